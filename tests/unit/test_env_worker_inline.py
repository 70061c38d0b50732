"""`actor.num_workers: 0`: the actor steps its envs itself. Every slot it writes must be what the
worker processes write, step for step, with episode ends, resets by seed and the GRPO step_reset."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.actors.env_worker import EnvMakeError, EnvWorkerPool
from rlfleet.envs.api import observation_spec
from rlfleet.envs.registry import build_env_config
from rlfleet.wire.slots import slot_layout

ENV = {"name": "bench", "task": "state_dim=5,action_dim=2", "max_episode_steps": 3, "seed": 7}
E, S = 8, 2


def _run(workers: int) -> list[dict[str, np.ndarray]]:
    cfg = build_env_config(ENV)
    layout = slot_layout(E, observation_spec(cfg, 5), 2, 1)
    pool = EnvWorkerPool(ENV, E, workers, S, layout, env_offset=16)
    rng = np.random.default_rng(0)
    seen = []
    try:
        pool.reset(np.arange(100, 100 + E))
        seen.append({k: np.array(pool.slots[k]) for k in pool.slots.layout})
        for i in range(8):
            stage = i % S
            lo, hi = pool.stage_rows[stage]
            pool.slots["actions"][lo:hi] = rng.uniform(-1, 1, (hi - lo, 1, 2))
            seeds = np.arange(200 + i * E, 200 + (i + 1) * E) if i == 5 else None
            pool.step_async(stage, reset_seeds=seeds)
            pool.step_wait(stage)
            seen.append({k: np.array(pool.slots[k]) for k in pool.slots.layout})
        assert pool.env_faults == {}
    finally:
        pool.close()
    return seen


def test_in_process_envs_write_what_the_worker_processes_write():
    inline, workers = _run(0), _run(2)
    assert len(inline) == len(workers)
    for step, (a, b) in enumerate(zip(inline, workers)):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{key} after step {step}")
    assert any(s["episode_done"].any() for s in inline)  # episodes of 3 steps ended within the 8


def test_in_process_envs_that_cannot_be_made_say_why_in_one_line():
    bad = {**ENV, "task": "state_dim=-1"}
    layout = slot_layout(E, observation_spec(build_env_config(ENV), 5), 2, 1)
    with pytest.raises((EnvMakeError, ValueError)) as err:
        EnvWorkerPool(bad, E, 0, S, layout)
    assert "\n" not in str(err.value)
