"""CALVIN's long-horizon metrics (rlfleet.envs.chains) on hand-made chains, in the learner's
episode window and in the registry."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rlfleet.envs.chains import chain_metrics, chain_report
from rlfleet.envs.registry import chain_length
from rlfleet.eval.report import chain_line, chain_markdown
from rlfleet.learner.metrics import EpisodeWindow


def test_hand_made_chains():
    m = chain_metrics([0, 1, 5, 3, 2])
    assert m["avg_num_subtasks"] == pytest.approx(11 / 5)
    # at least k subtasks in a row: 4, 3, 2, 1, 1 of 5 chains
    assert [m[f"success_len_{k}"] for k in range(1, 6)] == pytest.approx([0.8, 0.6, 0.4, 0.2, 0.2])
    # CALVIN's identity: the average length is the sum of the success_len_k
    assert m["avg_num_subtasks"] == pytest.approx(sum(m[f"success_len_{k}"] for k in range(1, 6)))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no finished chains"):
        chain_metrics([])
    with pytest.raises(ValueError, match=r"\[0, 5\]"):
        chain_metrics([6])


def test_report_and_markdown():
    report = chain_report({"calvin-D": [5.0, 0.0], "calvin-A": [1.0, 1.0]})
    assert report["all"]["avg_num_subtasks"] == pytest.approx(7 / 4)
    assert report["calvin-D"]["success_len_5"] == 0.5
    text = chain_markdown(report, "t")
    assert "| calvin-D | 50.0% |" in text and text.rstrip().endswith("| 1.75 |")
    assert chain_line(report["all"]) == "avg_num_subtasks 1.75, success_len_1..5 75 / 25 / 25 / 25 / 25%"


def test_the_starting_policy_line_names_the_chain_metrics(tmp_path, capsys):
    """Whole-chain success is 0% for most policies: the start of a chained run shows its chain metrics."""
    import json

    from rlfleet.eval.service import keep_before

    report = chain_report({"calvin-D": [2.0, 0.0, 1.0, 0.0]})
    keep_before(tmp_path, {"calvin-D": 0.0}, report)
    err = capsys.readouterr().err
    assert "starting policy: mean 0.0% (calvin-D 0%)" in err
    assert "starting policy chains: avg_num_subtasks 0.75, success_len_1..5 50 / 25 / 0 / 0 / 0%" in err
    assert json.loads((tmp_path / "eval_chain_before.json").read_text()) == report


def _episodes(returns):
    """What EpisodeWindow.add reads from a segment: the finished episodes' fields."""
    n = len(returns)
    return SimpleNamespace(
        ep_returns=np.asarray(returns, np.float32),
        ep_lengths=np.ones(n, np.int32),
        ep_success=np.asarray(returns) == 5,
        ep_task_ids=np.zeros(n, np.int64),
    )


def test_episode_window_logs_chain_metrics():
    window = EpisodeWindow(["calvin-D"], chain_length=5)
    window.add(_episodes([2.0, 5.0, 0.0, 1.0]))
    out = window.scalars()
    assert out["env/avg_num_subtasks"] == pytest.approx(2.0)
    assert out["env/success_len_2"] == pytest.approx(0.5)
    plain = EpisodeWindow(["reach-v3"])
    plain.add(_episodes([2.0]))
    assert "env/avg_num_subtasks" not in plain.scalars()


def test_registry_knows_which_envs_chain():
    assert chain_length("metaworld") == 0 and chain_length("robotwin") == 0
    assert chain_length("no-such-env") == 0
    assert chain_length("calvin") == 5
