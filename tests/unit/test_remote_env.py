"""RemoteEnv against an in-process EnvService serving a tiny deterministic env: a drop-in for the local env."""

from __future__ import annotations

import pickle
import time

import grpc
import numpy as np
import pytest

from rlfleet.envs.api import ChunkedEnv, EnvConfig, EnvSpec, StepResult
from rlfleet.envs.env_messages import decode_step, spec_from_reply, spec_reply, step_reply
from rlfleet.envs.env_server import EnvServerConfig, EnvServicer, env_config, serve_env
from rlfleet.envs.registry import make_env, register_env, registered_envs
from rlfleet.envs.remote import RemoteEnvError, parse_remote_name
from rlfleet.wire import codec
from rlfleet.wire.gen import env_pb2

EPISODE = 3  # steps per episode of the test env


class CounterEnv(ChunkedEnv):
    """state = [steps this episode, episode seed]; reward = sum of the action; episodes last 3 steps."""

    def __init__(self, cfg: EnvConfig, num_envs: int, env_offset: int = 0):
        self.cfg, self.n, self.offset = cfg, num_envs, env_offset
        self._spec = EnvSpec(
            state_dim=2,
            action_dim=2,
            chunk_size=cfg.chunk_size,
            num_envs=num_envs,
            max_episode_steps=EPISODE,
            task_names=[f"count-{(env_offset + i) % 2}" for i in range(num_envs)],
        )
        self.states = np.zeros((num_envs, 2), np.float32)
        self.returns = np.zeros(num_envs, np.float32)
        self.next_seed = np.array([cfg.seed * 1000 + env_offset + i for i in range(num_envs)], np.int64)

    @property
    def spec(self) -> EnvSpec:
        return self._spec

    @property
    def task_list(self) -> list[str]:
        return ["count-0", "count-1"]

    def _start(self, i: int) -> None:
        self.states[i] = (0.0, float(self.next_seed[i]))
        self.next_seed[i] += 7
        self.returns[i] = 0.0

    def reset(self, seeds=None):
        if seeds is not None:
            self.next_seed = np.asarray(seeds, np.int64).copy()
        for i in range(self.n):
            self._start(i)
        return self._obs()

    def _obs(self) -> dict:
        ids = np.array([(self.offset + i) % 2 for i in range(self.n)], np.int64)
        return {
            "states": self.states.copy(),
            "instructions": np.zeros((self.n, 128), np.uint8),
            "task_ids": ids,
            "task_descriptions": list(self._spec.task_names),
        }

    def chunk_step(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.n, self.cfg.chunk_size, 2):
            raise ValueError(f"bad actions shape {actions.shape}")
        K = self.cfg.chunk_size
        rewards = np.zeros((self.n, K), np.float32)
        done = np.zeros(self.n, bool)
        ep_ret = np.zeros(self.n, np.float32)
        ep_len = np.zeros(self.n, np.int32)
        ran = np.full(self.n, K, np.int32)
        final = {"states": np.zeros_like(self.states), "instructions": np.zeros((self.n, 128), np.uint8)}
        for i in range(self.n):
            for k in range(K):
                rewards[i, k] = actions[i, k].sum()
                self.returns[i] += rewards[i, k]
                self.states[i, 0] += 1
                if self.states[i, 0] >= EPISODE:
                    done[i], ep_ret[i], ep_len[i] = True, self.returns[i], EPISODE
                    final["states"][i] = self.states[i]
                    self._start(i)
                    ran[i] = k + 1
                    break
        return StepResult(
            obs=self._obs(),
            rewards=rewards,
            terminated=np.zeros(self.n, bool),
            truncated=done.copy(),
            success=done.copy(),
            episode_done=done,
            episode_return=ep_ret,
            episode_length=ep_len,
            episode_success_once=done.copy(),
            final_obs=final,
            substeps=ran,
        )

    def close(self) -> None:
        pass


register_env("h_counter", CounterEnv)


@pytest.fixture
def server():
    cfg = EnvServerConfig(env=env_config("h_counter", overrides=["chunk_size=2"]), num_envs=2, max_envs=8)
    srv, port, servicer = serve_env(cfg)
    yield f"127.0.0.1:{port}", servicer
    srv.stop(0)
    servicer.close()


def _remote_cfg(address: str, **kw) -> EnvConfig:
    return EnvConfig(name=f"remote://{address}?connect_timeout=20&timeout=20", chunk_size=2, **kw)


def test_parse_remote_name():
    t = parse_remote_name("remote://127.0.0.1:50070")
    assert (t.address, t.connect_timeout, t.timeout) == ("127.0.0.1:50070", 30.0, 60.0)
    t = parse_remote_name("remote://[::1]:7?timeout=2.5&connect_timeout=1")
    assert (t.address, t.connect_timeout, t.timeout) == ("[::1]:7", 1.0, 2.5)
    for bad, msg in [
        ("remote://127.0.0.1", "host and a port"),
        ("remote://h:x", "bad port"),
        ("remote://h:1?retries=3", "unknown option"),
        ("remote://h:1?timeout=-1", "positive"),
        ("remote://h:1/path", "look like"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_remote_name(bad)
    assert "remote://..." in registered_envs()


def test_remote_matches_local_with_auto_reset(server):
    address, servicer = server
    local = CounterEnv(EnvConfig(name="h_counter", chunk_size=2, seed=5), 3, env_offset=1)
    with make_env(_remote_cfg(address, seed=5), 3, env_offset=1) as remote:
        assert remote.spec == local.spec and remote.task_list == ["count-0", "count-1"]
        for seeds in (None, np.array([10, 20, 30])):
            a, b = remote.reset(seeds), local.reset(seeds)
            for key in ("states", "instructions", "task_ids"):
                np.testing.assert_array_equal(a[key], b[key])
            assert a["task_descriptions"] == b["task_descriptions"]
            rng = np.random.default_rng(0)
            for _ in range(4):  # crosses episode ends inside a chunk (3 steps, chunks of 2)
                act = rng.normal(size=(3, 2, 2)).astype(np.float32)
                ra, rb = remote.chunk_step(act), local.chunk_step(act)
                for name in ("rewards", "episode_done", "episode_return", "episode_length", "success", "substeps"):
                    np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name))
                np.testing.assert_array_equal(ra.obs["states"], rb.obs["states"])
                np.testing.assert_array_equal(ra.final_obs["states"], rb.final_obs["states"])
                assert ra.obs["states"].flags.writeable  # a drop-in: arrays are the caller's to keep
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(remote)
    assert servicer.sessions == {}  # close() ended the session


def test_a_server_that_sends_no_substeps_gets_them_derived(server, monkeypatch):
    """Servers written before `substeps` leave it out: the client takes a finished episode's
    length less the steps it counted, so env steps still count the substeps simulated."""
    import rlfleet.envs.env_server as env_server

    def old_reply(result):
        reply = step_reply(result)
        kept = [t for t in reply.step.tensors if t.name != "substeps"]
        assert len(kept) == len(reply.step.tensors) - 1
        del reply.step.tensors[:]
        reply.step.tensors.extend(kept)
        return reply

    monkeypatch.setattr(env_server, "step_reply", old_reply)
    address, _ = server
    with make_env(_remote_cfg(address), 2) as env:
        env.reset()
        ran = [env.chunk_step(np.zeros((2, 2, 2), np.float32)).substeps.tolist() for _ in range(4)]
    assert ran == [[2, 2], [1, 1], [2, 2], [1, 1]]  # episodes of 3 steps in chunks of 2


def test_bad_actions_are_rejected_and_the_session_keeps_working(server):
    address, servicer = server
    with make_env(_remote_cfg(address), 2) as env:
        env.reset()
        with pytest.raises(ValueError, match=r"shape \[2, 2, 3\], expected \[2, 2, 2\]"):
            env.chunk_step(np.zeros((2, 2, 3), np.float32))
        with pytest.raises(ValueError, match="NaN or inf"):
            env.chunk_step(np.full((2, 2, 2), np.nan, np.float32))
        res = env.chunk_step(np.ones((2, 2, 2)))  # float64 is converted, as local envs accept it
        np.testing.assert_array_equal(res.rewards, np.full((2, 2), 2.0))
    assert servicer.errors["INVALID_ARGUMENT"] == 2


def test_sessions_are_independent_and_bounded(server):
    address, servicer = server
    with make_env(_remote_cfg(address), 4) as a, make_env(_remote_cfg(address), 4) as b:
        a.reset(np.arange(4))
        b.reset(np.arange(4) + 100)
        a.chunk_step(np.zeros((4, 2, 2), np.float32))
        assert b.reset(np.arange(4) + 100)["states"][:, 0].tolist() == [0, 0, 0, 0]  # a's steps did not move b
        with pytest.raises(RemoteEnvError, match="RESOURCE_EXHAUSTED.*limit of 8"):
            make_env(_remote_cfg(address), 1)
    with make_env(_remote_cfg(address), 8):  # both closed: room again
        assert len(servicer.sessions) == 1


def test_image_size_must_match_the_server(server):
    address, _ = server
    with pytest.raises(ValueError, match="env.image_size=32 but env server"):
        make_env(_remote_cfg(address, image_size=32), 1)


def test_wrist_camera_must_be_served():
    cfg = EnvServerConfig(env=env_config("bench", overrides=["chunk_size=2", "image_size=8"]), num_envs=1, max_envs=4)
    srv, port, servicer = serve_env(cfg)
    try:
        with pytest.raises(ValueError, match="env.wrist_camera is set but env server .* sends wrist_images none"):
            make_env(_remote_cfg(f"127.0.0.1:{port}", image_size=8, wrist_camera=True), 1)
        with make_env(_remote_cfg(f"127.0.0.1:{port}", image_size=8), 1) as env:  # without it: served as before
            assert env.reset()["main_images"].shape == (1, 8, 8, 3)
    finally:
        srv.stop(0)
        servicer.close()


def test_unreachable_server_is_a_clear_error():
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=r"env server 127.0.0.1:1 unreachable: no connection within 0.5s"):
        make_env(EnvConfig(name="remote://127.0.0.1:1?connect_timeout=0.5"), 1)
    assert time.monotonic() - t0 < 10


def test_call_order_errors_use_failed_precondition(server):
    address, _ = server
    from rlfleet.wire.gen import env_pb2_grpc
    from rlfleet.wire.grpc_server import make_channel

    with make_channel(address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Reset(env_pb2.ResetRequest(session_id="never-opened"), timeout=20)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "GetSpec" in err.value.details()
        stub.GetSpec(env_pb2.SpecRequest(session_id="s"), timeout=20)  # default batch: the server's num_envs
        act = codec.encode_tensor("actions", np.zeros((2, 2, 2), np.float32))
        with pytest.raises(grpc.RpcError) as err:
            stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="s", actions=act), timeout=20)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "Reset" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.Reset(env_pb2.ResetRequest(session_id="s", seeds=[1, 2, 3]), timeout=20)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "3 seeds" in err.value.details()
        stub.Reset(env_pb2.ResetRequest(session_id="s"), timeout=20)
        stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="s", actions=act), timeout=20)
        stub.Close(env_pb2.CloseRequest(session_id="s"), timeout=20)


def test_messages_round_trip_and_reject_incomplete_replies():
    env = CounterEnv(EnvConfig(chunk_size=1), 2)
    env.reset()
    res = env.chunk_step(np.ones((2, 1, 2), np.float32))
    spec, tasks, obs_spec = spec_from_reply(spec_reply(env.spec, env.task_list, {"states": ((2,), "float32")}, "x"))
    assert spec == env.spec and tasks == env.task_list and obs_spec == {"states": ((2,), "float32")}
    reply = step_reply(res)
    fields, final = decode_step(reply.step, 2, 1)
    np.testing.assert_array_equal(fields["rewards"], res.rewards)
    assert set(final) == {"states", "instructions"}
    step = codec.decode_map(reply.step)
    del step["episode_length"]
    with pytest.raises(codec.WireFormatError, match="missing tensor 'episode_length'"):
        decode_step(codec.encode_map(step), 2, 1)
    with pytest.raises(codec.WireFormatError, match="2 tasks for 3 envs"):
        spec_from_reply(
            env_pb2.EnvSpecReply(num_envs=3, state_dim=2, action_dim=2, chunk_size=1, task_names=["a", "b"])
        )


def test_servicer_rejects_bad_settings():
    servicer = EnvServicer(EnvServerConfig(env=env_config("h_counter"), max_envs=4))

    class Ctx:
        def abort(self, code, details):
            raise RuntimeError(code, details)

    with pytest.raises(RuntimeError) as err:
        servicer.GetSpec(env_pb2.SpecRequest(session_id="s", num_envs=-1), Ctx())
    assert err.value.args[0] == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(RuntimeError) as err:
        servicer.GetSpec(env_pb2.SpecRequest(session_id="s", num_envs=5), Ctx())
    assert err.value.args[0] == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_env_workers_step_a_remote_env_with_the_actors_token():
    """Env workers are separate processes: they get the actor's token/TLS settings for their gRPC channels."""
    from rlfleet.actors.env_worker import EnvWorkerPool
    from rlfleet.envs.api import observation_spec
    from rlfleet.wire.auth import AuthConfig, configure
    from rlfleet.wire.slots import slot_layout

    configure(AuthConfig(token="h-env-token-123"))
    srv, port, _ = serve_env(EnvServerConfig(env=env_config("h_counter", overrides=["chunk_size=2"])))
    pool = None
    try:
        cfg = _remote_cfg(f"127.0.0.1:{port}")
        pool = EnvWorkerPool(cfg.__dict__, 4, 1, 2, slot_layout(4, observation_spec(cfg, 2), 2, 2))
        pool.reset()
        pool.slots["actions"][:] = 1.0
        pool.step_async(0)
        pool.step_wait(0)
        np.testing.assert_array_equal(pool.slots["rewards"][:2], np.full((2, 2), 2.0))  # stage 0 stepped
        np.testing.assert_array_equal(pool.slots["rewards"][2:], np.zeros((2, 2)))
        configure(None)  # a client without the token is refused, with the server's reason
        with pytest.raises(RemoteEnvError, match="UNAUTHENTICATED"):
            make_env(cfg, 1)
    finally:
        configure(None)
        if pool is not None:
            pool.close()
        srv.stop(0)


class MiscountedScenesEnv(CounterEnv):
    """Gives one scene id whatever the batch: a server bug the client must not pass on."""

    def episode_scenes(self) -> list[int]:
        return [7]


register_env("h_miscounted_scenes", MiscountedScenesEnv)


def test_scene_ids_come_one_per_env_or_not_at_all(server):
    address, _ = server
    env = make_env(_remote_cfg(address), 2)  # CounterEnv has no scene ids: none on the wire
    try:
        env.reset(np.array([3, 4]))
        assert env.episode_scenes() is None
    finally:
        env.close()
    srv, port, _ = serve_env(EnvServerConfig(env=env_config("h_miscounted_scenes", overrides=["chunk_size=2"])))
    bad = make_env(_remote_cfg(f"127.0.0.1:{port}"), 2)
    try:
        with pytest.raises(codec.WireFormatError, match="1 episode_scenes for 2 envs"):
            bad.reset(np.array([3, 4]))
    finally:
        bad.close()
        srv.stop(0)
