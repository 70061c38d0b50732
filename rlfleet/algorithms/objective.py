"""The per-algorithm pieces of the learner's update, chosen in one place from the config.

The learner runs one loop for every algorithm (prepare rows, estimate advantages, minibatch
epochs of a clipped policy loss); what differs between PPO with GAE, PPO with V-trace and GRPO is
only which advantage estimator runs (:mod:`rlfleet.algorithms.estimators`) and whether a critic
trains. :func:`objective` reads both from ``algorithm.*`` once; the trainer asks the
:class:`Objective` instead of testing the algorithm's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlfleet.algorithms.estimators import estimator_name, spec
from rlfleet.algorithms.ppo import PPOConfig


@dataclass(frozen=True)
class Objective:
    estimator: str  # registered advantage estimator: gae | vtrace | grpo
    critic: bool  # a value head trains: bootstrap values, value loss, critic metrics
    normalize_advantages: bool  # whiten advantages per minibatch (GRPO's are normalised per group)
    normalize_per_task: bool  # whiten advantages per task over the whole update instead
    kl_to_reference: bool  # kl_beta > 0: a KL penalty to the frozen reference (SFT) policy

    @property
    def whole_segment_advantages(self) -> bool:
        """A critic-free estimator needs no forward pass, so it runs on whole segments before DDP
        sharding (GRPO: a group's statistics need all its members, and a rank may hold only some)."""
        return not self.critic

    def trains(self, critic_warmup: bool) -> tuple[bool, bool]:
        """(actor, critic): the critic warm-up trains only the critic; a critic-free algorithm none."""
        return not critic_warmup, critic_warmup or self.critic


def objective(cfg: PPOConfig) -> Objective:
    """The run's objective from ``algorithm.adv_type``, ``off_policy``, ``norm_adv[_per_task]`` and ``kl_beta``."""
    est = spec(estimator_name(cfg))
    return Objective(
        estimator=est.name,
        critic=est.critic,
        normalize_advantages=cfg.norm_adv and not cfg.norm_adv_per_task and not est.normalised,
        normalize_per_task=cfg.norm_adv and cfg.norm_adv_per_task and not est.normalised,
        kl_to_reference=cfg.kl_beta > 0,
    )
