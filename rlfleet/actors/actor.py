"""The actor process: env workers + inference client + segment assembly + learner link.

Pipelining (Sample Factory's double buffering): envs are split in S stages; while the workers
step stage s, the inference server computes actions for stage s+1, so neither waits.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rlfleet.actors.env_worker import EnvWorkerPool
from rlfleet.actors.groups import GroupedResets
from rlfleet.actors.inference_client import InferenceError, StopWaiting
from rlfleet.actors.inference_failover import connect_fleet
from rlfleet.actors.learner_client import LearnerClient
from rlfleet.actors.rollout import SegmentBuilder
from rlfleet.algorithms.estimators import episode_schedule
from rlfleet.config import as_dict
from rlfleet.envs.core import resumed_stream_seeds, training_stream
from rlfleet.envs.registry import build_env_config
from rlfleet.envs.run_shapes import run_slot_layout
from rlfleet.telemetry.profiling import profiled
from rlfleet.wire.run_spec import RunSpec
from rlfleet.wire.segment import Segment

log = logging.getLogger(__name__)


@dataclass
class ActorStats:
    env_steps: int
    segments: int
    seconds: float


@dataclass
class ActorCounters:
    """Live counts for the metrics endpoint: written by the actor loop, read by scrapes (plain ints)."""

    env_steps: int = 0
    segments: int = 0
    episodes: int = 0
    successes: int = 0

    def add_segment(self, segment: Segment) -> None:
        self.segments += 1
        self.episodes += len(segment.ep_success)
        self.successes += int(segment.ep_success.sum())


def run_actor(
    cfg: DictConfig,
    spec: RunSpec,
    actor_index: int,
    client_id: str,
    learner_address: str,
    inference_address: str,
    stop_event: threading.Event | None = None,
    counters: ActorCounters | None = None,
    restarts: int = 0,
) -> ActorStats:
    """`spec`: the learner's run spec (slot shapes, a resumed run's env steps); `restarts`: how
    often this client id registered with the learner before (a restarted process plays a new
    episode stream, rlfleet.envs.core.training_stream)."""
    with profiled("actor"):
        return _run_actor(
            cfg, spec, actor_index, client_id, learner_address, inference_address, stop_event, counters, restarts
        )


def _run_actor(
    cfg: DictConfig,
    spec: RunSpec,
    actor_index: int,
    client_id: str,
    learner_address: str,
    inference_address: str,
    stop_event: threading.Event | None,
    counters: ActorCounters | None,
    restarts: int,
) -> ActorStats:
    a = cfg.actor
    E, S = a.num_envs, a.pipeline_stage_num
    schedule = episode_schedule(cfg.algorithm, cfg.env, a)  # segment length, groups of envs reset alike
    T = schedule.segment_len
    stop_event = stop_event or threading.Event()
    counters = counters if counters is not None else ActorCounters()
    fleet = max(cfg.env.get("fleet_envs", 0), a.num_actors * E, (actor_index + 1) * E)  # actors beyond num_actors too
    env = {**as_dict(cfg.env), "fleet_envs": fleet}
    layout = run_slot_layout(build_env_config(as_dict(cfg.env)), spec, E)
    pool = EnvWorkerPool(env, E, a.num_workers, S, layout, env_offset=actor_index * E)
    if a.num_workers == 0 and S > 1 and not schedule.group_size:
        log.info(
            "actor %s steps its envs itself in %d pipeline stages: a stage's step overlaps no other "
            "here, and actor.pipeline_stage_num=1 halves the inference requests per env step",
            client_id,
            S,
        )
    learner = inference = None
    segments, steps, t0 = 0, 0, time.monotonic()

    def stopping() -> bool:
        return stop_event.is_set() or (
            learner is not None and (learner.stop_requested.is_set() or learner.failed.is_set())
        )

    try:
        learner = LearnerClient(learner_address, client_id, a.send_queue_size, cfg.learner.weight_chunk_bytes)
        # one address, or several ("h1:p1,h2:p2") to spread requests over and fail over between
        inference = connect_fleet(
            a.transport, inference_address, pool.slots, client_id, stopping, OmegaConf.to_object(a.failover)
        )
        # A resumed run's or a restarted actor's envs start a new episode stream, not replay an earlier life's.
        stream = training_stream(spec.resumed_from_env_steps, restarts)
        if stream:
            log.info("actor %s: its envs start training episode stream %d (restart %d)", client_id, stream, restarts)
        pool.reset(resumed_stream_seeds(cfg.env.seed, actor_index * E, E, stream) if stream > 0 else None)
        rows = pool.stage_rows
        resets = None
        if schedule.group_size:  # the first reset told us each row's task; now reset every group to one seed
            resets = GroupedResets(
                rows, np.array(pool.slots["task_ids"]), schedule.group_size, cfg.env.seed, actor_index, stream
            )
            pool.reset(resets.all_seeds())
        builders = [
            SegmentBuilder(T, lo, hi, pool.layout, resets.groups[s].group_ids if resets else None)
            for s, (lo, hi) in enumerate(rows)
        ]

        acted = [-1] * S  # each stage's latest actions' policy version (its credit requests tell it)

        def launch(s: int) -> None:
            version = inference.wait(s)
            acted[s] = version
            builders[s].record_policy(pool.slots, version)
            if resets is not None and builders[s].t == T - 1:  # a segment's last step: reset after it
                seeds = np.zeros(E, np.int64)
                resets.next_seeds(s, seeds)
                pool.step_async(s, reset_seeds=seeds)
            else:
                pool.step_async(s)

        # learner.flow_control: pace: a segment starts only when the learner could train it within
        # max_policy_lag (rlfleet.learner.pacing), so nothing is stepped only to be masked as too old
        paced = cfg.learner.get("flow_control", "pace") == "pace"

        def start_segment(s: int) -> None:
            if paced:
                learner.await_credit(T * (rows[s][1] - rows[s][0]), stopping, acted[s])
            inference.submit(s, *rows[s])

        for s in range(S):
            start_segment(s)
        launch(0)
        s = 0
        t0 = time.monotonic()
        log.info("actor %s stepping %d envs in %d stages", client_id, E, S)
        while not stopping():
            nxt = (s + 1) % S
            if nxt != s:
                launch(nxt)  # queued in the workers behind stage s: they never idle
            pool.step_wait(s)
            steps += builders[s].record_step(pool.slots)  # simulated substeps, the same count segments carry
            counters.env_steps = steps
            learner.env_steps = steps
            learner.env_faults = pool.env_faults
            if builders[s].full:
                segment = builders[s].finish(pool.slots)
                learner.push(segment)
                segments += 1
                counters.add_segment(segment)
                start_segment(s)  # the observation after its last step is the next segment's first
            else:
                inference.submit(s, *rows[s])
            if nxt == s:
                launch(s)
            s = nxt
    except (StopWaiting, InferenceError):
        if not stopping():  # the server went away while the run goes on: a real failure
            raise
    finally:
        if pool.env_faults:
            log.warning("actor %s: remote simulator faults %s", client_id, pool.env_faults)
        if learner is not None:
            learner.close()
        if inference is not None:
            inference.close()
        pool.close()
    return ActorStats(steps, segments, time.monotonic() - t0)
