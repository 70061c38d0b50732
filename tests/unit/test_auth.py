"""Token, TLS, the bind rule and size limits on real gRPC / ZeroMQ servers on loopback."""

from __future__ import annotations

import shutil
import struct
import subprocess
import threading

import grpc
import numpy as np
import pytest
import torch
import zmq
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from rlfleet import cli
from rlfleet.actors.inference_client import InferenceError, connect_inference, reachable_endpoint
from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.inference_server.server import InferenceServer
from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig
from rlfleet.runs import launcher
from rlfleet.wire import auth, codec
from rlfleet.wire.auth import AuthConfig, AuthError, TokenAuthInterceptor, load_auth
from rlfleet.wire.grpc_server import make_channel, start_grpc_server
from rlfleet.wire.shm import SharedArrays
from rlfleet.wire.slots import slot_layout

TOKEN = "s3cret-token"
SERVICE = "test.Echo"
TIMEOUT = 20.0
S, D, K = 5, 2, 1


def _echo(server: grpc.Server) -> None:
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req),
                    "Chat": grpc.stream_stream_rpc_method_handler(lambda reqs, ctx: (r for r in reqs)),
                },
            ),
        )
    )


@pytest.fixture
def echo_server(request):
    cfg = getattr(request, "param", AuthConfig(token=TOKEN))
    server, port = start_grpc_server("127.0.0.1", 0, [_echo], [SERVICE], max_workers=4, auth=cfg)
    yield f"127.0.0.1:{port}"
    server.stop(grace=None).wait(5)


@pytest.fixture(autouse=True)
def process_auth(monkeypatch):
    """Tests start from no settings at all; `process_auth(cfg)` installs some (the CLI's job)."""
    for var in (
        "RLFLEET_TOKEN",
        "RLFLEET_TLS_CERT",
        "RLFLEET_TLS_KEY",
        "RLFLEET_TLS_CA",
        "RLFLEET_TLS_SERVER_NAME",
        "RLFLEET_MAX_MESSAGE_BYTES",
    ):
        monkeypatch.delenv(var, raising=False)
    yield auth.configure
    auth.configure(None)


def _echo_call(address: str, cfg: AuthConfig, payload: bytes = b"ping") -> bytes:
    with make_channel(address, cfg) as ch:
        return ch.unary_unary(f"/{SERVICE}/Echo")(payload, timeout=TIMEOUT)


def _code(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value.code()


# ---- gRPC token --------------------------------------------------------------------------------


def test_right_token_passes_unary_and_streaming_calls(echo_server):
    cfg = AuthConfig(token=TOKEN)
    assert _echo_call(echo_server, cfg) == b"ping"
    with make_channel(echo_server, cfg) as ch:
        assert list(ch.stream_stream(f"/{SERVICE}/Chat")(iter([b"a", b"b"]), timeout=TIMEOUT)) == [b"a", b"b"]


@pytest.mark.parametrize("client", [AuthConfig(), AuthConfig(token="wrong-token")], ids=["none", "wrong"])
def test_missing_or_wrong_token_is_unauthenticated_and_serving_goes_on(echo_server, client):
    assert _code(lambda: _echo_call(echo_server, client)) == grpc.StatusCode.UNAUTHENTICATED
    with make_channel(echo_server, client) as ch:  # a stream is refused before any message
        chat = ch.stream_stream(f"/{SERVICE}/Chat")
        assert _code(lambda: list(chat(iter([b"a"]), timeout=TIMEOUT))) == grpc.StatusCode.UNAUTHENTICATED
    assert _echo_call(echo_server, AuthConfig(token=TOKEN)) == b"ping"


def test_health_needs_no_token_but_reflection_does(echo_server):
    with make_channel(echo_server, AuthConfig()) as ch:  # what a Kubernetes gRPC probe does
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=TIMEOUT)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert _code(lambda: ProtoReflectionDescriptorDatabase(ch).get_services()) == grpc.StatusCode.UNAUTHENTICATED
    with make_channel(echo_server, AuthConfig(token=TOKEN)) as ch:
        assert SERVICE in ProtoReflectionDescriptorDatabase(ch).get_services()


def test_interceptor_counts_refusals_and_compares_the_whole_header():
    icpt = TokenAuthInterceptor(TOKEN)
    seen = []

    class Details:
        def __init__(self, method, metadata):
            self.method, self.invocation_metadata = method, metadata

    def cont(details):
        seen.append(details.method)
        return grpc.unary_unary_rpc_method_handler(lambda r, c: r)

    icpt.intercept_service(cont, Details("/x.Y/Z", [("authorization", f"Bearer {TOKEN}")]))
    icpt.intercept_service(cont, Details("/grpc.health.v1.Health/Check", []))
    for md in ([], [("authorization", TOKEN)], [("authorization", f"Bearer {TOKEN}x")]):
        handler = icpt.intercept_service(cont, Details("/x.Y/Z", md))
        assert handler.unary_unary is not None and handler.unary_unary.__name__ == "_deny"
    assert icpt.rejected == 3


# ---- TLS ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    """A throwaway certificate for 127.0.0.1 / localhost (the openssl CLI; `cryptography` is not a dependency)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:learner.internal",
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def test_tls_with_token(self_signed):
    cert, key = self_signed
    server_cfg = AuthConfig(token=TOKEN, tls_cert=cert, tls_key=key)
    server, port = start_grpc_server("127.0.0.1", 0, [_echo], [SERVICE], max_workers=4, auth=server_cfg)
    address = f"127.0.0.1:{port}"
    try:
        assert _echo_call(address, AuthConfig(token=TOKEN, tls_ca=cert)) == b"ping"
        assert _echo_call(f"localhost:{port}", AuthConfig(token=TOKEN, tls_ca=cert)) == b"ping"
        named = AuthConfig(token=TOKEN, tls_ca=cert, tls_server_name="learner.internal")  # checked against the name
        assert _echo_call(address, named) == b"ping"
        misnamed = AuthConfig(token=TOKEN, tls_ca=cert, tls_server_name="someone.else")
        assert _code(lambda: _echo_call(address, misnamed)) == grpc.StatusCode.UNAVAILABLE
        # token as call credentials over TLS: a wrong one is still refused
        assert (
            _code(lambda: _echo_call(address, AuthConfig(token="wrong", tls_ca=cert)))
            == grpc.StatusCode.UNAUTHENTICATED
        )
        # a plain-text client cannot talk to a TLS server
        assert _code(lambda: _echo_call(address, AuthConfig(token=TOKEN))) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None).wait(5)


def test_tls_settings_are_checked():
    with pytest.raises(AuthError, match="both a certificate and its key"):
        AuthConfig(tls_cert="cert.pem")
    with pytest.raises(AuthError, match="cannot read the TLS key /nope.key"):
        start_grpc_server(
            "127.0.0.1", 0, [_echo], [SERVICE], auth=AuthConfig(tls_cert="/nope.pem", tls_key="/nope.key")
        )


# ---- bind rule ---------------------------------------------------------------------------------


def test_non_loopback_bind_needs_a_token():
    with pytest.raises(ValueError, match="without a token.*loopback.*RLFLEET_TOKEN"):
        start_grpc_server("0.0.0.0", 0, [_echo], [SERVICE], auth=AuthConfig())
    server, port = start_grpc_server("0.0.0.0", 0, [_echo], [SERVICE], max_workers=4, auth=AuthConfig(token=TOKEN))
    try:
        assert _echo_call(f"127.0.0.1:{port}", AuthConfig(token=TOKEN)) == b"ping"
    finally:
        server.stop(grace=None).wait(5)
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        auth.check_bind_host(host, AuthConfig())
    for host in ("0.0.0.0", "::", "10.1.2.3", "example.org"):
        with pytest.raises(ValueError):
            auth.check_bind_host(host, AuthConfig())


# ---- message size ------------------------------------------------------------------------------


@pytest.mark.parametrize("echo_server", [AuthConfig(token=TOKEN, max_message_bytes=64 * 1024)], indirect=True)
def test_oversized_message_is_resource_exhausted_and_serving_goes_on(echo_server):
    big = AuthConfig(token=TOKEN)  # the client allows more than the server does
    assert _code(lambda: _echo_call(echo_server, big, b"x" * 100_000)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _echo_call(echo_server, big, b"x" * 1000) == b"x" * 1000
    small = AuthConfig(token=TOKEN, max_message_bytes=1024)  # the client's own limit refuses to send
    assert _code(lambda: _echo_call(echo_server, small, b"x" * 2048)) == grpc.StatusCode.RESOURCE_EXHAUSTED


# ---- ZeroMQ ------------------------------------------------------------------------------------


def _inference_server(host: str, cfg: AuthConfig) -> tuple[InferenceServer, threading.Thread]:
    torch.manual_seed(0)
    policy = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[8]))
    srv = InferenceServer(PolicyRunner(policy, version=3), host, 0, 0, max_batch=16, max_wait_ms=2, auth=cfg)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    return srv, thread


@pytest.fixture
def token_server():
    srv, thread = _inference_server("127.0.0.1", AuthConfig(token=TOKEN, max_message_bytes=256 * 1024))
    yield srv
    srv.stop()
    thread.join(10)


@pytest.fixture
def slots():
    blk = SharedArrays.create(slot_layout(4, {"states": ((S,), "float32")}, D, K))
    blk["states"][:] = np.random.default_rng(0).normal(size=(4, S)).astype(np.float32)
    yield blk
    blk.close()


def _raw_request(endpoint: str, frames: list, wait_s: float = TIMEOUT) -> list[bytes] | None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        return sock.recv_multipart() if sock.poll(int(wait_s * 1000)) else None
    finally:
        sock.close()


def test_zmq_token_checked_on_every_request_and_serving_goes_on(token_server, slots, process_auth):
    act = [b"act", struct.pack("<Q", 1), b"\0", *codec.encode_frames({"states": np.zeros((2, S), np.float32)})]
    endpoint = token_server.zmq.endpoint
    missing = _raw_request(endpoint, act)
    wrong = _raw_request(endpoint, [b"auth", b"wrong", *act])
    assert missing[0] == b"error" and b"needs a token" in missing[2]
    assert wrong[0] == b"error" and wrong[2] == b"wrong token"
    assert token_server.zmq.auth_rejected == 2 and token_server.stats().errors >= 2
    ok = _raw_request(endpoint, [b"auth", TOKEN.encode(), *act])
    assert ok[0] == b"result" and struct.unpack("<q", ok[2])[0] == 3

    process_auth(AuthConfig(token=TOKEN))  # the actor's clients take the token from the process settings
    for transport in ("shm", "zmq", "grpc"):
        client = connect_inference(transport, token_server.address, slots)
        try:
            client.submit(0, 0, 4)
            assert client.wait(0) == 3, transport
        finally:
            client.close()


def test_zmq_client_without_token_gets_a_clear_error(token_server, slots):
    with pytest.raises(grpc.RpcError):  # even asking for the ZeroMQ endpoint needs the token
        connect_inference("zmq", token_server.address, slots)
    from rlfleet.actors.inference_client import ZmqInferenceClient

    client = ZmqInferenceClient(token_server.zmq.endpoint, slots, timeout_s=TIMEOUT)
    try:
        client.submit(0, 0, 4)
        with pytest.raises(InferenceError, match="needs a token"):
            client.wait(0)
    finally:
        client.close()


def test_zmq_oversized_frame_refused_and_serving_goes_on(token_server, process_auth):
    huge = [b"auth", TOKEN.encode(), b"act", struct.pack("<Q", 1), b"\0", b"x" * (300 * 1024)]
    assert _raw_request(token_server.zmq.endpoint, huge, wait_s=2) is None  # over 256 KiB: the peer is dropped
    process_auth(AuthConfig(token=TOKEN, max_message_bytes=1024))  # a client that knows the limit says so
    big = SharedArrays.create(slot_layout(64, {"states": ((S,), "float32")}, D, K))
    client = connect_inference("zmq", token_server.address, big)
    try:
        with pytest.raises(InferenceError, match="exceeds the 1024-byte message limit"):
            client.submit(0, 0, 64)  # 64 x 5 float32 = 1280 bytes
        client.submit(0, 0, 4)  # the server still serves, this client too
        assert client.wait(0) == 3
    finally:
        client.close()
        big.close()


def test_wildcard_bind_with_token_reached_through_loopback(slots, process_auth):
    with pytest.raises(ValueError, match="without a token"):
        _inference_server("0.0.0.0", AuthConfig())
    srv, thread = _inference_server("0.0.0.0", AuthConfig(token=TOKEN))
    try:
        assert srv.zmq.endpoint.startswith("tcp://0.0.0.0:")
        process_auth(AuthConfig(token=TOKEN))
        client = connect_inference("zmq", f"127.0.0.1:{srv.grpc_port}", slots)
        try:
            client.submit(0, 0, 4)
            assert client.wait(0) == 3
        finally:
            client.close()
    finally:
        srv.stop()
        thread.join(10)
    assert reachable_endpoint("tcp://0.0.0.0:5555", "10.0.0.7:6000") == "tcp://10.0.0.7:5555"
    assert reachable_endpoint("tcp://10.0.0.8:5555", "10.0.0.7:6000") == "tcp://10.0.0.8:5555"


# ---- settings from flags and environment -------------------------------------------------------


def test_token_file_wins_over_environment_and_child_env_round_trips(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(" from-file\n")
    token_file.chmod(0o600)
    env = {"RLFLEET_TOKEN": "from-env", "RLFLEET_TLS_CA": "/ca.pem", "RLFLEET_MAX_MESSAGE_BYTES": "1000"}
    assert load_auth(env=env).token == "from-env"
    cfg = load_auth(str(token_file), env=env, tls_ca=None, tls_server_name="learner.internal")
    assert (cfg.token, cfg.tls_ca, cfg.tls_server_name, cfg.max_message_bytes) == (
        "from-file",
        "/ca.pem",
        "learner.internal",
        1000,
    )
    assert AuthConfig.from_env(cfg.child_env()) == cfg
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(AuthError, match="empty"):
        load_auth(str(tmp_path / "empty"), env={})
    with pytest.raises(AuthError, match="cannot read"):
        load_auth(str(tmp_path / "missing"), env={})


def test_launcher_passes_the_token_by_environment_not_command_line(monkeypatch, process_auth):
    seen = {}

    class FakePopen:
        def __init__(self, args, env, stdout, stderr, **_):
            seen.update(args=args, env=env)

    monkeypatch.setattr(launcher.subprocess, "Popen", FakePopen)
    process_auth(AuthConfig(token=TOKEN, tls_ca="/ca.pem"))
    launcher._spawn(["actor", "--learner", "127.0.0.1:1"])
    assert not any(TOKEN in a for a in seen["args"])
    assert seen["env"]["RLFLEET_TOKEN"] == TOKEN and seen["env"]["RLFLEET_TLS_CA"] == "/ca.pem"


def test_cli_addresses_come_from_flags_or_environment(monkeypatch, capsys):
    for var in (
        "RLFLEET_LEARNER",
        "RLFLEET_INFERENCE",
        "RLFLEET_HOST",
        "RLFLEET_GRPC_PORT",
        "RLFLEET_ZMQ_PORT",
        "RLFLEET_LEARNER_PORT",
    ):
        monkeypatch.delenv(var, raising=False)
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        cli._check_addresses(parser, parser.parse_args(["actor", "--inference", "127.0.0.1:2"]))
    err = capsys.readouterr().err
    assert "--learner" in err and "RLFLEET_LEARNER" in err

    monkeypatch.setenv("RLFLEET_LEARNER", "10.0.0.1:50051")
    monkeypatch.setenv("RLFLEET_INFERENCE", "10.0.0.2:50052,10.0.0.3:50052")
    monkeypatch.setenv("RLFLEET_HOST", "0.0.0.0")
    monkeypatch.setenv("RLFLEET_GRPC_PORT", "6000")
    monkeypatch.setenv("RLFLEET_ZMQ_PORT", "6001")
    monkeypatch.setenv("RLFLEET_LEARNER_PORT", "6002")
    parser = cli.build_parser()
    actor = parser.parse_args(["actor"])
    cli._check_addresses(parser, actor)
    assert (actor.learner, actor.inference) == ("10.0.0.1:50051", "10.0.0.2:50052,10.0.0.3:50052")
    assert parser.parse_args(["actor", "--learner", "127.0.0.1:9"]).learner == "127.0.0.1:9"  # the flag wins
    inf = parser.parse_args(["inference"])
    assert (inf.learner, inf.host, inf.grpc_port, inf.zmq_port) == ("10.0.0.1:50051", "0.0.0.0", 6000, 6001)
    learner = parser.parse_args(["learner", "metaworld_reach_ppo"])
    assert (learner.host, learner.port) == ("0.0.0.0", 6002)

    monkeypatch.setenv("RLFLEET_GRPC_PORT", "not-a-port")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["inference"])
    assert "not a port number" in capsys.readouterr().err


def test_identities_file_names_tokens(tmp_path):
    from rlfleet.wire.auth import FLEET_IDENTITY, identity_of, read_identities

    f = tmp_path / "ids"
    f.write_text("alice a1  # a comment\n\nbob b2\n")
    assert read_identities(str(f)) == {"alice": "a1", "bob": "b2"}
    cfg = AuthConfig(token=TOKEN, identities_file=str(f))
    assert identity_of([("authorization", "Bearer b2")], cfg) == "bob"
    assert identity_of([("authorization", f"Bearer {TOKEN}")], cfg) == FLEET_IDENTITY
    assert identity_of([("authorization", "Bearer nope")], cfg) == "" and identity_of([], cfg) == ""
    assert identity_of([("authorization", "Bearer b2")], AuthConfig()) == ""  # no token set: no identities
    for bad in ("alice", "alice a b", "al/ce a", "alice a\nalice b", "fleet f"):
        f.write_text(bad + "\n")
        with pytest.raises(AuthError):
            read_identities(str(f))
