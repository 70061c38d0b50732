"""Env worker subprocess: steps its slice of envs and writes results into shared-memory slots.

The actor tells a worker "step stage s" over a pipe; the worker reads that stage's action
rows from shared memory, steps, writes observations/rewards/episode stats back into the same
rows and answers with a tiny notification. Workers hold one env slice per pipeline stage, so
while stage s waits for inference the worker is already stepping stage s+1.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from rlfleet.envs.registry import build_env_config, make_env
from rlfleet.telemetry.profiling import profiled
from rlfleet.wire.auth import configure
from rlfleet.wire.auth import current as current_auth
from rlfleet.wire.shm import Layout, SharedArrays, layout_from_json, layout_to_json
from rlfleet.wire.slots import obs_keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvSlice:
    stage: int
    lo: int  # first row in the actor's slots
    hi: int
    global_offset: int  # index of the first env across the whole fleet (tasks, seeds)


def stage_slices(num_envs: int, num_stages: int, num_workers: int, actor_offset: int) -> list[list[EnvSlice]]:
    """Rows of stage s are [s*E/S, (s+1)*E/S), split evenly over the workers."""
    if num_envs % (num_stages * num_workers):
        raise ValueError(
            f"num_envs ({num_envs}) must be divisible by pipeline_stage_num x num_workers "
            f"({num_stages} x {num_workers})"
        )
    per_stage, per_worker = num_envs // num_stages, num_envs // (num_stages * num_workers)
    out: list[list[EnvSlice]] = [[] for _ in range(num_workers)]
    for s in range(num_stages):
        for w in range(num_workers):
            lo = s * per_stage + w * per_worker
            out[w].append(EnvSlice(s, lo, lo + per_worker, actor_offset + lo))
    return out


class _Lines:
    """Worker pipe messages: short text lines ("step 1", "stepped 1") on the pipe's raw fd.

    One write and (usually) one read per message, without Connection's length header and its
    second read; a read that brings two lines (the actor queues "step s+1" behind "step s")
    keeps the second for the next call. Newlines inside a message (a traceback) travel as \x1e.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn, self._fd, self._buf = conn, conn.fileno(), b""

    def send(self, kind: str, arg: str = "") -> None:
        data = memoryview(f"{kind} {arg.replace(chr(10), chr(30))}\n".encode())
        while data:
            data = data[os.write(self._fd, data) :]

    def recv(self) -> tuple[str, str]:
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line, self._buf = self._buf[:end], self._buf[end + 1 :]
                kind, _, arg = line.decode().partition(" ")
                return kind, arg.replace(chr(30), chr(10))
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                raise EOFError
            self._buf += chunk


def _send(conn: _Lines, kind: str, arg: str = "") -> None:
    conn.send(kind, arg)


def _recv(conn: _Lines) -> tuple[str, str]:
    return conn.recv()


def _write_obs(slots: SharedArrays, rows: slice, obs: dict, keys: list[str], prefix: str = "") -> None:
    for key in keys:
        slots[prefix + key][rows] = obs[key]


def _write_step(slots: SharedArrays, sl: EnvSlice, res, keys: list[str]) -> None:
    rows = slice(sl.lo, sl.hi)
    _write_obs(slots, rows, res.obs, keys)
    # final observations only where an episode ended: the only rows anyone reads (the segment
    # builder), and a frame-sized copy per env and step spared everywhere else
    ended = np.flatnonzero(res.episode_done)
    if len(ended):
        for key in keys:
            slots["final_" + key][sl.lo + ended] = res.final_obs[key][ended]
    slots["rewards"][rows] = res.rewards
    slots["terminated"][rows] = res.terminated
    slots["truncated"][rows] = res.truncated
    slots["success"][rows] = res.success
    slots["episode_done"][rows] = res.episode_done
    slots["episode_return"][rows] = res.episode_return
    slots["episode_length"][rows] = res.episode_length
    slots["episode_success_once"][rows] = res.episode_success_once
    slots["substeps"][rows] = res.substeps


def _reset_slice(env, sl: EnvSlice, slots: SharedArrays, keys: list[str], seeds: np.ndarray | None) -> None:
    """Reset a slice's envs (``seeds``: one per actor row, or None) into its rows of the slots."""
    obs = env.reset(None if seeds is None else seeds[sl.lo : sl.hi])
    _write_obs(slots, slice(sl.lo, sl.hi), obs, keys)
    slots["task_ids"][sl.lo : sl.hi] = obs["task_ids"]


def _step_slice(env, sl: EnvSlice, slots: SharedArrays, keys: list[str], reset_seeds: np.ndarray | None) -> None:
    """Step a slice's envs with the actions in its rows; with ``reset_seeds`` (GRPO: the next segment
    starts a new episode everywhere) reset them after, the new first observations replacing the step's."""
    _write_step(slots, sl, env.chunk_step(slots["actions"][sl.lo : sl.hi]), keys)
    if reset_seeds is not None:
        _reset_slice(env, sl, slots, keys, reset_seeds)


def worker_main(
    env_cfg: dict, slices: list[EnvSlice], shm_name: str, layout_json: str, conn: Connection, auth=None
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    configure(auth)  # the actor's token/TLS, for envs that are gRPC clients (env.name=remote://...)
    with profiled("env_worker"):
        _serve(env_cfg, slices, shm_name, layout_json, conn)


def _env_faults(envs) -> dict[str, int]:
    """What remote simulators got wrong so far (`RemoteEnv.faults`), summed over this worker's envs."""
    out: dict[str, int] = {}
    for env in envs:
        for kind, n in (getattr(env, "faults", None) or {}).items():
            out[kind] = out.get(kind, 0) + int(n)
    return out


def _serve(env_cfg: dict, slices: list[EnvSlice], shm_name: str, layout_json: str, pipe: Connection) -> None:
    conn = _Lines(pipe)
    slots = SharedArrays.attach(shm_name, layout_from_json(layout_json), untrack=False)
    envs = {}
    try:
        cfg = build_env_config(env_cfg)
        try:
            envs = {sl.stage: make_env(cfg, sl.hi - sl.lo, env_offset=sl.global_offset) for sl in slices}
        except Exception as exc:  # the cause in one line for the actor's error, the traceback for DEBUG
            _send(conn, "make_error", json.dumps({"cause": _one_line(exc), "traceback": traceback.format_exc()}))
            return
        by_stage = {sl.stage: sl for sl in slices}
        keys = obs_keys(slots.layout)
        told: dict[str, int] = {}
        _send(conn, "ready")
        while True:
            cmd, arg = _recv(conn)
            if cmd in ("step", "step_reset"):
                stage_arg, _, seeds_json = arg.partition(" ")
                stage = int(stage_arg)
                seeds = np.asarray(json.loads(seeds_json)) if cmd == "step_reset" else None
                _step_slice(envs[stage], by_stage[stage], slots, keys, seeds)
                faults = _env_faults(envs.values())
                if faults != told:  # rare: only a change travels, after the stage number
                    told = faults
                    _send(conn, "stepped", f"{stage_arg} {json.dumps(faults)}")
                else:
                    _send(conn, "stepped", stage_arg)
            elif cmd == "reset":
                arg = json.loads(arg)
                for sl in slices:
                    _reset_slice(envs[sl.stage], sl, slots, keys, None if arg is None else np.asarray(arg))
                _send(conn, "reset")
            elif cmd == "close":
                break
            else:
                raise ValueError(f"unknown worker command {cmd!r}")
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass
    except Exception:
        try:
            _send(conn, "error", traceback.format_exc())
        except (BrokenPipeError, OSError):
            pass
    finally:
        for env in envs.values():
            env.close()
        slots.close()


def _one_line(exc: BaseException) -> str:
    """An exception as one line: rlfleet's own errors are already one (ValueError), others get their type."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, ValueError) and text else f"{type(exc).__name__}: {text}"


class WorkerCrashed(RuntimeError):
    pass


class EnvMakeError(ValueError):
    """An env worker could not make its envs (a missing package, a bad env config): one line,
    the worker's traceback logged at DEBUG."""


class EnvWorkerPool:
    """E envs in W worker processes, pipelined in S stages, results in one shared block.

    With W = 0 the actor process steps the envs itself, a stage at a time when the actor waits
    for it: no worker processes, pipes or wake-ups, which for a simulator cheaper than a pipe round
    trip (tens of microseconds) costs less than the pipelining saves; a stage's step then no longer
    overlaps the inference of the other stages."""

    def __init__(
        self, env_cfg: dict, num_envs: int, num_workers: int, num_stages: int, layout: Layout, env_offset: int = 0
    ):
        if num_workers < 0:
            raise ValueError(f"actor.num_workers must be >= 0 (0: the actor steps its envs itself), got {num_workers}")
        self.num_envs, self.num_stages = num_envs, num_stages
        self.env_name = str(env_cfg.get("name", ""))
        self.stage_rows = [(s * num_envs // num_stages, (s + 1) * num_envs // num_stages) for s in range(num_stages)]
        self.layout = layout
        self.slots = SharedArrays.create(self.layout)
        ctx = mp.get_context("spawn")  # never fork a process that may hold gRPC threads
        self.conns: list[_Lines] = []
        self.procs: list[mp.Process] = []
        self._faults: dict[int, dict[str, int]] = {}  # per worker: its remote envs' faults so far
        self._inline: dict[int, tuple[Any, EnvSlice]] = {}  # num_workers 0: stage -> (envs, rows)
        self._due: dict[int, np.ndarray | None] = {}  # inline stages told to step, not yet stepped
        if num_workers == 0:
            self._start_inline(env_cfg, env_offset)
            return
        try:
            for slices in stage_slices(num_envs, num_stages, num_workers, env_offset):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=worker_main,
                    daemon=True,
                    args=(env_cfg, slices, self.slots.name, layout_to_json(self.layout), child, current_auth()),
                )
                proc.start()
                child.close()
                self.conns.append(_Lines(parent))
                self.procs.append(proc)
            self._gather("ready")
        except BaseException:
            self.close()
            raise

    def _start_inline(self, env_cfg: dict, env_offset: int) -> None:
        try:
            cfg = build_env_config(env_cfg)
            (slices,) = stage_slices(self.num_envs, self.num_stages, 1, env_offset)  # one "worker": every row
            for sl in slices:
                try:
                    env = make_env(cfg, sl.hi - sl.lo, env_offset=sl.global_offset)
                except Exception as exc:
                    log.debug("in-process envs: %s", traceback.format_exc())
                    raise EnvMakeError(f"cannot make env {self.env_name!r}: {_one_line(exc)}") from None
                self._inline[sl.stage] = (env, sl)
        except BaseException:
            self.close()
            raise
        self._keys = obs_keys(self.layout)

    def _gather(self, expect: str) -> None:
        for i, conn in enumerate(self.conns):
            try:
                kind, payload = _recv(conn)
            except EOFError as exc:
                raise WorkerCrashed(f"env worker {i} died (exit code {self.procs[i].exitcode})") from exc
            if kind == "make_error":
                err = json.loads(payload)
                log.debug("env worker %d traceback:\n%s", i, err["traceback"])
                raise EnvMakeError(f"cannot make env {self.env_name!r}: {err['cause']}")
            if kind == "error":
                raise WorkerCrashed(f"env worker {i} failed:\n{payload}")
            if kind != expect:
                raise WorkerCrashed(f"env worker {i} answered {kind!r}, expected {expect!r}")
            _, _, faults = payload.partition(" ")
            if faults:
                self._faults[i] = json.loads(faults)

    @property
    def env_faults(self) -> dict[str, int]:
        """Remote simulator faults of every worker's envs so far, by kind (empty for local envs)."""
        if self._inline:
            return _env_faults(env for env, _ in self._inline.values())
        out: dict[str, int] = {}
        for faults in self._faults.values():
            for kind, n in faults.items():
                out[kind] = out.get(kind, 0) + n
        return out

    def reset(self, seeds: np.ndarray | None = None) -> None:
        for env, sl in self._inline.values():
            _reset_slice(env, sl, self.slots, self._keys, None if seeds is None else np.asarray(seeds))
        for conn in self.conns:
            _send(conn, "reset", json.dumps(None if seeds is None else np.asarray(seeds).tolist()))
        self._gather("reset")

    def step_async(self, stage: int, reset_seeds: np.ndarray | None = None) -> None:
        """Step a stage; with ``reset_seeds`` (one per actor row) its envs are then reset with them,
        the new episodes' first observations replacing the step's (final_obs keeps the last ones)."""
        if self._inline:  # stepped when the actor waits for it (step_wait)
            self._due[stage] = None if reset_seeds is None else np.asarray(reset_seeds)
            return
        if reset_seeds is None:
            for conn in self.conns:
                _send(conn, "step", str(stage))
            return
        arg = f"{stage} {json.dumps(np.asarray(reset_seeds).tolist())}"
        for conn in self.conns:
            _send(conn, "step_reset", arg)

    def step_wait(self, stage: int) -> None:
        if self._inline:
            env, sl = self._inline[stage]
            _step_slice(env, sl, self.slots, self._keys, self._due.pop(stage))
            return
        self._gather("stepped")

    def close(self) -> None:
        for conn in self.conns:
            try:
                _send(conn, "close")
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=3)
            if proc.is_alive():
                proc.terminate()
        for conn in self.conns:
            conn.conn.close()
        for env, _ in self._inline.values():
            env.close()
        self.conns, self.procs, self._inline = [], [], {}
        self.slots.close()
