"""The actor process: env workers + inference client + segment assembly + learner link.

Pipelining (Sample Factory's double buffering): envs are split in S stages; while the workers
step stage s, the inference server computes actions for stage s+1, so neither waits.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from omegaconf import DictConfig

from rlfleet.actors.env_worker import EnvWorkerPool
from rlfleet.actors.inference_client import InferenceError, StopWaiting, connect_inference
from rlfleet.actors.learner_client import LearnerClient
from rlfleet.actors.rollout import SegmentBuilder
from rlfleet.config import as_dict, run_slot_layout

log = logging.getLogger(__name__)


@dataclass
class ActorStats:
    env_steps: int
    segments: int
    seconds: float


def run_actor(cfg: DictConfig, actor_index: int, client_id: str, learner_address: str, inference_address: str,
              stop_event: threading.Event | None = None) -> ActorStats:
    a = cfg.actor
    E, S, T, K = a.num_envs, a.pipeline_stage_num, a.rollout_len, cfg.env.chunk_size
    stop_event = stop_event or threading.Event()
    pool = EnvWorkerPool(as_dict(cfg.env), E, a.num_workers, S, run_slot_layout(cfg, E), env_offset=actor_index * E)
    learner = inference = None
    segments, steps, t0 = 0, 0, time.monotonic()

    def stopping() -> bool:
        return stop_event.is_set() or (learner is not None and (learner.stop_requested.is_set() or learner.failed.is_set()))

    try:
        learner = LearnerClient(learner_address, client_id, a.send_queue_size, cfg.learner.weight_chunk_bytes)
        inference = connect_inference(a.transport, inference_address, pool.slots, client_id, stopping)
        pool.reset()
        rows = pool.stage_rows
        builders = [SegmentBuilder(T, lo, hi, pool.layout) for lo, hi in rows]

        def launch(s: int) -> None:
            version = inference.wait(s)
            builders[s].record_policy(pool.slots, version)
            pool.step_async(s)

        for s in range(S):
            inference.submit(s, *rows[s])
        launch(0)
        s = 0
        t0 = time.monotonic()
        log.info("actor %s stepping %d envs in %d stages", client_id, E, S)
        while not stopping():
            nxt = (s + 1) % S
            if nxt != s:
                launch(nxt)  # queued in the workers behind stage s: they never idle
            pool.step_wait(s)
            builders[s].record_step(pool.slots)
            steps += (rows[s][1] - rows[s][0]) * K
            learner.env_steps = steps
            if builders[s].full:
                learner.push(builders[s].finish(pool.slots))
                segments += 1
            inference.submit(s, *rows[s])
            if nxt == s:
                launch(s)
            s = nxt
    except (StopWaiting, InferenceError):
        if not stopping():  # the server went away while the run goes on: a real failure
            raise
    finally:
        if learner is not None:
            learner.close()
        if inference is not None:
            inference.close()
        pool.close()
    return ActorStats(steps, segments, time.monotonic() - t0)
