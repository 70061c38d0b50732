"""Each role's /metrics endpoint, scraped from real processes while a tiny run trains."""

from __future__ import annotations

import math
import socket
import struct
import time
import urllib.request

import grpc
import zmq
from prometheus_client.parser import text_string_to_metric_families

from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(address: str) -> dict:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(families: dict, sample_name: str, **labels: str) -> float:
    """One sample's value (sample names carry _total, _count, _bucket ... beyond the family name)."""
    for family in families.values():
        for sample in family.samples:
            if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no sample {sample_name}{labels} among {sorted(families)}")


def _total(families: dict, family_name: str) -> float:
    """Sum over labels (e.g. rejections by reason)."""
    return sum(s.value for s in families[family_name].samples if s.name == family_name + "_total")


def _wait_for(address: str, sample_name: str, minimum: float, timeout: float, log) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        families = _scrape(address)
        try:
            if _value(families, sample_name) >= minimum:
                return families
        except AssertionError:
            pass
        assert time.monotonic() < deadline, f"{sample_name} never reached {minimum}:\n{log()[-3000:]}"
        time.sleep(0.3)


def _push_malformed_segment(learner_addr: str) -> None:
    chunk = learner_pb2.TrajectoryChunk(client_id="bad-client", segment_id=1, chunk_index=0, num_chunks=0, payload=b"x")
    with grpc.insecure_channel(learner_addr) as ch:
        ack = learner_pb2_grpc.LearnerServiceStub(ch).PushTrajectory(iter([chunk]), timeout=10)
    assert not ack.accepted and ack.error


def _send_malformed_inference_request(zmq_endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        sock.connect(zmq_endpoint)
        sock.send_multipart([b"no-such-kind", struct.pack("<q", 1)])
        assert sock.recv_multipart()[0] == b"error"
    finally:
        sock.close()
        ctx.term()


def test_learner_inference_and_actor_serve_prometheus_metrics(roles, tmp_path, monkeypatch):
    learner_port, inference_port, actor_port = _free_port(), _free_port(), _free_port()
    learner, laddr = roles.learner(
        tmp_path / "run", "runner.total_env_steps=100000000", "eval.at_end=false", "--metrics-port", str(learner_port)
    )
    learner_info = roles.wait_address("learner", learner)
    assert learner_info["metrics"] == f"127.0.0.1:{learner_port}"  # reported beside the gRPC address
    inference = roles.start(
        "inference",
        "inference",
        "--learner",
        laddr,
        "--address-file",
        str(tmp_path / "inference.json"),
        "--metrics-port",
        str(inference_port),
    )
    inference_info = roles.wait_address("inference", inference)
    monkeypatch.setenv("RLFLEET_METRICS_PORT", str(actor_port))  # the environment works as well as the flag
    roles.actor("actor-metrics", laddr, inference_info["inference"], "zmq")
    monkeypatch.delenv("RLFLEET_METRICS_PORT")

    _push_malformed_segment(laddr)
    _send_malformed_inference_request(inference_info["zmq"])
    lm = _wait_for(learner_info["metrics"], "rlfleet_learner_updates_total", 2, 180, lambda: roles.log("learner"))

    # learner: live counters, bad input counted, TensorBoard scalars mirrored as gauges
    assert _value(lm, "rlfleet_learner_policy_version") >= 2
    assert _value(lm, "rlfleet_learner_env_steps_total") >= 2 * 64
    assert _value(lm, "rlfleet_learner_rejected_segments_total", reason="protocol") >= 1
    assert _value(lm, "rlfleet_learner_accepted_segments_total") >= 2
    assert _value(lm, "rlfleet_learner_ingest_queue_capacity") == 4
    assert 0 <= _value(lm, "rlfleet_learner_ingest_queue_depth") <= 4
    assert lm["rlfleet_learner_rejected_segments"].type == "counter"
    for gauge in (
        "rlfleet_learner_train_actor_approx_kl",
        "rlfleet_learner_train_actor_policy_loss",
        "rlfleet_learner_train_critic_value_loss",
        "rlfleet_learner_throughput_policy_lag",
    ):
        assert lm[gauge].type == "gauge" and math.isfinite(_value(lm, gauge)), gauge
    assert _value(lm, "rlfleet_learner_throughput_env_steps_per_s") > 0
    assert _value(lm, "rlfleet_info", role="learner") == 1
    assert _value(lm, "process_resident_memory_bytes") > 0

    # inference server: batch-size histogram, requests, errors by front end
    im = _scrape(f"127.0.0.1:{inference_port}")
    assert im["rlfleet_inference_batch_size"].type == "histogram"
    batches = _value(im, "rlfleet_inference_batch_size_count")
    assert batches > 0 and _value(im, "rlfleet_inference_batch_size_sum") >= batches
    assert _value(im, "rlfleet_inference_batch_size_bucket", le="+Inf") == batches
    assert _value(im, "rlfleet_inference_requests_total") >= batches
    assert _value(im, "rlfleet_inference_rows_total") >= _value(im, "rlfleet_inference_batches_total") > 0
    assert im["rlfleet_inference_rejected_requests"].type == "counter"
    assert _total(im, "rlfleet_inference_rejected_requests") >= 1  # the malformed ZeroMQ message
    assert _value(im, "rlfleet_inference_policy_version") >= 0
    assert _value(im, "rlfleet_info", role="inference") == 1

    # actor: env steps, segments and finished episodes (20-step episodes, 8-step segments)
    am = _wait_for(f"127.0.0.1:{actor_port}", "rlfleet_actor_episodes_total", 1, 60, lambda: roles.log("actor-metrics"))
    assert _value(am, "rlfleet_actor_env_steps_total") >= 2 * 64
    assert _value(am, "rlfleet_actor_segments_total") >= 2
    assert 0 <= _value(am, "rlfleet_actor_successful_episodes_total") <= _value(am, "rlfleet_actor_episodes_total")
    assert _value(am, "rlfleet_info", role="actor", id="actor-metrics") == 1


def test_env_server_counts_calls_and_rejected_calls(roles, tmp_path):
    from rlfleet.wire.gen import env_pb2, env_pb2_grpc

    port = _free_port()
    server = roles.start(
        "env-server",
        "env-server",
        "--env",
        "metaworld",
        "--task",
        "reach-v3",
        "--metrics-port",
        str(port),
        "--address-file",
        str(tmp_path / "env-server.json"),
    )
    address = roles.wait_address("env-server", server)["env"]
    with grpc.insecure_channel(address) as ch:
        stub = env_pb2_grpc.EnvServiceStub(ch)
        stub.GetSpec(env_pb2.SpecRequest(session_id="s1", num_envs=1), timeout=60)
        try:
            stub.ChunkStep(env_pb2.ChunkStepRequest(session_id="never-opened"), timeout=10)
            raise AssertionError("a step in an unknown session was accepted")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    em = _scrape(f"127.0.0.1:{port}")
    assert _value(em, "rlfleet_env_server_calls_total", rpc="GetSpec") == 1
    assert _value(em, "rlfleet_env_server_calls_total", rpc="ChunkStep") == 1
    assert _value(em, "rlfleet_env_server_rejected_calls_total", code="FAILED_PRECONDITION") == 1
    assert _value(em, "rlfleet_env_server_sessions") == 1 and _value(em, "rlfleet_env_server_envs") == 1
    assert _value(em, "rlfleet_info", role="env-server") == 1
