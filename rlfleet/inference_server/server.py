"""The inference server process: front ends -> dynamic batcher -> policy, weights from the learner."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from omegaconf import DictConfig

from rlfleet.config import as_dict
from rlfleet.envs.registry import build_env_config
from rlfleet.envs.run_shapes import run_observation_spec
from rlfleet.inference_server.batcher import DynamicBatcher, InferenceRequest
from rlfleet.inference_server.grpc_frontend import InferenceServicer
from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.inference_server.weight_subscriber import WeightSubscriber, pull_weights
from rlfleet.inference_server.zmq_frontend import ZmqFrontend
from rlfleet.policies.checkpoint_io import load_state_dict_bytes
from rlfleet.policies.registry import make_policy
from rlfleet.telemetry.profiling import profiled
from rlfleet.wire.auth import AuthConfig
from rlfleet.wire.auth import resolve as resolve_auth
from rlfleet.wire.gen import inference_pb2_grpc, learner_pb2_grpc
from rlfleet.wire.grpc_decoding import add_servicer
from rlfleet.wire.grpc_server import start_grpc_server
from rlfleet.wire.rejections import merge_counts
from rlfleet.wire.run_spec import RunSpec

log = logging.getLogger(__name__)


@dataclass
class InferenceStats:
    batches: int
    rows: int
    errors: int
    version: int


class InferenceServer:
    """Owns the serving loop (ZeroMQ receive, batching, policy, answers on one thread); runs until
    stop() or until the learner says training is over."""

    def __init__(
        self,
        runner: PolicyRunner,
        host: str,
        grpc_port: int,
        zmq_port: int,
        max_batch: int,
        max_wait_ms: float,
        subscriber: WeightSubscriber | None = None,
        auth: AuthConfig | None = None,
        offload_idle_s: float = 0.0,
    ):
        auth = resolve_auth(auth)  # token / TLS / size limit for both front ends
        self.runner = runner
        self.batcher = DynamicBatcher(max_batch, max_wait_ms)
        self.ctx = zmq.Context()
        self.zmq = ZmqFrontend(self.ctx, host, zmq_port, self.batcher, runner.validate, auth)
        # The serving thread receives ZeroMQ requests itself while it waits for a batch; gRPC
        # requests arrive on gRPC's threads and wake that wait.
        self.batcher.pump = self.zmq.pump
        self.batcher.on_submit = self.zmq.wake
        self.servicer = InferenceServicer(self.batcher, runner, self.zmq.endpoint)
        self.grpc_server, self.grpc_port = start_grpc_server(
            host,
            grpc_port,
            [
                lambda s: add_servicer(
                    inference_pb2_grpc.add_InferenceServiceServicer_to_server,
                    self.servicer,
                    s,
                    self.servicer.rejections.count,
                )
            ],
            ["rlfleet.v1.InferenceService"],
            auth=auth,
            on_refused=self.servicer.rejections.count,
        )
        self.address = f"{host}:{self.grpc_port}"
        self.subscriber = subscriber
        self.on_batch: Callable[[list[InferenceRequest]], None] | None = None  # e.g. the metrics histogram
        self._stop = threading.Event()
        self.offload_idle_s = offload_idle_s
        self.policy_seconds = 0.0  # wall time inside runner.run: its rate is the server's busy fraction

    def stop(self) -> None:
        self._stop.set()

    def stats(self) -> InferenceStats:
        return InferenceStats(
            self.runner.batches, self.runner.rows, sum(self.rejected_requests().values()), self.runner.version
        )

    def rejected_requests(self) -> dict[str, int]:
        """Requests answered with an error, by reason (bad input, protocol, overload, policy failure)."""
        return merge_counts(
            self.zmq.rejections.snapshot(),
            self.servicer.rejections.snapshot(),
            {"overloaded": self.batcher.overloaded, "policy_error": self.runner.errors},
        )

    def serve(self) -> None:
        try:
            with profiled("inference"):
                self._serve()
        finally:
            self.close()

    def _serve(self) -> None:
        last_batch = time.monotonic()
        while not self._stop.is_set():
            if self.subscriber is not None:
                if self.subscriber.finished.is_set():
                    log.info("learner finished training; inference server exits")
                    break
                pending = self.subscriber.take()
                if pending is not None:
                    self.runner.load_update(pending)
            batch = self.batcher.next_batch(timeout=0.05)
            if batch:
                t0 = time.monotonic()
                self.runner.run(batch)
                last_batch = time.monotonic()
                self.policy_seconds += last_batch - t0
                if self.on_batch is not None:
                    self.on_batch(batch)
            elif self.offload_idle_s and time.monotonic() - last_batch > self.offload_idle_s:
                self.runner.offload()  # the actors wait on the learner's update: lend it the memory

    def close(self) -> None:
        if self.subscriber is not None:
            self.subscriber.stop()
        self.grpc_server.stop(grace=0.5)
        self.zmq.close()
        self.ctx.term()


def build_runner_from_learner(
    channel, cfg: DictConfig, spec: RunSpec, subscriber_id: str
) -> tuple[PolicyRunner, WeightSubscriber]:
    """The run's policy (as the run spec says the learner built it) with the learner's current
    weights, plus a subscriber for newer ones."""
    # a fresh policy of the run's kind: its weights come from the learner, not from model_path
    policy = make_policy(
        spec.fresh_policy_settings(), spec.state_dim, spec.action_dim, cfg.env.chunk_size, image_size=cfg.env.image_size
    )
    stub = learner_pb2_grpc.LearnerServiceStub(channel)
    initial = pull_weights(stub)
    load_state_dict_bytes(policy, initial.data)
    obs_spec = run_observation_spec(build_env_config(as_dict(cfg.env)), spec)
    runner = PolicyRunner(policy, initial.version, cfg.inference.device, obs_spec)
    return runner, WeightSubscriber(channel, initial, subscriber_id, delta=cfg.inference.weight_delta).start()
