"""The inference role's main: `rlfleet inference --learner HOST:PORT`.

Registers with the learner for the run's config and run spec, pulls the current weights, serves gRPC and
ZeroMQ (and shared memory on this host) until a signal arrives, following the learner's weights.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from argparse import Namespace

import torch

from rlfleet.config import config_from_yaml
from rlfleet.inference_server.server import InferenceServer, build_runner_from_learner
from rlfleet.telemetry.prometheus import (
    InferenceCollector,
    MetricsEndpoint,
    MetricsPortError,
    batch_observer,
    role_registry,
    start_role_metrics,
)
from rlfleet.wire.grpc_server import make_channel
from rlfleet.wire.join import register, stop_on_signals, write_address
from rlfleet.wire.run_spec import registered_spec

log = logging.getLogger(__name__)


def main(args: Namespace) -> int:
    torch.set_num_threads(args.threads)
    client_id = f"inference-{socket.gethostname()}-{os.getpid()}"
    reply = register(args.learner, client_id, "inference")
    cfg = config_from_yaml(reply.config_yaml)
    spec = registered_spec(reply, args.learner)
    channel = make_channel(args.learner)
    if args.device:
        cfg.inference.device = args.device
    runner, subscriber = build_runner_from_learner(channel, cfg, spec, client_id)
    server = InferenceServer(
        runner,
        args.host,
        args.grpc_port,
        args.zmq_port,
        cfg.inference.max_batch,
        cfg.inference.max_wait_ms,
        subscriber,
        offload_idle_s=args.offload_idle_s,
    )
    metrics = _metrics(server, cfg.inference.max_batch, args, client_id)
    write_address(
        args.address_file,
        inference=server.address,
        zmq=server.zmq.endpoint,
        **({"metrics": metrics.address} if metrics else {}),
    )
    log.info("inference server on %s (zmq %s), policy version %d", server.address, server.zmq.endpoint, runner.version)
    stop = threading.Event()
    stop_on_signals(stop)
    threading.Thread(target=lambda: (stop.wait(), server.stop()), daemon=True).start()
    server.serve()
    if metrics is not None:
        metrics.close()
    stats = server.stats()
    log.info("served %d batches, %d rows, %d rejected requests", stats.batches, stats.rows, stats.errors)
    return 0


def _metrics(server: InferenceServer, max_batch: int, args: Namespace, client_id: str) -> MetricsEndpoint | None:
    """The inference server's /metrics (None when --metrics-port is 0); stops the server if the port is taken."""
    if not args.metrics_port:
        return None
    registry = role_registry("inference", id=client_id)
    server.on_batch = batch_observer(registry, max_batch)
    try:
        return start_role_metrics(
            "inference", args.metrics_port, [InferenceCollector(server)], args.metrics_host, registry=registry
        )
    except MetricsPortError:
        server.close()
        raise
