"""Evaluation episodes: the policy (deterministic by default, or sampled as in training) on fresh
episodes of every task, success_once per task (a run's evaluations: `rlfleet.eval.service`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn

from rlfleet.config import VideoConfig
from rlfleet.envs.api import TEST_SEED_BASE, ChunkedEnv, EnvConfig
from rlfleet.envs.chains import chain_report
from rlfleet.envs.registry import make_env, scored_chain_length, task_groups, task_list
from rlfleet.eval.paired import write_episodes
from rlfleet.eval.report import rich_table, success_table, write_chain_table, write_report
from rlfleet.eval.summary import mean_returns, return_line
from rlfleet.eval.video import EpisodeRecorder

# A rendering env holds a ~60 MB offscreen context: evaluate in rounds of at most this many envs.
MAX_EVAL_ENVS = 50


def evaluate_policy(
    policy: nn.Module,
    env_cfg: EnvConfig,
    episodes_per_task: int,
    seed: int = TEST_SEED_BASE,
    video_cfg=None,
    out_dir: str | Path | None = None,
    max_envs: int = MAX_EVAL_ENVS,
    deterministic: bool = True,
    progress: bool = True,
    videos: list[Path] | None = None,
    episode_records: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """Run `episodes_per_task` episodes of each task; returns success rate per task.

    Episode j of task i uses seed `seed + j * num_tasks + i` whatever the batching, so every
    evaluation of a task set sees the same episodes. Envs run in rounds of at most `max_envs`
    (at least one env per task). With `video_cfg.save_video` the first episode of each task is
    written as MP4 under `out_dir`. `deterministic=False` samples actions the way the fleet does
    in training (seeded by torch's global RNG), which is the policy RL actually optimises.
    `progress` shows a bar over episodes on the terminal (off where another live display runs,
    such as the training bar); `videos`, when given, receives the paths of the MP4s written;
    `episode_records`, when given, one record per episode in seed order: {"task", "seed",
    "scene", "success", "return", "length"} (scene: `ChunkedEnv.episode_scenes`, else the seed;
    length in env steps), what `rlfleet.eval.paired` pairs.
    """
    tasks = task_list(env_cfg)
    per_round = max(1, min(episodes_per_task, max_envs // len(tasks)))
    results: dict[str, list[bool]] = {t: [] for t in tasks}
    envs: dict[int, ChunkedEnv] = {}  # by batch size: rounds reuse one env batch (see below)
    done_eps = 0
    bar = Progress(
        TextColumn("[bold]eval[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("episodes"),
        TimeRemainingColumn(),
        transient=True,
        disable=not progress,
    )
    bar_task = bar.add_task("eval", total=episodes_per_task * len(tasks))
    try:
        bar.start()
        while done_eps < episodes_per_task:
            r = min(per_round, episodes_per_task - done_eps)
            seeds = seed + done_eps * len(tasks) + np.arange(r * len(tasks))
            video = video_cfg if done_eps == 0 else None
            # Building 50 MetaWorld envs with renderers per round and closing them left ~2 GB per
            # round in the process (12 GB for 250 episodes, which OOM-killed a training run).
            if len(seeds) not in envs:
                envs[len(seeds)] = make_env(env_cfg, len(seeds))
            env = envs[len(seeds)]
            names, scenes, ok_all, ret_all, len_all, written = _run_episodes(
                policy, env, seeds, video, out_dir, deterministic, on_done=lambda n: bar.advance(bar_task, n)
            )
            if videos is not None:
                videos.extend(written)
            for k, (task, ok, ret, length) in enumerate(zip(names, ok_all, ret_all, len_all)):
                results[task].append(ok)
                if episode_records is not None:
                    scene = int(seeds[k] if scenes is None else scenes[k])
                    record = {"task": task, "seed": int(seeds[k]), "scene": scene, "success": bool(ok)}
                    episode_records.append({**record, "return": float(ret), "length": int(length)})
            done_eps += r
    finally:
        bar.stop()
        for env in envs.values():
            env.close()
    return {task: float(np.mean(results[task])) for task in tasks}


@torch.no_grad()
def _run_episodes(
    policy: nn.Module, env: ChunkedEnv, seeds: np.ndarray, video_cfg, out_dir, deterministic: bool = True, on_done=None
) -> tuple[list[str], list[int] | None, np.ndarray, np.ndarray, np.ndarray, list[Path]]:
    """One episode per env of a batch reset with `seeds` (env i runs task i mod num_tasks);
    the env's scene ids (None: the seeds name them), success_once, return and length (env steps)
    per env, and the videos written. `on_done(n)`: n more episodes ended."""
    n = len(seeds)
    recorder = None
    try:
        obs = env.reset(seeds)
        names = env.spec.task_names
        scenes = env.episode_scenes()  # the counted episode of each env is the one this reset started
        recorder = EpisodeRecorder(video_cfg or VideoConfig(), names, root=out_dir, episodes_per_env=1)
        recorder.start(obs.get("main_images"))
        done = np.zeros(n, bool)
        success = np.zeros(n, bool)
        returns = np.zeros(n, np.float64)
        lengths = np.zeros(n, np.int64)
        policy.eval()
        device = next(policy.parameters()).device  # the policy acts where it lives (a learner's GPU)
        while not done.all():
            out = policy.act(obs_tensors(obs, policy.obs_keys, device), deterministic=deterministic)
            res = env.chunk_step(out["actions"].cpu().numpy())
            recorder.step(
                res.obs.get("main_images"),
                rewards=res.rewards,
                success=res.success,
                done=res.episode_done,
                final_frames=res.final_obs.get("main_images"),
                episode_success=res.episode_success_once,
                episode_length=res.episode_length,
            )
            newly = res.episode_done & ~done
            success[newly] = res.episode_success_once[newly]
            returns[newly] = res.episode_return[newly]
            lengths[newly] = res.episode_length[newly]
            done |= res.episode_done
            if on_done is not None and newly.any():
                on_done(int(newly.sum()))
            obs = res.obs
    finally:
        if recorder is not None:
            recorder.close()
    return names, scenes, success, returns, lengths, list(recorder.written)


def returns_by_task(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each task's episode returns in episode order (CALVIN: subtasks done), from `episode_records`."""
    returns: dict[str, list[float]] = {}
    for r in records:
        returns.setdefault(r["task"], []).append(r["return"])
    return returns


def report_evaluation(
    out: Path,
    records: list[dict],
    success: dict[str, float],
    env: EnvConfig,
    seed: int,
    mode: str,
    checkpoint: str,
    split: str = "test",
) -> dict[str, Any]:
    """Write one evaluation's report to `out` and show it: episodes.jsonl, eval.json (the success
    table, how actions were chosen, the env and first seed, mean returns, a chained env's chain
    metrics) and eval.md (eval_chain.md for chains). Returns the eval.json dict."""
    episodes = Counter(r["task"] for r in records)
    returns = returns_by_task(records)
    table = success_table(success, {t: episodes[t] for t in success}, task_groups(env.name))
    per_task = max(episodes.values(), default=0)
    title = f"evaluation of {checkpoint} ({per_task} episodes per task, {mode}, {split} split)"
    Console().print(rich_table(table, title=title))
    table["mode"] = mode  # what a later --compare against this report checks
    table["split"] = split  # test: what results report; validation: where choices are made
    table["env"], table["seed"] = {"name": env.name, "task": env.task}, seed  # what it ran, for a later pairing
    table["mean_return"] = mean_returns(returns)  # envs judged by return (gym:...)
    print(return_line(table["mean_return"]))
    n = scored_chain_length(env.name, env.reward_type)
    if n:
        table["chains"] = chain_report(returns, n)  # CALVIN's columns, also in eval.json
    write_episodes(records, out)
    write_report(table, out, name="eval", title=f"Evaluation of {checkpoint}")
    if n:
        print(write_chain_table(out, table["chains"], f"Chains of {checkpoint} ({mode})", n))
    return table


def obs_tensors(obs: dict, keys: tuple[str, ...], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The tensor observations a policy reads, from an env's observation dict, on `device`."""
    return {k: torch.from_numpy(np.ascontiguousarray(obs[k])).to(device) for k in keys}
