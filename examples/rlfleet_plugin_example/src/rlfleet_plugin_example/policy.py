"""A custom policy: a Gaussian actor and critic, linear unless given hidden layers (rlfleet's MLP policy).

A policy plugin is a class taking (state_dim, action_dim, chunk_size, config) whose settings
dataclass is `config_class`; the run's `policy:` section (minus `name`) fills that dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig


@dataclass
class LinearConfig:
    hidden_sizes: list[int] = field(default_factory=list)  # none: linear in the (normalised) state
    init_log_std: float = -0.5
    obs_norm: bool = True


class LinearGaussianPolicy(GaussianMLPPolicy):
    config_class = LinearConfig

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg: LinearConfig) -> None:
        super().__init__(
            state_dim,
            action_dim,
            chunk_size,
            PolicyConfig(hidden_sizes=list(cfg.hidden_sizes), init_log_std=cfg.init_log_std, obs_norm=cfg.obs_norm),
        )
