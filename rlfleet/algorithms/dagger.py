"""DAgger and HG-DAgger: the formula-level pieces (beta schedule, policy mixing, intervention gate,
aggregation window). The training loop that uses them is `rlfleet.runs.dagger`.

DAgger (Ross, Gordon & Bagnell 2011, *A Reduction of Imitation Learning and Structured Prediction
to No-Regret Online Learning*, Algorithm 3.1), with the expert pi* and the student pi_hat::

    pi_i        = beta_i * pi* + (1 - beta_i) * pi_hat_i          roll out the mixture
    D_i         = {(s, pi*(s)) : s visited by pi_i}                label EVERY visited state
    D           = D  u  D_i                                        aggregate
    pi_hat_i+1  = argmin_pi  E_{(s, a*) ~ D} [ loss(pi(s), a*) ]   supervised step

HG-DAgger (Kelly, Sidrane, Driggs-Campbell & Kochenderfer 2019, *HG-DAgger: Interactive Imitation
Learning with Human Experts*): the student drives; an expert takes over where it judges the student
is going wrong, and ONLY the states where the expert was in control are added to D.

Here decisions are made per action chunk of K steps (one policy query), the chunk analogue of
Ross et al.'s per-step mixture. See docs/algorithms.md for the formula-to-function map.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VARIANTS = ("dagger", "hg_dagger")
BETA_SCHEDULES = ("exponential", "linear")


@dataclass
class DAggerConfig:
    """The `dagger:` section of a run config (plain types: usable as an OmegaConf structured config)."""

    enabled: bool = False  # true: `rlfleet train` runs DAgger (rlfleet.runs.dagger) instead of the PPO fleet
    variant: str = "dagger"  # dagger | hg_dagger
    iterations: int = 10  # rollout + train rounds
    num_envs: int = 10  # N envs rolled out in parallel (one in-process batch) per iteration
    episodes_per_env: int = 1  # full episodes each env runs per iteration
    beta0: float = 1.0  # probability that the expert executes a chunk at iteration 0
    beta_schedule: str = "exponential"  # exponential: beta0 * decay^i | linear: beta0 * max(0, 1 - i / linear_iters)
    beta_decay: float = 0.5  # exponential; 0 gives Ross et al.'s beta_0 = beta0, beta_i>0 = 0
    beta_linear_iters: int = 10  # linear: iterations until beta reaches 0
    # hg_dagger: the expert takes over a chunk when ||a_student[0] - a_expert||_2 > hg_threshold
    # (env units, first action of the chunk); null: only the random beta_i takeovers
    hg_threshold: float | None = 0.5
    window: int = 20000  # aggregated dataset keeps the newest W samples (0: all of them)
    include_demos: bool = True  # seed D with the run's demo dataset (the SFT data) when it exists
    train_steps: int = 200  # S: optimiser steps on D per iteration
    batch_size: int = 64
    lr: float = 1.0e-4
    weight_decay: float = 1.0e-4
    max_grad_norm: float = 1.0
    shift_augment: int = 2  # random image shift in pixels, as in SFT (0: off)
    student_deterministic: bool = True  # the student acts as it is evaluated (no exploration noise)
    eval_every: int = 0  # iterations between simulator evaluations during training (0: only before/after)
    eval_episodes_per_task: int = 5  # for eval_every
    device: str = "cpu"  # where the student acts, trains and is evaluated (cuda on a GPU host)
    threads: int = 1  # torch threads (1 is fastest on a small, busy CPU: the envs render on the same cores)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"dagger.variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"dagger.beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}")
        if not 0.0 <= self.beta0 <= 1.0:
            raise ValueError(f"dagger.beta0 must be in [0, 1], got {self.beta0}")
        if not 0.0 <= self.beta_decay <= 1.0:
            raise ValueError(f"dagger.beta_decay must be in [0, 1], got {self.beta_decay}")
        if self.beta_linear_iters < 1:
            raise ValueError(f"dagger.beta_linear_iters must be >= 1, got {self.beta_linear_iters}")
        if self.hg_threshold is not None and self.hg_threshold < 0:
            raise ValueError(f"dagger.hg_threshold must be >= 0 (or null), got {self.hg_threshold}")
        for name in ("iterations", "num_envs", "episodes_per_env", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"dagger.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("window", "train_steps", "eval_every", "shift_augment"):
            if getattr(self, name) < 0:
                raise ValueError(f"dagger.{name} must be >= 0, got {getattr(self, name)}")


def beta_schedule(
    iteration: int, beta0: float, schedule: str = "exponential", decay: float = 0.5, linear_iters: int = 10
) -> float:
    """Expert-control probability at iteration i (0-based).

    exponential (Ross et al. 2011, sec. 3: beta_i = p^(i-1) with 1-based i)::

        beta_i = beta0 * decay^i            decay = 0: beta_0 = beta0, then 0 (their best variant)

    linear::

        beta_i = beta0 * max(0, 1 - i / linear_iters)
    """
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    if schedule == "exponential":
        return float(beta0 * decay**iteration)  # 0.0 ** 0 == 1.0
    if schedule == "linear":
        return float(beta0 * max(0.0, 1.0 - iteration / linear_iters))
    raise ValueError(f"unknown beta schedule {schedule!r} (choose {', '.join(BETA_SCHEDULES)})")


def mix_policies(rng: np.random.Generator, beta: float, n: int) -> np.ndarray:
    """DAgger's mixture pi_i = beta_i pi* + (1 - beta_i) pi_hat_i, decided per chunk::

        expert executes chunk j  <=>  u_j < beta_i,    u_j ~ U[0, 1)   (independent per env and chunk)

    so E[fraction of expert chunks] = beta_i. Returns the bool mask [n].
    """
    return rng.random(n) < beta


def intervention_gate(student_actions: np.ndarray, expert_actions: np.ndarray, threshold: float | None) -> np.ndarray:
    """HG-DAgger's takeover rule, a stand-in for the human judging the student "unsafe"::

        g = 1[ ||a_hat_t - a*_t||_2 > tau ]

    with a_hat_t the student's FIRST action of the chunk it proposes at s_t, a*_t = pi*(s_t)
    (env units, [B, D] each) and tau = `threshold`; None disables the gate (all False).
    """
    student_actions = np.asarray(student_actions, np.float32)
    expert_actions = np.asarray(expert_actions, np.float32)
    if student_actions.shape != expert_actions.shape:
        raise ValueError(f"student {student_actions.shape} and expert {expert_actions.shape} actions differ in shape")
    if threshold is None:
        return np.zeros(student_actions.shape[0], bool)
    return action_gap(student_actions, expert_actions) > threshold


def action_gap(student_actions: np.ndarray, expert_actions: np.ndarray) -> np.ndarray:
    """||a_hat - a*||_2 per row: how far the student is from the expert at the states it visits."""
    return np.linalg.norm(np.asarray(student_actions, np.float32) - np.asarray(expert_actions, np.float32), axis=-1)


def expert_control(variant: str, mixed: np.ndarray, gated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Who executes each chunk and which visited states enter D, per variant::

        dagger:     execute expert <=> u < beta_i;             keep every state (labels from pi*)
        hg_dagger:  execute expert <=> u < beta_i  or  g = 1;  keep only expert-executed states

    Returns (use_expert [B] bool, keep [B] bool).
    """
    mixed, gated = np.asarray(mixed, bool), np.asarray(gated, bool)
    if variant == "dagger":
        return mixed, np.ones_like(mixed)
    if variant == "hg_dagger":
        use_expert = mixed | gated
        return use_expert, use_expert.copy()
    raise ValueError(f"unknown DAgger variant {variant!r} (choose {', '.join(VARIANTS)})")


class AggregatedDataset:
    """D = D_0 u D_1 u ... bounded to the newest `window` samples (FIFO; window 0 keeps all)::

        D  <-  last_W( D  u  D_i )

    Each sample is an observation dict row and its [K, D] expert action chunk, tagged with the
    iteration that collected it (-1 for demos). Rows are kept in arrival order.
    """

    def __init__(self, window: int):
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        self.window = window
        self._parts: list[tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]] = []
        self._cache: tuple[dict[str, np.ndarray], np.ndarray, np.ndarray] | None = None
        self.total_added = 0
        self.total_evicted = 0

    def __len__(self) -> int:
        return sum(len(a) for _, a, _ in self._parts)

    def add(self, obs: dict[str, np.ndarray], actions: np.ndarray, iteration: int) -> int:
        """Append samples; returns how many old ones were evicted to respect the window."""
        n = len(actions)
        if any(len(v) != n for v in obs.values()):
            raise ValueError("every observation array needs one row per action chunk")
        if self._parts and set(obs) != set(self._parts[0][0]):
            raise ValueError(f"observation keys {sorted(obs)} differ from the dataset's {sorted(self._parts[0][0])}")
        if n:
            self._parts.append(
                (
                    {k: np.asarray(v) for k, v in obs.items()},
                    np.asarray(actions, np.float32),
                    np.full(n, iteration, np.int64),
                )
            )
            self._cache = None
        self.total_added += n
        return self._trim()

    def _trim(self) -> int:
        """Evict the oldest rows beyond the window; returns how many."""
        evicted = 0
        excess = len(self) - self.window if self.window else 0
        while excess > 0:
            part_obs, part_act, part_it = self._parts[0]
            if len(part_act) <= excess:  # drop the whole oldest part
                self._parts.pop(0)
                excess -= len(part_act)
                evicted += len(part_act)
            else:  # trim its oldest rows
                self._parts[0] = ({k: v[excess:] for k, v in part_obs.items()}, part_act[excess:], part_it[excess:])
                evicted += excess
                excess = 0
            self._cache = None
        self.total_evicted += evicted
        return evicted

    def arrays(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """(obs dict, actions [M, K, D], iteration [M]) as contiguous arrays, oldest first."""
        if not self._parts:
            raise ValueError("the aggregated dataset is empty")
        if self._cache is None:
            keys = list(self._parts[0][0])
            obs = {k: np.ascontiguousarray(np.concatenate([p[0][k] for p in self._parts])) for k in keys}
            actions = np.concatenate([p[1] for p in self._parts])
            its = np.concatenate([p[2] for p in self._parts])
            self._parts = [(obs, actions, its)]  # one part from now on: no second copy
            self._cache = self._parts[0]
        return self._cache

    def save(self, path: str | Path) -> None:
        """Write as .npz (no pickle), atomically: `obs.<key>`, `actions`, `iteration`, counters."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        arrays: dict[str, np.ndarray] = {
            "window": np.asarray(self.window),
            "total_added": np.asarray(self.total_added),
            "total_evicted": np.asarray(self.total_evicted),
        }
        if self._parts:
            obs, actions, its = self.arrays()
            arrays.update({f"obs.{k}": v for k, v in obs.items()}, actions=actions, iteration=its)
        with open(tmp, "wb") as f:
            # numpy's stub types savez's allow_pickle keyword, which **arrays could in principle name
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path, window: int | None = None) -> AggregatedDataset:
        """Read a dataset written by `save`; `window` (if given) replaces the stored bound."""
        with np.load(path, allow_pickle=False) as z:
            data = cls(int(z["window"]) if window is None else window)
            if "actions" in z.files:
                obs = {k[len("obs.") :]: z[k] for k in z.files if k.startswith("obs.")}
                its = z["iteration"]
                data._parts = [(obs, z["actions"], its)]
                data._cache = None
            data.total_added = int(z["total_added"])
            data.total_evicted = int(z["total_evicted"])
        data._trim()  # a smaller window than the saved one
        return data


def chunks_per_episode(max_episode_steps: int, chunk_size: int) -> int:
    """Chunk steps an episode takes: ceil(T / K) (the last chunk is cut short by the time limit)."""
    return math.ceil(max_episode_steps / chunk_size)
