"""Pixel policies through real servers and processes: the batched inference server serves the
tiny VLA heads over every transport, the learner recomputes exactly the log-probs the server
returned, and a short pixel training run goes through learner + inference server + actor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from rlfleet.actors.inference_client import connect_inference
from rlfleet.envs.api import EnvConfig, encode_instructions, observation_spec
from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.inference_server.server import InferenceServer
from rlfleet.policies.registry import make_policy
from rlfleet.wire.shm import SharedArrays
from rlfleet.wire.slots import output_slot, slot_layout

S, D, K, SIZE, E = 39, 4, 4, 32, 6
OBS_SPEC = observation_spec(EnvConfig(image_size=SIZE), S)
WRIST_SPEC = observation_spec(EnvConfig(image_size=SIZE, wrist_camera=True), S)


@pytest.fixture(params=["tiny_oft", "tiny_pi0", "tiny_pi0/sde", "tiny_pi05/noise", "tiny_pi0/sde/wrist"])
def served(request):
    torch.manual_seed(0)
    name, flow_rl, wrist = (request.param.split("/") + ["", ""])[:3]  # flow policies: SDE and Noise extras too
    settings = {"name": name, "depth": 1, "logprob_type": "action", **({"flow_rl": flow_rl} if flow_rl else {})}
    if wrist:  # a second camera: one more observation key through the slots and every transport
        settings["wrist_camera"] = True
    policy = make_policy(settings, S, D, K, image_size=SIZE)
    spec = WRIST_SPEC if wrist else OBS_SPEC
    srv = InferenceServer(
        PolicyRunner(policy, version=3, obs_spec=spec), "127.0.0.1", 0, 0, max_batch=64, max_wait_ms=2
    )
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    yield srv, policy
    srv.stop()
    thread.join(10)


def _slots(policy) -> SharedArrays:
    extras = {k: (tuple(s), dt) for k, (s, dt) in policy.extra_outputs.items()}
    spec = WRIST_SPEC if "wrist_images" in policy.obs_keys else OBS_SPEC
    blk = SharedArrays.create(slot_layout(E, spec, D, K, tuple(policy.logprob_shape), extras))
    rng = np.random.default_rng(1)
    blk["states"][:] = rng.normal(size=(E, S)).astype(np.float32)
    for key in ("main_images", "wrist_images"):
        if key in spec:
            blk[key][:] = rng.integers(0, 255, (E, SIZE, SIZE, 3), dtype=np.uint8)
    blk["instructions"][:] = encode_instructions(["reach the goal position", "press the button"] * (E // 2))
    return blk


@pytest.mark.parametrize("transport", ["shm", "zmq", "grpc"])
def test_server_logprobs_equal_the_learners_recomputation(served, transport):
    srv, policy = served
    blk = _slots(policy)
    client = connect_inference(transport, srv.address, blk)
    try:
        client.submit(0, 0, E, deterministic=False)
        assert client.wait(0) == 3
    finally:
        client.close()
    obs = {k: torch.from_numpy(np.array(blk[k])) for k in policy.obs_keys}
    extras = {k: torch.from_numpy(np.array(blk[output_slot(k)])) for k in policy.extra_outputs}
    assert blk["logprobs"].shape == (E, K)  # per-action log-probs travel as they are
    with torch.no_grad():
        logp, _, values = policy.evaluate(obs, torch.from_numpy(np.array(blk["actions"])), extras)
    np.testing.assert_allclose(blk["logprobs"], logp.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(blk["values"], values.numpy(), rtol=1e-4, atol=1e-5)
    blk.close()


PIXEL_RUN = [
    "env.task=reach-v3,button-press-topdown-v3",
    "env.image_size=32",
    "env.chunk_size=4",
    "env.max_episode_steps=16",
    "policy.depth=1",
    "demos.bootstrap=false",
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
    "eval.video_cfg.save_video=true",
]


def _train(recipe: str, *overrides: str) -> None:
    """`rlfleet train RECIPE OVERRIDES` in a child process (learner, inference server and actors
    are its children); fails the test with the run's stderr tail."""
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "train", recipe, *overrides],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("policy", ["tiny_oft", "tiny_pi05"])
def test_short_pixel_training_run_through_real_processes(tmp_path, policy):
    run = tmp_path / "run"
    _train("metaworld_quickstart_tinyoft", *PIXEL_RUN, f"policy.name={policy}", f"runner.logger.log_path={run}")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 4 and summary["rejected_segments"] == 0
    assert set(summary["eval_success"]) == set(summary["eval_before"]) == {"reach-v3", "button-press-topdown-v3"}
    assert (run / "before_after.md").exists() and "Before" in (run / "before_after.md").read_text()
    assert list((run / "videos").rglob("*.mp4")), "eval videos were asked for"
    cfg = json.loads(
        (run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "config.json").read_text()
    )
    assert cfg["policy"]["name"] == policy and cfg["image_size"] == 32


def test_short_calvin_run_with_the_wrist_camera_through_real_processes(tmp_path):
    """env.wrist_camera + policy.wrist_camera: demos with both cameras, SFT, then RL through learner,
    inference server and actor processes, and the checkpoint keeps reading both cameras."""
    pytest.importorskip("pybullet")
    from rlfleet.runs.collect import collect_env_demos

    demos = tmp_path / "demos"
    chain = EnvConfig(name="calvin", task="D", max_episode_steps=1800, image_size=16, wrist_camera=True)
    collect_env_demos(demos, chain, episodes_per_task=1, progress=False)
    run = tmp_path / "run"
    _train(
        "calvin_d_d_ppo_tinypi0_cpu",
        "env.image_size=16",
        "env.wrist_camera=true",
        "policy.wrist_camera=true",
        "policy.depth=1",
        "env.max_episode_steps=40",
        f"demos.path={demos}",
        f"demos.cache_dir={tmp_path / 'cache'}",
        "sft.steps=5",
        "sft.eval_episodes_per_task=0",
        "actor.num_envs=2",
        "actor.num_workers=1",
        "actor.rollout_len=2",
        "learner.batch_samples=8",  # samples: chunks of 8 env steps
        "runner.total_env_steps=256",
        "runner.max_wall_seconds=0",
        "eval.episodes_per_task=1",
        f"runner.logger.log_path={run}",
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 3 and summary["rejected_segments"] == 0
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    assert json.loads((ckpt / "config.json").read_text())["policy"]["wrist_camera"] is True
    from rlfleet.policies.checkpoint_io import load_checkpoint

    policy, _ = load_checkpoint(ckpt)
    assert "wrist_images" in policy.obs_keys
