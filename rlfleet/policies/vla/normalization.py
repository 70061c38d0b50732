"""Action and state normalisation to [-1, 1] by the 1st/99th percentiles (OpenVLA's scheme).

    normalise:    n = 2 (x - q01) / (q99 - q01) - 1, clamped to [-1, 1]
    un-normalise: x = (n + 1) (q99 - q01) / 2 + q01

Percentiles instead of min/max so that a few outlier demos do not squash the useful range.
The statistics are buffers of the policy, so they travel with its weights to the inference
servers and into checkpoints; a checkpoint folder also holds them readable in
`norm_stats.json` = {unnorm_key: {"action": {...}, "state": {...}}} (one entry per dataset or
robot, as OpenVLA's `unnorm_key`). The defaults (q01 = -1, q99 = 1) are the identity, right for
MetaWorld whose actions already live in [-1, 1].
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

NORM_STATS_FILE = "norm_stats.json"
_STAT_NAMES = ("q01", "q99", "mean", "std", "min", "max")
_MIN_HALF_RANGE = 1e-6  # a constant dimension maps to 0 instead of dividing by zero


class UnknownNormKeyError(ValueError, KeyError):
    """A wrong `unnorm_key`: a ValueError (config mistake) that `except KeyError` also catches."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class ActionStateNormalizer(nn.Module):
    """Holds q01/q99 of the actions [D] and of the proprio state prefix [P] as buffers."""

    def __init__(self, action_dim: int, proprio_dims: int):
        super().__init__()
        self.register_buffer("action_q01", torch.full((action_dim,), -1.0))
        self.register_buffer("action_q99", torch.full((action_dim,), 1.0))
        self.register_buffer("state_q01", torch.full((proprio_dims,), -1.0))
        self.register_buffer("state_q99", torch.full((proprio_dims,), 1.0))

    @staticmethod
    def _centre_half(q01: torch.Tensor, q99: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Written as centre/half-range: same map as 2 (x - q01) / (q99 - q01) - 1, and exact
        # (no rounding) for the identity stats, which makes act/evaluate round trips bit-exact.
        return (q01 + q99) * 0.5, ((q99 - q01) * 0.5).clamp_min(_MIN_HALF_RANGE)

    def normalize_action(self, a: torch.Tensor, clamp: bool = True) -> torch.Tensor:
        """Env units [..., D] -> [-1, 1]; `clamp=False` keeps Gaussian samples exact for their log-prob."""
        centre, half = self._centre_half(self.action_q01, self.action_q99)
        n = (a - centre) / half
        return n.clamp(-1.0, 1.0) if clamp else n

    def unnormalize_action(self, n: torch.Tensor) -> torch.Tensor:
        centre, half = self._centre_half(self.action_q01, self.action_q99)
        return n * half + centre

    def normalize_state(self, s: torch.Tensor) -> torch.Tensor:
        """The first `proprio_dims` of the state [..., S] -> [-1, 1] [..., P]."""
        p = self.state_q01.shape[0]
        if s.shape[-1] < p:
            raise ValueError(f"states have {s.shape[-1]} dims, the policy reads the first {p}")
        centre, half = self._centre_half(self.state_q01, self.state_q99)
        return ((s[..., :p] - centre) / half).clamp(-1.0, 1.0)


def _as_2d(x: Any, name: str) -> np.ndarray:
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if arr.ndim < 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty [N, dim] array, got shape {arr.shape}")
    return arr.reshape(-1, arr.shape[-1]).astype(np.float64)


def _stats(x: np.ndarray) -> dict[str, list[float]]:
    return {
        "q01": np.quantile(x, 0.01, axis=0).tolist(),
        "q99": np.quantile(x, 0.99, axis=0).tolist(),
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "min": x.min(0).tolist(),
        "max": x.max(0).tolist(),
    }


def compute_norm_stats(actions: Any, states: Any) -> dict[str, dict[str, list[float]]]:
    """Per-dim statistics of demo actions [N, D] (or [N, K, D]) and states [N, S], as JSON-ready lists.

    States keep all S dims; `set_norm_stats` takes the prefix the policy reads.
    """
    return {"action": _stats(_as_2d(actions, "actions")), "state": _stats(_as_2d(states, "states"))}


def _find_normalizer(policy: nn.Module) -> ActionStateNormalizer:
    for module in policy.modules():
        if isinstance(module, ActionStateNormalizer):
            return module
    raise TypeError(f"{type(policy).__name__} has no ActionStateNormalizer (not a VLA policy?)")


def _checked(stats: dict, part: str, name: str, want: tuple[int, ...]) -> torch.Tensor:
    try:
        values = stats[part][name]
    except (KeyError, TypeError):
        raise ValueError(f"norm stats lack {part}.{name}") from None
    t = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
    if t.shape[0] not in want:
        raise ValueError(
            f"norm stats {part}.{name} has {t.shape[0]} values, the model needs {' or '.join(map(str, want))}"
        )
    return t


@torch.no_grad()
def set_norm_stats(policy: nn.Module, stats: dict) -> None:
    """Copy q01/q99 into the policy's buffers (the state stats may cover all S dims or just the prefix)."""
    norm = _find_normalizer(policy)
    d, p = norm.action_q01.shape[0], norm.state_q01.shape[0]
    state_dim = getattr(policy, "state_dim", p)
    a01, a99 = (_checked(stats, "action", k, (d,)) for k in ("q01", "q99"))
    s01, s99 = (_checked(stats, "state", k, (p, state_dim))[:p] for k in ("q01", "q99"))
    for part, lo, hi in (("action", a01, a99), ("state", s01, s99)):
        if not bool((hi >= lo).all()):
            raise ValueError(f"norm stats {part}: q99 must be >= q01 in every dim")
    norm.action_q01.copy_(a01)
    norm.action_q99.copy_(a99)
    norm.state_q01.copy_(s01)
    norm.state_q99.copy_(s99)


def get_norm_stats(policy: nn.Module) -> dict[str, dict[str, list[float]]]:
    """The policy's q01/q99 as JSON-ready lists (what `save_norm_stats` writes)."""
    norm = _find_normalizer(policy)
    return {
        "action": {"q01": norm.action_q01.tolist(), "q99": norm.action_q99.tolist()},
        "state": {"q01": norm.state_q01.tolist(), "q99": norm.state_q99.tolist()},
    }


def save_norm_stats(folder: str | os.PathLike, unnorm_key: str, stats: dict) -> Path:
    """Write `stats` under `unnorm_key` into folder/norm_stats.json, keeping the other keys."""
    path = Path(folder) / NORM_STATS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    table = json.loads(path.read_text()) if path.exists() else {}
    table[unnorm_key] = stats
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, path)  # readers never see a half-written file
    return path


def load_norm_stats(folder: str | os.PathLike, unnorm_key: str, policy: nn.Module | None = None) -> dict:
    """Stats stored under `unnorm_key` in folder/norm_stats.json; also set into `policy` if given."""
    path = Path(folder) / NORM_STATS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {NORM_STATS_FILE} in {folder}")
    table = json.loads(path.read_text())
    if unnorm_key not in table:
        raise UnknownNormKeyError(
            f"unnorm_key {unnorm_key!r} not in {path} (available: {', '.join(sorted(table)) or 'none'})"
        )
    stats = table[unnorm_key]
    if policy is not None:
        set_norm_stats(policy, stats)
    return stats
