"""Policy-lag counts per value and their TensorBoard histogram (read back from the event file)."""

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlfleet.learner.metrics import MetricsWriter, policy_lag_counts


def test_lag_counts_cover_zero_to_max_lag_and_larger_seen_lags():
    counts = policy_lag_counts(np.array([0, 0, 1, 3, 3, 3, 7]), max_policy_lag=4)
    assert counts == {
        "throughput/policy_lag_count/0": 2.0,
        "throughput/policy_lag_count/1": 1.0,
        "throughput/policy_lag_count/2": 0.0,
        "throughput/policy_lag_count/3": 3.0,
        "throughput/policy_lag_count/4": 0.0,
        "throughput/policy_lag_count/7": 1.0,
    }
    assert policy_lag_counts(np.zeros(0, np.int64), 1) == {
        "throughput/policy_lag_count/0": 0.0,
        "throughput/policy_lag_count/1": 0.0,
    }


def test_histogram_and_count_scalars_reach_tensorboard(tmp_path):
    lags = np.array([0] * 5 + [1] * 3 + [2] * 1)
    stats = {"throughput/policy_lag": float(lags.mean()), **policy_lag_counts(lags, 2)}
    writer = MetricsWriter(tmp_path)
    writer.write(stats, step=100)
    writer.write_lag_histogram(stats, step=100)
    writer.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0, "scalars": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("throughput/policy_lag_count/1")] == [3.0]
    (hist,) = acc.Histograms("throughput/policy_lag_hist")
    h = hist.histogram_value
    assert hist.step == 100 and h.num == 9 and h.min == 0 and h.max == 2 and h.sum == 5.0
    # one bin per integer lag: counts 5, 3, 1
    assert [c for c in h.bucket if c > 0] == [5.0, 3.0, 1.0]


def test_no_histogram_without_samples(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.write_lag_histogram(policy_lag_counts(np.zeros(0, np.int64), 1), step=1)
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert acc.Tags()["histograms"] == []
