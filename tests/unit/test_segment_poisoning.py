"""One well-formed segment must not ruin a run: its step count, task ids and states are bounded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_learner_service import B, K, T, make_segment

from rlfleet.learner.metrics import MAX_TASK_SERIES, EpisodeWindow
from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig, RunningNorm
from rlfleet.telemetry.prometheus import scalar_gauges
from rlfleet.wire.codec import WireFormatError
from rlfleet.wire.segment import Segment


@pytest.mark.parametrize("steps", [2**40, -1, -(2**40), T * B * K + 1])
def test_env_steps_beyond_the_segments_own_shape_are_refused(steps):
    t = make_segment().to_tensors()
    t["env_steps"] = np.array(steps, np.int64)
    with pytest.raises(WireFormatError) as err:
        Segment.from_tensors(t)
    assert err.value.reason == "bad_env_steps"


@pytest.mark.parametrize("steps", [0, 1, T * B * K])
def test_env_steps_within_the_shape_are_taken(steps):
    t = make_segment().to_tensors()
    t["env_steps"] = np.array(steps, np.int64)
    assert int(Segment.from_tensors(t).env_steps) == steps


def _episodes(task_ids) -> Segment:
    n = len(task_ids)
    return make_segment(
        ep_returns=np.ones(n, np.float32),
        ep_lengths=np.ones(n, np.int32),
        ep_success=np.ones(n, bool),
        ep_task_ids=np.asarray(task_ids, np.int64),
    )


def test_negative_and_unknown_task_ids_do_not_crash_the_metrics():
    window = EpisodeWindow(["reach", "push"])
    window.add(_episodes([0, 1, -1, -(2**40), 2, 2**62]))
    scalars = window.scalars()
    assert {k for k in scalars if k.startswith("env/success_once/")} == {
        "env/success_once/reach",
        "env/success_once/push",
    }
    assert scalars["env/unknown_task_episodes"] == 4 and len(window.recent) == 6


def test_thousands_of_task_ids_make_a_bounded_number_of_series():
    for names in ([], ["a", "b", "c"]):
        window = EpisodeWindow(names, size=10_000)
        window.add(_episodes(np.arange(5000)))
        scalars = window.scalars()
        per_task = [k for k in scalars if k.startswith("env/success_once/")]
        assert len(per_task) == (len(names) or MAX_TASK_SERIES)
        assert scalars["env/unknown_task_episodes"] == 5000 - len(per_task)
        families = list(scalar_gauges("learner", scalars))
        assert sum(len(f.samples) for f in families) <= len(scalars)


def test_one_huge_segment_does_not_break_the_running_normalisation():
    torch.manual_seed(0)
    norm = RunningNorm(4, clip=10.0)
    for _ in range(5):
        norm.update(torch.randn(500, 4))
    mean, var = norm.mean.clone(), norm.var.clone()
    states = torch.randn(8, 4)
    before = norm(states)

    poison = torch.randn(64, 4)
    poison[:32] = 1e20  # finite, and far beyond anything a robot reports
    norm.update(poison)
    poison[:32] = 1e5  # under the absolute limit: clipped to the running spread before it counts
    norm.update(poison)

    after = norm(states)
    assert torch.isfinite(norm.mean).all() and torch.isfinite(norm.var).all()
    assert len({tuple(r) for r in after.round(decimals=3).tolist()}) == 8  # different states stay different
    assert (norm.mean - mean).abs().max() < 1.0 and (norm.var / var).max() < 50
    assert torch.allclose(before.sign(), after.sign()) or (after - before).abs().max() < 5
    assert norm.rejected_rows == 32 and norm.clipped_values >= 32 * 4


def test_the_policy_counts_what_normalisation_left_out():
    policy = GaussianMLPPolicy(3, 2, 1, PolicyConfig(hidden_sizes=[8]))
    obs = torch.randn(2000, 3)
    obs[0, 0] = float("nan")
    obs[1, 1] = float("inf")
    policy.update_normalization({"states": obs})
    assert policy.obs_norm.rejected_rows == 2 and torch.isfinite(policy.obs_norm.mean).all()
    assert set(policy.state_dict()) >= {"obs_norm.mean", "obs_norm.var", "obs_norm.count"}
    assert not any("rejected" in k for k in policy.state_dict())  # checkpoints keep their keys
