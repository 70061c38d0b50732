"""The per-algorithm pieces chosen once from the config, and the minibatch loss they compose."""

import pytest
import torch

from rlfleet.algorithms import PPOConfig, ppo_total_loss
from rlfleet.algorithms.objective import objective
from rlfleet.algorithms.ppo import update_loss


def test_objective_per_algorithm():
    ppo = objective(PPOConfig())
    assert (ppo.estimator, ppo.critic, ppo.normalize_advantages, ppo.kl_to_reference) == ("gae", True, True, False)
    assert not ppo.whole_segment_advantages
    vtrace = objective(PPOConfig(off_policy="vtrace", norm_adv=False, kl_beta=0.1))
    assert (vtrace.estimator, vtrace.critic, vtrace.normalize_advantages, vtrace.kl_to_reference) == (
        "vtrace",
        True,
        False,
        True,
    )
    grpo = objective(PPOConfig(adv_type="grpo"))
    # GRPO's advantages are normalised per group already, and it has no critic
    assert (grpo.estimator, grpo.critic, grpo.normalize_advantages) == ("grpo", False, False)
    assert grpo.whole_segment_advantages


def test_per_task_normalisation_replaces_the_minibatch_one():
    o = objective(PPOConfig(norm_adv_per_task=True))
    assert (o.normalize_per_task, o.normalize_advantages) == (True, False)
    assert not objective(PPOConfig()).normalize_per_task
    with pytest.raises(ValueError, match="norm_adv_per_task needs"):
        PPOConfig(adv_type="grpo", norm_adv_per_task=True)  # GRPO normalises per group already
    with pytest.raises(ValueError, match="norm_adv_per_task needs"):
        PPOConfig(norm_adv=False, norm_adv_per_task=True)


@pytest.mark.parametrize("adv_type, critic", [("gae", True), ("grpo", False)])
def test_what_trains(adv_type, critic):
    o = objective(PPOConfig(adv_type=adv_type))
    assert o.trains(critic_warmup=True) == (False, True)  # the warm-up trains only the critic
    assert o.trains(critic_warmup=False) == (True, critic)


def test_update_loss_terms():
    cfg = PPOConfig(vf_coef=0.7, ent_coef=0.01, kl_beta=0.3)
    pg, v, kl = torch.tensor(0.4), torch.tensor(2.0), torch.tensor(0.05)
    ent = torch.tensor([1.0, 3.0])
    assert torch.equal(update_loss(pg, v, ent, None, cfg), ppo_total_loss(pg, v, ent, cfg))
    torch.testing.assert_close(
        update_loss(pg, v, ent, kl, cfg), torch.tensor(0.4 + 0.7 * 2.0 - 0.01 * 2.0 + 0.3 * 0.05)
    )
    # critic-free: no value term
    torch.testing.assert_close(
        update_loss(pg, v, ent, kl, cfg, train_critic=False), torch.tensor(0.4 - 0.01 * 2.0 + 0.3 * 0.05)
    )
    # critic warm-up: only the value term, no KL (the policy keeps its weights)
    torch.testing.assert_close(update_loss(pg, v, ent, kl, cfg, train_actor=False), torch.tensor(0.7 * 2.0))
