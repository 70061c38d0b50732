"""The actor role's main: `rlfleet actor --learner HOST:PORT --inference HOST:PORT[,...]`.

Registers with the learner (which hands out the run's config, its run spec and this actor's index), then runs
the env workers until the learner says stop or a signal arrives (`rlfleet.actors.actor.run_actor`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from argparse import Namespace

from rlfleet.actors.actor import ActorCounters, run_actor
from rlfleet.config import config_from_yaml
from rlfleet.telemetry.prometheus import ActorCollector, start_role_metrics
from rlfleet.wire.join import EXIT_INTERRUPTED, register, report_exit, stop_on_signals
from rlfleet.wire.run_spec import registered_spec

log = logging.getLogger(__name__)


def main(args: Namespace) -> int:
    client_id = args.id or f"actor-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    reply = register(args.learner, client_id, "actor")
    cfg = config_from_yaml(reply.config_yaml)
    spec = registered_spec(reply, args.learner)
    if args.transport:
        cfg.actor.transport = args.transport
    index = args.index if args.index is not None else reply.client_index
    stop = threading.Event()
    stop_on_signals(stop)
    counters = ActorCounters()
    metrics = start_role_metrics(
        "actor", args.metrics_port, [ActorCollector(counters)], args.metrics_host, id=client_id, index=str(index)
    )
    try:
        stats = run_actor(
            cfg, spec, index, client_id, args.learner, args.inference, stop, counters, reply.registrations
        )
    except Exception as exc:  # the learner logs this actor's death with its cause, and frees its index
        cause = " ".join(str(exc).split()) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        report_exit(args.learner, client_id, cause.splitlines()[0] if cause else type(exc).__name__)
        raise
    finally:
        if metrics is not None:
            metrics.close()
    log.info(
        "actor %s done: %d env steps, %d segments in %.0fs (%.0f steps/s)",
        client_id,
        stats.env_steps,
        stats.segments,
        stats.seconds,
        stats.env_steps / max(stats.seconds, 1e-6),
    )
    if stop.is_set():  # a signal, not the learner's stop: the one rule's "interrupted"
        log.warning("actor %s interrupted", client_id)
        return EXIT_INTERRUPTED
    return 0
