"""A learner segment acted by a Gaussian MLP policy, for trainer tests on any device.

Importable from every test folder: pytest puts tests/ on sys.path (the root conftest.py).
"""

from __future__ import annotations

import numpy as np
import torch

from rlfleet.policies import GaussianMLPPolicy
from rlfleet.wire.segment import Segment


def make_segment(
    policy: GaussianMLPPolicy,
    T: int,
    B: int,
    versions,
    seed: int = 0,
    logp_shift: float = 0.0,
    terminated: np.ndarray | None = None,
    truncated: np.ndarray | None = None,
    task_ids: np.ndarray | None = None,
) -> Segment:
    """A segment whose actions / log-probs / values come from `policy` (plus an optional shift)."""
    S, K, D = policy.state_dim, policy.chunk_size, policy.action_dim
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(T, B, S)).astype(np.float32)
    with torch.no_grad():
        out = policy.act({"states": torch.from_numpy(states.reshape(T * B, S))})
    terminated = np.zeros((T, B), bool) if terminated is None else terminated
    truncated = np.zeros((T, B), bool) if truncated is None else truncated
    done = terminated | truncated
    final_states = np.where(done[..., None], rng.normal(size=(T, B, S)), 0.0).astype(np.float32)
    return Segment(
        obs={"states": states},
        actions=out["actions"].numpy().reshape(T, B, K, D),
        logprobs=(out["logprobs"].numpy() + logp_shift).reshape(T, B).astype(np.float32),
        values=out["values"].numpy().reshape(T, B),
        rewards=rng.normal(size=(T, B)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        final_obs={"states": final_states},
        next_obs={"states": rng.normal(size=(B, S)).astype(np.float32)},
        versions=np.asarray(versions, np.int64),
        task_ids=np.zeros(B, np.int64) if task_ids is None else np.asarray(task_ids, np.int64),
        env_steps=np.array(T * B * K, np.int64),
        ep_returns=np.zeros(0, np.float32),
        ep_lengths=np.zeros(0, np.int32),
        ep_success=np.zeros(0, bool),
        ep_task_ids=np.zeros(0, np.int64),
        extras={},
    )
