"""The `rlfleet` command: parses the command line and dispatches through COMMANDS to each
command's function; what a command raises becomes its exit code in rlfleet.wire.role_args."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from collections.abc import Callable

from rlfleet.learner.arguments import add_arguments as add_arguments_of_learner
from rlfleet.telemetry.json_logs import add_log_flags, setup_logging
from rlfleet.wire.role_args import (
    add_metrics_flags,
    add_security_flags,
    parse_command_line,
    port,
    run_command,
)

_EXAMPLES = """examples:
  # list the built-in recipes; train one with every role on this host (local mode)
  rlfleet recipes
  rlfleet train metaworld_reach_ppo
  rlfleet train metaworld_reach_ppo actor.num_envs=32 runner.logger.logger_backends=[tensorboard,wandb]
  # evaluate a checkpoint folder, or one on the Hugging Face Hub
  rlfleet eval runs/metaworld_reach_ppo --episodes 20        # a run folder: its latest checkpoint
  rlfleet eval hf://ORG/NAME
  # two policies on the same 200 episodes, episode by episode
  rlfleet eval START --episodes 200 --out eval/start
  rlfleet eval runs/NAME/checkpoints/update_000100 --episodes 200 --compare eval/start
  # one checkpoint from the mean of a run's last 3 checkpoints' weights, evaluated as the run's own
  rlfleet average runs/NAME --last 3
  rlfleet eval runs/NAME/checkpoints/average --compare runs/NAME/episodes_before.jsonl
  # a Hub-ready folder (weights, config, norm stats, model card), and an upload
  rlfleet export runs/metaworld_reach_ppo out/reach
  rlfleet push runs/metaworld_reach_ppo ORG/NAME
  # distributed mode: each role on its own host, with a shared token
  rlfleet learner metaworld_reach_ppo --host 0.0.0.0 --port 50051 --token-file token
  rlfleet actor --learner HOST:50051 --inference HOST:50052 --token-file token

Each subcommand has its own help (rlfleet train --help); docs/operations.md and docs/tracking.md."""


class _RoleHelpFormatter(argparse.HelpFormatter):
    """Keeps the metrics and security flags out of a role's usage line; their own sections list them."""

    def _format_usage(self, usage, actions, groups, prefix):  # type: ignore[no-untyped-def]
        kept = [a for a in actions if not getattr(a, "in_own_section", False)]
        text = super()._format_usage(usage, kept, groups, prefix)
        if usage is None and len(kept) < len(actions):
            text = text.rstrip("\n") + "\n       (and the metrics / security options below)\n\n"
        return text


_ADDRESS_VARS = "_address_vars"


def _address_flag(p: argparse.ArgumentParser, flag: str, var: str, what: str) -> None:
    """A HOST:PORT flag that defaults to $VAR; one of the two must be given (checked in main)."""
    p.add_argument(flag, default=os.environ.get(var) or None, metavar="HOST:PORT", help=f"{what} (default: ${var})")
    p.set_defaults(**{_ADDRESS_VARS: [*(p.get_default(_ADDRESS_VARS) or []), (flag, var)]})


def _check_addresses(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag, var in getattr(args, _ADDRESS_VARS, None) or []:
        if not getattr(args, flag.lstrip("-").replace("-", "_")):
            parser.error(f"{args.command}: {flag.lstrip('-')} address missing: pass {flag} HOST:PORT or set {var}")


# Dispatch: command -> "module:function" taking the parsed arguments. The module is imported only
# when its command runs, so `rlfleet --help`, `rlfleet recipes` and a mistyped command answer at
# once (no torch, gRPC stubs or simulators loaded).
COMMANDS: dict[str, str] = {
    "train": "rlfleet.runs.launcher:main",
    "learner": "rlfleet.learner.__main__:run",
    "inference": "rlfleet.inference_server.main:main",
    "actor": "rlfleet.actors.main:main",
    "env-server": "rlfleet.envs.env_server:main",
    "eval": "rlfleet.eval.main:main",
    "collect": "rlfleet.runs.collect:main",
    "sft": "rlfleet.runs.sft:main",
    "average": "rlfleet.policies.averaging:main",
    "export": "rlfleet.cli:export",
    "push": "rlfleet.cli:push",
    "recipes": "rlfleet.cli:recipes",
    "config": "rlfleet.cli:config",
}


def command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs command `name` (its module imported now)."""
    module, _, function = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


_MERGE_HELP = (
    "hf_* policies with LoRA: fold the adapters into the backbone and write it whole under backbone/ "
    "(default: adapters and heads, with the backbone's id and revision)"
)


def export(args: argparse.Namespace) -> int:
    from rlfleet.eval.report import checkpoint_eval_markdown  # lazy: see COMMANDS
    from rlfleet.policies.hub import export_checkpoint  # lazy: see COMMANDS

    out = export_checkpoint(
        args.checkpoint,
        args.out,
        repo_id=args.repo_id,
        eval_markdown=checkpoint_eval_markdown,
        merge_adapters=args.merge_adapters,
    )
    print("\n".join(sorted(str(p) for p in out.iterdir())))
    return 0


def push(args: argparse.Namespace) -> int:
    from rlfleet.eval.report import checkpoint_eval_markdown  # lazy: see COMMANDS
    from rlfleet.policies.hub import push_checkpoint  # lazy: see COMMANDS

    url = push_checkpoint(
        args.checkpoint,
        args.repo_id,
        private=args.private,
        revision=args.revision,
        merge_adapters=args.merge_adapters,
        message=args.message,
        eval_markdown=checkpoint_eval_markdown,
    )
    print(f"pushed {args.checkpoint} to {url}")
    return 0


def recipes(args: argparse.Namespace) -> int:
    from rlfleet.config import recipe_description, recipe_names, recipe_scale  # lazy: see COMMANDS

    names = recipe_names()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {recipe_scale(name).upper() or '-':<3}  {recipe_description(name)}")
    return 0


def config(args: argparse.Namespace) -> int:
    from rlfleet.config import load_config, to_yaml  # lazy: see COMMANDS
    from rlfleet.runs.placement import resolve_placement  # lazy: see COMMANDS

    cfg = load_config(args.recipe, args.overrides)
    resolve_placement(cfg)  # a placement this host cannot satisfy: one line, as `rlfleet train` says it
    print(to_yaml(cfg), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlfleet",
        description="RL fine-tuning of robot policies, at fleet scale",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_flags(p)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="local mode: learner + inference server + actors on this host")
    t.add_argument("recipe", help="recipe name (see `rlfleet recipes`) or a YAML file")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.num_envs=32")
    t.add_argument("--resume", action="store_true", help="continue from the run folder's last checkpoint")
    add_metrics_flags(t)  # local mode: learner PORT, inference PORT+1, actor i PORT+2+i
    add_security_flags(t)  # the spawned roles get them through RLFLEET_* variables

    lr = sub.add_parser("learner", help="start the learner role")
    add_arguments_of_learner(lr)

    inf = sub.add_parser("inference", help="start an inference server that follows a learner's weights")
    _address_flag(inf, "--learner", "RLFLEET_LEARNER", "the learner's gRPC address")
    inf.add_argument(
        "--host",
        default=os.environ.get("RLFLEET_HOST") or "127.0.0.1",
        help="bind address (default: $RLFLEET_HOST or 127.0.0.1; others need a token)",
    )
    inf.add_argument(
        "--grpc-port",
        type=port,
        default=os.environ.get("RLFLEET_GRPC_PORT") or "0",
        help="gRPC port (default: $RLFLEET_GRPC_PORT, 0 = any free port)",
    )
    inf.add_argument(
        "--zmq-port",
        type=port,
        default=os.environ.get("RLFLEET_ZMQ_PORT") or "0",
        help="ZeroMQ port (default: $RLFLEET_ZMQ_PORT, 0 = any free port)",
    )
    inf.add_argument("--device", help="torch device for the policy (default: the run's inference.device)")
    inf.add_argument(
        "--offload-idle-s",
        type=float,
        default=0.0,
        help="move the weights to host memory after this many idle seconds (0: never); for a "
        "GPU shared with a learner rank (cluster.component_placement, collocated)",
    )
    inf.add_argument("--threads", type=int, default=1, help="torch threads for the policy")
    inf.add_argument("--address-file", help='write {"inference": HOST:PORT, "zmq": ...} here once serving')
    add_metrics_flags(inf)
    add_security_flags(inf)

    ac = sub.add_parser("actor", help="start an actor (env workers) feeding a learner")
    _address_flag(ac, "--learner", "RLFLEET_LEARNER", "the learner's gRPC address")
    _address_flag(
        ac,
        "--inference",
        "RLFLEET_INFERENCE",
        "inference server gRPC address; several, comma separated, to spread requests and fail over",
    )
    ac.add_argument("--index", type=int, help="actor index (env seeds/tasks); default: assigned by the learner")
    ac.add_argument("--id", help="client id (default: host-pid-random)")
    ac.add_argument("--transport", choices=["shm", "zmq", "grpc"], help="override actor.transport")
    add_metrics_flags(ac)
    add_security_flags(ac)

    ev = sub.add_parser("eval", help="evaluate a checkpoint folder: success by task, difficulty and ML45 split")
    ev.add_argument(
        "checkpoint",
        help="checkpoint folder, run folder (its latest checkpoint) or hf://ORG/NAME[@REVISION] (Hugging Face Hub)",
    )
    ev.add_argument(
        "--task",
        help="task or task set, e.g. MT50 (default: a run's checkpoint, the run's evaluation tasks; "
        "otherwise the one it was trained on)",
    )
    ev.add_argument(
        "--env-address",
        metavar="HOST:PORT",
        help="evaluate on the EnvService server there (env.name=remote://HOST:PORT) instead of the checkpoint's env",
    )
    ev.add_argument(
        "--episodes",
        type=int,
        help="episodes per task (default: the run's eval.episodes_per_task for a run's checkpoint, else what the "
        "checkpoint's config.json records of its recipe's evaluation, else 10)",
    )
    ev.add_argument(
        "--seed",
        type=int,
        help="first episode seed (default: the split's first seed, eval.seed or eval.validation_seed, of the "
        "checkpoint's run, else the one its config.json records, else the default of rlfleet.envs.api)",
    )
    ev.add_argument(
        "--split",
        choices=["test", "validation"],
        help="held-out split to play (default: the run's eval.split, else test): test is what results report, "
        "validation is where choices made by looking at success are made (report in CHECKPOINT/eval_validation)",
    )
    ev.add_argument("--out", help="report folder (default: CHECKPOINT/eval; for hf:// eval/ORG--NAME)")
    ev.add_argument("--video", action="store_true", help="write MP4s of the first episode of each task")
    ev.add_argument(
        "--compare",
        metavar="OTHER",
        help="pair each episode with the same episode (task and scene played) of another evaluation: its report folder "
        "or episodes.jsonl; prints success of both, the episodes only one solved and an exact McNemar p",
    )
    ev.add_argument(
        "--json", action="store_true", help="print the report as JSON, alone on stdout (tables and notes go to stderr)"
    )
    ev.add_argument(
        "--sample",
        action="store_true",
        help="sample actions as in training (seeded) instead of the deterministic policy",
    )
    ev.add_argument(
        "--decode",
        help="tiny_oft's deterministic action from its bin distributions: argmax, median or mean "
        "(default: the checkpoint's policy.decode)",
    )

    co = sub.add_parser("collect", help="record scripted-expert demonstrations to a dataset folder")
    co.add_argument(
        "--env", default="metaworld", help="any env with scripted experts: metaworld, robotwin, calvin, a plugin"
    )
    co.add_argument(
        "--tasks",
        required=True,
        help="env.task: a task, MT10/MT25/MT50, a comma-separated list; "
        "robotwin: e.g. place_empty_cup:randomized; calvin: scene variants, e.g. D or ABC",
    )
    co.add_argument(
        "--episodes-per-task", type=int, help="successful episodes wanted per task (default: demos.episodes_per_task)"
    )
    co.add_argument("--out", required=True, help="dataset folder to create (see docs/datasets.md)")
    co.add_argument("--image-size", type=int, default=64, help="camera frame side in pixels; 0: states only")
    co.add_argument("--camera", help="camera for main_images (MetaWorld; default: env.camera)")
    co.add_argument("--wrist-camera", action="store_true", help="also record wrist_images (envs with one: calvin)")
    co.add_argument(
        "--max-episode-steps", type=int, help="episode limit (default: env.max_episode_steps; calvin chains: 1800)"
    )
    co.add_argument(
        "--envs-per-task",
        type=int,
        default=1,
        help="envs per task stepped together in one batch (more: faster collection, more memory)",
    )
    co.add_argument("--seed", type=int, help="seed block (default: demos.seed; demo seeds never overlap eval seeds)")
    co.add_argument("--keep-failed", action="store_true", help="also write failed expert episodes, flagged")
    co.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    co.add_argument(
        "--format",
        choices=["rlfleet", "lerobot"],
        default="rlfleet",
        help="rlfleet (npz episodes) or lerobot (LeRobot v3: parquet + mp4, the [lerobot] extra); docs/datasets.md",
    )
    co.add_argument("--fps", type=float, default=10.0, help="frames per second a LeRobot dataset records")

    sf = sub.add_parser("sft", help="behaviour cloning of the recipe's policy on demos (see `rlfleet collect`)")
    sf.add_argument("recipe", help="recipe whose policy/env/sft settings to use")
    sf.add_argument("overrides", nargs="*", help="key=value overrides, e.g. sft.steps=500")
    sf.add_argument(
        "--demos",
        required=True,
        help="demo dataset: an rlfleet folder, a LeRobot v3 folder (meta/info.json) or hf://datasets/ORG/NAME "
        "(feature names mapped by demos.features, docs/datasets.md)",
    )
    sf.add_argument("--out", required=True, help="checkpoint folder to write")
    sf.add_argument("--eval-episodes", type=int, default=0, help="evaluate the result (episodes per task)")
    sf.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint at --out")

    es = sub.add_parser("env-server", help="serve a simulator over gRPC (EnvService) for env.name=remote://HOST:PORT")
    es.add_argument("--env", required=True, help="registered env name, e.g. metaworld")
    es.add_argument("--task", help="env.task, e.g. reach-v3 or MT10")
    es.add_argument("--num-envs", type=int, default=1, help="envs of a session whose client does not ask for a number")
    es.add_argument("--max-envs", type=int, default=256, help="envs across all client sessions")
    es.add_argument(
        "--host",
        default=os.environ.get("RLFLEET_HOST") or "127.0.0.1",
        help="bind address (default: $RLFLEET_HOST or 127.0.0.1; others need a token)",
    )
    es.add_argument("--port", type=int, default=0, help="0: any free port (see --address-file)")
    es.add_argument("--address-file", help='write {"env": "HOST:PORT"} here once serving')
    es.add_argument("overrides", nargs="*", help="EnvConfig key=value, e.g. max_episode_steps=100 image_size=64")
    add_metrics_flags(es)
    add_security_flags(es)

    ex = sub.add_parser("export", help="write a Hub-ready folder (safetensors, config, norm stats, model card)")
    ex.add_argument("checkpoint", help="checkpoint folder, run folder (its latest checkpoint) or hf://ORG/NAME[@REV]")
    ex.add_argument("out", help="folder to write (created; files of the same names are replaced)")
    ex.add_argument("--repo-id", help="ORG/NAME the model card's usage lines name (default: a placeholder)")
    ex.add_argument("--merge-adapters", action="store_true", help=_MERGE_HELP)

    pu = sub.add_parser("push", help="export a checkpoint and upload it to the Hugging Face Hub")
    pu.add_argument("checkpoint", help="checkpoint folder or run folder (its latest checkpoint)")
    pu.add_argument("repo_id", metavar="ORG/NAME", help="Hub model repository (created if missing)")
    pu.add_argument("--private", action="store_true", help="create the repository private")
    pu.add_argument("--revision", help="branch to push to (created if missing; default: main)")
    pu.add_argument("--message", help="commit message (default: names the checkpoint)")
    pu.add_argument("--merge-adapters", action="store_true", help=_MERGE_HELP)

    av = sub.add_parser("average", help="average the weights of a run's last checkpoints into one checkpoint")
    av.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a run folder (its kept checkpoints) or two checkpoint folders or more (of one run)",
    )
    av.add_argument(
        "--last",
        type=int,
        default=0,
        metavar="K",
        help="of a run folder, the newest K checkpoints only (default: all it kept)",
    )
    av.add_argument(
        "--out", help="checkpoint folder to write (default: RUN/checkpoints/average, evaluated as the run's own)"
    )

    sub.add_parser("recipes", help="list the built-in recipes: name, CPU or GPU sizing, description")
    cf = sub.add_parser("config", help="print a recipe's fully resolved config (after key=value overrides)")
    cf.add_argument("recipe", help="recipe name (see `rlfleet recipes`) or a YAML file")
    cf.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.num_envs=32")
    for parser in sub.choices.values():
        parser.formatter_class = _RoleHelpFormatter
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_command_line(parser, argv)
    args.command_line = shlex.join(["rlfleet", *(sys.argv[1:] if argv is None else argv)])
    _check_addresses(parser, args)
    setup_logging(args.log_level, args.log_format, args.command)
    return run_command(command(args.command), args)


if __name__ == "__main__":
    sys.exit(main())
