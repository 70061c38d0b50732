"""RoboTwin-style dual-arm env (SAPIEN): tasks, experts, seeds, batch semantics, rendering."""

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("sapien")
pytest.importorskip("pybullet_data")

from rlfleet.envs import make_env  # noqa: E402
from rlfleet.envs.api import EnvConfig, decode_instructions  # noqa: E402
from rlfleet.envs.robotwin import scene as scene_mod  # noqa: E402
from rlfleet.envs.robotwin.config import RoboTwinEnvConfig  # noqa: E402
from rlfleet.envs.robotwin.env import ACTION_DIM, STATE_DIM, RoboTwinEnv, resolve_tasks  # noqa: E402
from rlfleet.envs.robotwin.seeds import HELD_OUT_SHIFT, SEED_DIR, load_seeds  # noqa: E402
from rlfleet.envs.robotwin.settings import SETTINGS  # noqa: E402
from rlfleet.envs.robotwin.tasks import TASKS  # noqa: E402


def _cfg(task: str, **kw) -> RoboTwinEnvConfig:
    base = dict(name="robotwin", task=task, max_episode_steps=300, chunk_size=8, reward_type="success_once")
    base.update(kw)
    return RoboTwinEnvConfig(**base)


@pytest.mark.parametrize("task", list(TASKS))
def test_expert_solves_and_zero_actions_do_not(task: str) -> None:
    env = RoboTwinEnv(_cfg(task), 1)
    try:
        obs = env.reset(np.array([0]))
        assert obs["states"].shape == (1, STATE_DIM) and np.isfinite(obs["states"]).all()
        assert decode_instructions(obs["instructions"]) == [TASKS[task].instruction]
        solved = False
        for _ in range(300 // 8):
            res, labels, executed = env.expert_chunk_step(np.zeros((1, 8, ACTION_DIM), np.float32), np.ones(1, bool))
            assert labels.shape == (1, 8, ACTION_DIM) and np.array_equal(labels, executed)
            if res.success[0]:
                solved = True
                break
        assert solved, f"expert failed {task} on train seed 0"

        env.reset(np.array([0]))
        for _ in range(8):
            res = env.chunk_step(np.zeros((1, 8, ACTION_DIM), np.float32))
            assert not res.success[0] and res.rewards.sum() == 0
    finally:
        env.close()


def test_terminate_on_success_ends_the_expert_episode_when_solved() -> None:
    task = next(iter(TASKS))
    env = RoboTwinEnv(_cfg(task, terminate_on_success=True), 1)
    try:
        env.reset(np.array([0]))
        for _ in range(300 // 8):
            res, _, _ = env.expert_chunk_step(np.zeros((1, 8, ACTION_DIM), np.float32), np.ones(1, bool))
            if res.episode_done[0]:
                break
        assert res.terminated[0] and not res.truncated[0] and res.success[0]
        assert res.episode_success_once[0] and res.episode_return[0] == 1.0 and res.episode_length[0] < 300
    finally:
        env.close()


def test_progress_reward_is_potential_based_shaping_on_the_expert_path() -> None:
    """place_empty_cup's stages rise 0 -> 0.25 -> 0.5 -> 0.75 -> 1 along the expert's episode; each
    step's reward is success plus w * (progress after - progress before), so the episode's shaping
    sums to w * (last - first progress); without the setting the rewards are the plain success ones."""
    w, steps = 2.0, 120
    rewards = {}
    for weight in (0.0, w):
        env = RoboTwinEnv(_cfg("place_empty_cup", chunk_size=1, reward_type="success", progress_reward=weight), 1)
        try:
            env.reset(np.array([0]))
            slot = env._slots[0]
            seen, got, solved = [slot.task.progress()], [], []
            for _ in range(steps):
                res, _, _ = env.expert_chunk_step(np.zeros((1, 1, ACTION_DIM), np.float32), np.ones(1, bool))
                got.append(float(res.rewards[0, 0]))
                solved.append(bool(res.success[0]))
                seen.append(slot.task.progress())
            rewards[weight] = np.array(got)
        finally:
            env.close()
    stages = [p for i, p in enumerate(seen) if i == 0 or p != seen[i - 1]]
    assert stages == [0.0, 0.25, 0.5, 0.75, 1.0] and any(solved)
    np.testing.assert_array_equal(rewards[0.0], np.array(solved, np.float32))
    shaping = rewards[w] - np.array(solved, np.float32)
    np.testing.assert_allclose(shaping, w * np.diff(seen), atol=1e-6)
    assert shaping.sum() == pytest.approx(w * (seen[-1] - seen[0]))
    plain = RoboTwinEnv(_cfg("click_bell", chunk_size=1, reward_type="success", progress_reward=w), 1)
    try:  # a task without stages: no shaping
        plain.reset(np.array([0]))
        assert plain._slots[0].task.progress() is None
        res, _, _ = plain.expert_chunk_step(np.zeros((1, 1, ACTION_DIM), np.float32), np.ones(1, bool))
        assert res.rewards[0, 0] == float(res.success[0])
    finally:
        plain.close()


def test_progress_reward_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="progress_reward must be >= 0"):
        RoboTwinEnv(_cfg("place_empty_cup", progress_reward=-1.0), 1)
    with pytest.raises(ValueError, match="success_once pays 0/1"):
        RoboTwinEnv(_cfg("place_empty_cup", progress_reward=1.0), 1)  # _cfg's reward_type is success_once


def test_seed_files_are_disjoint_and_complete() -> None:
    for task in TASKS:
        for setting in SETTINGS:
            train, evals = load_seeds(task, "train", setting), load_seeds(task, "eval", setting)
            assert len(train) >= 20 and len(evals) >= 10
            assert len(set(train)) == len(train) and len(set(evals)) == len(evals)
            assert not set(train) & set(evals), f"{task}/{setting}: train and eval seeds overlap"
    for path in SEED_DIR.glob("*.json"):
        assert set(json.loads(path.read_text())) <= set(SETTINGS)


def test_split_any_never_plays_a_held_out_layout() -> None:
    """Demo collection's seeds start at 1_000_000, where the eval seeds do: split `any` shifts the
    task's eval seeds away (other seeds play as given); only the eval seed search plays them raw."""
    first_eval = load_seeds("place_empty_cup", "eval", "clean")[0]
    held_out = RoboTwinEnv(_cfg("place_empty_cup:eval", chunk_size=1), 1)
    trained = RoboTwinEnv(_cfg("place_empty_cup:any", chunk_size=1), 1)
    searched = RoboTwinEnv(_cfg("place_empty_cup:any", chunk_size=1), 1, allow_held_out=True)
    try:
        eval_state = held_out.reset(np.array([0]))["states"]
        assert held_out.episode_seeds == [first_eval]
        state = trained.reset(np.array([first_eval]))["states"]
        assert trained.episode_seeds == [first_eval + HELD_OUT_SHIFT]
        assert not np.allclose(state, eval_state)
        trained.reset(np.array([7]))
        assert trained.episode_seeds == [7]
        assert np.array_equal(searched.reset(np.array([first_eval]))["states"], eval_state)
        assert searched.episode_seeds == [first_eval]
    finally:
        for env in (held_out, trained, searched):
            env.close()


def test_one_scene_under_two_layouts_has_one_scene_id() -> None:
    """Env i's reset seed walks task i's list by seed // (number of tasks): the same held-out scene
    has another reset seed in a one-task and a two-task evaluation, and one `episode_scenes` id."""
    alone = RoboTwinEnv(_cfg("place_empty_cup:eval", chunk_size=1), 1)
    both = RoboTwinEnv(_cfg("place_empty_cup:eval,click_bell:eval", chunk_size=1), 2)
    try:
        state = alone.reset(np.array([1]))["states"][0]
        assert alone.episode_scenes() == [load_seeds("place_empty_cup", "eval", "clean")[1]]
        states = both.reset(np.array([2, 3]))["states"]
        assert both.episode_scenes()[0] == alone.episode_scenes()[0]
        assert np.array_equal(states[0], state)
    finally:
        alone.close()
        both.close()


def test_a_remote_env_carries_the_servers_scene_ids() -> None:
    """Through an EnvService server the scene ids come back with each Reset, so evaluations over
    the wire pair RoboTwin's episodes by scene as local ones do."""
    from rlfleet.envs.env_server import EnvServerConfig, serve_env

    cfg = _cfg("place_empty_cup:eval,click_bell:eval", chunk_size=1)
    srv, port, _ = serve_env(EnvServerConfig(env=cfg, num_envs=2, max_envs=4))
    local = RoboTwinEnv(cfg, 2)
    remote = make_env(dataclasses.replace(cfg, name=f"remote://127.0.0.1:{port}?connect_timeout=20&timeout=60"), 2)
    try:
        for seeds in ([2, 3], [4, 5]):
            np.testing.assert_array_equal(
                remote.reset(np.array(seeds))["states"], local.reset(np.array(seeds))["states"]
            )
            assert remote.episode_scenes() == local.episode_scenes() != seeds  # scene seeds, not reset seeds
    finally:
        remote.close()
        local.close()
        srv.stop(0)


def test_batch_shapes_auto_reset_and_seed_schedule() -> None:
    B, K, T = 3, 4, 10
    env = make_env(
        _cfg("place_empty_cup,click_bell:randomized", max_episode_steps=T, chunk_size=K, reward_type="dense"),
        B,
        env_offset=1,
    )
    try:
        assert env.task_list == ["place_empty_cup", "click_bell:randomized"]
        assert env.spec.task_names == ["click_bell:randomized", "place_empty_cup", "click_bell:randomized"]
        obs = env.reset()
        assert obs["states"].shape == (B, STATE_DIM) and obs["states"].dtype == np.float32
        assert obs["task_ids"].tolist() == [1, 0, 1]
        train = load_seeds("click_bell", "train", "randomized")
        assert env.episode_seeds[0] == train[1 // 2]  # env 0 of offset 1: global index 1, 2 task items
        first = obs["states"].copy()
        done_at = []
        for c in range(3):
            res = env.chunk_step(np.zeros((B, K, ACTION_DIM), np.float32))
            assert res.rewards.shape == (B, K) and res.obs["states"].shape == (B, STATE_DIM)
            assert ((res.rewards >= 0) & (res.rewards <= 1.1)).all()
            if res.episode_done.any():
                done_at.append(c)
                assert res.truncated.all() and not res.terminated.any()
                assert (res.episode_length == T).all()
                assert (res.rewards[:, T - 2 * K :] == 0).all()  # substeps after the end are skipped
                assert np.abs(res.final_obs["states"]).sum() > 0
        assert done_at == [2]
        assert env.episode_seeds[0] == train[(1 + 4) // 2]  # next episode: index + num_total_envs (offset 1 + 3)
        env.reset(np.array([1, 0, 1]))  # explicit seeds // 2 items index the seed list
        again = env.reset(np.array([1, 0, 1]))
        np.testing.assert_allclose(again["states"], env.reset(np.array([1, 0, 1]))["states"], atol=1e-5)
        np.testing.assert_allclose(again["states"][0], first[0], atol=1e-5)
    finally:
        env.close()


def test_task_strings() -> None:
    assert len(resolve_tasks("all")) == 10
    assert resolve_tasks("all:randomized:eval")[0] == "adjust_bottle:randomized:eval"
    with pytest.raises(ValueError, match="unknown RoboTwin task"):
        resolve_tasks("fold_laundry")
    with pytest.raises(ValueError, match="unknown option"):
        resolve_tasks("click_bell:messy")


def test_images_need_a_renderer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scene_mod, "render_available", lambda: False)
    with pytest.raises(RuntimeError, match="Vulkan device"):
        RoboTwinEnv(_cfg("click_bell", image_size=32), 1)


@pytest.mark.skipif(
    not scene_mod.render_available(), reason="no Vulkan device (GPU or Mesa >= 25 lavapipe: deploy/install_lavapipe.sh)"
)
def test_head_camera_images() -> None:
    env = RoboTwinEnv(_cfg("place_empty_cup:randomized", image_size=48, max_episode_steps=4, chunk_size=2), 2)
    try:
        obs = env.reset()
        imgs = obs["main_images"]
        assert imgs.shape == (2, 48, 48, 3) and imgs.dtype == np.uint8 and imgs.std() > 5
        res = env.chunk_step(np.zeros((2, 2, ACTION_DIM), np.float32))
        res = env.chunk_step(np.zeros((2, 2, ACTION_DIM), np.float32))
        assert res.episode_done.all() and res.final_obs["main_images"].std() > 5
    finally:
        env.close()


def test_multi_task_evaluation_seeds_reach_every_eval_entry():
    """evaluate_policy resets env i (task i mod n) with seeds base + j*n + i: each task must get
    a different list entry for every j (all 20 eval seeds), not every n-th one."""
    env = RoboTwinEnv(EnvConfig(name="robotwin", task="click_bell:eval,place_empty_cup:eval"), 2)
    try:
        seen = [set(), set()]
        for j in range(20):
            env.reset(np.array([10_000 + 2 * j, 10_000 + 2 * j + 1]))
            for i, seed in enumerate(env.episode_seeds):
                seen[i].add(seed)
        assert [len(s) for s in seen] == [20, 20]
    finally:
        env.close()


def test_the_experts_demos_wait_at_waypoints_and_no_op_dropping_removes_only_waits(tmp_path) -> None:
    """The scripted expert emits zero-motion frames while the arm catches up with a waypoint (a
    third of place_empty_cup's frames); sft.drop_noop_frames drops those and keeps every frame
    that moves an arm or switches a gripper."""
    from rlfleet.data.demos import drop_noop_frames, load_demos
    from rlfleet.envs.registry import gripper_action_dims
    from rlfleet.runs.collect import collect_env_demos

    dims = gripper_action_dims("robotwin")
    assert dims == (3, 7)
    collect_env_demos(tmp_path / "d", _cfg("place_empty_cup", chunk_size=1, reward_type="success"), 1, progress=False)
    (ep,) = load_demos(tmp_path / "d")
    out = drop_noop_frames(ep, dims)
    motion = [0, 1, 2, 4, 5, 6]
    moves = np.abs(ep.actions[:, motion]).max(1) > 1e-3
    switches = np.r_[True, (ep.actions[1:, [3, 7]] != ep.actions[:-1, [3, 7]]).any(1)]
    assert ep.length - out.length >= ep.length // 4  # the waits are a large share
    assert out.length == int((moves | switches)[: ep.success_step].sum()) + ep.length - ep.success_step
    assert out.step_success[out.success_step] and not out.step_success[: out.success_step].any()
    # DAgger starts its aggregated dataset from the same samples SFT trained on
    from rlfleet.config import load_config
    from rlfleet.runs.dagger import _load_demos

    for drop, length in ((False, ep.length), (True, out.length)):
        cfg = load_config(
            "robotwin_multitask_ppo_mlp_cpu", [f"demos.path={tmp_path / 'd'}", f"sft.drop_noop_frames={drop}"]
        )
        obs, labels = _load_demos(cfg, ("states",), 1)
        assert obs["states"].shape[0] == labels.shape[0] == length


def test_stage_counts_bench_follows_a_policy_through_the_stages(tmp_path) -> None:
    """bench/robotwin_stages.py: the scripted expert takes both held-out layouts through every
    stage to success, zero actions through none; a checkpoint runs end to end; a task without
    stages is refused."""
    import importlib.util
    from pathlib import Path

    from rlfleet.policies.checkpoint_io import model_config, save_checkpoint_folder
    from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig

    path = Path(__file__).parents[2] / "bench" / "robotwin_stages.py"
    spec = importlib.util.spec_from_file_location("robotwin_stages", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    env = RoboTwinEnv(_cfg("place_empty_cup:eval", chunk_size=1, reward_type="success", max_episode_steps=301), 1)
    try:
        expert = bench.follow_stages(env, lambda obs: env.expert_actions()[:, None, :], episodes=2, max_steps=300)
        assert expert == dict.fromkeys(["held", "lifted", "over the coaster", "lowered", "success"], 2)
        idle = bench.follow_stages(env, lambda obs: np.zeros((1, 1, ACTION_DIM), np.float32), episodes=2, max_steps=8)
        assert set(idle.values()) == {0}
    finally:
        env.close()

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    policy = GaussianMLPPolicy(STATE_DIM, ACTION_DIM, 1, PolicyConfig(hidden_sizes=[16]))
    config = model_config({"name": "gaussian_mlp", "hidden_sizes": [16]}, STATE_DIM, ACTION_DIM, 1)
    save_checkpoint_folder(tmp_path / "ckpt", policy, config)
    counts = bench.stage_counts(str(tmp_path / "ckpt"), episodes=1, max_steps=8)
    assert list(counts) == ["held", "lifted", "over the coaster", "lowered", "success"]
    with pytest.raises(SystemExit, match="no stages"):
        bench.stage_counts(str(tmp_path / "ckpt"), task="click_bell", episodes=1, max_steps=8)
