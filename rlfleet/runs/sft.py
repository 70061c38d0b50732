"""Supervised fine-tuning (behaviour cloning) of a policy on demonstration episodes.

Each demo step t becomes one sample: the observation at t and the next K expert actions as the
target chunk (padded with the episode's last action, as OpenVLA-OFT does near the end). The
policy's own `sft_loss` decides the objective: token cross-entropy for `tiny_oft`, the
flow-matching loss for `tiny_pi0`/`tiny_pi05`, Gaussian NLL for the MLP. Action and state
normalisation statistics come from the demos and are stored in the checkpoint under `unnorm_key`.
"""

from __future__ import annotations

import json
import logging
import time
from argparse import Namespace
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rlfleet.config import (
    SFTConfig,
    as_dict,
    load_config,
    policy_settings,
)
from rlfleet.data.demos import IMAGE_KEYS, DemoEpisode, drop_noop_frames, load_demos
from rlfleet.data.lerobot import is_lerobot_path
from rlfleet.envs.api import TEST_SEED_BASE, EnvConfig
from rlfleet.envs.registry import build_env_config, gripper_action_dims, make_env
from rlfleet.eval.episodes import evaluate_policy, report_evaluation
from rlfleet.eval.report import evaluation_mode
from rlfleet.eval.splits import eval_env_config, evaluation_record, split_seed
from rlfleet.eval.summary import print_summary
from rlfleet.policies.checkpoint_io import load_checkpoint, model_config, save_checkpoint_folder
from rlfleet.policies.registry import make_policy
from rlfleet.policies.vla.normalization import compute_norm_stats, save_norm_stats, set_norm_stats
from rlfleet.runs.collect import refuse_existing

log = logging.getLogger(__name__)


@dataclass
class SFTData:
    """Demo steps as flat arrays: the observation dict of each sample and its target chunk."""

    obs: dict[str, np.ndarray]
    actions: np.ndarray  # [N, K, D] float32
    episode: np.ndarray  # [N] int64

    def __len__(self) -> int:
        return int(self.actions.shape[0])


def action_chunks(actions: np.ndarray, chunk_size: int) -> np.ndarray:
    """[L, D] per-step actions -> [L, K, D]: row t holds a_t .. a_{t+K-1}, padded with a_{L-1}."""
    L = actions.shape[0]
    idx = np.minimum(np.arange(L)[:, None] + np.arange(chunk_size)[None, :], L - 1)
    return actions[idx]


def build_sft_data(episodes: list[Any], chunk_size: int) -> SFTData:
    """Flatten demo episodes (rlfleet.data.demos.DemoEpisode) into SFT samples."""
    if not episodes:
        raise ValueError("no demonstration episodes to train on")
    obs: dict[str, list[np.ndarray]] = {"states": [], "instructions": []}
    cameras = [k for k in IMAGE_KEYS if getattr(episodes[0], k, None) is not None]
    for key in cameras:
        obs[key] = []
    actions, index = [], []
    for i, ep in enumerate(episodes):
        L = ep.actions.shape[0]
        obs["states"].append(ep.states.astype(np.float32))
        per_step = getattr(ep, "step_instructions", None)
        obs["instructions"].append(
            per_step if per_step is not None else np.broadcast_to(ep.instruction, (L, ep.instruction.shape[-1]))
        )
        for key in cameras:
            obs[key].append(getattr(ep, key))
        actions.append(action_chunks(ep.actions.astype(np.float32), chunk_size))
        index.append(np.full(L, i, np.int64))
    return SFTData(
        {k: np.ascontiguousarray(np.concatenate(v)) for k, v in obs.items()},
        np.concatenate(actions),
        np.concatenate(index),
    )


def _shift(images: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """Random translation by up to `pad` pixels (DrQ-style pad-and-crop), uint8 in and out."""
    if pad <= 0:
        return images
    B, H, W, C = images.shape
    padded = torch.nn.functional.pad(images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    dev = images.device
    dx = torch.randint(0, 2 * pad + 1, (B,), generator=gen).to(dev)  # drawn on the CPU generator
    dy = torch.randint(0, 2 * pad + 1, (B,), generator=gen).to(dev)
    rows = (dy[:, None] + torch.arange(H, device=dev)[None, :])[:, :, None].expand(B, H, W)
    cols = (dx[:, None] + torch.arange(W, device=dev)[None, :])[:, None, :].expand(B, H, W)
    out = padded[torch.arange(B, device=dev)[:, None, None], :, rows, cols]  # [B, H, W, C]
    return out.to(torch.uint8)


def augment_images(mb: dict[str, torch.Tensor], pad: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """`_shift` every camera of a minibatch, each by its own random offsets (in place)."""
    for key in IMAGE_KEYS:
        if key in mb:
            mb[key] = _shift(mb[key], pad, gen)
    return mb


def train_sft(
    policy: torch.nn.Module, data: SFTData, cfg: SFTConfig, progress: bool = True, evaluate=None
) -> list[dict[str, float]]:
    """Minimise policy.sft_loss over random minibatches on `cfg.device`; returns the log (loss,
    eval) per report. The policy ends on the CPU, as a checkpoint it is saved to loads."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)  # on the CPU: the same minibatches on any device
    device = torch.device(cfg.device)
    policy.to(device)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(cfg.steps, 1), eta_min=cfg.lr * 0.1)
    # The demos move to the device once (a few hundred MB at most for 64 px demos); minibatches
    # are then gathered there.
    obs_t = {k: torch.from_numpy(v).to(device) for k, v in data.obs.items() if k in policy.obs_keys}
    # Running observation statistics (the MLP's) come from the demos, so the policy learns on the
    # normalised inputs it will see in RL (VLA policies: a no-op, their statistics are quantiles).
    policy.update_normalization(obs_t)
    actions_t = torch.from_numpy(data.actions).to(device)
    n = len(data)
    history: list[dict[str, float]] = []
    losses: list[float] = []
    report_every = max(1, min(100, cfg.steps // 20))
    bar = Progress(
        TextColumn("[bold]sft"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
        disable=not progress,
    )
    with bar:
        task = bar.add_task("sft", total=cfg.steps, info="")
        for step in range(1, cfg.steps + 1):
            policy.train()
            idx = torch.randint(0, n, (min(cfg.batch_size, n),), generator=gen).to(device)
            mb = {k: v[idx] for k, v in obs_t.items()}
            augment_images(mb, cfg.shift_augment, gen)
            loss = policy.sft_loss(mb, actions_t[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if step % report_every == 0 or step == cfg.steps:
                entry = {"step": step, "loss": float(np.mean(losses))}
                losses = []
                if evaluate is not None and cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.steps:
                    entry.update(evaluate(policy))
                history.append(entry)
                bar.update(task, info=f"loss {entry['loss']:.4f}")
                if not bar.console.is_terminal:  # logs and CI: progress as lines
                    log.info("sft step %d/%d loss %.4f", step, cfg.steps, entry["loss"])
            bar.update(task, advance=1)
    policy.cpu().eval()
    return history


def without_noop_frames(episodes: list[DemoEpisode], env_name: str) -> list[DemoEpisode]:
    """`sft.drop_noop_frames`: each episode without its no-op frames (rlfleet.data.demos.noop_frames)."""
    dims = gripper_action_dims(env_name)
    if dims is None:
        raise ValueError(
            f"sft.drop_noop_frames needs env {env_name!r} to declare its gripper action dims "
            "(GRIPPER_ACTION_DIMS on the env class); it does not"
        )
    out = [drop_noop_frames(ep, dims) for ep in episodes]
    before, after = sum(ep.length for ep in episodes), sum(ep.length for ep in out)
    log.info(
        "dropped %d no-op frames of %d (%.0f%%)", before - after, before, 100.0 * (before - after) / max(before, 1)
    )
    return out


def in_policy_units(episodes: list[DemoEpisode], env_cfg: EnvConfig) -> list[DemoEpisode]:
    """Episodes whose actions are in the env's own units (LeRobot datasets) with the policy's
    [-1, 1] actions instead, through the env's `policy_actions` (the gym door's inverse rescale);
    envs without one act in [-1, 1] already. Actions outside the env's bounds are refused."""
    probe = make_env(replace(env_cfg, image_size=0, wrist_camera=False), 1)
    try:
        convert = getattr(probe, "policy_actions", None)
        out = [ep if convert is None else replace(ep, actions=convert(ep.actions)) for ep in episodes]
        dim = probe.spec.action_dim
    finally:
        probe.close()
    for ep in out:
        if ep.actions.shape[1] != dim:
            raise ValueError(f"the dataset's actions have {ep.actions.shape[1]} dims, env {env_cfg.name} takes {dim}")
    worst = max(float(np.abs(ep.actions).max(initial=0.0)) for ep in out)
    if worst > 1.0 + 1e-3:
        raise ValueError(
            f"the dataset's actions reach {worst:.2f} in the policy's units: outside env {env_cfg.name}'s action "
            "bounds (is demos.features.actions the right feature?)"
        )
    return out


def run_sft(
    demos: str | Path,
    out: str | Path,
    policy_cfg: dict[str, Any],
    env_cfg: EnvConfig,
    cfg: SFTConfig,
    progress: bool = True,
    evaluation: dict[str, Any] | None = None,
    features: dict[str, Any] | None = None,
    eval_env: EnvConfig | None = None,
    eval_seed: int = TEST_SEED_BASE,
) -> dict[str, Any]:
    """Demos folder -> trained checkpoint folder (config.json, model.safetensors, norm_stats.json);
    `evaluation` (`rlfleet.eval.splits.evaluation_record`) is how the recipe evaluates it; `features`
    maps a LeRobot dataset's feature names onto rlfleet's keys (`demos.features`). The evaluations
    during training (sft.eval_every) play `eval_env` (a recipe's: `eval_env_config`, default
    `env_cfg` in the test split's held-out form) from `eval_seed` (a recipe's:
    `split_seed(cfg.eval)`), its `eval.split`."""
    torch.set_num_threads(cfg.threads)
    t0 = time.monotonic()
    cameras = ("main_images",) + (("wrist_images",) if env_cfg.wrist_camera else ()) if env_cfg.image_size else ()
    episodes = load_demos(demos, True, features, env_cfg.image_size, cameras)
    if is_lerobot_path(demos):  # its actions are in the env's units: the policy's [-1, 1] from the env's bounds
        episodes = in_policy_units(episodes, env_cfg)
    if cfg.drop_noop_frames:
        episodes = without_noop_frames(episodes, env_cfg.name)
    data = build_sft_data(episodes, env_cfg.chunk_size)
    state_dim, action_dim = data.obs["states"].shape[1], data.actions.shape[2]
    if "main_images" in data.obs and data.obs["main_images"].shape[1] != env_cfg.image_size:
        raise ValueError(
            f"demos hold {data.obs['main_images'].shape[1]}px images, the env config asks for "
            f"{env_cfg.image_size}px: collect demos at the run's image_size"
        )
    torch.manual_seed(cfg.seed)
    policy = make_policy(policy_cfg, state_dim, action_dim, env_cfg.chunk_size, image_size=env_cfg.image_size)
    missing = [k for k in policy.obs_keys if k not in data.obs]
    if missing:
        raise ValueError(
            f"the policy reads {', '.join(missing)} but the demos in {demos} hold none: "
            "collect them with the run's env settings (env.wrist_camera for wrist_images)"
        )
    # built before training, so a setting config.json cannot hold fails now, not after the last step
    config = model_config(
        dict(policy_cfg),
        state_dim,
        action_dim,
        env_cfg.chunk_size,
        dict(vars(env_cfg)),
        env_cfg.image_size,
        evaluation,
    )
    unnorm_key = policy_cfg.get("unnorm_key", "metaworld")
    stats = None
    try:
        stats = compute_norm_stats(data.actions.reshape(-1, action_dim), data.obs["states"])
        set_norm_stats(policy, stats)
    except TypeError:  # a policy without normalisation buffers (the MLP) keeps its own
        stats = None
    log.info("SFT on %d samples from %d episodes (%s)", len(data), len(episodes), demos)

    def evaluate(p):
        success = evaluate_policy(
            p, eval_env or env_cfg.held_out("test"), cfg.eval_episodes_per_task, seed=eval_seed, progress=False
        )  # inside the sft bar
        return {"eval_success_mean": float(np.mean(list(success.values())))}

    history = train_sft(policy, data, cfg, progress, evaluate)
    out = Path(out)
    save_checkpoint_folder(out, policy, config)
    if stats is not None:
        save_norm_stats(out, unnorm_key, stats)
    summary = {
        "demos": str(demos),
        "samples": len(data),
        "episodes": len(episodes),
        "steps": cfg.steps,
        "final_loss": history[-1]["loss"],
        "train_seconds": round(time.monotonic() - t0, 1),
        "history": history,
    }
    (out / "sft_log.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(args: Namespace) -> int:
    """`rlfleet sft RECIPE --demos DIR --out DIR`: behaviour-clone the recipe's policy on a demo
    dataset and write a checkpoint folder (evaluated with --eval-episodes)."""
    cfg = load_config(args.recipe, args.overrides)
    out = Path(args.out)
    refuse_existing(out, getattr(args, "overwrite", False))  # before any training
    summary = run_sft(
        args.demos,
        args.out,
        policy_settings(cfg),
        build_env_config(as_dict(cfg.env)),
        SFTConfig(**as_dict(cfg.sft)),
        # what `--eval-episodes N` plays is what a later plain `rlfleet eval CKPT` replays
        evaluation={
            **evaluation_record(cfg),
            **({"episodes_per_task": args.eval_episodes} if args.eval_episodes else {}),
        },
        features=as_dict(cfg.demos.features),
        eval_env=eval_env_config(cfg),
        eval_seed=split_seed(cfg.eval),
    )
    if args.eval_episodes:  # on the recipe's held-out evaluation env, reported as `rlfleet eval` reports
        policy, meta = load_checkpoint(args.out)
        records: list[dict] = []
        env = eval_env_config(cfg)
        seed = split_seed(cfg.eval)
        success = evaluate_policy(policy, env, args.eval_episodes, seed=seed, episode_records=records)
        summary.update(eval_success=success, eval_success_mean=sum(success.values()) / len(success))
        mode = evaluation_mode(meta["policy"], sample=False)
        report_evaluation(Path(args.out) / "eval", records, success, env, seed, mode, str(args.out), cfg.eval.split)
        print_summary(summary)
    Console().print({k: summary[k] for k in ("samples", "episodes", "steps", "final_loss", "train_seconds")})
    print(f"checkpoint: {args.out}")
    return 0
