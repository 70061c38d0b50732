"""An example rlfleet plugin: `PointReachEnv` (env `point_reach`) and `LinearGaussianPolicy`
(policy `linear_gaussian`), published through the `rlfleet.envs` / `rlfleet.policies` entry points."""
