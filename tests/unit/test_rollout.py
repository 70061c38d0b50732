import numpy as np
import pytest

from rlfleet.actors.env_worker import stage_slices
from rlfleet.actors.rollout import SegmentBuilder
from rlfleet.wire import codec
from rlfleet.wire.gen import tensor_pb2
from rlfleet.wire.segment import Segment
from rlfleet.wire.shm import SharedArrays
from rlfleet.wire.slots import slot_layout

E, S, D, K, T = 6, 3, 2, 2, 4
LO, HI = 2, 5  # the builder's stage owns rows 2..4 of the actor's slots
B = HI - LO
# a pixel policy's slots: image + state observations, per-action log-probs, one extra output
OBS_SPEC = {"states": ((S,), "float32"), "main_images": ((4, 4, 3), "uint8")}
LP_SHAPE = (K,)
EXTRAS = {"noise": ((K * D,), "float32")}
LAYOUT = slot_layout(E, OBS_SPEC, D, K, LP_SHAPE, EXTRAS)
OBS_KEYS = ("states", "main_images")


def new_obs(rng, slots, prefix=""):
    slots[prefix + "states"][:] = rng.normal(size=(E, S))
    slots[prefix + "main_images"][:] = rng.integers(1, 255, size=(E, 4, 4, 3))


@pytest.fixture
def slots():
    blk = SharedArrays.create(LAYOUT)
    try:
        yield blk
    finally:
        blk.close()


def test_slot_layout_shapes():
    layout = LAYOUT
    assert layout["states"].shape == (E, S) and layout["states"].dtype == "float32"
    assert layout["main_images"].shape == (E, 4, 4, 3) and layout["main_images"].dtype == "uint8"
    assert layout["actions"].shape == (E, K, D)
    assert layout["logprobs"].shape == (E, K)
    assert layout["extra.noise"].shape == (E, K * D)
    assert layout["rewards"].shape == (E, K)
    assert layout["final_states"].shape == (E, S)
    assert layout["final_main_images"].shape == (E, 4, 4, 3)
    assert layout["task_ids"].dtype == "int64" and layout["episode_length"].dtype == "int32"
    assert {k for k, v in layout.items() if v.dtype == "bool"} == {
        "terminated",
        "truncated",
        "success",
        "episode_done",
        "episode_success_once",
    }


# episode ends (by step t, row within the stage): (terminated, truncated)
ENDS = {(1, 0): (True, False), (2, 2): (False, True), (3, 0): (False, True)}


def run_rollout(slots, builder, base: float):
    """Fill the slots by hand as the inference server and env workers would, for T steps.

    Rows outside [LO, HI) get junk that must never reach the segment.
    """
    rng = np.random.default_rng(int(base))
    slots["task_ids"][:] = np.arange(E) + 100
    new_obs(rng, slots)
    keys = ("states", "main_images", "actions", "logprobs", "values", "extra.noise")
    expect = {k: [] for k in (*keys, "rewards", "final_states", "final_main_images")}
    episodes = []
    expect["env_steps"] = 0
    for t in range(T):
        # inference: actions for the current states
        slots["actions"][:] = rng.normal(size=(E, K, D))
        slots["logprobs"][:] = rng.normal(size=(E, K))
        slots["values"][:] = rng.normal(size=E)
        slots["extra.noise"][:] = rng.normal(size=(E, K * D))
        builder.record_policy(slots, version=10 + t)
        for k in keys:
            expect[k].append(np.array(slots[k][LO:HI]))

        # env step
        slots["rewards"][:] = rng.normal(size=(E, K))
        done = np.zeros(E, bool)
        slots["terminated"][:] = False
        slots["truncated"][:] = False
        new_obs(rng, slots, prefix="final_")  # junk wherever no episode ended
        slots["episode_return"][:] = -999.0
        slots["episode_length"][:] = -1
        slots["episode_success_once"][:] = True
        slots["substeps"][:] = 99  # other stages' rows: never counted
        slots["substeps"][LO:HI] = K
        for (tt, row), (term, trunc) in ENDS.items():
            if tt == t:
                i = LO + row
                done[i] = True
                slots["terminated"][i], slots["truncated"][i] = term, trunc
                slots["episode_return"][i] = base + 10 * t + row
                slots["episode_length"][i] = 20 + t
                slots["episode_success_once"][i] = term
                slots["substeps"][i] = 1  # the episode ended at the chunk's first substep
                episodes.append((base + 10 * t + row, 20 + t, term, 100 + i))
        done[0] = done[E - 1] = True  # other stages' rows: ignored
        slots["episode_done"][:] = done
        expect["rewards"].append(slots["rewards"][LO:HI].sum(axis=1))
        expect["final_states"].append(np.where(done[LO:HI, None], slots["final_states"][LO:HI], 0.0))
        expect["final_main_images"].append(
            np.where(done[LO:HI, None, None, None], slots["final_main_images"][LO:HI], 0)
        )
        new_obs(rng, slots)  # next observation (auto-reset included)
        ran = builder.record_step(slots)
        assert ran == int(slots["substeps"][LO:HI].sum())
        expect["env_steps"] += ran
        assert builder.full == (t == T - 1)
    steps = expect.pop("env_steps")
    return {**{k: np.stack(v) for k, v in expect.items()}, "env_steps": steps}, episodes


def test_segment_from_hand_filled_slots(slots):
    builder = SegmentBuilder(T, LO, HI, LAYOUT)
    expect, episodes = run_rollout(slots, builder, base=1.0)
    seg = builder.finish(slots)

    assert (seg.num_steps, seg.num_envs) == (T, B)
    for key in OBS_KEYS:
        np.testing.assert_array_equal(seg.obs[key], expect[key], err_msg=key)
    for key in ("actions", "logprobs", "values"):
        np.testing.assert_array_equal(getattr(seg, key), expect[key], err_msg=key)
    np.testing.assert_array_equal(seg.extras["noise"], expect["extra.noise"])
    np.testing.assert_allclose(seg.rewards, expect["rewards"], rtol=1e-6)  # summed over the chunk
    assert seg.rewards.shape == (T, B)
    np.testing.assert_array_equal(seg.final_obs["states"], expect["final_states"].astype(np.float32))
    np.testing.assert_array_equal(seg.final_obs["main_images"], expect["final_main_images"])
    assert np.count_nonzero(np.abs(seg.final_obs["states"]).sum(-1)) == len(ENDS)  # only where an episode ended
    assert np.count_nonzero(seg.final_obs["main_images"].reshape(T, B, -1).sum(-1)) == len(ENDS)

    want_term = np.zeros((T, B), bool)
    want_trunc = np.zeros((T, B), bool)
    for (t, row), (term, trunc) in ENDS.items():
        want_term[t, row], want_trunc[t, row] = term, trunc
    np.testing.assert_array_equal(seg.terminated, want_term)
    np.testing.assert_array_equal(seg.truncated, want_trunc)

    for key in OBS_KEYS:
        np.testing.assert_array_equal(seg.next_obs[key], slots[key][LO:HI])  # the current obs
        assert not np.shares_memory(seg.next_obs[key], slots[key])
    np.testing.assert_array_equal(seg.versions, [10, 11, 12, 13])
    np.testing.assert_array_equal(seg.task_ids, [102, 103, 104])
    # simulated substeps: each chunk cut by an episode end counts the one substep that ran
    assert seg.env_steps.shape == () and int(seg.env_steps) == T * B * K - len(ENDS) * (K - 1) == expect["env_steps"]

    np.testing.assert_allclose(seg.ep_returns, [e[0] for e in episodes])
    np.testing.assert_array_equal(seg.ep_lengths, [e[1] for e in episodes])
    np.testing.assert_array_equal(seg.ep_success, [e[2] for e in episodes])
    np.testing.assert_array_equal(seg.ep_task_ids, [e[3] for e in episodes])
    assert seg.ep_returns.dtype == np.float32 and seg.ep_lengths.dtype == np.int32

    # the segment passes the learner's schema check, also after a trip through the codec
    back = Segment.from_tensors(seg.to_tensors())
    wire = tensor_pb2.TensorMap.FromString(codec.encode_map(seg.to_tensors()).SerializeToString())
    decoded = Segment.from_tensors(codec.decode_map(wire))
    for name, arr in seg.to_tensors().items():
        np.testing.assert_array_equal(back.to_tensors()[name], arr, err_msg=name)
        np.testing.assert_array_equal(decoded.to_tensors()[name], arr, err_msg=name)
    seg.check_schema(OBS_SPEC, D, K, LP_SHAPE, {"noise": (K * D,)})
    with pytest.raises(codec.WireFormatError, match="logprobs"):
        seg.check_schema(OBS_SPEC, D, K, (), {"noise": (K * D,)})
    with pytest.raises(codec.WireFormatError, match="observation keys"):
        seg.check_schema({"states": ((S,), "float32")}, D, K, LP_SHAPE, {"noise": (K * D,)})
    with pytest.raises(codec.WireFormatError, match="main_images"):
        seg.check_schema({**OBS_SPEC, "main_images": ((8, 8, 3), "uint8")}, D, K, LP_SHAPE, {"noise": (K * D,)})


def test_segment_does_not_alias_builder_or_slots(slots):
    builder = SegmentBuilder(T, LO, HI, LAYOUT)
    run_rollout(slots, builder, base=1.0)
    seg = builder.finish(slots)
    saved = {k: np.array(v) for k, v in seg.to_tensors().items()}
    # the next rollout overwrites the builder's buffers and the slots
    expect2, episodes2 = run_rollout(slots, builder, base=2.0)
    seg2 = builder.finish(slots)
    for name, arr in saved.items():
        np.testing.assert_array_equal(seg.to_tensors()[name], arr, err_msg=name)
    # and the second segment holds only its own episodes and steps
    np.testing.assert_allclose(seg2.ep_returns, [e[0] for e in episodes2])
    np.testing.assert_array_equal(seg2.obs["states"], expect2["states"])
    assert builder.t == 0 and not builder.full


def test_segment_without_finished_episodes(slots):
    builder = SegmentBuilder(1, LO, HI, LAYOUT)
    slots["states"][:] = 1.0
    builder.record_policy(slots, version=3)
    slots["rewards"][:] = 0.5
    slots["episode_done"][:] = False
    slots["substeps"][:] = K
    builder.record_step(slots)
    seg = builder.finish(slots)
    assert int(seg.env_steps) == B * K
    assert seg.ep_returns.shape == (0,) and seg.ep_lengths.shape == (0,)
    np.testing.assert_array_equal(seg.rewards, np.full((1, B), 0.5 * K, np.float32))
    assert not seg.final_obs["states"].any() and not seg.final_obs["main_images"].any()
    Segment.from_tensors(seg.to_tensors())


@pytest.mark.parametrize(
    "num_envs, stages, workers",
    [(16, 2, 2), (12, 3, 2), (8, 1, 4), (6, 2, 3), (4, 4, 1), (1, 1, 1)],
)
def test_stage_slices_cover_every_row_once(num_envs, stages, workers):
    offset = 1000
    slices = stage_slices(num_envs, stages, workers, actor_offset=offset)
    assert len(slices) == workers
    seen = np.zeros(num_envs, int)
    per_worker = num_envs // (stages * workers)
    for worker in slices:
        assert sorted(sl.stage for sl in worker) == list(range(stages))  # one slice per stage
        for sl in worker:
            assert sl.hi - sl.lo == per_worker
            assert sl.global_offset == offset + sl.lo
            seen[sl.lo : sl.hi] += 1
    assert seen.tolist() == [1] * num_envs
    # each stage's slices tile exactly the stage's rows (the pool's stage_rows)
    for s in range(stages):
        rows = sorted((sl.lo, sl.hi) for w in slices for sl in w if sl.stage == s)
        assert rows[0][0] == s * num_envs // stages and rows[-1][1] == (s + 1) * num_envs // stages
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))


@pytest.mark.parametrize("num_envs, stages, workers", [(10, 2, 3), (7, 2, 1), (6, 4, 1), (2, 1, 4)])
def test_stage_slices_reject_non_divisible(num_envs, stages, workers):
    with pytest.raises(ValueError, match=rf"num_envs \({num_envs}\) must be divisible"):
        stage_slices(num_envs, stages, workers, actor_offset=0)
