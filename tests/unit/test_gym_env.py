"""The gymnasium door (`env.name=gym:<id>`): action rescaling, Dict observations, TimeLimit as
truncation, the env's own termination, success keys and the clear errors."""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
from gymnasium import spaces  # noqa: E402

from rlfleet.envs.gymnasium_config import GymEnvConfig  # noqa: E402
from rlfleet.envs.registry import make_env  # noqa: E402


class Line(gym.Env):
    """pos on a line, action in [-2, 2] moves it by 0.1 x action; terminated beyond |pos| > 1;
    info reports `solved` (pos > 0.5) under a custom key."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None, dict_obs: bool = False, reward: float = 1.0):
        self.dict_obs = dict_obs
        self.reward = reward
        box = spaces.Box(-5, 5, (1,))
        camera = spaces.Box(0, 255, (8, 8, 3), np.uint8)
        if dict_obs == "nested":  # as LeRobot's gym envs: {"pixels": {"front": ...}, "agent_pos": ...}
            self.observation_space = spaces.Dict({"pixels": spaces.Dict({"front": camera}), "agent_pos": box, "v": box})
        else:
            self.observation_space = spaces.Dict({"pos": box, "camera": camera}) if dict_obs else box
        self.action_space = spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.seen: list[float] = []

    def _obs(self):
        pos = np.array([self.pos], np.float32)
        if self.dict_obs == "nested":
            return {"pixels": {"front": np.zeros((8, 8, 3), np.uint8)}, "agent_pos": pos, "v": pos}
        if self.dict_obs:
            return {"pos": pos, "camera": np.full((8, 8, 3), int(100 + 100 * self.pos) % 256, np.uint8)}
        return pos

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0.0
        return self._obs(), {}

    def step(self, action):
        self.seen.append(float(action[0]))
        self.pos += 0.1 * float(action[0])
        return self._obs(), self.reward, abs(self.pos) > 1.0, False, {"solved": self.pos > 0.5, "dist": 1 - self.pos}


if "rlfleet-test/Line-v0" not in gym.registry:
    gym.register(id="rlfleet-test/Line-v0", entry_point=Line, max_episode_steps=6)
    gym.register(id="rlfleet-test/LineDict-v0", entry_point=Line, kwargs={"dict_obs": True}, max_episode_steps=6)
    gym.register(id="rlfleet-test/LineNested-v0", entry_point=Line, kwargs={"dict_obs": "nested"}, max_episode_steps=6)
    gym.register(id="rlfleet-test/Discrete-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")


def _env(name: str = "gym:rlfleet-test/Line-v0", n: int = 1, **kw):
    return make_env(GymEnvConfig(name=name, max_episode_steps=100, chunk_size=1, **kw), n)


def test_actions_are_rescaled_to_the_box_bounds() -> None:
    with _env() as env:
        env.reset()
        env.chunk_step(np.array([[[1.0]]], np.float32))
        env.chunk_step(np.array([[[-0.5]]], np.float32))
        env.chunk_step(np.array([[[7.0]]], np.float32))  # clipped to 1 first
        assert env._envs[0].unwrapped.seen == [2.0, -1.0, 2.0]


def test_time_limit_is_truncation_and_the_env_end_is_termination() -> None:
    with _env() as env:
        env.reset()
        for _ in range(5):
            assert not env.chunk_step(np.zeros((1, 1, 1), np.float32)).episode_done[0]
        res = env.chunk_step(np.zeros((1, 1, 1), np.float32))  # the 6th step: gymnasium's TimeLimit
        assert res.truncated[0] and not res.terminated[0] and res.episode_length[0] == 6
        for _ in range(6):  # +0.2 a step: beyond 1.0 at the 6th step, which is also the time limit
            res = env.chunk_step(np.ones((1, 1, 1), np.float32))
            if res.episode_done[0]:
                break
        assert res.terminated[0] and not res.truncated[0]  # termination wins over the time limit


def test_success_from_a_named_info_key_and_terminate_on_success() -> None:
    with _env(success_key="solved", terminate_on_success=True, reward_type="success_once") as env:
        env.reset()
        results = [env.chunk_step(np.ones((1, 1, 1), np.float32)) for _ in range(3)]
        assert [r.success[0] for r in results] == [False, False, True]  # pos 0.2, 0.4, 0.6
        assert results[2].terminated[0] and results[2].episode_return[0] == 1.0
    with _env() as env:  # without the key: no "is_success"/"success" in info, so never a success
        env.reset()
        assert not any(env.chunk_step(np.ones((1, 1, 1), np.float32)).success[0] for _ in range(4))


def test_dict_observation_maps_to_states_and_main_images() -> None:
    with _env("gym:rlfleet-test/LineDict-v0", n=2, image_size=4) as env:
        assert env.spec.state_dim == 1
        obs = env.reset()
        assert obs["states"].shape == (2, 1) and obs["main_images"].shape == (2, 4, 4, 3)
        assert (obs["main_images"] == 100).all()  # the camera entry, resized from 8x8


def test_pixels_from_render_when_the_observation_has_none() -> None:
    pytest.importorskip("mujoco")
    with _env("gym:InvertedPendulum-v5", image_size=24) as env:
        obs = env.reset()
        assert obs["main_images"].shape == (1, 24, 24, 3) and obs["main_images"].any()


def test_clear_errors() -> None:
    with pytest.raises(ValueError, match="Discrete action space"):
        _env("gym:rlfleet-test/Discrete-v0")
    with pytest.raises(ValueError, match="gymnasium cannot make"):
        _env("gym:NoSuchEnv-v0")
    with pytest.raises(ValueError, match="No module named 'no_such_package'"):
        _env("gym:no_such_package.envs:Thing-v0")


def test_gym_kwargs_reach_gym_make() -> None:
    with _env(gym_kwargs={"reward": 0.25}) as env:
        env.reset()
        assert env.chunk_step(np.zeros((1, 1, 1), np.float32)).rewards[0, 0] == 0.25
    with pytest.raises(ValueError, match=r"gym_kwargs=\{'colour': 1\}.*colour"):
        _env(gym_kwargs={"colour": 1})
    with pytest.raises(ValueError, match="env.gym_kwargs is not a setting of env bench"):
        make_env(GymEnvConfig(name="bench", gym_kwargs={"reward": 1.0}), 1)


def test_task_name_is_the_id_without_its_module() -> None:
    # gymnasium's `module:id` form imports the module first; the task is named by the id alone
    with _env("gym:gymnasium.envs.classic_control:rlfleet-test/Line-v0") as env:
        assert env.task_list == ["rlfleet-test/Line-v0"]
        assert env.reset()["task_descriptions"] == ["rlfleet-test/Line-v0"]


def _run_episodes(env, n: int) -> None:
    env.reset()
    for _ in range(6 * n):
        env.chunk_step(np.zeros((1, 1, 1), np.float32))


def test_a_success_key_never_in_info_is_one_warning_naming_the_keys_seen(caplog) -> None:
    with caplog.at_level("WARNING", logger="rlfleet.envs.gymnasium_env"), _env(success_key="succeed") as env:
        _run_episodes(env, 5)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "env.success_key='succeed' never appeared in info" in warnings[0] and "dist, solved" in warnings[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlfleet.envs.gymnasium_env"), _env() as env:  # the default keys
        _run_episodes(env, 5)
    assert [r.getMessage() for r in caplog.records] == [
        "no 'is_success' or 'success' in info in the first 3 episodes, so success reads 0%; "
        "set env.success_key to one of the info keys seen: dist, solved"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlfleet.envs.gymnasium_env"), _env(success_key="solved") as env:
        _run_episodes(env, 5)
    with caplog.at_level("WARNING", logger="rlfleet.envs.gymnasium_env"):  # a batch not holding env 0: silent
        with make_env(GymEnvConfig(name="gym:rlfleet-test/Line-v0", success_key="x"), 1, env_offset=1) as env:
            _run_episodes(env, 5)
    assert caplog.records == []


def test_nested_dict_observations_are_flattened() -> None:
    with _env("gym:rlfleet-test/LineNested-v0", image_size=8) as env:
        obs = env.reset()
        assert env.spec.state_dim == 2 and obs["main_images"].shape == (1, 8, 8, 3)
        env.chunk_step(np.ones((1, 1, 1), np.float32))


def test_policy_actions_invert_the_rescaling() -> None:
    # a LeRobot dataset's actions (the env's units, here [-2, 2]) in the policy's [-1, 1]
    with _env() as env:
        np.testing.assert_allclose(env.policy_actions(np.array([[2.0], [-1.0], [0.0]])), [[1.0], [-0.5], [0.0]])


def test_mujoco_frames_render_without_shadows_and_multisampling_unless_asked() -> None:
    pytest.importorskip("mujoco")
    with _env("gym:Reacher-v5", image_size=16) as env:
        model = env._envs[0].unwrapped.model
        assert model.vis.quality.offsamples == 0 and not model.light_castshadow.any()
        assert env.reset()["main_images"].any()
    with _env("gym:Reacher-v5", image_size=16, gym_render_quality="env") as env:
        model = env._envs[0].unwrapped.model
        assert model.vis.quality.offsamples > 0  # as the env ships it
    with _env("gym:Reacher-v5") as env:  # no frames: the scene is left alone
        assert env._envs[0].unwrapped.model.vis.quality.offsamples > 0
    with pytest.raises(ValueError, match="gym_render_quality must be 'fast' or 'env'"):
        _env(gym_render_quality="best")
