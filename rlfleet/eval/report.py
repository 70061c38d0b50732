"""The evaluation report: per-task success, averaged over the task groups the env declares.

Why: a bare per-task list (50 rows for MT50) is hard to compare with papers, which average over
groups of tasks: VLA papers on MetaWorld (TinyVLA, SmolVLA, RLinf) over the easy / medium / hard
/ very-hard split of Seo et al. (2022), meta-RL work over ML45's 5 held-out tasks. Which groups
exist is the env's to say (`ChunkedEnv.task_groups()`, read through
`rlfleet.envs.registry.task_groups(name)`): this module knows no simulator. It turns
`evaluate_policy`'s `{task: success}` into that summary (JSON + Markdown + a rich table) and
prints before/after comparisons for fine-tuning runs. `write_before_after` is the one place a
run's before/after tables are written (local-mode RL and DAgger runs both call it).

All success values are fractions in [0, 1]; means are unweighted over tasks (each task counts
once, whatever its number of episodes), as in the published tables.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlfleet.envs.chains import CHAIN_LENGTH, chain_columns
from rlfleet.envs.registry import task_groups
from rlfleet.policies.checkpoint_io import run_folder

Groups = Mapping[str, Sequence[str]]
"""Group title -> its tasks, in report order (a task may be in several groups)."""

_MISSING = "-"


def _check(success: Mapping[str, float]) -> None:
    for task, value in success.items():
        if not (isinstance(value, numbers.Real) and 0.0 <= float(value) <= 1.0):
            raise ValueError(f"success of {task!r} must be a fraction in [0, 1], got {value!r}")


def _group(values: list[float]) -> dict[str, Any] | None:
    """Mean and count of a group, None when the group is empty (so 0% and "not run" differ)."""
    return {"success": sum(values) / len(values), "tasks": len(values)} if values else None


def _first_group(task: str, groups: Groups) -> str | None:
    return next((title for title, tasks in groups.items() if task in tasks), None)


def success_table(
    success: Mapping[str, float], episodes: Mapping[str, int] | None = None, groups: Groups | None = None
) -> dict[str, Any]:
    """Per-task success (fractions) with the mean of every group and overall.

    Returns a JSON-serialisable dict: `groups`: {title: {"success", "tasks"} or None when no task
    of it ran} in `groups` order, `mean`: float or None, `num_tasks`: int, `tasks`: [{"task",
    "group" (the first group holding it, None if none), "success", "episodes" (None if unknown)}]
    in the order of `success`.
    """
    _check(success)
    episodes = episodes or {}
    groups = groups or {}
    rows = [
        {
            "task": task,
            "group": _first_group(task, groups),
            "success": float(value),
            "episodes": int(episodes[task]) if task in episodes else None,
        }
        for task, value in success.items()
    ]
    overall = _group([r["success"] for r in rows])
    return {
        "groups": {
            title: _group([r["success"] for r in rows if r["task"] in tasks]) for title, tasks in groups.items()
        },
        "mean": overall["success"] if overall else None,
        "num_tasks": len(rows),
        "tasks": rows,
    }


def _pct(value: float | None) -> str:
    return _MISSING if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100.0 * value:.1f}"


def _summary_cells(table: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Success % and task count for each group column, then the overall mean."""
    groups = list(table["groups"].values())
    success = [_pct(g["success"]) if g else _MISSING for g in groups] + [_pct(table.get("mean"))]
    counts = [str(g["tasks"]) if g else "0" for g in groups] + [str(table.get("num_tasks", 0))]
    return success, counts


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def to_markdown(table: Mapping[str, Any], title: str) -> str:
    """The report as Markdown: an RLinf-style summary table, then one row per task."""
    success, counts = _summary_cells(table)
    lines = [
        f"# {title}",
        "",
        "Success rate (%) of the deterministic policy; split means are unweighted over the tasks evaluated.",
        "",
        _md_row(["Split", *table["groups"], "Avg."]),
        _md_row(["---"] + ["---:"] * (len(table["groups"]) + 1)),
        _md_row(["Success (%)", *success]),
        _md_row(["Tasks", *counts]),
        "",
        _md_row(["Task", "Group", "Success (%)", "Episodes"]),
        _md_row(["---", "---", "---:", "---:"]),
    ]
    for row in table["tasks"]:
        eps = _MISSING if row["episodes"] is None else str(row["episodes"])
        lines.append(_md_row([row["task"], row["group"] or _MISSING, _pct(row["success"]), eps]))
    lines.append("")
    return "\n".join(lines)


def evaluation_mode(policy_settings: Mapping[str, Any], sample: bool) -> str:
    """How an evaluation chose its actions, as `eval.json`'s `mode` says it (a later `--compare`
    against the report checks it): sampled, or deterministic (with tiny_oft's decoding of its bins)."""
    if sample:
        return "sampled"
    if policy_settings.get("name") == "tiny_oft":
        return f"deterministic, {policy_settings.get('decode', 'argmax')} decoding"
    return "deterministic"


def atomic_write(path: Path, text: str) -> None:
    """Write via a temp file and rename, so a reader (or a crash) never sees half a report."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_report(
    table: Mapping[str, Any], out_dir: Path, name: str = "eval", title: str | None = None
) -> tuple[Path, Path]:
    """Write `<out_dir>/<name>.json` and `<out_dir>/<name>.md` atomically; returns (json, md) paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    atomic_write(json_path, json.dumps(table, indent=2) + "\n")
    atomic_write(md_path, to_markdown(table, title or f"Evaluation: {name}"))
    return json_path, md_path


def _colour(value: float | None, text: str) -> str:
    if value is None:
        return text
    colour = "green" if value >= 0.8 else "yellow" if value >= 0.4 else "red"
    return f"[{colour}]{text}[/{colour}]"


def rich_table(table: Mapping[str, Any], title: str = "evaluation (success_once, deterministic policy)") -> Table:
    """Terminal view of a `success_table`: one row per task, then the split summary rows."""
    out = Table(title=title)
    out.add_column("task")
    out.add_column("group")
    out.add_column("success %", justify="right")
    out.add_column("episodes", justify="right")
    for row in table["tasks"]:
        eps = _MISSING if row["episodes"] is None else str(row["episodes"])
        out.add_row(row["task"], row["group"] or _MISSING, _colour(row["success"], _pct(row["success"])), eps)
    out.add_section()
    for label, group in table["groups"].items():
        if group:
            out.add_row(
                f"[bold]{label}[/bold]",
                "",
                _colour(group["success"], _pct(group["success"])),
                f"{group['tasks']} tasks",
            )
    if table.get("mean") is not None:
        out.add_row("[bold]Avg.[/bold]", "", f"[bold]{_pct(table['mean'])}[/bold]", f"{table['num_tasks']} tasks")
    return out


# --- before / after --------------------------------------------------------------------------


def compare(before: Mapping[str, float], after: Mapping[str, float], groups: Groups | None = None) -> dict[str, Any]:
    """Per-task before/after success and delta, plus means over the tasks present in both.

    Rows follow `before`'s order, then tasks only in `after`; a task missing on one side has
    None there and no delta, and is left out of the means (so the mean delta compares like with like).
    """
    _check(before)
    _check(after)
    tasks = list(before) + [t for t in after if t not in before]
    rows = []
    for task in tasks:
        b = float(before[task]) if task in before else None
        a = float(after[task]) if task in after else None
        delta = None if a is None or b is None else a - b
        rows.append({"task": task, "group": _first_group(task, groups or {}), "before": b, "after": a, "delta": delta})
    common = [r for r in rows if r["delta"] is not None]
    mean_b = sum(r["before"] for r in common) / len(common) if common else None
    mean_a = sum(r["after"] for r in common) / len(common) if common else None
    mean_d = None if mean_b is None else mean_a - mean_b
    return {"tasks": rows, "mean": {"before": mean_b, "after": mean_a, "delta": mean_d, "tasks": len(common)}}


def _delta(value: float | None) -> str:
    return _MISSING if value is None else f"{100.0 * value:+.1f}"


def compare_markdown(
    before: Mapping[str, float], after: Mapping[str, float], title: str, groups: Groups | None = None
) -> str:
    """Markdown before/after table (success %, delta in percentage points), ending with the mean row."""
    cmp = compare(before, after, groups)
    lines = [
        f"# {title}",
        "",
        _md_row(["Task", "Group", "Before (%)", "After (%)", "Delta (pp)"]),
        _md_row(["---", "---", "---:", "---:", "---:"]),
    ]
    for r in cmp["tasks"]:
        lines.append(
            _md_row([r["task"], r["group"] or _MISSING, _pct(r["before"]), _pct(r["after"]), _delta(r["delta"])])
        )
    m = cmp["mean"]
    mean_cells = [_pct(m["before"]), _pct(m["after"]), _delta(m["delta"])]
    lines.append(_md_row([f"**Mean** ({m['tasks']} tasks)", "", *mean_cells]))
    lines.append("")
    return "\n".join(lines)


def compare_rich(
    before: Mapping[str, float], after: Mapping[str, float], title: str = "success before / after fine-tuning"
) -> Table:
    """Terminal before/after table; deltas green when better, red when worse."""
    cmp = compare(before, after)
    out = Table(title=title)
    out.add_column("task")
    out.add_column("before %", justify="right")
    out.add_column("after %", justify="right")
    out.add_column("delta pp", justify="right")

    def coloured(delta: float | None) -> str:
        text = _delta(delta)
        if delta is None or abs(delta) < 1e-12:
            return text
        return f"[green]{text}[/green]" if delta > 0 else f"[red]{text}[/red]"

    for r in cmp["tasks"]:
        out.add_row(r["task"], _pct(r["before"]), _pct(r["after"]), coloured(r["delta"]))
    out.add_section()
    m = cmp["mean"]
    out.add_row(f"[bold]mean[/bold] ({m['tasks']} tasks)", _pct(m["before"]), _pct(m["after"]), coloured(m["delta"]))
    return out


def chain_line(metrics: Mapping[str, float]) -> str:
    """One line of chain metrics (a chained env's whole-chain success alone reads 0% for most policies)."""
    lens = sorted((k for k in metrics if k.startswith("success_len_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    cells = " / ".join(f"{100 * metrics[k]:.0f}" for k in lens)
    return f"avg_num_subtasks {metrics['avg_num_subtasks']:.2f}, success_len_1..{len(lens)} {cells}%"


def chain_markdown(rows: Mapping[str, Mapping[str, Any]], title: str, chain_length: int = CHAIN_LENGTH) -> str:
    """RLinf's CALVIN table: one row per model or setting, success_len_k in % and avg_num_subtasks."""
    cols = chain_columns(chain_length)
    lines = [f"# {title}", "", "| | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, m in rows.items():
        cells = [f"{100 * m[c]:.1f}%" for c in cols[:-1]] + [f"{m['avg_num_subtasks']:.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_chain_table(
    folder: Path, rows: Mapping[str, Mapping[str, Any]], title: str, chain_length: int = CHAIN_LENGTH
) -> str:
    """`eval_chain.md` in `folder` (the chain table of one evaluation, atomically); returns its text."""
    text = chain_markdown(rows, title, chain_length)
    atomic_write(Path(folder) / "eval_chain.md", text)
    return text


def write_before_after(
    run_dir: Path, summary: Mapping[str, Any], experiment: str, env_name: str, chain_episodes: int = 0
) -> None:
    """A finished run's before/after tables, from its summary: `before_after.md` (per task and per
    task group of env `env_name`, also printed) when it has `eval_before` and `eval_success`, and for
    chained envs `before_after_chain.md` (RLinf's CALVIN table) when it has `eval_chain_before` and
    `eval_chain`. `chain_episodes` (eval chains per scene) goes into that table's title."""
    run_dir = Path(run_dir)
    before, after = summary.get("eval_before"), summary.get("eval_success")
    if not (before and after):
        return
    method = summary.get("method", "RL")  # DAgger runs name themselves
    title = f"{experiment}: success before / after {method} ({summary.get('train_seconds')} s of training)"
    atomic_write(run_dir / "before_after.md", compare_markdown(before, after, title, task_groups(env_name)))
    Console().print(compare_rich(before, after, title=f"success before / after {method} fine-tuning"))
    chain_before, chain_after = summary.get("eval_chain_before"), summary.get("eval_chain")
    if chain_before and chain_after:
        n = len([k for k in chain_after["all"] if k.startswith("success_len_")])
        rows = {
            f"{task} {when}": table[task]
            for task in chain_before
            for when, table in (("before", chain_before), ("after", chain_after))
        }
        per_scene = f" ({chain_episodes} eval chains per scene)" if chain_episodes else ""
        text = chain_markdown(rows, f"{experiment}: chains before / after {method}{per_scene}", n)
        atomic_write(run_dir / "before_after_chain.md", text)
        print(text, flush=True)


def _final_episode_counts(checkpoint: Path, after: Mapping[str, float]) -> dict[str, int] | None:
    """Episodes per task of the final evaluation of the run `checkpoint` belongs to, from its
    episodes.jsonl; None where that is not known (no run folder, no file, a file that does not read)."""
    from rlfleet.eval.paired import EPISODES_FILE, read_episodes  # paired imports this module

    run = run_folder(checkpoint)
    try:
        played = read_episodes(run / EPISODES_FILE) if run is not None else []
    except ValueError:  # missing or damaged: the card says "-" rather than failing the export
        return None
    return {task: sum(r["task"] == task for r in played) for task in after} if played else None


def checkpoint_eval_markdown(summary: Mapping[str, Any], checkpoint: Path, env_name: str) -> str | None:
    """The evaluation section of an exported checkpoint's model card (`rlfleet.policies.hub`):
    the run's before/after table, its final evaluation, or the report `rlfleet eval` left."""
    after = summary.get("eval_success")
    groups = task_groups(env_name)  # the env's own report groups (MetaWorld: difficulty levels)
    if after and summary.get("eval_before"):
        return compare_markdown(summary["eval_before"], after, "Success before / after RL fine-tuning", groups)
    if after:
        counts = _final_episode_counts(checkpoint, after)
        return to_markdown(
            success_table(after, counts, groups=groups), "Evaluation (success_once, deterministic policy)"
        )
    if (checkpoint / "eval" / "eval.md").exists():  # `rlfleet eval CHECKPOINT` wrote one
        return (checkpoint / "eval" / "eval.md").read_text()
    return None
