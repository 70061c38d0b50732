"""gRPC front end: a long-lived bidirectional Act stream per actor, raw tensors both ways."""

from __future__ import annotations

import logging
import queue
import socket
import threading

import numpy as np

from rlfleet.inference_server.batcher import DynamicBatcher, InferenceRequest
from rlfleet.wire import codec
from rlfleet.wire.gen import inference_pb2, inference_pb2_grpc
from rlfleet.wire.rejections import RejectionCounter

log = logging.getLogger(__name__)
_DONE = object()


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, batcher: DynamicBatcher, runner, zmq_endpoint: str):
        self.batcher = batcher
        self.runner = runner
        self.zmq_endpoint = zmq_endpoint
        self.errors = 0  # every error answer, batch-stage failures (overload, policy) included
        self.rejections = RejectionCounter()  # requests refused here, by reason

    def GetInfo(self, request, context):
        p = self.runner.policy
        return inference_pb2.ServerInfo(
            zmq_endpoint=self.zmq_endpoint,
            policy_version=self.runner.version,
            state_dim=p.state_dim,
            action_dim=p.action_dim,
            chunk_size=p.chunk_size,
            hostname=socket.gethostname(),
        )

    def _submit(self, msg: inference_pb2.ActRequest, replies: queue.Queue) -> None:
        def respond(out: dict[str, np.ndarray], version: int) -> None:
            replies.put(
                inference_pb2.ActResponse(
                    request_id=msg.request_id, outputs=codec.encode_map(out), policy_version=version
                )
            )

        def fail(err: str) -> None:
            self.errors += 1
            replies.put(inference_pb2.ActResponse(request_id=msg.request_id, error=err))

        try:
            obs = self.runner.validate(codec.decode_map(msg.obs))
        except codec.WireFormatError as exc:
            log.warning("rejected an inference request: %s", exc)
            self.rejections.count(exc.reason)
            fail(str(exc))
            return
        except Exception as exc:  # an answer, never a silently dead stream reader
            log.exception("unexpected error on an inference request")
            self.rejections.count("internal")
            fail(f"request could not be processed: {type(exc).__name__}: {exc}")
            return
        self.batcher.submit(InferenceRequest(obs, msg.deterministic, respond, fail))

    def Act(self, request_iterator, context):
        replies: queue.Queue = queue.Queue()
        counts = {"in": 0, "reading": True}

        def read() -> None:
            try:
                for msg in request_iterator:
                    counts["in"] += 1
                    self._submit(msg, replies)
            except Exception:  # client went away mid-stream
                pass
            finally:
                counts["reading"] = False
                replies.put(_DONE)

        threading.Thread(target=read, name="act-stream-reader", daemon=True).start()
        sent = 0
        while context.is_active():
            try:
                item = replies.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is _DONE:
                if sent >= counts["in"]:
                    return
                replies.put(_DONE)  # answers still owed: come back to it after them
                continue
            sent += 1
            yield item
