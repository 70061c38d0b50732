"""Credit-based flow control (rlfleet.learner.pacing) and exact update batches
(rlfleet.learner.batches): what the learner grants, and that a fleet paced by it trains every row
within the lag bound however fast its actors are, with every env step accounted for."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rlfleet.learner.batches import samples, split_columns, take_batch
from rlfleet.learner.pacing import SampleCredits, pace_limit
from rlfleet.learner.trainer import env_step_account
from rlfleet.wire.segment import Segment


def segment(T: int, B: int, version: int = 0, groups: int = 0, episodes: int = 1, env_steps: int | None = None):
    rng = np.random.default_rng(T * 100 + B)
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    return Segment(
        obs={"states": f32(T, B, 3)},
        actions=f32(T, B, 1, 2),
        logprobs=f32(T, B),
        values=f32(T, B),
        rewards=f32(T, B),
        terminated=np.zeros((T, B), bool),
        truncated=np.zeros((T, B), bool),
        final_obs={"states": f32(T, B, 3)},
        next_obs={"states": f32(B, 3)},
        versions=np.full(T, version, np.int64),
        task_ids=np.arange(B, dtype=np.int64),
        env_steps=np.array(T * B if env_steps is None else env_steps, np.int64),
        ep_returns=np.ones(episodes, np.float32),
        ep_lengths=np.ones(episodes, np.int32),
        ep_success=np.zeros(episodes, bool),
        ep_task_ids=np.zeros(episodes, np.int64),
        extras={},
        group_ids=(np.arange(B, dtype=np.int64) % groups) if groups else np.zeros(0, np.int64),
    )


# --- the credits ---------------------------------------------------------------------------------


def test_grants_while_there_is_room_then_waits_for_an_update():
    credits = SampleCredits(batch_samples=50, max_policy_lag=2)  # 100 owed at most; 150 for current actors
    assert credits.grant("a", 40, timeout=0) and credits.grant("b", 40, timeout=0)
    assert not credits.grant("a", 40, timeout=0)  # 80 owed + 40 > 100, and the actor told no version
    assert credits.owed() == 80 and credits.waits == 1
    credits.arrived("a", 40)  # reserved -> untrained: still owed
    credits.arrived("b", 40)
    assert credits.owed() == 80 and not credits.grant("a", 40, timeout=0)
    credits.trained(50, version=1)  # an update took 50 of them
    assert credits.owed() == 30 and credits.grant("a", 40, timeout=0)


def test_an_actor_with_current_weights_gets_one_more_update_of_room():
    credits = SampleCredits(batch_samples=50, max_policy_lag=2)
    credits.trained(0, version=7)
    assert credits.grant("a", 50, timeout=0) and credits.grant("a", 50, timeout=0)  # 100 owed
    # the next 50 would be trained at version 7 + 149 // 50 = 9: lag 2 from actions of version 7
    assert credits.grant("a", 50, timeout=0, version=7)
    assert not credits.grant("b", 10, timeout=0, version=7)  # 160 > (2 + 1) x 50
    credits.release("a")
    assert credits.grant("a", 50, timeout=0) and credits.grant("a", 50, timeout=0)
    assert not credits.grant("a", 50, timeout=0, version=6)  # weights one version behind: lag 3


def test_a_waiting_grant_wakes_when_an_update_finishes():
    credits = SampleCredits(batch_samples=10, max_policy_lag=1)
    assert credits.grant("a", 10, timeout=0)
    credits.arrived("a", 10)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(credits.grant("b", 10, timeout=60)))
    waiter.start()
    credits.trained(10, version=1)
    waiter.join(timeout=60)
    assert got == [True] and credits.owed() == 10


def test_the_next_update_is_never_starved_by_a_segment_larger_than_the_limit():
    credits = SampleCredits(batch_samples=10, max_policy_lag=1)
    assert credits.grant("a", 25, timeout=0)  # nothing owed: the learner needs it to start at all
    credits.arrived("a", 25)
    assert not credits.grant("a", 25, timeout=0)
    credits.trained(10)
    assert not credits.grant("a", 25, timeout=0)  # 15 owed: the next update can run on it
    credits.trained(10)
    assert credits.grant("a", 25, timeout=0)  # 5 owed: less than an update


def test_a_stream_that_ends_gives_its_reservations_back():
    credits = SampleCredits(batch_samples=10, max_policy_lag=2)
    assert credits.grant("dead", 10, timeout=0) and credits.grant("dead", 10, timeout=0)
    assert not credits.grant("live", 10, timeout=0)
    credits.release("dead")  # its actor stopped or died: those segments will not come
    assert credits.owed() == 0 and credits.grant("live", 10, timeout=0)


def test_unreserved_arrivals_are_owed_too():
    """Segments sent before a grant (an actor of the drop mode, or queued after its stream ended)."""
    credits = SampleCredits(batch_samples=10, max_policy_lag=2)
    credits.arrived("x", 20)
    assert credits.owed() == 20 and not credits.grant("x", 5, timeout=0)


def test_the_limit_follows_the_lag_bound():
    assert pace_limit(4096, 4) == 5 * 4096  # for actors whose weights are current
    assert SampleCredits(4096, 4).blind_limit == 4 * 4096
    assert SampleCredits(4096, 0).blind_limit == 4096  # on-policy: one update's worth at a time


def test_an_actor_starts_every_stage_when_its_segments_fit_the_lag_bound():
    # an actor asks for each pipeline stage's first segment before stepping any: with every stage's
    # segments within max(lag, 1) x batch (what rlfleet.config checks at start) all are granted at once
    credits = SampleCredits(2048, 4)
    assert all(credits.grant("actor0", 4096, timeout=0) for _ in range(2))  # 2 x 4096 = 4 x 2048
    # beyond it the second stage would wait for an update that needs the first stage's rows: the
    # config check refuses such a run (tests/unit/test_config.py)
    big = SampleCredits(2048, 4)
    assert big.grant("actor0", 16384, timeout=0)
    assert not big.grant("actor0", 16384, timeout=0.05)


# --- a paced fleet, simulated: actors as fast as can be, a learner that trains batch_samples per update --


def simulate(actors: int, T: int, B: int, batch: int, max_lag: int, paced: bool, updates: int = 30):
    """Every actor steps a segment the moment it may (instantly), half of them with their actions
    from the version before the learner's newest one (the weights still on their way).
    Returns the lag of every trained row and the env steps (stepped, trained, owed at the end)."""
    credits = SampleCredits(batch, max_lag)
    queue: list[Segment] = []
    lags: list[int] = []
    version, stepped, trained = 0, 0, 0
    for _ in range(updates):
        # each actor steps as many segments as it is granted; unpaced, the fleet runs ahead of the
        # learner by 3 updates' worth more at each update (it samples faster than it trains)
        for _ in range(64):
            started = False
            for a in range(actors):
                # even actors' weights are current and they say so; odd ones' are a version behind,
                # unsaid (-1): the worst the learner must allow for
                acted = version if a % 2 == 0 else max(version - 1, 0)
                told = acted if a % 2 == 0 else -1
                if paced and not credits.grant(f"actor{a}", T * B, timeout=0, version=told):
                    continue
                seg = segment(T, B, version=acted)
                stepped += int(seg.env_steps)
                credits.arrived(f"actor{a}", T * B)
                queue.append(seg)
                started = True
            if not started or not paced and len(queue) * T * B > 3 * batch * (version + 1):
                break
        while samples(queue) < batch:  # a learner never trains short
            queue.append(segment(T, B, version=version))
            stepped += T * B
        taken, queue = take_batch(queue, batch)
        assert samples(taken) == batch
        for seg in taken:
            lags.extend([version - int(v) for v in seg.versions for _ in range(seg.num_envs)])
        trained += sum(int(s.env_steps) for s in taken)
        version += 1
        credits.trained(batch, version)
    return np.array(lags), stepped, trained, sum(int(s.env_steps) for s in queue)


@pytest.mark.parametrize(
    ("actors", "T", "B", "batch", "max_lag"),
    [(1, 32, 64, 4096, 4), (8, 32, 8, 4096, 2), (32, 32, 2, 4096, 1), (3, 4, 3, 40, 2), (2, 8, 5, 64, 3)],
)
def test_paced_actors_never_step_a_row_it_cannot_train_in_time(actors, T, B, batch, max_lag):
    lags, stepped, trained, owed = simulate(actors, T, B, batch, max_lag, paced=True)
    assert lags.max() <= max_lag, np.bincount(lags)
    assert stepped == trained + owed  # every stepped env step is trained, or still owed to the next update
    assert owed <= pace_limit(batch, max_lag) + T * B


def test_the_same_fleet_unpaced_steps_rows_too_old_to_train():
    lags, *_ = simulate(8, 32, 8, 4096, 2, paced=False)
    assert lags.max() > 2  # what the trainer would mask (train/dropped_samples)


# --- an update's batch: exactly batch_samples -------------------------------------------------------


def test_an_update_takes_exactly_batch_samples_and_carries_the_rest():
    segs = [segment(4, 10), segment(4, 10), segment(4, 10)]  # 120 samples
    taken, rest = take_batch(segs, 100)
    assert samples(taken) == 100 and samples(rest) == 20
    assert [s.num_envs for s in taken] == [10, 10, 5] and [s.num_envs for s in rest] == [5]
    again, left = take_batch(rest + [segment(4, 20)], 100)  # the carried columns come first
    assert again[0] is rest[0] and samples(again) == 100 and left == []


def test_a_batch_that_is_no_multiple_of_T_rounds_up_to_whole_columns():
    taken, rest = take_batch([segment(4, 10)], 10)
    assert samples(taken) == 12 and samples(rest) == 28


def test_a_split_segment_keeps_its_env_steps_and_episodes_once():
    seg = segment(4, 10, episodes=3, env_steps=37)
    head, tail = split_columns(seg, 3)
    assert tail is not None
    assert int(head.env_steps) + int(tail.env_steps) == 37
    assert len(head.ep_returns) == 3 and len(tail.ep_returns) == 0  # the episodes were counted at gather
    assert np.array_equal(np.concatenate([head.actions, tail.actions], axis=1), seg.actions)


def test_grpo_groups_are_never_split():
    seg = segment(4, 8, groups=4)  # groups {0,4}, {1,5}, {2,6}, {3,7}
    head, tail = split_columns(seg, 3)
    assert tail is not None
    assert sorted(head.group_ids.tolist()) == [0, 0, 1, 1] and sorted(tail.group_ids.tolist()) == [2, 2, 3, 3]


def test_the_env_step_account_adds_up():
    segs = [segment(4, 3, env_steps=10), segment(2, 2, env_steps=8)]
    valid = torch.tensor([True] * 6 + [False] * 6 + [True, False, True, False])
    trained, masked = env_step_account(segs, valid)
    assert trained == 10 * 6 // 12 + 8 * 2 // 4 and trained + masked == 18


def test_a_rejected_segment_gives_its_reservation_back_and_grants_go_on():
    credits = SampleCredits(batch_samples=10, max_policy_lag=1)
    for _ in range(5):  # without unreserve the second grant would never come
        assert credits.grant("a", 10, timeout=0)
        credits.unreserve("a", 10)
        assert credits.owed() == 0
    assert credits.grant("a", 10, timeout=0)
    credits.unreserve("a", 1000)  # never more than the client holds
    credits.unreserve("b", 10)
    assert credits.owed() == 0 and credits.held("a") == 0


def test_one_client_holds_at_most_max_held():
    credits = SampleCredits(batch_samples=100, max_policy_lag=5, max_held=20)
    assert credits.grant("a", 10, timeout=0) and credits.grant("a", 10, timeout=0)
    assert not credits.grant("a", 10, timeout=0)  # room in the fleet, none in a's share
    assert credits.grant("b", 10, timeout=0)
    credits.arrived("a", 10)
    assert credits.grant("a", 10, timeout=0)


def test_stop_ends_waiting_grants_at_once():
    credits = SampleCredits(batch_samples=10, max_policy_lag=0)
    assert credits.grant("a", 10, timeout=0)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(credits.grant("b", 10, timeout=60)))
    waiter.start()
    credits.stop()
    waiter.join(timeout=30)
    assert got == [False]
    assert not credits.grant("a", 0, timeout=0)  # and every later one
