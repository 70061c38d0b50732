"""A killed launcher takes its fleet with it: children spawned by `rlfleet.runs.launcher._spawn` get
SIGTERM when the launcher dies, even by SIGKILL (an orphaned actor would keep a sim and a port busy)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

PARENT = """
import sys
from rlfleet.runs.launcher import _spawn
child = _spawn([], launcher=("-c", "import time; time.sleep(120)"))
print(child.pid, flush=True)
import time; time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too (reaped later by init)
        return f.read().split(") ")[-1][0] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_a_sigkilled_launcher():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()
