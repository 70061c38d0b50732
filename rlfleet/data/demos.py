"""Scripted-expert demonstration datasets: the on-disk format and how to load one.

Envs that declare experts (MetaWorld, RoboTwin, CALVIN) record demonstrations through the one
collector, `rlfleet.runs.collect.collect_env_demos` (`rlfleet collect`, and the SFT bootstrap);
`rlfleet.runs.sft` behaviour-clones a policy on them before RL fine-tuning.

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
     "collect": {...},                        # the collector's arguments (episodes_per_task, seed, ...)
     "episodes": [{"id": 0, "file": "episodes/ep_000000.npz", "task": "reach-v3",
                   "instruction": "reach the goal position", "seed": 1000000, "attempt": 0,
                   "length": 52, "success": true, "success_step": 41}, ...],
     "summary": {"reach-v3": {"episodes": 10, "success": 10, "attempts": 11, "failed": 1}, ...}}

Episode ids number the kept episodes 0..N-1 in the order they were recorded. ``success_step`` is
the index t of the first step whose action led to success (``success[t]`` is the first True), -1
if the episode never succeeded. In ``summary``, ``episodes`` counts the episodes in the dataset,
``success`` the successful ones among them, ``attempts`` the expert rollouts run and ``failed``
how many of those failed (kept or not).

Each ``episodes/ep_XXXXXX.npz`` is written with ``np.savez`` (no pickled objects; load it with
``allow_pickle=False``) and holds, for an episode of L steps:

================= ================= ===========================================================
key               shape / dtype     meaning
================= ================= ===========================================================
main_images       [L,H,W,3] uint8   camera frame each action was chosen from (absent if image_size 0)
wrist_images      [L,H,W,3] uint8   gripper-camera frame, likewise (only with env.wrist_camera)
states            [L,S] float32     the env's state observation each action was chosen from
actions           [L,D] float32     expert action, clipped to [-1, 1] (what the env executed)
rewards           [L] float32       reward after each step
success           [L] bool          the env's success after each step
instruction       [128] uint8       the first instruction, `rlfleet.envs.api.encode_instructions`
step_instructions [L,128] uint8     the instruction each action was chosen under (CALVIN chains change it)
================= ================= ===========================================================

An episode stops 10 steps after its first success (so a policy also sees "hold still" frames
at the goal) or at the env's episode limit. Demo seeds start at DEMO_SEED_BASE, above every
evaluation seed (`rlfleet.eval.splits.eval_seed_range` checks it), so demos never replay an eval episode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "rlfleet-demos/1"
DEMO_SEED_BASE = 1_000_000  # first demo seed; eval seeds (10_000 + i) stay below it
ATTEMPTS_PER_EPISODE = 3  # attempt budget: episodes_per_task * 3 expert rollouts per task
IMAGE_KEYS = ("main_images", "wrist_images")  # camera observations an episode may hold


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
    wrist_images: np.ndarray | None = None  # [L, H, W, 3] uint8, only from env.wrist_camera demos
    # [L, 128] uint8: per-step instructions where they change within an episode (CALVIN chains,
    # rlfleet.runs.collect); None: `instruction` holds for every step
    step_instructions: np.ndarray | None = None

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])


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


def load_demos(
    path: str | Path,
    only_success: bool = True,
    features: dict[str, Any] | None = None,
    image_size: int = 0,
    cameras: tuple[str, ...] = ("main_images",),
) -> list[DemoEpisode]:
    """All episodes of a dataset (by default only the expert's successful ones), in id order: an
    rlfleet demo folder, or a LeRobot v3 dataset (a folder with meta/info.json or
    hf://datasets/ORG/NAME, read with `features` as its feature-name mapping, `cameras` decoded
    at `image_size`; see rlfleet.data.lerobot)."""
    from rlfleet.data import lerobot  # it builds DemoEpisodes from this module: imported when used

    if lerobot.is_lerobot_path(path):
        episodes = lerobot.read_lerobot(path, features, image_size, cameras)
        return [ep for ep in episodes if ep.success or not only_success]
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
                wrist_images=arrays.get("wrist_images"),
                step_instructions=arrays.get("step_instructions"),
            )
        )
    return episodes


# --- no-op frames ------------------------------------------------------------------------------


def noop_frames(
    actions: np.ndarray, gripper_dims: tuple[int, ...], keep_from: int = -1, tol: float = 1e-3
) -> np.ndarray:
    """[L] bool: frames whose action moves nothing (every dim outside `gripper_dims` within `tol`
    of 0) and repeats the previous frame's gripper commands. A waypoint expert emits them while
    the arm catches up with its target; the state does not show that lag, so behaviour cloning
    learns to stop at the waypoints (OpenVLA filters no-op actions from its datasets likewise).
    The first frame, and every frame from `keep_from` on (>= 0: the first success, so the "hold
    still" frames after it stay), are never no-ops."""
    actions = np.asarray(actions)
    if actions.ndim != 2:
        raise ValueError(f"actions must be [L, action_dim], got shape {actions.shape}")
    dims = actions.shape[1]
    if any(not 0 <= d < dims for d in gripper_dims):
        raise ValueError(f"gripper dims {list(gripper_dims)} outside the {dims} action dims")
    motion = [d for d in range(dims) if d not in gripper_dims]
    grip = list(gripper_dims)
    noop = np.abs(actions[:, motion]).max(axis=1, initial=0.0) <= tol
    noop[1:] &= (actions[1:, grip] == actions[:-1, grip]).all(axis=1)
    noop[:1] = False
    if keep_from >= 0:
        noop[keep_from:] = False
    return noop


def drop_noop_frames(episode: DemoEpisode, gripper_dims: tuple[int, ...]) -> DemoEpisode:
    """The episode without its no-op frames (see `noop_frames`), `success_step` moved to match."""
    noop = noop_frames(episode.actions, gripper_dims, keep_from=episode.success_step)
    if not noop.any():
        return episode
    keep = ~noop

    def cut(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[keep]

    return replace(
        episode,
        states=episode.states[keep],
        actions=episode.actions[keep],
        rewards=episode.rewards[keep],
        step_success=episode.step_success[keep],
        main_images=cut(episode.main_images),
        wrist_images=cut(episode.wrist_images),
        step_instructions=cut(episode.step_instructions),
        success_step=int(keep[: episode.success_step].sum()) if episode.success_step >= 0 else -1,
    )
