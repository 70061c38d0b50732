"""ZeroMQ front end: raw tensor frames from remote actors, or shared-memory rows from local ones.

Protocol (DEALER -> ROUTER), every message [kind, request_id(8 bytes little endian), ...]:
- b"attach" + JSON {shm_name, layout}: map the actor's shared-memory block (same host only);
- b"act_shm" + int64[3] (lo, hi, deterministic): read the observation rows lo:hi from the block,
  write the outputs into the same rows (`rlfleet.wire.slots`), answer b"done" + int64 policy version;
- b"act" + flag byte + codec frames: answer b"result" + int64 version + codec frames;
- anything wrong: b"error" + UTF-8 message; the socket keeps serving.
With a token configured (`rlfleet.wire.auth`), each message is prefixed by [b"auth", token];
without it, or with a wrong token, the answer is an error and the request is counted, not served.
"""
from __future__ import annotations

import json
import logging
import struct
import threading

import numpy as np
import zmq

from rlfleet.inference_server.batcher import DynamicBatcher, InferenceRequest
from rlfleet.wire import codec
from rlfleet.wire.auth import AuthConfig, check_bind_host, check_zmq_token, is_loopback, resolve
from rlfleet.wire.rejections import RejectionCounter
from rlfleet.wire.shm import SharedArrays, layout_from_json
from rlfleet.wire.slots import BASE_OUTPUTS, obs_keys, output_slot

log = logging.getLogger(__name__)
_I64 = struct.Struct("<q")


class ZmqFrontend:
    def __init__(self, ctx: zmq.Context, host: str, port: int, batcher: DynamicBatcher, validate,
                 auth: AuthConfig | None = None):
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
        self._local = threading.local()
        self._pushers: list[zmq.Socket] = []
        self.blocks: dict[bytes, SharedArrays] = {}
        self.errors = 0  # every error answer, batch-stage failures (overload, policy) included
        self.rejections = RejectionCounter()  # requests refused here, by reason
        self.auth_rejected = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="zmq-frontend", daemon=True)

    def start(self) -> "ZmqFrontend":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Call from the batching thread once it has stopped using `_reply`."""
        self._stop.set()
        self._thread.join(timeout=2)
        for sock in self._pushers:
            sock.close()

    def _reply(self, frames: list) -> None:
        """Called from the batching thread: hand the reply to the socket's own thread."""
        sock = getattr(self._local, "push", None)
        if sock is None:
            sock = self._local.push = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._outbox_addr)
            self._pushers.append(sock)
        sock.send_multipart(frames, copy=False)

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.outbox, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(100):
                if sock is self.outbox:
                    while True:
                        try:
                            self.router.send_multipart(self.outbox.recv_multipart(zmq.NOBLOCK, copy=False), copy=False)
                        except zmq.Again:
                            break
                else:
                    while True:
                        try:
                            frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._handle(frames)
        for blk in self.blocks.values():
            blk.close()
        self.router.close()
        self.outbox.close()

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
        frames = [ident, *frames[1 + start:]]
        if len(frames) < 3:
            self._error(ident, b"\0" * 8, "message too short: expected [kind, request_id, ...]")
            return
        kind, req_id = frames[1].bytes, frames[2].bytes
        try:
            if kind == b"attach":
                self._attach(ident.bytes, frames[3].bytes if len(frames) > 3 else b"")
                self.router.send_multipart([ident, b"ok", req_id])
            elif kind == b"act_shm":
                self._act_shm(ident, req_id, frames[3:])
            elif kind == b"act":
                self._act_frames(ident, req_id, frames[3:])
            else:
                raise codec.WireFormatError(f"unknown message kind {kind[:32]!r}", reason="protocol")
        except (codec.WireFormatError, ValueError, KeyError, OSError) as exc:
            self._error(ident, req_id, str(exc), getattr(exc, "reason", "malformed"))
        except Exception as exc:  # whatever a message does, the socket thread must keep serving
            log.exception("unexpected error on an inference request")
            self._error(ident, req_id, f"request could not be processed: {type(exc).__name__}: {exc}", "internal")

    def _attach(self, ident: bytes, payload: bytes) -> None:
        try:
            info = json.loads(payload)
            name, layout = info["shm_name"], layout_from_json(json.dumps(info["layout"]))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise codec.WireFormatError(f"bad attach message: {exc}", reason="protocol") from exc
        for key in BASE_OUTPUTS:
            if key not in layout:
                raise codec.WireFormatError(f"shared block layout lacks {key!r}", reason="protocol")
        old = self.blocks.pop(ident, None)
        if old is not None:
            old.close()
        self.blocks[ident] = SharedArrays.attach(name, layout)

    def _act_shm(self, ident, req_id: bytes, rest: list) -> None:
        blk = self.blocks.get(ident.bytes)
        if blk is None:
            raise codec.WireFormatError("act_shm before attach: send an attach message first", reason="protocol")
        if len(rest) != 1 or len(rest[0].bytes) != 24:
            raise codec.WireFormatError("act_shm needs one 24-byte frame (lo, hi, deterministic)", reason="protocol")
        lo, hi, det = struct.unpack("<qqq", rest[0].bytes)
        n = blk["actions"].shape[0]
        if not 0 <= lo < hi <= n:
            raise codec.WireFormatError(f"rows {lo}:{hi} outside the block's {n} envs", reason="bad_shape")
        obs = self.validate({k: blk[k][lo:hi] for k in obs_keys(blk.layout)})

        fail = self._fail(ident, req_id)

        def respond(out: dict[str, np.ndarray], version: int) -> None:
            missing = [output_slot(k) for k in out if output_slot(k) not in blk.layout]
            if missing:
                self.rejections.count("slot_mismatch")
                fail(f"the actor's shared block has no slots {missing} for the policy's outputs")
                return
            for key, value in out.items():
                blk[output_slot(key)][lo:hi] = value
            self._reply([ident, b"done", req_id, _I64.pack(version)])

        self.batcher.submit(InferenceRequest(obs, bool(det), respond, fail))

    def _act_frames(self, ident, req_id: bytes, rest: list) -> None:
        if not rest or len(rest[0].bytes) != 1:
            raise codec.WireFormatError("act needs a 1-byte deterministic flag frame before the tensors",
                                        reason="protocol")
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
