"""LearnerService: registration, heartbeats, trajectory ingest and weight streaming over gRPC."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
import numpy as np

from rlfleet.learner.ingest import IngestedSegment, IngestQueue
from rlfleet.learner.pacing import SampleCredits
from rlfleet.learner.weight_publisher import WeightPublisher
from rlfleet.wire import codec
from rlfleet.wire.auth import AuthConfig, identity_of, identity_table, resolve
from rlfleet.wire.gen import learner_pb2, learner_pb2_grpc, tensor_pb2
from rlfleet.wire.grpc_decoding import UndecodableRequest
from rlfleet.wire.grpc_limits import PeerRate, peer_host
from rlfleet.wire.rejections import RejectionCounter
from rlfleet.wire.run_spec import RunSpec
from rlfleet.wire.segment import Segment

log = logging.getLogger(__name__)

MAX_SEGMENT_BYTES = 512 * 1024 * 1024
MIN_WEIGHT_CHUNK_BYTES = 64 * 1024  # a PullWeights asking for smaller chunks gets these
MAX_ADOPTED_CLIENTS = 256  # heartbeat ids never registered here (a learner restart) kept at once
FORGET_CLIENT_S = 600.0  # a client silent this long is dropped from the table
MAX_CLIENTS = 4096
MAX_FAULT_LIVES = 4096  # actor lives whose env fault counts are kept apart (older ones are folded)
MAX_FAULT_KINDS = 32  # per heartbeat; a kind is at most 64 characters
# New client ids one peer host may register: a burst, then a rate. With ids forgotten after
# FORGET_CLIENT_S, one host holds at most 256 + 4 * 600 = 2,656 of the MAX_CLIENTS entries.
REGISTER_BURST = 256
REGISTER_PER_S = 4.0
MAX_CLIENT_ID_BYTES = 128  # a longer id is refused: ids are kept in the client table and the loss ledger
CREDIT_REPLY_S = 1.0  # a credit request with no room yet is answered "not granted" this often
MAX_UNRESERVED_KEPT = 4096  # rejected (client, segment) ids whose reservation was given back, kept at once


def segment_byte_limit(
    obs_spec: dict,
    rollout_len: int,
    num_envs: int,
    chunk_size: int,
    action_dim: int,
    logprob_shape: tuple[int, ...] = (),
    extra_outputs: dict | None = None,
) -> int:
    """The largest push this run's actors can make, with room to spare (4x + 16 MiB), at most
    MAX_SEGMENT_BYTES: the learner refuses anything bigger while it streams in."""
    T, B = max(rollout_len, 1), max(num_envs, 1)
    obs = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in obs_spec.values())
    extras = sum(int(np.prod(shape, dtype=np.int64)) for shape in (extra_outputs or {}).values())
    per_step = 2 * obs + 4 * (chunk_size * action_dim + int(np.prod(logprob_shape, dtype=np.int64)) + extras + 4) + 64
    total = T * B * per_step + B * (obs + 64) + T * 16
    return int(min(4 * total + (16 << 20), MAX_SEGMENT_BYTES))


@dataclass
class ClientInfo:
    client_id: str
    role: str
    index: int
    last_seen: float
    env_steps: int = 0
    told_to_stop: bool = False
    life: int = 0  # the process life it last heartbeated from, and whether that life has ended
    life_ended: bool = False
    registrations: int = 0  # Register calls under this id: a restarted process registers again
    exited: bool = False  # reported its own death (HeartbeatRequest.exit_cause): its index is free
    identity: str = ""  # the token identity that registered it ("" without several identities)


def _abort(context: Any, code: grpc.StatusCode, details: str) -> NoReturn:
    """End the call with a status: grpc's context.abort raises, and NoReturn tells the checker so."""
    context.abort(code, details)
    raise RuntimeError(f"grpc context.abort returned ({code}: {details})")  # it always raises


class LearnerServicer(learner_pb2_grpc.LearnerServiceServicer):
    def __init__(
        self,
        config_yaml: str,
        run_id: str,
        ingest: IngestQueue,
        weights: WeightPublisher,
        chunk_bytes: int = 4 * 1024 * 1024,
        heartbeat_ms: int = 1000,
        check_segment: Callable[[Segment], None] | None = None,
        max_segment_bytes: int = MAX_SEGMENT_BYTES,
        on_life_ended: Callable[..., int] | None = None,
        on_refused_push: Callable[[str, int], None] | None = None,
        auth: AuthConfig | None = None,
        credits: SampleCredits | None = None,
        segment_samples: int = 0,
        run_spec: RunSpec | None = None,
    ):
        self.auth = auth  # None: the process's settings (its token identities share the client table)
        self.config_yaml = config_yaml  # the user's config as composed: never rewritten here
        # what the learner learned at start, sent to every role that registers (None: tests of the service alone)
        self.run_spec = run_spec.to_proto() if run_spec is not None else None
        self.run_id = run_id
        self.ingest = ingest
        self.weights = weights
        self.chunk_bytes = chunk_bytes
        self.heartbeat_ms = heartbeat_ms
        self.check_segment = check_segment or (lambda seg: None)
        self.max_segment_bytes = min(max_segment_bytes, MAX_SEGMENT_BYTES)
        self.other_rejections = RejectionCounter()  # refused calls that are not pushes, by reason
        self.on_life_ended = on_life_ended  # (client_id, life, taken, accepted, rejected, crashed) -> lost
        self.on_refused_push = on_refused_push  # (client_id, segment_id): bounds what a life may report rejected
        self.credits = credits  # flow control (learner.flow_control: pace); None: every credit at once
        # the run's largest segment (segment_len x actor.num_envs): the most one credit request may
        # ask, and what a rejected push that could not be decoded gives back (0: not known, no bound)
        self.segment_samples = segment_samples
        self._unreserved: OrderedDict[tuple[str, int], None] = OrderedDict()  # rejected pushes given back
        self.stop_event = threading.Event()
        self._clients: dict[str, ClientInfo] = {}
        self._adopted: set[str] = set()  # ids first seen in a heartbeat, not a Register
        self._next_index: dict[str, int] = {}
        # remote simulator faults (RemoteEnv.faults): each actor life's latest cumulative counts
        self._faults: OrderedDict[tuple[str, int], dict[str, int]] = OrderedDict()
        self._faults_folded: Counter[str] = Counter()
        # Indexes of clients that reported their death, given to the next new client of the role,
        # so an actor that could not start leaves no hole in the fleet's env seeds and tasks.
        self._free_index: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self.register_rate = PeerRate(REGISTER_BURST, REGISTER_PER_S)

    # ---- membership -------------------------------------------------------------------------
    def _forget_silent(self) -> None:
        """Drop clients silent for FORGET_CLIENT_S, so the table is bounded by who is alive. Hold _lock."""
        cutoff = time.monotonic() - FORGET_CLIENT_S
        for cid in [c for c, info in self._clients.items() if info.last_seen < cutoff]:
            del self._clients[cid]
            self._adopted.discard(cid)

    def _client(self, client_id: str, role: str, adopt: bool = False) -> ClientInfo | None:
        """The client's record (created with the next index of its role); marks it seen. Hold _lock.

        None when the table is full: MAX_CLIENTS in all, or MAX_ADOPTED_CLIENTS for `adopt`.
        """
        info = self._clients.get(client_id)
        if info is None:
            limit_hit = len(self._clients) >= MAX_CLIENTS or (adopt and len(self._adopted) >= MAX_ADOPTED_CLIENTS)
            if limit_hit:
                self._forget_silent()
                if len(self._clients) >= MAX_CLIENTS or (adopt and len(self._adopted) >= MAX_ADOPTED_CLIENTS):
                    return None
            info = self._clients[client_id] = ClientInfo(client_id, role, self._take_index(role), time.monotonic())
            if adopt:
                self._adopted.add(client_id)
        elif not adopt:
            self._adopted.discard(client_id)  # registered now: no longer on the adopted budget
        info.last_seen = time.monotonic()
        return info

    def _check_client_id(self, client_id: str, context: Any) -> None:
        if len(client_id.encode()) > MAX_CLIENT_ID_BYTES:
            self.other_rejections.count("bad_client_id")
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"client_id longer than {MAX_CLIENT_ID_BYTES} bytes")

    def _revive(self, info: ClientInfo) -> None:
        """A client registering again after its reported death: its old index when still free. Hold _lock."""
        if not info.exited:
            return
        free = self._free_index.get(info.role, [])
        if info.index in free:
            free.remove(info.index)
        else:
            info.index = self._take_index(info.role)
        info.exited = False

    def _take_index(self, role: str) -> int:
        """The lowest index a dead client freed, else the next new one. Hold _lock."""
        free = self._free_index.get(role)
        if free:
            free.sort()
            return free.pop(0)
        idx = self._next_index.get(role, 0)
        self._next_index[role] = idx + 1
        return idx

    def _exited(self, client_id: str, cause: str) -> None:
        with self._lock:
            info = self._clients.get(client_id)
            if info is None or info.exited:
                return
            info.exited = True
            self._free_index.setdefault(info.role, []).append(info.index)
        log.warning("%s %s (index %d) died: %s", info.role, client_id, info.index, cause)

    def Register(self, request, context):
        self._check_client_id(request.client_id, context)
        with self._lock:
            known = request.client_id in self._clients
        who, quota = self._identity_quota(context)
        if not known and who:
            with self._lock:
                held = sum(1 for c in self._clients.values() if c.identity == who)
            if held >= quota:
                self.other_rejections.count("identity_clients")
                _abort(
                    context,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"identity {who!r} already has its {quota} of the {MAX_CLIENTS} client entries",
                )
        peer = peer_host(context.peer() if hasattr(context, "peer") else "")
        if not known and not self.register_rate.allow(peer):
            self.other_rejections.count("register_rate")
            _abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many new client ids from {peer}: {REGISTER_BURST} at once, then {REGISTER_PER_S:g} a second",
            )
        with self._lock:
            info = self._client(request.client_id, request.role)
            before = 0
            if info is not None and who and not known:
                info.identity = who
            if info is not None:
                self._revive(info)
                before, info.registrations = info.registrations, info.registrations + 1
        if info is None:
            self.other_rejections.count("too_many_clients")
            _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, f"learner already tracks {MAX_CLIENTS} clients")
        log.info("registered %s %s (index %d) from %s", request.role, request.client_id, info.index, request.host)
        current = self.weights.current()
        return learner_pb2.RegisterReply(
            run_id=self.run_id,
            config_yaml=self.config_yaml,
            client_index=info.index,
            policy_version=current.version if current else -1,
            heartbeat_interval_ms=self.heartbeat_ms,
            registrations=before,
            run_spec=self.run_spec,
        )

    def _identity_quota(self, context: Any) -> tuple[str, int]:
        """The caller's token identity and its share of the client table, where a server has several
        identities ("" otherwise: one identity, the whole table)."""
        table = identity_table(resolve(self.auth))
        if len(table) < 2 or not hasattr(context, "invocation_metadata"):
            return "", MAX_CLIENTS
        return identity_of(context.invocation_metadata(), self.auth), MAX_CLIENTS // len(table)

    def Heartbeat(self, request, context):
        self._check_client_id(request.client_id, context)
        with self._lock:
            # An unknown id registered with a learner that has since restarted: adopt it (a bounded
            # number of such ids; beyond it the heartbeat is answered but not recorded).
            info = self._client(request.client_id, "actor", adopt=request.client_id not in self._clients)
            if info is not None:
                info.env_steps = request.env_steps
                info.told_to_stop = self.stop_event.is_set()
                if request.life and request.life != info.life:
                    info.life, info.life_ended = request.life, False
                if request.env_faults:
                    self._note_faults(request.client_id, request.life, request.env_faults)
        if info is None:
            self.other_rejections.count("unknown_client")
        elif request.HasField("ended"):
            self._life_ended(request.client_id, request.ended)
        if info is not None and request.exit_cause:
            self._exited(request.client_id, request.exit_cause[:500])  # a bounded line in the log
        current = self.weights.current()
        return learner_pb2.HeartbeatReply(
            stop=self.stop_event.is_set(), policy_version=current.version if current else -1
        )

    def _note_faults(self, client_id: str, life: int, faults: Any) -> None:
        """Hold _lock. Counts are cumulative per life: the latest replaces the one before."""
        clean = {str(k)[:64]: max(0, min(int(v), 1 << 53)) for k, v in list(faults.items())[:MAX_FAULT_KINDS]}
        self._faults[(client_id, life)] = clean
        self._faults.move_to_end((client_id, life))
        while len(self._faults) > MAX_FAULT_LIVES:
            _, old = self._faults.popitem(last=False)
            self._faults_folded.update(old)

    def env_faults(self) -> dict[str, int]:
        """Remote simulator faults the actors reported, by kind, over the run's actor lives."""
        with self._lock:
            total = Counter(self._faults_folded)
            for faults in self._faults.values():
                total.update(faults)
        return {k: v for k, v in sorted(total.items()) if v}

    def wait_clients_told(self, timeout: float, within_s: float = 10.0) -> bool:
        """After stop: give live actors a moment to hear it, so none is left waiting on a dead run."""
        return self._wait_live_actors(lambda c: c.told_to_stop, timeout, within_s)

    def _wait_live_actors(self, done: Callable[[ClientInfo], bool], timeout: float, within_s: float) -> bool:
        """Wait until `done` holds for every actor heard from within the last `within_s` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = time.monotonic()
            with self._lock:
                pending = [
                    c
                    for c in self._clients.values()
                    if c.role == "actor" and now - c.last_seen < within_s and not done(c)
                ]
            if not pending:
                return True
            time.sleep(0.05)
        return False

    def _life_ended(self, client_id: str, r: learner_pb2.LifeReport) -> None:
        with self._lock:
            info = self._clients.get(client_id)
            if info is not None and info.life == r.life:
                info.life_ended = True
        if self.on_life_ended is not None:
            try:
                lost = self.on_life_ended(
                    client_id, r.life, r.env_steps, r.accepted_env_steps, r.rejected_env_steps, r.crashed
                )
            except ValueError as exc:  # an account the learners' count rules out: refused, counted
                self.other_rejections.count("bad_life_report")
                log.warning("%s", str(exc)[:300])
                return
            log.info(
                "%s life %x %s: %d env steps taken, %d lost",
                client_id,
                r.life,
                "crashed" if r.crashed else "ended",
                r.env_steps,
                lost,
            )

    def wait_lives_ended(self, timeout: float, within_s: float = 10.0) -> bool:
        """After stop: wait for live actors' final reports, so the summary's loss account is whole."""
        return self._wait_live_actors(lambda c: not c.life or c.life_ended, timeout, within_s)

    def alive_clients(self, role: str, within_s: float = 10.0) -> int:
        now = time.monotonic()
        with self._lock:
            return sum(1 for c in self._clients.values() if c.role == role and now - c.last_seen < within_s)

    # ---- trajectories -----------------------------------------------------------------------
    def PushTrajectory(self, request_iterator, context):
        version = self._version()
        parts: list[bytes] = []
        received = 0
        first = None
        segment: Segment | None = None
        try:
            for chunk in request_iterator:
                if first is None:
                    first = chunk
                    if len(chunk.client_id.encode()) > MAX_CLIENT_ID_BYTES:
                        raise codec.WireFormatError(
                            f"client_id longer than {MAX_CLIENT_ID_BYTES} bytes", reason="bad_client_id"
                        )
                    if chunk.num_chunks == 0:
                        raise codec.WireFormatError("num_chunks must be at least 1", reason="protocol")
                elif (chunk.segment_id, chunk.client_id, chunk.num_chunks) != (
                    first.segment_id,
                    first.client_id,
                    first.num_chunks,
                ):
                    raise codec.WireFormatError(
                        "chunks of one push must share segment_id, client_id and num_chunks", reason="protocol"
                    )
                if chunk.chunk_index != len(parts):
                    raise codec.WireFormatError(
                        f"chunk {chunk.chunk_index} arrived where {len(parts)} was expected", reason="protocol"
                    )
                received += len(chunk.payload)
                if received > self.max_segment_bytes:  # checked per chunk: never buffer more than the limit
                    raise codec.WireFormatError(
                        f"segment larger than {self.max_segment_bytes} bytes", reason="too_large"
                    )
                parts.append(chunk.payload)
            if first is None:
                raise codec.WireFormatError("empty push: no chunks", reason="protocol")
            if len(parts) != first.num_chunks:
                raise codec.WireFormatError(f"got {len(parts)} of {first.num_chunks} chunks", reason="protocol")
            if self.ingest.seen(first.client_id, first.segment_id):
                self.ingest.count_duplicate()
                return learner_pb2.PushAck(
                    segment_id=first.segment_id,
                    accepted=True,
                    duplicate=True,
                    learner_version=version,
                    stop=self.stop_event.is_set(),
                )
            msg = tensor_pb2.TensorMap()
            try:
                msg.ParseFromString(b"".join(parts))
            except Exception as exc:
                raise codec.WireFormatError(f"unreadable segment: {exc}", reason="undecodable") from exc
            segment = Segment.from_tensors(codec.decode_map(msg))
            self.check_segment(segment)
            self._check_versions(segment)
        except codec.WireFormatError as exc:
            return self._reject(first, exc.reason, str(exc), version, segment)
        except (grpc.RpcError, UndecodableRequest):
            raise  # the client went away, or sent bytes that are no message: gRPC answers (and counts) those
        except Exception as exc:  # unexpected: still an answer, or the actor would retry the same bytes forever
            log.exception("could not process a trajectory push")
            error = f"push could not be processed: {type(exc).__name__}: {exc}"
            return self._reject(first, "internal", error, version, segment)
        item = IngestedSegment(first.client_id, first.segment_id, segment)
        while not self.stop_event.is_set() and context.is_active():
            if self.ingest.put(item, timeout=0.5):
                return learner_pb2.PushAck(segment_id=first.segment_id, accepted=True, learner_version=self._version())
        return learner_pb2.PushAck(
            segment_id=first.segment_id,
            accepted=False,
            stop=True,
            error="learner is stopping",
            learner_version=self._version(),
        )

    def Credits(self, request_iterator, context) -> Iterator[learner_pb2.CreditReply]:
        """One actor's credit stream: a reply per request once there is room (rlfleet.learner.pacing),
        "not granted" every CREDIT_REPLY_S meanwhile. Its reservations end with the stream.

        Only a registered (or heartbeat-adopted) client id may ask, for at most the run's largest
        segment a request (INVALID_ARGUMENT beyond it); SampleCredits bounds what one id holds."""
        client_id = None
        try:
            for request in request_iterator:
                if client_id is None:
                    self._check_client_id(request.client_id, context)
                    with self._lock:
                        known = request.client_id in self._clients
                    if not known:
                        self.other_rejections.count("unknown_client")
                        _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "credits for an unregistered client id")
                    client_id = request.client_id
                    if self.credits is not None:  # however the call ends (a cancelled call skips `finally`)
                        context.add_callback(lambda c=client_id: self.credits.release(c))
                samples = max(int(request.samples), 0)
                if self.segment_samples and samples > self.segment_samples:
                    self.other_rejections.count("credit_too_large")
                    _abort(
                        context,
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"credit for {samples} samples; this run's segments have at most {self.segment_samples}",
                    )
                again = False
                while True:
                    if self.stop_event.is_set():
                        yield learner_pb2.CreditReply(stop=True, learner_version=self._version())
                        return
                    granted = self.credits is None or self.credits.grant(
                        client_id, samples, CREDIT_REPLY_S, again, int(request.policy_version)
                    )
                    yield learner_pb2.CreditReply(granted=granted, learner_version=self._version())
                    if granted or not context.is_active():
                        break
                    again = True
        finally:
            if client_id is not None and self.credits is not None:
                self.credits.release(client_id)

    def _reject(
        self, first, reason: str, error: str, version: int, segment: Segment | None = None
    ) -> learner_pb2.PushAck:
        self.ingest.count_rejected(reason)
        if first is not None and reason != "bad_client_id":
            self._unreserve(first.client_id, first.segment_id, segment)
        if first is not None and self.on_refused_push is not None and reason != "bad_client_id":
            self.on_refused_push(first.client_id, first.segment_id)
        log.warning("rejected a trajectory push (%s): %s", reason, error)
        return learner_pb2.PushAck(
            segment_id=first.segment_id if first else 0, accepted=False, error=error, learner_version=version
        )

    def _unreserve(self, client_id: str, segment_id: int, segment: Segment | None) -> None:
        """A rejected segment will not arrive: give back the credit its actor reserved for it (the
        segment's samples, or the run's segment size when it could not be decoded). Once per
        segment id, and never for one already accepted (a re-sent copy)."""
        if self.credits is None or self.ingest.seen(client_id, segment_id):
            return
        key = (client_id, segment_id)
        with self._lock:
            if key in self._unreserved:
                return
            self._unreserved[key] = None
            while len(self._unreserved) > MAX_UNRESERVED_KEPT:
                self._unreserved.popitem(last=False)
        samples = segment.num_steps * segment.num_envs if segment is not None else self.segment_samples
        self.credits.unreserve(client_id, samples)

    def _check_versions(self, segment: Segment) -> None:
        """Samples must come from weights this learner published: a future version would make the
        policy lag negative (the trainer refuses it), a negative one is never published."""
        low, high = int(segment.versions.min()), int(segment.versions.max())
        latest = self._version()
        if low < 0 or (latest >= 0 and high > latest):
            raise codec.WireFormatError(
                f"policy versions {low}..{high} were never published (latest is {latest})",
                reason="unknown_policy_version",
            )

    def rejected_requests(self) -> dict[str, int]:
        """Trajectory pushes refused, by reason (undecodable messages included)."""
        return self.ingest.rejected_by_reason()

    def rejected_calls(self) -> dict[str, int]:
        """Every other refused call (undecodable, unknown client, stream budget), by reason."""
        return self.other_rejections.snapshot()

    # ---- weights ----------------------------------------------------------------------------
    def _version(self) -> int:
        current = self.weights.current()
        return current.version if current else -1

    def WatchWeights(self, request, context) -> Iterator[learner_pb2.WeightAnnouncement]:
        known = request.known_version
        while context.is_active():
            wv = self.weights.wait_newer(known, timeout=0.5)
            if wv is not None:
                known = wv.version
                yield learner_pb2.WeightAnnouncement(version=wv.version, checksum=wv.checksum, size_bytes=len(wv.data))
            if self.weights.finished:
                yield learner_pb2.WeightAnnouncement(version=known, final=True)
                return

    def PullWeights(self, request, context) -> Iterator[learner_pb2.WeightChunk]:
        wv = self.weights.delta_since(request.base_version) if request.delta else self.weights.current()
        if wv is None:
            _abort(context, grpc.StatusCode.UNAVAILABLE, "no weights published yet")
        if request.version >= 0 and request.version > wv.version:
            _abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"version {request.version} does not exist yet (latest {wv.version})",
            )
        # the client may ask for smaller chunks than ours, not for tiny ones (one message per byte)
        size = max(request.max_chunk_bytes, MIN_WEIGHT_CHUNK_BYTES) if request.max_chunk_bytes else self.chunk_bytes
        chunks = codec.split_chunks(wv.data, min(size, self.chunk_bytes))
        for i, piece in enumerate(chunks):
            yield learner_pb2.WeightChunk(
                version=wv.version,
                checksum=wv.checksum,
                total_size=len(wv.data),
                index=i,
                num_chunks=len(chunks),
                data=bytes(piece),
                base_version=wv.base_version,
            )
