"""A simulator that fails costs episodes, not the actor: RemoteEnv against a faulty in-process EnvService.

Each test fails on the client without recovery (reconnects, step numbers, per-env NaN handling):
there the first fault raised out of `chunk_step` and took the env worker, hence the actor, down.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar

import grpc
import numpy as np
import pytest

from rlfleet.envs.api import ChunkedEnv, EnvConfig, EnvSpec, StepResult
from rlfleet.envs.env_server import EnvServerConfig, env_config, serve_env
from rlfleet.envs.registry import make_env, register_env
from rlfleet.envs.remote import MAX_BAD_OBS_STREAK, RemoteEnvError
from rlfleet.wire import codec
from rlfleet.wire.gen import env_pb2, env_pb2_grpc
from rlfleet.wire.grpc_server import make_channel

EPISODE = 4


class FaultyEnv(ChunkedEnv):
    """state = [steps this episode, env index]; reward 1 per step; 4-step episodes. The class-level
    `faults` dict injects failures: {"nan_reward": env, "nan_obs": env, "nan_reset": True, "sleep": s}."""

    faults: ClassVar[dict] = {}
    steps_taken = 0  # chunk_step calls across instances (what the server really applied)
    resets = 0  # reset calls across instances: each reset's scene ids differ (10 * resets + env)

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0):
        self.cfg, self.n = cfg, num_envs
        self._spec = EnvSpec(
            state_dim=2,
            action_dim=1,
            chunk_size=cfg.chunk_size,
            num_envs=num_envs,
            max_episode_steps=EPISODE,
            task_names=["faulty"] * num_envs,
        )
        self.t = np.zeros(num_envs, np.int64)

    def _obs(self, stepped: bool = True) -> dict:
        states = np.stack([self.t.astype(np.float32), np.arange(self.n, dtype=np.float32)], axis=1)
        if stepped and "nan_obs" in self.faults:  # a reset cures it
            states[self.faults["nan_obs"], 0] = np.nan
        return {
            "states": states,
            "instructions": np.zeros((self.n, 128), np.uint8),
            "task_ids": np.zeros(self.n, np.int64),
            "task_descriptions": ["faulty"] * self.n,
        }

    def reset(self, seeds=None):
        self.t[:] = 0
        FaultyEnv.resets += 1
        self._scenes = [10 * FaultyEnv.resets + i for i in range(self.n)]
        obs = self._obs(stepped=False)
        if self.faults.get("nan_reset"):
            obs["states"][:] = np.inf
        return obs

    def episode_scenes(self) -> list[int]:
        return list(self._scenes)

    def chunk_step(self, actions):
        if "sleep" in self.faults:
            time.sleep(self.faults.pop("sleep"))  # once: a slow step whose call times out
        FaultyEnv.steps_taken += 1
        K = self.cfg.chunk_size
        rewards = np.ones((self.n, K), np.float32)
        self.t += K
        done = self.t >= EPISODE
        final = {k: v for k, v in self._obs().items() if isinstance(v, np.ndarray) and k != "task_ids"}
        ep_len = np.where(done, self.t, 0).astype(np.int32)
        self.t[done] = 0
        if "nan_reward" in self.faults:
            rewards[self.faults["nan_reward"]] = np.nan
        return StepResult(
            obs=self._obs(),
            rewards=rewards,
            terminated=np.zeros(self.n, bool),
            truncated=done.copy(),
            success=np.zeros(self.n, bool),
            episode_done=done,
            episode_return=ep_len.astype(np.float32),
            episode_length=ep_len,
            episode_success_once=np.zeros(self.n, bool),
            final_obs=final,
            substeps=np.full(self.n, K, np.int32),
        )

    def close(self) -> None:
        pass


register_env("h_faulty", FaultyEnv)


def _serve(port: int = 0):
    cfg = EnvServerConfig(
        env=env_config("h_faulty", overrides=["chunk_size=1", "max_episode_steps=4"]), num_envs=2, max_envs=8, port=port
    )
    return serve_env(cfg)


@pytest.fixture
def server():
    FaultyEnv.faults = {}
    FaultyEnv.steps_taken = 0
    FaultyEnv.resets = 0
    srv, port, servicer = _serve()
    yield port, servicer, srv
    srv.stop(0)
    servicer.close()
    FaultyEnv.faults = {}


def _env(port: int, num_envs: int = 2, **options) -> ChunkedEnv:
    query = "&".join(f"{k}={v}" for k, v in {"connect_timeout": 20, "timeout": 20, **options}.items())
    return make_env(
        EnvConfig(name=f"remote://127.0.0.1:{port}?{query}", chunk_size=1, task="faulty", max_episode_steps=4), num_envs
    )


def _act(n: int = 2) -> np.ndarray:
    return np.zeros((n, 1, 1), np.float32)


def test_a_restarted_server_is_reconnected_and_episodes_in_flight_end_truncated(server):
    port, servicer, srv = server
    with _env(port) as env:
        env.reset()
        assert env.episode_scenes() == [10, 11]
        env.chunk_step(_act())
        env.chunk_step(_act())
        first = env.chunk_step(_act())
        assert not first.episode_done.any()
        # kill the server (sessions and all) and bring a fresh one up on the same port a bit later
        srv_holder = {}
        srv.stop(0).wait()
        servicer.close()

        def restart():
            time.sleep(1.0)  # not a timing assertion: the client must wait, however long this takes
            srv_holder["srv"], _, srv_holder["servicer"] = _serve(port)

        thread = threading.Thread(target=restart)
        thread.start()
        try:
            res = env.chunk_step(_act())
            thread.join()
            # every episode in flight ended as truncated, with the steps it had taken
            assert res.episode_done.all() and res.truncated.all() and not res.terminated.any()
            np.testing.assert_array_equal(res.episode_length, [3, 3])
            np.testing.assert_array_equal(res.episode_return, [3.0, 3.0])
            np.testing.assert_array_equal(res.rewards, np.zeros((2, 1)))
            np.testing.assert_array_equal(res.final_obs["states"][:, 0], [3.0, 3.0])
            np.testing.assert_array_equal(res.obs["states"][:, 0], [0.0, 0.0])  # new episodes
            assert env.faults["reopened_sessions"] == 1 and env.faults["episodes_truncated"] == 2
            assert env.episode_scenes() == [20, 21]  # the new session's reset gave the new episodes' scenes
            after = env.chunk_step(_act())  # and it goes on stepping on the new server
            np.testing.assert_array_equal(after.obs["states"][:, 0], [1.0, 1.0])
            assert len(srv_holder["servicer"].sessions) == 1
        finally:
            thread.join()
            if "srv" in srv_holder:
                srv_holder["srv"].stop(0)
                srv_holder["servicer"].close()


def test_a_server_that_stays_away_is_a_clear_error_within_the_bound(server):
    port, _, srv = server
    env = _env(port, reconnect_timeout=1)
    env.reset()
    srv.stop(0).wait()
    with pytest.raises(ConnectionError, match=r"did not come back within 1s \(reconnect_timeout\)"):
        env.chunk_step(_act())
    env.close()


def test_a_nan_reward_ends_that_envs_episode_only(server):
    port, _, _ = server
    with _env(port) as env:
        env.reset()
        env.chunk_step(_act())
        FaultyEnv.faults["nan_reward"] = 1
        res = env.chunk_step(_act())
        del FaultyEnv.faults["nan_reward"]
        assert np.isfinite(res.rewards).all()
        assert res.episode_done.tolist() == [False, True] and res.truncated.tolist() == [False, True]
        np.testing.assert_array_equal(res.rewards, [[1.0], [0.0]])
        assert res.episode_length[1] == 1 and res.episode_return[1] == 1.0  # what it had before the bad step
        assert env.faults["non_finite_rewards"] == 1 and env.faults["episodes_ended_bad_reply"] == 1
        res = env.chunk_step(_act())  # the session goes on
        np.testing.assert_array_equal(res.rewards, [[1.0], [1.0]])


def test_nan_observations_are_caught_at_the_client_and_named_as_the_simulators(server):
    port, _, _ = server
    with _env(port) as env:
        first = env.reset()
        FaultyEnv.faults["nan_obs"] = 0
        res = env.chunk_step(_act())
        assert np.isfinite(res.obs["states"]).all()  # the policy sees env 0's last good observation
        np.testing.assert_array_equal(res.obs["states"][0], first["states"][0])
        assert res.episode_done.tolist() == [True, False] and env.faults["non_finite_states"] == 1
        for _ in range(MAX_BAD_OBS_STREAK - 1):  # still broken: the session is reset, every episode ends
            res = env.chunk_step(_act())
        assert env.faults["session_resets"] == 1 and res.episode_done.all()
        assert np.isfinite(res.obs["states"]).all()
        del FaultyEnv.faults["nan_obs"]
        FaultyEnv.faults["nan_reset"] = True
        with pytest.raises(RemoteEnvError, match=r"the simulator's fault.*'states' contains NaN or inf"):
            env.reset()


def test_step_numbers_make_a_repeated_step_harmless_and_a_lost_one_visible(server):
    port, _, _ = server
    with make_channel(f"127.0.0.1:{port}") as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        stub.GetSpec(env_pb2.SpecRequest(session_id="s", num_envs=2, chunk_size=1), timeout=20)
        stub.Reset(env_pb2.ResetRequest(session_id="s"), timeout=20)
        act = codec.encode_tensor("actions", _act())
        a = stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="s", actions=act, step_seq=1), timeout=20)
        b = stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="s", actions=act, step_seq=1), timeout=20)
        assert a == b and a.step_seq == 1 and FaultyEnv.steps_taken == 1  # answered again, not stepped again
        with pytest.raises(grpc.RpcError) as err:
            stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="s", actions=act, step_seq=3), timeout=20)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "expected 2" in err.value.details()
        c = stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="s", actions=act, step_seq=2), timeout=20)
        assert c.step_seq == 2 and FaultyEnv.steps_taken == 2
        stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="s", actions=act), timeout=20)  # 0: unnumbered
        assert FaultyEnv.steps_taken == 3


def test_a_timed_out_step_is_asked_again_and_applied_once(server):
    port, _, _ = server
    with _env(port, timeout=2) as env:
        env.reset()
        FaultyEnv.faults["sleep"] = 3.0  # the first call times out while the server still steps
        res = env.chunk_step(_act())
        assert FaultyEnv.steps_taken == 1 and env.faults["step_timeouts"] == 1
        np.testing.assert_array_equal(res.obs["states"][:, 0], [1.0, 1.0])
        res = env.chunk_step(_act())
        np.testing.assert_array_equal(res.obs["states"][:, 0], [2.0, 2.0])  # no step lost or doubled
        assert FaultyEnv.steps_taken == 2 and env.faults["reopened_sessions"] == 0


def test_settings_the_server_decides_are_not_ignored_silently(server, caplog):
    from rlfleet.envs import remote

    port, _, _ = server
    remote._warned.clear()
    with caplog.at_level("WARNING", logger="rlfleet.envs.remote"):
        make_env(
            EnvConfig(name=f"remote://127.0.0.1:{port}", chunk_size=1, task="reach-v3", max_episode_steps=150), 1
        ).close()
        make_env(
            EnvConfig(name=f"remote://127.0.0.1:{port}", chunk_size=1, task="reach-v3", max_episode_steps=150), 1
        ).close()
    text = [r.getMessage() for r in caplog.records]
    assert sum("env.max_episode_steps=150 is ignored" in t and "episodes of 4 steps" in t for t in text) == 1
    assert sum("env.task='reach-v3' is ignored" in t and "runs faulty" in t for t in text) == 1


def test_remote_env_faults_reach_the_learner_through_the_worker_and_the_heartbeat(server):
    """Was: RemoteEnv.faults stayed in the env worker process; now the worker sends changes with its
    step notification, the actor's heartbeat carries them, the learner sums them (metric and summary)."""
    import dataclasses

    from rlfleet.actors.env_worker import EnvWorkerPool
    from rlfleet.actors.learner_client import LearnerClient
    from rlfleet.learner.ingest import IngestQueue
    from rlfleet.learner.service import LearnerServicer
    from rlfleet.learner.weight_publisher import WeightPublisher
    from rlfleet.wire.gen import learner_pb2_grpc
    from rlfleet.wire.grpc_server import start_grpc_server
    from rlfleet.wire.slots import slot_layout

    port, _, _ = server
    cfg = EnvConfig(
        name=f"remote://127.0.0.1:{port}?connect_timeout=20&timeout=20",
        chunk_size=1,
        task="faulty",
        max_episode_steps=4,
    )
    pool = EnvWorkerPool(dataclasses.asdict(cfg), 2, 1, 1, slot_layout(2, {"states": ((2,), "float32")}, 1, 1))
    servicer = LearnerServicer("x: 1\n", "run", IngestQueue(maxsize=1), WeightPublisher())
    grpc_server, lport = start_grpc_server(
        "127.0.0.1", 0, [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s)], []
    )
    client = LearnerClient(f"127.0.0.1:{lport}", "a0", queue_size=1, heartbeat_s=0.05)
    try:
        pool.reset()
        pool.step_async(0)
        pool.step_wait(0)
        assert pool.env_faults == {}
        FaultyEnv.faults["nan_reward"] = 1
        pool.step_async(0)
        pool.step_wait(0)
        del FaultyEnv.faults["nan_reward"]
        assert pool.env_faults == {"non_finite_rewards": 1, "episodes_ended_bad_reply": 1}
        client.env_faults = pool.env_faults
        deadline = time.monotonic() + 30
        while not servicer.env_faults() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert servicer.env_faults() == {"episodes_ended_bad_reply": 1, "non_finite_rewards": 1}
    finally:
        client.close(drain_s=0)
        pool.close()
        grpc_server.stop(0)
