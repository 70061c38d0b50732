"""What every rlfleet process takes on its command line and how it ends, whichever entry starts it
(`rlfleet ROLE` through rlfleet.cli, or a role's own entry such as `python -m rlfleet.learner`
under torchrun): the security and metrics flags, key=value overrides after the options, and the
exit-code rule (rlfleet.wire.join) for what the command raises."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

import grpc

from rlfleet.wire.auth import configure, load_auth
from rlfleet.wire.join import EXIT_BAD_INPUT, EXIT_INTERRUPTED, CommandError

log = logging.getLogger("rlfleet")


def port(text: str) -> int:
    """An argparse type: a TCP port number."""
    number = int(text) if text.strip().isdigit() else -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (0-65535)")
    return number


def _own_section(group: argparse._ArgumentGroup) -> argparse._ArgumentGroup:
    for action in group._group_actions:
        action.in_own_section = True  # type: ignore[attr-defined]  # rlfleet.cli's help keeps them off the usage line
    return group


def add_metrics_flags(p: argparse.ArgumentParser) -> None:
    """--metrics-port/--metrics-host for a role (RLFLEET_METRICS_PORT/HOST); port 0 disables the endpoint."""
    g = p.add_argument_group("metrics (Prometheus; see docs/operations.md)")
    g.add_argument(
        "--metrics-port",
        type=port,
        default=os.environ.get("RLFLEET_METRICS_PORT") or "0",
        help="serve Prometheus metrics on this port (default: $RLFLEET_METRICS_PORT, 0 = off)",
    )
    g.add_argument(
        "--metrics-host",
        default=os.environ.get("RLFLEET_METRICS_HOST") or "127.0.0.1",
        help="address of the metrics endpoint (default: $RLFLEET_METRICS_HOST or 127.0.0.1)",
    )
    _own_section(g)


def add_security_flags(p: argparse.ArgumentParser) -> None:
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


def configure_auth(args: argparse.Namespace) -> None:
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


def run_command(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a parsed command; what a user can fix or a run's failure in one line, with its exit code.

    Bad input (a missing file, a bad value, a server that cannot be reached or refuses this process's
    credentials) exits 2; a `CommandError` (a role of the fleet stopped the run, a bad env server)
    its own code; Ctrl-C outside the command's own handling 130. Anything else is a bug: traceback."""
    try:
        if hasattr(args, "token_file"):
            configure_auth(args)
        return command(args)
    except KeyboardInterrupt:  # a command's own handling says more (e.g. where the checkpoint is)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (FileNotFoundError, FileExistsError, ValueError, ConnectionError, TimeoutError) as exc:
        log.error("%s", exc)
        return EXIT_BAD_INPUT
    except CommandError as exc:  # its message names the role or server, whose own log has the traceback
        log.error("%s", exc)
        return exc.exit_code
    except grpc.RpcError as exc:
        if not (callable(getattr(exc, "code", None)) and exc.code() == grpc.StatusCode.UNAUTHENTICATED):
            raise
        log.error("a server refused this process's credentials: %s", exc.details())
        return EXIT_BAD_INPUT
