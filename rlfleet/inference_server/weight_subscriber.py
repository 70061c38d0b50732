"""Follows the learner's weight versions: watch the stream, pull new versions in chunks (only the
changed tensors when delta sync is on), verify, and hand them to the batching loop."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import grpc
import torch
from safetensors.torch import load as st_load

from rlfleet.policies.checkpoint_io import checksum
from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PulledWeights:
    version: int
    data: bytes
    base_version: int  # -1: all tensors; else a delta on top of base_version


def pull_weights(
    stub: learner_pb2_grpc.LearnerServiceStub, version: int = -1, base_version: int | None = None
) -> PulledWeights:
    """Fetch one version's bytes (a delta on `base_version` if given and the learner can);
    raises ValueError if the chunks or checksum do not add up."""
    parts, meta = [], None
    request = learner_pb2.PullRequest(
        version=version, delta=base_version is not None, base_version=base_version if base_version is not None else -1
    )
    for chunk in stub.PullWeights(request):
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
    if base_version is None and meta.base_version != -1:
        raise ValueError(f"asked for full weights, got a delta on version {meta.base_version}")
    if base_version is not None and meta.base_version not in (-1, base_version):
        raise ValueError(f"asked for a delta on version {base_version}, got one on {meta.base_version}")
    return PulledWeights(meta.version, data, meta.base_version)


@dataclass(frozen=True)
class WeightUpdate:
    """Tensors to load for `version`: all of them (`complete`) or those changed since the last take."""

    version: int
    tensors: dict[str, torch.Tensor]
    complete: bool


class WeightSubscriber:
    """Background thread; `take()` hands the newest verified weights to the batching loop."""

    def __init__(self, channel: grpc.Channel, initial: PulledWeights, subscriber_id: str, delta: bool = True):
        self.stub = learner_pb2_grpc.LearnerServiceStub(channel)
        self.known = initial.version
        self.subscriber_id = subscriber_id
        self.delta = delta
        self.finished = threading.Event()
        self.bytes_received = 0
        self._pending: WeightUpdate | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weight-subscriber", daemon=True)

    def start(self) -> WeightSubscriber:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def take(self) -> WeightUpdate | None:
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

    def _apply(self, pulled: PulledWeights) -> None:
        """Fold a pull into the full state and into the update the batching loop will take."""
        incoming = st_load(pulled.data)
        complete = pulled.base_version == -1
        self.bytes_received += len(pulled.data)
        with self._lock:
            if complete or self._pending is None:
                self._pending = WeightUpdate(pulled.version, incoming, complete)
            else:  # an update not yet taken: merge, so no changed tensor is skipped
                merged = {**self._pending.tensors, **incoming}
                self._pending = WeightUpdate(pulled.version, merged, self._pending.complete)
        self.known = pulled.version

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
                        self._apply(pull_weights(self.stub, ann.version, self.known if self.delta else None))
                    if self._stop.is_set():
                        break
            except Exception as exc:  # noqa: BLE001 - a dead watcher would serve stale weights forever
                if self._stop.is_set():
                    break
                reason = exc.code() if isinstance(exc, grpc.RpcError) else repr(exc)
                log.warning("weight watch interrupted (%s); retrying in %.1fs", reason, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
