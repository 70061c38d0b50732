"""The learner role's main: serve LearnerService, train on what arrives, publish, checkpoint, evaluate.

The training loop calls its observers (`rlfleet.eval.service.LoopObserver`) when it starts, after
each update and at its end; `run_learner` registers the run's `EvaluationService` (periodic and
final evaluations), and writes summary.json once, with every observer's fields.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
import uuid
from argparse import Namespace
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import DictConfig
from safetensors.torch import save as st_save

from rlfleet.algorithms.estimators import episode_schedule
from rlfleet.config import (
    as_dict,
    load_config,
    to_yaml,
)
from rlfleet.envs.registry import build_env_config, scored_chain_length, task_list
from rlfleet.envs.run_shapes import probe_env_dims, run_observation_spec
from rlfleet.eval.service import EvaluationService, LoopObserver, PeriodicEval
from rlfleet.eval.splits import eval_env_config, eval_seed_range, evaluation_record
from rlfleet.eval.summary import print_summary, write_summary
from rlfleet.learner.batches import samples, take_batch
from rlfleet.learner.checkpointer import Checkpointer, TrainerCounters, run_info
from rlfleet.learner.distributed import Ranks, SingleRank, join_ranks
from rlfleet.learner.follower import run_follower
from rlfleet.learner.ingest import IngestedSegment, IngestQueue
from rlfleet.learner.losses import LossLedger
from rlfleet.learner.metrics import EpisodeWindow, MetricsWriter, TrainProgress
from rlfleet.learner.pacing import SampleCredits
from rlfleet.learner.service import LearnerServicer, segment_byte_limit
from rlfleet.learner.trainer import Trainer, ppo_config
from rlfleet.learner.weight_publisher import WeightPublisher, tensor_digests
from rlfleet.policies.base import Policy
from rlfleet.policies.checkpoint_io import cpu_state_dict, model_config, policy_from_config, reference_policy
from rlfleet.policies.pinning import pinned_policy_settings
from rlfleet.telemetry.profiling import profiled
from rlfleet.telemetry.prometheus import LearnerCollector, MetricsPortError, start_role_metrics
from rlfleet.wire.gen import learner_pb2_grpc
from rlfleet.wire.grpc_decoding import add_servicer
from rlfleet.wire.grpc_server import start_grpc_server
from rlfleet.wire.join import EXIT_INTERRUPTED, write_address
from rlfleet.wire.life_ledger import mark_reported, read_account, unreported
from rlfleet.wire.run_spec import RunSpec, write_run_spec
from rlfleet.wire.segment import Segment

log = logging.getLogger(__name__)


def built_run_spec(
    state_dim: int, action_dim: int, policy: torch.nn.Module, settings: dict[str, Any], model_path: str
) -> RunSpec:
    """The run spec of a learner that built `policy` from `settings` (the checkpoint's own settings
    where it started from one, `model_path` pinned): its log-prob shape and extra outputs size the
    actors' slots and the segments they push; the settings build every other copy of it."""
    declared = cast(Policy, policy)  # every registered policy implements the protocol; nn.Module cannot say so
    return RunSpec(
        state_dim=state_dim,
        action_dim=action_dim,
        logprob_shape=tuple(declared.logprob_shape),
        extra_outputs={name: tuple(shape) for name, (shape, _) in declared.extra_outputs.items()},
        policy={**settings, **({"model_path": model_path} if model_path else {})},
    )


RUN_OUTPUTS = ("checkpoints", "tensorboard", "summary.json", "episodes.jsonl", "periodic_eval")
"""What the learner writes in a run folder, which a fresh run in the same folder moves aside."""
START_OUTPUTS = ("eval_before.json", "eval_before_split.txt", "eval_chain_before.json", "episodes_before.jsonl")
"""The starting policy's evaluation, written before the learner starts: `rlfleet train` and DAgger
move an earlier run's aside with RUN_OUTPUTS before they evaluate their start."""


def archive_previous_run(run_dir: Path, names: tuple[str, ...] = RUN_OUTPUTS) -> Path | None:
    """A fresh run in a used folder: move the old run's outputs (`names`) aside instead of mixing them."""
    old = [run_dir / n for n in names if (run_dir / n).exists()]
    if not old:
        return None
    dest = run_dir / "previous" / time.strftime("%Y%m%d-%H%M%S")
    dest.mkdir(parents=True, exist_ok=True)
    for path in old:
        path.rename(dest / path.name)
    log.warning("%s held an earlier run; moved its outputs to %s (use --resume to continue it)", run_dir, dest)
    return dest


@dataclasses.dataclass(frozen=True)
class _LoopLimits:
    batch_samples: int
    total_env_steps: int
    max_wall_seconds: float


class Learner:
    """The learner's training loop (a `rlfleet.eval.service.TrainingLoop` to its observers)."""

    def __init__(
        self, cfg: DictConfig, run_dir: Path, ranks: Ranks | None = None, observers: Sequence[LoopObserver] = ()
    ):
        self.cfg = cfg
        self._limits_cache: _LoopLimits | None = None
        self.observers = list(observers)  # the run's evaluation (run_learner); none: train only
        self.run_dir = run_dir
        self.ranks = ranks or SingleRank()  # under torchrun this is rank 0; the others follow it
        run_dir.mkdir(parents=True, exist_ok=True)
        if not cfg.runner.resume:
            archive_previous_run(run_dir)
        torch.manual_seed(cfg.runner.seed)
        # What the learner learns here travels as the run spec; `cfg` stays the user's config.
        self.env_cfg = build_env_config(as_dict(cfg.env))
        state_dim, action_dim = probe_env_dims(self.env_cfg)
        # model_path and the other hf:// settings pinned: the ranks and the servers see one Hub revision
        settings = pinned_policy_settings(as_dict(cfg.policy), run_dir, cfg.runner.resume)
        self.policy = policy_from_config(settings, state_dim, action_dim, cfg.env.chunk_size, cfg.env.image_size)
        self.model_config = model_config(
            settings,
            state_dim,
            action_dim,
            cfg.env.chunk_size,
            as_dict(cfg.env),
            cfg.env.image_size,
            evaluation_record(cfg),
        )
        # the settings the policy was built with (a model_path checkpoint's settings the recipe leaves
        # out), for the inference servers and ranks that build their copy from the spec
        self.spec = built_run_spec(
            state_dim, action_dim, self.policy, self.model_config["policy"], settings.get("model_path", "")
        )
        self.trainer = Trainer(
            self.policy,
            ppo_config(cfg.algorithm),
            cfg.learner.reward_scale,
            self.ranks.device(cfg.learner.device),
            self.ranks,
            reference=reference_policy(cfg, self.spec, self.policy),
            freeze_normalization=bool(self.spec.model_path),
        )
        # what the estimator asks of segments; a schedule the actors cannot keep fails here, not in each
        self.schedule = episode_schedule(cfg.algorithm, cfg.env, cfg.actor)
        self.checkpointer = Checkpointer(run_dir, info=run_info())  # command and commit, for the model card
        self.counters = TrainerCounters()
        latest = self.checkpointer.latest() if cfg.runner.resume else None
        if cfg.runner.resume:
            if latest is None:
                log.warning("--resume: no checkpoint under %s; starting fresh", self.checkpointer.root)
            else:
                self.counters = self.checkpointer.restore(latest, self.policy, self.trainer.optimizer)
                published = self.checkpointer.published_high_water()
                if published > self.counters.version:  # the crashed run got further than its checkpoint
                    self.counters.version = published + 1
                log.info("resumed from %s at version %d", latest, self.counters.version)
                # actors read this from the run spec: their envs start a new episode stream
                self.spec = dataclasses.replace(self.spec, resumed_from_env_steps=self.counters.env_steps)
        # env steps lost by cause, across restarts; life reports are checked against the largest
        # push and what one life can hold unsent (its send queue, a push in flight, unfinished segments)
        segment_env_steps = self.schedule.segment_len * cfg.actor.num_envs * cfg.env.chunk_size
        self.losses = LossLedger(
            self.checkpointer.root,
            life_slack=(cfg.actor.send_queue_size + cfg.actor.pipeline_stage_num + 2) * segment_env_steps,
            segment_env_steps=segment_env_steps,
        )
        if latest is not None:  # resumed from a checkpoint
            self.losses.resume(self.counters.env_steps)
            self.count_unreported_lives()  # lives the previous learner did not hear from
        else:
            self.losses.start(self.counters.env_steps)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))  # the user's config, as composed
        write_run_spec(run_dir, self.spec)
        self.publisher = WeightPublisher()
        self._frozen = frozenset(n for n, p in self.policy.named_parameters() if not p.requires_grad)
        self._digests: dict[str, str] = {}
        self._publish()
        # learner.flow_control: pace: actors start a segment only when it can be trained within the lag bound
        batch, lag = cfg.learner.batch_samples, cfg.algorithm.max_policy_lag
        segment_samples = self.schedule.segment_len * cfg.actor.num_envs  # the largest credit one request asks
        # an actor's segments outstanding at once: its stages, its send queue, the push in flight (+1 spare)
        held = (cfg.actor.pipeline_stage_num + cfg.actor.send_queue_size + 2) * segment_samples
        self.credits = SampleCredits(batch, lag, max_held=held) if cfg.learner.flow_control == "pace" else None
        if self.credits is not None:
            self.credits.version = self.counters.version  # a resumed run's
        self._carry: list[Segment] = []  # env columns past the last update's batch_samples, first in the next
        self.lag_rows: Counter[int] = Counter()  # received rows by policy lag, over the run (the metrics endpoint)
        self.ingest = IngestQueue(
            cfg.learner.ingest_queue_size,
            on_accept=self.losses.accepted_segment,
            seen_before=self.losses.seen_before,
            on_queued=self._queued,
        )
        spec = self.spec
        obs_spec = run_observation_spec(self.env_cfg, spec)
        lp_shape, extras = spec.logprob_shape, dict(spec.extra_outputs)
        group_size = self.schedule.group_size
        self.servicer = LearnerServicer(
            to_yaml(cfg),
            uuid.uuid4().hex[:12],
            self.ingest,
            self.publisher,
            cfg.learner.weight_chunk_bytes,
            check_segment=lambda seg: seg.check_schema(
                obs_spec, spec.action_dim, cfg.env.chunk_size, lp_shape, extras, group_size
            ),
            max_segment_bytes=segment_byte_limit(
                obs_spec,
                self.schedule.segment_len,
                cfg.actor.num_envs,
                cfg.env.chunk_size,
                spec.action_dim,
                lp_shape,
                extras,
            ),
            on_life_ended=self.losses.life_ended,
            on_refused_push=self.losses.refused_push,
            credits=self.credits,
            segment_samples=segment_samples,
            run_spec=spec,
        )
        self.server = None  # start() serves: constructing a Learner opens no port
        self.port, self.address = 0, ""
        self.stop_event = threading.Event()
        # CALVIN's chain metrics need the subtask count as the return: the sparse reward only
        self.episodes = EpisodeWindow(
            task_list(self.env_cfg), chain_length=scored_chain_length(cfg.env.name, cfg.env.reward_type)
        )
        # fail at start, not at the first evaluation, if the eval seeds would meet the demo seeds
        same_tasks = (cfg.eval_env.name, cfg.eval_env.task) == (cfg.env.name, cfg.env.task)
        eval_tasks = self.episodes.task_names if same_tasks else task_list(eval_env_config(cfg))
        eval_seed_range(cfg, len(eval_tasks))
        self.last_stats: dict[str, float] = {}
        self.writer: MetricsWriter | None = None  # opened by train()
        self._progress: TrainProgress | None = None  # train()'s bar

    @property
    def updates(self) -> int:
        return self.counters.update

    @property
    def step(self) -> int:
        """Scalars are logged against env steps."""
        return self.counters.env_steps

    step_unit = "env steps"

    def show(self, info: str) -> None:
        if self._progress is not None:
            self._progress.update(self.counters.env_steps, info=info)

    def start(self) -> str:
        """Serve the LearnerService on learner.host:port; returns the bound address."""
        if self.server is None:
            # undecodable pushes count as rejected segments; any other undecodable call does not
            push_method = {"PushTrajectory": self.ingest.count_rejected}
            self.server, self.port = start_grpc_server(
                self.cfg.learner.host,
                self.cfg.learner.port,
                [
                    lambda s: add_servicer(
                        learner_pb2_grpc.add_LearnerServiceServicer_to_server,
                        self.servicer,
                        s,
                        self.servicer.other_rejections.count,
                        per_method=push_method,
                    )
                ],
                ["rlfleet.v1.LearnerService"],
                on_refused=self.servicer.other_rejections.count,
            )
            self.address = f"{self.cfg.learner.host}:{self.port}"
        return self.address

    def _queued(self, item: IngestedSegment) -> None:
        if self.credits is not None:
            self.credits.arrived(item.client_id, item.segment.num_steps * item.segment.num_envs)

    def _gather(self, progress: TrainProgress) -> list[Segment] | None:
        """One update's batch_samples samples (rlfleet.learner.batches): the columns the last update
        left over, then segments as they come; None when asked to stop first."""
        segments, have = self._carry, samples(self._carry)
        self._carry = []
        batch_samples = self._limits.batch_samples
        while have < batch_samples:
            if self.stop_event.is_set() or self._out_of_time():
                return None
            item = self.ingest.get(timeout=0.2)
            if item is None:
                progress.update(self.counters.env_steps)  # the clock runs while waiting too
                continue
            seg = item.segment
            segments.append(seg)
            have += seg.num_steps * seg.num_envs
            self.counters.samples += seg.num_steps * seg.num_envs  # chunk samples: one per chunk step and env
            self.counters.env_steps += int(seg.env_steps)  # simulated substeps: fewer where episodes ended mid-chunk
            self.losses.counted(self.counters.env_steps)
            self.episodes.add(seg)
            progress.update(self.counters.env_steps)
        batch, self._carry = take_batch(segments, batch_samples)
        return batch

    def _trained(self, segments: list[Segment], trained: int, masked: int) -> None:
        """An update is done with these segments: room for more (flow control), and the account."""
        if self.credits is not None:
            self.credits.trained(samples(segments), self.counters.version)
        self.counters.trained_env_steps += trained
        self.counters.masked_env_steps += masked

    def env_step_account(self) -> dict[str, float | int]:
        """Counted env steps by fate: trained, masked (too old, or left out by the estimator), and
        in no update (the carried columns and a partial batch at the end; consume_only: all)."""
        c = self.counters
        return {
            "trained_env_steps": c.trained_env_steps,
            "masked_env_steps": c.masked_env_steps,
            "untrained_env_steps": c.env_steps - c.trained_env_steps - c.masked_env_steps,
            "trained_share": round(c.trained_env_steps / c.env_steps, 4) if c.env_steps else 0.0,
            "flow_control": self.cfg.learner.flow_control,
            "paced_credit_waits": self.credits.waits if self.credits is not None else 0,
        }

    def _out_of_time(self) -> bool:
        c, r = self.counters, self._limits
        if c.env_steps >= r.total_env_steps:
            return True
        return bool(r.max_wall_seconds) and (time.monotonic() - self._t_start) >= r.max_wall_seconds

    @property
    def _limits(self) -> _LoopLimits:
        """The settings the train loop reads on every wait, as plain numbers: an OmegaConf attribute
        read costs tens of microseconds, and the loop polls them many times per update."""
        if self._limits_cache is None:
            self._limits_cache = _LoopLimits(
                int(self.cfg.learner.batch_samples),
                int(self.cfg.runner.total_env_steps),
                float(self.cfg.runner.max_wall_seconds),
            )
        return self._limits_cache

    def count_unreported_lives(self) -> int:
        """Actor lives that never reported, read from their ledger files in the run folder (where local
        mode's actors keep them): counted as crashed lives, checked like a report, then renamed
        `.reported` so no one counts them again. Returns the env steps they lost."""
        folder = self.run_dir / "ledgers"
        lost = 0
        for path in unreported(folder) if folder.is_dir() else []:
            try:
                a = read_account(path)
                lost += self.losses.life_ended(a.client_id, a.life, a.taken, a.accepted, a.rejected, crashed=True)
            except FileNotFoundError:  # its actor reported it and renamed it since the listing
                continue
            except ValueError as exc:  # unreadable, or an account the learners' own count rules out
                log.warning("actor ledger %s not counted: %s", path.name, exc)
                continue
            if not mark_reported(path):
                continue
            log.info("counted %s's life %x from its ledger file (it never reported)", a.client_id, a.life)
        return lost

    def _publish(self) -> None:
        """Per-tensor digests go with the bytes so inference servers can pull deltas."""
        tensors = cpu_state_dict(self.policy)
        self._digests = tensor_digests(tensors, self._digests, self._frozen)
        self.publisher.publish(self.counters.version, st_save(tensors), self._digests)
        self.checkpointer.record_published(self.counters.version)

    def save(self) -> Path:
        return self.checkpointer.save(self.policy, self.trainer.optimizer, self.counters, self.model_config)

    def train(self) -> dict:
        with profiled("learner"):
            return self._train()

    def _train(self) -> dict:
        cfg = self.cfg
        self._limits_cache = None  # read again: a caller may have changed the config since
        writer = self.writer = MetricsWriter.for_run(cfg, self.run_dir)  # open for finish(); close() ends it
        progress = self._progress = TrainProgress(cfg.runner.total_env_steps, cfg.runner.max_wall_seconds)
        for observer in self.observers:
            observer.on_start(self)
        self._t_start = time.monotonic()
        steps_at_start, t_first = self.counters.env_steps, None
        try:
            with progress:
                progress.update(self.counters.env_steps)
                while True:
                    segments = self._gather(progress)
                    if segments is None:
                        break
                    if t_first is None:  # throughput counts from the first data, not from start-up
                        t_first, steps_at_start = (
                            time.monotonic(),
                            self.counters.env_steps - sum(int(s.env_steps) for s in segments),
                        )
                    t0 = time.monotonic()
                    if cfg.learner.consume_only:
                        self._trained(segments, 0, 0)
                        continue
                    self.ranks.send_update(segments, self.counters.version)  # ranks > 0 train on them too
                    stats = self.trainer.step(segments, self.counters.version)
                    self.counters.version += 1
                    self.counters.update += 1
                    self._publish()
                    self._trained(segments, *self.trainer.last_account)
                    stats["train/trained_env_steps"], stats["train/masked_env_steps"] = self.trainer.last_account
                    c = self.counters
                    stats["throughput/trained_share"] = c.trained_env_steps / max(c.env_steps, 1)
                    self.lag_rows.update(
                        {int(k.rsplit("/", 1)[1]): int(v) for k, v in stats.items() if "/policy_lag_count/" in k}
                    )
                    elapsed = time.monotonic() - t_first
                    stats.update(self.episodes.scalars())
                    stats["time/update_s"] = time.monotonic() - t0
                    stats["throughput/env_steps_per_s"] = (self.counters.env_steps - steps_at_start) / max(
                        elapsed, 1e-6
                    )
                    stats["queue/ingest_depth"] = float(self.ingest.qsize())
                    stats["queue/rejected_segments"] = float(self.ingest.rejected)
                    stats["learner/version"] = float(self.counters.version)
                    stats["actors/alive"] = float(self.servicer.alive_clients("actor"))
                    stats.update({f"lost_env_steps/{k}": float(v) for k, v in self.losses.by_cause().items()})
                    stats.update({f"env_faults/{k}": float(v) for k, v in self.servicer.env_faults().items()})
                    writer.write(stats, self.counters.env_steps)
                    writer.write_lag_histogram(stats, self.counters.env_steps)
                    self.last_stats = stats
                    progress.update(
                        self.counters.env_steps,
                        info=(
                            f"v{self.counters.version} success {stats.get('env/success_once', float('nan')):.2f} "
                            f"{stats['throughput/env_steps_per_s']:,.0f} steps/s "
                            f"lag {stats.get('throughput/policy_lag', 0):.1f}"
                        ),
                    )
                    for observer in self.observers:
                        observer.on_update(self)
                    if self.counters.update % cfg.runner.checkpoint_every == 0:
                        self.save()
                self.ranks.send_stop()  # a clean end only: after a crash torchrun ends the other ranks
        finally:
            t_end = time.monotonic()
            self.counters.wall_seconds += t_end - self._t_start
            self.servicer.stop_event.set()  # actors learn it from their next heartbeat or push
            if self.credits is not None:
                self.credits.stop()  # waiting Credits handlers answer "stop" now, not after CREDIT_REPLY_S
            final = self.save()
            self.servicer.wait_clients_told(timeout=5.0)
            self.servicer.wait_lives_ended(timeout=10.0)  # actors' final accounts, for lost_env_steps
            self.count_unreported_lives()  # and those of actors that could not report in time
            self._progress = None
        steps = self.counters.env_steps - steps_at_start
        acct = self.ingest.accounting()
        summary = {
            "version": self.counters.version,
            "updates": self.counters.update,
            "env_steps": self.counters.env_steps,  # simulated substeps (docs/usage.md, "Env steps")
            "chunk_samples": self.counters.samples,  # training samples: one per chunk step and env
            "train_seconds": round(t_end - self._t_start, 1),  # this process's life
            "train_seconds_all_lives": round(self.counters.wall_seconds, 1),  # with the lives before a --resume
            # from the first full batch on; 0 when the run stopped before one (t_first unset)
            "throughput_env_steps_per_s": round(steps / max(t_end - t_first, 1e-6), 1) if t_first else 0.0,
            "train_success_once": self.last_stats.get("env/success_once"),
            "policy_lag_last_update": self.last_stats.get("throughput/policy_lag"),
            "checkpoint": str(final),
            "segments_by_client": dict(self.ingest.by_client),
            "rejected_segments": self.ingest.rejected,
            "rejected_by_reason": self.ingest.rejected_by_reason(),
            "rejected_calls": self.servicer.rejected_calls(),  # refused life reports, ids, stream budget, ...
            "ingest": acct,  # accepted == consumed + queued: nothing counted twice
        }
        # env steps taken by the actors == env_steps + sum(lost_env_steps) (rlfleet.learner.losses)
        summary["lost_env_steps"] = self.losses.by_cause(acct["accepted_env_steps"] - acct["consumed_env_steps"])
        # what remote simulators got wrong (episodes cut by NaN or bad replies, timeouts, reopened sessions)
        summary["env_faults"] = self.servicer.env_faults()
        account = self.env_step_account()  # trained_share: of the counted env steps, those trained
        summary.update(account)
        log.info(
            "trained on %d of %d env steps (%.1f%%; %d masked, flow_control %s)",
            self.counters.trained_env_steps,
            self.counters.env_steps,
            100 * float(account["trained_share"]),
            self.counters.masked_env_steps,
            cfg.learner.flow_control,
        )
        return summary

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """The observers' end of training (the final evaluation unless stopped early), then summary.json."""
        completed = not self.stop_event.is_set()
        if completed and self.observers:
            time.sleep(0.5)  # let actors see the stop flag and free the cores
        for observer in self.observers:
            observer.on_end(self, summary, completed=completed)
        write_summary(self.run_dir, summary)
        return summary

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.publisher.finish()
        if self.server is not None:
            self.server.stop(grace=1.0)
        self.losses.close()


def run_learner(
    cfg: DictConfig,
    address_file: str | None = None,
    metrics_port: int = 0,
    metrics_host: str = "127.0.0.1",
) -> dict:
    """Serve and train until the budget is spent or a signal arrives, evaluate (the run's
    `EvaluationService`); returns the run summary (also summary.json). Under torchrun only rank 0
    serves; the other ranks follow it."""
    ranks = join_ranks(cfg.learner.distributed)
    if not ranks.is_main:  # torchrun rank > 0: trains in lockstep, serves and writes nothing
        try:
            run_follower(ranks)
        finally:
            ranks.close()
        return {}
    run_dir = Path(cfg.runner.logger.log_path)
    evaluation = EvaluationService(cfg, run_dir, PeriodicEval.from_config(cfg.eval))
    learner = Learner(cfg, run_dir, ranks, [evaluation])
    learner.start()
    ranks.send_config(to_yaml(learner.cfg), learner.spec)
    try:
        metrics = start_role_metrics("learner", metrics_port, [LearnerCollector(learner)], metrics_host)
    except MetricsPortError:  # fail now, with the gRPC server stopped
        learner.close()
        raise
    write_address(address_file, learner=learner.address, **({"metrics": metrics.address} if metrics else {}))
    log.info("learner listening on %s, run folder %s", learner.address, run_dir)

    interrupted = threading.Event()

    def on_signal(signum, frame):  # Ctrl-C / SIGTERM: stop cleanly, checkpoint on the way out
        if signum == signal.SIGINT:  # a person's Ctrl-C: exit 130; SIGTERM is a supervisor's normal stop: 0
            interrupted.set()
        learner.stop_event.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        summary = learner.train()
        if interrupted.is_set():
            summary["interrupted"] = True  # the learner main exits 130 and says where the checkpoint is
        return learner.finish(summary)
    finally:
        learner.close()
        ranks.close()
        if metrics is not None:
            metrics.close()


def main(args: Namespace) -> int:
    """`rlfleet learner RECIPE [overrides]` (rlfleet.learner.arguments); the run's evaluation is
    `run_learner`'s `EvaluationService`."""
    bind = ([f"learner.host={args.host}"] if args.host else []) + (
        [f"learner.port={args.port}"] if args.port is not None else []
    )
    cfg = load_config(args.recipe, bind + args.overrides + (["runner.resume=true"] if args.resume else []))
    summary = run_learner(cfg, args.address_file, args.metrics_port, args.metrics_host)
    if summary and not args.address_file:  # started by hand: show the result here (torchrun: rank 0 only)
        print_summary(summary)
    if summary.get("interrupted"):
        latest = Path(cfg.runner.logger.log_path) / "checkpoints" / "latest"
        where = latest.parent / latest.read_text().strip() if latest.is_file() else "none written"
        log.warning("interrupted; last checkpoint: %s", where)
        return EXIT_INTERRUPTED
    return 0
