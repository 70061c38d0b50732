"""The DDP learner trains exactly like one process: row sharding, segment broadcast, 2 gloo ranks.

The equivalence test starts two rank processes the way torchrun would (WORLD_SIZE / RANK /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT in the environment; this file is their script) and
compares their weights, Adam moments and metrics after three updates with one process doing the
same updates, for PPO with critic warm-up, PPO with V-trace, PPO with per-task advantage normalisation and GRPO.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlfleet.algorithms import PPOConfig, policy_lag
from rlfleet.learner.distributed import backend_and_device, pack_segments, torchrun_ranks, unpack_segments
from rlfleet.learner.sharding import shard_rows
from rlfleet.learner.trainer import Trainer
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire.segment import Segment

S, D, K = 5, 2, 1
ENVS = (3, 2, 3)  # envs per segment: 8 env columns, split unevenly within segments
T = 6
UPDATES = 3
_BASE = dict(update_epochs=2, num_minibatches=3, lr=3e-3, max_policy_lag=2, ent_coef=0.01, rho_bar=1.2)
# Each scenario runs in the same two rank processes, one after the other.
SCENARIOS = {
    "gae_warmup": PPOConfig(**_BASE, critic_warmup_updates=1),  # the actor sits out the first update
    "vtrace": PPOConfig(**_BASE, off_policy="vtrace"),
    "task_norm": PPOConfig(**_BASE, norm_adv_per_task=True),  # per-task statistics over both ranks' rows
    "grpo": PPOConfig(**_BASE, adv_type="grpo", group_size=2),  # critic-free: the critic sits out
}


def make_policy(seed: int) -> GaussianMLPPolicy:
    torch.manual_seed(seed)
    return GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[16, 16]))


def make_segment(behaviour: GaussianMLPPolicy, B: int, versions, seed: int, grpo: bool = False) -> Segment:
    """Deterministic synthetic segment: actions and log-probs from `behaviour`, some episode ends
    (with `grpo`, every env ends an episode and envs come in groups of two)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    states = rng.normal(size=(T, B, S)).astype(np.float32) * 2.0 + 1.0
    with torch.no_grad():
        x = torch.from_numpy(states.reshape(T * B, S))
        dist = behaviour.distribution(x)
        actions = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=gen)
        logp = dist.log_prob(actions).sum(-1) + torch.from_numpy(rng.normal(scale=0.1, size=T * B).astype(np.float32))
        values = behaviour.value({"states": x})
    terminated = rng.random((T, B)) < 0.1
    truncated = (rng.random((T, B)) < 0.1) & ~terminated
    if grpo:
        terminated[rng.integers(2, T, size=B), np.arange(B)] = True
        truncated &= ~terminated
    final = np.where((terminated | truncated)[..., None], rng.normal(size=(T, B, S)), 0.0).astype(np.float32)
    return Segment(
        obs={"states": states},
        actions=actions.numpy().reshape(T, B, K, D),
        logprobs=logp.numpy().reshape(T, B),
        values=values.numpy().reshape(T, B),
        rewards=rng.normal(size=(T, B)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        final_obs={"states": final},
        next_obs={"states": rng.normal(size=(B, S)).astype(np.float32)},
        versions=np.asarray(versions, np.int64),
        task_ids=np.arange(B, dtype=np.int64) % 2 + 1,  # two tasks, split across the ranks' columns
        env_steps=np.array(T * B * K, np.int64),
        ep_returns=np.zeros(1, np.float32),
        ep_lengths=np.ones(1, np.int32),
        ep_success=np.zeros(1, bool),
        ep_task_ids=np.zeros(1, np.int64),
        extras={},
        group_ids=np.arange(B, dtype=np.int64) // 2 if grpo else np.zeros(0, np.int64),
    )


def update_segments(version: int, scenario: str = "gae_warmup") -> list[Segment]:
    """Steps of lags 3 (dropped at max_policy_lag 2), 1 and 0."""
    behaviour = make_policy(100 + version)
    versions = [max(version - 3, 0)] * 2 + [max(version - 1, 0)] * 2 + [version] * 2
    return [
        make_segment(behaviour, B, versions, seed=10 * version + i, grpo=scenario == "grpo") for i, B in enumerate(ENVS)
    ]


def starting_state(path: Path, scenario: str) -> None:
    """Weights and Adam moments after one update, as a resumed rank 0 would restore them."""
    policy = make_policy(0)
    trainer = Trainer(policy, PPOConfig(**{**vars(SCENARIOS[scenario]), "critic_warmup_updates": 0}))
    torch.manual_seed(7)
    trainer.step(update_segments(0, scenario), 0)
    torch.save({"policy": policy.state_dict(), "optimizer": trainer.optimizer.state_dict()}, path)


def load_start(path: Path, trainer: Trainer) -> None:
    state = torch.load(path, weights_only=True)
    trainer.policy.load_state_dict(state["policy"])
    trainer.optimizer.load_state_dict(state["optimizer"])


def train(trainer: Trainer, scenario: str, ranks=None) -> list[dict[str, float]]:
    torch.manual_seed(123)  # rank 0's RNG draws the minibatch order, as one process's does
    metrics = []
    for version in range(1, UPDATES + 1):
        segments = None
        if ranks is None or ranks.is_main:
            segments = update_segments(version, scenario)
            if ranks is not None:
                ranks.send_update(segments, version)
        else:
            segments, got = ranks.receive_update()
            assert got == version
        metrics.append(trainer.step(segments, version))
    if ranks is not None and ranks.is_main:
        ranks.send_stop()
    elif ranks is not None:
        assert ranks.receive_update() is None
    return metrics


def rank_main(out: str) -> None:
    """One rank, started with torchrun's environment variables; every scenario in turn."""
    from omegaconf import OmegaConf

    from rlfleet.config import DistributedConfig
    from rlfleet.learner.distributed import join_ranks

    torch.set_num_threads(1)
    ranks = join_ranks(OmegaConf.structured(DistributedConfig(backend="auto", timeout_s=120, idle_timeout_s=120)))
    for scenario, cfg in SCENARIOS.items():
        # rank 1 starts from other weights and an empty optimiser: the first update must sync them
        policy = make_policy(0 if ranks.is_main else 1)
        trainer = Trainer(policy, cfg, device=ranks.device("cpu"), ranks=ranks)
        if ranks.is_main:
            load_start(Path(out) / f"{scenario}_start.pt", trainer)
        metrics = train(trainer, scenario, ranks)
        torch.save(
            {"policy": policy.state_dict(), "optimizer": trainer.optimizer.state_dict(), "metrics": metrics},
            Path(out) / f"{scenario}_rank{ranks.rank}.pt",
        )
    ranks.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Fractions of rows on one side of a threshold: rounding may flip a row sitting on it.
FRACTIONS = {"train/actor/clip_fraction", "train/actor/dual_clip_fraction", "train/critic/value_clip_ratio"}


def test_two_gloo_ranks_match_one_process(tmp_path):
    for scenario in SCENARIOS:
        starting_state(tmp_path / f"{scenario}_start.pt", scenario)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            WORLD_SIZE="2",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
        )
        with open(tmp_path / f"rank{rank}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, str(tmp_path)], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            )
    try:
        for rank, proc in enumerate(procs):
            assert proc.wait(timeout=300) == 0, (tmp_path / f"rank{rank}.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    for scenario, cfg in SCENARIOS.items():
        start = tmp_path / f"{scenario}_start.pt"
        policy = make_policy(0)
        reference = Trainer(policy, cfg)
        load_start(start, reference)
        want_metrics = train(reference, scenario)
        want = policy.state_dict()
        ranks = [torch.load(tmp_path / f"{scenario}_rank{r}.pt", weights_only=True) for r in range(2)]

        for name, value in want.items():
            torch.testing.assert_close(ranks[0]["policy"][name], value, rtol=1e-4, atol=1e-5, msg=f"{scenario} {name}")
            assert torch.equal(ranks[1]["policy"][name], ranks[0]["policy"][name]), name  # ranks stay identical
        assert not torch.equal(want["actor.0.weight"], torch.load(start, weights_only=True)["policy"]["actor.0.weight"])
        # Adam moments too: a part that sits out (actor in warm-up, critic in GRPO) keeps its own
        got_opt, want_opt = ranks[0]["optimizer"]["state"], reference.optimizer.state_dict()["state"]
        assert got_opt.keys() == want_opt.keys()
        for i in want_opt:
            for key in ("exp_avg", "exp_avg_sq", "step"):
                torch.testing.assert_close(
                    got_opt[i][key], want_opt[i][key], rtol=1e-4, atol=1e-6, msg=f"{scenario} param {i} {key}"
                )
        for update, (got, expected) in enumerate(zip(ranks[0]["metrics"], want_metrics)):
            assert got.keys() == expected.keys(), scenario
            assert got["train/samples"] == expected["train/samples"] > 0
            for key, value in expected.items():
                tol = dict(abs=0.05) if key in FRACTIONS else dict(rel=1e-4, abs=1e-6)
                assert got[key] == pytest.approx(value, nan_ok=True, **tol), (scenario, update, key)
        assert want_metrics[-1]["train/dropped_samples"] >= 2 * sum(ENVS)  # the lag-3 steps
    warmups = [m["train/critic_warmup"] for m in torch.load(tmp_path / "gae_warmup_rank0.pt")["metrics"]]
    assert warmups == [1.0, 0.0, 0.0]


def valid_rows(segments: list[Segment], version: int, max_lag: int) -> torch.Tensor:
    """Rows young enough to train on, in one-process order (every row of every segment)."""
    lags = [version - torch.from_numpy(s.versions) for s in segments]
    return torch.cat([(lag <= max_lag).repeat_interleave(s.num_envs) for s, lag in zip(segments, lags)])


def test_shards_partition_the_one_process_rows():
    segments = update_segments(5)
    total_envs = sum(ENVS)
    valid = valid_rows(segments, 5, 2)
    for world in (1, 2, 3, 9):
        shards = [shard_rows(segments, valid, r, world) for r in range(world)]
        assert shards[0].num_rows == 4 * total_envs  # two of six steps are too old
        ids = torch.cat([s.row_ids[s.row_ids >= 0] for s in shards])
        assert torch.equal(ids.sort().values, torch.arange(T * total_envs))  # disjoint, and all of them
        sizes = [int(s.local_valid().sum()) for s in shards]
        assert sum(sizes) == 4 * total_envs and max(sizes) - min(sizes) <= 4 * len(ENVS)  # within a column a segment
    idle = shard_rows(segments, valid, 8, 9)  # 8 env columns, 9 ranks: it holds a column, every row masked
    assert [(j, c.tolist()) for j, c in idle.parts] == [(0, [0])]
    assert len(idle.row_ids) == T and not idle.local_valid().any() and idle.num_rows == 4 * total_envs


class RecordingRanks:
    """Collectives that log each call (every rank must make the same calls, in order); all-reduce
    is the identity and a broadcast replays what rank 0 sent in an earlier run."""

    def __init__(self, rank: int, world_size: int, sent: list[torch.Tensor]):
        self.rank, self.world_size, self.is_main = rank, world_size, rank == 0
        self.calls: list[tuple] = []
        self.sent = sent

    def wrap(self, module, some_unused=False):
        self.calls.append(("wrap",))
        return module

    def sync_optimizer(self, optimizer):
        self.calls.append(("sync_optimizer",))

    def broadcast_(self, tensor):
        self.calls.append(("broadcast", tuple(tensor.shape), tensor.dtype))
        if self.is_main:
            self.sent.append(tensor.clone())
        else:
            tensor.copy_(self.sent.pop(0))
        return tensor

    def all_reduce_(self, tensor):
        self.calls.append(("all_reduce", tuple(tensor.shape), tensor.dtype))
        return tensor

    def broadcast_buffers(self, module):
        self.calls.append(("broadcast_buffers",))


def test_a_rank_without_rows_makes_the_same_collective_calls():
    """Fewer env columns than ranks: the idle rank still steps with the others (DDP would hang)."""
    segments = update_segments(5)
    calls, sent = [], []
    for rank in (0, 8):
        ranks = RecordingRanks(rank, 9, sent)
        trainer = Trainer(make_policy(0), SCENARIOS["gae_warmup"], ranks=ranks)
        before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
        metrics = trainer.step(segments, 5)
        assert metrics["train/samples"] == 4 * sum(ENVS)
        calls.append(ranks.calls)
        if rank == 8:  # zero rows: zero gradients, and a fresh Adam does not move
            for name, value in trainer.policy.state_dict().items():
                assert torch.equal(value, before[name]), name
    assert calls[0] == calls[1]
    assert calls[0][0] == ("wrap",) and ("broadcast_buffers",) in calls[0]


def test_a_shard_prepares_the_same_rows_as_one_process():
    policy = make_policy(0)
    trainer = Trainer(policy, SCENARIOS["gae_warmup"])
    segments = update_segments(4)
    full = trainer.prepare(segments, 4)
    lags = [policy_lag(4, torch.from_numpy(s.versions)) for s in segments]
    valid = valid_rows(segments, 4, 2)
    assert torch.equal(full.valid, valid)
    for rank in range(2):
        shard = shard_rows(segments, valid, rank, 2)
        part = trainer._prepare(segments, lags, None, shard)
        idx = shard.row_ids
        for field in ("advantages", "returns", "values_old", "logp_old", "is_weights", "lags", "valid"):
            torch.testing.assert_close(getattr(part, field), getattr(full, field)[idx], rtol=1e-5, atol=1e-6, msg=field)
        torch.testing.assert_close(part.obs["states"], full.obs["states"][idx])


def test_segments_survive_the_broadcast_encoding():
    segments = update_segments(2)
    lengths, payload = pack_segments(segments)
    back = unpack_segments(lengths, payload)
    assert len(back) == len(segments)
    for a, b in zip(segments, back):
        for name, arr in a.to_tensors().items():
            np.testing.assert_array_equal(b.to_tensors()[name], arr, err_msg=name)


def test_rank_discovery_and_devices():
    assert torchrun_ranks({}) is None
    assert torchrun_ranks({"WORLD_SIZE": "1", "RANK": "0"}) is None
    info = torchrun_ranks({"WORLD_SIZE": "4", "RANK": "5", "LOCAL_RANK": "1"})
    assert (info.rank, info.local_rank, info.world_size) == (5, 1, 4)
    assert backend_and_device("auto", 3, cuda_devices=0) == ("gloo", "cpu")
    assert backend_and_device("auto", 3, cuda_devices=8) == ("nccl", "cuda:3")
    assert backend_and_device("nccl", 2, cuda_devices=1) == ("nccl", "cuda:0")  # pinned by CUDA_VISIBLE_DEVICES
    assert backend_and_device("gloo", 2, cuda_devices=8) == ("gloo", "cpu")
    with pytest.raises(ValueError, match="needs CUDA"):
        backend_and_device("nccl", 0, cuda_devices=0)
    with pytest.raises(ValueError, match="no GPU of its own"):
        backend_and_device("nccl", 3, cuda_devices=2)
    with pytest.raises(ValueError, match="auto, nccl or gloo"):
        backend_and_device("mpi", 0, cuda_devices=0)


if __name__ == "__main__":
    rank_main(sys.argv[1])
