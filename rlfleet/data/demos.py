"""Scripted-expert demonstrations: collect them in parallel, write them to disk, load them back.

MetaWorld ships a hand-written expert for every task (`metaworld.policies.ENV_POLICY_MAP`). Rolling
them out gives cheap, near-perfect demonstrations to pre-train a policy by behaviour cloning
(`rlfleet.data.sft`) before RL fine-tuning, so RL starts from a policy that already succeeds sometimes.

On-disk format ``rlfleet-demos/1`` (also in docs/datasets.md)
-------------------------------------------------------------
A dataset is a folder::

    DATASET/
      index.json
      episodes/ep_000000.npz, ep_000001.npz, ...

``index.json``::

    {"format": "rlfleet-demos/1",
     "env": {...EnvConfig fields...},       # task = the comma-joined task list, chunk_size 1
     "created": "2025-01-01T12:00:00+00:00",  # ISO 8601, UTC
     "collect": {...},                        # the collect_demos arguments (episodes_per_task, seed, ...)
     "episodes": [{"id": 0, "file": "episodes/ep_000000.npz", "task": "reach-v3",
                   "instruction": "reach the goal position", "seed": 1000017, "attempt": 0,
                   "length": 52, "success": true, "success_step": 41}, ...],
     "summary": {"reach-v3": {"episodes": 10, "success": 10, "attempts": 11, "failed": 1}, ...}}

Episode ids number the kept episodes 0..N-1, ordered by task (in the order given) then attempt.
``success_step`` is the index t of the first step whose action led to success (``success[t]`` is
the first True), -1 if the episode never succeeded. In ``summary``, ``episodes`` counts the episodes
in the dataset, ``success`` the successful ones among them, ``attempts`` the expert rollouts run
and ``failed`` how many of those failed (kept or not).

Each ``episodes/ep_XXXXXX.npz`` is written with ``np.savez`` (no pickled objects; load it with
``allow_pickle=False``) and holds, for an episode of L steps:

=============== =============== ===============================================================
key             shape / dtype   meaning
=============== =============== ===============================================================
main_images     [L,H,W,3] uint8 camera frame each action was chosen from (absent if image_size 0)
states          [L,39] float32  raw MetaWorld observation each action was chosen from
actions         [L,4] float32   expert action, clipped to [-1, 1] (what the env executed)
rewards         [L] float32     reward after each step
success         [L] bool        MetaWorld's info["success"] after each step
instruction     [128] uint8     the task description, `rlfleet.envs.api.encode_instructions`
=============== =============== ===============================================================

An episode stops ``stop_after_success`` steps after its first success (so a policy also sees
"hold still" frames at the goal) or at ``max_episode_steps``, whichever comes first.

Seeds (why episodes are reproducible and never overlap evaluation)
------------------------------------------------------------------
Attempt a (0, 1, 2, ...) of task T gets the env seed::

    1_000_000 * (1 + seed) + 10_000 * slot(T) + a

where slot(T) is T's position in the alphabetically sorted list of all 50 MetaWorld v3 tasks.
`rlfleet eval` uses seeds 10_000 + i (i < number of eval episodes), always below 1_000_000, and
training draws its episode seeds through `np.random.SeedSequence`, so demos never replay an
eval episode. The seed depends on the task name, not its position in `tasks`, so the same task
gives the same episodes whatever else is collected with it. At most 10_000 attempts per task
(episodes_per_task <= 3333).

Failed expert rollouts: a task gets up to 3 * episodes_per_task attempts to reach
episodes_per_task successes. Attempt a+1.. are started only when earlier ones fail, so the
attempts run are always the shortest prefix holding enough successes and the dataset is the
same whatever the number of workers. Failed episodes are left out unless keep_failed=True
(then they are written with ``success: false``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import time
import warnings
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.envs.api import EnvConfig, encode_instructions

FORMAT = "rlfleet-demos/1"
DEMO_SEED_BASE = 1_000_000  # first demo seed; eval seeds (10_000 + i) stay below it
TASK_SEED_STRIDE = 10_000  # seeds reserved per task (max attempts per task)
ATTEMPTS_PER_EPISODE = 3  # attempt budget: episodes_per_task * 3 expert rollouts per task
_ENV_CACHE = 4  # MetaWorld envs (with renderers) a worker keeps alive across tasks


@dataclass
class DemoEpisode:
    """One demonstration episode of L steps: the arrays of its .npz file plus its index entry."""

    id: int
    task: str
    instruction_text: str  # the task description in plain text
    seed: int  # env seed: `MetaWorldEnv.reset(np.array([seed]))` replays the episode's initial state
    success: bool  # the expert succeeded at some step
    success_step: int  # first step t with step_success[t], -1 if none
    states: np.ndarray  # [L, 39] float32
    actions: np.ndarray  # [L, 4] float32, in [-1, 1]
    rewards: np.ndarray  # [L] float32
    step_success: np.ndarray  # [L] bool: the npz `success` array (info success after step t)
    instruction: np.ndarray  # [128] uint8, encode_instructions of instruction_text
    main_images: np.ndarray | None = None  # [L, H, W, 3] uint8, None for state-only datasets
    # [L, 128] uint8: per-step instructions where they change within an episode (CALVIN chains,
    # rlfleet.data.env_demos); None: `instruction` holds for every step
    step_instructions: np.ndarray | None = None

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])


def demo_seed(seed: int, task: str, attempt: int) -> int:
    """Env seed of `attempt` of `task` (see the module docstring): disjoint from eval and other tasks."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if not 0 <= attempt < TASK_SEED_STRIDE:
        raise ValueError(f"attempt must be in [0, {TASK_SEED_STRIDE}), got {attempt}")
    from rlfleet.envs.metaworld.env import ALL_TASKS

    return DEMO_SEED_BASE * (1 + seed) + TASK_SEED_STRIDE * sorted(ALL_TASKS).index(task) + attempt


def rollout_expert(
    env: Any, expert: Any, seed: int, max_episode_steps: int, stop_after_success: int = 10
) -> dict[str, np.ndarray]:
    """One expert episode in a 1-env, chunk-size-1 `MetaWorldEnv`; returns the per-step arrays.

    Kept separate from the worker plumbing so benchmarks and tests can roll out experts directly.
    """
    obs = env.reset(np.array([seed]))
    images: list[np.ndarray] = []
    states: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    rewards: list[float] = []
    success: list[bool] = []
    first_success = -1
    for t in range(max_episode_steps):
        state = obs["states"][0]
        action = np.clip(np.asarray(expert.get_action(state.astype(np.float64)), np.float32), -1.0, 1.0)
        states.append(state)
        if "main_images" in obs:
            images.append(obs["main_images"][0])
        actions.append(action)
        res = env.chunk_step(action[None, None])
        rewards.append(float(res.rewards[0, 0]))
        success.append(bool(res.success[0]))
        if success[-1] and first_success < 0:
            first_success = t
        if first_success >= 0 and t >= first_success + stop_after_success:
            break
        obs = res.obs
    out = {
        "states": np.stack(states).astype(np.float32),
        "actions": np.stack(actions).astype(np.float32),
        "rewards": np.asarray(rewards, np.float32),
        "success": np.asarray(success, bool),
    }
    if images:
        out["main_images"] = np.stack(images).astype(np.uint8)
    return out


# --- worker processes -------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(settings: dict[str, Any]) -> None:
    # Workers already fill the cores: without this every worker's llvmpipe (CPU OpenGL) starts one
    # render thread per core, N workers x N threads. Rendering in the worker's own thread cost
    # nothing measurable with 2 workers on 2 idle-ish cores and was faster on a loaded host
    # (~13 vs ~22 ms a 64 px frame). Must precede the first GL context; a user setting wins.
    os.environ.setdefault("LP_NUM_THREADS", "0")
    # MetaWorld's experts warn whenever an action exceeds [-1, 1]; we clip on purpose.
    warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
    _WORKER.clear()
    _WORKER["settings"] = settings
    _WORKER["envs"] = OrderedDict()  # task -> (MetaWorldEnv, expert), least recently used first


def _env_and_expert(task: str) -> tuple[Any, Any]:
    """This worker's env for `task`; a few are cached because building one (with renderer) is slow."""
    envs: OrderedDict = _WORKER["envs"]
    if task in envs:
        envs.move_to_end(task)
        return envs[task]
    while len(envs) >= _ENV_CACHE:
        _, (old, _expert) = envs.popitem(last=False)
        old.close()
    from rlfleet.envs.metaworld.env import MetaWorldEnv

    s = _WORKER["settings"]
    cfg = EnvConfig(
        task=task,
        max_episode_steps=s["max_episode_steps"],
        chunk_size=1,
        image_size=s["image_size"],
        camera=s["camera"],
    )
    envs[task] = (MetaWorldEnv(cfg, 1), expert_policies()[task]())
    return envs[task]


def _run_job(job: tuple[str, int, int]) -> dict[str, Any]:
    """Roll out one (task, attempt, seed); write its .npz into the temporary folder if it is kept."""
    task, attempt, seed = job
    s = _WORKER["settings"]
    env, expert = _env_and_expert(task)
    t0 = time.perf_counter()
    arrays = rollout_expert(env, expert, seed, s["max_episode_steps"], s["stop_after_success"])
    seconds = time.perf_counter() - t0
    ok = bool(arrays["success"].any())
    meta: dict[str, Any] = {
        "task": task,
        "attempt": attempt,
        "seed": seed,
        "length": int(arrays["actions"].shape[0]),
        "success": ok,
        "success_step": int(np.argmax(arrays["success"])) if ok else -1,
        "seconds": seconds,
        "tmp_file": None,
    }
    if ok or s["keep_failed"]:
        arrays["instruction"] = np.asarray(s["instructions"][task], np.uint8)
        name = f"{task}_{attempt:05d}.npz"
        with open(Path(s["episodes_dir"]) / name, "wb") as f:
            np.savez(f, **arrays)
        meta["tmp_file"] = name
    return meta


# --- collection -------------------------------------------------------------------------------


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def expert_policies() -> dict[str, type]:
    """MetaWorld's scripted expert class per task (`ENV_POLICY_MAP`).

    Imported through here because `metaworld.policies` imports mujoco, which picks its OpenGL
    backend once at import: `rlfleet.envs.metaworld` must come first to select EGL (headless),
    or later renderers fail with "an OpenGL platform library has not been loaded".
    """
    import rlfleet.envs.metaworld  # noqa: F401, I001  (sets MUJOCO_GL before mujoco is imported)
    from metaworld.policies import ENV_POLICY_MAP

    return ENV_POLICY_MAP


def _validate_tasks(tasks: list[str]) -> list[str]:
    from rlfleet.envs.metaworld.env import resolve_tasks

    ENV_POLICY_MAP = expert_policies()

    if isinstance(tasks, str):
        tasks = resolve_tasks(tasks)
    tasks = list(tasks)
    if not tasks:
        raise ValueError("no tasks to collect demos for")
    resolve_tasks(",".join(tasks))  # raises a helpful ValueError for unknown names
    dupes = sorted({t for t in tasks if tasks.count(t) > 1})
    if dupes:
        raise ValueError(f"tasks listed more than once: {dupes}")
    missing = [t for t in tasks if t not in ENV_POLICY_MAP]
    if missing:
        raise ValueError(f"MetaWorld has no scripted expert for {missing}")
    return tasks


def collect_demos(
    out: Path,
    tasks: list[str],
    episodes_per_task: int,
    image_size: int = 64,
    camera: str = "corner",
    max_episode_steps: int = 150,
    num_workers: int = 2,
    seed: int = 0,
    keep_failed: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    stop_after_success: int = 10,
) -> dict[str, dict[str, int]]:
    """Roll out MetaWorld's scripted experts in `num_workers` processes and write a dataset to `out`.

    Written into `<out>.tmp/` and renamed at the end, so an interrupted run never leaves a partial
    dataset under `out`. Returns the per-task summary stored in index.json.
    """
    out = Path(out)
    if episodes_per_task < 1:
        raise ValueError(f"episodes_per_task must be >= 1, got {episodes_per_task}")
    if ATTEMPTS_PER_EPISODE * episodes_per_task > TASK_SEED_STRIDE:
        raise ValueError(
            f"episodes_per_task must be <= {TASK_SEED_STRIDE // ATTEMPTS_PER_EPISODE}, got {episodes_per_task}"
        )
    if max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
    if stop_after_success < 0:
        raise ValueError(f"stop_after_success must be >= 0, got {stop_after_success}")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if not 0 <= image_size <= 1024:
        raise ValueError(f"image_size must be 0 (no images) or 1..1024, got {image_size}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    tasks = _validate_tasks(tasks)
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise FileExistsError(
            f"{out} already exists; pass overwrite=True (rlfleet collect --overwrite) "
            "to replace it, or choose another output folder"
        )

    from rlfleet.envs.metaworld.env import TASK_DESCRIPTIONS

    env_cfg = EnvConfig(
        task=",".join(tasks),
        max_episode_steps=max_episode_steps,
        chunk_size=1,
        seed=seed,
        image_size=image_size,
        camera=camera,
    )
    tmp = out.with_name(out.name + ".tmp")
    _remove(tmp)  # a stale one from a killed run
    episodes_dir = tmp / "episodes"
    episodes_dir.mkdir(parents=True)
    settings = {
        "max_episode_steps": max_episode_steps,
        "stop_after_success": stop_after_success,
        "image_size": image_size,
        "camera": camera,
        "keep_failed": keep_failed,
        "episodes_dir": str(episodes_dir),
        "instructions": {t: encode_instructions([TASK_DESCRIPTIONS[t]])[0] for t in tasks},
    }
    try:
        results = _run_jobs(tasks, episodes_per_task, seed, num_workers, settings, progress)
        index = _write_index(
            tmp,
            env_cfg,
            tasks,
            results,
            TASK_DESCRIPTIONS,
            {
                "episodes_per_task": episodes_per_task,
                "seed": seed,
                "keep_failed": keep_failed,
                "stop_after_success": stop_after_success,
                "max_attempts_per_task": ATTEMPTS_PER_EPISODE * episodes_per_task,
                "seed_scheme": "1_000_000 * (1 + seed) + 10_000 * sorted(ALL_TASKS).index(task) + attempt",
            },
        )
        if out.exists() or out.is_symlink():
            old = out.with_name(out.name + ".old")
            _remove(old)
            out.rename(old)
            tmp.rename(out)
            _remove(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return index["summary"]


def _run_jobs(
    tasks: list[str], episodes_per_task: int, seed: int, num_workers: int, settings: dict[str, Any], progress: bool
) -> list[dict[str, Any]]:
    """Schedule expert rollouts: n attempts per task first, one more after each failure (up to 3n)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    n = episodes_per_task
    cap = ATTEMPTS_PER_EPISODE * n
    launched = {t: 0 for t in tasks}
    running = {t: 0 for t in tasks}
    ok = {t: 0 for t in tasks}
    failed = {t: 0 for t in tasks}
    results: list[dict[str, Any]] = []
    pending: dict[Future, str] = {}
    workers = max(1, min(num_workers, len(tasks) * n))
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(settings,)
    )
    bar = Progress(
        TextColumn("[bold]collect"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=not progress,
    )

    def submit(task: str) -> None:
        attempt = launched[task]
        launched[task] += 1
        running[task] += 1
        pending[pool.submit(_run_job, (task, attempt, demo_seed(seed, task, attempt)))] = task

    def settled() -> int:
        """Episode slots decided: filled by a success, or given up once a task's attempts ran out."""
        return sum(n if ok[t] >= n or (launched[t] >= cap and running[t] == 0) else ok[t] for t in tasks)

    try:
        with bar:
            bar_task = bar.add_task("collect", total=len(tasks) * n, info="")
            for task in tasks:
                for _ in range(n):
                    submit(task)
            while pending:
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in done:
                    task = pending.pop(fut)
                    running[task] -= 1
                    r = fut.result()
                    results.append(r)
                    if r["success"]:
                        ok[task] += 1
                    else:
                        failed[task] += 1
                        if launched[task] < cap:
                            submit(task)
                bar.update(
                    bar_task,
                    completed=settled(),
                    info=f"{sum(ok.values())} successes, {sum(failed.values())} failed attempts",
                )
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results


def _write_index(
    tmp: Path,
    env_cfg: EnvConfig,
    tasks: list[str],
    results: list[dict[str, Any]],
    descriptions: dict[str, str],
    collect: dict[str, Any],
) -> dict[str, Any]:
    """Number the kept episodes, rename their files to ep_XXXXXX.npz and write index.json."""
    order = {t: i for i, t in enumerate(tasks)}
    kept = sorted((r for r in results if r["tmp_file"]), key=lambda r: (order[r["task"]], r["attempt"]))
    episodes = []
    for i, r in enumerate(kept):
        file = f"episodes/ep_{i:06d}.npz"
        (tmp / "episodes" / r["tmp_file"]).rename(tmp / file)
        episodes.append(
            {
                "id": i,
                "file": file,
                "task": r["task"],
                "instruction": descriptions[r["task"]],
                "seed": r["seed"],
                "attempt": r["attempt"],
                "length": r["length"],
                "success": r["success"],
                "success_step": r["success_step"],
            }
        )
    summary = {
        t: {
            "episodes": sum(1 for e in episodes if e["task"] == t),
            "success": sum(1 for e in episodes if e["task"] == t and e["success"]),
            "attempts": sum(1 for r in results if r["task"] == t),
            "failed": sum(1 for r in results if r["task"] == t and not r["success"]),
        }
        for t in tasks
    }
    index = {
        "format": FORMAT,
        "env": asdict(env_cfg),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "collect": collect,
        "episodes": episodes,
        "summary": summary,
    }
    (tmp / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


# --- loading ----------------------------------------------------------------------------------


def read_index(path: str | Path) -> dict[str, Any]:
    """The dataset's index.json, checked to be an `rlfleet-demos/1` dataset."""
    path = Path(path)
    index_file = path / "index.json"
    if not path.is_dir():
        raise FileNotFoundError(f"demo dataset folder {path} does not exist (collect one with `rlfleet collect`)")
    if not index_file.is_file():
        raise FileNotFoundError(
            f"{path} has no index.json: not an rlfleet demo dataset (collect one with `rlfleet collect`)"
        )
    try:
        index = json.loads(index_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{index_file} is not valid JSON: {exc}") from exc
    fmt = index.get("format") if isinstance(index, dict) else None
    if fmt != FORMAT:
        raise ValueError(f"{index_file} has format {fmt!r}; this version of rlfleet reads {FORMAT!r}")
    return index


def load_demos(path: str | Path, only_success: bool = True) -> list[DemoEpisode]:
    """All episodes of a dataset (by default only the expert's successful ones), in id order."""
    path = Path(path)
    index = read_index(path)
    episodes = []
    for entry in index["episodes"]:
        if only_success and not entry["success"]:
            continue
        with np.load(path / entry["file"], allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        episodes.append(
            DemoEpisode(
                id=int(entry["id"]),
                task=entry["task"],
                instruction_text=entry["instruction"],
                seed=int(entry["seed"]),
                success=bool(entry["success"]),
                success_step=int(entry["success_step"]),
                states=arrays["states"],
                actions=arrays["actions"],
                rewards=arrays["rewards"],
                step_success=arrays["success"],
                instruction=arrays["instruction"],
                main_images=arrays.get("main_images"),
                step_instructions=arrays.get("step_instructions"),
            )
        )
    return episodes
