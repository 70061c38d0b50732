"""`rlfleet eval CHECKPOINT`: a checkpoint folder (or hf://ORG/NAME) on fresh episodes of its env,
reported per task and per task group, as JSON, Markdown and a terminal table, with every episode
in episodes.jsonl; `--compare OTHER` pairs those episodes with another evaluation's."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console

from rlfleet.config import VideoConfig, config_from_yaml
from rlfleet.envs.api import EVAL_SPLITS
from rlfleet.envs.registry import env_config_class, recorded_env_config, task_list
from rlfleet.eval.episodes import evaluate_policy, report_evaluation
from rlfleet.eval.paired import (
    EPISODES_FILE,
    paired_comparison,
    paired_markdown,
    paired_rich,
    pairing_note,
    read_episodes,
)
from rlfleet.eval.report import atomic_write, evaluation_mode, write_report
from rlfleet.eval.splits import (
    checkpoint_eval_config,
    checkpoint_eval_task,
    eval_env_config,
    eval_seed_range,
    split_seed,
)
from rlfleet.policies.checkpoint_io import checkpoint_folder, is_hub_path, is_run_folder, load_checkpoint, run_folder


def main(args: Namespace) -> int:
    """Success per task and per task group the env declares (MetaWorld: difficulty, ML45 held-out),
    as JSON and Markdown; with --json stdout holds the report's JSON alone (tables and notes go to
    stderr), so it pipes into jq."""
    if not args.json:
        evaluate_checkpoint(args)
        return 0
    with contextlib.redirect_stdout(sys.stderr):
        table = evaluate_checkpoint(args)
    print(json.dumps(table))
    return 0


def evaluate_checkpoint(args: Namespace) -> dict:
    """`rlfleet eval`'s work: the evaluation, its report files and terminal tables; returns the report."""
    decode = getattr(args, "decode", None)
    # a run folder names its latest checkpoint; hf:// stays as given (its report folder is named after it)
    checkpoint = args.checkpoint if is_hub_path(args.checkpoint) else str(checkpoint_folder(args.checkpoint))
    split = getattr(args, "split", None)
    if split is not None and split not in EVAL_SPLITS:
        raise ValueError(f"--split must be one of {', '.join(EVAL_SPLITS)}, got {split!r}")
    if args.out and is_run_folder(Path(args.out)):  # refused before any download or episode
        raise ValueError(
            f"--out {args.out} is a run folder: its episodes.jsonl is the run's final evaluation (pass another --out)"
        )
    if args.episodes is not None and args.episodes < 1:
        raise ValueError(f"--episodes must be at least 1, got {args.episodes}")
    policy, meta = load_checkpoint(checkpoint, overrides={"decode": decode} if decode else None)
    env = dict(meta.get("env") or {})
    try:
        run_cfg = checkpoint_run_config(checkpoint)
    except (OmegaConfBaseException, yaml.YAMLError, OSError) as exc:  # e.g. a key a later rlfleet dropped
        print(f"note: the run's config.yaml does not load ({type(exc).__name__}); evaluating as its config.json says")
        run_cfg = None
    # A run's checkpoint is evaluated as the run evaluated it (its `eval_env`, e.g. RoboTwin's
    # X:eval scenes), so its final evaluation replays here episode by episode; any other checkpoint
    # as its config.json says its recipe evaluates it (an SFT cache, a Hub copy), else the defaults.
    run_eval = run_cfg.eval if run_cfg is not None else checkpoint_eval_config(meta)
    split = split or getattr(run_eval, "split", "test")  # the held-out split: test unless asked
    default_out = _default_eval_dir(checkpoint)
    if split == "validation":  # a validation report (asked, or the run's eval.split) never overwrites the test one
        default_out = default_out.with_name(default_out.name + "_validation")
    out = Path(args.out or default_out)
    if run_cfg is not None and args.seed is None:  # the run's start check: splits apart, held out
        eval_seed_range(run_cfg, len(task_list(eval_env_config(run_cfg, split))), split)
    seed = args.seed if args.seed is not None else split_seed(run_eval, split)
    episodes = args.episodes if args.episodes is not None else run_eval.episodes_per_task
    if not args.task and not args.env_address:
        if run_cfg is not None:
            env = dataclasses.asdict(eval_env_config(run_cfg, split))
            print(f"evaluating on the run's evaluation env: {env['name']} {env['task']}", flush=True)
        elif env and checkpoint_eval_task(meta):
            env["task"] = checkpoint_eval_task(meta)
            print(f"evaluating on the checkpoint's evaluation env: {env['name']} {env['task']}", flush=True)
    if args.env_address:  # the same policy against another (or a restarted) env server
        env = env_on_server(env, args.env_address)
    if args.task:
        if str(env.get("name", "")).startswith("remote://"):  # the server decides its task: say so
            raise ValueError(
                f"--task {args.task} cannot apply to the remote env {env['name']}: its server decides "
                f"the task (start `rlfleet env-server --task {args.task}` and pass --env-address)"
            )
        env["task"] = args.task
    if not env:
        raise SystemExit("the checkpoint does not name its env: pass --task")
    env_cfg = recorded_env_config(env).held_out(split)  # a checkpoint's own env, evaluated as a run evaluates it
    print(f"held-out split: {split} (episode seeds from {seed})", flush=True)
    other = None
    if args.compare:  # a bad path fails before any episode runs
        other = read_episodes(args.compare)
        other_file = Path(args.compare) / EPISODES_FILE if Path(args.compare).is_dir() else Path(args.compare)
        if other_file.resolve() == (out / EPISODES_FILE).resolve():
            raise ValueError(f"--compare {args.compare} is this evaluation's own report folder: pass another --out")
    (out / "paired.md").unlink(missing_ok=True)  # a reused --out keeps no earlier comparison
    video = VideoConfig(save_video=args.video, video_base_dir=str(out / "videos"))
    if args.sample:
        torch.manual_seed(seed)
    records: list[dict] = []
    success = evaluate_policy(
        policy,
        env_cfg,
        episodes,
        seed=seed,
        video_cfg=video,
        out_dir=out,
        deterministic=not args.sample,
        episode_records=records,
    )
    mode = evaluation_mode(meta["policy"], args.sample)
    table = report_evaluation(out, records, success, env_cfg, seed, mode, checkpoint, split)
    json_path, md_path = out / "eval.json", out / "eval.md"
    if other is not None:  # after the report is written, so a failed pairing loses no episode
        table["paired"] = {"against": str(args.compare), **paired_comparison(records, other)}
        title = f"{checkpoint} (this) against {args.compare} (other), same episodes"
        other_mode = _report_mode(Path(args.compare))
        if other_mode and other_mode != mode:  # e.g. sampled against deterministic: allowed, but say so
            print(f"note: {args.compare} was evaluated {other_mode}, this evaluation {mode}", flush=True)
        Console().print(paired_rich(table["paired"], title))
        note = pairing_note(table["paired"])
        if note:
            print(f"note: {note}", flush=True)
        atomic_write(out / "paired.md", paired_markdown(table["paired"], title))
        write_report(table, out, name="eval", title=f"Evaluation of {checkpoint}")
    print(f"report: {json_path} {md_path}")
    return table


def _report_mode(path: Path) -> str | None:
    """How the evaluation whose episodes are at `path` chose its actions, when its eval.json says."""
    report = (path if path.is_dir() else path.parent) / "eval.json"
    try:
        return json.loads(report.read_text()).get("mode")
    except (OSError, ValueError, AttributeError):  # a run folder has no eval.json; older reports no mode
        return None


def _default_eval_dir(checkpoint: str) -> Path:
    """CHECKPOINT/eval; for an exported folder (its model card, README.md, marks an upload) the
    folder beside it, EXPORT-eval, so the upload stays clean; for a Hub checkpoint (read-only
    cache) eval/ORG--NAME[@REV] here."""
    if is_hub_path(checkpoint):
        return Path("eval") / checkpoint[len("hf://") :].replace("/", "--")
    folder = Path(checkpoint)
    if (folder / "README.md").is_file():
        return folder.resolve().parent / f"{folder.resolve().name}-eval"
    return folder / "eval"


def checkpoint_run_config(checkpoint: str | Path) -> DictConfig | None:
    """The config of the run a checkpoint RUN/checkpoints/update_N was written by (its config.yaml),
    or None for any other folder or a Hub path."""
    run = run_folder(checkpoint)
    return config_from_yaml((run / "config.yaml").read_text()) if run else None


def env_on_server(env: dict[str, Any], address: str) -> dict[str, Any]:
    """A recorded env section played against the env server at `address` (`--env-address`): its
    name becomes `remote://address` (keeping a remote name's query), and a family's own settings
    (MetaWorld's goal marker, CALVIN's pool, ...) are left to the server, which owns its env."""
    name = str(env.get("name", ""))
    query = name.partition("?")[2] if name.startswith("remote://") else ""
    remote = f"remote://{address}" + (f"?{query}" if query else "")
    keys = {f.name for f in dataclasses.fields(env_config_class(remote))}
    return {key: value for key, value in env.items() if key in keys} | {"name": remote}
