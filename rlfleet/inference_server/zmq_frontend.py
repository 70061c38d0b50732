"""ZeroMQ front end: raw tensor frames from remote actors, or shared-memory rows from local ones.

Protocol (DEALER -> ROUTER), every message [kind, request_id(8 bytes little endian), ...]:
- b"attach" + JSON {shm_name, layout, secret}: map the actor's shared-memory block (same host
  only; an `rlfleet_` name, plain dtypes, and the block's own secret, see `rlfleet.wire.shm`);
- b"detach": release this connection's block (clients send it on close; blocks whose owner
  removed them are released too, and at most MAX_ATTACHED are held, least recently used first);
- b"act_shm" + int64[3] (lo, hi, deterministic): read the observation rows lo:hi from the block,
  write the outputs into the same rows (`rlfleet.wire.slots`), answer b"done" + int64 policy version;
  the block is read and written with pread/pwrite, never mapped (`rlfleet.wire.shm.PeerBlock`), so
  a block its owner truncates or removes is an error answer (`block_truncated`, `block_gone`);
- b"act" + flag byte + codec frames: answer b"result" + int64 version + codec frames;
- anything wrong: b"error" + UTF-8 message; the socket keeps serving.
With a token configured (`rlfleet.wire.auth`), each message is prefixed by [b"auth", token];
without it, or with a wrong token, the answer is an error and the request is counted, not served.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time

import numpy as np
import zmq

from rlfleet.inference_server.batcher import DynamicBatcher, InferenceRequest
from rlfleet.wire import codec
from rlfleet.wire.auth import AuthConfig, check_bind_host, check_zmq_token, is_loopback, resolve
from rlfleet.wire.rejections import RejectionCounter
from rlfleet.wire.shm import PeerBlock, check_layout
from rlfleet.wire.slots import BASE_OUTPUTS, obs_keys, output_slot

log = logging.getLogger(__name__)
_I64 = struct.Struct("<q")
MAX_ATTACHED = 1024  # blocks attached at once (one per actor connection, an fd each); the oldest idle one goes first
_SWEEP_S = 5.0  # how often blocks whose owner has removed them are released
_SHM_DIR = "/dev/shm"


def _allow_fds(wanted: int) -> None:
    """Raise this process's soft fd limit towards `wanted` (never above the hard limit)."""
    try:
        import resource  # POSIX only
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # a limit we may not raise: attaches past it are refused one by one
            log.warning("could not raise the fd limit from %d to %d", soft, target)


class _Attached:
    """One attached block and the requests still using it: it is unmapped only when none is."""

    def __init__(self, blk: PeerBlock):
        self.blk = blk
        self.pending = 0
        self.retired = False
        self.last_used = time.monotonic()
        self.fitting: set[tuple] = set()  # answer shapes already checked against the layout


class ZmqFrontend:
    def __init__(
        self, ctx: zmq.Context, host: str, port: int, batcher: DynamicBatcher, validate, auth: AuthConfig | None = None
    ):
        self.ctx = ctx
        self.batcher = batcher
        self.validate = validate
        auth = resolve(auth)
        check_bind_host(host, auth)
        if auth.server_tls and not is_loopback(host):
            # ZeroMQ has no TLS: keep its clear-text traffic (and the token) on this host
            log.warning("TLS is on: the ZeroMQ front end stays on 127.0.0.1; remote actors use transport=grpc")
            host = "127.0.0.1"
        self._token = auth.token
        _allow_fds(MAX_ATTACHED + 1024)  # an fd per attached block, beside sockets and gRPC's
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.MAXMSGSIZE, auth.max_message_bytes)  # larger: the peer is disconnected
        if port:
            self.router.bind(f"tcp://{host}:{port}")
        else:
            port = self.router.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"
        self._outbox_addr = f"inproc://rlfleet-outbox-{id(self)}"
        self.outbox = ctx.socket(zmq.PULL)
        self.outbox.bind(self._outbox_addr)
        # One socket for every other thread's answers, used under a lock: one per thread (as
        # before) left a socket and its eventfd behind for every Act stream ever opened.
        self._pusher = ctx.socket(zmq.PUSH)
        self._pusher.setsockopt(zmq.LINGER, 0)
        self._pusher.connect(self._outbox_addr)
        self._push_lock = threading.Lock()
        self.blocks: dict[bytes, _Attached] = {}  # by connection identity; touched by the pumping thread only
        self.released_blocks = 0  # blocks unmapped after a detach, re-attach, owner gone, or eviction
        self.errors = 0  # every error answer, batch-stage failures (overload, policy) included
        self.rejections = RejectionCounter()  # requests refused here, by reason
        self.auth_rejected = 0
        self._owner: int | None = None  # the thread that pumps: the sockets are its own
        self._poller = zmq.Poller()
        self._poller.register(self.router, zmq.POLLIN)
        self._poller.register(self.outbox, zmq.POLLIN)
        self._next_sweep = time.monotonic() + _SWEEP_S

    def pump(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for messages, then handle every one that has arrived:
        requests go to the batcher, answers queued by other threads leave.

        Called by the serving thread only (it is the batcher's pump), so a shared-memory request
        is received, batched, run and answered on one thread, without a hand-off per request.
        ZeroMQ polls in whole milliseconds: the part of a wait under 1 ms is slept, then what has
        arrived is taken, so a sub-millisecond `max_wait_ms` keeps its meaning without spinning.
        """
        self._owner = threading.get_ident()
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep()
            self._next_sweep = now + _SWEEP_S
        ms = int(timeout * 1000)
        if ms == 0 and timeout > 0:
            time.sleep(timeout)
        for sock, _ in self._poller.poll(ms):
            if sock is self.outbox:
                while True:
                    try:
                        frames = self.outbox.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    if len(frames) > 1:  # a one-frame message only wakes this wait
                        self.router.send_multipart(frames, copy=False)
            else:
                while True:
                    try:
                        frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._handle(frames)

    def wake(self) -> None:
        """Cut the pump's wait short, from another thread (a gRPC request was queued)."""
        if threading.get_ident() != self._owner:
            self._push([b""])

    def close(self) -> None:
        """Release the blocks and sockets; call from the pumping thread once it has stopped."""
        for ident in list(self.blocks):
            self._retire(ident)
        self.router.close()
        self.outbox.close()
        with self._push_lock:
            self._pusher.close()

    def _reply(self, frames: list) -> None:
        """On the pumping thread the answer leaves at once; another thread queues it for the pump."""
        if threading.get_ident() == self._owner:
            self.router.send_multipart(frames, copy=False)
        else:
            self._push(frames)

    def _push(self, frames: list) -> None:
        with self._push_lock:
            self._pusher.send_multipart(frames, copy=False)

    def _error(self, ident, req_id: bytes, msg: str, reason: str = "protocol") -> None:
        self.errors += 1
        self.rejections.count(reason)
        log.warning("rejected an inference request: %s", msg)
        self.router.send_multipart([ident, b"error", req_id, msg.encode()])

    def _handle(self, frames: list) -> None:
        ident = frames[0]
        start, refusal = check_zmq_token([f.bytes for f in frames[1:3]], self._token)
        if refusal:
            self.auth_rejected += 1
            self._error(ident, b"\0" * 8, refusal, reason="auth")
            return
        frames = [ident, *frames[1 + start :]]
        if len(frames) < 3:
            self._error(ident, b"\0" * 8, "message too short: expected [kind, request_id, ...]")
            return
        kind, req_id = frames[1].bytes, frames[2].bytes
        try:
            if kind == b"attach":
                self._attach(ident.bytes, frames[3].bytes if len(frames) > 3 else b"")
                self.router.send_multipart([ident, b"ok", req_id])
            elif kind == b"detach":
                self._retire(ident.bytes)
                self.router.send_multipart([ident, b"ok", req_id])
            elif kind == b"act_shm":
                self._act_shm(ident, req_id, frames[3:])
            elif kind == b"act":
                self._act_frames(ident, req_id, frames[3:])
            else:
                raise codec.WireFormatError(f"unknown message kind {kind[:32]!r}", reason="protocol")
        except (codec.WireFormatError, ValueError, KeyError, OSError) as exc:
            self._error(ident, req_id, str(exc), getattr(exc, "reason", "malformed"))
        except Exception as exc:  # whatever a message does, the pump must keep serving
            log.exception("unexpected error on an inference request")
            self._error(ident, req_id, f"request could not be processed: {type(exc).__name__}: {exc}", "internal")

    def _attach(self, ident: bytes, payload: bytes) -> None:
        try:
            info = json.loads(payload)
            name, raw_layout, secret = info["shm_name"], info["layout"], info.get("secret")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise codec.WireFormatError(
                f"bad attach message: {type(exc).__name__}: {str(exc)[:200]}", reason="bad_attach"
            ) from exc
        if not isinstance(secret, str) or not isinstance(name, str):
            raise codec.WireFormatError(
                "attach needs shm_name and the block's secret (strings)", reason="attach_denied"
            )
        layout = check_layout(raw_layout)
        for key in BASE_OUTPUTS:
            if key not in layout:
                raise codec.WireFormatError(f"shared block layout lacks {key!r}", reason="bad_layout")
        self._retire(ident)  # a re-attach replaces this connection's block (unmapped once unused)
        if len(self.blocks) >= MAX_ATTACHED:
            oldest = min(self.blocks, key=lambda k: self.blocks[k].last_used)
            log.warning("%d shared blocks attached: releasing the least recently used", len(self.blocks))
            self._retire(oldest)
        self.blocks[ident] = _Attached(PeerBlock.attach(name, layout, secret))

    def _retire(self, ident: bytes) -> None:
        entry = self.blocks.pop(ident, None)
        if entry is None:
            return
        entry.retired = True
        if entry.pending == 0:
            self._unmap(entry)

    def _unmap(self, entry: _Attached) -> None:
        entry.blk.close()
        self.released_blocks += 1

    def _done_with(self, entry: _Attached) -> None:
        entry.pending -= 1
        if entry.retired and entry.pending == 0:
            self._unmap(entry)

    def _sweep(self) -> None:
        """Release blocks whose owner removed them: an actor that exited, cleanly or not (its
        resource tracker unlinks the block), never says detach."""
        if not os.path.isdir(_SHM_DIR):
            return
        for ident, entry in list(self.blocks.items()):
            if not os.path.exists(os.path.join(_SHM_DIR, entry.blk.name)):
                self._retire(ident)

    def _act_shm(self, ident, req_id: bytes, rest: list) -> None:
        entry = self.blocks.get(ident.bytes)
        if entry is None:
            raise codec.WireFormatError("act_shm before attach: send an attach message first", reason="protocol")
        blk = entry.blk
        if len(rest) != 1 or len(rest[0].bytes) != 24:
            raise codec.WireFormatError("act_shm needs one 24-byte frame (lo, hi, deterministic)", reason="protocol")
        lo, hi, det = struct.unpack("<qqq", rest[0].bytes)
        n = blk.layout["actions"].shape[0]
        if not 0 <= lo < hi <= n:
            raise codec.WireFormatError(f"rows {lo}:{hi} outside the block's {n} envs", reason="bad_shape")
        obs = self.validate(blk.read_rows(obs_keys(blk.layout), lo, hi))
        entry.last_used = time.monotonic()
        fail_once = self._fail(ident, req_id)
        answered = threading.Event()

        def fail(msg: str) -> None:
            if not answered.is_set():
                answered.set()
                try:
                    fail_once(msg)
                finally:
                    self._done_with(entry)

        def respond(out: dict[str, np.ndarray], version: int) -> None:
            # Runs in the serving thread: any mismatch must become this request's error, never an exception.
            problem = None
            shapes = tuple((key, value.dtype, value.shape) for key, value in out.items())
            for key, value in () if shapes in entry.fitting else out.items():
                slot = output_slot(key)
                if slot not in blk.layout:
                    problem = f"the actor's shared block has no slot {slot!r} for the policy's outputs"
                    break
                want = (hi - lo, *blk.layout[slot].shape[1:])
                if tuple(value.shape) != want or not np.can_cast(value.dtype, blk.layout[slot].dtype, "same_kind"):
                    problem = (
                        f"slot {slot!r} holds {blk.layout[slot].dtype} {list(want)} for these rows, "
                        f"the policy answers {value.dtype} {list(value.shape)}"
                    )
                    break
            if problem is not None:
                self.rejections.count("slot_mismatch")
                fail(problem)
                return
            entry.fitting.add(shapes)  # answers of these keys, dtypes and shapes fit this block
            if answered.is_set():
                return
            answered.set()
            try:  # through the entry's own fd even if re-attached meanwhile (closed once unused)
                try:
                    blk.write_rows({output_slot(key): value for key, value in out.items()}, lo, hi)
                except codec.WireFormatError as exc:  # the owner truncated or removed its block
                    self.rejections.count(exc.reason)
                    fail_once(str(exc))
                    return
                except (ValueError, TypeError, OSError) as exc:
                    self.rejections.count("slot_mismatch")
                    fail_once(f"could not write the policy's answer into the shared block: {exc}")
                    return
                self._reply([ident, b"done", req_id, _I64.pack(version)])
            finally:
                self._done_with(entry)

        entry.pending += 1
        self.batcher.submit(InferenceRequest(obs, bool(det), respond, fail))

    def _act_frames(self, ident, req_id: bytes, rest: list) -> None:
        if not rest or len(rest[0].bytes) != 1:
            raise codec.WireFormatError(
                "act needs a 1-byte deterministic flag frame before the tensors", reason="protocol"
            )
        det = rest[0].bytes == b"\1"
        obs = self.validate(codec.decode_frames([f.buffer for f in rest[1:]]))

        def respond(out: dict[str, np.ndarray], version: int) -> None:
            self._reply([ident, b"result", req_id, _I64.pack(version), *codec.encode_frames(out)])

        self.batcher.submit(InferenceRequest(obs, det, respond, self._fail(ident, req_id)))

    def _fail(self, ident, req_id: bytes):
        def fail(msg: str) -> None:
            self.errors += 1
            self._reply([ident, b"error", req_id, msg.encode()])

        return fail
