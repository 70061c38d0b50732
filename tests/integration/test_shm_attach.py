"""The inference server's shared-memory attach path against hostile or careless clients.

Each test sends what a client may send over ZeroMQ (a layout that does not fit the policy,
an object dtype, a re-attach racing an answer, endless attaches, someone else's block) and
checks the server answers with an error, counts it, and keeps serving.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from multiprocessing import shared_memory

import numpy as np
import pytest
import torch
import zmq

from rlfleet.actors.inference_client import connect_inference
from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.inference_server.server import InferenceServer
from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire.shm import ArraySpec, SharedArrays
from rlfleet.wire.slots import slot_layout

S, D, K = 7, 3, 2


def layout(n: int, **override):
    out = slot_layout(n, {"states": ((S,), "float32")}, D, K)
    out.update(override)
    return out


@pytest.fixture
def server():
    torch.manual_seed(0)
    policy = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[16]))
    srv = InferenceServer(PolicyRunner(policy, version=5), "127.0.0.1", 0, 0, max_batch=64, max_wait_ms=2)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(10)
    assert not thread.is_alive()


class Raw:
    """A bare DEALER speaking the attach protocol, to send what a real client never would."""

    def __init__(self, srv):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(srv.zmq.endpoint)
        self.rid = 0

    def send(self, kind: bytes, *frames: bytes) -> bytes:
        self.rid += 1
        rid = struct.pack("<Q", self.rid)
        self.sock.send_multipart([kind, rid, *frames])
        return rid

    def recv(self) -> list[bytes]:
        assert self.sock.poll(30_000), "no answer"
        return self.sock.recv_multipart()

    def attach(self, blk: SharedArrays, lay=None, secret: str | None = None, name: str | None = None) -> list[bytes]:
        lay = blk.layout if lay is None else lay
        msg = {
            "shm_name": name or blk.name,
            "layout": {k: [list(v.shape), v.dtype] for k, v in lay.items()},
            "secret": blk.secret if secret is None else secret,
        }
        self.send(b"attach", json.dumps(msg).encode())
        return self.recv()

    def act_shm(self, lo: int, hi: int) -> bytes:
        return self.send(b"act_shm", struct.pack("<qqq", lo, hi, 1))

    def close(self):
        self.sock.close()


def _still_serves(srv):
    blk = SharedArrays.create(layout(4))
    blk["states"][:] = 1.0
    try:
        client = connect_inference("shm", srv.address, blk)
        client.submit(0, 0, 4, deterministic=True)
        assert client.wait(0) == 5
        client.close()
        assert not np.allclose(blk["values"], 0)
    finally:
        blk.close()


def test_an_output_slot_of_the_wrong_shape_gets_an_error_not_a_dead_server(server):
    blk = SharedArrays.create(layout(4, actions=ArraySpec((4, K + 1, D), "float32")))
    raw = Raw(server)
    try:
        assert raw.attach(blk)[0] == b"ok"
        rid = raw.act_shm(0, 4)
        reply = raw.recv()
        assert reply[0] == b"error" and reply[1] == rid and b"actions" in reply[2], reply
        assert server.rejected_requests().get("slot_mismatch") == 1
        assert np.all(blk["actions"] == 0)  # nothing written
    finally:
        raw.close()
        blk.close()
    _still_serves(server)


@pytest.mark.parametrize("dtype", ["O", "object", "U8", "V16", "complex64", ">f4", "datetime64[s]"])
def test_a_layout_with_a_non_plain_dtype_is_refused(server, dtype):
    blk = SharedArrays.create(layout(4))
    raw = Raw(server)
    try:
        reply = raw.attach(blk, layout(4, values=ArraySpec((4,), dtype)))
        assert reply[0] == b"error" and b"dtype" in reply[2], reply
        assert server.rejected_requests() == {"bad_dtype": 1}
        assert not server.zmq.blocks
    finally:
        raw.close()
        blk.close()
    _still_serves(server)


def test_act_shm_then_reattach_keeps_the_server_up(server):
    blocks = [SharedArrays.create(layout(8)) for _ in range(6)]
    raw = Raw(server)
    try:
        for blk in blocks:  # each answer races the next attach, which replaces the block it writes
            blk["states"][:] = 1.0
            raw.send(
                b"attach",
                json.dumps(
                    {
                        "shm_name": blk.name,
                        "secret": blk.secret,
                        "layout": {k: [list(v.shape), v.dtype] for k, v in blk.layout.items()},
                    }
                ).encode(),
            )
            raw.act_shm(0, 8)
        kinds = sorted(raw.recv()[0] for _ in range(len(blocks) * 2))
        assert kinds.count(b"done") == len(blocks) and kinds.count(b"ok") == len(blocks), kinds
        rid = raw.act_shm(0, 8)
        reply = raw.recv()
        assert reply[:2] == [b"done", rid]
        assert all(not np.allclose(b["values"], 0) for b in blocks)  # every answer landed in its own block
    finally:
        raw.close()
        for blk in blocks:
            blk.close()
    assert len(server.zmq.blocks) == 1 and server.zmq.released_blocks >= len(blocks) - 1
    _still_serves(server)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_attach_cycles_do_not_leak_fds_and_released_blocks_are_unmapped(server):
    blk = SharedArrays.create(layout(4))
    before = _fds()
    try:
        for i in range(400):  # connect, attach, vanish without a word
            raw = Raw(server)
            assert raw.attach(blk)[0] == b"ok", i
            raw.close()
        deadline = time.monotonic() + 30  # closed TCP connections are reaped by ZeroMQ's I/O thread, soon
        while _fds() - before >= 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        grown = _fds() - before
        assert grown < 20, grown  # was one or two fds per attach, held for good
        assert len(server.zmq.blocks) == 400
    finally:
        blk.close()  # the owner removes its block: the server notices and unmaps every attach of it
    deadline = time.monotonic() + 60
    while server.zmq.blocks and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not server.zmq.blocks and server.zmq.released_blocks >= 400
    _still_serves(server)


def test_a_refused_attach_never_unlinks_the_block(server):
    blk = SharedArrays.create(layout(2))
    raw = Raw(server)
    try:
        reply = raw.attach(blk, layout(4096))  # more than the block holds
        assert reply[0] == b"error", reply
        again = shared_memory.SharedMemory(name=blk.name)  # still there
        again.close()
    finally:
        raw.close()
        blk.close()


def test_attach_is_limited_to_blocks_the_client_created_for_the_server(server):
    victim = shared_memory.SharedMemory(name=f"victim_{os.getpid()}", create=True, size=1 << 16)
    victim.buf[:4] = b"keep"
    other = SharedArrays.create(layout(4))
    other["values"][:] = 42.0
    raw = Raw(server)
    try:
        cases = {
            "foreign name": raw.attach(other, name=victim.name),
            "path": raw.attach(other, name="../" + other.name),
            "no secret": raw.attach(other, secret=""),
            "wrong secret": raw.attach(other, secret="00" * 16),
            "not hex": raw.attach(other, secret="zz"),
        }
        for what, reply in cases.items():
            assert reply[0] == b"error", (what, reply)
        assert server.rejected_requests() == {"attach_denied": len(cases)}
        rid = raw.act_shm(0, 4)  # nothing was attached
        assert raw.recv()[:2] == [b"error", rid]
        assert bytes(victim.buf[:4]) == b"keep" and np.all(other["values"] == 42.0)
    finally:
        raw.close()
        victim.close()
        victim.unlink()
        other.close()
    _still_serves(server)


@pytest.mark.parametrize("payload", [b"\xff\xfe", b"[]", b'{"shm_name": "rlfleet_x"}', b'"text"', b"{}", b"null"])
def test_malformed_attaches_get_a_clean_counted_error(server, payload):
    raw = Raw(server)
    try:
        raw.send(b"attach", payload)
        reply = raw.recv()
    finally:
        raw.close()
    assert reply[0] == b"error"
    counted = server.rejected_requests()
    assert sum(counted.values()) == 1 and "internal" not in counted and "malformed" not in counted, counted


def _truncate(blk: SharedArrays, size: int) -> None:
    import _posixshmem

    fd = _posixshmem.shm_open("/" + blk.name, os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [0, 64, "half"])
def test_a_block_its_owner_truncates_gets_an_error_not_sigbus(server, size):
    """Was: the server mapped the block, and the next act_shm after ftruncate(64 or 0) killed it
    with SIGBUS. Now the block is read by pread: a counted `block_truncated` error."""
    n = 512  # spans many pages: a mapping faults only on a page wholly past the end of the file
    blk = SharedArrays.create(layout(n))
    blk["states"][:] = 1.0
    raw = Raw(server)
    try:
        assert raw.attach(blk)[0] == b"ok"
        rid = raw.act_shm(0, n)
        assert raw.recv()[:2] == [b"done", rid]
        full = blk.shm.size
        # our own mapping is not touched again: a truncated mapping faults in this process too
        _truncate(blk, full // 2 if size == "half" else size)
        for lo, hi in [(0, n), (n - 2, n), (0, 1)]:
            rid = raw.act_shm(lo, hi)
            reply = raw.recv()
            assert reply[0] == b"error" and reply[1] == rid and b"truncated" in reply[2], reply
        assert server.rejected_requests() == {"block_truncated": 3}
        _truncate(blk, full)  # restored by its owner: served again (with the rows it now holds)
        rid = raw.act_shm(0, n)
        assert raw.recv()[:2] == [b"done", rid]
    finally:
        raw.close()
        blk.close()
    _still_serves(server)


def test_a_block_its_owner_removes_gets_an_error(server):
    blk = SharedArrays.create(layout(4))
    raw = Raw(server)
    try:
        assert raw.attach(blk)[0] == b"ok"
        blk.close()  # unlinks it; the server has not swept it yet
        rid = raw.act_shm(0, 4)
        reply = raw.recv()
        assert reply[0] == b"error" and reply[1] == rid, reply
        assert server.rejected_requests() == {"block_gone": 1}
    finally:
        raw.close()
    _still_serves(server)
