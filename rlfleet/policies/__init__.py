"""Policies: networks, their registry and checkpoint I/O."""

from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig
from rlfleet.policies.registry import make_policy

__all__ = ["GaussianMLPPolicy", "PolicyConfig", "make_policy"]
