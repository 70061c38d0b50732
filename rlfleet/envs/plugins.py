"""Resolve an env or policy name to the object that builds it, the same way in every process.

A name is looked up, in order, among the built-in names, in-process registrations, as a
`package.module:attribute` path, and among the Python entry points of a group (`rlfleet.envs`,
`rlfleet.policies`) that installed packages publish. Resolution works from the name alone, so
every role (learner, inference server, actors, spawned env workers, `rlfleet env-server`, eval)
finds a plugin as long as its package is importable there: nothing has to be registered first.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

# `package.module:attribute` (attribute may be dotted: `module:Class.factory`)
_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_import_path(name: str) -> bool:
    """Whether `name` reads as `package.module:attribute`."""
    return bool(_PATH.match(name))


def import_path(path: str, kind: str = "object") -> Any:
    """The object `package.module:attribute` names, or a one-line ValueError."""
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{kind} {path!r}: cannot import module {module_name!r} ({exc})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{kind} {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def entry_point_names(group: str) -> list[str]:
    """Names installed packages publish in entry-point `group`."""
    return sorted({ep.name for ep in entry_points(group=group)})


def resolve(name: str, kind: str, group: str, known: Mapping[str, Any], also: Sequence[str] = ()) -> Any:
    """The object behind `name`: `known[name]` (an import-path string is imported), an import
    path, or the entry point `name` of `group`. Unknown names raise one ValueError line naming
    what was looked up and what is available (`known`, then the forms in `also`)."""
    if name in known:
        value = known[name]
        return import_path(value, kind) if isinstance(value, str) else value
    if is_import_path(name):
        return import_path(name, kind)
    matches = [ep for ep in entry_points(group=group) if ep.name == name]
    if matches:
        try:
            return matches[0].load()
        except Exception as exc:  # a broken plugin: say which one, in one line
            raise ValueError(
                f"{kind} {name!r}: entry point {matches[0].value!r} of group {group!r} failed to load "
                f"({type(exc).__name__}: {exc})"
            ) from None
    plugins = entry_point_names(group)
    raise ValueError(
        f"unknown {kind} {name!r}: not built in or registered, not a 'package.module:factory' path, "
        f"and no entry point of that name in group {group!r}; available: {', '.join([*sorted(known), *also])}"
        + (f"; entry points: {', '.join(plugins)}" if plugins else "")
    )
