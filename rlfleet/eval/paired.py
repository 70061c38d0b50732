"""Two evaluations of the same episodes, compared episode by episode.

Why: two policies' success rates on 50 episodes a task differ by a few points through the episodes'
sampling alone. When both ran the same episodes (same task, same starting scene), an episode both solve
or both fail says nothing about which is better; only the discordant ones do (one solves it, the
other does not). The exact McNemar test (McNemar 1947, exact form) asks whether the split of the
discordant episodes is more lopsided than a fair coin would make it: a two-sided binomial test of
`only_this` successes in `only_this + only_other` trials at p = 1/2.

Episodes are matched on task and scene: the reset seed, or the env's own id of the starting state
where seeds map onto a finite list (`ChunkedEnv.episode_scenes`: RoboTwin's scene seeds, CALVIN's
chain pool entries). A scene an evaluation played more than once counts once (its first episode),
so repeats do not pass for independent evidence.

`rlfleet eval` writes each episode to `episodes.jsonl` in its report folder, a training run to
`episodes_before.jsonl` (the starting policy) and `episodes.jsonl` (the final one) in its run
folder (`write_episodes`); `rlfleet eval CKPT --compare OTHER` pairs this evaluation's episodes with
OTHER's, and bench/reproduce.py a run's final episodes with its start's (`paired_comparison`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from rlfleet.eval.report import atomic_write

EPISODES_FILE = "episodes.jsonl"
"""One JSON object per episode: {"task", "seed", "scene", "success", "return", "length"}."""
BEFORE_EPISODES_FILE = "episodes_before.jsonl"
"""A training run's evaluation of its starting policy, episode by episode (eval.before)."""

_FIELDS = ("task", "seed", "success")


def write_episodes(records: Sequence[Mapping[str, Any]], out_dir: Path, name: str = EPISODES_FILE) -> Path:
    """`<out_dir>/<name>`, one line per episode record, written atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    atomic_write(path, "".join(json.dumps(dict(r)) + "\n" for r in records))
    return path


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """The episode records of an evaluation: an `episodes.jsonl` file, or a folder holding one
    (`rlfleet eval`'s report folder). Raises ValueError, in one line, on a missing or bad file."""
    path = Path(path)
    if path.is_dir():
        path = path / EPISODES_FILE
    if not path.is_file():
        raise ValueError(
            f"{path}: no such file (rlfleet eval writes {EPISODES_FILE} in its report folder, a run writes "
            f"{EPISODES_FILE} and, with eval.before=true, {BEFORE_EPISODES_FILE})"
        )
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(record, dict) or any(k not in record for k in _FIELDS):
            raise ValueError(f"{path}:{n}: an episode record needs {', '.join(_FIELDS)}")
        records.append(record)
    return records


def exact_mcnemar_p(only_this: int, only_other: int) -> float:
    """Two-sided p-value of the exact McNemar test: P(a split at least this lopsided) when each
    discordant episode is a fair coin, 2 * P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2), at most 1."""
    n = only_this + only_other
    if n == 0:
        return 1.0
    k = min(only_this, only_other)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def _by_scene(records: Sequence[Mapping[str, Any]]) -> tuple[dict[tuple[str, int], bool], int]:
    """Success by (task, scene), the first episode of a scene played more than once; and how many
    repeats were left out. Records without a scene (older files) are keyed by their seed."""
    keyed: dict[tuple[str, int], bool] = {}
    for r in records:
        keyed.setdefault((str(r["task"]), int(r.get("scene", r["seed"]))), bool(r["success"]))
    return keyed, len(records) - len(keyed)


def _span(records: Sequence[Mapping[str, Any]]) -> str:
    tasks = list(dict.fromkeys(str(r["task"]) for r in records))
    seeds = [int(r["seed"]) for r in records]
    return f"{', '.join(tasks[:3])}{' ...' if len(tasks) > 3 else ''} from seed {min(seeds)}" if records else "nothing"


def paired_comparison(this: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per task, the episodes both evaluations ran (matched on task and scene): `pairs`, success of
    each on them (`this`, `other`, fractions), `difference` (this - other), the discordant counts
    `only_this` and `only_other`, and `p` (exact McNemar). Tasks in `this`'s order; a task with no
    shared episode is left out. Also `pairs` (all tasks), `unpaired_this` / `unpaired_other` (scenes
    only one side played) and `repeats_this` / `repeats_other` (repeated scenes left out). Raises
    ValueError when the two share no episode at all."""
    a, repeats_a = _by_scene(this)
    b, repeats_b = _by_scene(other)
    tasks: dict[str, list[tuple[bool, bool]]] = {}
    for key, ok in a.items():
        if key in b:
            tasks.setdefault(key[0], []).append((ok, b[key]))
    if not tasks:
        raise ValueError(
            f"the two evaluations share no episode (task and scene): this one ran {_span(this)}, the other "
            f"{_span(other)}; evaluate both on the same tasks with the same --seed"
        )
    rows = []
    for task, pairs in tasks.items():
        n = len(pairs)
        only_this = sum(x and not y for x, y in pairs)
        only_other = sum(y and not x for x, y in pairs)
        this_rate = sum(x for x, _ in pairs) / n
        other_rate = sum(y for _, y in pairs) / n
        rows.append(
            {
                "task": task,
                "pairs": n,
                "this": this_rate,
                "other": other_rate,
                "difference": this_rate - other_rate,
                "only_this": only_this,
                "only_other": only_other,
                "p": exact_mcnemar_p(only_this, only_other),
            }
        )
    pairs = sum(r["pairs"] for r in rows)
    return {
        "tasks": rows,
        "pairs": pairs,
        "unpaired_this": len(a) - pairs,
        "unpaired_other": len(b) - pairs,
        "repeats_this": repeats_a,
        "repeats_other": repeats_b,
    }


def pairing_note(cmp: Mapping[str, Any]) -> str | None:
    """One line on the episodes a `paired_comparison` left out, or None when it used them all."""
    parts = []
    if cmp["unpaired_this"] or cmp["unpaired_other"]:
        parts.append(
            f"{cmp['unpaired_this']} episodes of this evaluation and {cmp['unpaired_other']} of the other "
            "have no counterpart"
        )
    if cmp["repeats_this"] or cmp["repeats_other"]:
        parts.append(
            f"scenes played again left out: {cmp['repeats_this']} here, {cmp['repeats_other']} in the other "
            "(the env has fewer scenes than episodes)"
        )
    return f"paired {cmp['pairs']} episodes; " + "; ".join(parts) if parts else None


def _cells(row: Mapping[str, Any]) -> list[str]:
    return [
        row["task"],
        str(row["pairs"]),
        f"{100 * row['this']:.1f}",
        f"{100 * row['other']:.1f}",
        f"{100 * row['difference']:+.1f}",
        str(row["only_this"]),
        str(row["only_other"]),
        f"{row['p']:.3g}",
    ]


_HEADER = ["task", "paired episodes", "this %", "other %", "difference pp", "only this", "only other", "p (McNemar)"]


def paired_rich(cmp: Mapping[str, Any], title: str) -> Table:
    """Terminal view of a `paired_comparison`."""
    out = Table(title=title)
    for i, name in enumerate(_HEADER):
        out.add_column(name, justify="left" if i == 0 else "right")
    for row in cmp["tasks"]:
        out.add_row(*_cells(row))
    return out


def paired_markdown(cmp: Mapping[str, Any], title: str) -> str:
    """A `paired_comparison` as Markdown, with a line on how to read p."""
    lines = [
        f"# {title}",
        "",
        "Episodes matched on task and reset seed. `only this` / `only other`: episodes one policy solved and "
        "the other did not; p: exact McNemar test on those (two-sided), small when the split is more "
        "lopsided than chance.",
        "",
        "| " + " | ".join(_HEADER) + " |",
        "|---" + "|---:" * (len(_HEADER) - 1) + "|",
    ]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in cmp["tasks"]]
    note = pairing_note(cmp)
    return "\n".join(lines + ([f"\n{note}."] if note else [])) + "\n"
