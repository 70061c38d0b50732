"""The CLI explains itself: every argument has help, the top-level help shows examples, the
security and metrics flags sit in their own sections, and other libraries' INFO logs stay off the
console at the default level."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import textwrap

import pytest

from rlfleet.cli import build_parser

SECURITY = ("--token-file", "--tls-cert", "--tls-key", "--tls-ca", "--tls-server-name", "--max-message-bytes")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_argument_of_every_subcommand_has_help():
    parser = build_parser()
    subs = _subparsers(parser)
    (sub_action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {c.dest for c in sub_action._choices_actions} == set(subs)  # each subcommand has a one-line help
    assert all(c.help for c in sub_action._choices_actions)
    missing = []
    for name, p in [("rlfleet", parser), *subs.items()]:
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_top_level_help_shows_examples():
    text = build_parser().format_help()
    assert "examples:" in text
    for example in (
        "rlfleet train metaworld_reach_ppo",
        "rlfleet eval hf://ORG/NAME",
        "rlfleet export ",
        "rlfleet learner ",
        "rlfleet actor --learner",
    ):
        assert example in text, example


@pytest.mark.parametrize("role", ["train", "learner", "inference", "actor", "env-server"])
def test_security_flags_have_their_own_section(role):
    text = _subparsers(build_parser())[role].format_help()
    usage, _, body = text.partition("\n\n")
    assert not any(flag in usage for flag in SECURITY)  # the usage line stays short
    assert "metrics / security options below" in usage
    options, _, security = body.partition("security (see docs/security.md):")
    assert all(flag in security for flag in SECURITY)
    assert not any(flag in options for flag in SECURITY)


def test_log_level_is_checked():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log-level", "loud", "recipes"])
    assert build_parser().parse_args(["--log-level", "debug", "recipes"]).log_level == "DEBUG"


_LOGS = textwrap.dedent("""
    import logging, sys
    from rlfleet.telemetry.json_logs import setup_logging as _setup_logging
    _setup_logging(sys.argv[1])
    logging.getLogger("OpenGL.acceleratesupport").info("third-party info")
    logging.getLogger("absl").info("absl info")
    logging.getLogger("OpenGL").warning("third-party warning")
    logging.getLogger("rlfleet.learner.main").info("our info")
    logging.getLogger("__main__").info("cli info")
""")


def test_third_party_info_stays_off_the_console():
    quiet = subprocess.run([sys.executable, "-c", _LOGS, "INFO"], capture_output=True, text=True, timeout=60).stderr
    assert "our info" in quiet and "cli info" in quiet and "third-party warning" in quiet
    assert "third-party info" not in quiet and "absl info" not in quiet
    loud = subprocess.run([sys.executable, "-c", _LOGS, "DEBUG"], capture_output=True, text=True, timeout=60).stderr
    assert "third-party info" in loud and "absl info" in loud


@pytest.mark.skipif(importlib.util.find_spec("OpenGL") is None, reason="PyOpenGL is not installed")
def test_no_opengl_accelerate_line():
    """PyOpenGL logs "No OpenGL_accelerate module loaded" at INFO when it is imported (MuJoCo
    rendering imports it during evaluation)."""
    code = "from rlfleet.telemetry.json_logs import setup_logging as s; s('INFO'); import OpenGL.acceleratesupport"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "OpenGL_accelerate" not in res.stderr


def test_every_command_dispatches_through_the_table():
    """COMMANDS names a function for every subcommand and nothing else; each imports and is callable."""
    from rlfleet.cli import COMMANDS, command

    assert set(COMMANDS) == set(_subparsers(build_parser()))
    for name in ("recipes", "config", "export", "push"):  # the ones that import nothing heavy
        assert callable(command(name))


def test_the_learner_entries_take_the_same_arguments():
    """`python -m rlfleet.learner` (torchrun's form) is the learner's own entry, not the CLI, and
    parses what `rlfleet learner` parses."""
    from rlfleet.learner.__main__ import entry  # noqa: F401  (imports: the entry exists)

    cli = _subparsers(build_parser())["learner"]
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.learner", "--help"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0
    for action in cli._actions:
        for flag in action.option_strings:
            assert flag in res.stdout, flag
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.learner", "no_such_recipe"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and "unknown recipe 'no_such_recipe'" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "error, code",
    [
        (FileNotFoundError("no such file"), 2),
        (ValueError("bad value"), 2),
        (TimeoutError("no answer"), 2),
        ("command", 1),
        ("command_bad_input", 2),
        ("remote_env", 2),
        (KeyboardInterrupt(), 130),
    ],
)
def test_errors_become_exit_codes_by_type(error, code):
    from rlfleet.envs.remote import RemoteEnvError
    from rlfleet.wire.join import EXIT_BAD_INPUT, CommandError
    from rlfleet.wire.role_args import run_command

    error = {
        "command": CommandError("actor-0 exited"),
        "command_bad_input": CommandError("learner refused its input", EXIT_BAD_INPUT),
        "remote_env": RemoteEnvError("env server 127.0.0.1:1 sent a bad spec"),
    }.get(error, error)

    def fails(args):
        raise error

    assert run_command(fails, argparse.Namespace()) == code


def test_a_bug_keeps_its_traceback():
    from rlfleet.wire.role_args import run_command

    def buggy(args):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_command(buggy, argparse.Namespace())
