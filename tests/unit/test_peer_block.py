"""The inference server's view of an actor's shared block: one held fd per block name, checked
with fstat on every access (removed -> block_gone, truncated -> block_truncated)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rlfleet.wire.codec import WireFormatError
from rlfleet.wire.shm import ArraySpec, PeerBlock, SharedArrays


def _layout(n: int = 4) -> dict[str, ArraySpec]:
    return {"states": ArraySpec((n, 3), "float32"), "values": ArraySpec((n,), "float32")}


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_attaches_of_one_block_share_an_fd_that_the_last_close_releases():
    owner = SharedArrays.create(_layout())
    try:
        owner["states"][:] = np.arange(12, dtype=np.float32).reshape(4, 3)
        a = PeerBlock.attach(owner.name, owner.layout, owner.secret)
        b = PeerBlock.attach(owner.name, owner.layout, owner.secret)
        assert a._fd == b._fd
        np.testing.assert_array_equal(a.read_rows(["states"], 1, 3)["states"], owner["states"][1:3])
        b.write_rows({"values": np.ones(2, np.float32)}, 2, 4)
        np.testing.assert_array_equal(owner["values"], [0, 0, 1, 1])
        fd = a._fd
        a.close()
        assert _is_open(fd)  # b still holds it
        b.read_rows(["states"], 0, 4)
        b.close()
        assert fd not in PeerBlock._holders and owner.name not in PeerBlock._by_name  # closed
        with pytest.raises(WireFormatError) as err:
            b.read_rows(["states"], 0, 1)
        assert err.value.reason == "block_gone"
    finally:
        owner.close()


def test_a_block_its_owner_removed_is_refused_through_the_held_fd():
    owner = SharedArrays.create(_layout())
    old = PeerBlock.attach(owner.name, owner.layout, owner.secret)
    try:
        name, layout, secret = owner.name, owner.layout, owner.secret
        owner.close()  # the owner unlinks it: the held fd no longer names anything
        for access in (lambda: old.read_rows(["states"], 0, 1), lambda: old.write_rows({"values": np.zeros(1)}, 0, 1)):
            with pytest.raises(WireFormatError) as err:
                access()
            assert err.value.reason == "block_gone"
        with pytest.raises(WireFormatError):  # nothing by that name to attach
            PeerBlock.attach(name, layout, secret)
    finally:
        old.close()
    assert all(_is_open(fd) for fd in PeerBlock._holders)  # nothing left behind a closed fd number
