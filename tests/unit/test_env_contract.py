"""One contract, every env: the episode semantics of `rlfleet.envs.api` checked the same way for
MetaWorld, RoboTwin-style, CALVIN-style, a remote env (EnvService on loopback), gymnasium envs,
the example plugin and the zero-cost benchmark env: shapes, seeds reproduce, truncation vs
termination, the final observation,
episode stats, auto-reset, terminate_on_success and bad actions."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfleet.envs.api import INSTRUCTION_BYTES, ChunkedEnv, EnvConfig
from rlfleet.envs.registry import make_env

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "examples" / "rlfleet_plugin_example" / "src"
PLUGIN_ENV = "rlfleet_plugin_example.env:PointReachEnv"


def _point_solver(env: ChunkedEnv, obs: dict) -> np.ndarray:
    """Moves the point (state [pos, goal], steps of 0.1 per unit action) straight to its goal."""
    pos, goal = obs["states"][:, 0], obs["states"][:, 1]
    a = np.clip((goal - pos) / 0.1, -1.0, 1.0).astype(np.float32)
    return np.repeat(a[:, None, None], env.spec.chunk_size, axis=1)


def _expert_solver(env: ChunkedEnv, obs: dict) -> np.ndarray:
    """The env's own scripted expert (a chunk repeats the expert's action at its first state)."""
    return np.repeat(env.expert_actions()[:, None, :], env.spec.chunk_size, axis=1)


# --- a gymnasium env with a Dict observation and a success flag (registered in this process) ----------


class _GoalDictEnv:
    """gymnasium.Env on a line: Dict obs {pos, goal}, Box action in [-2, 2] (rescaled by the adapter),
    `is_success` within 0.1 of the goal, terminated when it leaves [-3, 3], TimeLimit 40."""

    def __new__(cls, **kwargs: Any):  # built lazily so importing this module needs no gymnasium
        import gymnasium as gym
        from gymnasium import spaces

        class GoalDict(gym.Env):
            metadata = {"render_modes": ["rgb_array"]}

            def __init__(self, render_mode: str | None = None) -> None:
                self.render_mode = render_mode
                self.observation_space = spaces.Dict({"goal": spaces.Box(-3, 3, (1,)), "pos": spaces.Box(-3, 3, (1,))})
                self.action_space = spaces.Box(-2.0, 2.0, (1,), np.float32)

            def _obs(self) -> dict:
                return {"goal": np.array([self.goal], np.float32), "pos": np.array([self.pos], np.float32)}

            def reset(self, *, seed: int | None = None, options: dict | None = None):
                super().reset(seed=seed)
                self.pos, self.goal = self.np_random.uniform(-1, 1, 2)
                return self._obs(), {}

            def step(self, action):
                self.pos += 0.1 * float(action[0])
                ok = abs(self.pos - self.goal) < 0.1
                return self._obs(), -abs(self.pos - self.goal), abs(self.pos) > 3, False, {"is_success": ok}

            def render(self):
                return np.full((16, 16, 3), 128, np.uint8)

        return GoalDict(**kwargs)


def _goal_dict_solver(env: ChunkedEnv, obs: dict) -> np.ndarray:
    goal, pos = obs["states"][:, 0], obs["states"][:, 1]  # Dict entries in key order: goal, pos
    u = np.clip((goal - pos) / 0.2, -1.0, 1.0).astype(np.float32)  # [-1, 1] -> [-2, 2]: 0.2 per unit
    return np.repeat(u[:, None, None], env.spec.chunk_size, axis=1)


def _register_goal_dict() -> str:
    import gymnasium as gym

    if "rlfleet-test/GoalDict-v0" not in gym.registry:
        gym.register(id="rlfleet-test/GoalDict-v0", entry_point=_GoalDictEnv, max_episode_steps=40)
    return "gym:rlfleet-test/GoalDict-v0"


# --- the cases ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    name: str
    cfg: dict
    solver: Callable[[ChunkedEnv, dict], np.ndarray] | None = None  # reaches success within `solve_steps`
    solve_steps: int = 150
    needs: tuple[str, ...] = ()  # modules the simulator needs (skipped where missing)
    remote: bool = False  # serve `cfg` over EnvService on loopback and step it through RemoteEnv


CASES = [
    Case("metaworld", dict(name="metaworld", task="reach-v3"), _expert_solver, needs=("metaworld",)),
    Case("robotwin", dict(name="robotwin", task="click_bell"), _expert_solver, solve_steps=300, needs=("sapien",)),
    # a chain of 5 subtasks takes ~1000 steps to succeed: terminate_on_success is checked on the others
    Case("calvin", dict(name="calvin", task="A"), None, needs=("pybullet",)),
    Case("remote", dict(name=PLUGIN_ENV), _point_solver, remote=True),
    Case("gym-mujoco", dict(name="gym:InvertedPendulum-v5"), None, needs=("gymnasium", "mujoco")),
    Case("gym-dict", dict(name="gym-dict"), _goal_dict_solver, needs=("gymnasium",)),
    Case("plugin", dict(name=PLUGIN_ENV), _point_solver),
    Case("bench", dict(name="bench", task="state_dim=6,action_dim=2"), lambda env, obs: _bench_solver(env, obs)),
]


def _bench_solver(env: ChunkedEnv, obs: dict) -> np.ndarray:
    """The bench env's point (the first action_dim state entries) moved straight to 0."""
    point = obs["states"][:, : env.spec.action_dim]
    norm = np.linalg.norm(point, axis=1, keepdims=True)
    u = -point / np.maximum(norm, 1e-6) * np.minimum(1.0, norm / 0.1)
    return np.repeat(u[:, None, :].astype(np.float32), env.spec.chunk_size, axis=1)


class _Served:
    """A RemoteEnv whose EnvService (serving `cfg`) lives in this process and stops with it."""

    def __init__(self, cfg: EnvConfig, num_envs: int) -> None:
        from rlfleet.envs.env_server import EnvServerConfig, serve_env

        self._server, port, self._servicer = serve_env(EnvServerConfig(env=cfg, max_envs=16))
        try:
            self.env = make_env(dataclasses.replace(cfg, name=f"remote://127.0.0.1:{port}"), num_envs)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        env = getattr(self, "env", None)
        if env is not None:
            env.close()
        self._servicer.close()
        self._server.stop(None)


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request) -> Case:
    c: Case = request.param
    for module in c.needs:
        pytest.importorskip(module)
    if str(PLUGIN_SRC) not in sys.path:
        sys.path.insert(0, str(PLUGIN_SRC))  # the example plugin, named by its import path
    return c


@pytest.fixture
def build(case: Case):
    """build(num_envs, **EnvConfig overrides) -> env; every env built is closed after the test."""
    opened: list[Any] = []

    def _build(num_envs: int = 2, **overrides: Any) -> ChunkedEnv:
        cfg_kw = dict(case.cfg, max_episode_steps=50, chunk_size=2, reward_type="dense")
        cfg_kw.update(overrides)
        if cfg_kw["name"] == "gym-dict":
            cfg_kw["name"] = _register_goal_dict()
        cfg = EnvConfig(**cfg_kw)
        if case.remote:
            served = _Served(cfg, num_envs)
            opened.append(served)
            return served.env
        env = make_env(cfg, num_envs)
        opened.append(env)
        return env

    yield _build
    for item in reversed(opened):
        item.close()


def _actions(env: ChunkedEnv, rng: np.random.Generator, scale: float = 0.3) -> np.ndarray:
    s = env.spec
    return rng.uniform(-scale, scale, (s.num_envs, s.chunk_size, s.action_dim)).astype(np.float32)


# --- the contract ---------------------------------------------------------------------------------


def test_shapes_and_dtypes(build) -> None:
    env = build(3, chunk_size=2)
    s = env.spec
    assert s.num_envs == 3 and s.chunk_size == 2 and len(s.task_names) == 3
    assert set(s.task_names) <= set(env.task_list)
    obs = env.reset(np.arange(3))
    assert obs["states"].shape == (3, s.state_dim) and obs["states"].dtype == np.float32
    assert obs["instructions"].shape == (3, INSTRUCTION_BYTES) and obs["instructions"].dtype == np.uint8
    assert obs["task_ids"].shape == (3,) and len(obs["task_descriptions"]) == 3
    assert [env.task_list[t] for t in obs["task_ids"]] == s.task_names
    res = env.chunk_step(np.zeros((3, 2, s.action_dim), np.float32))
    assert res.rewards.shape == (3, 2) and res.rewards.dtype == np.float32
    for field in ("terminated", "truncated", "success", "episode_done", "episode_success_once"):
        assert getattr(res, field).shape == (3,) and getattr(res, field).dtype == bool, field
    assert res.episode_return.shape == (3,) and res.episode_length.shape == (3,)
    assert res.final_obs["states"].shape == (3, s.state_dim)
    assert np.isfinite(res.obs["states"]).all()


def test_images_when_asked(build, case) -> None:
    if case.name in ("calvin", "robotwin", "metaworld"):
        pytest.skip("rendering is covered by the simulator's own tests (slow offscreen contexts)")
    env = build(2, image_size=16)
    obs = env.reset(np.arange(2))
    assert obs["main_images"].shape == (2, 16, 16, 3) and obs["main_images"].dtype == np.uint8
    res = env.chunk_step(np.zeros((2, 2, env.spec.action_dim), np.float32))
    assert res.obs["main_images"].shape == (2, 16, 16, 3) and res.final_obs["main_images"].shape == (2, 16, 16, 3)


def test_wrist_camera_only_where_the_env_has_one(build, case) -> None:
    with pytest.raises(ValueError, match="set env.image_size > 0 too"):
        build(2, wrist_camera=True)  # renders at image_size: none without it
    if case.name == "calvin":
        pytest.skip("CALVIN has a gripper camera: tests/unit/test_calvin_env.py")
    if case.remote:
        pytest.skip("a remote env is checked against the server's spec: tests/unit/test_remote_env.py")
    with pytest.raises(ValueError, match="has no wrist camera: set env.wrist_camera=false"):
        build(2, image_size=16, wrist_camera=True)


def test_seeds_reproduce(build) -> None:
    a, b = build(2), build(2)
    oa, ob = a.reset(np.array([5, 9])), b.reset(np.array([5, 9]))
    np.testing.assert_array_equal(oa["states"], ob["states"])
    rng = np.random.default_rng(0)
    for _ in range(3):
        act = _actions(a, rng)
        ra, rb = a.chunk_step(act), b.chunk_step(act)
        np.testing.assert_array_equal(ra.obs["states"], rb.obs["states"])
        np.testing.assert_array_equal(ra.rewards, rb.rewards)
    other = build(2)
    oc = other.reset(np.array([6, 10]))
    assert not np.array_equal(oc["states"], oa["states"])  # other seeds, other episodes


def test_a_resumed_streams_seeds_start_other_reproducible_episodes(build) -> None:
    """A resumed run's actors reset with seeds >= 2**62 (`resumed_stream_seeds`): every env takes
    them, they reproduce, and they start other episodes than a fresh run's stream (reset())."""
    from rlfleet.envs.core import RESUMED_SEED_BASE, resumed_stream_seeds

    seeds = resumed_stream_seeds(0, 0, 4, stream=1_000_000)
    assert (seeds >= RESUMED_SEED_BASE).all() and len(set(seeds.tolist())) == 4
    a, b, fresh = build(4), build(4), build(4)
    oa, ob, of = a.reset(seeds), b.reset(seeds), fresh.reset()
    np.testing.assert_array_equal(oa["states"], ob["states"])
    assert not np.array_equal(oa["states"], of["states"])
    act = _actions(a, np.random.default_rng(0))
    np.testing.assert_array_equal(a.chunk_step(act).obs["states"], b.chunk_step(act).obs["states"])


def test_truncation_final_obs_stats_and_auto_reset(build) -> None:
    """max_episode_steps 3 with chunks of 2: the episode ends at substep 0 of the second chunk."""
    env = build(2, max_episode_steps=3, chunk_size=2)
    twin = build(2, max_episode_steps=50, chunk_size=1)  # same episodes, never truncated here
    obs = env.reset(np.array([3, 4]))
    twin.reset(np.array([3, 4]))
    zeros = np.zeros((2, 2, env.spec.action_dim), np.float32)
    first = env.chunk_step(zeros)
    assert not first.episode_done.any()
    second = env.chunk_step(zeros)
    twin_states = [twin.chunk_step(zeros[:, :1]).obs["states"] for _ in range(3)]
    if second.terminated.any():
        pytest.skip("the task itself ended an episode within 3 steps")
    assert second.truncated.all() and second.episode_done.all() and not second.terminated.any()
    assert (second.episode_length == 3).all()
    assert (second.rewards[:, 1] == 0).all()  # the substep after the episode end is skipped
    # env steps count simulated substeps: the cut chunk counts the one that ran
    assert first.substeps.dtype == np.int32 and (first.substeps == 2).all() and (second.substeps == 1).all()
    np.testing.assert_allclose(second.episode_return, first.rewards.sum(1) + second.rewards[:, 0], rtol=1e-5)
    # final_obs: where the old episode ended (what the twin sees after 3 steps) ...
    np.testing.assert_allclose(second.final_obs["states"], twin_states[2], rtol=1e-5, atol=1e-6)
    # ... while obs is the next episode's start, whose stats start again at 0
    assert not np.allclose(second.obs["states"], second.final_obs["states"])
    third, fourth = env.chunk_step(zeros), env.chunk_step(zeros)
    assert not third.episode_done.any() and fourth.truncated.all() and (fourth.episode_length == 3).all()
    assert obs["states"].shape == second.obs["states"].shape


def test_success_once_and_terminate_on_success(build, case) -> None:
    if case.solver is None:
        pytest.skip(f"{case.name}: no success within a short test budget")
    K = 2
    stop = build(
        1, max_episode_steps=case.solve_steps, chunk_size=K, reward_type="success_once", terminate_on_success=True
    )
    go_on = build(1, max_episode_steps=case.solve_steps, chunk_size=K, reward_type="success_once")
    obs_s, obs_g = stop.reset(np.array([1])), go_on.reset(np.array([1]))
    total, ran = 0.0, 0
    for _ in range(case.solve_steps // K + 1):
        rs, rg = stop.chunk_step(case.solver(stop, obs_s)), go_on.chunk_step(case.solver(go_on, obs_g))
        total += float(rs.rewards.sum())
        ran += int(rs.substeps[0])
        assert rs.episode_done[0] or rs.substeps[0] == K
        if rs.episode_done[0]:
            break
        obs_s, obs_g = rs.obs, rg.obs
    else:
        pytest.fail("the solver never ended the episode")
    assert rs.terminated[0] and not rs.truncated[0] and rs.success[0] and rs.episode_success_once[0]
    assert ran == rs.episode_length[0]  # the substeps counted are the episode's steps, none skipped ones
    assert rs.episode_return[0] == pytest.approx(1.0) and total == pytest.approx(1.0)  # success_once: 1, once
    assert rg.success[0] and not rg.episode_done[0]  # without the option the same success ends nothing


def test_bad_actions_are_rejected(build) -> None:
    env = build(2)
    env.reset(np.arange(2))
    D = env.spec.action_dim
    with pytest.raises(ValueError):
        env.chunk_step(np.zeros((2, 3, D), np.float32))
    bad = np.zeros((2, 2, D), np.float32)
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError):
        env.chunk_step(bad)


def test_bench_env_settings_and_busy_wait() -> None:
    from rlfleet.envs.bench_env import parse_task

    assert parse_task("a,b,state_dim=8,busy_us=20") == (["a", "b"], {"state_dim": 8, "action_dim": 4, "busy_us": 20})
    with pytest.raises(ValueError, match="settings: state_dim, action_dim, busy_us"):
        parse_task("size=3")
    with make_env(
        EnvConfig(
            name="bench", task="state_dim=3,action_dim=5,busy_us=50", chunk_size=4, image_size=8, max_episode_steps=7
        ),
        2,
    ) as env:
        assert (env.spec.state_dim, env.spec.action_dim, env.task_list) == (3, 5, ["bench"])
        obs = env.reset()
        assert obs["main_images"].shape == (2, 8, 8, 3)
        res = env.chunk_step(np.zeros((2, 4, 5), np.float32))
        res = env.chunk_step(np.zeros((2, 4, 5), np.float32))
        assert res.truncated.all() and (res.episode_length == 7).all()


def test_resumed_stream_seeds_are_distinct_reproducible_and_above_held_out_seeds():
    from rlfleet.data.demos import DEMO_SEED_BASE
    from rlfleet.envs.core import RESUMED_SEED_BASE, resumed_stream_seeds

    a = resumed_stream_seeds(3, 40, 8, stream=1000)
    np.testing.assert_array_equal(a, resumed_stream_seeds(3, 40, 8, stream=1000))
    # the envs 44..47 of the same stream are the same seeds, whichever batch they sit in
    np.testing.assert_array_equal(a[4:], resumed_stream_seeds(3, 44, 4, stream=1000))
    others = [resumed_stream_seeds(3, 40, 8, stream=2000), resumed_stream_seeds(4, 40, 8, stream=1000)]
    every = np.concatenate([a, *others])
    assert len(set(every.tolist())) == len(every)
    assert (every >= RESUMED_SEED_BASE).all() and RESUMED_SEED_BASE > DEMO_SEED_BASE * 1000
    with pytest.raises(ValueError, match="stream must be > 0"):
        resumed_stream_seeds(3, 40, 8, stream=0)


def test_training_stream_differs_for_every_life_of_an_actor():
    """A fresh run's first actor process keeps the envs' own stream (0); a resumed learner life plays the
    env steps it resumed from; a restarted actor process a stream of its own, above every env-step count."""
    from rlfleet.envs.core import RESUMED_SEED_BASE, training_stream

    assert training_stream(0) == 0 and training_stream(5000) == 5000
    restarted = [training_stream(r, k) for r in (0, 5000) for k in (1, 2, 3)]
    assert len(set(restarted)) == len(restarted) and all(s >= RESUMED_SEED_BASE for s in restarted)
    assert training_stream(5000, 2) == training_stream(5000, 2)  # reproducible
    with pytest.raises(ValueError, match="must be >= 0"):
        training_stream(-1)
