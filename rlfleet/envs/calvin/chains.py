"""Chains of 5 subtasks and the disjoint train / eval pools they are drawn from.

A `ChainSpec` is an (initial-state seed, 5 subtask names) pair. `sample_chain` walks the symbolic
state forward (CALVIN's multistep sampler): at each position it picks among the subtasks whose
precondition holds, uniformly over kinds (drawer, slider, led, lightbulb, lift, push, rotate,
stack, unstack, place) and then over the subtasks of that kind, so the 15 block subtasks do not
crowd out the 8 articulated ones; dead ends (lifting a block when nothing could follow) are
backtracked out of. Everything is numpy + hashlib, deterministic given the seed.

Pools. Which split a chain belongs to depends on the 5-tuple of names alone (sha256 of the names,
one in `EVAL_EVERY` to eval), so no chain, and hence no (initial state, chain) pair, is in both
pools. Entry `i` of a pool tries candidate initial-state seeds derived from (split, i, attempt)
until the sampled chain hashes into that split: entries are random-access (no pool has to be
built up front), reproducible, and distinct with overwhelming probability (63-bit seeds;
`build_pool` checks). `pool_entry("eval", i)` for i < EVAL_POOL_SIZE is the evaluation (test)
set (1000 chains, as CALVIN's). The `validation` pool (for choices made by looking at success)
draws held-out chains as the eval pool does, from its own initial-state seeds: its (initial
state, chain) pairs are in neither the train pool (other chains) nor the eval pool (other
seeds; `check_pools_disjoint` checks the entries a run plays).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rlfleet.envs.calvin.subtasks import SUBTASK_NAMES, SUBTASKS
from rlfleet.envs.calvin.symbolic import SymState, sample_initial_state

CHAIN_LENGTH = 5
EVAL_EVERY = 5  # one chain in 5 (by hash of its subtask names) belongs to the eval split
TRAIN_POOL_SIZE = 100_000
EVAL_POOL_SIZE = 1000
POOLS = ("train", "eval", "validation")
VALIDATION_POOL_SIZE = EVAL_POOL_SIZE


@dataclass(frozen=True)
class ChainSpec:
    """An episode: the initial scene (from `init_seed`) and the subtasks to do in order."""

    init_seed: int
    subtasks: tuple[str, ...]

    def initial_state(self) -> SymState:
        return sample_initial_state(self.init_seed)

    def plan(self) -> list[SymState]:
        """Symbolic states before subtask 0, ..., after the last subtask (length + 1 states)."""
        states = [self.initial_state()]
        for name in self.subtasks:
            states.append(SUBTASKS[name].effect(states[-1]))
        return states


def is_feasible(state: SymState, chain: tuple[str, ...] | list[str]) -> bool:
    """Every subtask's precondition holds in the state the previous ones leave."""
    for name in chain:
        task = SUBTASKS[name]
        if not task.precondition(state):
            return False
        state = task.effect(state)
    return True


def sample_chain(state: SymState, rng: np.random.Generator, length: int = CHAIN_LENGTH) -> tuple[str, ...] | None:
    """A random feasible chain from `state` (uniform choice per position, with backtracking), or None."""
    if length == 0:
        return ()
    options = [n for n in SUBTASK_NAMES if SUBTASKS[n].precondition(state)]
    kinds = Counter(SUBTASKS[n].kind for n in options)
    weights = np.array([1.0 / kinds[SUBTASKS[n].kind] for n in options])
    keys = rng.random(len(options)) ** (1.0 / weights)  # weighted order without replacement
    for i in np.argsort(-keys):
        name = options[i]
        rest = sample_chain(SUBTASKS[name].effect(state), rng, length - 1)
        if rest is not None:
            return (name, *rest)
    return None


def chain_split(chain: tuple[str, ...]) -> str:
    """ "eval" or "train", from the subtask names only."""
    digest = hashlib.sha256("|".join(chain).encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "little") % EVAL_EVERY == 0 else "train"


def _seed(split: str, index: int, attempt: int) -> int:
    digest = hashlib.sha256(f"calvin:{split}:{index}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits


@lru_cache(maxsize=65536)
def pool_entry(split: str, index: int) -> ChainSpec:
    """Entry `index` of the `split` pool (see the module docstring)."""
    if split not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {split!r}")
    if index < 0:
        raise ValueError(f"pool index must be >= 0, got {index}")
    for attempt in range(10_000):
        seed = _seed(split, index, attempt)
        chain = sample_chain(sample_initial_state(seed), np.random.default_rng([seed, 1]))
        # validation entries are held-out chains too (as the test set's), on their own seeds
        if chain is not None and chain_split(chain) == ("eval" if split == "validation" else split):
            return ChainSpec(seed, chain)
    raise RuntimeError(f"no {split} chain found for entry {index}")  # pragma: no cover


def pool_size(split: str) -> int:
    return {"eval": EVAL_POOL_SIZE, "validation": VALIDATION_POOL_SIZE}.get(split, TRAIN_POOL_SIZE)


def check_pools_disjoint(eval_indices: Iterable[int], validation_indices: Iterable[int]) -> None:
    """One line (ValueError) if a validation entry played is also an eval (test) entry played;
    train chains are other chains by construction."""
    test = {pool_entry("eval", i % EVAL_POOL_SIZE) for i in eval_indices}
    for i in validation_indices:
        if pool_entry("validation", i % VALIDATION_POOL_SIZE) in test:
            raise ValueError(f"CALVIN validation chain {i} is also a test (eval pool) chain: the splits overlap")


def build_pool(split: str, size: int) -> list[ChainSpec]:
    """The first `size` entries of a pool, checked to be distinct (init seed, chain) pairs."""
    pool = [pool_entry(split, i) for i in range(size)]
    if len(set(pool)) != len(pool):
        raise RuntimeError(f"duplicate entries in the first {size} of the {split} pool")  # pragma: no cover
    return pool
