"""Scripted-expert demos from any env that declares experts (`has_expert`: MetaWorld, RoboTwin, CALVIN).

The one demo collector of the CLI and the SFT bootstrap. Envs carry their experts inside the env
batch, so one batch of envs steps in lockstep, every env driven by its own expert, and writes the same
``rlfleet-demos/1`` dataset (docs/datasets.md) that `rlfleet sft` reads, plus one more key:

    step_instructions [L,128] uint8: the instruction each action was chosen under (a CALVIN chain
                                     changes it after every completed subtask)

Rounds. Round r resets env i (task i mod n_tasks) with seed ``DEMO_SEED_BASE * (1 + seed) + r *
num_envs + i`` and records its first episode; rounds repeat until every task has
`episodes_per_task` successes or used 3x that many attempts. What a seed means is the env's own
(RoboTwin: an index into its train seed list; CALVIN: a train-pool entry), so demos never come
from evaluation seeds or pools.
"""

from __future__ import annotations

import json
import logging
import shutil
from argparse import Namespace
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlfleet.config import DemosConfig
from rlfleet.data.demos import ATTEMPTS_PER_EPISODE, DEMO_SEED_BASE, FORMAT, IMAGE_KEYS, load_demos
from rlfleet.data.lerobot import write_lerobot
from rlfleet.envs.api import EnvConfig, decode_instructions
from rlfleet.envs.registry import build_env_config, make_env

STOP_AFTER_SUCCESS = 10  # as rlfleet.data.demos: recorded steps after the first success


def _round_seeds(seed: int, round_index: int, num_envs: int) -> np.ndarray:
    return DEMO_SEED_BASE * (1 + seed) + round_index * num_envs + np.arange(num_envs)


def _record_round(env: Any, seeds: np.ndarray, max_steps: int) -> list[dict[str, np.ndarray]]:
    """Each env's first episode under its expert, as per-step arrays (an env that finished early
    keeps stepping with the batch; what it does then is not recorded)."""
    n = len(seeds)
    obs = env.reset(seeds)
    steps: list[dict[str, list]] = [
        {k: [] for k in ("states", "actions", "rewards", "success", "step_instructions", *IMAGE_KEYS)} for _ in range(n)
    ]
    done = np.zeros(n, bool)
    first = np.full(n, -1)
    for _ in range(max_steps):
        actions = np.clip(env.expert_actions().astype(np.float32), -1.0, 1.0)
        res = env.chunk_step(actions[:, None, :])
        for i in np.flatnonzero(~done):
            rec = steps[i]
            rec["states"].append(obs["states"][i])
            rec["step_instructions"].append(obs["instructions"][i])
            for key in IMAGE_KEYS:
                if key in obs:
                    rec[key].append(obs[key][i])
            rec["actions"].append(actions[i])
            rec["rewards"].append(float(res.rewards[i, 0]))
            # the env's own success: a solved task, or a whole CALVIN chain
            rec["success"].append(bool(res.success[i]))
            if res.success[i] and first[i] < 0:
                first[i] = len(rec["success"]) - 1
        # stop STOP_AFTER_SUCCESS steps after the first success (a few "hold still" frames), or at the episode end
        lengths = np.array([len(rec["success"]) for rec in steps])
        done |= res.episode_done | ((first >= 0) & (lengths > first + STOP_AFTER_SUCCESS))
        obs = res.obs
        if done.all():
            break
    out = []
    for rec in steps:
        arrays = {k: np.asarray(v) for k, v in rec.items() if v}
        arrays["states"] = arrays["states"].astype(np.float32)
        arrays["actions"] = arrays["actions"].astype(np.float32)
        arrays["rewards"] = arrays["rewards"].astype(np.float32)
        arrays["success"] = arrays["success"].astype(bool)
        out.append(arrays)
    return out


def refuse_existing(out: Path, overwrite: bool) -> None:
    """A command's output folder is never replaced unless the user said --overwrite."""
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise FileExistsError(f"{out} already exists; pass --overwrite to replace it, or choose another folder")


def collect_env_demos(
    out: Path,
    env_cfg: EnvConfig,
    episodes_per_task: int,
    envs_per_task: int = 1,
    seed: int = 0,
    keep_failed: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, dict[str, int]]:
    """Write a demo dataset for `env_cfg` (its tasks, camera size, episode limit) to `out`.

    Written into `<out>.tmp/` and renamed at the end, so an interrupted run leaves nothing under
    `out`. Returns the per-task summary stored in index.json.
    """
    out = Path(out)
    if episodes_per_task < 1 or envs_per_task < 1:
        raise ValueError(f"episodes_per_task and envs_per_task must be >= 1, got {episodes_per_task}, {envs_per_task}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    refuse_existing(out, overwrite)
    cfg = replace(env_cfg, chunk_size=1, reward_type="success")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "episodes").mkdir(parents=True)
    try:
        env = make_env(cfg, 1)  # probe: the task list and whether this env has experts
        tasks = env.task_list
        env.close()
        num_envs = len(tasks) * envs_per_task
        env = make_env(cfg, num_envs)
        if not env.has_expert:
            env.close()
            raise ValueError(f"env {cfg.name!r} has no scripted experts (expert_actions) to collect demos with")
        entries, attempts = _collect_rounds(env, tmp, tasks, episodes_per_task, seed, keep_failed, progress)
        env.close()
        summary = {
            t: {
                "episodes": sum(e["task"] == t for e in entries),
                "success": sum(e["task"] == t and e["success"] for e in entries),
                "attempts": attempts[t]["attempts"],
                "failed": attempts[t]["failed"],
            }
            for t in tasks
        }
        index = {
            "format": FORMAT,
            "env": asdict(cfg),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "collect": {
                "episodes_per_task": episodes_per_task,
                "envs_per_task": envs_per_task,
                "seed": seed,
                "keep_failed": keep_failed,
                "seed_scheme": "1_000_000 * (1 + seed) + round * num_envs + env",
            },
            "episodes": entries,
            "summary": summary,
        }
        (tmp / "index.json").write_text(json.dumps(index, indent=2) + "\n")
        if out.exists() or out.is_symlink():
            shutil.rmtree(out) if out.is_dir() and not out.is_symlink() else out.unlink()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _collect_rounds(
    env: Any, tmp: Path, tasks: list[str], n: int, seed: int, keep_failed: bool, progress: bool
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    names = env.spec.task_names
    num_envs = len(names)
    ok = {t: 0 for t in tasks}
    tally = {t: {"attempts": 0, "failed": 0} for t in tasks}
    entries: list[dict[str, Any]] = []
    bar = Progress(
        TextColumn("[bold]collect"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=not progress,
    )
    with bar:
        job = bar.add_task("collect", total=len(tasks) * n, info="")
        r = 0
        while any(ok[t] < n and tally[t]["attempts"] < ATTEMPTS_PER_EPISODE * n for t in tasks):
            seeds = _round_seeds(seed, r, num_envs)
            for i, arrays in enumerate(_record_round(env, seeds, env.spec.max_episode_steps)):
                task = names[i]
                if ok[task] >= n or tally[task]["attempts"] >= ATTEMPTS_PER_EPISODE * n:
                    continue
                success = bool(arrays["success"].any())
                tally[task]["attempts"] += 1
                ok[task] += success
                tally[task]["failed"] += not success
                if success or keep_failed:
                    entries.append(_write_episode(tmp, len(entries), task, int(seeds[i]), r, arrays))
            r += 1
            bar.update(
                job,
                completed=sum(min(v, n) for v in ok.values()),
                info=f"{sum(ok.values())} successes, {sum(t['failed'] for t in tally.values())} failed",
            )
    return entries, tally


def _write_episode(tmp: Path, ep_id: int, task: str, seed: int, attempt: int, arrays: dict[str, np.ndarray]) -> dict:
    arrays["instruction"] = arrays["step_instructions"][0]
    file = f"episodes/ep_{ep_id:06d}.npz"
    with open(tmp / file, "wb") as f:
        np.savez(f, **arrays)
    texts = list(dict.fromkeys(decode_instructions(arrays["step_instructions"])))
    ok = bool(arrays["success"].any())
    return {
        "id": ep_id,
        "file": file,
        "task": task,
        "instruction": " | ".join(texts),
        "seed": seed,
        "attempt": attempt,
        "length": int(arrays["actions"].shape[0]),
        "success": ok,
        "success_step": int(np.argmax(arrays["success"])) if ok else -1,
    }


def main(args: Namespace) -> int:
    """`rlfleet collect --tasks T --out DIR`: record scripted-expert demonstrations (the SFT data).
    A flag left out takes the schema's default (DemosConfig, EnvConfig): one place per default."""
    defaults = DemosConfig()
    episodes = defaults.episodes_per_task if args.episodes_per_task is None else args.episodes_per_task
    seed = defaults.seed if args.seed is None else args.seed
    cfg = build_env_config(
        dict(
            name=args.env,
            task=args.tasks,
            max_episode_steps=EnvConfig.max_episode_steps if args.max_episode_steps is None else args.max_episode_steps,
            image_size=args.image_size,
            camera=EnvConfig.camera if args.camera is None else args.camera,
            wrist_camera=getattr(args, "wrist_camera", False),
        )
    )
    out = Path(args.out)
    lerobot = getattr(args, "format", "rlfleet") == "lerobot"
    if lerobot:  # collected in rlfleet's format beside it, then written as a LeRobot v3 dataset
        refuse_existing(out, args.overwrite)
    staging = out.with_name(f".{out.name}.rlfleet-demos") if lerobot else out
    summary = collect_env_demos(
        staging,
        cfg,
        episodes,
        envs_per_task=getattr(args, "envs_per_task", 1),
        seed=seed,
        keep_failed=args.keep_failed,
        overwrite=args.overwrite or lerobot,
    )
    if lerobot:
        try:
            write_lerobot(out, load_demos(staging, only_success=False), fps=args.fps)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    table = Table(title=f"scripted-expert demos in {args.out}")
    table.add_column("task")
    table.add_column("episodes", justify="right")
    table.add_column("expert success", justify="right")
    table.add_column("failed attempts", justify="right")
    for task, s in summary.items():
        table.add_row(task, str(s["episodes"]), f"{s['attempts'] - s['failed']}/{s['attempts']}", str(s["failed"]))
    Console().print(table)
    short = [t for t, s in summary.items() if s["attempts"] - s["failed"] < episodes]
    if short:
        logging.getLogger("rlfleet").warning("fewer than %d successful episodes for: %s", episodes, ", ".join(short))
    return 0
