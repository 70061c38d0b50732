"""The DAgger / HG-DAgger training loop with MetaWorld's scripted experts (`dagger.enabled: true`).

One iteration i (formulas in `rlfleet.algorithms.dagger` and docs/algorithms.md):

1. beta_i from the schedule; N envs (one in-process `MetaWorldEnv` batch, as in evaluation) run
   `episodes_per_env` full episodes. At every chunk step the student proposes a chunk for each env
   and the expert executes it instead with probability beta_i (DAgger) or when the HG-DAgger
   gate fires (`dagger.variant: hg_dagger`).
2. Labels: every state visited is labelled with the scripted expert's action at that state, queried
   on the fly inside the chunk (`MetaWorldEnv.expert_chunk_step`). A sample is the observation at a
   chunk's first state s_t (the only states with a camera frame) and the chunk label
   (pi*(s_t), ..., pi*(s_{t+K-1})) of the K states the env went through, i.e. consecutive per-step
   expert labels as `rlfleet.runs.sft.action_chunks` builds them from demos. For an expert-executed
   chunk this is exactly the chunk the expert ran; for a student chunk it is what the expert would
   have done at each state the student visited (the MetaWorld experts are stateless closed-loop
   controllers, so "what to do here" is well defined at every state).
3. D <- newest W samples of D u D_i (HG-DAgger: only the expert-executed chunks enter D), then S
   optimiser steps of the policy's own SFT loss on minibatches of D (token cross-entropy for
   tiny_oft, flow matching for tiny_pi0/tiny_pi05, Gaussian NLL for the MLP).

The run starts from `policy.model_path` (with `demos.bootstrap: true` and no model path,
`rlfleet train` first builds the cached SFT checkpoint), evaluates before, during (`dagger.eval_every`)
and after through the evaluation service the PPO learner uses (`rlfleet.eval.service`, an observer
of this loop) and writes checkpoints, TensorBoard scalars, summary.json and before_after.md into the
run folder. Resume (`runner.resume`) restores weights, optimiser, iteration and the aggregated dataset.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlfleet.algorithms.dagger import (
    AggregatedDataset,
    DAggerConfig,
    action_gap,
    beta_schedule,
    chunks_per_episode,
    expert_control,
    intervention_gate,
    mix_policies,
)
from rlfleet.config import as_dict, to_yaml
from rlfleet.data.demos import load_demos
from rlfleet.envs.registry import build_env_config, make_env
from rlfleet.envs.run_shapes import probe_env_dims
from rlfleet.eval.episodes import obs_tensors
from rlfleet.eval.service import EvaluationService, PeriodicEval
from rlfleet.eval.splits import evaluation_record
from rlfleet.eval.summary import write_summary
from rlfleet.learner.checkpointer import Checkpointer, TrainerCounters, run_info
from rlfleet.learner.main import RUN_OUTPUTS, START_OUTPUTS, archive_previous_run, built_run_spec
from rlfleet.learner.metrics import MetricsWriter
from rlfleet.policies.checkpoint_io import model_config, policy_from_config
from rlfleet.policies.vla.normalization import compute_norm_stats, get_norm_stats, save_norm_stats, set_norm_stats
from rlfleet.runs.bootstrap import demos_folder
from rlfleet.runs.sft import augment_images, build_sft_data, without_noop_frames
from rlfleet.wire.run_spec import write_run_spec

log = logging.getLogger(__name__)

DATASET_FILE = "dagger_dataset.npz"  # the aggregated window, in the run folder (for resume)
METHOD_NAMES = {"dagger": "DAgger", "hg_dagger": "HG-DAgger"}
TRAIN_SEED_BASE = 10**9  # rollout episode seeds are drawn above this: never an eval (10_000 + i) or demo seed


@dataclass
class DAggerLoop:
    """The loop as its observers see it (`rlfleet.eval.service.TrainingLoop`): scalars are logged
    against iterations."""

    policy: torch.nn.Module
    counters: TrainerCounters
    writer: MetricsWriter | None
    bar: Progress | None = None
    bar_task: Any = field(default=None)

    @property
    def updates(self) -> int:
        return self.counters.update

    @property
    def step(self) -> int:
        return self.counters.update

    step_unit = "iterations"

    def show(self, info: str) -> None:
        if self.bar is not None and self.bar_task is not None:
            self.bar.update(self.bar_task, info=info)


@dataclass
class RolloutBatch:
    """What one iteration's rollouts produced: the samples for D and statistics."""

    obs: dict[str, np.ndarray]  # [M, ...] observation at each kept chunk start
    labels: np.ndarray  # [M, K, D] expert chunk labels
    chunks: int  # chunk steps taken over all envs (kept or not)
    expert_chunks: int  # ... of which the expert executed
    gated_chunks: int  # ... of which the HG-DAgger gate fired
    action_gap: float  # mean ||a_student[0] - a_expert|| at the chunk starts
    env_steps: int  # substeps simulated (a chunk cut by an episode end counts those that ran)
    episode_success: list[bool]  # success_once of every finished episode
    episode_tasks: list[str]


def collect_rollouts(
    env: Any, policy: torch.nn.Module, cfg: DAggerConfig, beta: float, rng: np.random.Generator, seeds: np.ndarray
) -> RolloutBatch:
    """Roll out the beta-mixture (or the gated student) for `cfg.episodes_per_env` episodes per env.

    `env` must declare scripted experts (`has_expert`: MetaWorld, RoboTwin, CALVIN envs). Episodes of all envs start
    together from `seeds` and never end early, so each env runs exactly T/K chunk steps each.
    """
    if not env.has_expert:
        raise ValueError(f"{type(env).__name__} has no scripted expert (expert_chunk_step) for DAgger")
    B, K = env.spec.num_envs, env.spec.chunk_size
    steps = cfg.episodes_per_env * chunks_per_episode(env.spec.max_episode_steps, K)
    names = env.spec.task_names
    obs = env.reset(seeds)
    kept_obs: dict[str, list[np.ndarray]] = {k: [] for k in policy.obs_keys}
    kept_labels: list[np.ndarray] = []
    n_expert = n_gated = env_steps = 0
    gaps: list[np.ndarray] = []
    successes: list[bool] = []
    tasks: list[str] = []
    device = next(iter(policy.parameters()), torch.empty(0)).device
    policy.eval()
    for _ in range(steps):
        obs_t = obs_tensors(obs, policy.obs_keys, device)
        student = policy.act(obs_t, deterministic=cfg.student_deterministic)
        student_actions = student["actions"].cpu().numpy().astype(np.float32)
        expert_now = env.expert_actions()  # pi*(s_t) at the chunk start
        gaps.append(action_gap(np.clip(student_actions[:, 0], -1.0, 1.0), expert_now))
        mixed = mix_policies(rng, beta, B)
        gated = (
            intervention_gate(np.clip(student_actions[:, 0], -1.0, 1.0), expert_now, cfg.hg_threshold)
            if cfg.variant == "hg_dagger"
            else np.zeros(B, bool)
        )
        use_expert, keep = expert_control(cfg.variant, mixed, gated)
        res, labels, _ = env.expert_chunk_step(student_actions, use_expert)
        for k in kept_obs:
            kept_obs[k].append(obs[k][keep])
        kept_labels.append(labels[keep])
        n_expert += int(use_expert.sum())
        n_gated += int(gated.sum())
        env_steps += int(res.substeps.sum())
        for i in np.flatnonzero(res.episode_done):
            successes.append(bool(res.episode_success_once[i]))
            tasks.append(names[i])
        obs = res.obs
    return RolloutBatch(
        obs={k: np.concatenate(v) for k, v in kept_obs.items()},
        labels=np.concatenate(kept_labels),
        chunks=steps * B,
        expert_chunks=n_expert,
        gated_chunks=n_gated,
        action_gap=float(np.mean(np.concatenate(gaps))),
        env_steps=env_steps,
        episode_success=successes,
        episode_tasks=tasks,
    )


def train_on_dataset(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: AggregatedDataset,
    cfg: DAggerConfig,
    gen: torch.Generator,
) -> float:
    """S = `cfg.train_steps` steps of min E_{(s, a*) ~ D} policy.sft_loss(s, a*); returns the mean loss."""
    obs_np, actions_np, _ = data.arrays()
    obs_t = {k: torch.from_numpy(v) for k, v in obs_np.items() if k in policy.obs_keys}
    actions_t = torch.from_numpy(actions_np)
    params = [p for p in policy.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    n = len(actions_t)
    losses = []
    policy.train()
    for _ in range(cfg.train_steps):
        idx = torch.randint(0, n, (min(cfg.batch_size, n),), generator=gen)
        mb = {k: v[idx] for k, v in obs_t.items()}
        augment_images(mb, cfg.shift_augment, gen)
        mb = {k: v.to(device, non_blocking=True) for k, v in mb.items()}
        loss = policy.sft_loss(mb, actions_t[idx].to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    policy.eval()
    return float(np.mean(losses)) if losses else float("nan")


def _load_demos(cfg: DictConfig, obs_keys: tuple[str, ...], chunk_size: int) -> tuple[dict, np.ndarray] | None:
    """The run's demo dataset (the SFT data) as (obs, chunk labels), or None when there is none."""
    folder = demos_folder(cfg)
    if not (folder / "index.json").exists():
        return None
    episodes = load_demos(folder, only_success=True)
    if cfg.sft.get("drop_noop_frames", False):  # the same samples SFT trained on
        episodes = without_noop_frames(episodes, cfg.env.name)
    data = build_sft_data(episodes, chunk_size)
    missing = [k for k in obs_keys if k not in data.obs]
    if missing:
        log.warning("demos in %s lack %s: not adding them to the DAgger dataset", folder, missing)
        return None
    if "main_images" in data.obs and data.obs["main_images"].shape[1] != cfg.env.image_size:
        log.warning(
            "demos in %s hold %dpx images, the run uses %dpx: not adding them",
            folder,
            data.obs["main_images"].shape[1],
            cfg.env.image_size,
        )
        return None
    return {k: data.obs[k] for k in obs_keys}, data.actions


def _save_checkpoint(
    checkpointer: Any,
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    counters: Any,
    model_cfg: dict[str, Any],
    unnorm_key: str,
) -> Path:
    folder = checkpointer.save(policy, optimizer, counters, model_cfg)
    try:  # VLA policies: norm_stats.json beside the weights, as SFT checkpoints have
        save_norm_stats(folder, unnorm_key, get_norm_stats(policy))
    except (TypeError, ValueError, LookupError):
        pass  # a policy without normalisation buffers (the MLP)
    return folder


def _maybe_set_norm_stats(policy: torch.nn.Module, data: AggregatedDataset) -> bool:
    """A fresh policy (no checkpoint) takes its action/state normalisation from the first data of D."""
    obs, actions, _ = data.arrays()
    try:
        set_norm_stats(policy, compute_norm_stats(actions.reshape(-1, actions.shape[-1]), obs["states"]))
    except (TypeError, KeyError, LookupError):
        return False
    return True


def run_dagger(cfg: DictConfig, progress: bool = True) -> dict[str, Any]:
    """Run DAgger / HG-DAgger as configured in `cfg.dagger`; returns (and writes) the run summary."""
    dcfg: DAggerConfig = OmegaConf.to_object(cfg.dagger)
    env = make_env(build_env_config(as_dict(cfg.env)), dcfg.num_envs)
    if not env.has_expert:
        env.close()
        raise ValueError(f"DAgger needs an env with scripted experts; env {cfg.env.name!r} declares none")
    run_dir = Path(cfg.runner.logger.log_path)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not cfg.runner.resume:
        archive_previous_run(run_dir, (*RUN_OUTPUTS, *START_OUTPUTS))
        (run_dir / DATASET_FILE).unlink(missing_ok=True)
    torch.set_num_threads(dcfg.threads)
    torch.manual_seed(cfg.runner.seed)
    state_dim, action_dim = probe_env_dims(build_env_config(as_dict(cfg.env)))
    K = cfg.env.chunk_size
    fresh = not cfg.policy.get("model_path")
    policy = policy_from_config(as_dict(cfg.policy), state_dim, action_dim, K, cfg.env.image_size)
    policy.to(dcfg.device)
    model_cfg = model_config(
        as_dict(cfg.policy),
        state_dim,
        action_dim,
        K,
        as_dict(cfg.env),
        cfg.env.image_size,
        evaluation_record(cfg),
    )
    (run_dir / "config.yaml").write_text(to_yaml(cfg))  # the user's config, as composed
    # the dims and the settings the policy was built with, as a learner's run folder holds them
    write_run_spec(
        run_dir, built_run_spec(state_dim, action_dim, policy, model_cfg["policy"], cfg.policy.get("model_path", ""))
    )
    optimizer = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad], lr=dcfg.lr, weight_decay=dcfg.weight_decay
    )
    checkpointer = Checkpointer(run_dir, info=run_info())
    counters = TrainerCounters()
    data = AggregatedDataset(dcfg.window)
    need_norm = fresh
    if cfg.runner.resume and checkpointer.latest() is not None:
        latest = checkpointer.latest()
        counters = checkpointer.restore(latest, policy, optimizer)
        need_norm = False  # the stats are buffers in the restored weights
        if (run_dir / DATASET_FILE).exists():
            data = AggregatedDataset.load(run_dir / DATASET_FILE, dcfg.window)
        log.info("resumed DAgger from %s at iteration %d (%d samples in D)", latest, counters.update, len(data))
    elif dcfg.include_demos:
        demos = _load_demos(cfg, policy.obs_keys, K)
        if demos is not None:
            data.add(demos[0], demos[1], iteration=-1)
            log.info("D starts with %d demo samples", len(data))
    if need_norm and len(data):
        need_norm = not _maybe_set_norm_stats(policy, data)

    # before (at iteration 0), every dagger.eval_every iterations but the last, and after
    periodic = PeriodicEval(dcfg.eval_episodes_per_task, dcfg.eval_every, last_update=dcfg.iterations)
    evaluation = EvaluationService(cfg, run_dir, periodic, evaluate_start=True)
    loop = DAggerLoop(policy, counters, writer=None)
    evaluation.on_start(loop)
    writer = loop.writer = MetricsWriter.for_run(cfg, run_dir)
    unnorm_key = cfg.policy.get("unnorm_key", "metaworld")
    history: list[dict[str, float]] = []
    t_start = time.monotonic()
    stopped_early = False
    bar = Progress(
        TextColumn(f"[bold]{dcfg.variant}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=not progress,
    )
    try:
        with bar:
            task = bar.add_task("dagger", total=dcfg.iterations, completed=counters.update, info="")
            loop.bar, loop.bar_task = bar, task
            while counters.update < dcfg.iterations:
                it = counters.update
                beta = beta_schedule(it, dcfg.beta0, dcfg.beta_schedule, dcfg.beta_decay, dcfg.beta_linear_iters)
                rng = np.random.default_rng([cfg.runner.seed, it])  # per iteration: resume replays the same draws
                gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
                seeds = TRAIN_SEED_BASE + rng.integers(0, 2**62 - TRAIN_SEED_BASE, size=dcfg.num_envs)

                bar.update(task, info=f"beta {beta:.2f} rollout ...")
                t0 = time.monotonic()
                batch = collect_rollouts(env, policy, dcfg, beta, rng, seeds)
                t_rollout = time.monotonic() - t0
                evicted = data.add(batch.obs, batch.labels, iteration=it)
                if need_norm and len(data):
                    need_norm = not _maybe_set_norm_stats(policy, data)

                bar.update(task, info=f"beta {beta:.2f} train on {len(data)} samples ...")
                t0 = time.monotonic()
                loss = train_on_dataset(policy, optimizer, data, dcfg, gen) if len(data) else float("nan")
                t_train = time.monotonic() - t0
                counters.update = it + 1
                counters.env_steps += batch.env_steps
                counters.samples += len(batch.labels)
                counters.version = counters.update

                success = float(np.mean(batch.episode_success)) if batch.episode_success else float("nan")
                stats = {
                    "dagger/beta": beta,
                    "dagger/dataset_size": float(len(data)),
                    "dagger/new_samples": float(len(batch.labels)),
                    "dagger/evicted_samples": float(evicted),
                    "dagger/expert_fraction": batch.expert_chunks / max(batch.chunks, 1),
                    "dagger/intervention_rate": batch.gated_chunks / max(batch.chunks, 1),
                    "dagger/action_gap": batch.action_gap,
                    "train/sft_loss": loss,
                    "env/success_once": success,
                    "env/episodes": float(len(batch.episode_success)),
                    "time/rollout_s": t_rollout,
                    "time/train_s": t_train,
                    "throughput/env_steps_per_s": batch.env_steps / max(t_rollout, 1e-6),
                }
                if len(set(batch.episode_tasks)) > 1:  # per task, as the PPO learner logs it
                    for name in dict.fromkeys(batch.episode_tasks):
                        oks = [ok for ok, t in zip(batch.episode_success, batch.episode_tasks) if t == name]
                        stats[f"env/success_once/{name}"] = float(np.mean(oks))
                writer.write(stats, counters.update)
                stats.update(evaluation.on_update(loop))  # periodic: eval/success_once, ... (logged by it)
                history.append(
                    {
                        "iteration": counters.update,
                        **{k: v for k, v in stats.items() if "/" in k and not k.startswith("env/success_once/")},
                    }
                )
                if counters.update % cfg.runner.checkpoint_every == 0 and counters.update < dcfg.iterations:
                    _save_checkpoint(checkpointer, policy, optimizer, counters, model_cfg, unnorm_key)
                    data.save(run_dir / DATASET_FILE)
                bar.update(
                    task,
                    completed=counters.update,
                    info=(
                        f"beta {beta:.2f} D {len(data)} loss {loss:.4f} rollout success {success:.2f} "
                        f"gap {batch.action_gap:.3f}"
                    ),
                )
                if not bar.console.is_terminal:
                    log.info(
                        "dagger iteration %d/%d beta %.3f D %d loss %.4f rollout success %.2f expert %.2f",
                        counters.update,
                        dcfg.iterations,
                        beta,
                        len(data),
                        loss,
                        success,
                        stats["dagger/expert_fraction"],
                    )
                elapsed = time.monotonic() - t_start
                if cfg.runner.max_wall_seconds and elapsed >= cfg.runner.max_wall_seconds:
                    stopped_early = counters.update < dcfg.iterations
                    if stopped_early:
                        log.warning(
                            "runner.max_wall_seconds (%.0f s) reached after %d of %d iterations",
                            cfg.runner.max_wall_seconds,
                            counters.update,
                            dcfg.iterations,
                        )
                    break
    finally:
        t_end = time.monotonic()
        counters.wall_seconds += t_end - t_start
        env.close()
        final = _save_checkpoint(checkpointer, policy, optimizer, counters, model_cfg, unnorm_key)
        data.save(run_dir / DATASET_FILE)  # the writer stays open for the final evaluation below

    summary: dict[str, Any] = {
        "algorithm": "dagger",
        "variant": dcfg.variant,
        "method": METHOD_NAMES[dcfg.variant],
        "iterations": counters.update,
        "iterations_planned": dcfg.iterations,
        "stopped_by_wall_clock": stopped_early,
        "env_steps": counters.env_steps,
        "dataset_size": len(data),
        "samples_collected": counters.samples,
        "train_seconds": round(t_end - t_start, 1),
        "train_success_once": history[-1]["env/success_once"] if history else None,
        "checkpoint": str(final),
        "history": history,
    }
    loop.bar = None  # the bar is closed
    if cfg.eval.at_end and progress:
        print("evaluating the trained policy ...", flush=True)
    try:
        evaluation.on_end(loop, summary, completed=True)
    finally:
        writer.close()
    write_summary(run_dir, summary)
    return summary
