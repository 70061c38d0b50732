"""MetaWorldEnv: shapes, seeding, auto-reset, task spreading, errors, and a scripted-expert success."""

import numpy as np
import pytest
from omegaconf import OmegaConf

from rlfleet.envs import ChunkedEnv, EnvConfig, EnvSpec, StepResult, make_env
from rlfleet.envs.metaworld import DIFFICULTY, TASK_DESCRIPTIONS, TASK_SETS, MetaWorldEnv, resolve_tasks
from rlfleet.envs.metaworld.config import MetaWorldEnvConfig
from rlfleet.envs.metaworld.env import _quat_from_matrix, _touching_object

S, D = 39, 4
GOAL = slice(36, 39)  # goal position in the MT observation


@pytest.fixture(scope="module")
def env() -> MetaWorldEnv:
    """2 reach envs, K=2, 5-step episodes: episodes end mid-chunk on the third chunk."""
    e = make_env(EnvConfig(task="reach-v3", chunk_size=2, max_episode_steps=5, seed=3), num_envs=2)
    assert isinstance(e, MetaWorldEnv)
    yield e
    e.close()


def _random_actions(rng: np.random.Generator, spec: EnvSpec) -> np.ndarray:
    return rng.uniform(-1, 1, size=(spec.num_envs, spec.chunk_size, spec.action_dim)).astype(np.float32)


def test_spec_and_obs_shapes(env: MetaWorldEnv) -> None:
    assert isinstance(env, ChunkedEnv)
    spec = env.spec
    assert (spec.state_dim, spec.action_dim, spec.chunk_size, spec.num_envs, spec.max_episode_steps) == (S, D, 2, 2, 5)
    assert spec.task_names == ["reach-v3", "reach-v3"]
    assert (spec.action_low, spec.action_high) == (-1.0, 1.0)
    obs = env.reset()
    assert obs["states"].shape == (2, S) and obs["states"].dtype == np.float32
    assert obs["task_ids"].dtype == np.int64 and obs["task_ids"].tolist() == [0, 0]
    assert obs["task_descriptions"] == [TASK_DESCRIPTIONS["reach-v3"]] * 2
    assert np.any(obs["states"][:, GOAL] != 0), "MT observations must include the goal"


def test_chunk_step_shapes(env: MetaWorldEnv) -> None:
    env.reset(np.array([1, 2]))
    res = env.chunk_step(_random_actions(np.random.default_rng(0), env.spec))
    assert isinstance(res, StepResult)
    assert res.obs["states"].shape == (2, S) and res.obs["states"].dtype == np.float32
    assert res.rewards.shape == (2, 2) and res.rewards.dtype == np.float32
    for name in ("terminated", "truncated", "success", "episode_done", "episode_success_once"):
        arr = getattr(res, name)
        assert arr.shape == (2,) and arr.dtype == bool, name
    assert res.episode_return.shape == (2,) and res.episode_return.dtype == np.float32
    assert res.episode_length.shape == (2,) and res.episode_length.dtype == np.int32
    assert res.final_obs["states"].shape == (2, S) and res.final_obs["states"].dtype == np.float32
    assert res.obs["instructions"].shape == (2, 128) and res.obs["instructions"].dtype == np.uint8
    assert "main_images" not in res.obs  # state-only unless image_size > 0
    assert np.all(res.rewards > 0) and not res.episode_done.any()


def test_reset_is_deterministic_in_seeds(env: MetaWorldEnv) -> None:
    first = env.reset(np.array([7, 8]))["states"]
    env.chunk_step(_random_actions(np.random.default_rng(1), env.spec))
    again = env.reset(np.array([7, 8]))["states"]
    np.testing.assert_array_equal(first, again)
    other = env.reset(np.array([9, 10]))["states"]
    assert np.all(np.abs(other[:, GOAL] - first[:, GOAL]).max(axis=1) > 1e-3), "new seeds must move the goals"
    assert not np.allclose(first[0, GOAL], first[1, GOAL]), "different envs got the same goal"


def test_default_seeds_follow_global_env_index() -> None:
    """reset() without seeds depends only on (cfg.seed, env_offset + i): slices of a batch agree."""
    cfg = EnvConfig(task="reach-v3", seed=11)
    whole, tail = MetaWorldEnv(cfg, 2), MetaWorldEnv(cfg, 1, env_offset=1)
    try:
        a, b = whole.reset()["states"], tail.reset()["states"]
        np.testing.assert_array_equal(a[1], b[0])
        assert not np.allclose(a[0, GOAL], a[1, GOAL])
        # A second reset() continues each env's generator rather than replaying the same episode.
        assert not np.allclose(whole.reset()["states"][:, GOAL], a[:, GOAL])
    finally:
        whole.close()
        tail.close()


def test_auto_reset_at_time_limit(env: MetaWorldEnv) -> None:
    obs = env.reset(np.array([4, 5]))
    goal = obs["states"][:, GOAL].copy()
    rng = np.random.default_rng(2)
    rewards = []
    for _ in range(2):  # 4 of 5 steps
        res = env.chunk_step(_random_actions(rng, env.spec))
        assert not res.episode_done.any() and not res.truncated.any()
        rewards.append(res.rewards)
    res = env.chunk_step(_random_actions(rng, env.spec))  # step 5 ends the episode at substep 0
    rewards.append(res.rewards[:, :1])

    assert res.truncated.all() and res.episode_done.all() and not res.terminated.any()
    assert np.all(res.rewards[:, 1] == 0), "substeps after the episode end must be ignored"
    assert res.episode_length.tolist() == [5, 5]
    np.testing.assert_allclose(res.episode_return, np.concatenate(rewards, axis=1).sum(axis=1), rtol=1e-5)
    # final_states is the old episode's last state; obs is the new episode's first state.
    np.testing.assert_array_equal(res.final_obs["states"][:, GOAL], goal)
    assert np.all(np.abs(res.obs["states"][:, GOAL] - goal).max(axis=1) > 1e-3)
    assert not np.allclose(res.final_obs["states"], res.obs["states"])

    # The new episode counts from zero: it ends again after 5 more steps (chunks of 2, 2, 1).
    dones = [env.chunk_step(_random_actions(rng, env.spec)).episode_done.all() for _ in range(3)]
    assert dones == [False, False, True]


def test_actions_are_clipped(env: MetaWorldEnv) -> None:
    big = np.full((2, 2, D), 5.0, dtype=np.float32)
    env.reset(np.array([1, 2]))
    a = env.chunk_step(big)
    env.reset(np.array([1, 2]))
    b = env.chunk_step(np.clip(big, -1, 1))
    np.testing.assert_array_equal(a.obs["states"], b.obs["states"])
    np.testing.assert_array_equal(a.rewards, b.rewards)


def test_bad_actions_raise(env: MetaWorldEnv) -> None:
    env.reset()
    with pytest.raises(ValueError, match=r"actions must have shape \(num_envs, chunk_size, action_dim\) = \(2, 2, 4\)"):
        env.chunk_step(np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        env.chunk_step(np.zeros((2, 1, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        env.chunk_step(np.full((2, 2, 4), np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="seeds"):
        env.reset(np.array([1, 2, 3]))


def test_step_before_reset_raises() -> None:
    e = MetaWorldEnv(EnvConfig(task="reach-v3"), 1)
    with pytest.raises(RuntimeError, match="reset"):
        e.chunk_step(np.zeros((1, 1, D), dtype=np.float32))
    e.close()


def test_mt10_task_spreading_with_offset() -> None:
    mt10 = TASK_SETS["MT10"]
    e = make_env(EnvConfig(task="MT10"), num_envs=3, env_offset=9)
    try:
        expected = [mt10[9], mt10[0], mt10[1]]
        assert e.spec.task_names == expected
        obs = e.reset()
        assert obs["task_ids"].tolist() == [9, 0, 1]
        assert obs["task_descriptions"] == [TASK_DESCRIPTIONS[t] for t in expected]
        res = e.chunk_step(np.zeros((3, 1, D), dtype=np.float32))
        assert res.obs["task_ids"].tolist() == [9, 0, 1]
    finally:
        e.close()


def test_task_resolution_and_errors() -> None:
    assert [len(resolve_tasks(n)) for n in ("MT10", "MT25", "MT50")] == [10, 25, 50]
    assert resolve_tasks("reach-v3, push-v3") == ["reach-v3", "push-v3"]
    with pytest.raises(ValueError, match="reach-v3"):  # the message lists valid names
        resolve_tasks("reach-v2")
    with pytest.raises(ValueError, match="nope-v3"):
        make_env(EnvConfig(task="reach-v3,nope-v3"), num_envs=1)
    with pytest.raises(ValueError, match="metaworld"):
        make_env(EnvConfig(name="isaac"), num_envs=1)


def test_task_tables_cover_all_tasks() -> None:
    all_tasks = set(TASK_SETS["MT50"])
    assert set(TASK_DESCRIPTIONS) == all_tasks and set(DIFFICULTY) == all_tasks
    assert set(DIFFICULTY.values()) == {"easy", "medium", "hard", "very_hard"}


def test_env_config_is_an_omegaconf_structured_config() -> None:
    cfg = OmegaConf.merge(OmegaConf.structured(EnvConfig), {"task": "MT10", "chunk_size": 4})
    assert OmegaConf.to_object(cfg) == EnvConfig(task="MT10", chunk_size=4)


@pytest.mark.filterwarnings("ignore:Constant.*may be too high")
def test_scripted_expert_reaches_success() -> None:
    from metaworld.policies import ENV_POLICY_MAP

    policy = ENV_POLICY_MAP["reach-v3"]()
    e = MetaWorldEnv(EnvConfig(task="reach-v3", chunk_size=1, max_episode_steps=100), 1)
    try:
        states = e.reset(np.array([0]))["states"]
        for _ in range(100):
            action = policy.get_action(states[0].astype(np.float64))
            res = e.chunk_step(action.reshape(1, 1, D).astype(np.float32))
            states = res.obs["states"]
            if res.episode_done[0]:
                break
        assert res.episode_done[0] and res.episode_length[0] == 100
        assert res.episode_success_once[0]
    finally:
        e.close()


def test_fast_quaternion_matches_scipy_bit_for_bit() -> None:
    from scipy.spatial.transform import Rotation

    mats = list(Rotation.random(500, random_state=0).as_matrix())
    mats += [np.eye(3), np.diag([1.0, -1.0, -1.0]), np.diag([-1.0, 1.0, -1.0]), np.diag([-1.0, -1.0, 1.0])]
    for m in mats:
        np.testing.assert_array_equal(_quat_from_matrix(m), Rotation.from_matrix(m).as_quat())
    assert _quat_from_matrix(np.diag([1.0, 1.0, 1.001])) is None  # scipy would orthogonalise: defer to it
    assert _quat_from_matrix(-np.eye(3)) is None  # scipy would raise: defer to it


@pytest.mark.filterwarnings("ignore:Constant.*may be too high")
def test_fast_contact_check_matches_metaworld() -> None:
    from metaworld.policies import ENV_POLICY_MAP
    from metaworld.sawyer_xyz_env import SawyerXYZEnv

    policy = ENV_POLICY_MAP["pick-place-v3"]()
    e = MetaWorldEnv(EnvConfig(task="pick-place-v3"), 1)
    try:
        raw = e._envs[0]
        obj = raw._get_id_main_object()
        states, touching = e.reset(np.array([0]))["states"], []
        for _ in range(60):
            action = policy.get_action(states[0].astype(np.float64))
            states = e.chunk_step(action.reshape(1, 1, D).astype(np.float32)).obs["states"]
            expected = SawyerXYZEnv.touching_object(raw, obj)
            assert _touching_object(raw, obj) == expected
            touching.append(expected)
        assert any(touching) and not all(touching), "rollout should cover both contact states"
    finally:
        e.close()


def test_pixel_observations_and_instructions() -> None:
    """main_images come from the corner camera, upright, and the final frame is the old episode's."""
    from rlfleet.envs.api import decode_instructions

    cfg = EnvConfig(task="reach-v3,drawer-close-v3", max_episode_steps=3, chunk_size=2, image_size=32)
    with MetaWorldEnv(cfg, 2) as env:
        obs = env.reset(np.array([1, 2]))
        assert obs["main_images"].shape == (2, 32, 32, 3) and obs["main_images"].dtype == np.uint8
        assert obs["main_images"].std() > 5, "a blank frame: the renderer did not draw the scene"
        assert decode_instructions(obs["instructions"]) == obs["task_descriptions"]
        assert obs["task_descriptions"] == ["reach the goal position", "push the drawer closed"]
        first = obs["main_images"].copy()
        res = env.chunk_step(np.ones((2, 2, 4), np.float32))
        assert not np.array_equal(res.obs["main_images"], first)  # the arm moved
        assert not res.final_obs["main_images"].any()  # no episode ended yet
        res = env.chunk_step(np.ones((2, 2, 4), np.float32))  # step 3 ends both episodes
        assert res.episode_done.all()
        assert res.final_obs["main_images"].std() > 5
        assert not np.array_equal(res.final_obs["main_images"], res.obs["main_images"])


def _expert_rewards(reward_type: str, steps: int = 60):
    """Rewards and success flags of reach-v3's scripted expert, one action per step, seed 3."""
    cfg = EnvConfig(task="reach-v3", max_episode_steps=steps, chunk_size=1, reward_type=reward_type)
    with MetaWorldEnv(cfg, 1) as env:
        env.reset(np.array([3]))
        rewards, successes = [], []
        for _ in range(steps):
            res = env.chunk_step(env.expert_one(0).reshape(1, 1, 4))
            rewards.append(float(res.rewards[0, 0]))
            successes.append(bool(res.success[0]))
    return rewards, successes, res


def test_success_reward_counts_solved_steps() -> None:
    """reward_type=success: reward 1 exactly on the steps info['success'] is set, else 0."""
    rewards, successes, _ = _expert_rewards("success")
    assert set(rewards) <= {0.0, 1.0} and sum(rewards) > 0
    assert rewards == [float(s) for s in successes]


def test_success_once_reward_is_one_at_the_first_solved_step() -> None:
    """reward_type=success_once: 1 on the first solved step only, so the return is 0 or 1."""
    rewards, successes, res = _expert_rewards("success_once")
    assert sum(successes) > 1  # solved on several steps ...
    first = successes.index(True)
    assert rewards == [float(t == first) for t in range(60)]  # ... rewarded once
    assert res.episode_done[0] and res.episode_return[0] == 1.0 and res.episode_success_once[0]
    with pytest.raises(ValueError, match="reward_type"):
        MetaWorldEnv(EnvConfig(task="reach-v3", reward_type="shaped"), 1)


def test_terminate_on_success_ends_the_episode_at_the_first_solved_step() -> None:
    """terminate_on_success: the chunk stops at the solved substep, terminated (not truncated), auto-reset."""
    _, successes, _ = _expert_rewards("success_once")
    first = successes.index(True)  # the same expert and seed, without termination
    cfg = EnvConfig(
        task="reach-v3", max_episode_steps=60, chunk_size=8, reward_type="success_once", terminate_on_success=True
    )
    expert_cfg = EnvConfig(task="reach-v3", chunk_size=8, max_episode_steps=60)
    with MetaWorldEnv(cfg, 2) as env, MetaWorldEnv(expert_cfg, 2) as expert_env:
        env.reset(np.array([3, 3]))
        expert_env.reset(np.array([3, 3]))
        chunks = 0
        while True:  # the expert's chunks, labelled in an env that does not terminate
            _, labels, _ = expert_env.expert_chunk_step(np.zeros((2, 8, 4), np.float32), np.ones(2, bool))
            res = env.chunk_step(labels)
            chunks += 1
            if res.episode_done.any():
                break
    assert res.terminated.all() and not res.truncated.any() and res.episode_done.all()
    assert res.episode_length.tolist() == [first + 1] * 2 and chunks == first // 8 + 1
    assert res.episode_success_once.all() and res.episode_return.tolist() == [1.0, 1.0]
    k = first % 8
    assert res.rewards[:, k].tolist() == [1.0, 1.0] and not res.rewards[:, k + 1 :].any()
    assert not np.allclose(res.final_obs["states"], res.obs["states"])  # the next episode began


def test_experts_import_keeps_headless_rendering() -> None:
    """Importing MetaWorld's experts after this package must not let mujoco pick a windowed GL backend."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "import rlfleet.envs.metaworld\n"
        "from metaworld.policies import ENV_POLICY_MAP\n"
        "from rlfleet.envs.api import EnvConfig\n"
        "from rlfleet.envs.metaworld import MetaWorldEnv\n"
        "env = MetaWorldEnv(EnvConfig(task='reach-v3', image_size=16), 1)\n"
        "assert env.reset(np.array([0]))['main_images'].std() > 0\n"
        "env.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_goal_marker_changes_only_the_frames_of_tasks_with_a_goal_site() -> None:
    """env.goal_marker_size draws reach's goal as a green sphere: the frames show it, while states,
    rewards and success stay those of the stock task; a task without a `goal` site is untouched."""
    from rlfleet.envs.metaworld.render import GOAL_MARKER_RGBA

    def run(task: str, size: float):
        cfg = MetaWorldEnvConfig(task=task, max_episode_steps=8, chunk_size=2, image_size=64, goal_marker_size=size)
        with MetaWorldEnv(cfg, 2) as env:
            obs = env.reset(np.array([3, 4]))
            res = env.chunk_step(np.full((2, 2, 4), 0.5, np.float32))
            return obs, res

    stock, stock_step = run("reach-v3", 0.0)
    marked, marked_step = run("reach-v3", 0.05)
    green = lambda img: ((img[..., 1] > 200) & (img[..., 0] < 60) & (img[..., 2] < 60)).sum(axis=(1, 2))  # noqa: E731
    assert GOAL_MARKER_RGBA == (0.0, 1.0, 0.0, 1.0)
    assert (green(stock["main_images"]) == 0).all() and (green(marked["main_images"]) >= 6).all()
    np.testing.assert_array_equal(stock["states"], marked["states"])
    np.testing.assert_array_equal(stock_step.obs["states"], marked_step.obs["states"])
    np.testing.assert_array_equal(stock_step.rewards, marked_step.rewards)
    plain, _ = run("button-press-topdown-v3", 0.0)
    same, _ = run("button-press-topdown-v3", 0.05)  # no `goal` site: nothing to draw
    np.testing.assert_array_equal(plain["main_images"], same["main_images"])
    with pytest.raises(ValueError, match="goal_marker_size must be >= 0"):
        MetaWorldEnv(MetaWorldEnvConfig(task="reach-v3", goal_marker_size=-1.0), 1)


def test_first_frame_of_an_episode_shows_its_own_goal() -> None:
    """reach-v3 moves its goal site after its last forward pass; the reset frame must still draw
    the new goal where the following frames (after physics steps) draw it, and the site must sit
    at the goal the state reports."""
    cfg = MetaWorldEnvConfig(task="reach-v3", max_episode_steps=8, chunk_size=2, image_size=64, goal_marker_size=0.05)
    ys, xs = np.mgrid[0:64, 0:64]

    def centroid(img: np.ndarray) -> np.ndarray:
        green = (img[..., 1] > 200) & (img[..., 0] < 60) & (img[..., 2] < 60)
        assert green.sum() >= 6
        return np.array([(green * ys).sum(), (green * xs).sum()]) / green.sum()

    with MetaWorldEnv(cfg, 1) as env:
        for seed in (3, 4, 5):
            obs = env.reset(np.array([seed]))
            raw = env._envs[0]
            np.testing.assert_allclose(raw.data.site("goal").xpos, obs["states"][0, 36:39], atol=1e-6)
            after = env.chunk_step(np.zeros((1, 2, 4), np.float32)).obs
            np.testing.assert_allclose(centroid(obs["main_images"][0]), centroid(after["main_images"][0]), atol=0.5)


@pytest.mark.parametrize("task", ["reach-v3", "reach-wall-v3"])
def test_reach_experts_bring_the_fingertips_to_the_goal(task: str) -> None:
    """Success is the fingertips (`tcp_center`) within 5 cm of the goal; MetaWorld's expert steers
    the hand body, ~4.5 cm above them, onto the goal and settles on the rim of that ball. Ours
    settles with the fingertips at the goal and succeeds in every episode."""
    cfg = EnvConfig(task=task, chunk_size=1, max_episode_steps=100, reward_type="success", terminate_on_success=False)
    with MetaWorldEnv(cfg, 1) as env:
        raw = env._envs[0]
        for seed in range(5):
            env.reset(np.array([seed]))
            solved = False
            for _ in range(80):  # within the 100-step limit: no auto-reset
                solved |= bool(env.chunk_step(env.expert_one(0)[None, None]).success[0])
            assert solved
            assert np.linalg.norm(raw.tcp_center - raw._target_pos) < 0.02


def test_goal_readout_bench_runs_end_to_end() -> None:
    """bench/metaworld_goal_readout.py on a few frames: it renders, trains and reports one line."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "metaworld_goal_readout.py"
    args = ["--frames", "12", "--train", "8", "--steps", "3", "--marker", "0.05"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reach-v3 marker=0.05 train=8 goals, 4 held out" in proc.stdout
    assert "within 5 cm" in proc.stdout and "the best constant guess" in proc.stdout
    bad = subprocess.run([sys.executable, str(script), "--frames", "5", "--train", "5"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--train must be in (0, --frames=5)" in bad.stderr
