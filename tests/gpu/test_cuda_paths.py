"""The CUDA paths, on a host with a GPU: `pytest tests/gpu` (every test skips without CUDA).

Each path is checked against the same computation on the CPU (the PPO update, the inference
server's batched act, behaviour cloning) or end to end through real processes (`rlfleet train`
with the learner, the inference server and SFT on the GPU, then `rlfleet eval` on the CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from mlp_segments import make_segment

from rlfleet.algorithms import PPOConfig
from rlfleet.config import SFTConfig
from rlfleet.envs.api import EnvConfig, encode_instructions, observation_spec
from rlfleet.inference_server.batcher import InferenceRequest
from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.learner.trainer import Trainer
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig
from rlfleet.policies.registry import make_policy
from rlfleet.runs.sft import SFTData, train_sft

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

S, D, K, SIZE = 39, 4, 4, 32


def test_ppo_update_on_cuda_matches_the_cpu_update():
    torch.manual_seed(0)
    cpu_policy = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[64, 64]))
    gpu_policy = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[64, 64]))
    gpu_policy.load_state_dict(cpu_policy.state_dict())
    terminated = np.zeros((16, 8), bool)
    terminated[8, 0] = True
    segments = [make_segment(cpu_policy, 16, 8, [0] * 16, seed, terminated=terminated) for seed in range(3)]
    # One minibatch: the minibatch order comes from the device's own RNG, so only a whole-batch
    # step is the same computation on both devices.
    cfg = PPOConfig(update_epochs=3, num_minibatches=1, lr=1e-3)
    results = []
    for policy, device in ((cpu_policy, "cpu"), (gpu_policy, "cuda")):
        trainer = Trainer(policy, cfg, device=device)
        results.append(trainer.step(segments, version=0))
    assert next(gpu_policy.parameters()).device.type == "cuda"
    for (name, p_cpu), (_, p_gpu) in zip(cpu_policy.named_parameters(), gpu_policy.named_parameters(), strict=True):
        torch.testing.assert_close(p_gpu.cpu(), p_cpu, rtol=1e-4, atol=1e-5, msg=name)
    cpu_stats, gpu_stats = results
    assert gpu_stats["train/samples"] == cpu_stats["train/samples"] == 3 * 16 * 8
    assert gpu_stats["train/actor/policy_loss"] == pytest.approx(cpu_stats["train/actor/policy_loss"], abs=1e-4)


def _pixel_request(n: int, deterministic: bool, out: list) -> InferenceRequest:
    rng = np.random.default_rng(3)
    obs = {
        "states": rng.normal(size=(n, S)).astype(np.float32),
        "main_images": rng.integers(0, 255, (n, SIZE, SIZE, 3), dtype=np.uint8),
        "instructions": encode_instructions(["reach the goal position", "press the button"] * (n // 2)),
    }
    return InferenceRequest(obs=obs, deterministic=deterministic, respond=lambda o, v: out.append(o), fail=pytest.fail)


@pytest.mark.parametrize("name", ["tiny_oft", "tiny_pi0"])
def test_inference_server_batch_on_cuda_matches_the_cpu(name):
    torch.manual_seed(0)
    policy = make_policy({"name": name, "depth": 1}, S, D, K, image_size=SIZE)
    spec = observation_spec(EnvConfig(image_size=SIZE), S)
    outs: dict[str, list] = {"cpu": [], "gpu": []}
    for label, device in (("cpu", "cpu"), ("gpu", "cuda")):
        runner = PolicyRunner(policy, version=1, device=device, obs_spec=spec)
        runner.run([_pixel_request(8, True, outs[label])])
    (cpu,), (gpu,) = outs["cpu"], outs["gpu"]
    assert isinstance(gpu["actions"], np.ndarray)  # back on the host, ready for the wire
    if name == "tiny_oft":  # argmax over token logits (flow policies draw noise)
        # GPU kernels round differently from the CPU's, which flips the argmax where two bins
        # are nearly tied: 2 of 128 action values on an H200.
        assert np.isclose(gpu["actions"], cpu["actions"], atol=1e-5).mean() >= 0.9
    np.testing.assert_allclose(gpu["values"], cpu["values"], rtol=1e-3, atol=1e-4)


def test_behaviour_cloning_on_cuda_follows_the_cpu_run():
    rng = np.random.default_rng(0)
    n = 96
    data = SFTData(
        obs={
            "states": rng.normal(size=(n, S)).astype(np.float32),
            "main_images": rng.integers(0, 255, (n, SIZE, SIZE, 3), dtype=np.uint8),
            "instructions": encode_instructions(["reach the goal position"] * n),
        },
        actions=rng.uniform(-1, 1, size=(n, K, D)).astype(np.float32),
        episode=np.repeat(np.arange(4), n // 4),
    )
    histories = {}
    for label, device in (("cpu", "cpu"), ("gpu", "cuda")):
        torch.manual_seed(0)
        policy = make_policy({"name": "tiny_oft", "depth": 1}, S, D, K, image_size=SIZE)
        cfg = SFTConfig(steps=20, batch_size=16, device=device)
        histories[label] = [h["loss"] for h in train_sft(policy, data, cfg, progress=False)]
        assert next(policy.parameters()).device.type == "cpu"  # saved and evaluated from the CPU
    np.testing.assert_allclose(histories["gpu"][0], histories["cpu"][0], rtol=1e-3)  # the same minibatches
    assert histories["gpu"][-1] < histories["gpu"][0]


def _cli(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_pixel_training_on_cuda_through_real_processes_then_cpu_eval(tmp_path):
    """Demos, SFT on the GPU, PPO with the learner and the inference server on the GPU, and the
    checkpoint it writes evaluated by `rlfleet eval` on the CPU."""
    run = tmp_path / "run"
    res = _cli(
        "train",
        "metaworld_quickstart_tinyoft",
        "env.task=reach-v3",
        "env.image_size=32",
        "env.chunk_size=4",
        "env.max_episode_steps=60",  # the scripted expert's demos must succeed
        "policy.depth=1",
        "demos.episodes_per_task=2",
        f"demos.cache_dir={tmp_path / 'cache'}",
        "sft.steps=10",
        "sft.device=cuda",
        "learner.device=cuda",
        "inference.device=cuda",
        "actor.num_envs=4",
        "actor.num_workers=1",
        "actor.pipeline_stage_num=2",
        "actor.rollout_len=4",
        "learner.batch_samples=16",
        "runner.total_env_steps=512",
        "runner.max_wall_seconds=0",
        "runner.checkpoint_every=2",
        "eval.episodes_per_task=1",
        "eval.before=true",
        "eval.every_updates=2",  # periodic evaluation of the policy on the GPU
        f"runner.logger.log_path={run}",
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 4 and summary["rejected_segments"] == 0
    assert set(summary["eval_success"]) == {"reach-v3"}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert events.Scalars("eval/elapsed_s")  # the periodic evaluation ran during training too
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    ev = _cli("eval", str(ckpt), "--episodes", "1", "--json", timeout=300)
    assert ev.returncode == 0, ev.stderr[-3000:]
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    assert [row["task"] for row in result["tasks"]] == ["reach-v3"]


def test_state_training_with_every_role_placed_on_the_gpu(tmp_path):
    """RLinf's placement grammar on one GPU: env, rollout and actor all on device 0."""
    run = tmp_path / "run"
    res = _cli(
        "train",
        "metaworld_reach_ppo",
        "env.max_episode_steps=20",
        "actor.num_envs=4",
        "actor.num_workers=1",
        "actor.rollout_len=8",
        "learner.batch_samples=64",
        "runner.total_env_steps=640",
        "runner.max_wall_seconds=0",
        "eval.episodes_per_task=2",
        "policy.hidden_sizes=[32,32]",
        "cluster.component_placement={'env,rollout,actor': all}",
        f"runner.logger.log_path={run}",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 9 and 0.0 <= summary["eval_success"]["reach-v3"] <= 1.0


def test_dagger_on_cuda(tmp_path):
    """DAgger's student acts, trains and is evaluated on the GPU (the SFT bootstrap too)."""
    run = tmp_path / "run"
    res = _cli(
        "train",
        "metaworld_dagger_tinypi0_cpu",
        "env.task=reach-v3",
        "env.max_episode_steps=48",
        "env.chunk_size=8",
        "env.image_size=32",
        "policy.dim=32",
        "policy.depth=1",
        "policy.heads=2",
        "demos.episodes_per_task=1",
        "demos.num_workers=1",
        f"demos.cache_dir={tmp_path / 'cache'}",
        "sft.steps=3",
        "sft.batch_size=8",
        "sft.device=cuda",
        "dagger.device=cuda",
        "dagger.iterations=2",
        "dagger.num_envs=2",
        "dagger.train_steps=3",
        "dagger.batch_size=8",
        "dagger.window=80",
        "eval.episodes_per_task=1",
        "runner.max_wall_seconds=0",
        f"runner.logger.log_path={run}",
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == "dagger" and summary["iterations"] == 2
