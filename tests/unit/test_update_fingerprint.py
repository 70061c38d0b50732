"""The learner's update, bit for bit: seeded updates on fixed synthetic segments must leave the same
weights, Adam moments and metrics as the recorded ones (recorded at 2f559dd, before the update was
restructured into prepare + update). A change that moves any of them changes what a run learns.

Scenarios cover each estimator (GAE, V-trace, GRPO), rows older than the lag bound, the critic
warm-up, per-task normalisation, the KL penalty to a reference policy, dual clip without value
clip, and a chunked policy whose log-probs are per action ([N, K]).

Re-record (only for an intended change, say why in the commit) into data/update_fingerprint.json:
    PYTHONPATH=. python tests/unit/test_update_fingerprint.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlfleet.algorithms import PPOConfig
from rlfleet.learner.trainer import Trainer
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire.segment import Segment

S, D = 4, 2
ENVS = (4, 4)
T = 6
UPDATES = 3


class PerActionMLP(GaussianMLPPolicy):
    """A chunked policy with one log-prob per action step ([N, K]), as a VLA with per-action log-probs."""

    def __init__(self, chunk_size: int, cfg: PolicyConfig):
        super().__init__(S, D, chunk_size, cfg)
        self.logprob_shape = (chunk_size,)

    def evaluate(self, obs, actions, extras=None):
        x = self._obs_features(obs)
        dist = self._normal(x)
        n, k = actions.shape[0], self.chunk_size
        logp = dist.log_prob(actions.reshape(n, -1)).reshape(n, k, D).sum(-1)
        entropy = dist.entropy().reshape(n, k, D).sum(-1)
        return logp, entropy, self.critic(x).squeeze(-1)


def make_policy(seed: int, chunk: int = 1) -> GaussianMLPPolicy:
    torch.manual_seed(seed)
    cfg = PolicyConfig(hidden_sizes=[16, 16])
    return PerActionMLP(chunk, cfg) if chunk > 1 else GaussianMLPPolicy(S, D, 1, cfg)


def make_segment(behaviour: GaussianMLPPolicy, B: int, versions, seed: int, grpo: bool) -> Segment:
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    K = behaviour.chunk_size
    states = rng.normal(size=(T, B, S)).astype(np.float32) * 2.0 + 1.0
    with torch.no_grad():
        x = torch.from_numpy(states.reshape(T * B, S))
        dist = behaviour.distribution(x)
        actions = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=gen)
        per_dim = dist.log_prob(actions).reshape(T * B, K, D).sum(-1)
        noise = torch.from_numpy(rng.normal(scale=0.1, size=(T * B, K)).astype(np.float32))
        logp = per_dim + noise if K > 1 else per_dim.sum(-1) + noise[:, 0]
        values = behaviour.value({"states": x})
    terminated = rng.random((T, B)) < 0.15
    truncated = (rng.random((T, B)) < 0.1) & ~terminated
    if grpo:
        terminated[rng.integers(2, T, size=B), np.arange(B)] = True
        truncated &= ~terminated
    final = np.where((terminated | truncated)[..., None], rng.normal(size=(T, B, S)), 0.0).astype(np.float32)
    return Segment(
        obs={"states": states},
        actions=actions.numpy().reshape(T, B, K, D),
        logprobs=logp.numpy().reshape(T, B, *([K] if K > 1 else [])),
        values=values.numpy().reshape(T, B),
        rewards=(rng.random((T, B)) < 0.3).astype(np.float32) if grpo else rng.normal(size=(T, B)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        final_obs={"states": final},
        next_obs={"states": rng.normal(size=(B, S)).astype(np.float32)},
        versions=np.asarray(versions, np.int64),
        task_ids=np.arange(B, dtype=np.int64) % 2,
        env_steps=np.array(T * B * K, np.int64),
        ep_returns=np.zeros(1, np.float32),
        ep_lengths=np.ones(1, np.int32),
        ep_success=np.zeros(1, bool),
        ep_task_ids=np.zeros(1, np.int64),
        extras={},
        group_ids=np.arange(B, dtype=np.int64) // 2 if grpo else np.zeros(0, np.int64),
    )


_BASE = dict(update_epochs=2, num_minibatches=3, lr=3e-3, max_policy_lag=2, ent_coef=0.01, rho_bar=1.2)
# name: (config, lags of the segments' steps, chunk size, KL reference)
SCENARIOS: dict[str, tuple[PPOConfig, list[int], int, bool]] = {
    "gae_fresh": (PPOConfig(**_BASE), [0] * T, 1, False),
    "gae_stale_warmup": (PPOConfig(**_BASE, critic_warmup_updates=1), [3, 3, 1, 1, 0, 0], 1, False),
    "gae_dual_clip_no_value_clip": (
        PPOConfig(**{**_BASE, "max_policy_lag": 1}, dual_clip=3.0, value_clip=None, clip_ratio_high=0.28),
        [2, 1, 1, 0, 0, 0],
        1,
        False,
    ),
    "vtrace_stale": (PPOConfig(**_BASE, off_policy="vtrace"), [3, 2, 1, 1, 0, 0], 1, False),
    "task_norm_stale": (PPOConfig(**_BASE, norm_adv_per_task=True), [3, 3, 1, 1, 0, 0], 1, False),
    "grpo_stale": (PPOConfig(**_BASE, adv_type="grpo", group_size=2), [3, 1, 1, 0, 0, 0], 1, False),
    "grpo_filter": (
        PPOConfig(**_BASE, adv_type="grpo", group_size=2, group_filter=[0.1, 2.5]),
        [0] * T,
        1,
        False,
    ),
    "kl_ref_critic_lr": (PPOConfig(**_BASE, kl_beta=0.05, critic_lr=1e-3, lr_warmup_updates=2), [1] * T, 1, True),
    "chunked_per_action_stale": (PPOConfig(**_BASE), [3, 2, 2, 1, 0, 0], 3, False),
}


def _sha(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def run(name: str) -> dict:
    """UPDATES seeded updates of scenario `name`: weight and Adam hashes, and the last metrics."""
    cfg, lags, chunk, with_reference = SCENARIOS[name]
    policy = make_policy(0, chunk)
    reference = make_policy(5, chunk) if with_reference else None
    trainer = Trainer(policy, cfg, reward_scale=0.5, reference=reference)
    torch.manual_seed(123)
    metrics: dict[str, float] = {}
    for version in range(UPDATES, 2 * UPDATES):
        behaviour = make_policy(100 + version, chunk)
        segments = [
            make_segment(behaviour, B, [version - lag for lag in lags], 10 * version + i, cfg.adv_type == "grpo")
            for i, B in enumerate(ENVS)
        ]
        metrics = trainer.step(segments, version)
    state = trainer.optimizer.state_dict()["state"]
    return {
        "params": _sha([p for _, p in sorted(policy.state_dict().items())]),
        "adam": _sha([s[k] for i in sorted(state) for k in ("exp_avg", "exp_avg_sq") for s in [state[i]]]),
        "metrics": {k: metrics[k] for k in sorted(metrics) if not k.startswith("throughput/policy_lag_count/")},
    }


# Recorded at 2f559dd (PPOTrainer before the prepare/update split), one torch thread.
RECORDED_FILE = Path(__file__).parent / "data" / "update_fingerprint.json"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_updates_are_bit_for_bit_the_recorded_ones(name):
    got, want = run(name), json.loads(RECORDED_FILE.read_text())[name]
    assert got["params"] == want["params"], name
    assert got["adam"] == want["adam"], name
    assert got["metrics"].keys() == want["metrics"].keys()
    for key, value in want["metrics"].items():
        assert got["metrics"][key] == pytest.approx(value, rel=1e-12, abs=1e-12, nan_ok=True), key


if __name__ == "__main__":
    torch.set_num_threads(1)
    RECORDED_FILE.write_text(json.dumps({name: run(name) for name in SCENARIOS}, indent=1, sort_keys=True) + "\n")
