"""Actor-side learner link: heartbeat, and a bounded queue of segments to push.

Pushes are retried with exponential backoff while the learner is unreachable (a restarted
learner picks up where it left off); a segment keeps its id across retries, so the learner
acknowledges a repeat without counting it twice. Ids start from a random per-process base, so
a restarted actor that reuses its client id (`--id`) never sends ids the learner has already
seen, which it would otherwise acknowledge as repeats and drop.

Each process life accounts for its env steps: taken, accepted by a learner, rejected. It sends
that account (`LifeReport`) once when it ends, so the learner counts what the life lost (its
unfinished segments and send queue). With `RLFLEET_ACTOR_LEDGER_DIR` set (local mode sets it)
the account is also kept in a small file, `DIR/CLIENT.LIFE.ledger`, rewritten as the counts
change: a life killed before it could report is reported by the next life of the same client
id, from that file (which is then renamed `.reported`).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from rlfleet.wire import codec
from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel
from rlfleet.wire.life_ledger import RECORD, ledger_path, mark_reported, read_account, unreported
from rlfleet.wire.segment import Segment

log = logging.getLogger(__name__)


LEDGER_DIR_VAR = "RLFLEET_ACTOR_LEDGER_DIR"


class LifeLedger:
    """One process life's env step account, optionally mirrored in a file that outlives a SIGKILL
    (one 24-byte pwrite per change: the page cache keeps it when the process dies)."""

    def __init__(self, client_id: str, life: int, folder: str | None):
        self.client_id, self.life = client_id, life
        self.taken = self.accepted = self.rejected = 0
        self._lock = threading.Lock()
        self.path = ledger_path(folder, client_id, life) if folder else None
        self._fd = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self._write()

    def add(self, taken: int = 0, accepted: int = 0, rejected: int = 0) -> None:
        with self._lock:
            self.taken += taken
            self.accepted += accepted
            self.rejected += rejected
            self._write()

    def set_taken(self, taken: int) -> None:
        with self._lock:
            self.taken = taken
            self._write()

    def _write(self) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, RECORD.pack(self.taken, self.accepted, self.rejected), 0)

    def report(self, crashed: bool = False) -> learner_pb2.LifeReport:
        with self._lock:
            return learner_pb2.LifeReport(
                life=self.life,
                env_steps=self.taken,
                accepted_env_steps=self.accepted,
                rejected_env_steps=self.rejected,
                crashed=crashed,
            )

    def close(self, reported: bool) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if reported:
                mark_reported(self.path)


def orphaned_lives(folder: str | None, client_id: str, own: Path | None) -> list[tuple[Path, learner_pb2.LifeReport]]:
    """Earlier lives of this client id that never reported (they were killed): their ledgers."""
    if not folder:
        return []
    out = []
    for path in unreported(folder, client_id):
        if path == own:
            continue
        try:
            acct = read_account(path)
        except FileNotFoundError:  # the learner counted it since the listing
            continue
        except ValueError:
            log.warning("unreadable actor ledger %s: skipped", path)
            continue
        report = learner_pb2.LifeReport(
            life=acct.life,
            env_steps=acct.taken,
            accepted_env_steps=acct.accepted,
            rejected_env_steps=acct.rejected,
            crashed=True,
        )
        out.append((path, report))
    return out


class CreditStream:
    """The actor's side of the learner's flow control (rlfleet.learner.pacing): `wait(samples)`
    before each segment returns once the learner could train it within the lag bound. One request
    per segment on one stream; a broken stream is opened again (the learner may have restarted).

    A stream that keeps failing (refused, unreachable) is retried with its status code logged at
    most every `log_every_s`; after `give_up_s` of failures with no reply in between (waiting
    for room does not count) the actor runs unpaced, with a warning, rather than stall.
    """

    def __init__(
        self,
        stub: learner_pb2_grpc.LearnerServiceStub,
        client_id: str,
        give_up_s: float = 60.0,
        log_every_s: float = 10.0,
    ):
        self.stub, self.client_id = stub, client_id
        self.give_up_s, self.log_every_s = give_up_s, log_every_s
        self.enabled = True  # False after a learner that does not know the call, or failing (then nothing is paced)
        self.waited_s = 0.0  # time spent waiting for room
        self.stop = False  # the learner said training is over
        self._requests: queue.Queue[learner_pb2.CreditRequest | None] | None = None
        self._replies: Iterator[learner_pb2.CreditReply] | None = None

    def _open(self) -> Iterator[learner_pb2.CreditReply]:
        requests: queue.Queue[learner_pb2.CreditRequest | None] = queue.Queue()

        def send() -> Iterator[learner_pb2.CreditRequest]:
            while (item := requests.get()) is not None:
                yield item

        self._requests, self._replies = requests, self.stub.Credits(send())
        return self._replies

    def wait(self, samples: int, stopping: Callable[[], bool], version: int = -1) -> None:
        """Block until the learner grants `samples` (or says stop, or `stopping()`); `version`: that
        of the actor's latest actions (-1: none yet)."""
        t0, backoff = time.monotonic(), 0.1
        failing_since: float | None = None  # the first failure since the last reply
        logged_at = -float("inf")
        try:
            while self.enabled and not stopping():
                replies = self._replies or self._open()
                assert self._requests is not None
                self._requests.put(
                    learner_pb2.CreditRequest(client_id=self.client_id, samples=samples, policy_version=version)
                )
                try:
                    for reply in replies:
                        failing_since = None  # the learner answers: waiting for room is pacing
                        if reply.stop:
                            self.stop = True
                            return
                        if reply.granted:
                            return
                        if stopping():
                            return
                    raise grpc.RpcError("credit stream ended")  # the learner closed it: open a new one
                except grpc.RpcError as exc:
                    code = exc.code() if hasattr(exc, "code") else None
                    self.close()
                    if code == grpc.StatusCode.UNIMPLEMENTED:
                        log.warning("the learner has no flow control; this actor runs unpaced")
                        self.enabled = False
                        return
                    now = time.monotonic()
                    failing_since = failing_since if failing_since is not None else now
                    if now - failing_since >= self.give_up_s:
                        log.warning(
                            "no credit for %.0fs: the credit stream keeps failing (%s); this actor runs unpaced",
                            now - failing_since,
                            code,
                        )
                        self.enabled = False
                        return
                    if now - logged_at >= self.log_every_s:
                        log.warning("credit stream failed (%s); retrying", code)
                        logged_at = now
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
        finally:
            self.waited_s += time.monotonic() - t0

    def close(self) -> None:
        if self._requests is not None:
            self._requests.put(None)
        if self._replies is not None and hasattr(self._replies, "cancel"):
            self._replies.cancel()
        self._requests = self._replies = None


class LearnerClient:
    def __init__(
        self,
        address: str,
        client_id: str,
        queue_size: int,
        chunk_bytes: int = 4 * 1024 * 1024,
        heartbeat_s: float = 1.0,
        give_up_s: float = 600.0,
    ):
        self.client_id = client_id
        self.channel = make_channel(address)
        self.stub = learner_pb2_grpc.LearnerServiceStub(self.channel)
        self.chunk_bytes = chunk_bytes
        self.heartbeat_s = heartbeat_s
        self.give_up_s = give_up_s
        self.stop_requested = threading.Event()
        self.failed = threading.Event()
        self.segments_sent = 0
        self.rejected = 0
        self.env_faults: dict[str, int] = {}  # remote simulator faults so far (the actor loop sets it)
        self._next_id = secrets.randbits(31) << 32  # this process's id block (see the module doc)
        self.life = self._next_id >> 32
        folder = os.environ.get(LEDGER_DIR_VAR) or None
        self.ledger = LifeLedger(client_id, self.life, folder)
        self._orphans = orphaned_lives(folder, client_id, self.ledger.path)  # reported by the heartbeat
        self._queue: queue.Queue[tuple[int, bytes, int] | None] = queue.Queue(maxsize=queue_size)
        self.credits = CreditStream(self.stub, client_id)
        self._sender = threading.Thread(target=self._send_loop, name="segment-sender", daemon=True)
        self._heart = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._sender.start()
        self._heart.start()

    @property
    def env_steps(self) -> int:
        return self.ledger.taken

    @env_steps.setter
    def env_steps(self, value: int) -> None:
        """Env steps taken so far by this process (the actor loop sets it after each step)."""
        self.ledger.set_taken(value)

    def await_credit(self, samples: int, stopping: Callable[[], bool], version: int = -1) -> None:
        """learner.flow_control: pace: wait until the learner has room for a segment of `samples`,
        acted from `version` (that of the latest actions; -1: none yet) or newer."""
        self.credits.wait(samples, lambda: stopping() or self.failed.is_set() or self.stop_requested.is_set(), version)
        if self.credits.stop:
            self.stop_requested.set()

    def push(self, segment: Segment) -> None:
        """Queue a segment; blocks while the queue is full (back-pressure from the learner)."""
        payload = codec.encode_map(segment.to_tensors()).SerializeToString()
        self._next_id += 1
        item = (self._next_id, payload, int(segment.env_steps))
        while not self.stop_requested.is_set() and not self.failed.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _chunks(self, segment_id: int, payload: bytes):
        pieces = codec.split_chunks(payload, self.chunk_bytes)
        for i, piece in enumerate(pieces):
            yield learner_pb2.TrajectoryChunk(
                client_id=self.client_id,
                segment_id=segment_id,
                chunk_index=i,
                num_chunks=len(pieces),
                payload=bytes(piece),
            )

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            segment_id, payload, steps = item
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
                    self.ledger.add(accepted=steps)
                elif not ack.stop:
                    self.rejected += 1
                    self.ledger.add(rejected=steps)
                    log.error("learner rejected segment %d: %s", segment_id, ack.error)
                break

    def _heartbeat(self, ended: learner_pb2.LifeReport | None = None, timeout: float = 5.0):
        return self.stub.Heartbeat(
            learner_pb2.HeartbeatRequest(
                client_id=self.client_id,
                env_steps=self.env_steps,
                segments_sent=self.segments_sent,
                life=self.life,
                ended=ended,
                env_faults=self.env_faults if ended is None or ended.life == self.life else {},
            ),
            timeout=timeout,
        )

    def _heartbeat_loop(self) -> None:
        while not self.failed.is_set():
            try:
                while self._orphans:  # a predecessor killed before it could report: report it for it
                    path, report = self._orphans[0]
                    self._heartbeat(report)
                    mark_reported(path)
                    log.info(
                        "reported an earlier life of %s: %d env steps, %d accepted",
                        self.client_id,
                        report.env_steps,
                        report.accepted_env_steps,
                    )
                    self._orphans.pop(0)
                reply = self._heartbeat()
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
        self.credits.close()
        try:  # with `failed` set the sender only drops what is queued: room comes at once
            self._queue.put(None, timeout=2)
        except queue.Full:
            pass
        self._sender.join(timeout=2)
        self._heart.join(timeout=self.heartbeat_s + 6)
        reported = False
        if not self._sender.is_alive():  # the account is final: tell the learner what this life lost
            try:
                self._heartbeat(self.ledger.report(), timeout=5)
                reported = True
            except grpc.RpcError as exc:
                log.info("could not report this process's env steps to the learner: %s", exc.code())
        self.ledger.close(reported)
        self.channel.close()
