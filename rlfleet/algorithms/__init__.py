"""RL algorithm math: GAE, advantage processing, off-policy corrections, PPO losses, flow policies
(Flow-SDE, Flow-Noise), DAgger.

Formula-shaped, CleanRL-style functions; see docs/algorithms.md for the
formula-to-function map.
"""

from rlfleet.algorithms.advantages import (
    filter_groups_by_mean,
    group_mean_var,
    group_relative_advantages,
    normalize_advantages,
    normalize_advantages_per_task,
    spread_over_steps,
)
from rlfleet.algorithms.dagger import (
    AggregatedDataset,
    DAggerConfig,
    beta_schedule,
    expert_control,
    intervention_gate,
    mix_policies,
)
from rlfleet.algorithms.flow import (
    bounded_std,
    euler_step,
    flow_sde_sigma,
    flow_sde_step,
    gaussian_entropy,
    gaussian_log_prob,
    rectified_flow_score,
)
from rlfleet.algorithms.gae import bootstrap_next_values, compute_gae
from rlfleet.algorithms.off_policy import lag_mask, policy_lag, truncated_importance_weights
from rlfleet.algorithms.ppo import (
    PPOConfig,
    explained_variance,
    kl_to_reference,
    policy_loss,
    ppo_total_loss,
    value_loss,
)

__all__ = [
    "AggregatedDataset",
    "DAggerConfig",
    "PPOConfig",
    "beta_schedule",
    "bootstrap_next_values",
    "bounded_std",
    "compute_gae",
    "euler_step",
    "expert_control",
    "explained_variance",
    "filter_groups_by_mean",
    "flow_sde_sigma",
    "flow_sde_step",
    "gaussian_entropy",
    "gaussian_log_prob",
    "group_relative_advantages",
    "intervention_gate",
    "kl_to_reference",
    "lag_mask",
    "mix_policies",
    "normalize_advantages",
    "group_mean_var",
    "normalize_advantages_per_task",
    "policy_lag",
    "policy_loss",
    "ppo_total_loss",
    "rectified_flow_score",
    "spread_over_steps",
    "truncated_importance_weights",
    "value_loss",
]
