"""Opt-in cProfile of a role's hot loop, for bench/overhead.py --profile."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

PROFILE_DIR_VAR = "RLFLEET_PROFILE_DIR"


@contextlib.contextmanager
def profiled(name: str) -> Iterator[None]:
    """cProfile the block into $RLFLEET_PROFILE_DIR/<name>-<pid>.prof when that variable is set
    (bench/overhead.py --profile); otherwise nothing. Times are the calling thread's CPU time."""
    folder = os.environ.get(PROFILE_DIR_VAR)
    if not folder:
        yield
        return
    import cProfile  # only when profiling is asked for

    prof = cProfile.Profile(time.thread_time)  # CPU time: a blocking wait counts as what it costs
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        prof.dump_stats(os.path.join(folder, f"{name}-{os.getpid()}.prof"))
