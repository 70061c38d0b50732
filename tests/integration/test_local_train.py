"""`rlfleet train` end to end in local mode, Ctrl-C, and `rlfleet eval` on the checkpoint it wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from role_processes import TINY


def _cli(*args, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "rlfleet.cli", *args], capture_output=True, text=True, env=env, **kw)


def test_train_local_then_eval(tmp_path):
    run = tmp_path / "run"
    res = _cli(
        "train",
        "metaworld_reach_ppo",
        *TINY,
        "runner.total_env_steps=640",
        f"runner.logger.log_path={run}",
        "eval.before=true",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 9 and 0.0 <= summary["eval_success"]["reach-v3"] <= 1.0
    assert "reach-v3" in res.stdout and "mean" in res.stdout  # the success table is printed
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    assert {"config.json", "model.safetensors", "trainer_state.json", "trainer_state.safetensors", "training.json"} <= {
        p.name for p in ckpt.iterdir()
    }
    import yaml

    run_cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert json.loads((ckpt / "config.json").read_text())["evaluation"] == {
        "task": run_cfg["eval_env"]["task"],
        **{key: run_cfg["eval"][key] for key in ("seed", "validation_seed", "episodes_per_task")},
    }  # how the run evaluates, for a copy of the checkpoint away from its run (export, Hub)
    assert (run / "logs" / "actor0.log").exists() and (run / "logs" / "inference.log").exists()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()  # the final evaluation reaches the trackers too, at the last training step
    (final,) = events.Scalars("eval/success/reach-v3")
    assert final.value == summary["eval_success"]["reach-v3"] and final.step == summary["env_steps"]
    (before,) = events.Scalars("eval/success_before/reach-v3")  # measured by `rlfleet train` before the fleet
    assert before.value == summary["eval_before"]["reach-v3"]
    assert "eval/before_after/text_summary" in events.Tags()["tensors"]  # the table, as TensorBoard text
    ev = _cli("eval", str(ckpt), "--episodes", "2", "--json", timeout=120)
    assert ev.returncode == 0, ev.stderr[-3000:]
    result = json.loads(ev.stdout)  # --json: stdout is the report alone (tables go to stderr), for jq
    assert "Evaluation" not in ev.stdout and "reach-v3" in ev.stderr
    assert [row["task"] for row in result["tasks"]] == ["reach-v3"]
    assert result["groups"]["Easy"]["tasks"] == 1  # reach is an easy task in MetaWorld's declared split
    assert (ckpt / "eval" / "eval.json").exists() and (ckpt / "eval" / "eval.md").exists()
    # Every episode of the start's and the final evaluation is kept, on the same held-out seeds, and
    # the final one replays from the checkpoint: `rlfleet eval --compare` finds the same outcomes.
    from rlfleet.eval.paired import read_episodes

    start, final_eps = read_episodes(run / "episodes_before.jsonl"), read_episodes(run / "episodes.jsonl")
    assert [r["seed"] for r in start] == [r["seed"] for r in final_eps] == [10_000 + j for j in range(len(start))]
    assert sum(r["success"] for r in final_eps) / len(final_eps) == summary["eval_success"]["reach-v3"]
    # (a run folder names its latest checkpoint, whose eval/ folder gets the report)
    ev = _cli("eval", str(run), "--episodes", "2", "--compare", str(run), "--json", timeout=120)
    assert ev.returncode == 0, ev.stderr[-3000:]
    (row,) = json.loads(ev.stdout.strip().splitlines()[-1])["paired"]["tasks"]
    assert row["pairs"] == 2 and row["only_this"] == row["only_other"] == 0
    assert read_episodes(ckpt / "eval") == final_eps[:2]


def test_ctrl_c_stops_every_role_and_checkpoints(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet.cli",
            "train",
            "metaworld_reach_ppo",
            *TINY,
            "runner.total_env_steps=100000000",
            f"runner.logger.log_path={run}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (run / "checkpoints" / "update_000002").exists():  # training is under way
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-3000:]  # interrupted (docs/usage.md "Exit codes")
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert int(latest.split("_")[1]) >= 2
    assert f"interrupted; last checkpoint: {run / 'checkpoints' / latest}" in out.decode()
    assert (run / "summary.json").exists()
    leftovers = subprocess.run(["pgrep", "-f", f"runner.logger.log_path={run}"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


def test_env_steps_count_the_substeps_simulated(tmp_path):
    """Episodes of 14 steps in chunks of 4 end mid-chunk (4+4+4+2 substeps): the run counts the 14
    substeps simulated, not 16, and the loss identity holds with that count."""
    import struct

    run = tmp_path / "run"
    res = _cli(
        "train",
        "metaworld_reach_ppo",
        *TINY,
        "env.max_episode_steps=14",
        "env.chunk_size=4",
        "env.terminate_on_success=false",
        "runner.total_env_steps=1200",
        f"runner.logger.log_path={run}",
        "eval.at_end=false",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    ingest = summary["ingest"]
    # a segment: 8 chunk steps x 2 envs (one stage) = 16 samples, 2 whole episodes per env = 56 substeps
    assert ingest["consumed"] > 0 and ingest["consumed_env_steps"] == ingest["consumed"] * 56
    assert summary["chunk_samples"] == ingest["consumed"] * 16
    assert summary["env_steps"] == ingest["consumed_env_steps"] == summary["chunk_samples"] * 14 // 4
    # taken (each actor life's ledger) == counted + lost, all in simulated substeps
    taken = [struct.unpack("<qqq", p.read_bytes()[:24])[0] for p in (run / "ledgers").iterdir()]
    assert taken
    assert sum(taken) == summary["env_steps"] + sum(summary["lost_env_steps"].values()), (taken, summary)
