"""DDP row sharding (rlfleet.learner.sharding) against a plain reference: list the one-process rows
(segment, step, env) in order, every one with its validity, give env column g to rank
g % world_size, slice minibatches over the valid rows."""

import numpy as np
import pytest
import torch

from rlfleet.learner.sharding import (
    MinibatchMean,
    minibatch_rows,
    minibatch_size,
    segment_envs,
    shard_rows,
    whole_batch,
)
from rlfleet.wire.segment import Segment

VERSION, MAX_LAG = 5, 2


def segment(T: int, B: int, versions, seed: int) -> Segment:
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    return Segment(
        obs={"states": f32(T, B, 3)},
        actions=f32(T, B, 1, 2),
        logprobs=f32(T, B),
        values=f32(T, B),
        rewards=f32(T, B),
        terminated=rng.random((T, B)) < 0.2,
        truncated=rng.random((T, B)) < 0.2,
        final_obs={"states": f32(T, B, 3)},
        next_obs={"states": f32(B, 3)},
        versions=np.asarray(versions, np.int64),
        task_ids=np.arange(B, dtype=np.int64) + 10 * seed,
        env_steps=np.array(T * B, np.int64),
        ep_returns=np.zeros(0, np.float32),
        ep_lengths=np.zeros(0, np.int32),
        ep_success=np.zeros(0, bool),
        ep_task_ids=np.zeros(0, np.int64),
        extras={"noise": f32(T, B, 4)},
        group_ids=np.arange(B, dtype=np.int64) // 2,
    )


def reference_rows(segments, masks):
    """One-process rows in order, every one: (segment, step, env, global env column, valid)."""
    rows, col0 = [], 0
    for j, seg in enumerate(segments):
        for t in range(seg.num_steps):
            young = VERSION - int(seg.versions[t]) <= MAX_LAG
            for b in range(seg.num_envs):
                rows.append((j, t, b, col0 + b, young and (masks is None or bool(masks[j][t, b]))))
        col0 += seg.num_envs
    return rows


def make_update(seed: int, with_masks: bool):
    rng = np.random.default_rng(seed)
    segments = []
    for j in range(int(rng.integers(1, 4))):
        T, B = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        segments.append(segment(T, B, rng.integers(VERSION - 4, VERSION + 1, size=T), seed=10 * seed + j))
    masks = [rng.random((s.num_steps, s.num_envs)) < 0.7 for s in segments] if with_masks else None
    valid = torch.tensor([r[4] for r in reference_rows(segments, masks)], dtype=torch.bool)
    return segments, masks, valid


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("with_masks", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_shards_match_the_reference(seed, with_masks, world_size):
    segments, masks, valid = make_update(seed, with_masks)
    rows = reference_rows(segments, masks)
    for rank in range(world_size):
        shard = shard_rows(segments, valid, rank, world_size)
        assert shard.num_rows == sum(r[4] for r in rows)
        expected = [i for i, r in enumerate(rows) if r[3] % world_size == rank]
        # the columns a rank prepares, in segment order: exactly its env columns
        col0 = np.cumsum([0] + [s.num_envs for s in segments])
        expected_parts = [
            (j, [b for b in range(s.num_envs) if (col0[j] + b) % world_size == rank]) for j, s in enumerate(segments)
        ]
        got_parts = [(j, cols.tolist()) for j, cols in shard.parts]
        if not expected:  # no column here: it holds the first segment's column 0, every row masked
            assert got_parts == [(0, [0])] and shard.row_ids.tolist() == [-1] * segments[0].num_steps
            assert not shard.local_valid().any()
            continue
        assert shard.row_ids.tolist() == expected
        assert got_parts == [(j, c) for j, c in expected_parts if c]
        # preparing those columns in one-process order gives the rank's rows in row_ids order
        local = [(j, t, int(c)) for j, cols in shard.parts for t in range(segments[j].num_steps) for c in cols]
        assert local == [rows[i][:3] for i in expected]
        assert shard.local_valid().tolist() == [rows[i][4] for i in expected]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 9])
def test_minibatches_split_exactly_between_ranks(seed, world_size):
    segments, _, valid = make_update(seed, with_masks=True)
    shards = [shard_rows(segments, valid, r, world_size) for r in range(world_size)]
    n = shards[0].num_rows
    if n == 0:
        pytest.skip("every row too old")
    valid_ids = valid.nonzero().squeeze(-1)
    for num_minibatches in (1, 2, 3):
        mb_size = minibatch_size(n, num_minibatches)
        assert mb_size == max(1, n // num_minibatches)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        per_rank = [list(minibatch_rows(s, order, mb_size)) for s in shards]
        expected = [valid_ids[order[i : i + mb_size]].tolist() for i in range(0, n - mb_size + 1, mb_size)]
        assert all(len(mbs) == len(expected) for mbs in per_rank)  # every rank steps as often
        for m, want in enumerate(expected):
            got = []
            for shard, mbs in zip(shards, per_rank):
                local, weight = mbs[m]
                assert len(local) >= 1  # a rank with none of these rows still runs one, weight 0
                if not weight.any():
                    assert len(local) == 1
                    continue
                assert weight.all()
                got += shard.row_ids[local].tolist()
            assert sorted(got) == sorted(want)  # the ranks' shares partition the minibatch


def test_local_positions_invert_row_ids():
    segments, _, valid = make_update(3, with_masks=True)
    shard = shard_rows(segments, valid, 1, 2)
    where = shard.local_positions()
    assert len(where) == len(valid)
    held = (where >= 0).nonzero().squeeze(-1)
    assert held.tolist() == shard.row_ids.tolist()
    assert where[held].tolist() == list(range(len(shard.row_ids)))


def test_segment_envs_takes_the_columns_of_every_per_env_field():
    seg = segment(4, 5, [5, 5, 5, 5], seed=1)
    cols = np.array([1, 3])
    sub = segment_envs(seg, cols)
    assert sub.num_envs == 2 and sub.num_steps == 4
    for name in ("actions", "logprobs", "values", "rewards", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(sub, name), getattr(seg, name)[:, cols], err_msg=name)
    np.testing.assert_array_equal(sub.obs["states"], seg.obs["states"][:, cols])
    np.testing.assert_array_equal(sub.final_obs["states"], seg.final_obs["states"][:, cols])
    np.testing.assert_array_equal(sub.extras["noise"], seg.extras["noise"][:, cols])
    np.testing.assert_array_equal(sub.next_obs["states"], seg.next_obs["states"][cols])
    np.testing.assert_array_equal(sub.task_ids, seg.task_ids[cols])
    np.testing.assert_array_equal(sub.group_ids, seg.group_ids[cols])
    np.testing.assert_array_equal(sub.versions, seg.versions)  # per step: shared by every column
    assert segment_envs(seg, np.arange(5)) is seg


def test_one_process_slices_the_valid_rows_in_permutation_order():
    """One process: no position map is built; a minibatch is the permuted valid rows themselves."""
    valid = torch.tensor([True, False, True, True, False, True, True, True, False, True])
    shard = whole_batch(valid, torch.zeros(len(valid), dtype=torch.long))
    assert shard.local_positions() is None and shard.num_rows == 7
    order = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    got = list(minibatch_rows(shard, order, 3))
    valid_ids = valid.nonzero().squeeze(-1)
    assert [rows.tolist() for rows, _ in got] == [valid_ids[order[:3]].tolist(), valid_ids[order[3:6]].tolist()]
    assert all(bool(weight.all()) for _, weight in got)  # the remainder (one row) is left out of the epoch


def test_the_minibatch_mean_is_the_plain_mean_on_one_process_and_its_share_under_ddp():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=g)  # per-element values of a 6-row minibatch, 3 per row
    whole = MinibatchMean(torch.ones(6, dtype=torch.bool), 6.0)
    assert torch.equal(whole(x), x.mean()) and torch.equal(whole.local(x), x.mean())  # bit for bit
    assert int(whole.count(x > 0)) == int((x > 0).sum()) and whole.elements(x > 0) == 18
    # two ranks holding rows 0-3 and 4-5: DDP averages their losses' gradients, i.e. their values
    shares = [MinibatchMean(torch.ones(4, dtype=torch.bool), 3.0), MinibatchMean(torch.ones(2, dtype=torch.bool), 3.0)]
    torch.testing.assert_close((shares[0](x[:4]) + shares[1](x[4:])) / 2, x.mean())
    # a rank with none of the rows runs one with weight 0: no loss, no statistics, but a gradient path
    y = x[:1].clone().requires_grad_(True)
    idle = MinibatchMean(torch.zeros(1, dtype=torch.bool), 3.0)
    loss = idle(y)
    loss.backward()
    assert loss.item() == 0.0 and idle.rows == 0 and torch.equal(y.grad, torch.zeros_like(y))
