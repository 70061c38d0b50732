"""The learner's command line, one definition for both of its entries: `rlfleet learner` (rlfleet.cli)
and `python -m rlfleet.learner` (the form torchrun starts). Imports nothing heavy: `rlfleet --help`
builds it."""

from __future__ import annotations

import argparse
import os

from rlfleet.wire.role_args import add_metrics_flags, add_security_flags, port


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe name (see `rlfleet recipes`) or a YAML file")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. learner.batch_samples=8192")
    p.add_argument("--resume", action="store_true", help="continue from the run folder's last checkpoint")
    p.add_argument("--address-file", help="write the bound address here as JSON (used by `train`)")
    p.add_argument(
        "--host",
        default=os.environ.get("RLFLEET_HOST") or None,
        help="bind address (default: $RLFLEET_HOST, else the recipe's learner.host); key=value overrides win",
    )
    p.add_argument(
        "--port",
        type=port,
        default=os.environ.get("RLFLEET_LEARNER_PORT") or None,
        help="gRPC port (default: $RLFLEET_LEARNER_PORT, else the recipe's learner.port)",
    )
    add_metrics_flags(p)
    add_security_flags(p)
