"""Actor-side inference clients: one outstanding request per pipeline stage, results in the slots.

- shm:  same host; the server reads/writes the actor's shared-memory rows, ZeroMQ only notifies;
- zmq:  raw tensor frames over ZeroMQ (any host);
- grpc: a long-lived bidirectional Act stream (any host).
All three leave actions/logprobs/values for rows lo:hi in the slots and return the policy version.
"""

from __future__ import annotations

import itertools
import json
import queue
import struct
import threading
import time
from collections.abc import Callable

import grpc
import zmq
from zmq.utils.monitor import recv_monitor_message

from rlfleet.wire import codec
from rlfleet.wire.auth import current as current_auth
from rlfleet.wire.auth import zmq_auth_frames
from rlfleet.wire.gen import inference_pb2, inference_pb2_grpc
from rlfleet.wire.grpc_server import make_channel
from rlfleet.wire.shm import SharedArrays
from rlfleet.wire.slots import obs_keys, output_slot


def _observation(slots: SharedArrays, lo: int, hi: int) -> dict:
    return {k: slots[k][lo:hi] for k in obs_keys(slots.layout)}


def _store_outputs(slots: SharedArrays, lo: int, hi: int, out: dict) -> None:
    for key, value in out.items():
        slot = output_slot(key)
        if slot not in slots.layout:
            raise InferenceError(
                f"the server returned {key!r}, which this actor has no slot for "
                "(actor and server were configured for different policies)"
            )
        slots[slot][lo:hi] = value


class InferenceError(RuntimeError):
    """The server rejected a request or could not be reached in time."""


class InferenceUnavailable(InferenceError):
    """The server went away or missed the deadline: the request may be retried on another server."""


class StopWaiting(Exception):
    """Raised inside a wait when the actor was told to stop (the run is over)."""


def server_info(address: str, timeout: float = 30.0) -> inference_pb2.ServerInfo:
    with make_channel(address) as ch:
        stub = inference_pb2_grpc.InferenceServiceStub(ch)
        return stub.GetInfo(inference_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True)


class _ZmqClientBase:
    def __init__(
        self,
        endpoint: str,
        slots: SharedArrays,
        timeout_s: float = 60.0,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        self.slots = slots
        self.timeout_ms = int(timeout_s * 1000)
        self.should_stop = should_stop
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # a dead server never answers: its TCP disconnect is the signal that requests sent to it are lost
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.sock.connect(endpoint)
        self._poller = zmq.Poller()  # one poller for every wait (Socket.poll builds one per call)
        self._poller.register(self.sock, zmq.POLLIN)
        self._auth = zmq_auth_frames()  # [b"auth", token] before each request when a token is set
        self._max_bytes = current_auth().max_message_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, int]] = {}  # stage -> (req_id, lo, hi)
        self._early: dict[int, list] = {}

    def _send(self, frames: list, copy: bool = True) -> None:
        """Prefix the token; refuse a frame the server would drop silently (ZeroMQ's size limit)."""
        for f in frames:
            if memoryview(f).nbytes > self._max_bytes:
                raise InferenceError(
                    f"a {memoryview(f).nbytes}-byte frame exceeds the {self._max_bytes}-byte message "
                    "limit (RLFLEET_MAX_MESSAGE_BYTES on both ends)"
                )
        self.sock.send_multipart([*self._auth, *frames], copy=copy)

    def _recv_for(self, req_id: int) -> list:
        if req_id in self._early:
            return self._checked(self._early.pop(req_id))
        waited = 0
        while True:
            try:  # the answer is often there already (pipelining): take it without a poll
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                if not self._poller.poll(200):
                    waited += 200
                    if self.should_stop():
                        raise StopWaiting() from None
                    if self._peer_lost():
                        raise InferenceUnavailable("lost the connection to the inference server") from None
                    if waited >= self.timeout_ms:
                        raise InferenceUnavailable(
                            f"no answer from the inference server within {self.timeout_ms} ms"
                        ) from None
                continue
            got = struct.unpack("<Q", frames[1].bytes)[0]
            if got == req_id:
                return self._checked(frames)
            if frames[0].bytes == b"error" and got not in self._outstanding():
                self._checked(frames)  # an error for no request of ours (e.g. refused auth): say so now
            self._early[got] = frames  # another stage's answer, or its error: that stage's wait takes it

    def _outstanding(self) -> set[int]:
        return {rid for rid, _, _ in self._pending.values()}

    @staticmethod
    def _checked(frames: list) -> list:
        if frames[0].bytes == b"error":
            raise InferenceError("inference server rejected a request: " + frames[2].bytes.decode(errors="replace"))
        return frames

    def _peer_lost(self) -> bool:
        lost = False
        while self._monitor.poll(0):
            lost = recv_monitor_message(self._monitor)["event"] == zmq.EVENT_DISCONNECTED or lost
        return lost

    def wait(self, stage: int) -> int:
        req_id, lo, hi = self._pending.pop(stage)
        frames = self._recv_for(req_id)
        return self._finish(frames, lo, hi)

    def close(self) -> None:
        self.sock.disable_monitor()
        self._monitor.close()
        self.sock.close()


class ShmInferenceClient(_ZmqClientBase):
    def __init__(
        self,
        endpoint: str,
        slots: SharedArrays,
        timeout_s: float = 60.0,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        super().__init__(endpoint, slots, timeout_s, should_stop)
        req = next(self._ids)
        layout = {k: [list(v.shape), v.dtype] for k, v in slots.layout.items()}
        # the block's secret proves to the server that this client may have the block written
        self._send(
            [
                b"attach",
                struct.pack("<Q", req),
                json.dumps({"shm_name": slots.name, "layout": layout, "secret": slots.secret}).encode(),
            ]
        )
        self._recv_for(req)

    def close(self) -> None:
        try:  # the server unmaps the block now rather than when it notices the block is gone
            self._send([b"detach", struct.pack("<Q", next(self._ids))])
        except zmq.ZMQError:
            pass
        super().close()

    def submit(self, stage: int, lo: int, hi: int, deterministic: bool = False) -> None:
        req = next(self._ids)
        # three small fixed-size frames: nothing for `_send`'s size check to refuse
        self.sock.send_multipart(
            [*self._auth, b"act_shm", struct.pack("<Q", req), struct.pack("<qqq", lo, hi, int(deterministic))]
        )
        self._pending[stage] = (req, lo, hi)

    def _finish(self, frames: list, lo: int, hi: int) -> int:
        return struct.unpack("<q", frames[2].bytes)[0]


class ZmqInferenceClient(_ZmqClientBase):
    def submit(self, stage: int, lo: int, hi: int, deterministic: bool = False) -> None:
        req = next(self._ids)
        obs = codec.encode_frames(_observation(self.slots, lo, hi))
        self._send([b"act", struct.pack("<Q", req), b"\1" if deterministic else b"\0", *obs], copy=False)
        self._pending[stage] = (req, lo, hi)

    def _finish(self, frames: list, lo: int, hi: int) -> int:
        _store_outputs(self.slots, lo, hi, codec.decode_frames([f.buffer for f in frames[3:]]))
        return struct.unpack("<q", frames[2].bytes)[0]


class GrpcInferenceClient:
    def __init__(
        self,
        address: str,
        slots: SharedArrays,
        timeout_s: float = 60.0,
        actor_id: str = "",
        should_stop: Callable[[], bool] = lambda: False,
    ):
        self.slots = slots
        self.timeout_s = timeout_s
        self.actor_id = actor_id
        self.should_stop = should_stop
        self.channel = make_channel(address)
        self._requests: queue.Queue = queue.Queue()
        stub = inference_pb2_grpc.InferenceServiceStub(self.channel)
        self._responses = stub.Act(iter(self._requests.get, None), wait_for_ready=True)
        # a reader thread, so that a wait can give up at a deadline instead of blocking in next()
        self._inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, name="act-responses", daemon=True).start()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, int]] = {}
        self._early: dict[int, inference_pb2.ActResponse] = {}

    def _read(self) -> None:
        try:
            for msg in self._responses:
                self._inbox.put(msg)
            self._inbox.put(InferenceUnavailable("the inference server ended the stream"))
        except grpc.RpcError as exc:
            self._inbox.put(InferenceUnavailable(f"inference stream broke: {exc.code()} {exc.details()}"))

    def _next_response(self, deadline: float) -> inference_pb2.ActResponse:
        while True:
            try:
                item = self._inbox.get(timeout=0.2)
            except queue.Empty:
                if self.should_stop():
                    raise StopWaiting() from None
                if time.monotonic() > deadline:
                    raise InferenceUnavailable(
                        f"no answer from the inference server within {self.timeout_s:.0f} s"
                    ) from None
                continue
            if isinstance(item, Exception):
                self._inbox.put(item)  # every later wait on this dead stream fails the same way
                raise item
            return item

    def submit(self, stage: int, lo: int, hi: int, deterministic: bool = False) -> None:
        req = next(self._ids)
        obs = codec.encode_map(_observation(self.slots, lo, hi))
        self._requests.put(
            inference_pb2.ActRequest(request_id=req, actor_id=self.actor_id, obs=obs, deterministic=deterministic)
        )
        self._pending[stage] = (req, lo, hi)

    def wait(self, stage: int) -> int:
        req, lo, hi = self._pending.pop(stage)
        resp = self._early.pop(req, None)
        deadline = time.monotonic() + self.timeout_s
        while resp is None:
            msg = self._next_response(deadline)
            if msg.request_id == req:
                resp = msg
            else:
                self._early[msg.request_id] = msg
        if resp.error:
            raise InferenceError("inference server rejected a request: " + resp.error)
        _store_outputs(self.slots, lo, hi, codec.decode_map(resp.outputs))
        return resp.policy_version

    def close(self) -> None:
        self._requests.put(None)
        self.channel.close()


def reachable_endpoint(endpoint: str, address: str) -> str:
    """A server bound to a wildcard host advertises it as such: reach it via the host used for gRPC."""
    scheme, _, host_port = endpoint.partition("://")
    host, _, port = host_port.rpartition(":")
    if host not in ("0.0.0.0", "*", "::", "[::]"):
        return endpoint
    return f"{scheme}://{address.rpartition(':')[0]}:{port}"


def connect_inference(
    transport: str,
    address: str,
    slots: SharedArrays,
    actor_id: str = "",
    should_stop: Callable[[], bool] = lambda: False,
    timeout_s: float = 60.0,
):
    """Open the client for `transport`; `address` is always the server's gRPC address.

    `timeout_s` bounds each wait for an answer (InferenceUnavailable past it).
    """
    if transport == "grpc":
        return GrpcInferenceClient(address, slots, timeout_s, actor_id=actor_id, should_stop=should_stop)
    info = server_info(address, timeout=min(30.0, timeout_s))
    endpoint = reachable_endpoint(info.zmq_endpoint, address)
    if transport == "shm":
        return ShmInferenceClient(endpoint, slots, timeout_s, should_stop=should_stop)
    if transport == "zmq":
        return ZmqInferenceClient(endpoint, slots, timeout_s, should_stop=should_stop)
    raise ValueError(f"unknown transport {transport!r} (shm, zmq or grpc)")
