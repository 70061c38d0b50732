"""docs/results.md, built from the committed data in docs/results/ (JSON and PNG, no checkpoints).

    python bench/results_page.py            # rewrite docs/results.md from docs/results/
    python bench/results_page.py --check    # exit 1 when docs/results.md differs from the rebuilt page
    python bench/results_page.py --add RUNS NAME   # copy a bench/reproduce.py folder's data in

`python bench/reproduce.py --report-only` (no recipe) does the same as the first. The page is a
function of the folder only (no clock, no git, no machine), so the same data gives the same bytes;
tests/unit/test_results_page.py checks the committed page against it.

What the folder holds:

- `metaworld_mt50/`, `metaworld_ml45/`: a measured 3-seed result each (`--add` copies it from a
  `bench/reproduce.py` folder: results.json with the commands, commit and wall times, each seed's
  summary.json, curves.json and the PNG plots). Their sections show success by difficulty group
  (rlfleet.envs.metaworld.difficulty) before and after RL, mean +- standard error over the seeds,
  beside RLinf's published rows; "not yet measured" while the folder is absent.
- `metaworld_mt50_validation/`: the settings tried on the validation split before the MT50 run
  (`--add-candidate` copies one run's summary.json in, with the overrides it ran): one row each,
  success by difficulty before and after RL on validation episodes, so the choice can be checked.
- `published/rlinf_metaworld_mt50.json`: RLinf's MT50 table, with its source.
- `headline_5task.json`: the three 5-task recipes' rows, transcribed from the earlier hand-written
  page (their per-seed summaries were never committed), marked so.
- `hf_oft_quickstart_cpu/`: one run's summary, episodes and throughput bench, and `section.json`
  with the section's words.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "results.md"
MEASURED = {"mt50": "metaworld_mt50", "ml45": "metaworld_ml45"}
SCREENS = {"mt50": "metaworld_mt50_validation"}  # settings tried on validation before the 3-seed run
COPIED = ("results.json", "curves.json", "wall_seconds.json")  # and seed*/summary.json, *.png


# --- numbers -----------------------------------------------------------------------------------


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean over seeds (0 for one value, NaN for none)."""
    if not values:
        return math.nan, math.nan
    m = sum(values) / len(values)
    if len(values) == 1:
        return m, 0.0
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))


def binomial_se(p: float, n: int) -> float:
    """One evaluation's standard error at success rate p on n episodes: sqrt(p (1 - p) / n)."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n > 0 and not math.isnan(p) else math.nan


def pm(pair: tuple[float, float], scale: float = 100.0, signed: bool = False, digits: int = 1) -> str:
    m, se = pair
    if math.isnan(m):
        return "-"
    return f"{scale * m:{'+' if signed else ''}.{digits}f} +- {scale * se:.{digits}f}"


# --- measured MetaWorld results by difficulty --------------------------------------------------


def load_measured(folder: Path) -> dict[str, Any] | None:
    """A `--add`ed result: its results.json and each seed's summary.json; None when absent."""
    seeds = sorted(folder.glob("seed*/summary.json"), key=lambda p: int(p.parent.name[4:]))
    if not seeds:
        return None
    meta = json.loads((folder / "results.json").read_text()) if (folder / "results.json").exists() else {}
    return {"meta": meta, "summaries": [json.loads(p.read_text()) for p in seeds], "folder": folder.name}


def group_table(summaries: list[dict[str, Any]], tasks: set[str] | None) -> dict[str, dict[str, Any]]:
    """Per difficulty group and "avg" (RLinf's mean of the group means): before, after and gain,
    mean +- standard error over seeds, and the tasks counted."""
    from rlfleet.envs.metaworld.difficulty import DIFFICULTY_GROUPS, group_average, group_means

    per_seed: dict[str, dict[str, list[float]]] = {}
    for s in summaries:
        before, after = group_means(s["eval_before"], tasks), group_means(s["eval_success"], tasks)
        before["avg"], after["avg"] = group_average(before), group_average(after)
        for g in after:
            row = per_seed.setdefault(g, {"before": [], "after": [], "gain": []})
            row["before"].append(before[g])
            row["after"].append(after[g])
            row["gain"].append(after[g] - before[g])
    known = set(summaries[0]["eval_success"]) & (tasks if tasks is not None else set(summaries[0]["eval_success"]))
    out = {}
    for g in [*DIFFICULTY_GROUPS, "avg"]:
        if g in per_seed:
            counted = len(known) if g == "avg" else sum(t in known for t in DIFFICULTY_GROUPS[g])
            out[g] = {k: mean_se(v) for k, v in per_seed[g].items()} | {"tasks": counted}
    return out


def rlinf_rows(published: dict[str, Any]) -> list[str]:
    return [
        f"| {r['policy']} (RLinf) | "
        + " | ".join(f"{r['success'][g]:.1f}" for g in [*published["groups"], "avg"])
        + " |"
        for r in published["rows"]
    ]


def difficulty_section(kind: str, result: dict[str, Any] | None, published: dict[str, Any]) -> list[str]:
    """The MT50 or ML45 section: success by difficulty before / after RL (ours, when measured)
    beside RLinf's published MT50 rows."""
    from rlfleet.envs.metaworld.difficulty import GROUP_TITLES

    title = (
        "MetaWorld MT50 by difficulty, before and after RL"
        if kind == "mt50"
        else "MetaWorld ML45: 45 training tasks by difficulty, the 5 held-out tasks apart"
    )
    head = "| policy | " + " | ".join(GROUP_TITLES.values()) + " | Avg. |"
    rule = "|---" + "|---:" * (len(GROUP_TITLES) + 1) + "|"
    source = f"[RLinf's MetaWorld page]({published['url']})"
    lines = [
        f"## {title}",
        "",
        "Groups: the difficulty split of Seo et al. (Masked World Models) that LeRobot's MetaWorld evaluation and "
        f"{source} use, 28 / 11 / 6 / 5 tasks (`rlfleet/envs/metaworld/difficulty.py`).",
        "",
    ]
    if result is None:
        lines += [
            f"**Not yet measured**: no 3-seed run's data in `docs/results/{MEASURED[kind]}/`. `python "
            f"bench/results_page.py --add RUNS {MEASURED[kind]} --selected-on validation` adds a `bench/reproduce.py` "
            "folder (RUNS) and this section then shows its table.",
            "",
        ]
        if kind == "mt50":
            lines += [f"What it will stand beside, success (%) as {source} publishes it ({published['average']}):", ""]
            lines += [head, rule, *rlinf_rows(published), ""]
        else:
            lines += [f"{source} publishes no ML45 rows.", ""]
        return lines
    from rlfleet.envs.metaworld.difficulty import DIFFICULTY

    meta, summaries = result["meta"], result["summaries"]
    n = len(summaries)
    held_out: set[str] = set()
    train: set[str] | None = None
    if kind == "ml45":
        from rlfleet.envs.metaworld import TASK_SETS

        held_out = set(TASK_SETS["ML45_test"])
        train = set(TASK_SETS["ML45_train"])
    table = group_table(summaries, train)
    episodes = int(meta.get("episodes_per_task", 0))
    starts = [s for s in meta.get("sft_starts", []) if s]
    repeats = (
        "each a full repeat (its own SFT start on the same demos, its own RL)"
        if len(starts) == n and len(set(starts)) == n
        else "**sharing one SFT start** (the spread leaves out the SFT's own variance)"
    )
    selected = {"validation": "selected on the validation split", "test": "**selected on the test episodes**"}
    lines += [
        f"`{meta.get('recipe', result['folder'])}`, {n} seeds, {repeats}, evaluated on the same test episodes; "
        f"{selected.get(meta.get('selected_on', ''), '**how it was selected is not recorded**')}; success (%), "
        "mean +- standard error over the seeds; Avg. is the mean of the group means, as RLinf's. "
        f"{meta.get('policy_note', '')}".rstrip(),
        "",
        head,
        rule,
    ]
    for label, key in (("SFT start (ours)", "before"), ("after RL (ours)", "after"), ("gain (points)", "gain")):
        cells = [pm(table[g][key], signed=key == "gain") if g in table else "-" for g in [*GROUP_TITLES, "avg"]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if kind == "mt50":
        lines += rlinf_rows(published)
    lines += [""]
    if episodes:
        errs = []
        for g in [*GROUP_TITLES, "avg"]:
            if g in table:
                p, k = table[g]["after"][0], table[g]["tasks"] * episodes
                errs.append(f"{GROUP_TITLES.get(g, 'Avg.')} {100 * binomial_se(p, k):.1f} ({k} episodes)")
        lines += [
            f"One evaluation's binomial standard error after RL, sqrt(p (1 - p) / n), in points: {'; '.join(errs)}.",
            "",
        ]
    if held_out:
        lines += ["The 5 held-out tasks (never trained on), per task:", "", "| task | group | before | after | gain |"]
        lines += ["|---|---|---:|---:|---:|"]
        for t in sorted(held_out):
            if t in summaries[0]["eval_success"]:
                b = mean_se([s["eval_before"][t] for s in summaries])
                a = mean_se([s["eval_success"][t] for s in summaries])
                d = mean_se([s["eval_success"][t] - s["eval_before"][t] for s in summaries])
                group = GROUP_TITLES[DIFFICULTY[t]]
                lines.append(f"| {t} | {group} | {pm(b)} | {pm(a)} | {pm(d, signed=True)} |")
        lines += [""]
    lines += measured_footer(meta, summaries, result["folder"])
    return lines


def screen_section(kind: str, folder: Path) -> list[str]:
    """The settings tried on the validation split before a 3-seed run, one row each: success by
    difficulty group before and after RL on validation episodes (one seed each), and the gain."""
    from rlfleet.envs.metaworld.difficulty import GROUP_TITLES

    screen = json.loads((folder / "screen.json").read_text())
    lines = [
        f"### How the {kind.upper()} settings were chosen: validation episodes",
        "",
        f"{screen['note']} Each row is one run of `{screen['recipe']}` with the overrides shown, seed "
        f"{screen['seed']}, evaluated on the validation split "
        f"({screen['episodes_per_task']} episodes per task from seed {screen['validation_seed']:,}, apart from the "
        "test episodes the table above reports); success (%) by group, SFT start -> after RL.",
        "",
        "| candidate | overrides | env steps | " + " | ".join(GROUP_TITLES.values()) + " | Avg. | gain |",
        "|---|---|" + "---:|" * (len(GROUP_TITLES) + 3),
    ]
    for cand in screen["candidates"]:
        summary = json.loads((folder / cand["name"] / "summary.json").read_text())
        table = group_table([summary], None)
        cells = [
            f"{100 * table[g]['before'][0]:.1f} -> {100 * table[g]['after'][0]:.1f}" if g in table else "-"
            for g in [*GROUP_TITLES, "avg"]
        ]
        gain = round(100 * table["avg"]["gain"][0], 1) + 0.0  # never "-0.0"
        chosen = " (chosen)" if cand["name"] == screen.get("chosen") else ""
        overrides = " ".join(f"`{o}`" for o in cand["overrides"]) or "(the recipe)"
        steps = f"{summary['env_steps']:,}" if "env_steps" in summary else "-"
        lines.append(f"| {cand['name']}{chosen} | {overrides} | {steps} | " + " | ".join(cells) + f" | {gain:+.1f} |")
    lines += ["", screen.get("after", ""), ""] if screen.get("after") else [""]
    return lines


def measured_footer(meta: dict[str, Any], summaries: list[dict[str, Any]], folder: str) -> list[str]:
    steps = ", ".join(f"{s['env_steps']:,}" for s in summaries)
    walls = meta.get("wall_seconds") or []
    lines = [
        f"Env steps per seed: {steps}"
        + (f"; wall seconds per seed: {', '.join(f'{w:.0f}' for w in walls)}" if walls else "")
        + (f"; commit `{meta['commit']}`" if meta.get("commit") else "")
        + f". Data: [results/{folder}/](results/{folder}/).",
        "",
    ]
    for png in meta.get("plots", []):
        lines += [f"![{png}](results/{folder}/{png})", ""]
    if meta.get("commands"):
        lines += ["```", *meta["commands"], "```", ""]
    return lines


# --- the transcribed 5-task rows ---------------------------------------------------------------


def _cell(value: float | list[float], unit: str, signed: bool = False) -> str:
    digits, suffix = (1, "%") if unit == "percent" else (2, "")
    if isinstance(value, list):
        text = pm((value[0], value[1]), 1.0, signed, digits)
    else:
        text = f"{value:{'+' if signed else ''}.{digits}f}"
    return text + (" points" if signed and unit == "percent" else suffix if not signed else "")


def headline_section(data: dict[str, Any]) -> list[str]:
    lines = [
        "## The 5-task recipes: 3 seeds each (transcribed, selected on the test episodes)",
        "",
        f"**Transcribed** from {data['source']}. **Selected on the test episodes.** {data['selected_on_note']} "
        f"Env steps count {data['env_steps_counted']}; {data['sft_start']}. Each recipe's full page: "
        f"[{data['details']}]({data['details']}).",
        "",
        "| recipe | env steps per seed | before | after | gain | aim | met |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in data["rows"]:
        u = r["unit"]
        cells = [r["result"], r["env_steps_per_seed"], _cell(r["before"], u), _cell(r["after"], u)]
        cells += [_cell(r["gain"], u, signed=True), r["aim"], r["met"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""]
    for note in data["notes"]:
        lines += [note, ""]
    lines += ["| result | aim | command |", "|---|---|---|"]
    lines += [f"| {c['result']} | {c['aim']} | {c['command']} |" for c in data["commands"]]
    lines += [
        "",
        "Success on held-out episodes against env steps during training, each seed grey, the mean blue (+- 1 "
        "standard error):",
        "",
    ]
    plots = data["plots"]
    for k in range(0, len(plots), 2):
        pair = plots[k : k + 2]
        titles = [p["title"] if k == 0 else f"**{p['title']}**" for p in pair]
        if k == 0:
            lines += ["| " + " | ".join(titles) + " |", "|---" * len(pair) + "|"]
        else:
            lines.append("| " + " | ".join(titles) + " |")
        lines.append("| " + " | ".join(f"![{p['png'][:-4]}](results/{p['png']})" for p in pair) + " |")
    lines += [""]
    return lines


# --- one run with a transformers backbone ------------------------------------------------------


def single_run_section(folder: Path) -> list[str]:
    """A one-seed run's section: before / after per task from its summary, paired on its episodes
    (rlfleet.eval.paired), the throughput bench beside it, and the words from section.json."""
    from rlfleet.eval.paired import paired_comparison, read_episodes

    words = json.loads((folder / "section.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    pairs = {
        r["task"]: r
        for r in paired_comparison(
            read_episodes(folder / "episodes.jsonl"), read_episodes(folder / "episodes_before.jsonl")
        )["tasks"]
    }
    lines = [f"## {words['title']}", "", words["intro"], ""]
    lines += ["| task | before (SFT) % | after RL % | only after | only before | p (McNemar) |"]
    lines += ["|---|---:|---:|---:|---:|---:|"]
    for task, after in summary["eval_success"].items():
        p = pairs[task]
        before = summary["eval_before"][task]
        lines.append(
            f"| {task} | {100 * before:.1f} | {100 * after:.1f} | {p['only_this']} | {p['only_other']} | {p['p']:.2g} |"
        )
    only_after = sum(p["only_this"] for p in pairs.values())
    only_before = sum(p["only_other"] for p in pairs.values())
    lines.append(
        f"| **mean** | **{100 * summary['eval_before_mean']:.1f}** | **{100 * summary['eval_success_mean']:.1f}** "
        f"| {only_after} | {only_before} | |"
    )
    lines += ["", words["after_table"], "", words["bench_intro"], ""]
    bench = json.loads((folder / words["bench"]).read_text())
    lines += [
        "| policy | training env steps/s (3 repeats) | median "
        "| CPU us per env step: env workers / inference / learner / actor |",
        "|---|---|---:|---|",
    ]
    for name, label in words["bench_policies"].items():
        rates = bench["env_steps_per_s"][name]
        mid = rates.index(median(rates))
        us = bench["us_per_env_step"][name][mid]  # the median repeat's split
        split = " / ".join(f"{us[k]:,.0f}" for k in ("env workers", "inference", "learner", "actor"))
        lines.append(f"| {label} | {', '.join(f'{r:,.0f}' for r in rates)} | {median(rates):,.0f} | {split} |")
    lines += ["", words["bench_after"].format(ratio=bench["hf_over_tiny"]), ""]
    return lines


# --- the page ----------------------------------------------------------------------------------

INTRO = """# Results

What each recipe reaches, before and after RL, on held-out test episodes: the MetaWorld MT50 and
ML45 tables by difficulty beside RLinf's published rows, the 5-task recipes, and one run with a
transformers backbone. This page is built from the data in [results/](results/) (JSON and PNG:
per-seed summaries, evaluation tables and curves; no checkpoints) by `python bench/reproduce.py
--report-only` (or `python bench/results_page.py`); edit the data or the builder, not the page (a
test checks that they agree). Each row says how its numbers were chosen: on a validation split, or
on the test episodes themselves. Per-recipe pages with every table and command:
[results_details.md](results_details.md); the history of attempts:
[results_history.md](results_history.md). All numbers were measured on the development machine:
2 CPU cores, no GPU, shared with other work while the runs ran.
"""


def build_page(data: Path = DATA) -> str:
    published = json.loads((data / "published" / "rlinf_metaworld_mt50.json").read_text())
    lines = INTRO.rstrip("\n").split("\n") + [""]
    for kind in ("mt50", "ml45"):
        lines += difficulty_section(kind, load_measured(data / MEASURED[kind]), published)
        if kind in SCREENS and (data / SCREENS[kind] / "screen.json").exists():
            lines += screen_section(kind, data / SCREENS[kind])
    lines += headline_section(json.loads((data / "headline_5task.json").read_text()))
    if (data / "hf_oft_quickstart_cpu" / "section.json").exists():
        lines += single_run_section(data / "hf_oft_quickstart_cpu")
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def add_result(runs: Path, name: str, data: Path = DATA, selected_on: str = "") -> Path:
    """Copy a bench/reproduce.py folder's small files (results.json, curves.json, wall_seconds.json,
    the PNG plots, each seed's summary.json) into data/name; nothing else (no checkpoints).
    `selected_on` ("validation" or "test"): what the choices behind the recipe looked at, which
    the page states."""
    seeds = sorted(runs.glob("seed*/summary.json"))
    if not seeds or not (runs / "results.json").exists():
        raise FileNotFoundError(f"{runs} holds no bench/reproduce.py result (results.json, seed*/summary.json)")
    dest = data / name
    if dest.exists():  # a result added again replaces the earlier one whole: seeds never mix
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in [*(runs / c for c in COPIED), *sorted(runs.glob("*.png"))]:
        if f.exists():
            shutil.copy2(f, dest / f.name)
    for s in seeds:
        (dest / s.parent.name).mkdir(exist_ok=True)
        shutil.copy2(s, dest / s.parent.name / "summary.json")
    if selected_on:
        meta = json.loads((dest / "results.json").read_text())
        (dest / "results.json").write_text(json.dumps(meta | {"selected_on": selected_on}, indent=2) + "\n")
    return dest


def add_candidate(run: Path, name: str, candidate: str, overrides: list[str], data: Path = DATA) -> Path:
    """Copy one validation run's summary.json into data/name/candidate and list it, with the
    overrides it ran, in data/name/screen.json (which holds the section's words and the choice)."""
    summary = json.loads((run / "summary.json").read_text())
    if summary.get("eval_split") != "validation" or "eval_before" not in summary:
        raise ValueError(
            f"{run}: not a validation run with a before/after evaluation (eval.split=validation eval.before=true)"
        )
    dest = data / name
    (dest / candidate).mkdir(parents=True, exist_ok=True)
    shutil.copy2(run / "summary.json", dest / candidate / "summary.json")
    screen_file = dest / "screen.json"
    screen = json.loads(screen_file.read_text())
    screen["candidates"] = [c for c in screen["candidates"] if c["name"] != candidate]
    screen["candidates"].append({"name": candidate, "overrides": overrides})
    screen_file.write_text(json.dumps(screen, indent=2) + "\n")
    return dest / candidate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DATA), help="the data folder (default docs/results)")
    p.add_argument("--out", default=str(PAGE), help="the page (default docs/results.md)")
    p.add_argument("--check", action="store_true", help="exit 1 when the page differs from the rebuilt one")
    p.add_argument("--add", nargs=2, metavar=("RUNS", "NAME"), help="copy a bench/reproduce.py folder's data in")
    p.add_argument(
        "--selected-on", choices=("validation", "test"), default="", help="with --add: what its choices looked at"
    )
    p.add_argument(
        "--add-candidate",
        nargs=3,
        metavar=("RUN", "NAME", "CANDIDATE"),
        help="copy a validation run's summary into NAME/CANDIDATE and list it in NAME/screen.json",
    )
    p.add_argument("--overrides", nargs="*", default=[], help="with --add-candidate: the overrides it ran")
    args = p.parse_args(argv)
    data, out = Path(args.data), Path(args.out)
    if args.add_candidate:
        run, name, candidate = args.add_candidate
        print(f"added {add_candidate(Path(run), name, candidate, args.overrides, data)}")
    if args.add:
        print(f"added {add_result(Path(args.add[0]), args.add[1], data, args.selected_on)}")
    page = build_page(data)
    if args.check:
        same = out.exists() and out.read_text() == page
        print(f"{out}: {'up to date' if same else 'differs from the page its data builds'}")
        return 0 if same else 1
    out.write_text(page)
    print(f"wrote {out} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
