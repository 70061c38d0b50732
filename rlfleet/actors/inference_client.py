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
from collections.abc import Callable

import grpc
import zmq

from rlfleet.wire import codec
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
            raise InferenceError(f"the server returned {key!r}, which this actor has no slot for "
                                 "(actor and server were configured for different policies)")
        slots[slot][lo:hi] = value


class InferenceError(RuntimeError):
    """The server rejected a request or could not be reached in time."""


class StopWaiting(Exception):
    """Raised inside a wait when the actor was told to stop (the run is over)."""


def server_info(address: str, timeout: float = 30.0) -> inference_pb2.ServerInfo:
    with make_channel(address) as ch:
        stub = inference_pb2_grpc.InferenceServiceStub(ch)
        return stub.GetInfo(inference_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True)


class _ZmqClientBase:
    def __init__(self, endpoint: str, slots: SharedArrays, timeout_s: float = 60.0,
                 should_stop: Callable[[], bool] = lambda: False):
        self.slots = slots
        self.timeout_ms = int(timeout_s * 1000)
        self.should_stop = should_stop
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, int]] = {}  # stage -> (req_id, lo, hi)
        self._early: dict[int, list] = {}

    def _recv_for(self, req_id: int) -> list:
        if req_id in self._early:
            return self._early.pop(req_id)
        waited = 0
        while True:
            if not self.sock.poll(200):
                waited += 200
                if self.should_stop():
                    raise StopWaiting()
                if waited >= self.timeout_ms:
                    raise InferenceError(f"no answer from the inference server within {self.timeout_ms} ms")
                continue
            frames = self.sock.recv_multipart(copy=False)
            got = struct.unpack("<Q", frames[1].bytes)[0]
            if frames[0].bytes == b"error":
                raise InferenceError("inference server rejected a request: " + frames[2].bytes.decode(errors="replace"))
            if got == req_id:
                return frames
            self._early[got] = frames

    def wait(self, stage: int) -> int:
        req_id, lo, hi = self._pending.pop(stage)
        frames = self._recv_for(req_id)
        return self._finish(frames, lo, hi)

    def close(self) -> None:
        self.sock.close()


class ShmInferenceClient(_ZmqClientBase):
    def __init__(self, endpoint: str, slots: SharedArrays, timeout_s: float = 60.0,
                 should_stop: Callable[[], bool] = lambda: False):
        super().__init__(endpoint, slots, timeout_s, should_stop)
        req = next(self._ids)
        layout = {k: [list(v.shape), v.dtype] for k, v in slots.layout.items()}
        self.sock.send_multipart([b"attach", struct.pack("<Q", req),
                                  json.dumps({"shm_name": slots.name, "layout": layout}).encode()])
        self._recv_for(req)

    def submit(self, stage: int, lo: int, hi: int, deterministic: bool = False) -> None:
        req = next(self._ids)
        self.sock.send_multipart([b"act_shm", struct.pack("<Q", req), struct.pack("<qqq", lo, hi, int(deterministic))])
        self._pending[stage] = (req, lo, hi)

    def _finish(self, frames: list, lo: int, hi: int) -> int:
        return struct.unpack("<q", frames[2].bytes)[0]


class ZmqInferenceClient(_ZmqClientBase):
    def submit(self, stage: int, lo: int, hi: int, deterministic: bool = False) -> None:
        req = next(self._ids)
        obs = codec.encode_frames(_observation(self.slots, lo, hi))
        self.sock.send_multipart([b"act", struct.pack("<Q", req), b"\1" if deterministic else b"\0", *obs], copy=False)
        self._pending[stage] = (req, lo, hi)

    def _finish(self, frames: list, lo: int, hi: int) -> int:
        _store_outputs(self.slots, lo, hi, codec.decode_frames([f.buffer for f in frames[3:]]))
        return struct.unpack("<q", frames[2].bytes)[0]


class GrpcInferenceClient:
    def __init__(self, address: str, slots: SharedArrays, timeout_s: float = 60.0, actor_id: str = ""):
        self.slots = slots
        self.timeout_s = timeout_s
        self.actor_id = actor_id
        self.channel = make_channel(address)
        self._requests: queue.Queue = queue.Queue()
        stub = inference_pb2_grpc.InferenceServiceStub(self.channel)
        self._responses = stub.Act(iter(self._requests.get, None), wait_for_ready=True)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, int]] = {}
        self._early: dict[int, inference_pb2.ActResponse] = {}

    def submit(self, stage: int, lo: int, hi: int, deterministic: bool = False) -> None:
        req = next(self._ids)
        obs = codec.encode_map(_observation(self.slots, lo, hi))
        self._requests.put(inference_pb2.ActRequest(request_id=req, actor_id=self.actor_id, obs=obs,
                                                    deterministic=deterministic))
        self._pending[stage] = (req, lo, hi)

    def wait(self, stage: int) -> int:
        req, lo, hi = self._pending.pop(stage)
        resp = self._early.pop(req, None)
        try:
            while resp is None:
                msg = next(self._responses)
                if msg.request_id == req:
                    resp = msg
                else:
                    self._early[msg.request_id] = msg
        except (grpc.RpcError, StopIteration) as exc:
            raise InferenceError(f"inference stream broke: {exc}") from exc
        if resp.error:
            raise InferenceError("inference server rejected a request: " + resp.error)
        _store_outputs(self.slots, lo, hi, codec.decode_map(resp.outputs))
        return resp.policy_version

    def close(self) -> None:
        self._requests.put(None)
        self.channel.close()


def connect_inference(transport: str, address: str, slots: SharedArrays, actor_id: str = "",
                      should_stop: Callable[[], bool] = lambda: False):
    """Open the client for `transport`; `address` is always the server's gRPC address."""
    if transport == "grpc":
        return GrpcInferenceClient(address, slots, actor_id=actor_id)
    info = server_info(address)
    if transport == "shm":
        return ShmInferenceClient(info.zmq_endpoint, slots, should_stop=should_stop)
    if transport == "zmq":
        return ZmqInferenceClient(info.zmq_endpoint, slots, should_stop=should_stop)
    raise ValueError(f"unknown transport {transport!r} (shm, zmq or grpc)")
