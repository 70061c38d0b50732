"""The learner's update, bit for bit: seeded updates on fixed synthetic segments must leave the same
weights, Adam moments and metrics as the recorded ones (recorded at 2f559dd, before the update was
restructured into prepare + update). A change that moves any of them changes what a run learns.

Scenarios cover each estimator (GAE, V-trace, GRPO), rows older than the lag bound, the critic
warm-up, per-task normalisation, the KL penalty to a reference policy, dual clip without value
clip, and a chunked policy whose log-probs are per action ([N, K]).

Re-record (only for an intended change, say why in the commit):
    PYTHONPATH=. python tests/unit/test_update_fingerprint.py
"""

from __future__ import annotations

import hashlib

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


# Recorded at 2f559dd (Trainer before the prepare/update split), one torch thread.
RECORDED: dict[str, dict] = {
    "gae_fresh": {
        "params": "3d08bacd0736ca33",
        "adam": "48653b3ca81c5d91",
        "metrics": {
            "rollout/advantages_mean": 0.09998387191444635,
            "rollout/is_weight_mean": 1.0,
            "rollout/returns_mean": -0.130885262042284,
            "throughput/policy_lag": 0.0,
            "throughput/policy_lag_max": 0.0,
            "train/actor/approx_kl": 0.013444761435190836,
            "train/actor/clip_fraction": 0.125,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.8085962335268657,
            "train/actor/grad_norm": 1.4135338068008423,
            "train/actor/policy_loss": 0.01988716485599677,
            "train/critic/explained_variance": -1.0801917543812043,
            "train/critic/value_clip_ratio": 0.375,
            "train/critic/value_loss": 0.24159755557775497,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 0.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 48.0,
        },
    },
    "gae_stale_warmup": {
        "params": "11764985a26a0996",
        "adam": "d93a34a01415dd2d",
        "metrics": {
            "rollout/advantages_mean": -0.059274801751598716,
            "rollout/is_weight_mean": 1.0102409478276968,
            "rollout/returns_mean": -0.11565874144434929,
            "throughput/policy_lag": 1.3333333730697632,
            "throughput/policy_lag_max": 3.0,
            "train/actor/approx_kl": 0.006036163365934044,
            "train/actor/clip_fraction": 0.11666666666666667,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.827364484469096,
            "train/actor/grad_norm": 2.426994800567627,
            "train/actor/policy_loss": 0.050796055467799306,
            "train/critic/explained_variance": -1.715863944359842,
            "train/critic/value_clip_ratio": 0.35,
            "train/critic/value_loss": 0.19065103431542715,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 16.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 32.0,
        },
    },
    "gae_dual_clip_no_value_clip": {
        "params": "3bc33529259f1359",
        "adam": "81ab09b95b825919",
        "metrics": {
            "rollout/advantages_mean": -0.018758507817983626,
            "rollout/is_weight_mean": 0.9871400132775306,
            "rollout/returns_mean": -0.1307107549160719,
            "throughput/policy_lag": 0.6666666865348816,
            "throughput/policy_lag_max": 2.0,
            "train/actor/approx_kl": 0.0126160290868332,
            "train/actor/clip_fraction": 0.1282051282051282,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.8057680328687031,
            "train/actor/grad_norm": 1.6085400581359863,
            "train/actor/policy_loss": 0.008239701933537921,
            "train/critic/explained_variance": -1.4807334585218865,
            "train/critic/value_clip_ratio": 0.0,
            "train/critic/value_loss": 0.12344363704323769,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 8.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 40.0,
        },
    },
    "vtrace_stale": {
        "params": "91f58beb44c6922d",
        "adam": "0488f40b0eb036e5",
        "metrics": {
            "rollout/advantages_mean": -0.07673302735202014,
            "rollout/is_weight_mean": 1.0,
            "rollout/returns_mean": -0.10737745030783116,
            "throughput/policy_lag": 1.1666666269302368,
            "throughput/policy_lag_max": 3.0,
            "train/actor/approx_kl": 0.007500658432642619,
            "train/actor/clip_fraction": 0.10256410256410256,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.819514552752177,
            "train/actor/grad_norm": 1.4998640219370525,
            "train/actor/policy_loss": 0.01280361549773564,
            "train/critic/explained_variance": -1.13932835035622,
            "train/critic/value_clip_ratio": 0.20512820512820512,
            "train/critic/value_loss": 0.2001673144598802,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 8.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 40.0,
        },
    },
    "task_norm_stale": {
        "params": "d69036b8358d2594",
        "adam": "bf9626586d14dfa4",
        "metrics": {
            "rollout/advantages_mean": -0.059628859627991915,
            "rollout/is_weight_mean": 0.9906748384237289,
            "rollout/returns_mean": -0.1173478327691555,
            "throughput/policy_lag": 1.3333333730697632,
            "throughput/policy_lag_max": 3.0,
            "train/actor/approx_kl": 0.008327128482051194,
            "train/actor/clip_fraction": 0.11666666666666667,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.8189822832743328,
            "train/actor/grad_norm": 2.448238432407379,
            "train/actor/policy_loss": 0.06545435637235641,
            "train/critic/explained_variance": -1.7107786818507624,
            "train/critic/value_clip_ratio": 0.3333333333333333,
            "train/critic/value_loss": 0.1896858513355255,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 16.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 32.0,
        },
    },
    "grpo_stale": {
        "params": "3da491e3372d92d6",
        "adam": "8ae059fbd95b82c2",
        "metrics": {
            "rollout/advantages_mean": 0.31249875202775,
            "rollout/is_weight_mean": 0.9649902209639549,
            "rollout/returns_mean": 0.375,
            "throughput/policy_lag": 0.8333333134651184,
            "throughput/policy_lag_max": 3.0,
            "train/actor/approx_kl": 0.0019790232715119296,
            "train/actor/clip_fraction": 0.0,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.8280834952990215,
            "train/actor/grad_norm": 2.453124533096949,
            "train/actor/policy_loss": -0.3549983004728953,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 32.0,
            "train/grpo/advantage_abs_max": 0.9999960064888,
            "train/grpo/advantage_mean": 0.0,
            "train/grpo/advantage_std": 0.8660219453022892,
            "train/grpo/filtered_groups": 0.0,
            "train/grpo/groups": 4.0,
            "train/grpo/trajectory_return_mean": 0.3125,
            "train/grpo/trajectory_return_std": 0.34798527267687634,
            "train/grpo/valid_step_fraction": 0.5,
            "train/grpo/zero_std_groups": 1.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 16.0,
        },
    },
    "grpo_filter": {
        "params": "58668da231397393",
        "adam": "82600e3a9b0bb046",
        "metrics": {
            "rollout/advantages_mean": 0.2941164724967059,
            "rollout/is_weight_mean": 1.0,
            "rollout/returns_mean": 0.5,
            "throughput/policy_lag": 0.0,
            "throughput/policy_lag_max": 0.0,
            "train/actor/approx_kl": 0.006948212860152125,
            "train/actor/clip_fraction": 0.03333333333333333,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.831222395102183,
            "train/actor/grad_norm": 3.030268351236979,
            "train/actor/policy_loss": -0.3000313738981883,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 31.0,
            "train/grpo/advantage_abs_max": 0.9999960064888,
            "train/grpo/advantage_mean": 0.0,
            "train/grpo/advantage_std": 0.8660219453022892,
            "train/grpo/filtered_groups": 1.0,
            "train/grpo/groups": 4.0,
            "train/grpo/trajectory_return_mean": 0.3125,
            "train/grpo/trajectory_return_std": 0.34798527267687634,
            "train/grpo/valid_step_fraction": 0.5,
            "train/grpo/zero_std_groups": 1.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 17.0,
        },
    },
    "kl_ref_critic_lr": {
        "params": "31dd9769e4a03203",
        "adam": "fbe8fc53534263a9",
        "metrics": {
            "rollout/advantages_mean": -0.2517290348187089,
            "rollout/is_weight_mean": 0.9799218798677126,
            "rollout/returns_mean": -0.16256555945922932,
            "throughput/policy_lag": 1.0,
            "throughput/policy_lag_max": 1.0,
            "train/actor/approx_kl": 0.0009202342480421066,
            "train/actor/clip_fraction": 0.010416666666666666,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.8122073610623677,
            "train/actor/grad_norm": 1.4781358639399211,
            "train/actor/kl_ref": 0.009095301230748495,
            "train/actor/policy_loss": 0.007207001559436321,
            "train/critic/explained_variance": -0.31544207854377837,
            "train/critic/value_clip_ratio": 0.0,
            "train/critic/value_loss": 0.18942937379082045,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 0.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 48.0,
        },
    },
    "chunked_per_action_stale": {
        "params": "b216a7b98404a026",
        "adam": "42de851f34d02f70",
        "metrics": {
            "rollout/advantages_mean": -0.20260499715805053,
            "rollout/is_weight_mean": 1.008902763823668,
            "rollout/returns_mean": -0.3212633434683084,
            "throughput/policy_lag": 1.3333333730697632,
            "throughput/policy_lag_max": 3.0,
            "train/actor/approx_kl": 0.00522542306377242,
            "train/actor/clip_fraction": 0.08974358974358974,
            "train/actor/dual_clip_fraction": 0.0,
            "train/actor/entropy": 1.8504958351453145,
            "train/actor/grad_norm": 1.0093269248803456,
            "train/actor/policy_loss": 0.014883634323875109,
            "train/critic/explained_variance": -0.24355475053011721,
            "train/critic/value_clip_ratio": 0.20512820512820512,
            "train/critic/value_loss": 0.42598799367745716,
            "train/critic_warmup": 0.0,
            "train/dropped_samples": 8.0,
            "train/lr": 0.003,
            "train/nonfinite_steps": 0.0,
            "train/obs_norm_clipped_values": 0.0,
            "train/obs_norm_rejected_rows": 0.0,
            "train/samples": 40.0,
        },
    },
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_updates_are_bit_for_bit_the_recorded_ones(name):
    got, want = run(name), RECORDED[name]
    assert got["params"] == want["params"], name
    assert got["adam"] == want["adam"], name
    assert got["metrics"].keys() == want["metrics"].keys()
    for key, value in want["metrics"].items():
        assert got["metrics"][key] == pytest.approx(value, rel=1e-12, abs=1e-12, nan_ok=True), key


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("RECORDED: dict[str, dict] = {")
    for scenario in SCENARIOS:
        print(f"    {scenario!r}: {run(scenario)!r},")
    print("}")
