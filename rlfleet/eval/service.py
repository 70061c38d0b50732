"""The evaluation service: a run's evaluations on its held-out eval episodes (the starting policy
before training, periodically during it, the final policy at its end), played, written and logged
one way whoever trains.

A training loop (the learner role's, DAgger's) registers the service as an observer, after
Sample Factory's runner observers: it calls `on_start` when training starts, `on_update` after
each update and `on_end` with the summary it is about to write (`rlfleet.eval.summary`), and the
service adds its fields. The local launcher calls `before` itself: it evaluates the starting
policy before the fleet starts, and the learner's service reads that evaluation back from the run
folder (eval_before.json), so summary.json holds it without being rewritten.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf
from torch import nn

from rlfleet.envs.chains import chain_report
from rlfleet.envs.registry import scored_chain_length
from rlfleet.eval.episodes import evaluate_policy, returns_by_task
from rlfleet.eval.paired import BEFORE_EPISODES_FILE, EPISODES_FILE, write_episodes
from rlfleet.eval.report import chain_line, write_chain_table
from rlfleet.eval.splits import eval_env_config, split_seed
from rlfleet.eval.summary import mean_returns
from rlfleet.telemetry.trackers import MetricsLogger, log_eval

log = logging.getLogger(__name__)

BEFORE_FILE = "eval_before.json"
"""The starting policy's success per task, in the run folder (a chained env's chains: CHAIN_BEFORE_FILE)."""
CHAIN_BEFORE_FILE = "eval_chain_before.json"
BEFORE_SPLIT_FILE = "eval_before_split.txt"
"""The split the starting policy was evaluated on, beside BEFORE_FILE (none: test, from before splits)."""
PERIODIC_DIR = "periodic_eval"
"""Under the run folder: update_N/ per periodic evaluation (its episodes.jsonl and videos)."""


class TrainingLoop(Protocol):
    """What an observer sees of the training loop that calls it."""

    @property
    def policy(self) -> nn.Module:
        """The policy being trained, where it trains."""
        ...

    @property
    def updates(self) -> int:
        """Updates done so far (DAgger: iterations)."""
        ...

    @property
    def step(self) -> int:
        """The x axis of the loop's scalars (the learner: env steps; DAgger: iterations)."""
        ...

    @property
    def step_unit(self) -> str:
        """What `step` counts, for the log ("env steps", "iterations")."""
        ...

    @property
    def writer(self) -> MetricsLogger | None:
        """The run's trackers (None: log nothing)."""
        ...

    def show(self, info: str) -> None:
        """A status line on the loop's progress display."""
        ...


class LoopObserver:
    """Hooks of a training loop; each does nothing unless overridden."""

    def on_start(self, loop: TrainingLoop) -> None:
        """Training starts (a resumed loop: `loop.updates` > 0)."""

    def on_update(self, loop: TrainingLoop) -> dict[str, float]:
        """An update is done; returns the scalars the observer logged at `loop.step`."""
        return {}

    def on_end(self, loop: TrainingLoop, summary: dict[str, Any], *, completed: bool) -> None:
        """Training ended (`completed`: not interrupted); add fields to the run's `summary`."""


@dataclass(frozen=True)
class PeriodicEval:
    """When the policy is evaluated during training, and on how many episodes per task."""

    episodes_per_task: int
    every_updates: int = 0  # 0: not by updates
    every_seconds: float = 0.0  # 0: not by time
    last_update: int = 0  # > 0: none at or after this update (the final evaluation follows it)

    @classmethod
    def from_config(cls, eval_cfg: Any) -> PeriodicEval:
        """The RL recipes' `eval` section (every_updates, every_seconds, periodic_episodes_per_task)."""
        return cls(
            int(eval_cfg.periodic_episodes_per_task or eval_cfg.episodes_per_task),
            int(eval_cfg.every_updates),
            float(eval_cfg.every_seconds),
        )

    def due(self, updates: int, seconds_since_last: float) -> bool:
        if self.last_update and updates >= self.last_update:
            return False
        by_updates = self.every_updates > 0 and updates % self.every_updates == 0
        return by_updates or (self.every_seconds > 0 and seconds_since_last >= self.every_seconds)


@dataclass
class Evaluated:
    """One evaluation's outcome: success per task, and every episode (`evaluate_policy`'s records)."""

    success: dict[str, float]
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.success.values()) / len(self.success)

    @property
    def returns(self) -> dict[str, list[float]]:
        return returns_by_task(self.records)


def keep_before(run_dir: Path, before: dict[str, float], chain_before: dict | None = None, split: str = "test") -> None:
    """The starting policy's success on `split`, on disk and on screen as soon as it is known: a
    fleet that then fails to start must not lose minutes of evaluation, and `--resume` reuses it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / BEFORE_FILE).write_text(json.dumps(before, indent=2))
    (run_dir / BEFORE_SPLIT_FILE).write_text(split + "\n")
    if chain_before is not None:
        (run_dir / CHAIN_BEFORE_FILE).write_text(json.dumps(chain_before, indent=2))
    cells = ", ".join(f"{task} {100 * v:.0f}%" for task, v in before.items())
    print(
        f"starting policy: mean {100 * sum(before.values()) / len(before):.1f}% ({cells})", file=sys.stderr, flush=True
    )
    if chain_before is not None:  # what a chained env is judged by
        print(f"starting policy chains: {chain_line(chain_before['all'])}", file=sys.stderr, flush=True)


def kept_before(run_dir: Path, split: str = "test") -> tuple[dict[str, float], dict | None] | None:
    """The starting policy's success (and chain table) kept in the run folder, None if none is or
    if it was played on another split than `split` (said in one line)."""
    path = run_dir / BEFORE_FILE
    if not path.exists():
        return None
    split_file = run_dir / BEFORE_SPLIT_FILE
    kept_split = split_file.read_text().strip() if split_file.exists() else "test"
    if kept_split != split:  # a start measured on another split is not this run's start
        print(f"{path} was played on the {kept_split} split, this run evaluates {split}: not reused", file=sys.stderr)
        return None
    chain = run_dir / CHAIN_BEFORE_FILE
    return json.loads(path.read_text()), (json.loads(chain.read_text()) if chain.exists() else None)


class EvaluationService(LoopObserver):
    """A run's evaluations on `eval_env_config(cfg)`, from the `eval.split` split's first seed
    (`split_seed`; test: `eval.seed`): `before` (eval.before), `periodic` (as `periodic` schedules
    it; None: none), `final` (eval.at_end).

    `evaluate_start`: `on_start` evaluates the loop's policy when it has not trained yet (DAgger,
    which trains in this process); otherwise it reads the start's evaluation that `before` kept in
    the run folder (the learner, whose launcher evaluated the start before the fleet)."""

    def __init__(
        self, cfg: DictConfig, run_dir: Path, periodic: PeriodicEval | None = None, evaluate_start: bool = False
    ):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.env = eval_env_config(cfg)
        # chained envs (CALVIN) are judged by their chain metrics, from the same episodes' returns
        self.chain_length = scored_chain_length(self.env.name, self.env.reward_type)
        self.schedule = periodic
        self.evaluate_start = evaluate_start
        self.before_success: dict[str, float] | None = None
        self.before_chain: dict | None = None
        self._t_start = self._last_eval = time.monotonic()

    def play(
        self,
        policy: nn.Module,
        episodes: int,
        out_dir: Path | None,
        *,
        episodes_file: str | None = EPISODES_FILE,
        video: bool = True,
        deterministic: bool = True,
        progress: bool = True,
        videos: list[Path] | None = None,
    ) -> Evaluated:
        """`episodes` episodes per task of the eval env; its episodes written to
        `out_dir`/`episodes_file` (None: not written), its videos (eval.video_cfg, with `video`)
        under `out_dir`. The policy is left in the mode (train/eval) it was in."""
        ev = Evaluated({})
        was_training = policy.training  # evaluated where it trains (evaluate_policy moves the observations)
        try:
            ev.success = evaluate_policy(
                policy,
                self.env,
                episodes,
                seed=split_seed(self.cfg.eval),
                video_cfg=OmegaConf.to_object(self.cfg.eval.video_cfg) if video else None,
                out_dir=out_dir,
                deterministic=deterministic,
                progress=progress,
                videos=videos,
                episode_records=ev.records,
            )
        finally:
            policy.train(was_training)
        if out_dir is not None and episodes_file is not None:
            write_episodes(ev.records, out_dir, episodes_file)
        return ev

    def chains(self, ev: Evaluated) -> dict | None:
        """A chained env's chain metrics of an evaluation (rlfleet.envs.chains), else None."""
        return chain_report(ev.returns, self.chain_length) if self.chain_length else None

    # -- before ------------------------------------------------------------------------------------

    def before(self, starting_policy: Callable[[], nn.Module]) -> tuple[dict[str, float], dict | None]:
        """The starting policy's success (and chains): kept in the run folder (eval_before.json,
        episodes_before.jsonl); a resumed run reuses what its first life kept, without building
        the policy (`starting_policy` is called only to evaluate)."""
        kept = kept_before(self.run_dir, self.cfg.eval.split) if self.cfg.runner.resume else None
        if kept is not None:  # a resumed run's starting policy is the one the first life evaluated
            print(f"--resume: the starting policy's evaluation from {self.run_dir / BEFORE_FILE}", file=sys.stderr)
            self.before_success, self.before_chain = kept
            return kept
        print("evaluating the starting policy ...", file=sys.stderr, flush=True)
        ev = self.play(
            starting_policy(),
            self.cfg.eval.episodes_per_task,
            self.run_dir,
            episodes_file=BEFORE_EPISODES_FILE,
            video=False,  # the start's videos would land beside the final evaluation's
        )  # paired with the final episodes.jsonl
        self.before_success, self.before_chain = ev.success, self.chains(ev)
        keep_before(self.run_dir, ev.success, self.before_chain, self.cfg.eval.split)
        return ev.success, self.before_chain

    def load_before(self) -> None:
        """The start's evaluation that `before` kept in the run folder, if any."""
        kept = kept_before(self.run_dir, self.cfg.eval.split)
        if kept is not None:
            self.before_success, self.before_chain = kept

    # -- periodic ----------------------------------------------------------------------------------

    def periodic(self, loop: TrainingLoop) -> dict[str, float]:
        """The current policy on the held-out eval episodes, as eval/* scalars at `loop.step`:
        eval/success_once (mean over tasks), eval/<task>/success_once, eval/elapsed_s (seconds since
        training started, eval time included) and, for chained envs, eval/avg_num_subtasks and
        eval/success_len_k. Episodes and videos go under periodic_eval/update_N/; videos also to
        the trackers as eval/video/<task> with eval.video_cfg.tensorboard."""
        assert self.schedule is not None
        written: list[Path] = []
        out = self.run_dir / PERIODIC_DIR / f"update_{loop.updates:06d}"
        ev = self.play(loop.policy, self.schedule.episodes_per_task, out, progress=False, videos=written)
        scalars = {"eval/success_once": ev.mean, "eval/elapsed_s": time.monotonic() - self._t_start}
        if len(ev.success) > 1:
            scalars.update({f"eval/{task}/success_once": v for task, v in ev.success.items()})
        chain = self.chains(ev)
        if chain is not None:
            scalars.update({f"eval/{k}": v for k, v in chain["all"].items()})
        video = self.cfg.eval.video_cfg
        if loop.writer is not None:
            loop.writer.scalars(scalars, loop.step)
            if video.save_video and video.tensorboard:
                for path in written:  # <base>/<task>/ep<k>_<label>.mp4
                    loop.writer.video(f"eval/video/{path.parent.name}", path, loop.step, video.fps)
            loop.writer.flush()
        self._last_eval = time.monotonic()
        chain_text = f", avg_num_subtasks {scalars['eval/avg_num_subtasks']:.2f}" if chain is not None else ""
        log.info(
            "eval at %d %s: success_once %.3f%s", loop.step, loop.step_unit, scalars["eval/success_once"], chain_text
        )
        return scalars

    # -- final -------------------------------------------------------------------------------------

    def final(self, policy: nn.Module, step: int = 0, writer: MetricsLogger | None = None) -> dict[str, Any]:
        """The final evaluation (eval.episodes_per_task) in the run folder: episodes.jsonl, videos,
        eval_chain.md for chained envs, and to the trackers at `step` with the start beside it.
        Returns its summary fields: eval_success, eval_success_mean, eval_split, eval_mean_return,
        eval_chain."""
        t0 = time.time()
        ev = self.play(policy, self.cfg.eval.episodes_per_task, self.run_dir)
        fields: dict[str, Any] = {"eval_success": ev.success, "eval_success_mean": ev.mean}
        fields["eval_split"] = self.cfg.eval.split  # test unless a run measures on validation (a choice's probe)
        mean_return = mean_returns(ev.returns)
        if mean_return:  # envs judged by return (gym:...)
            fields["eval_mean_return"] = mean_return
        chain = self.chains(ev)
        if chain is not None:  # CALVIN's table: success_len_1..5 and avg_num_subtasks
            fields["eval_chain"] = chain
            title = f"{self.cfg.runner.experiment_name}: chains"
            print(write_chain_table(self.run_dir, chain, title, self.chain_length), flush=True)
        if writer is not None:  # eval success, the before/after table and the videos, to every tracker
            video = self.cfg.eval.video_cfg
            video_dir = Path(video.video_base_dir)
            log_eval(
                writer,
                ev.success,
                step,
                before=self.before_success,
                video_dir=(video_dir if video_dir.is_absolute() else self.run_dir / video_dir)
                if video.save_video
                else None,
                since=t0,
                fps=video.fps,
            )
        return fields

    def before_fields(self) -> dict[str, Any]:
        """The start's evaluation as summary fields: eval_before, eval_before_mean, eval_chain_before."""
        if not self.before_success:
            return {}
        fields: dict[str, Any] = {
            "eval_before": self.before_success,
            "eval_before_mean": sum(self.before_success.values()) / len(self.before_success),
        }
        if self.before_chain is not None:
            fields["eval_chain_before"] = self.before_chain
        return fields

    # -- the observer ------------------------------------------------------------------------------

    def on_start(self, loop: TrainingLoop) -> None:
        if self.cfg.eval.before:
            if self.evaluate_start and loop.updates == 0:
                self.before(lambda: loop.policy)
            else:
                self.load_before()
        self._t_start = self._last_eval = time.monotonic()

    def on_update(self, loop: TrainingLoop) -> dict[str, float]:
        if self.schedule is None or not self.schedule.due(loop.updates, time.monotonic() - self._last_eval):
            return {}
        loop.show("evaluating on the held-out seeds ...")
        return self.periodic(loop)

    def on_end(self, loop: TrainingLoop, summary: dict[str, Any], *, completed: bool) -> None:
        if completed and self.cfg.eval.at_end:
            loop.show("evaluating the trained policy ...")
            summary.update(self.final(loop.policy, loop.step, loop.writer))
        summary.update(self.before_fields())
        if "eval_success" in summary or "eval_before" in summary:  # whichever evaluations ran, on this split
            summary["eval_split"] = self.cfg.eval.split
