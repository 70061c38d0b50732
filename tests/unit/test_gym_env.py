"""The gymnasium door (`env.name=gym:<id>`): action rescaling, Dict observations, TimeLimit as
truncation, the env's own termination, success keys and the clear errors."""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
from gymnasium import spaces  # noqa: E402

from rlfleet.envs.api import EnvConfig  # noqa: E402
from rlfleet.envs.registry import make_env  # noqa: E402


class Line(gym.Env):
    """pos on a line, action in [-2, 2] moves it by 0.1 x action; terminated beyond |pos| > 1;
    info reports `solved` (pos > 0.5) under a custom key."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None, dict_obs: bool = False):
        self.dict_obs = dict_obs
        box = spaces.Box(-5, 5, (1,))
        self.observation_space = (
            spaces.Dict({"pos": box, "camera": spaces.Box(0, 255, (8, 8, 3), np.uint8)}) if dict_obs else box
        )
        self.action_space = spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.seen: list[float] = []

    def _obs(self):
        pos = np.array([self.pos], np.float32)
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
        return self._obs(), 1.0, abs(self.pos) > 1.0, False, {"solved": self.pos > 0.5}


if "rlfleet-test/Line-v0" not in gym.registry:
    gym.register(id="rlfleet-test/Line-v0", entry_point=Line, max_episode_steps=6)
    gym.register(id="rlfleet-test/LineDict-v0", entry_point=Line, kwargs={"dict_obs": True}, max_episode_steps=6)
    gym.register(id="rlfleet-test/Discrete-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")


def _env(name: str = "gym:rlfleet-test/Line-v0", n: int = 1, **kw):
    return make_env(EnvConfig(name=name, max_episode_steps=100, chunk_size=1, **kw), n)


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
