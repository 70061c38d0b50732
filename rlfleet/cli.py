"""The `rlfleet` command: parses the command line and dispatches to each command's main.

train: rlfleet.runs.launcher; learner / inference / actor / env-server: each role's package main;
eval: rlfleet.eval.main; collect, sft: rlfleet.runs; export, push: rlfleet.policies.hub;
average: rlfleet.policies.averaging.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys

import grpc

from rlfleet.telemetry.json_logs import make_formatter
from rlfleet.wire.auth import configure, load_auth
from rlfleet.wire.join import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED


def _setup_logging(level: str = "INFO", fmt: str = "text", role: str = "") -> None:
    """Text for people, or one JSON object per line (`--log-format json`) for log shippers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(make_formatter(fmt, role))
    # Other libraries' INFO (PyOpenGL's "No OpenGL_accelerate module", absl, httpx, ...) stays out of
    # the console unless asked for with --log-level DEBUG: the root logger holds them at WARNING.
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    numeric = numeric if isinstance(numeric, int) else logging.INFO
    logging.basicConfig(level=numeric if numeric < logging.INFO else max(numeric, logging.WARNING), handlers=[handler])
    for name in ("rlfleet", "__main__"):  # our own loggers (`python -m rlfleet.cli` logs as __main__)
        logging.getLogger(name).setLevel(numeric)


def _port(text: str) -> int:
    port = int(text) if text.strip().isdigit() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (0-65535)")
    return port


def _log_format(text: str) -> str:
    if text not in ("text", "json"):  # also checks $RLFLEET_LOG_FORMAT, which `choices` would not
        raise argparse.ArgumentTypeError(f"{text!r}: choose text or json")
    return text


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise argparse.ArgumentTypeError(f"{text!r}: choose DEBUG, INFO, WARNING or ERROR")
    return level


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


def _own_section(group: argparse._ArgumentGroup) -> argparse._ArgumentGroup:
    for action in group._group_actions:
        action.in_own_section = True  # type: ignore[attr-defined]  # read by _RoleHelpFormatter
    return group


def _add_metrics_flags(p: argparse.ArgumentParser) -> None:
    """--metrics-port/--metrics-host for a role (RLFLEET_METRICS_PORT/HOST); port 0 disables the endpoint."""
    g = p.add_argument_group("metrics (Prometheus; see docs/operations.md)")
    g.add_argument(
        "--metrics-port",
        type=_port,
        default=os.environ.get("RLFLEET_METRICS_PORT") or "0",
        help="serve Prometheus metrics on this port (default: $RLFLEET_METRICS_PORT, 0 = off)",
    )
    g.add_argument(
        "--metrics-host",
        default=os.environ.get("RLFLEET_METRICS_HOST") or "127.0.0.1",
        help="address of the metrics endpoint (default: $RLFLEET_METRICS_HOST or 127.0.0.1)",
    )
    _own_section(g)


def _add_security_flags(p: argparse.ArgumentParser) -> None:
    """Token and TLS for a role's servers and channels; unset flags fall back to RLFLEET_* (docs/security.md)."""
    g = p.add_argument_group("security (see docs/security.md)")
    g.add_argument("--token-file", help="file holding the shared token (default: the token in $RLFLEET_TOKEN)")
    g.add_argument("--tls-cert", help="PEM certificate chain for this role's servers (default: $RLFLEET_TLS_CERT)")
    g.add_argument("--tls-key", help="PEM private key for --tls-cert (default: $RLFLEET_TLS_KEY)")
    g.add_argument("--tls-ca", help="PEM root certificate(s) to trust as a client (default: $RLFLEET_TLS_CA)")
    g.add_argument(
        "--tls-server-name",
        help="name to check server certificates against (default: $RLFLEET_TLS_SERVER_NAME, else the host dialled)",
    )
    g.add_argument(
        "--max-message-bytes",
        type=int,
        help="largest gRPC / ZeroMQ message, both ways (default: $RLFLEET_MAX_MESSAGE_BYTES or 64 MiB)",
    )
    _own_section(g)


def _configure_auth(args: argparse.Namespace) -> None:
    """Install the role's token/TLS settings process-wide; the launcher passes them on by environment."""
    configure(
        load_auth(
            args.token_file,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_ca=args.tls_ca,
            tls_server_name=args.tls_server_name,
            max_message_bytes=args.max_message_bytes,
        )
    )


_ADDRESS_VARS = "_address_vars"


def _address_flag(p: argparse.ArgumentParser, flag: str, var: str, what: str) -> None:
    """A HOST:PORT flag that defaults to $VAR; one of the two must be given (checked in main)."""
    p.add_argument(flag, default=os.environ.get(var) or None, metavar="HOST:PORT", help=f"{what} (default: ${var})")
    p.set_defaults(**{_ADDRESS_VARS: [*(p.get_default(_ADDRESS_VARS) or []), (flag, var)]})


def _check_addresses(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag, var in getattr(args, _ADDRESS_VARS, None) or []:
        if not getattr(args, flag.lstrip("-").replace("-", "_")):
            parser.error(f"{args.command}: {flag.lstrip('-')} address missing: pass {flag} HOST:PORT or set {var}")


# Dispatch: each command imports its own main only when it runs, so `rlfleet --help`, `rlfleet
# recipes` and a mistyped command answer at once (no torch, gRPC stubs or simulators loaded).


def cmd_train(args: argparse.Namespace) -> int:
    from rlfleet.runs.launcher import main  # lazy: see Dispatch

    return main(args)


def cmd_learner(args: argparse.Namespace) -> int:
    from rlfleet.eval.episodes import RunEvaluation  # lazy: see Dispatch
    from rlfleet.learner.main import main  # lazy: see Dispatch

    return main(args, evaluation_for=RunEvaluation)


def cmd_inference(args: argparse.Namespace) -> int:
    from rlfleet.inference_server.main import main  # lazy: see Dispatch

    return main(args)


def cmd_actor(args: argparse.Namespace) -> int:
    from rlfleet.actors.main import main  # lazy: see Dispatch

    return main(args)


def cmd_env_server(args: argparse.Namespace) -> int:
    from rlfleet.envs.env_server import main  # lazy: see Dispatch

    return main(args)


def cmd_eval(args: argparse.Namespace) -> int:
    from rlfleet.eval.main import main  # lazy: see Dispatch

    return main(args)


def cmd_collect(args: argparse.Namespace) -> int:
    from rlfleet.runs.collect import main  # lazy: see Dispatch

    return main(args)


def cmd_sft(args: argparse.Namespace) -> int:
    from rlfleet.runs.sft import main  # lazy: see Dispatch

    return main(args)


_MERGE_HELP = (
    "hf_* policies with LoRA: fold the adapters into the backbone and write it whole under backbone/ "
    "(default: adapters and heads, with the backbone's id and revision)"
)


def cmd_export(args: argparse.Namespace) -> int:
    from rlfleet.eval.report import checkpoint_eval_markdown  # lazy: see Dispatch
    from rlfleet.policies.hub import export_checkpoint  # lazy: see Dispatch

    out = export_checkpoint(
        args.checkpoint,
        args.out,
        repo_id=args.repo_id,
        eval_markdown=checkpoint_eval_markdown,
        merge_adapters=args.merge_adapters,
    )
    print("\n".join(sorted(str(p) for p in out.iterdir())))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from rlfleet.eval.report import checkpoint_eval_markdown  # lazy: see Dispatch
    from rlfleet.policies.hub import push_checkpoint  # lazy: see Dispatch

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


def cmd_average(args: argparse.Namespace) -> int:
    from rlfleet.policies.averaging import main  # lazy: see Dispatch

    return main(args)


def cmd_recipes(args: argparse.Namespace) -> int:
    from rlfleet.config import recipe_description, recipe_names, recipe_scale  # lazy: see Dispatch

    names = recipe_names()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {recipe_scale(name).upper() or '-':<3}  {recipe_description(name)}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from rlfleet.config import load_config, to_yaml  # lazy: see Dispatch
    from rlfleet.runs.placement import resolve_placement  # lazy: see Dispatch

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
    p.add_argument(
        "--log-level",
        type=_log_level,
        default=os.environ.get("RLFLEET_LOG_LEVEL") or "INFO",
        help="DEBUG, INFO, WARNING or ERROR (default: $RLFLEET_LOG_LEVEL or INFO); other libraries "
        "log at WARNING and above unless DEBUG",
    )
    p.add_argument(
        "--log-format",
        type=_log_format,
        default=os.environ.get("RLFLEET_LOG_FORMAT") or "text",
        help="text (default: $RLFLEET_LOG_FORMAT or text) or json: one JSON object per line "
        "(time, level, logger, pid, role, message, extras)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="local mode: learner + inference server + actors on this host")
    t.add_argument("recipe", help="recipe name (see `rlfleet recipes`) or a YAML file")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.num_envs=32")
    t.add_argument("--resume", action="store_true", help="continue from the run folder's last checkpoint")
    _add_metrics_flags(t)  # local mode: learner PORT, inference PORT+1, actor i PORT+2+i
    _add_security_flags(t)  # the spawned roles get them through RLFLEET_* variables
    t.set_defaults(func=cmd_train)

    lr = sub.add_parser("learner", help="start the learner role")
    lr.add_argument("recipe", help="recipe name (see `rlfleet recipes`) or a YAML file")
    lr.add_argument("overrides", nargs="*", help="key=value overrides, e.g. learner.batch_samples=8192")
    lr.add_argument("--resume", action="store_true", help="continue from the run folder's last checkpoint")
    lr.add_argument("--address-file", help="write the bound address here as JSON (used by `train`)")
    lr.add_argument(
        "--host",
        default=os.environ.get("RLFLEET_HOST") or None,
        help="bind address (default: $RLFLEET_HOST, else the recipe's learner.host); key=value overrides win",
    )
    lr.add_argument(
        "--port",
        type=_port,
        default=os.environ.get("RLFLEET_LEARNER_PORT") or None,
        help="gRPC port (default: $RLFLEET_LEARNER_PORT, else the recipe's learner.port)",
    )
    _add_metrics_flags(lr)
    _add_security_flags(lr)
    lr.set_defaults(func=cmd_learner)

    inf = sub.add_parser("inference", help="start an inference server that follows a learner's weights")
    _address_flag(inf, "--learner", "RLFLEET_LEARNER", "the learner's gRPC address")
    inf.add_argument(
        "--host",
        default=os.environ.get("RLFLEET_HOST") or "127.0.0.1",
        help="bind address (default: $RLFLEET_HOST or 127.0.0.1; others need a token)",
    )
    inf.add_argument(
        "--grpc-port",
        type=_port,
        default=os.environ.get("RLFLEET_GRPC_PORT") or "0",
        help="gRPC port (default: $RLFLEET_GRPC_PORT, 0 = any free port)",
    )
    inf.add_argument(
        "--zmq-port",
        type=_port,
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
    _add_metrics_flags(inf)
    _add_security_flags(inf)
    inf.set_defaults(func=cmd_inference)

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
    _add_metrics_flags(ac)
    _add_security_flags(ac)
    ac.set_defaults(func=cmd_actor)

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
        help="first episode seed (default: the run's eval.seed for a run's checkpoint, else the one its "
        "config.json records, else 10000)",
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
    ev.set_defaults(func=cmd_eval)

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
    co.add_argument("--episodes-per-task", type=int, default=20, help="successful episodes wanted per task")
    co.add_argument("--out", required=True, help="dataset folder to create (see docs/datasets.md)")
    co.add_argument("--image-size", type=int, default=64, help="camera frame side in pixels; 0: states only")
    co.add_argument("--camera", default="corner", help="camera for main_images (MetaWorld)")
    co.add_argument("--wrist-camera", action="store_true", help="also record wrist_images (envs with one: calvin)")
    co.add_argument("--max-episode-steps", type=int, default=150, help="episode limit (calvin chains: 1800)")
    co.add_argument(
        "--envs-per-task",
        type=int,
        default=1,
        help="envs per task stepped together in one batch (more: faster collection, more memory)",
    )
    co.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)  # old scripts: warned, ignored
    co.add_argument("--seed", type=int, default=0, help="seed block (demo seeds never overlap eval seeds)")
    co.add_argument("--keep-failed", action="store_true", help="also write failed expert episodes, flagged")
    co.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    co.add_argument(
        "--format",
        choices=["rlfleet", "lerobot"],
        default="rlfleet",
        help="rlfleet (npz episodes) or lerobot (LeRobot v3: parquet + mp4, the [lerobot] extra); docs/datasets.md",
    )
    co.add_argument("--fps", type=float, default=10.0, help="frames per second a LeRobot dataset records")
    co.set_defaults(func=cmd_collect)

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
    sf.set_defaults(func=cmd_sft)

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
    _add_metrics_flags(es)
    _add_security_flags(es)
    es.set_defaults(func=cmd_env_server)

    ex = sub.add_parser("export", help="write a Hub-ready folder (safetensors, config, norm stats, model card)")
    ex.add_argument("checkpoint", help="checkpoint folder, run folder (its latest checkpoint) or hf://ORG/NAME[@REV]")
    ex.add_argument("out", help="folder to write (created; files of the same names are replaced)")
    ex.add_argument("--repo-id", help="ORG/NAME the model card's usage lines name (default: a placeholder)")
    ex.add_argument("--merge-adapters", action="store_true", help=_MERGE_HELP)
    ex.set_defaults(func=cmd_export)

    pu = sub.add_parser("push", help="export a checkpoint and upload it to the Hugging Face Hub")
    pu.add_argument("checkpoint", help="checkpoint folder or run folder (its latest checkpoint)")
    pu.add_argument("repo_id", metavar="ORG/NAME", help="Hub model repository (created if missing)")
    pu.add_argument("--private", action="store_true", help="create the repository private")
    pu.add_argument("--revision", help="branch to push to (created if missing; default: main)")
    pu.add_argument("--message", help="commit message (default: names the checkpoint)")
    pu.add_argument("--merge-adapters", action="store_true", help=_MERGE_HELP)
    pu.set_defaults(func=cmd_push)

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
    av.set_defaults(func=cmd_average)

    rc = sub.add_parser("recipes", help="list the built-in recipes: name, CPU or GPU sizing, description")
    rc.set_defaults(func=cmd_recipes)
    cf = sub.add_parser("config", help="print a recipe's fully resolved config (after key=value overrides)")
    cf.add_argument("recipe", help="recipe name (see `rlfleet recipes`) or a YAML file")
    cf.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.num_envs=32")
    cf.set_defaults(func=cmd_config)
    for parser in sub.choices.values():
        parser.formatter_class = _RoleHelpFormatter
    return p


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Like parse_args, but key=value overrides may also follow the options (`rlfleet sft RECIPE
    --demos D --out O sft.steps=500`): argparse stops filling a positional list at the first option."""
    args, extra = parser.parse_known_args(argv)
    late = [e for e in extra if "=" in e and not e.startswith("-")]
    if late and hasattr(args, "overrides") and len(late) == len(extra):
        args.overrides = [*args.overrides, *late]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_command_line(parser, argv)
    args.command_line = shlex.join(["rlfleet", *(sys.argv[1:] if argv is None else argv)])
    _check_addresses(parser, args)
    _setup_logging(args.log_level, args.log_format, args.command)
    try:
        if hasattr(args, "token_file"):
            _configure_auth(args)
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C outside a command's own handling (which says more, e.g. the checkpoint)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (
        FileNotFoundError,
        FileExistsError,
        ValueError,
        ConnectionError,
        TimeoutError,
    ) as exc:  # e.g. an env server gone
        logging.getLogger("rlfleet").error("%s", exc)
        return EXIT_BAD_INPUT
    except Exception as exc:
        if type(exc).__name__ == "RemoteEnvError":  # a bad env server: its message says which and how
            logging.getLogger("rlfleet").error("%s", exc)
            return EXIT_BAD_INPUT
        if type(exc).__name__ == "FleetError":  # rlfleet.runs.launcher: the role's own log has its traceback
            logging.getLogger("rlfleet").error("%s", exc)
            # a role that refused its input (exit 2) makes the run's input bad too: one rule for all commands
            return EXIT_BAD_INPUT if getattr(exc, "exit_code", 1) == EXIT_BAD_INPUT else EXIT_FAILED
        if not _unauthenticated(exc):
            raise
        logging.getLogger("rlfleet").error("a server refused this process's credentials: %s", exc.details())
        return EXIT_BAD_INPUT


def _unauthenticated(exc: Exception) -> bool:
    """A gRPC UNAUTHENTICATED error: one clear line instead of a traceback."""
    return (
        isinstance(exc, grpc.RpcError)
        and callable(getattr(exc, "code", None))
        and exc.code() == grpc.StatusCode.UNAUTHENTICATED
    )


if __name__ == "__main__":
    sys.exit(main())
