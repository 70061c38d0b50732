"""DAgger / HG-DAgger: beta schedule, policy mixing, intervention gate, aggregation window, expert
labels from MetaWorld's scripted experts, and the rollout / train steps of the loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlfleet.algorithms.dagger import (
    AggregatedDataset,
    DAggerConfig,
    action_gap,
    beta_schedule,
    chunks_per_episode,
    expert_control,
    intervention_gate,
    mix_policies,
)
from rlfleet.config import load_config
from rlfleet.envs.api import EnvConfig, EnvSpec, StepResult
from rlfleet.envs.metaworld.env import MetaWorldEnv
from rlfleet.runs.dagger import collect_rollouts, train_on_dataset

D = 4


# --- beta schedule ----------------------------------------------------------------------------


def test_exponential_beta_schedule():
    got = [beta_schedule(i, 0.8, "exponential", decay=0.5) for i in range(4)]
    np.testing.assert_allclose(got, [0.8, 0.4, 0.2, 0.1])
    # decay 0: Ross et al.'s "beta_1 = 1, then 0"
    assert [beta_schedule(i, 1.0, "exponential", decay=0.0) for i in range(3)] == [1.0, 0.0, 0.0]
    assert beta_schedule(5, 1.0, "exponential", decay=1.0) == 1.0


def test_linear_beta_schedule():
    got = [beta_schedule(i, 1.0, "linear", linear_iters=4) for i in range(6)]
    np.testing.assert_allclose(got, [1.0, 0.75, 0.5, 0.25, 0.0, 0.0])
    assert beta_schedule(1, 0.5, "linear", linear_iters=2) == pytest.approx(0.25)


def test_beta_schedule_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown beta schedule"):
        beta_schedule(0, 1.0, "cosine")
    with pytest.raises(ValueError, match="iteration"):
        beta_schedule(-1, 1.0)


def test_config_validation_and_recipes_load():
    with pytest.raises(ValueError, match="variant"):
        DAggerConfig(variant="dart")
    with pytest.raises(ValueError, match="beta0"):
        DAggerConfig(beta0=1.5)
    with pytest.raises(ValueError, match="hg_threshold"):
        DAggerConfig(hg_threshold=-0.1)
    for recipe in ("metaworld_dagger_tinypi0", "metaworld_dagger_tinypi0_cpu"):
        cfg = load_config(recipe)
        dcfg = OmegaConf.to_object(cfg.dagger)
        assert dcfg.enabled and dcfg.variant == "dagger" and cfg.policy.name == "tiny_pi0"
        assert cfg.demos.bootstrap and cfg.eval.before
    hg = load_config("metaworld_dagger_tinypi0_cpu", ["dagger.variant=hg_dagger"])
    assert OmegaConf.to_object(hg.dagger).variant == "hg_dagger"
    assert not load_config("metaworld_quickstart_tinyoft").dagger.enabled  # PPO recipes unchanged


# --- mixing and gating ------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_mixing_fraction_matches_beta(beta):
    rng = np.random.default_rng(123)
    mask = np.concatenate([mix_policies(rng, beta, 10) for _ in range(4000)])
    assert mask.dtype == bool and mask.shape == (40_000,)
    # binomial std at n = 40000 is <= 0.0025: 4 sigma
    assert abs(mask.mean() - beta) < 0.01
    if beta in (0.0, 1.0):
        assert mask.mean() == beta
    again = np.concatenate([mix_policies(np.random.default_rng(123), beta, 10)])
    np.testing.assert_array_equal(again, mask[:10])  # seeded: reproducible


def test_intervention_gate_thresholds_the_first_action_distance():
    student = np.array([[0, 0, 0, 0], [0.3, 0, 0, 0], [1, 1, 0, 0]], np.float32)
    expert = np.zeros((3, D), np.float32)
    np.testing.assert_allclose(action_gap(student, expert), [0.0, 0.3, np.sqrt(2)], rtol=1e-6)
    np.testing.assert_array_equal(intervention_gate(student, expert, 0.5), [False, False, True])
    np.testing.assert_array_equal(intervention_gate(student, expert, 0.0), [False, True, True])
    np.testing.assert_array_equal(intervention_gate(student, expert, None), [False, False, False])
    with pytest.raises(ValueError, match="shape"):
        intervention_gate(student, expert[:2], 0.5)


def test_expert_control_per_variant():
    mixed = np.array([True, False, False, True])
    gated = np.array([False, True, False, True])
    use, keep = expert_control("dagger", mixed, gated)
    np.testing.assert_array_equal(use, mixed)  # DAgger ignores the gate ...
    assert keep.all()  # ... and labels every visited state
    use, keep = expert_control("hg_dagger", mixed, gated)
    np.testing.assert_array_equal(use, [True, True, False, True])
    np.testing.assert_array_equal(keep, use)  # HG-DAgger keeps only expert-controlled states
    with pytest.raises(ValueError, match="variant"):
        expert_control("dart", mixed, gated)


# --- the aggregation window -------------------------------------------------------------------


def _rows(start: int, n: int, K: int = 2) -> tuple[dict[str, np.ndarray], np.ndarray]:
    ids = np.arange(start, start + n)
    obs = {
        "states": np.repeat(ids[:, None], 3, 1).astype(np.float32),
        "main_images": np.broadcast_to(ids[:, None, None, None] % 256, (n, 4, 4, 3)).astype(np.uint8),
    }
    return obs, np.broadcast_to(ids[:, None, None], (n, K, D)).astype(np.float32)


def test_window_keeps_the_newest_samples(tmp_path):
    data = AggregatedDataset(window=25)
    assert data.add(*_rows(0, 10), iteration=-1) == 0
    assert data.add(*_rows(10, 10), iteration=0) == 0
    assert data.add(*_rows(20, 10), iteration=1) == 5  # 30 > 25: the 5 oldest go
    assert len(data) == 25
    obs, actions, its = data.arrays()
    np.testing.assert_array_equal(obs["states"][:, 0], np.arange(5, 30))  # oldest first, in order
    np.testing.assert_array_equal(actions[:, 0, 0], np.arange(5, 30))
    np.testing.assert_array_equal(its, [-1] * 5 + [0] * 10 + [1] * 10)
    assert data.add(*_rows(30, 40), iteration=2) == 40  # a batch larger than the window: 25 old + its 15 oldest
    assert len(data) == 25 and data.arrays()[0]["states"][0, 0] == 45
    assert (data.total_added, data.total_evicted) == (70, 45)

    data.save(tmp_path / "d.npz")
    back = AggregatedDataset.load(tmp_path / "d.npz")
    assert back.window == 25 and len(back) == 25 and (back.total_added, back.total_evicted) == (70, 45)
    for a, b in zip(back.arrays()[1:], data.arrays()[1:]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.arrays()[0]["main_images"], data.arrays()[0]["main_images"])
    smaller = AggregatedDataset.load(tmp_path / "d.npz", window=10)
    assert len(smaller) == 10 and smaller.arrays()[0]["states"][0, 0] == 60


def test_unbounded_window_and_errors():
    data = AggregatedDataset(window=0)
    for i in range(5):
        data.add(*_rows(10 * i, 10), iteration=i)
    assert len(data) == 50 and data.total_evicted == 0
    obs, actions = _rows(0, 3)
    with pytest.raises(ValueError, match="one row per"):
        data.add({"states": obs["states"][:2], "main_images": obs["main_images"]}, actions, 0)
    with pytest.raises(ValueError, match="keys"):
        data.add({"states": obs["states"]}, actions, 0)
    with pytest.raises(ValueError, match="empty"):
        AggregatedDataset(5).arrays()
    with pytest.raises(ValueError, match="window"):
        AggregatedDataset(-1)


# --- expert labels on the real env ------------------------------------------------------------


def _expert_direct(task: str, state: np.ndarray, raw_env) -> np.ndarray:
    """The scripted expert called directly, as rlfleet.data.demos records demos; reach-v3's aims
    the fingertips (`tcp_center`), not the hand (state[:3]), at the goal (state[36:39])."""
    import rlfleet.envs.metaworld  # noqa: F401, I001  (sets MUJOCO_GL before mujoco is imported)
    from metaworld.policies import ENV_POLICY_MAP

    state = state.astype(np.float64)
    if task == "reach-v3":
        state[36:39] += state[:3] - raw_env.tcp_center
    action = ENV_POLICY_MAP[task]().get_action(state)
    return np.clip(np.asarray(action, np.float32), -1.0, 1.0)


@pytest.mark.filterwarnings("ignore:Constant\\(s\\) may be too high")
def test_labels_equal_the_scripted_expert_at_the_visited_states():
    """Replay the executed actions one step at a time in a second env with the same seeds and query
    the expert directly at every state: the chunk labels must match, for expert- and student-run
    chunks, including the padding after an episode ends mid-chunk."""
    tasks = ["reach-v3", "button-press-topdown-v3"]
    K, T, seeds = 4, 6, np.array([11, 12])
    env = MetaWorldEnv(EnvConfig(task=",".join(tasks), chunk_size=K, max_episode_steps=T), 2)
    ref = MetaWorldEnv(EnvConfig(task=",".join(tasks), chunk_size=1, max_episode_steps=T), 2)
    try:
        obs = env.reset(seeds)
        ref_obs = ref.reset(seeds)
        np.testing.assert_array_equal(obs["states"], ref_obs["states"])
        np.testing.assert_array_equal(
            env.expert_actions(),
            np.stack([_expert_direct(t, s, r) for t, s, r in zip(tasks, obs["states"], ref._envs)]),
        )
        rng = np.random.default_rng(0)
        use_expert = np.array([True, False])
        for chunk in range(2):  # the second chunk is cut after T - K = 2 substeps
            student = rng.uniform(-1.5, 1.5, (2, K, D)).astype(np.float32)
            res, labels, executed = env.expert_chunk_step(student, use_expert)
            assert isinstance(res, StepResult) and labels.shape == executed.shape == (2, K, D)
            steps = K if chunk == 0 else T - K
            for k in range(steps):
                want = np.stack([_expert_direct(t, s, r) for t, s, r in zip(tasks, ref_obs["states"], ref._envs)])
                np.testing.assert_array_equal(labels[:, k], want)
                ref_obs = ref.chunk_step(executed[:, k : k + 1]).obs
            np.testing.assert_array_equal(executed[0], labels[0])  # env 0: the expert ran its own chunk
            np.testing.assert_array_equal(executed[1, :steps], np.clip(student[1, :steps], -1, 1))  # env 1: student
            for k in range(steps, K):  # skipped substeps: padded with the last real one
                np.testing.assert_array_equal(labels[:, k], labels[:, steps - 1])
            if chunk == 0:
                np.testing.assert_array_equal(res.obs["states"], ref_obs["states"])  # same trajectory
            else:
                assert res.episode_done.all()
        with pytest.raises(ValueError, match="use_expert"):
            env.expert_chunk_step(student, np.array([True]))
    finally:
        env.close()
        ref.close()


def test_chunk_step_is_unchanged_by_the_expert_path():
    """The same actions through chunk_step and expert_chunk_step (expert off) give the same episode."""
    cfg = EnvConfig(task="reach-v3", chunk_size=3, max_episode_steps=9)
    a, b = MetaWorldEnv(cfg, 2), MetaWorldEnv(cfg, 2)
    try:
        a.reset(np.array([5, 6]))
        b.reset(np.array([5, 6]))
        rng = np.random.default_rng(1)
        for _ in range(3):
            act = rng.uniform(-1, 1, (2, 3, D)).astype(np.float32)
            ra = a.chunk_step(act)
            rb, _, executed = b.expert_chunk_step(act, np.zeros(2, bool))
            np.testing.assert_array_equal(ra.obs["states"], rb.obs["states"])
            np.testing.assert_array_equal(ra.rewards, rb.rewards)
            np.testing.assert_array_equal(executed, act)
    finally:
        a.close()
        b.close()


# --- the loop's rollout and training steps (fake env: fast, exact) ----------------------------


class _FakeExpertEnv:
    """1-D stand-in for MetaWorldEnv: state x, expert action -x, an episode lasts `T` steps."""

    has_expert = True  # the declared capability collect_rollouts checks

    def __init__(self, num_envs: int, K: int = 2, T: int = 4):
        self.spec = EnvSpec(
            state_dim=1,
            action_dim=D,
            chunk_size=K,
            num_envs=num_envs,
            max_episode_steps=T,
            task_names=["a", "b"] * (num_envs // 2) + ["a"] * (num_envs % 2),
        )
        self.x = np.zeros(num_envs, np.float32)
        self.t = 0
        self.calls: list[np.ndarray] = []

    def _obs(self) -> dict:
        return {"states": np.repeat(self.x[:, None], 39, 1).astype(np.float32)}

    def reset(self, seeds: np.ndarray) -> dict:
        self.x = (np.asarray(seeds) % 7).astype(np.float32) / 10
        self.t = 0
        return self._obs()

    def expert_actions(self) -> np.ndarray:
        return np.repeat(-self.x[:, None], D, 1).astype(np.float32)

    def expert_chunk_step(self, actions, use_expert):
        self.calls.append(np.asarray(use_expert).copy())
        B, K = self.spec.num_envs, self.spec.chunk_size
        labels = np.zeros((B, K, D), np.float32)
        for k in range(K):
            labels[:, k] = self.expert_actions()
            act = np.where(use_expert[:, None], labels[:, k], actions[:, k])
            self.x = self.x + 0.1 * act[:, 0]
        self.t += K
        done = np.full(B, self.t >= self.spec.max_episode_steps)
        if done.all():
            self.t = 0
        res = StepResult(
            obs=self._obs(),
            rewards=np.zeros((B, K), np.float32),
            terminated=np.zeros(B, bool),
            truncated=done,
            success=np.zeros(B, bool),
            episode_done=done,
            episode_return=np.zeros(B, np.float32),
            episode_length=np.zeros(B, np.int32),
            episode_success_once=done & (np.arange(B) % 2 == 0),
            final_obs={},
            substeps=np.full(B, K, np.int32),
        )
        return res, labels, labels


class _ConstPolicy(torch.nn.Module):
    """Proposes the same chunk everywhere: value `a` per env (a list), to control the gap to the expert."""

    obs_keys = ("states",)

    def __init__(self, values: list[float], K: int = 2):
        super().__init__()
        self.values = torch.tensor(values, dtype=torch.float32)
        self.K = K
        self.w = torch.nn.Parameter(torch.zeros(()))

    def act(self, obs, deterministic=False):
        B = obs["states"].shape[0]
        return {"actions": self.values[:B, None, None].expand(B, self.K, D).clone()}

    def sft_loss(self, obs, actions):
        return (self.w + obs["states"].mean() * 0 - actions.mean()).square()


def test_rollout_fraction_of_expert_chunks_matches_beta():
    env = _FakeExpertEnv(num_envs=10, K=2, T=400)
    cfg = DAggerConfig(episodes_per_env=1)
    batch = collect_rollouts(
        env, _ConstPolicy([0.0] * 10), cfg, beta=0.3, rng=np.random.default_rng(7), seeds=np.arange(10)
    )
    assert batch.chunks == 10 * 200 and batch.env_steps == 10 * 400
    assert abs(batch.expert_chunks / batch.chunks - 0.3) < 0.03  # binomial std 0.01 at n = 2000
    assert len(batch.labels) == batch.chunks  # DAgger keeps every visited state
    assert batch.labels.shape == (2000, 2, D) and batch.obs["states"].shape == (2000, 39)
    assert len(batch.episode_success) == 10 and batch.episode_success == [True, False] * 5
    same = collect_rollouts(
        _FakeExpertEnv(10, 2, 400), _ConstPolicy([0.0] * 10), cfg, 0.3, np.random.default_rng(7), np.arange(10)
    )
    assert same.expert_chunks == batch.expert_chunks  # seeded


def test_hg_dagger_keeps_only_intervention_steps():
    """Envs whose student is far from the expert get gated (expert takes over, kept); the others
    stay with the student and none of their states enter D (beta 0: no random takeovers)."""
    env = _FakeExpertEnv(num_envs=4, K=2, T=8)
    # expert action is -x with x in [0, 0.3]: student 0.0 is within 0.5 of it, 2.0 never is
    policy = _ConstPolicy([0.0, 2.0, 0.0, 2.0])
    cfg = DAggerConfig(variant="hg_dagger", hg_threshold=0.5, episodes_per_env=1)
    batch = collect_rollouts(env, policy, cfg, beta=0.0, rng=np.random.default_rng(0), seeds=np.arange(4))
    for use in env.calls:
        np.testing.assert_array_equal(use, [False, True, False, True])
    assert batch.chunks == 16 and batch.expert_chunks == batch.gated_chunks == 8
    assert len(batch.labels) == 8  # only the intervention chunks
    # the kept states are those of envs 1 and 3 (their x moves with the expert's action, not the student's)
    kept_x = batch.obs["states"][:, 0]
    np.testing.assert_allclose(batch.labels[:, 0, 0], -kept_x, atol=1e-6)

    plain = DAggerConfig(variant="dagger", episodes_per_env=1)
    every = collect_rollouts(_FakeExpertEnv(4, 2, 8), policy, plain, 0.0, np.random.default_rng(0), np.arange(4))
    assert every.expert_chunks == 0 and len(every.labels) == 16  # DAgger: student drives, all states labelled


def test_train_on_dataset_minimises_the_sft_loss():
    policy = _ConstPolicy([0.0, 0.0])
    data = AggregatedDataset(window=100)
    obs, actions = _rows(0, 20)
    data.add({"states": obs["states"]}, np.full_like(actions, 0.5), iteration=0)
    opt = torch.optim.SGD(policy.parameters(), lr=0.2)
    cfg = DAggerConfig(train_steps=50, batch_size=8)
    first = train_on_dataset(
        policy, opt, data, DAggerConfig(train_steps=1, batch_size=8), torch.Generator().manual_seed(0)
    )
    last = train_on_dataset(policy, opt, data, cfg, torch.Generator().manual_seed(0))
    assert first == pytest.approx(0.25) and last < 0.05
    assert policy.w.item() == pytest.approx(0.5, abs=1e-3)


def test_chunks_per_episode():
    assert chunks_per_episode(160, 8) == 20 and chunks_per_episode(150, 8) == 19 and chunks_per_episode(5, 1) == 5
