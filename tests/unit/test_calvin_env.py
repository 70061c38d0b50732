"""CalvinEnv: the ChunkedEnv contract (shapes, auto-reset, seeds, rendering), instruction switching and
subtask rewards along a chain, expert labels, scene variants, and full chains solved by the experts."""

from __future__ import annotations

import numpy as np
import pytest

p = pytest.importorskip("pybullet")

from rlfleet.envs.api import INSTRUCTION_BYTES, decode_instructions, observation_spec  # noqa: E402
from rlfleet.envs.calvin.chains import CHAIN_LENGTH, EVAL_POOL_SIZE, chain_split, pool_entry  # noqa: E402
from rlfleet.envs.calvin.config import CalvinEnvConfig  # noqa: E402
from rlfleet.envs.calvin.env import ACTION_DIM, CalvinEnv  # noqa: E402
from rlfleet.envs.calvin.layout import VARIANTS, resolve_variants  # noqa: E402
from rlfleet.envs.calvin.scene import STATE_DIM, Scene  # noqa: E402
from rlfleet.envs.calvin.subtasks import SUBTASKS  # noqa: E402
from rlfleet.envs.calvin.symbolic import sample_initial_state  # noqa: E402
from rlfleet.envs.registry import make_env, registered_envs  # noqa: E402


def _cfg(**kw) -> CalvinEnvConfig:
    base = dict(name="calvin", task="A", max_episode_steps=1800, chunk_size=1, reward_type="success")
    base.update(kw)
    return CalvinEnvConfig(**base)


def _run_expert(env: CalvinEnv, max_chunks: int = 2000):
    """Drive env 0 with the expert until its episode ends; yields (obs before, result) per chunk."""
    obs = env._obs()
    ignored = np.zeros((env.spec.num_envs, env.spec.chunk_size, ACTION_DIM), np.float32)
    for _ in range(max_chunks):
        res, _, _ = env.expert_chunk_step(ignored, np.ones(env.spec.num_envs, bool))
        yield obs, res
        obs = res.obs
        if res.episode_done[0]:
            return
    raise AssertionError("episode did not end")


def test_registry_tasks_and_spec():
    assert "calvin" in registered_envs()
    env = make_env(_cfg(task="ABC"), 4, env_offset=1)
    try:
        assert isinstance(env, CalvinEnv)
        assert env.task_list == ["calvin-A", "calvin-B", "calvin-C"]
        assert env.spec.task_names == ["calvin-B", "calvin-C", "calvin-A", "calvin-B"]
        assert (env.spec.state_dim, env.spec.action_dim) == (STATE_DIM, ACTION_DIM) == (39, 7)
        obs = env.reset()
        np.testing.assert_array_equal(obs["task_ids"], [1, 2, 0, 1])
    finally:
        env.close()
    assert resolve_variants("A,B,C") == resolve_variants("ABC") == ["A", "B", "C"]
    assert resolve_variants("calvin-D") == ["D"]
    for bad in ("E", "", "A,Q"):
        with pytest.raises(ValueError, match="variant"):
            resolve_variants(bad)
    with pytest.raises(ValueError, match="pool"):
        CalvinEnv(_cfg(pool="test"), 1)
    with pytest.raises(ValueError, match="reward_type"):
        CalvinEnv(_cfg(reward_type="shaped"), 1)


def test_shapes_auto_reset_and_final_obs():
    K, T = 3, 4
    env = CalvinEnv(_cfg(task="AB", chunk_size=K, max_episode_steps=T), 2)
    try:
        obs = env.reset(np.array([5, 6]))
        assert obs["states"].shape == (2, STATE_DIM) and obs["states"].dtype == np.float32
        assert obs["instructions"].shape == (2, INSTRUCTION_BYTES) and obs["instructions"].dtype == np.uint8
        assert decode_instructions(obs["instructions"]) == obs["task_descriptions"]
        assert "main_images" not in obs
        chains = env.current_chains()
        assert obs["task_descriptions"] == [SUBTASKS[c.subtasks[0]].instruction for c in chains]
        zero = np.zeros((2, K, ACTION_DIM), np.float32)
        res = env.chunk_step(zero)
        assert res.rewards.shape == (2, K) and not res.episode_done.any()
        res = env.chunk_step(zero)  # step 4 of 4 is the second chunk's first substep
        assert res.truncated.all() and not res.terminated.any() and res.episode_done.all()
        np.testing.assert_array_equal(res.episode_length, [T, T])
        np.testing.assert_array_equal(res.episode_return, [0, 0])
        assert not res.episode_success_once.any()
        assert np.abs(res.final_obs["states"]).sum(1).min() > 0
        assert res.final_obs["instructions"].shape == (2, INSTRUCTION_BYTES)
        # the returned obs is the next episode's first observation (a new chain from the env's generator)
        assert not np.allclose(res.obs["states"], res.final_obs["states"])
        with pytest.raises(ValueError, match="shape"):
            env.chunk_step(np.zeros((2, K, 4), np.float32))
        with pytest.raises(ValueError, match="seeds"):
            env.reset(np.array([1]))
    finally:
        env.close()


def test_seeds_pick_pool_entries_reproducibly():
    env = CalvinEnv(_cfg(task="D", pool="eval"), 2)
    other = CalvinEnv(_cfg(task="D", pool="eval"), 2)
    try:
        obs = env.reset(np.array([10_003, 10_004]))
        assert env.current_chains() == [pool_entry("eval", 3), pool_entry("eval", 4)]
        assert 10_000 % EVAL_POOL_SIZE == 0
        assert all(chain_split(c.subtasks) == "eval" for c in env.current_chains())
        np.testing.assert_array_equal(other.reset(np.array([10_003, 10_004]))["states"], obs["states"])
        action = np.random.default_rng(0).uniform(-1, 1, (2, 1, ACTION_DIM)).astype(np.float32)
        np.testing.assert_array_equal(env.chunk_step(action).obs["states"], other.chunk_step(action).obs["states"])
        a = CalvinEnv(_cfg(seed=1), 2)
        try:
            a.reset()
            assert all(chain_split(c.subtasks) == "train" for c in a.current_chains())
        finally:
            a.close()
    finally:
        env.close()
        other.close()


def test_rendering_main_images_at_64_px():
    env = CalvinEnv(_cfg(task="AD", image_size=64, max_episode_steps=2), 2)
    try:
        obs = env.reset(np.array([0, 1]))
        img = obs["main_images"]
        assert img.shape == (2, 64, 64, 3) and img.dtype == np.uint8
        assert img.std() > 10 and not np.array_equal(img[0], img[1])  # desk colours differ
        res = env.chunk_step(np.zeros((2, 1, ACTION_DIM), np.float32))
        res = env.chunk_step(np.zeros((2, 1, ACTION_DIM), np.float32))
        assert res.episode_done.all() and res.final_obs["main_images"].shape == (2, 64, 64, 3)
        assert res.final_obs["main_images"].std() > 10
        grip = env.render_gripper(32)
        assert grip.shape == (2, 32, 32, 3) and grip.dtype == np.uint8
    finally:
        env.close()


def test_wrist_camera_adds_wrist_images_that_follow_the_hand():
    cfg = _cfg(task="D", image_size=32, max_episode_steps=3, wrist_camera=True)
    env = CalvinEnv(cfg, 2)
    try:
        obs = env.reset(np.array([0, 1]))
        assert set(observation_spec(cfg, STATE_DIM)) == {"states", "instructions", "main_images", "wrist_images"}
        wrist = obs["wrist_images"]
        assert wrist.shape == (2, 32, 32, 3) and wrist.dtype == np.uint8 and wrist.std() > 10
        assert not np.array_equal(wrist, obs["main_images"])  # another camera, not a copy
        np.testing.assert_array_equal(wrist, env.render_gripper(32))
        down = np.zeros((2, 1, ACTION_DIM), np.float32)
        down[:, :, 2] = -1.0  # the hand moves down: the camera on it sees the desk from nearer
        res = env.chunk_step(down)
        assert not np.array_equal(res.obs["wrist_images"], wrist)
        env.chunk_step(down)
        res = env.chunk_step(down)
        assert res.episode_done.all() and res.final_obs["wrist_images"].std() > 10
        assert not np.array_equal(res.final_obs["wrist_images"], res.obs["wrist_images"])  # the new episode's
    finally:
        env.close()


def test_instruction_switches_and_return_counts_subtasks():
    env = CalvinEnv(_cfg(task="B", chunk_size=4, pool="eval"), 1)
    try:
        env.reset(np.array([10_007]))
        chain = env.current_chains()[0].subtasks
        instructions = [SUBTASKS[n].instruction for n in chain]
        completed, seen = 0, []
        for obs, res in _run_expert(env):
            seen.append(obs["task_descriptions"][0])
            assert obs["task_descriptions"][0] == instructions[completed]
            assert decode_instructions(obs["instructions"])[0] == instructions[completed]
            completed += int(res.rewards[0].sum())
        assert completed == CHAIN_LENGTH == env.last_chain_progress[0]
        assert res.terminated[0] and res.success[0] and res.episode_success_once[0]
        assert res.episode_return[0] == CHAIN_LENGTH
        assert [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]] == instructions
    finally:
        env.close()


def test_truncated_episode_returns_completed_subtasks():
    for reward_type in ("success", "success_once"):
        env = CalvinEnv(_cfg(task="C", chunk_size=2, max_episode_steps=160, reward_type=reward_type), 1)
        try:
            env.reset(np.array([11]))
            for _, res in _run_expert(env):  # noqa: B007 (the last reply is read after the loop)
                pass
            done = int(env.last_chain_progress[0])
            assert res.truncated[0] and not res.episode_success_once[0] and res.episode_length[0] == 160
            assert 1 <= done < CHAIN_LENGTH
            assert res.episode_return[0] == (done if reward_type == "success" else 0)
        finally:
            env.close()


@pytest.mark.parametrize("subtask_steps, budget", [(100, 100), (0, 360)])
def test_subtask_budget_truncates_from_the_last_completion(subtask_steps, budget):
    env = CalvinEnv(_cfg(task="D", subtask_steps=subtask_steps), 1)
    try:
        env.reset(np.array([3]))
        ignored = np.zeros((1, 1, ACTION_DIM), np.float32)
        first = 0
        while True:  # the expert completes the first subtask ...
            res, _, _ = env.expert_chunk_step(ignored, np.ones(1, bool))
            first += 1
            assert first <= 200 and not res.episode_done[0]
            if res.rewards[0, 0] > 0:
                break
        hold = np.zeros((1, 1, ACTION_DIM), np.float32)
        for _ in range(budget - 1):  # ... then the arm holds: no progress on the second
            assert not env.chunk_step(hold).episode_done[0]
        res = env.chunk_step(hold)
        assert res.truncated[0] and not res.terminated[0]
        assert res.episode_length[0] == first + budget and res.episode_return[0] == 1
    finally:
        env.close()
    with pytest.raises(ValueError, match="subtask_steps"):
        CalvinEnv(_cfg(subtask_steps=-1), 1)


def test_expert_labels_match_expert_actions_and_student_path():
    env = CalvinEnv(_cfg(task="A", chunk_size=3), 2)
    try:
        env.reset(np.array([3, 4]))
        first = env.expert_actions()
        assert first.shape == (2, ACTION_DIM) and first.dtype == np.float32 and np.abs(first).max() <= 1
        student = np.full((2, 3, ACTION_DIM), 0.5, np.float32)
        res, labels, executed = env.expert_chunk_step(student, np.array([True, False]))
        np.testing.assert_array_equal(labels[:, 0], first)
        np.testing.assert_array_equal(executed[0], labels[0])
        np.testing.assert_array_equal(executed[1], student[1])
        with pytest.raises(ValueError, match="use_expert"):
            env.expert_chunk_step(student, np.array([True]))
    finally:
        env.close()


def test_variants_place_fixtures_differently():
    fixtures = {name: (v.drawer_xy, v.cabinet_y, v.button_xy, v.switch_xy, v.desk_rgba) for name, v in VARIANTS.items()}
    names = sorted(fixtures)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert fixtures[a][:4] != fixtures[b][:4] and fixtures[a][4] != fixtures[b][4], (a, b)
    state = sample_initial_state(0)
    positions = {}
    for name, variant in VARIANTS.items():
        scene = Scene(variant)
        try:
            scene.reset(state, np.random.default_rng(0))
            positions[name] = np.concatenate(
                [
                    p.getBasePositionAndOrientation(body, physicsClientId=scene.client)[0]
                    for body in (scene.drawer, scene.slider, scene.button, scene.switch)
                ]
            )
        finally:
            scene.close()
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert np.abs(positions[a] - positions[b]).max() > 0.05, (a, b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expert_solves_eval_chains(seed):
    env = CalvinEnv(_cfg(task="ABCD"[seed], chunk_size=5, pool="eval"), 1)
    try:
        env.reset(np.array([seed]))
        for _, res in _run_expert(env):  # noqa: B007 (the last reply is read after the loop)
            pass
        assert env.last_chain_progress[0] == CHAIN_LENGTH, env.current_chains()
    finally:
        env.close()


def _phi_from_states(states: np.ndarray, subtask: str, held: bool) -> float:
    """The documented block progress recomputed from the `states` observation (tcp, block poses)."""
    from rlfleet.envs.calvin.layout import BLOCK_COLORS
    from rlfleet.envs.calvin.shaping import REACH_RANGE

    task = SUBTASKS[subtask]
    if task.kind not in ("lift", "push", "rotate"):
        return 0.0
    j = 15 + 6 + 6 * BLOCK_COLORS.index(task.color)
    d = float(np.linalg.norm(states[:3] - states[j : j + 3]))
    return 0.5 * max(0.0, 1 - d / REACH_RANGE) + (0.5 if held else 0.0)


def test_progress_reward_shapes_block_subtasks_by_a_potential_difference():
    w = 0.4
    seed = next(s for s in range(200) if pool_entry("train", s).subtasks[0].startswith("lift_"))
    chain = pool_entry("train", seed).subtasks
    runs, returns = {}, {}
    for shaped in (0.0, w):
        env = CalvinEnv(_cfg(task="D", progress_reward=shaped), 1)
        try:
            env.reset(np.array([seed]))
            steps = list(_run_expert(env))
            runs[shaped] = [(obs["states"][0], float(res.rewards[0, 0])) for obs, res in steps]
            returns[shaped] = float(steps[-1][1].episode_return[0])
        finally:
            env.close()
    sparse, dense = [r for _, r in runs[0.0]], [r for _, r in runs[w]]
    states = [s for s, _ in runs[w]]
    assert len(sparse) == len(dense)  # the shaping does not change what happens
    ends = [i for i, r in enumerate(sparse) if r == 1.0]
    assert len(ends) == CHAIN_LENGTH and returns[0.0] == CHAIN_LENGTH
    # The shaping sums to -w * Phi(s_0) over the episode: the return still rounds to the subtasks done.
    phi0 = _phi_from_states(states[0], chain[0], held=False)
    assert 0.0 <= phi0 < 0.5
    assert returns[w] == pytest.approx(CHAIN_LENGTH - w * phi0, abs=1e-4)
    assert sum(dense) == pytest.approx(returns[w], abs=1e-4)
    # A step of the approach pays w times the change of progress the observations show ...
    approach = [k for k in range(ends[0] - 1) if dense[k] != 0.0]
    assert len(approach) > 10
    for k in approach[:10]:
        want = _phi_from_states(states[k + 1], chain[0], False) - _phi_from_states(states[k], chain[0], False)
        assert dense[k] == pytest.approx(w * want, abs=1e-4)
    # ... and up to the lift's completion the hand earned the reach and the hold (block in hand).
    assert sum(dense[: ends[0]]) == pytest.approx(w * (1.0 - phi0), abs=0.03)
    # Subtasks that name no block (placing in the drawer, the LED) are paid as sparse until their
    # last step (which starts the next subtask's progress).
    unshaped = [j for j, n in enumerate(chain) if SUBTASKS[n].kind not in ("lift", "push", "rotate")]
    assert unshaped
    for j in unshaped:
        assert dense[ends[j - 1] + 1 : ends[j]] == sparse[ends[j - 1] + 1 : ends[j]]
    for bad, reward_type in ((1.0, "success"), (0.5, "success_once")):
        with pytest.raises(ValueError, match="progress_reward"):
            CalvinEnv(_cfg(progress_reward=bad, reward_type=reward_type), 1)


def test_seeds_a_pool_apart_play_one_chain_and_say_so():
    """`episode_scenes` names the pool entry, so two evaluations are paired on the chain played
    (rlfleet.eval.paired), not on a seed that wraps around the pool."""
    env = make_env(_cfg(pool="eval"), 2)
    try:
        obs = env.reset(np.array([10_000, 10_000 + EVAL_POOL_SIZE]))
        assert env.episode_scenes() == [10_000 % EVAL_POOL_SIZE] * 2
        assert np.array_equal(obs["states"][0], obs["states"][1])
    finally:
        env.close()
