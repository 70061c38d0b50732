"""Tiny vision-language-action policies (OpenVLA-OFT, pi0, pi0.5 styles) that train on CPU."""

from rlfleet.policies.vla.backbone import VLAConfig
from rlfleet.policies.vla.normalization import (
    compute_norm_stats,
    get_norm_stats,
    load_norm_stats,
    save_norm_stats,
    set_norm_stats,
)
from rlfleet.policies.vla.oft import TinyOFTPolicy
from rlfleet.policies.vla.pi0 import TinyPi0Policy, TinyPi05Policy
from rlfleet.policies.vla.tokenizer import WordTokenizer

VLA_POLICIES = {"tiny_oft": TinyOFTPolicy, "tiny_pi0": TinyPi0Policy, "tiny_pi05": TinyPi05Policy}

__all__ = [
    "VLAConfig",
    "TinyOFTPolicy",
    "TinyPi0Policy",
    "TinyPi05Policy",
    "WordTokenizer",
    "VLA_POLICIES",
    "compute_norm_stats",
    "set_norm_stats",
    "get_norm_stats",
    "save_norm_stats",
    "load_norm_stats",
]
