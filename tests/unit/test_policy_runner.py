import numpy as np
import pytest
import torch
from torch import nn

from rlfleet.inference_server.batcher import InferenceRequest
from rlfleet.inference_server.policy_runner import PolicyRunner
from rlfleet.inference_server.weight_subscriber import WeightUpdate
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig
from rlfleet.wire.codec import WireFormatError

S, D, K = 4, 2, 3


def full_update(version: int, policy: nn.Module) -> WeightUpdate:
    """All of `policy`'s tensors, as the weight subscriber hands a first or complete pull."""
    return WeightUpdate(version, {k: v.clone() for k, v in policy.state_dict().items()}, complete=True)


def make_policy(seed: int, hidden=(16, 16)) -> GaussianMLPPolicy:
    torch.manual_seed(seed)
    policy = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=list(hidden)))
    # the default init makes every mean ~0 (output gain 0.01): spread the weights so that rows
    # (and policies) give clearly different outputs
    with torch.no_grad():
        for p in policy.parameters():
            p.normal_(0.0, 0.5)
    return policy


class Caller:
    def __init__(self, states: np.ndarray, deterministic: bool):
        self.states = states
        self.responses: list[tuple[dict, int]] = []
        self.failures: list[str] = []
        self.req = InferenceRequest(
            obs={"states": states},
            deterministic=deterministic,
            respond=lambda out, v: self.responses.append((out, v)),
            fail=self.failures.append,
        )


def states_of(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, S)).astype(np.float32)


def run_one(runner: PolicyRunner, states: np.ndarray, deterministic: bool = True):
    c = Caller(states, deterministic)
    runner.run([c.req])
    assert c.failures == [] and len(c.responses) == 1
    return c.responses[0]


def test_mixed_batch_returns_each_caller_its_rows():
    policy = make_policy(0)
    runner = PolicyRunner(policy, version=7)
    callers = [
        Caller(states_of(2, 1), deterministic=False),
        Caller(states_of(3, 2), deterministic=True),
        Caller(states_of(1, 3), deterministic=False),
        Caller(states_of(4, 4), deterministic=True),
    ]
    runner.run([c.req for c in callers])

    for c in callers:
        assert c.failures == []
        assert len(c.responses) == 1
        out, version = c.responses[0]
        n = c.states.shape[0]
        assert version == 7
        assert out["actions"].shape == (n, K, D) and out["actions"].dtype == np.float32
        assert out["logprobs"].shape == (n,)
        assert out["values"].shape == (n,)

        x = torch.from_numpy(c.states)
        with torch.no_grad():
            dist = policy.distribution(x)
            values = policy.value({"states": x}).numpy()
            logp = dist.log_prob(torch.from_numpy(out["actions"]).reshape(n, -1)).sum(-1).numpy()
            mean = dist.mean.reshape(n, K, D).numpy()
        # values and log-probs computed from *this caller's* states: the rows were not mixed up
        np.testing.assert_allclose(out["values"], values, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["logprobs"], logp, rtol=1e-5, atol=1e-5)
        if c.req.deterministic:
            np.testing.assert_allclose(out["actions"], mean, rtol=1e-6, atol=1e-6)
        else:
            assert not np.allclose(out["actions"], mean, atol=1e-3)  # a sample, not the mean

    assert runner.batches == 2  # one forward pass per (deterministic, stochastic) group
    assert runner.rows == 10


def test_policy_error_fails_every_caller_of_the_group():
    runner = PolicyRunner(make_policy(0), version=1)

    def broken(states, deterministic=False):
        raise RuntimeError("boom")

    runner.policy.act = broken  # type: ignore[method-assign]
    callers = [Caller(states_of(2, 1), False), Caller(states_of(1, 2), True)]
    runner.run([c.req for c in callers])
    for c in callers:
        assert c.responses == []
        assert len(c.failures) == 1 and "policy failed" in c.failures[0] and "boom" in c.failures[0]


def test_validate_accepts_good_states_and_copies_what_the_policy_reads():
    runner = PolicyRunner(make_policy(0), version=0)
    x = states_of(5, 0)
    out = runner.validate({"states": x, "instructions": np.zeros((5, 8), np.uint8)})
    assert list(out) == ["states"]  # only the keys the policy reads
    np.testing.assert_array_equal(out["states"], x)
    assert not np.shares_memory(out["states"], x)


def test_validate_rejects_empty_and_missing():
    runner = PolicyRunner(make_policy(0), version=0)
    with pytest.raises(WireFormatError, match="empty"):
        runner.validate({"states": np.zeros((0, S), np.float32)})
    with pytest.raises(WireFormatError, match="lacks 'states'"):
        runner.validate({"main_images": np.zeros((1, 4, 4, 3), np.uint8)})


def test_runner_refuses_a_policy_the_env_cannot_feed():
    policy = make_policy(0)
    with pytest.raises(ValueError, match="image_size"):
        PolicyRunner(policy, version=0, obs_spec={"main_images": ((8, 8, 3), "uint8")})


@pytest.mark.parametrize(
    "states, match",
    [
        (np.zeros((2, S), np.float64), "float32"),
        (np.zeros((2, S), np.int32), "float32"),
        (np.zeros((S,), np.float32), r"\[B, 4\]"),
        (np.zeros((2, S + 1), np.float32), r"\[2, 5\]"),
        (np.zeros((2, 1, S), np.float32), r"\[B, 4\]"),
        (np.array([[0.0, np.nan, 0.0, 0.0]], np.float32), "NaN"),
        (np.array([[0.0, 0.0, np.inf, 0.0]], np.float32), "inf"),
    ],
    ids=["float64", "int32", "1d", "wrong_dim", "3d", "nan", "inf"],
)
def test_validate_rejects_bad_states(states, match):
    runner = PolicyRunner(make_policy(0), version=0)
    with pytest.raises(WireFormatError, match=match):
        runner.validate({"states": states})


def test_load_update_changes_outputs_and_version():
    runner = PolicyRunner(make_policy(0), version=3)
    other = make_policy(1)
    x = states_of(6, 5)
    before, v_before = run_one(runner, x)
    assert v_before == 3

    runner.load_update(full_update(4, other))
    after, v_after = run_one(runner, x)
    assert v_after == 4 and runner.version == 4
    assert not np.allclose(before["actions"], after["actions"], atol=1e-3)
    assert not np.allclose(before["values"], after["values"], atol=1e-3)
    with torch.no_grad():
        want = other.act({"states": torch.from_numpy(x)}, deterministic=True)
    for key in ("actions", "logprobs", "values"):
        np.testing.assert_allclose(after[key], want[key].numpy(), rtol=1e-5, atol=1e-5)


def test_load_update_carries_normalisation_buffers():
    runner = PolicyRunner(make_policy(0), version=0)
    other = make_policy(0)
    other.update_normalization({"states": torch.randn(64, S) * 3 + 2})
    runner.load_update(full_update(1, other))
    torch.testing.assert_close(runner.policy.obs_norm.mean, other.obs_norm.mean)
    torch.testing.assert_close(runner.policy.obs_norm.var, other.obs_norm.var)


def test_load_update_of_another_architecture_is_a_clear_error():
    runner = PolicyRunner(make_policy(0, hidden=(16, 16)), version=5)
    x = states_of(3, 9)
    before, _ = run_one(runner, x)
    params_before = {k: v.clone() for k, v in runner.policy.state_dict().items()}

    with pytest.raises(ValueError, match="shape mismatch") as info:
        runner.load_update(full_update(6, make_policy(1, hidden=(32, 16))))
    msg = str(info.value)
    assert "actor.0.weight" in msg and "(32, 4) vs (16, 4)" in msg

    # nothing was half-loaded and the version did not move
    assert runner.version == 5
    for k, v in runner.policy.state_dict().items():
        assert torch.equal(v, params_before[k]), k
    after, version = run_one(runner, x)
    assert version == 5
    np.testing.assert_array_equal(after["actions"], before["actions"])


def test_load_update_with_missing_tensors_is_a_clear_error():
    runner = PolicyRunner(make_policy(0), version=0)
    no_norm = GaussianMLPPolicy(S, D, K, PolicyConfig(hidden_sizes=[16, 16], obs_norm=False))
    with pytest.raises(ValueError, match=r"missing \['obs_norm.count'"):
        runner.load_update(full_update(1, no_norm))
    assert runner.version == 0


def test_runner_puts_policy_in_eval_mode():
    policy = make_policy(0)
    policy.train()
    runner = PolicyRunner(policy, version=0)
    assert isinstance(runner.policy, nn.Module) and not runner.policy.training


def test_fast_act_log_prob_matches_torch_distribution():
    import torch

    from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig

    torch.manual_seed(0)
    policy = GaussianMLPPolicy(6, 3, 2, PolicyConfig(hidden_sizes=[16]))
    obs = {"states": torch.randn(5, 6)}
    out = policy.act(obs)
    logp, _, value = policy.evaluate(obs, out["actions"])
    torch.testing.assert_close(out["logprobs"], logp)
    torch.testing.assert_close(out["values"], value)


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "silu"])
def test_act_runs_the_same_ops_as_the_modules(activation):
    """act() bypasses nn.Module dispatch on the hot path: its mean and value must be the modules' own, bit for bit."""
    import torch

    from rlfleet.policies.gaussian_mlp import GaussianMLPPolicy, PolicyConfig

    torch.manual_seed(0)
    policy = GaussianMLPPolicy(6, 3, 2, PolicyConfig(hidden_sizes=[16, 8], activation=activation))
    states = torch.randn(5, 6)
    out = policy.act({"states": states}, deterministic=True)
    with torch.no_grad():
        x = policy._features(states)
        assert torch.equal(out["actions"].reshape(5, -1), policy.actor(x))
        assert torch.equal(out["values"], policy.critic(x).squeeze(-1))
