"""Actor-side learner link: register, heartbeat, and a bounded queue of segments to push.

Pushes are retried with exponential backoff while the learner is unreachable (a restarted
learner picks up where it left off); a segment keeps its id across retries, so the learner
acknowledges a repeat without counting it twice. Ids start from a random per-process base, so
a restarted actor that reuses its client id (`--id`) never sends ids the learner has already
seen, which it would otherwise acknowledge as repeats and drop.
"""
from __future__ import annotations

import logging
import queue
import secrets
import socket
import threading
import time

import grpc

from rlfleet.wire import codec
from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel
from rlfleet.wire.segment import Segment

log = logging.getLogger(__name__)


def register(address: str, client_id: str, role: str, num_envs: int = 0,
             timeout_s: float = 120.0) -> learner_pb2.RegisterReply:
    """Register with the learner, waiting for it to come up (a learner may start after us)."""
    with make_channel(address) as ch:
        stub = learner_pb2_grpc.LearnerServiceStub(ch)
        return stub.Register(
            learner_pb2.RegisterRequest(client_id=client_id, role=role, host=socket.gethostname(), num_envs=num_envs),
            timeout=timeout_s, wait_for_ready=True,
        )


class LearnerClient:
    def __init__(self, address: str, client_id: str, queue_size: int, chunk_bytes: int = 4 * 1024 * 1024,
                 heartbeat_s: float = 1.0, give_up_s: float = 600.0):
        self.client_id = client_id
        self.channel = make_channel(address)
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)
        self.chunk_bytes = chunk_bytes
        self.heartbeat_s = heartbeat_s
        self.give_up_s = give_up_s
        self.stop_requested = threading.Event()
        self.failed = threading.Event()
        self.env_steps = 0
        self.segments_sent = 0
        self.rejected = 0
        self._next_id = secrets.randbits(31) << 32  # this process's id block (see the module doc)
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=queue_size)
        self._sender = threading.Thread(target=self._send_loop, name="segment-sender", daemon=True)
        self._heart = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._sender.start()
        self._heart.start()

    def push(self, segment: Segment) -> None:
        """Queue a segment; blocks while the queue is full (back-pressure from the learner)."""
        payload = codec.encode_map(segment.to_tensors()).SerializeToString()
        self._next_id += 1
        item = (self._next_id, payload)
        while not self.stop_requested.is_set() and not self.failed.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _chunks(self, segment_id: int, payload: bytes):
        pieces = codec.split_chunks(payload, self.chunk_bytes)
        for i, piece in enumerate(pieces):
            yield learner_pb2.TrajectoryChunk(client_id=self.client_id, segment_id=segment_id, chunk_index=i,
                                              num_chunks=len(pieces), payload=bytes(piece))

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            segment_id, payload = item
            backoff, down_since = 0.1, None
            while not self.failed.is_set():
                try:
                    ack = self.stub.PushTrajectory(self._chunks(segment_id, payload), timeout=120)
                except grpc.RpcError as exc:
                    down_since = down_since or time.monotonic()
                    if time.monotonic() - down_since > self.give_up_s:
                        log.error("learner unreachable for %.0fs; giving up", self.give_up_s)
                        self.failed.set()
                        break
                    log.warning("push failed (%s); retrying in %.1fs", exc.code(), backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                if ack.stop:
                    self.stop_requested.set()
                if ack.accepted:
                    self.segments_sent += 1
                elif not ack.stop:
                    self.rejected += 1
                    log.error("learner rejected segment %d: %s", segment_id, ack.error)
                break

    def _heartbeat_loop(self) -> None:
        while not self.failed.is_set():
            try:
                reply = self.stub.Heartbeat(
                    learner_pb2.HeartbeatRequest(client_id=self.client_id, env_steps=self.env_steps,
                                                 segments_sent=self.segments_sent), timeout=5)
                if reply.stop:
                    self.stop_requested.set()
            except grpc.RpcError:
                pass
            time.sleep(self.heartbeat_s)

    def close(self, drain_s: float = 5.0) -> None:
        """Let queued segments go out (briefly), then stop the threads."""
        deadline = time.monotonic() + drain_s
        while not self._queue.empty() and time.monotonic() < deadline and not self.stop_requested.is_set():
            time.sleep(0.05)
        self.failed.set()  # ends the heartbeat loop
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._sender.join(timeout=2)
        self.channel.close()
