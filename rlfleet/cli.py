"""The `rlfleet` command: train (local mode), the three roles one by one, and eval."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import uuid

from rich.console import Console
from rich.table import Table


def _setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
                        stream=sys.stderr)


def _stop_on_signals(event: threading.Event) -> None:
    def handler(signum, frame):
        event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _print_summary(summary: dict) -> None:
    console = Console()
    table = Table(title="evaluation (success_once, deterministic policy)")
    table.add_column("task")
    table.add_column("success", justify="right")
    for task, rate in (summary.get("eval_success") or {}).items():
        table.add_row(task, f"{rate:.0%}")
    if summary.get("eval_success"):
        table.add_row("[bold]mean[/bold]", f"[bold]{summary['eval_success_mean']:.0%}[/bold]")
        console.print(table)
    keys = ("env_steps", "updates", "train_seconds", "throughput_env_steps_per_s", "checkpoint")
    console.print({k: summary[k] for k in keys if k in summary})


def cmd_train(args: argparse.Namespace) -> int:
    from rlfleet.config import load_config
    from rlfleet.launcher import train_local

    cfg = load_config(args.recipe, args.overrides + (["runner.resume=true"] if args.resume else []))
    summary = train_local(cfg)
    _print_summary(summary)
    if summary.get("eval_before") and summary.get("eval_success"):
        from pathlib import Path

        from rlfleet.eval_report import compare_markdown, compare_rich

        before, after = summary["eval_before"], summary["eval_success"]
        Console().print(compare_rich(before, after, title="success before / after RL fine-tuning"))
        title = f"{cfg.runner.experiment_name}: success before / after RL ({summary.get('train_seconds')} s of training)"
        (Path(cfg.runner.logger.log_path) / "before_after.md").write_text(compare_markdown(before, after, title))
    print(f"run folder: {cfg.runner.logger.log_path}")
    return 0


def cmd_learner(args: argparse.Namespace) -> int:
    from rlfleet.config import load_config
    from rlfleet.learner.run import run_learner

    cfg = load_config(args.recipe, args.overrides + (["runner.resume=true"] if args.resume else []))
    summary = run_learner(cfg, args.address_file)
    if not args.address_file:  # started by hand: show the result here
        _print_summary(summary)
    return 0


def cmd_inference(args: argparse.Namespace) -> int:
    import torch

    from rlfleet.actors.learner_client import register
    from rlfleet.config import config_from_yaml
    from rlfleet.inference_server.server import InferenceServer, build_runner_from_learner
    from rlfleet.learner.run import write_address
    from rlfleet.wire.grpc_server import make_channel

    torch.set_num_threads(args.threads)
    client_id = f"inference-{socket.gethostname()}-{os.getpid()}"
    reply = register(args.learner, client_id, "inference")
    cfg = config_from_yaml(reply.config_yaml)
    channel = make_channel(args.learner)
    runner, subscriber = build_runner_from_learner(channel, cfg, client_id)
    server = InferenceServer(runner, args.host, args.grpc_port, args.zmq_port, cfg.inference.max_batch,
                             cfg.inference.max_wait_ms, subscriber)
    write_address(args.address_file, inference=server.address, zmq=server.zmq.endpoint)
    logging.getLogger(__name__).info("inference server on %s (zmq %s), policy version %d",
                                     server.address, server.zmq.endpoint, runner.version)
    stop = threading.Event()
    _stop_on_signals(stop)
    threading.Thread(target=lambda: (stop.wait(), server.stop()), daemon=True).start()
    server.serve()
    stats = server.stats()
    logging.getLogger(__name__).info("served %d batches, %d rows, %d rejected requests",
                                     stats.batches, stats.rows, stats.errors)
    return 0


def cmd_actor(args: argparse.Namespace) -> int:
    from rlfleet.actors.actor import run_actor
    from rlfleet.actors.learner_client import register
    from rlfleet.config import config_from_yaml

    client_id = args.id or f"actor-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    reply = register(args.learner, client_id, "actor")
    cfg = config_from_yaml(reply.config_yaml)
    if args.transport:
        cfg.actor.transport = args.transport
    index = args.index if args.index is not None else reply.client_index
    stop = threading.Event()
    _stop_on_signals(stop)
    stats = run_actor(cfg, index, client_id, args.learner, args.inference, stop)
    logging.getLogger(__name__).info("actor %s done: %d env steps, %d segments in %.0fs (%.0f steps/s)",
                                     client_id, stats.env_steps, stats.segments, stats.seconds,
                                     stats.env_steps / max(stats.seconds, 1e-6))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Success per task, by MetaWorld difficulty and on the ML45 held-out tasks, as JSON and Markdown."""
    from pathlib import Path

    from rlfleet.envs.api import EnvConfig
    from rlfleet.eval_report import rich_table, success_table, write_report
    from rlfleet.eval_video import VideoConfig
    from rlfleet.evaluation import evaluate_policy
    from rlfleet.policies.checkpoint_io import load_checkpoint

    policy, meta = load_checkpoint(args.checkpoint)
    env = dict(meta.get("env") or {})
    if args.task:
        env["task"] = args.task
    if not env:
        raise SystemExit("the checkpoint does not name its env: pass --task")
    out = Path(args.out or Path(args.checkpoint) / "eval")
    video = VideoConfig(save_video=args.video, video_base_dir=str(out / "videos"))
    success = evaluate_policy(policy, EnvConfig(**env), args.episodes, seed=args.seed, video_cfg=video, out_dir=out)
    table = success_table(success, {t: args.episodes for t in success})
    Console().print(rich_table(table, title=f"evaluation of {args.checkpoint} ({args.episodes} episodes per task)"))
    json_path, md_path = write_report(table, out, name="eval", title=f"Evaluation of {args.checkpoint}")
    print(f"report: {json_path} {md_path}")
    if args.json:
        print(json.dumps(table))
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    """Record scripted-expert demonstrations (the SFT data)."""
    from pathlib import Path

    from rlfleet.data.demos import collect_demos
    from rlfleet.envs.metaworld.env import resolve_tasks

    tasks = resolve_tasks(args.tasks)
    try:
        summary = collect_demos(Path(args.out), tasks, args.episodes_per_task, image_size=args.image_size,
                                camera=args.camera, max_episode_steps=args.max_episode_steps,
                                num_workers=args.workers, seed=args.seed, keep_failed=args.keep_failed,
                                overwrite=args.overwrite)
    except FileExistsError as exc:  # main() only maps FileNotFoundError / ValueError to exit code 2
        logging.getLogger("rlfleet").error("%s", exc)
        return 2
    table = Table(title=f"scripted-expert demos in {args.out}")
    table.add_column("task")
    table.add_column("episodes", justify="right")
    table.add_column("expert success", justify="right")
    table.add_column("failed attempts", justify="right")
    for task, s in summary.items():
        table.add_row(task, str(s["episodes"]), f"{s['attempts'] - s['failed']}/{s['attempts']}", str(s["failed"]))
    Console().print(table)
    short = [t for t, s in summary.items() if s["attempts"] - s["failed"] < args.episodes_per_task]
    if short:
        logging.getLogger("rlfleet").warning("fewer than %d successful episodes for: %s", args.episodes_per_task,
                                             ", ".join(short))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    """Behaviour-clone the recipe's policy on a demo dataset and write a checkpoint folder."""
    from rlfleet.config import SFTConfig, as_dict, load_config, policy_settings
    from rlfleet.data.sft import run_sft
    from rlfleet.envs.api import EnvConfig

    cfg = load_config(args.recipe, args.overrides)
    summary = run_sft(args.demos, args.out, policy_settings(cfg), EnvConfig(**as_dict(cfg.env)), SFTConfig(**as_dict(cfg.sft)))
    if args.eval_episodes:
        from rlfleet.evaluation import evaluate_policy
        from rlfleet.policies.checkpoint_io import load_checkpoint

        policy, _ = load_checkpoint(args.out)
        success = evaluate_policy(policy, EnvConfig(**as_dict(cfg.env)), args.eval_episodes, seed=cfg.eval.seed)
        summary.update(eval_success=success, eval_success_mean=sum(success.values()) / len(success))
        _print_summary(summary)
    Console().print({k: summary[k] for k in ("samples", "episodes", "steps", "final_loss", "train_seconds")})
    print(f"checkpoint: {args.out}")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from rlfleet.config import recipe_names

    print("\n".join(recipe_names()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlfleet", description="RL fine-tuning of robot policies, at fleet scale")
    p.add_argument("--log-level", default=os.environ.get("RLFLEET_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="local mode: learner + inference server + actors on this host")
    t.add_argument("recipe", help="recipe name (see `rlfleet recipes`) or a YAML file")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.num_envs=32")
    t.add_argument("--resume", action="store_true", help="continue from the run folder's last checkpoint")
    t.set_defaults(func=cmd_train)

    lr = sub.add_parser("learner", help="start the learner role")
    lr.add_argument("recipe")
    lr.add_argument("overrides", nargs="*")
    lr.add_argument("--resume", action="store_true")
    lr.add_argument("--address-file", help="write the bound address here as JSON (used by `train`)")
    lr.set_defaults(func=cmd_learner)

    inf = sub.add_parser("inference", help="start an inference server that follows a learner's weights")
    inf.add_argument("--learner", required=True, help="learner HOST:PORT")
    inf.add_argument("--host", default="127.0.0.1")
    inf.add_argument("--grpc-port", type=int, default=0)
    inf.add_argument("--zmq-port", type=int, default=0)
    inf.add_argument("--threads", type=int, default=1, help="torch threads for the policy")
    inf.add_argument("--address-file")
    inf.set_defaults(func=cmd_inference)

    ac = sub.add_parser("actor", help="start an actor (env workers) feeding a learner")
    ac.add_argument("--learner", required=True, help="learner HOST:PORT")
    ac.add_argument("--inference", required=True, help="inference server gRPC HOST:PORT")
    ac.add_argument("--index", type=int, help="actor index (env seeds/tasks); default: assigned by the learner")
    ac.add_argument("--id", help="client id (default: host-pid-random)")
    ac.add_argument("--transport", choices=["shm", "zmq", "grpc"], help="override actor.transport")
    ac.set_defaults(func=cmd_actor)

    ev = sub.add_parser("eval", help="evaluate a checkpoint folder: success by task, difficulty and ML45 split")
    ev.add_argument("checkpoint")
    ev.add_argument("--task", help="task or task set, e.g. MT50 (default: the one it was trained on)")
    ev.add_argument("--episodes", type=int, default=10, help="episodes per task")
    ev.add_argument("--seed", type=int, default=10_000, help="first episode seed")
    ev.add_argument("--out", help="report folder (default: CHECKPOINT/eval)")
    ev.add_argument("--video", action="store_true", help="write MP4s of the first episode of each task")
    ev.add_argument("--json", action="store_true", help="also print the report as JSON")
    ev.set_defaults(func=cmd_eval)

    co = sub.add_parser("collect", help="record scripted-expert demonstrations (MetaWorld) to a dataset folder")
    co.add_argument("--tasks", required=True, help="a task, MT10/MT25/MT50, or a comma-separated list")
    co.add_argument("--episodes-per-task", type=int, default=20, help="successful episodes wanted per task")
    co.add_argument("--out", required=True, help="dataset folder to create (see docs/datasets.md)")
    co.add_argument("--image-size", type=int, default=64, help="camera frame side in pixels; 0: states only")
    co.add_argument("--camera", default="corner", help="MetaWorld camera for main_images")
    co.add_argument("--max-episode-steps", type=int, default=150)
    co.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="worker processes")
    co.add_argument("--seed", type=int, default=0, help="seed block (demo seeds never overlap eval seeds)")
    co.add_argument("--keep-failed", action="store_true", help="also write failed expert episodes, flagged")
    co.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    co.set_defaults(func=cmd_collect)

    sf = sub.add_parser("sft", help="behaviour cloning of the recipe's policy on demos (see `rlfleet collect`)")
    sf.add_argument("recipe", help="recipe whose policy/env/sft settings to use")
    sf.add_argument("overrides", nargs="*", help="key=value overrides, e.g. sft.steps=500")
    sf.add_argument("--demos", required=True, help="demo dataset folder")
    sf.add_argument("--out", required=True, help="checkpoint folder to write")
    sf.add_argument("--eval-episodes", type=int, default=0, help="evaluate the result (episodes per task)")
    sf.set_defaults(func=cmd_sft)

    rc = sub.add_parser("recipes", help="list the built-in recipes")
    rc.set_defaults(func=cmd_recipes)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as exc:
        logging.getLogger("rlfleet").error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
