"""`python -m rlfleet.learner` = `rlfleet learner`, the form torchrun starts:

torchrun --nproc-per-node 4 -m rlfleet.learner RECIPE [key=value ...] [--resume] [--address-file F]

The learner's own entry: its command line (rlfleet.learner.arguments) and logging; the run's
evaluation is the learner's (rlfleet.eval.service, a layer below the roles). `rlfleet learner`
dispatches to `run` here.
"""

from __future__ import annotations

import argparse
import sys

from rlfleet.learner.arguments import add_arguments
from rlfleet.learner.main import main
from rlfleet.telemetry.json_logs import add_log_flags, setup_logging
from rlfleet.wire.role_args import parse_command_line, run_command


def run(args: argparse.Namespace) -> int:
    """The learner, for parsed learner arguments."""
    return main(args)


def entry(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlfleet.learner", description="the learner role (DDP under torchrun)"
    )
    add_log_flags(parser)
    add_arguments(parser)
    args = parse_command_line(parser, argv)
    setup_logging(args.log_level, args.log_format, "learner")
    return run_command(run, args)


if __name__ == "__main__":
    sys.exit(entry())
