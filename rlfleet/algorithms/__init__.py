"""RL algorithm math: GAE, advantage processing, off-policy corrections, PPO losses.

Formula-shaped, CleanRL-style functions; see docs/algorithms.md for the
formula-to-function map.
"""

from rlfleet.algorithms.advantages import (
    filter_groups_by_mean,
    group_relative_advantages,
    normalize_advantages,
    spread_over_steps,
)
from rlfleet.algorithms.gae import bootstrap_next_values, compute_gae
from rlfleet.algorithms.off_policy import lag_mask, policy_lag, truncated_importance_weights
from rlfleet.algorithms.ppo import (
    PPOConfig,
    explained_variance,
    policy_loss,
    ppo_total_loss,
    value_loss,
)

__all__ = [
    "PPOConfig",
    "bootstrap_next_values",
    "compute_gae",
    "explained_variance",
    "filter_groups_by_mean",
    "group_relative_advantages",
    "lag_mask",
    "normalize_advantages",
    "policy_lag",
    "policy_loss",
    "ppo_total_loss",
    "spread_over_steps",
    "truncated_importance_weights",
    "value_loss",
]
