"""Reproduce a recipe's learning result over several training seeds (CleanRL's benchmark style).

    python bench/reproduce.py RECIPE --seeds 3 [--out DIR] [key=value ...]

Runs `rlfleet train RECIPE runner.seed=S env.seed=S sft.seed=S eval.before=true
runner.logger.log_path=DIR/seedS [key=value ...]` for S = 0..N-1, one after another (they share the
cores, so budgets in env steps compare seeds fairly; a wall-clock budget does not). Each seed is a
full repeat: a recipe that builds its SFT start (`demos.bootstrap`) behaviour-clones its own on the
same demos (`sft.seed`: the policy's initialisation and the minibatch order; the demos' `demos.seed`
stays), then runs its own RL; `--shared-sft` gives every seed the recipe's one SFT start instead (as
results before issue 50 did). Each run evaluates its starting policy and its final policy on the
same held-out eval episodes (`eval.seed` up, which no training env or demo replays:
docs/evaluation.md "Held-out seeds") and, with `eval.every_updates` / `eval.every_seconds`, writes
eval/* curves to TensorBoard. Then it writes DIR/results.md (per task and mean: success before and
after as mean +- standard error over the repeats, the binomial standard error of one evaluation, the
exact commands, the commit, the wall time) and PNG plots of success against env steps and against
wall clock (mean, standard error band and each seed).

`--average-last K` also averages each seed's last K kept checkpoints (`rlfleet average RUN --last
K`: the mean of their weights, RUN/checkpoints/average), evaluates that policy on the run's own
held-out episodes (`rlfleet eval`, kept while the same checkpoints are averaged) and adds its table
and its episode-by-episode pairing with the start to the page.

`--report-only` rebuilds the page and plots from the runs already in DIR. A command that was cut
(or one that failed) keeps its work: run it again with the same DIR and it skips every seed that
finished its budget, and continues (`rlfleet train --resume`) every seed that has a checkpoint:
one cut mid-run, or one that finished a smaller `runner.total_env_steps` than the command now asks
for, so a 1M-step result extends to 3M without rerunning the first million. A resumed seed keeps
its first evaluation of the starting policy. `--fresh` reruns every seed from scratch. The page
names each seed's commit and where it was resumed; a seed's wall time adds up all its lives, a
killed one's counted up to the last write to its log.

`python bench/reproduce.py --report-only` with no recipe rebuilds docs/results.md from the committed
data in docs/results/ (bench/results_page.py).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


# --- statistics --------------------------------------------------------------------------------


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n); 0 for a single value)."""
    arr = np.asarray(values, np.float64)
    if arr.size == 0:
        return math.nan, math.nan
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else 0.0
    return float(arr.mean()), se


def aggregate(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-task and mean success before / after over seeds, from the runs' summary.json.

    The mean row averages each seed's task mean first, so its standard error is over seeds."""
    tasks = list(summaries[0]["eval_success"])
    rows = {}
    for task in tasks:
        before = [s["eval_before"][task] for s in summaries if "eval_before" in s]
        after = [s["eval_success"][task] for s in summaries]
        gain = [s["eval_success"][task] - s["eval_before"][task] for s in summaries if "eval_before" in s]
        rows[task] = {"before": mean_se(before), "after": mean_se(after), "gain": mean_se(gain)}
    seed_before = [float(np.mean([s["eval_before"][t] for t in tasks])) for s in summaries if "eval_before" in s]
    seed_after = [float(np.mean([s["eval_success"][t] for t in tasks])) for s in summaries]
    seed_gain = [a - b for a, b in zip(seed_after, seed_before)] if len(seed_before) == len(seed_after) else []
    out = {
        "tasks": rows,
        "mean": {"before": mean_se(seed_before), "after": mean_se(seed_after), "gain": mean_se(seed_gain)},
        "seeds": len(summaries),
        "env_steps": [s["env_steps"] for s in summaries],
        "train_seconds": [s["train_seconds"] for s in summaries],  # main() puts every life's in (run_curve)
    }
    chains = [s for s in summaries if s.get("eval_chain")]
    if chains:  # CALVIN-style: avg_num_subtasks and success_len_k over all chains
        keys = list(chains[0]["eval_chain"]["all"])
        out["chain"] = {}
        for key in keys:
            before = [s["eval_chain_before"]["all"][key] for s in chains if s.get("eval_chain_before")]
            after = [s["eval_chain"]["all"][key] for s in chains]
            gain = [a - s["eval_chain_before"]["all"][key] for a, s in zip(after, chains) if s.get("eval_chain_before")]
            out["chain"][key] = {"before": mean_se(before), "after": mean_se(after), "gain": mean_se(gain)}
    return out


def curve_metric(summary: dict[str, Any]) -> str:
    """What a run's curve shows: avg_num_subtasks for chained envs (a whole chain is rarely
    solved, so success_once stays near 0), else the mean success_once over tasks."""
    return "avg_num_subtasks" if summary.get("eval_chain") else "success_once"


# --- curves ------------------------------------------------------------------------------------


def read_curves(tensorboard_dir: Path, metric: str = "success_once") -> dict[str, np.ndarray]:
    """eval/<metric> and eval/elapsed_s of one run as arrays: steps, seconds, success (the metric).
    A run without TensorBoard (runner.logger.tensorboard=false) has only its end points: empty arrays."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    empty = {"steps": np.zeros(0), "seconds": np.zeros(0), "success": np.zeros(0)}
    if not tensorboard_dir.is_dir():
        return empty
    acc = EventAccumulator(str(tensorboard_dir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags().get("scalars", []))
    if f"eval/{metric}" not in tags:
        return empty
    success = acc.Scalars(f"eval/{metric}")
    elapsed = {e.step: e.value for e in acc.Scalars("eval/elapsed_s")} if "eval/elapsed_s" in tags else {}
    steps = np.array([e.step for e in success], np.float64)
    seconds = np.array([elapsed.get(e.step, math.nan) for e in success], np.float64)
    # A resumed run's learner counts elapsed_s from 0 again: each life continues where the last
    # one's final evaluation left off, so the wall-clock axis runs on across lives.
    offset, raw_prev, last = 0.0, -math.inf, 0.0
    for i, t in enumerate(seconds):
        if math.isfinite(t):
            if t < raw_prev:
                offset = last
            raw_prev, seconds[i] = float(t), t + offset
            last = float(seconds[i])
    return {
        "steps": steps,
        "seconds": seconds,
        "success": np.array([e.value for e in success], np.float64),
        "seconds_offset": np.array(offset),  # the earlier lives' time, for the end point
    }


def run_curve(summary: dict[str, Any], curves: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A run's success curve with its end points: the starting policy at (0 steps, 0 s) and the
    final evaluation at (env_steps, train_seconds) of summary.json."""
    tasks = list(summary["eval_success"])
    steps, seconds, success = list(curves["steps"]), list(curves["seconds"]), list(curves["success"])
    chained = curve_metric(summary) == "avg_num_subtasks"
    before = (
        summary.get("eval_chain_before", {}).get("all", {}).get("avg_num_subtasks")
        if chained
        else (float(np.mean([summary["eval_before"][t] for t in tasks])) if "eval_before" in summary else None)
    )
    if before is not None:
        steps, seconds, success = [0.0] + steps, [0.0] + seconds, [float(before)] + success
    steps.append(float(summary["env_steps"]))
    earlier = float(curves.get("seconds_offset", 0.0))  # a summary older than train_seconds_all_lives
    seconds.append(float(summary.get("train_seconds_all_lives", earlier + summary["train_seconds"])))
    after = (
        summary["eval_chain"]["all"]["avg_num_subtasks"]
        if chained
        else float(np.mean([summary["eval_success"][t] for t in tasks]))
    )
    success.append(float(after))
    return {"steps": np.array(steps), "seconds": np.array(seconds), "success": np.array(success)}


def mean_curve(
    curves: list[dict[str, np.ndarray]], x: str, points: int = 100
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeds interpolated onto a common x grid (up to the shortest run): grid, mean, standard error."""
    usable = [(c[x][np.isfinite(c[x])], c["success"][np.isfinite(c[x])]) for c in curves]
    usable = [(xs, ys) for xs, ys in usable if xs.size]
    if not usable:
        raise ValueError(f"no curve has {x}")
    end = min(xs.max() for xs, _ in usable)
    grid = np.linspace(0.0, end, points)
    ys = np.stack([np.interp(grid, xs, y) for xs, y in usable])
    se = ys.std(axis=0, ddof=1) / math.sqrt(len(ys)) if len(ys) > 1 else np.zeros_like(grid)
    return grid, ys.mean(axis=0), se


def plot_curves(
    curves: list[dict[str, np.ndarray]], x: str, path: Path, title: str, metric: str = "success_once"
) -> Path:
    """Success (or avg_num_subtasks) against `x` ("steps" or "seconds"): each seed thin, the mean
    thick, +- 1 SE shaded."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    grid, mean, se = mean_curve(curves, x)
    scale, label = (
        (1e6, "env steps (millions)") if x == "steps" else (60.0, "wall clock since training started (minutes)")
    )
    # success_once in %, avg_num_subtasks as it is (0 to the chain length)
    yscale, ylabel, ylim = (
        (1.0, "eval avg_num_subtasks", None)
        if metric == "avg_num_subtasks"
        else (
            100.0,
            "eval success_once (%)",
            (-2, 102),
        )
    )
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    for k, c in enumerate(curves):
        ok = np.isfinite(c[x])
        ax.plot(
            c[x][ok] / scale,
            yscale * c["success"][ok],
            lw=0.8,
            alpha=0.5,
            marker=".",
            ms=3,
            label="seeds" if k == 0 else None,
            color="tab:gray",
        )
    ax.plot(
        grid / scale,
        yscale * mean,
        lw=2,
        color="tab:blue",
        label=f"mean of {len(curves)} seed{'' if len(curves) == 1 else 's'}",
    )
    ax.fill_between(
        grid / scale, yscale * (mean - se), yscale * (mean + se), color="tab:blue", alpha=0.2, label="+- 1 SE"
    )
    ax.set_xlabel(label)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


# --- the page ----------------------------------------------------------------------------------


def _pm(pair: tuple[float, float], scale: float = 100.0, signed: bool = False, digits: int = 1) -> str:
    mean, se = pair
    if math.isnan(mean):
        return "-"
    sign = "+" if signed else ""
    return f"{scale * mean:{sign}.{digits}f} +- {scale * se:.{digits}f}"


def binomial_se(p: float, episodes: int) -> float:
    """The standard error of one success rate p read from `episodes` independent episodes,
    sqrt(p (1 - p) / n): the sampling of one evaluation, which a spread over seeds does not show."""
    if episodes <= 0 or math.isnan(p):
        return math.nan
    return math.sqrt(max(p * (1.0 - p), 0.0) / episodes)


def all_success_bound(episodes: int, confidence: float = 0.95) -> float:
    """The lowest success rate that is still consistent with `episodes` successes in `episodes`
    tries: the exact one-sided binomial (Clopper-Pearson) lower bound for k = n, p ** n = 1 - confidence."""
    return (1.0 - confidence) ** (1.0 / episodes)


def paired_lines(run_dirs: list[Path], episodes: str = "", policy: str = "final policy") -> list[str]:
    """Each task's final policy (or the policy whose episodes are at RUN/`episodes`) against its
    start on the same held-out episodes, per seed: the episodes only it solved (+), only the start
    solved (-) and the exact McNemar p (`rlfleet.eval.paired`). Seeds are not pooled: they share the
    start's episodes, so their pairs are not independent. No lines when no seed kept both episode
    files (runs before they existed)."""
    from rlfleet.eval.paired import BEFORE_EPISODES_FILE, EPISODES_FILE, paired_comparison, read_episodes

    cells: dict[str, dict[int, str]] = {}
    seeds = []
    for seed, run_dir in enumerate(run_dirs):
        after_file = run_dir / (episodes or EPISODES_FILE)
        if not (after_file.exists() and (run_dir / BEFORE_EPISODES_FILE).exists()):
            continue
        try:
            after, before = read_episodes(after_file), read_episodes(run_dir / BEFORE_EPISODES_FILE)
            rows = paired_comparison(after, before)["tasks"]
        except ValueError as e:  # a damaged file costs its seed's column, not the page
            print(f"[reproduce] seed {seed}: no paired table ({e})", file=sys.stderr)
            continue
        seeds.append(seed)
        for row in rows:
            cell = f"+{row['only_this']} / -{row['only_other']} (p {row['p']:.2g})"
            cells.setdefault(row["task"], {})[seed] = cell
    if not seeds:
        return []
    lines = [
        "",
        f"Episode by episode, on the same held-out episodes: + episodes only the {policy} solved, - episodes "
        "only the start solved, p the exact McNemar test of that split (two-sided; per seed, since the seeds "
        "share the start's episodes).",
        "",
        "| task | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---" + "|---:" * len(seeds) + "|",
    ]
    for task, by_seed in cells.items():
        lines.append(f"| {task} | " + " | ".join(by_seed.get(s, "-") for s in seeds) + " |")
    return lines


def results_markdown(
    recipe: str,
    agg: dict[str, Any],
    commands: list[str],
    commit: str,
    wall_seconds: list[float],
    plots: dict[str, str],
    eval_note: str,
    resumed: str = "",
    episodes_per_task: int = 0,
    paired: list[str] | None = None,
    sft_note: str = "",
) -> str:
    """The results page: success before / after per task and mean (%, mean +- SE over seeds); for
    chained envs their chain metrics instead (whole-chain success is their last success_len_k).
    `sft_note` says where each seed's starting policy came from."""
    n = agg["seeds"]
    seeds = "seed" if n == 1 else "seeds"
    lines = [f"## {recipe}: {n} {seeds}", ""]
    if sft_note:
        lines += [sft_note, ""]
    if "chain" not in agg:
        lines += [
            f"Success (%) on held-out eval seeds, mean +- standard error over {n} training {seeds}; {eval_note}.",
            "",
            "| task | before | after | gain (points) |",
            "|---|---:|---:|---:|",
        ]
        for task, row in agg["tasks"].items():
            lines.append(f"| {task} | {_pm(row['before'])} | {_pm(row['after'])} | {_pm(row['gain'], signed=True)} |")
        m = agg["mean"]
        lines.append(f"| **mean** | {_pm(m['before'])} | {_pm(m['after'])} | {_pm(m['gain'], signed=True)} |")
        if episodes_per_task:  # the seeds' spread leaves out each evaluation's own sampling
            tasks = len(agg["tasks"])
            b = agg.get("binomial_se") or binomial_errors(agg, episodes_per_task)
            lines += [
                "",
                f"Each success rate is read from {episodes_per_task} episodes per task, whose sampling the spread "
                "over seeds leaves out (a start the seeds share shows +- 0.0): a task at 100% on "
                f"{episodes_per_task} episodes is, at 95% confidence, only known to be above "
                f"{100 * all_success_bound(episodes_per_task):.1f}%. The binomial standard error of one "
                f"evaluation, sqrt(p (1 - p) / n): {100 * b['before']:.1f} points before and "
                f"{100 * b['after']:.1f} after on the mean ({tasks * episodes_per_task} episodes), at most "
                f"{100 * binomial_se(0.5, episodes_per_task):.1f} on one task ({episodes_per_task} episodes).",
            ]
        lines += paired or []
    else:  # CALVIN-style chains: the metrics the env is judged by
        lines += [
            f"Chain metrics on held-out eval chains, mean +- standard error over {n} training {seeds}; {eval_note}; "
            "whole-chain success is the last success_len_k.",
            "",
            "| chain metric | before | after | gain |",
            "|---|---:|---:|---:|",
        ]
        for key, row in agg["chain"].items():
            scale, digits = (1.0, 2) if key == "avg_num_subtasks" else (100.0, 1)
            cells = [_pm(row[k], scale, signed=k == "gain", digits=digits) for k in ("before", "after", "gain")]
            lines.append(f"| {key}{'' if scale == 1.0 else ' (%)'} | " + " | ".join(cells) + " |")
    steps = ", ".join(f"{s:,}" for s in agg["env_steps"])
    train = ", ".join(f"{t:.0f}" for t in agg["train_seconds"])
    walls = ", ".join(f"{w:.0f}" for w in wall_seconds)
    lines += [
        "",
        f"Env steps per seed: {steps}. Training seconds per seed (all lives of a resumed seed): {train}. "
        "Wall seconds per seed "
        f"(whole command: start-up, evaluations, training): {walls}; total {sum(wall_seconds) / 60:.1f} min.",
        f"Commit: `{commit}`." + (f" {resumed}" if resumed else ""),
        "",
    ]
    for label, path in plots.items():
        lines.append(f"![{label}]({path})")
    lines += ["", "Commands (one after another on the same machine):", "", "```"]
    lines += commands
    lines += ["```", ""]
    return "\n".join(lines)


AVERAGE_EPISODES = "checkpoints/average/eval/episodes.jsonl"  # rlfleet eval's default report folder


def _episode_keys(path: Path) -> set[tuple[str, int]]:
    from rlfleet.eval.paired import read_episodes

    return {(r["task"], int(r["seed"])) for r in read_episodes(path)} if path.exists() else set()


def average_seed(
    run_dir: Path, summary: dict[str, Any], last: int, log_path: Path, evaluate: bool = True
) -> tuple[dict[str, Any], bool]:
    """The run's summary with the evaluation of the mean of its last `last` kept checkpoints in place
    of its final one (`rlfleet average`, then `rlfleet eval` on the run's held-out episodes), and
    whether it evaluated now. An evaluation of the same checkpoints' average on the final
    evaluation's episodes is kept; without `evaluate` it must exist."""
    from rlfleet.eval.paired import BEFORE_EPISODES_FILE, EPISODES_FILE
    from rlfleet.policies.averaging import AVERAGE_FOLDER
    from rlfleet.policies.checkpoint_io import run_checkpoints

    summary = dict(summary)
    average = run_dir / "checkpoints" / AVERAGE_FOLDER
    kept = [p.name for p in run_checkpoints(run_dir)]
    if len(kept) < last:
        raise RuntimeError(f"{run_dir} keeps {len(kept)} checkpoints, fewer than --average-last {last}")
    kept = kept[-last:]
    report = average / "eval" / "eval.json"
    # the final evaluation's episodes (the start's where a run kept no final ones: the same seeds)
    final = _episode_keys(run_dir / EPISODES_FILE) or _episode_keys(run_dir / BEFORE_EPISODES_FILE)

    def evaluated() -> bool:  # these checkpoints' average, on the final evaluation's episodes
        if not (report.exists() and (average / "config.json").exists()):
            return False
        if json.loads((average / "config.json").read_text()).get("averaged_from") != kept:
            return False
        return not final or _episode_keys(run_dir / AVERAGE_EPISODES) == final

    ran = False
    if not evaluated():
        if not evaluate:
            raise RuntimeError(
                f"{run_dir}: no evaluation of its last {last} checkpoints' average (run without --report-only)"
            )
        with open(log_path, "wb") as log:
            for cmd in (["average", str(run_dir), "--last", str(last)], ["eval", str(average)]):
                res = subprocess.run([sys.executable, "-m", "rlfleet.cli", *cmd], stdout=log, stderr=subprocess.STDOUT)
                if res.returncode != 0:
                    raise RuntimeError(f"rlfleet {shlex.join(cmd)} failed (exit {res.returncode}); see {log_path}")
        if not evaluated():  # e.g. a config.yaml that no longer loads: rlfleet eval's defaults
            raise RuntimeError(f"{run_dir}: the average was evaluated on other episodes than the final policy")
        ran = True
    table = json.loads(report.read_text())
    summary["eval_success"] = {row["task"]: row["success"] for row in table["tasks"]}
    if summary.get("eval_chain"):
        if not table.get("chains"):
            raise RuntimeError(f"{report} has no chain metrics, the run's final evaluation has")
        summary["eval_chain"] = {"all": table["chains"]["all"]}
    summary["averaged_from"] = kept
    return summary, ran


def average_markdown(
    last: int, final: dict[str, Any], average: dict[str, Any], paired: list[str], commits: str = ""
) -> str:
    """The page's section on the mean of each seed's last checkpoints: before, final and average
    per task (chain metrics for chained envs), mean +- standard error over seeds, the commands and
    the commit they ran at."""
    lines = [
        f"### The mean of each seed's last {last} checkpoints",
        "",
        f"`rlfleet average RUN --last {last}` (the mean of the weights of the last {last} checkpoints the run kept), "
        "evaluated by `rlfleet eval RUN/checkpoints/average` on the same held-out episodes as the final policy.",
        "",
    ]
    if "chain" in average:
        lines += ["| chain metric | before | final | average | gain of the average |", "|---|---:|---:|---:|---:|"]
        for key, row in average["chain"].items():
            scale, digits = (1.0, 2) if key == "avg_num_subtasks" else (100.0, 1)
            cells = [row["before"], final["chain"][key]["after"], row["after"]]
            text = [_pm(c, scale, digits=digits) for c in cells] + [_pm(row["gain"], scale, True, digits)]
            lines.append(f"| {key}{'' if scale == 1.0 else ' (%)'} | " + " | ".join(text) + " |")
    else:
        lines += ["| task | before | final | average | gain of the average (points) |", "|---|---:|---:|---:|---:|"]
        rows = {**average["tasks"], "**mean**": average["mean"]}
        finals = {**final["tasks"], "**mean**": final["mean"]}
        for task, row in rows.items():
            cells = [_pm(row["before"]), _pm(finals[task]["after"]), _pm(row["after"]), _pm(row["gain"], signed=True)]
            lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines += paired
    lines += [
        "",
        f"Averaged checkpoints per seed: {'; '.join(', '.join(a) for a in average['averaged_from'])}."
        + (f" Averaged and evaluated at commit `{commits}`." if commits else ""),
        "",
        "Commands, per seed (`bench/reproduce.py --average-last` runs them):",
        "",
        "```",
        f"rlfleet average RUN --last {last}",
        "rlfleet eval RUN/checkpoints/average",
        "```",
        "",
    ]
    return "\n".join(lines)


def binomial_errors(agg: dict[str, Any], episodes_per_task: int) -> dict[str, float]:
    """The binomial standard error of one evaluation of the mean success before and after (all
    tasks' episodes together), at the mean over seeds."""
    n = episodes_per_task * len(agg["tasks"])
    return {
        "episodes": float(n),
        "before": binomial_se(agg["mean"]["before"][0], n),
        "after": binomial_se(agg["mean"]["after"][0], n),
    }


def sft_starts(run_dirs: list[Path]) -> list[str]:
    """Each seed's starting checkpoint (`policy.model_path` in its config.yaml: the SFT checkpoint a
    bootstrapped run built), "" where a run recorded none."""
    import yaml

    starts = []
    for run_dir in run_dirs:
        path = run_dir / "config.yaml"
        cfg = yaml.safe_load(path.read_text()) if path.exists() else None
        starts.append(str(((cfg or {}).get("policy") or {}).get("model_path") or ""))
    return starts


def sft_note(starts: list[str], shared: bool) -> str:
    """One line on where the seeds' starting policies came from."""
    known = [s for s in starts if s]
    if not known:
        return ""
    where = "; ".join(f"seed {k}: `{s}`" for k, s in enumerate(starts) if s)
    if len(starts) == 1:
        return f"Starting policy: `{known[0]}`."
    if len(set(known)) == len(starts):
        return (
            f"Each seed is a full repeat: its own SFT start on the same demos (`sft.seed`), then its own RL ({where})."
        )
    how = "`--shared-sft`" if shared else "one checkpoint, named by the recipe or its overrides"
    return f"The seeds share their starting policy ({how}), so the spread leaves out the SFT's own variance ({where})."


def policy_note(cfg: Any) -> str:
    """What the policy sees, for the results page: pixels (and their size) or states."""
    size = int(cfg.env.get("image_size", 0) or 0)
    seen = f"{size} px pixels" if size else "states (no pixels)"
    return f"Policy `{cfg.policy.get('name', '?')}` on {seen}."


def seed_commits(recorded: dict[str, Any], seeds: int) -> str:
    """The commit the seeds ran at, or each seed's where they differ (a resumed command)."""
    per_seed = [recorded.get("commits", {}).get(str(s), recorded.get("commit", "unknown")) for s in range(seeds)]
    if len(set(per_seed)) == 1:
        return per_seed[0]
    return ", ".join(f"seed {s}: {c}" for s, c in enumerate(per_seed))


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def seed_state(run_dir: Path, total_env_steps: int, wall_budget: bool) -> tuple[str, int | None]:
    """What a rerun does with a seed: "done" (kept), "resume" (from its last checkpoint) or "fresh",
    and the env steps it stands at: a resume's checkpoint, else its summary (None when unknown)."""
    summary = run_dir / "summary.json"
    steps = int(json.loads(summary.read_text())["env_steps"]) if summary.exists() else None
    if steps is not None and (wall_budget or not total_env_steps or steps >= total_env_steps):
        return "done", steps  # a wall-clock budget ends runs early by design: never extend them
    if (run_dir / "checkpoints" / "latest").exists():
        return "resume", checkpoint_env_steps(run_dir) or steps
    return "fresh", None


def checkpoint_env_steps(run_dir: Path) -> int | None:
    """The env steps of the checkpoint a resume starts from (the trainer's counters in it), which
    can lie behind the last summary: updates after the last checkpoint are retrained."""
    from rlfleet.learner.checkpointer import STATE_JSON, Checkpointer  # torch: only when resuming

    latest = Checkpointer(run_dir).latest()
    if latest is None or not (latest / STATE_JSON).exists():  # none complete, or a legacy .pt one
        return None
    return int(json.loads((latest / STATE_JSON).read_text())["counters"]["env_steps"])


def add_cut_life(recorded: dict[str, Any], seed: int, log_path: Path) -> bool:
    """Count the wall time of a seed's life that was killed before it could record its own: from
    its start to the last write to its log. False when no life of the seed was cut."""
    started = recorded.get("running", {}).pop(str(seed), None)
    if started is None:
        return False
    if log_path.exists():
        lived = max(0.0, log_path.stat().st_mtime - float(started))
        recorded[str(seed)] = float(recorded.get(str(seed), 0.0)) + lived
    return True


def resume_notes(recorded: dict[str, Any], seeds: int) -> str:
    """One line naming the seeds that were continued from a checkpoint, and from where."""
    parts = []
    for s in range(seeds):
        for r in recorded.get("resumed", {}).get(str(s), []):
            at = f"{r['from_env_steps']:,} env steps" if r.get("from_env_steps") is not None else "its last checkpoint"
            parts.append(f"seed {s} from {at} (commit {r['commit']})")
    return f"Resumed (`--resume`, same folder): {'; '.join(parts)}." if parts else ""


def seed_command(recipe: str, seed: int, run_dir: Path, overrides: list[str], own_sft: bool = True) -> list[str]:
    """One seed's `rlfleet train` command; `own_sft` gives it its own SFT start (`sft.seed`: a
    bootstrapped recipe's cache key holds it, so each seed builds and keeps its own). Overrides
    come last and win."""
    return [
        "rlfleet",
        "train",
        recipe,
        f"runner.seed={seed}",
        f"env.seed={seed}",
        *([f"sft.seed={seed}"] if own_sft else []),
        "eval.before=true",
        f"runner.logger.log_path={run_dir}",
        *overrides,
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recipe", nargs="?", help="the recipe; none with --report-only: rebuild docs/results.md")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every seed")
    p.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1")
    p.add_argument("--out", help="folder for the runs, results.md and plots (default: runs/reproduce/RECIPE)")
    p.add_argument("--report-only", action="store_true", help="only rebuild the page from the runs in --out")
    p.add_argument(
        "--fresh", action="store_true", help="rerun seeds that finished in --out before (default: keep them)"
    )
    p.add_argument(
        "--shared-sft",
        action="store_true",
        help="every seed starts from the recipe's one SFT checkpoint (default: each seed builds its own)",
    )
    p.add_argument(
        "--average-last",
        type=int,
        default=0,
        metavar="K",
        help="also evaluate the mean of each seed's last K checkpoints (rlfleet average) and report it",
    )
    args = p.parse_intermixed_args(argv)  # overrides may follow the options
    if args.recipe is None:
        if not args.report_only:
            p.error("a recipe is needed (without one, --report-only rebuilds docs/results.md)")
        return _rebuild_results_page()
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    if args.average_last == 1 or args.average_last < 0:
        p.error("--average-last must be 2 or more (0: no averaging)")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"overrides must look like key=value, got {bad}")
    name = Path(args.recipe).stem
    out = Path(args.out or f"runs/reproduce/{name}")
    out.mkdir(parents=True, exist_ok=True)
    commands, walls = [], []
    wall_file = out / "wall_seconds.json"
    recorded = json.loads(wall_file.read_text()) if wall_file.exists() else {}
    # The code that trains is the code at each seed's launch, whatever is committed later.
    commits = recorded.setdefault("commits", {})
    from rlfleet.config import load_config
    from rlfleet.eval.splits import split_seed

    cfg = load_config(args.recipe, args.overrides)
    budget, wall_budget = int(cfg.runner.total_env_steps or 0), bool(cfg.runner.max_wall_seconds)
    for seed in range(args.seeds):
        run_dir = out / f"seed{seed}"
        cmd = seed_command(args.recipe, seed, run_dir, args.overrides, not args.shared_sft)
        commands.append(shlex.join(cmd))
        state, reached = ("fresh", None) if args.fresh else seed_state(run_dir, budget, wall_budget)
        log_path = out / f"seed{seed}.log"
        if args.report_only or state == "done":
            if state == "done" and not args.report_only:
                print(f"[reproduce] seed {seed}: finished before ({run_dir / 'summary.json'}), kept", flush=True)
                if add_cut_life(recorded, seed, log_path):  # killed after its summary, before it returned
                    wall_file.write_text(json.dumps(recorded, indent=2))
            walls.append(float(recorded.get(str(seed), math.nan)))
            continue
        run = cmd + (["--resume"] if state == "resume" else [])
        if state == "resume":
            add_cut_life(recorded, seed, log_path)
            resumes = recorded.setdefault("resumed", {}).setdefault(str(seed), [])
            resumes.append({"from_env_steps": reached, "commit": git_commit()})
        else:
            commits[str(seed)] = git_commit()
            recorded.get("resumed", {}).pop(str(seed), None)
            recorded.pop(str(seed), None)
        # Written before the life starts, so a life cut by a kill still leaves its record.
        recorded.setdefault("running", {})[str(seed)] = time.time()
        wall_file.write_text(json.dumps(recorded, indent=2))
        print(f"[reproduce] seed {seed}: {shlex.join(run)}", flush=True)
        t0 = time.monotonic()
        with open(log_path, "ab" if state == "resume" else "wb") as log:
            res = subprocess.run([sys.executable, "-m", "rlfleet.cli", *run[1:]], stdout=log, stderr=subprocess.STDOUT)
        walls.append(time.monotonic() - t0 + float(recorded.get(str(seed), 0.0)))  # a resumed seed's lives add up
        recorded[str(seed)] = walls[-1]
        recorded["running"].pop(str(seed), None)
        wall_file.write_text(json.dumps(recorded, indent=2))
        if res.returncode != 0:
            print(
                f"[reproduce] seed {seed} failed (exit {res.returncode}); see {log_path}",
                file=sys.stderr,
            )
            return 1
        print(f"[reproduce] seed {seed} done in {walls[-1]:.0f} s", flush=True)
    summaries = [json.loads((out / f"seed{s}" / "summary.json").read_text()) for s in range(args.seeds)]
    agg = aggregate(summaries)
    if "chain" not in agg:
        agg["binomial_se"] = binomial_errors(agg, int(cfg.eval.episodes_per_task))
    metric = curve_metric(summaries[0])
    curves = [run_curve(s, read_curves(out / f"seed{k}" / "tensorboard", metric)) for k, s in enumerate(summaries)]
    agg["train_seconds"] = [float(c["seconds"][-1]) for c in curves]  # a resumed seed's lives together
    plots = {}
    what = "success" if metric == "success_once" else metric
    for x, label in (("steps", f"{what} vs env steps"), ("seconds", f"{what} vs wall clock")):
        path = plot_curves(curves, x, out / f"{name}_{x}.png", f"{name}: {label}", metric)
        plots[label] = path.name
    note = (
        f"{cfg.eval.episodes_per_task} episodes per task"
        + (f" of the {cfg.eval.split} split" if cfg.eval.split != "test" else "")  # test: as pages always said
        + f" from seed {split_seed(cfg.eval)}, deterministic policy; "
        "curves: periodic evaluation during training"
    )
    page = results_markdown(
        name,
        agg,
        commands,
        seed_commits(recorded, args.seeds),
        walls,
        plots,
        note,
        resume_notes(recorded, args.seeds),
        int(cfg.eval.episodes_per_task),
        paired_lines([out / f"seed{s}" for s in range(args.seeds)]),
        sft_note(sft_starts([out / f"seed{s}" for s in range(args.seeds)]), args.shared_sft),
    )
    # what bench/results_page.py shows of a result beside its seeds' summaries
    agg.update(
        recipe=name,
        commands=commands,
        commit=seed_commits(recorded, args.seeds),
        wall_seconds=walls,
        episodes_per_task=int(cfg.eval.episodes_per_task),
        plots=sorted(plots.values()),
        policy_note=policy_note(cfg),
        sft_starts=sft_starts([out / f"seed{s}" for s in range(args.seeds)]),
    )
    (out / "curves.json").write_text(json.dumps([{k: v.tolist() for k, v in c.items()} for c in curves]))
    (out / "results.md").write_text(page)  # kept whatever the averaging below does
    (out / "results.json").write_text(json.dumps(agg, indent=2))
    if args.average_last:
        averaged = []
        average_commits = recorded.setdefault("average_commits", {})
        for s in range(args.seeds):
            print(f"[reproduce] seed {s}: the mean of its last {args.average_last} checkpoints", flush=True)
            log_path = out / f"seed{s}_average.log"
            try:
                run_dir = out / f"seed{s}"
                summary, ran = average_seed(run_dir, summaries[s], args.average_last, log_path, not args.report_only)
            except RuntimeError as e:
                print(f"[reproduce] {e}; {out / 'results.md'} has no averaged section", file=sys.stderr)
                return 1
            averaged.append(summary)
            if ran:  # the commit an average was evaluated at; a kept evaluation keeps its own
                average_commits[str(s)] = git_commit()
                wall_file.write_text(json.dumps(recorded, indent=2))
        agg["average"] = aggregate(averaged)
        agg["average"]["averaged_from"] = [a["averaged_from"] for a in averaged]
        runs = [out / f"seed{s}" for s in range(args.seeds)]
        # chained envs are judged by their chain metrics, as on the main page
        average_pairs = [] if "chain" in agg else paired_lines(runs, AVERAGE_EPISODES, "average")
        commits = sorted({average_commits[str(s)] for s in range(args.seeds) if str(s) in average_commits})
        page += "\n" + average_markdown(args.average_last, agg, agg["average"], average_pairs, ", ".join(commits))
        (out / "results.md").write_text(page)
        (out / "results.json").write_text(json.dumps(agg, indent=2))
    print(page)
    return 0


def _rebuild_results_page() -> int:
    """docs/results.md from the committed data in docs/results/ (bench/results_page.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_page", ROOT / "bench" / "results_page.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main([]))


if __name__ == "__main__":
    sys.exit(main())
