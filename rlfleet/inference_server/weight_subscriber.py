"""Follows the learner's weight versions: watch the stream, pull new versions in chunks, verify."""
from __future__ import annotations

import logging
import threading
import time

import grpc

from rlfleet.policies.checkpoint_io import checksum
from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc

log = logging.getLogger(__name__)


def pull_weights(stub: learner_pb2_grpc.LearnerServiceStub, version: int = -1) -> tuple[int, bytes]:
    """Fetch one version's bytes; raises ValueError if the chunks or checksum do not add up."""
    parts, meta = [], None
    for chunk in stub.PullWeights(learner_pb2.PullRequest(version=version)):
        if meta is None:
            meta = chunk
        if chunk.index != len(parts) or chunk.version != meta.version:
            raise ValueError("weight chunks out of order or from mixed versions")
        parts.append(chunk.data)
    if meta is None:
        raise ValueError("learner sent no weight chunks")
    data = b"".join(parts)
    if len(parts) != meta.num_chunks or len(data) != meta.total_size:
        raise ValueError(f"incomplete weights: {len(data)} of {meta.total_size} bytes")
    if checksum(data) != meta.checksum:
        raise ValueError(f"weight checksum mismatch for version {meta.version}")
    return meta.version, data


class WeightSubscriber:
    """Background thread; `take()` hands the newest verified weights to the batching loop."""

    def __init__(self, channel: grpc.Channel, known_version: int, subscriber_id: str):
        self.stub = learner_pb2_grpc.LearnerServiceStub(channel)
        self.known = known_version
        self.subscriber_id = subscriber_id
        self.finished = threading.Event()
        self._pending: tuple[int, bytes] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weight-subscriber", daemon=True)

    def start(self) -> "WeightSubscriber":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def take(self) -> tuple[int, bytes] | None:
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set() and not self.finished.is_set():
            try:
                stream = self.stub.WatchWeights(
                    learner_pb2.WatchRequest(subscriber_id=self.subscriber_id, known_version=self.known)
                )
                for ann in stream:
                    backoff = 0.2
                    if ann.final:
                        self.finished.set()
                        break
                    if ann.version > self.known:
                        version, data = pull_weights(self.stub, ann.version)
                        with self._lock:
                            self._pending = (version, data)
                        self.known = version
                    if self._stop.is_set():
                        break
            except (grpc.RpcError, ValueError) as exc:
                if self._stop.is_set():
                    break
                reason = exc.code() if isinstance(exc, grpc.RpcError) else exc
                log.warning("weight watch interrupted (%s); retrying in %.1fs", reason, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
