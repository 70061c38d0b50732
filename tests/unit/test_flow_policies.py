"""Flow-SDE (piRL) and Flow-Noise (ReinFlow) for the pi0 head, against references written here
independently: piRL/RLinf's transition in their own time convention (t = 1 noise), densities
integrated numerically, torch.distributions.Normal, the exact velocity of a Gaussian toy (to
check that the SDE keeps the ODE's marginals), and the server == learner log-prob identity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate
from torch.distributions import Normal

from rlfleet.algorithms.flow import (
    bounded_std,
    euler_step,
    flow_sde_sigma,
    flow_sde_step,
    gaussian_entropy,
    gaussian_log_prob,
    rectified_flow_score,
)
from rlfleet.envs.api import EnvConfig, encode_instructions, observation_spec
from rlfleet.policies.registry import make_policy
from rlfleet.policies.vla import TinyPi0Policy, TinyPi05Policy, VLAConfig, set_norm_stats
from rlfleet.wire.slots import output_slot, slot_layout

STATE_DIM, K, D, B, SIZE, STEPS = 39, 4, 3, 6, 16, 4
N_TOK = K * D
CLASSES = {"tiny_pi0": TinyPi0Policy, "tiny_pi05": TinyPi05Policy}
NORM_STATS = {
    "action": {"q01": [-2.0, -0.5, 0.0], "q99": [2.0, 0.5, 3.0]},
    "state": {"q01": [-1.5, -1.0, 0.0, -0.2], "q99": [1.5, 2.0, 0.5, 0.2]},
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make_obs(batch: int = B, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    texts = ["push the block", "open the drawer", "press the button"]
    return {
        "main_images": torch.randint(0, 256, (batch, SIZE, SIZE, 3), dtype=torch.uint8, generator=g),
        "states": torch.randn(batch, STATE_DIM, generator=g),
        "instructions": torch.from_numpy(encode_instructions([texts[i % 3] for i in range(batch)])),
    }


def build(name: str = "tiny_pi0", flow_rl: str = "sde", **cfg) -> TinyPi0Policy:
    """A small policy whose velocity and noise heads are not at their zero init (an untrained
    expert has v = 0, which would hide every error in the velocity terms)."""
    settings = dict(name=name, dim=32, heads=2, depth=1, flow_hidden=32, num_denoise_steps=STEPS, flow_rl=flow_rl)
    policy = CLASSES[name](STATE_DIM, D, K, VLAConfig(**{**settings, **cfg}), SIZE)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        policy.expert.out.weight.copy_(0.3 * torch.randn(policy.expert.out.weight.shape, generator=g))
        policy.expert.out.bias.copy_(0.1 * torch.randn(policy.expert.out.bias.shape, generator=g))
        if flow_rl == "noise":
            last = policy.noise_net.net[-1]
            last.weight.copy_(torch.randn(last.weight.shape, generator=g))
    return policy


def extras_of(policy, out):
    return {k: out[k] for k in policy.extra_outputs}


def rlinf_sde_step(x, v, t, delta, a, num_steps):
    """piRL / RLinf's Flow-SDE step, written in *their* convention (t = 1 noise, t = 0 data,
    v = dx/dt, t decreasing by delta), independently of rlfleet/algorithms/flow.py."""
    grid = [1 - j / num_steps for j in range(num_steps)]  # 1, 1 - 1/N, ...
    denom = 1 - (grid[1] if t == 1 else t) if num_steps > 1 else 1.0
    sigma = a * math.sqrt(t / denom)
    x_data = x - v * t  # the data estimate
    x_noise = x + v * (1 - t)  # the noise estimate
    mean = x_data * (1 - (t - delta)) + x_noise * (t - delta - sigma**2 * delta / (2 * t))
    return mean, math.sqrt(delta) * sigma


def reference_sde_logp(policy, obs, extras) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of the SDE step, recomputed here: Euler chain to x_k, then RLinf's
    mean/std (v = -u, t = 1 - s) and torch's Normal. Returns (logp [B, K*D], mu_k [B, K*D])."""
    with torch.no_grad():
        cond = policy.prefix_feature(obs)
        dt = 1.0 / STEPS
        out_lp, out_mu = [], []
        for row in range(cond.shape[0]):
            x = extras["flow_x0"][row : row + 1].double()
            k = int(extras["flow_step"][row, 0])
            for i in range(k + 1):
                s = torch.full((1,), i * dt)
                u = policy.expert(x.float(), s, cond[row : row + 1]).double()
                if i < k:
                    x = x + dt * u
            mean, std = rlinf_sde_step(x, -u, 1 - k * dt, dt, policy.cfg.sde_a, STEPS)
            out_lp.append(Normal(mean, std).log_prob(extras["flow_xnext"][row : row + 1].double()))
            out_mu.append(mean)
        return torch.cat(out_lp).float(), torch.cat(out_mu).float()


# ---- (a) Flow-SDE math ----------------------------------------------------------------------


@pytest.mark.parametrize("num_steps", [1, 4, 10])
@pytest.mark.parametrize("a", [0.3, 0.7])
def test_sde_sigma_is_a_sqrt_noise_over_signal(num_steps, a):
    """sigma(s) = a sqrt((1 - s) / s), the first step's s = 0 replaced by dt; std = sigma sqrt(dt)."""
    dt = 1.0 / num_steps
    for i in range(num_steps):
        s = i * dt
        want = a * math.sqrt((1 - s) / (s if i > 0 else dt))
        assert flow_sde_sigma(s, a, dt).item() == pytest.approx(want, rel=1e-6)
        _, std = flow_sde_step(torch.zeros(1, 2), torch.zeros(1, 2), s, dt, a)
        torch.testing.assert_close(std, torch.full((1, 2), want * math.sqrt(dt)), rtol=1e-6, atol=0)


@pytest.mark.parametrize("num_steps", [1, 4, 10])
def test_sde_step_matches_pirl_in_its_own_time_convention(num_steps):
    g = torch.Generator().manual_seed(3)
    x, u = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    dt = 1.0 / num_steps
    for i in range(num_steps):
        mean, std = flow_sde_step(x, u, i * dt, dt, 0.6)
        want_mean, want_std = rlinf_sde_step(x, -u, 1 - i * dt, dt, 0.6, num_steps)
        torch.testing.assert_close(mean, want_mean, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(std, torch.full_like(std, want_std), rtol=1e-10, atol=0)


def test_score_from_velocity_is_the_gaussian_score():
    """Data x1 ~ N(m, c^2): x_s ~ N(s m, (1-s)^2 + s^2 c^2), whose exact velocity E[x1 - eps | x_s]
    is linear in x; the score written from it must be the Gaussian's -(x - s m) / V."""
    m, c, s = 0.7, 0.4, 0.35
    var = (1 - s) ** 2 + s**2 * c**2
    x = torch.linspace(-2, 2, 9, dtype=torch.float64)
    u = m + (s * c**2 - (1 - s)) / var * (x - s * m)
    torch.testing.assert_close(rectified_flow_score(x, u, s), -(x - s * m) / var)


def test_sde_keeps_the_odes_marginals():
    """Every step stochastic, exact velocity of a Gaussian toy: the chain must end at the data
    distribution N(m, c^2), as the ODE does. Without the score term the variance is far off."""
    m, c, n, steps, a = 0.5, 0.3, 40_000, 50, 0.7
    dt = 1.0 / steps

    def velocity(x, s):
        var = (1 - s) ** 2 + s**2 * c**2
        return m + (s * c**2 - (1 - s)) / var * (x - s * m)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x_plain = x.clone()
    for i in range(steps):
        s = i * dt
        mean, std = flow_sde_step(x, velocity(x, s), s, dt, a)
        x = mean + std * torch.randn(n, generator=g, dtype=torch.float64)
        sigma = flow_sde_sigma(s, a, dt).item()  # the same noise, no score correction
        x_plain = euler_step(x_plain, velocity(x_plain, s), dt) + sigma * math.sqrt(dt) * torch.randn(
            n, generator=g, dtype=torch.float64
        )
    assert x.mean().item() == pytest.approx(m, abs=0.01)
    assert x.std().item() == pytest.approx(c, rel=0.03)
    assert x_plain.std().item() > 1.5 * c


def test_sde_step_density_integrates_numerically():
    """exp(log-prob) of one SDE step is a normalised density with mean mu and variance std^2
    (1-D, integrated with scipy), and its value on a small box matches the box probability."""
    x, u, s, dt = torch.tensor([0.3], dtype=torch.float64), torch.tensor([-0.8], dtype=torch.float64), 0.25, 0.25
    mean, std = flow_sde_step(x, u, s, dt, 0.5)
    mu, sd = mean.item(), std.item()

    def density(y):
        return math.exp(gaussian_log_prob(torch.tensor([y], dtype=torch.float64), mean, std).item())

    lo, hi = mu - 12 * sd, mu + 12 * sd
    assert integrate.quad(density, lo, hi)[0] == pytest.approx(1.0, abs=1e-8)
    assert integrate.quad(lambda y: y * density(y), lo, hi)[0] == pytest.approx(mu, abs=1e-8)
    assert integrate.quad(lambda y: (y - mu) ** 2 * density(y), lo, hi)[0] == pytest.approx(sd**2, rel=1e-7)
    y0, h = mu + 0.3 * sd, 1e-3 * sd
    box = integrate.quad(density, y0 - h, y0 + h)[0]
    assert math.log(box / (2 * h)) == pytest.approx(math.log(density(y0)), abs=1e-6)


@pytest.mark.parametrize("name", list(CLASSES))
def test_sde_logprob_is_the_gaussian_transition_at_step_k(name):
    """act's chunk log-prob = log N(x_{k+1}; mu_k, std_k) with mu_k, std_k from piRL's formula."""
    policy = build(name, logprob_type="token").eval()
    obs = make_obs()
    out = policy.act(obs)
    want, _ = reference_sde_logp(policy, obs, extras_of(policy, out))
    torch.testing.assert_close(out["logprobs"], want, atol=1e-4, rtol=1e-5)


def test_sde_samples_are_distributed_around_mu_k():
    """Many rollouts: (x_{k+1} - mu_k) / std_k is standard normal, and k is uniform on 0..N-1."""
    policy = build("tiny_pi0").eval()
    n = 512
    obs = make_obs(batch=n, seed=5)
    out = policy.act(obs)
    _, mu = reference_sde_logp(policy, obs, extras_of(policy, out))
    k = out["flow_step"][:, 0].long()
    std = torch.tensor(
        [flow_sde_sigma(i / STEPS, policy.cfg.sde_a, 1 / STEPS).item() * math.sqrt(1 / STEPS) for i in range(STEPS)]
    )[k].unsqueeze(-1)
    z = (out["flow_xnext"] - mu) / std
    assert abs(z.mean().item()) < 4 / math.sqrt(z.numel())
    assert z.std().item() == pytest.approx(1.0, abs=0.05)
    counts = torch.bincount(k, minlength=STEPS).float()
    assert ((counts - n / STEPS).abs() < 4 * math.sqrt(n / STEPS)).all(), counts


def test_sde_env_action_continues_the_ode_from_x_next():
    """The chunk sent to the env is the deterministic chain from x_{k+1} to s = 1, clamped."""
    policy = build("tiny_pi0").eval()
    obs = make_obs()
    out = policy.act(obs)
    with torch.no_grad():
        cond = policy.prefix_feature(obs)
        for row in range(B):
            x, k = out["flow_xnext"][row : row + 1], int(out["flow_step"][row, 0])
            for i in range(k + 1, STEPS):
                x = x + policy.expert(x, torch.full((1,), i / STEPS), cond[row : row + 1]) / STEPS
            torch.testing.assert_close(out["actions"][row].reshape(1, -1), x.clamp(-1, 1), atol=1e-5, rtol=0)


# ---- (b) server == learner ------------------------------------------------------------------


@pytest.mark.parametrize("flow_rl", ["sde", "noise"])
@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("logprob_type", ["token", "action", "chunk"])
def test_act_logprob_equals_evaluate_logprob(flow_rl, name, logprob_type):
    policy = build(name, flow_rl, logprob_type=logprob_type)
    set_norm_stats(policy, NORM_STATS)
    obs = make_obs(batch=9)
    out = policy.eval().act(obs)
    policy.train()
    logp, ent, values = policy.evaluate(obs, out["actions"], extras_of(policy, out))
    want = {"token": (9, N_TOK), "action": (9, K), "chunk": (9,)}[logprob_type]
    assert out["logprobs"].shape == logp.shape == ent.shape == want
    torch.testing.assert_close(logp.detach(), out["logprobs"], atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(values.detach(), out["values"], atol=1e-5, rtol=0)
    assert torch.isfinite(ent).all()


def test_logprob_types_are_reductions_of_one_another():
    """token log-probs summed per action step are the action ones, summed per chunk the chunk one."""
    per = {t: build("tiny_pi0", "noise", logprob_type=t) for t in ("token", "action", "chunk")}
    for p in per.values():
        p.load_state_dict(per["token"].state_dict())
    obs = make_obs()
    out = per["token"].act(obs)
    lp = {t: p.evaluate(obs, out["actions"], extras_of(p, out))[0].detach() for t, p in per.items()}
    torch.testing.assert_close(lp["token"].reshape(B, K, D).sum(-1), lp["action"], atol=1e-5, rtol=0)
    torch.testing.assert_close(lp["token"].sum(-1), lp["chunk"], atol=1e-4, rtol=0)


# ---- (c) Flow-Noise --------------------------------------------------------------------------


def test_flow_noise_joint_logprob_is_the_sum_of_step_normals():
    policy = build("tiny_pi0", "noise", logprob_type="chunk").eval()
    obs = make_obs()
    out = policy.act(obs)
    chain = out["flow_chain"]
    assert chain.shape == (B, STEPS + 1, N_TOK)
    with torch.no_grad():
        cond = policy.prefix_feature(obs)
        total_lp, total_ent = torch.zeros(B), torch.zeros(B)
        for i in range(STEPS):
            s = torch.full((B,), i / STEPS)
            h = policy.expert.hidden(chain[:, i], s, cond)
            dist = Normal(chain[:, i] + policy.expert.out(h) / STEPS, policy.noise_net(h, s))
            total_lp += dist.log_prob(chain[:, i + 1]).sum(-1)
            total_ent += dist.entropy().sum(-1)
        logp, ent, _ = policy.evaluate(obs, out["actions"], extras_of(policy, out))
    torch.testing.assert_close(out["logprobs"], total_lp, atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(logp, total_lp, atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(ent, total_ent, atol=1e-4, rtol=1e-6)
    # the env action is the chain's end, clamped (identity normalisation)
    torch.testing.assert_close(out["actions"].reshape(B, -1), chain[:, -1].clamp(-1, 1))


def test_flow_noise_std_stays_in_bounds():
    lo, hi = 0.05, 0.2
    policy = build("tiny_pi0", "noise", noise_min_std=lo, noise_max_std=hi)
    with torch.no_grad():
        policy.noise_net.net[-1].weight.mul_(50.0)  # saturate the sigmoid both ways
        h = 3 * torch.randn(256, policy.cfg.flow_hidden)
        std = policy.noise_net(h, torch.rand(256))
    assert (std >= lo).all() and (std <= hi).all()
    assert std.min().item() < lo + 0.01 and std.max().item() > hi - 0.01
    torch.testing.assert_close(bounded_std(torch.zeros(3), lo, hi), torch.full((3,), (lo + hi) / 2))
    fresh = build("tiny_pi0", "noise", noise_min_std=lo, noise_max_std=hi)
    torch.nn.init.zeros_(fresh.noise_net.net[-1].weight)  # the constructor's init
    with torch.no_grad():
        std0 = fresh.noise_net(torch.randn(4, fresh.cfg.flow_hidden), torch.rand(4))
    torch.testing.assert_close(std0, torch.full_like(std0, (lo + hi) / 2))


def test_gaussian_entropy_and_logprob_formulas():
    std = torch.tensor([0.05, 0.3, 2.0], dtype=torch.float64)
    mean, x = torch.tensor([0.1, -1.0, 3.0], dtype=torch.float64), torch.tensor([0.0, 0.2, 1.0], dtype=torch.float64)
    torch.testing.assert_close(gaussian_entropy(std), Normal(mean, std).entropy())
    torch.testing.assert_close(gaussian_log_prob(x, mean, std), Normal(mean, std).log_prob(x))


# ---- (d) deterministic acting is the plain ODE -------------------------------------------------


@pytest.mark.parametrize("flow_rl", ["sde", "noise"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_deterministic_act_is_the_plain_ode_from_zero(flow_rl, name):
    policy = build(name, flow_rl).eval()
    obs = make_obs()
    a, b = policy.act(obs, deterministic=True), policy.act(obs, deterministic=True)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=0, rtol=0)
    with torch.no_grad():
        cond = policy.prefix_feature(obs)
        chain = [torch.zeros(B, N_TOK)]
        for i in range(STEPS):
            chain.append(chain[-1] + policy.expert(chain[-1], torch.full((B,), i / STEPS), cond) / STEPS)
    torch.testing.assert_close(a["actions"].reshape(B, -1), chain[-1].clamp(-1, 1), atol=1e-5, rtol=0)
    torch.testing.assert_close(a["actions"], policy.sample(obs, torch.zeros(B, N_TOK)), atol=0, rtol=0)
    if flow_rl == "sde":
        assert (a["flow_x0"] == 0).all() and (a["flow_step"] == 0).all()
        torch.testing.assert_close(a["flow_xnext"], chain[1], atol=1e-6, rtol=0)
    else:
        torch.testing.assert_close(a["flow_chain"], torch.stack(chain, 1), atol=1e-5, rtol=0)
    s1, s2 = policy.act(obs), policy.act(obs)
    assert not torch.equal(s1["actions"], s2["actions"])


# ---- (e) gradients -------------------------------------------------------------------------


def _grad_modules(policy) -> set[str]:
    return {n.split(".")[0] for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}


@pytest.mark.parametrize("flow_rl", ["sde", "noise"])
def test_logprob_gradients_reach_the_expert_and_backbone(flow_rl):
    policy = build("tiny_pi0", flow_rl)
    obs = make_obs()
    out = policy.act(obs)
    logp, ent, _ = policy.evaluate(obs, out["actions"], extras_of(policy, out))
    logp.sum().backward(retain_graph=True)
    with_grad = _grad_modules(policy)
    assert {"expert", "backbone"} <= with_grad and "critic" not in with_grad
    assert not hasattr(policy, "log_std")  # the gaussian mode's std is not a parameter here
    if flow_rl == "noise":
        assert "noise_net" in with_grad
        policy.zero_grad()
        ent.sum().backward()  # the entropy bonus moves the learned std
        assert policy.noise_net.net[-1].weight.grad.abs().sum() > 0
    else:
        assert ent.grad_fn is None  # fixed schedule: the SDE's entropy is a constant


def test_sde_logprob_gradient_matches_finite_differences():
    """The gradient PPO follows (through mu_k and the recomputed x_k) is the derivative of the
    log-prob: compare with central differences in the expert's output bias (float64 expert)."""
    policy = build("tiny_pi0", "sde")
    obs = make_obs(batch=3)
    out = policy.act(obs)
    policy.expert.double()
    cond = policy.prefix_feature(obs).detach().double()
    extras = {k: v.double() for k, v in extras_of(policy, out).items()}
    assert (extras["flow_step"] > 0).any()  # some rows differentiate through the recomputed chain
    logp = policy._evaluate_sde(cond, extras)[0].sum()
    (grad,) = torch.autograd.grad(logp, policy.expert.out.bias)
    eps = 1e-6
    for j in (0, 5, N_TOK - 1):
        with torch.no_grad():
            policy.expert.out.bias[j] += eps
            up = policy._evaluate_sde(cond, extras)[0].sum()
            policy.expert.out.bias[j] -= 2 * eps
            down = policy._evaluate_sde(cond, extras)[0].sum()
            policy.expert.out.bias[j] += eps
        assert grad[j].item() == pytest.approx(((up - down) / (2 * eps)).item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("flow_rl", ["sde", "noise"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_critic_detach_keeps_the_value_loss_out_of_the_expert(flow_rl, name):
    policy = build(name, flow_rl)
    policy.value(make_obs()).square().mean().backward()
    assert _grad_modules(policy) == {"critic"}
    attached = build(name, flow_rl, critic_detach=False)
    attached.value(make_obs()).square().mean().backward()
    reached = _grad_modules(attached)
    assert "backbone" in reached and ("expert" in reached) == (name == "tiny_pi0")  # pi0's critic reads the expert


@pytest.mark.parametrize("flow_rl", ["sde", "noise"])
def test_policy_gradient_on_the_flow_logprob_improves_the_action(flow_rl):
    """REINFORCE with the flow log-prob moves the deterministic chunk toward a rewarded target:
    the log-prob's gradient points where higher-reward samples lie."""
    policy = build("tiny_pi0", flow_rl, logprob_type="chunk", sde_a=0.7, noise_min_std=0.1, noise_max_std=0.3)
    obs = make_obs(batch=64, seed=2)
    target = torch.full((64, K, D), 0.5)
    opt = torch.optim.Adam([p for n, p in policy.named_parameters() if n.startswith("expert")], lr=3e-3)

    def distance() -> float:
        return (policy.act(obs, deterministic=True)["actions"] - target).square().mean().item()

    before = distance()
    for _ in range(15):
        out = policy.act(obs)
        reward = -(out["actions"] - target).square().sum((1, 2))
        adv = (reward - reward.mean()) / (reward.std() + 1e-8)
        logp, _, _ = policy.evaluate(obs, out["actions"], extras_of(policy, out))
        opt.zero_grad()
        (-(adv * logp).mean()).backward()
        opt.step()
    assert distance() < 0.8 * before, (before, distance())


# ---- (f) the fleet carries the extras -------------------------------------------------------


@pytest.mark.parametrize(
    "flow_rl,want",
    [
        ("gaussian", {"noise": ((N_TOK,), "float32")}),
        (
            "sde",
            {"flow_x0": ((N_TOK,), "float32"), "flow_step": ((1,), "float32"), "flow_xnext": ((N_TOK,), "float32")},
        ),
        ("noise", {"flow_chain": ((STEPS + 1, N_TOK), "float32")}),
    ],
)
def test_extras_match_extra_outputs_and_fit_the_slots(flow_rl, want):
    policy = build("tiny_pi05", flow_rl)
    assert policy.extra_outputs == want
    out = policy.act(make_obs())
    assert set(out) == {"actions", "logprobs", "values", *want}
    for key, (shape, dtype) in want.items():
        assert out[key].shape == (B, *shape) and out[key].dtype == getattr(torch, dtype)
    layout = slot_layout(
        5, observation_spec(EnvConfig(image_size=SIZE), STATE_DIM), D, K, policy.logprob_shape, policy.extra_outputs
    )
    for key, (shape, dtype) in want.items():
        spec = layout[output_slot(key)]
        assert tuple(spec.shape) == (5, *shape) and np.dtype(spec.dtype) == np.dtype(dtype)


def test_evaluate_rejects_missing_or_bad_extras():
    policy = build("tiny_pi0", "sde")
    obs = make_obs()
    out = policy.act(obs)
    with pytest.raises(ValueError, match="flow_xnext"):
        policy.evaluate(obs, out["actions"], {"flow_x0": out["flow_x0"], "flow_step": out["flow_step"]})
    bad = {**extras_of(policy, out), "flow_step": torch.full((B, 1), float(STEPS))}
    with pytest.raises(ValueError, match="flow_step must be in"):
        policy.evaluate(obs, out["actions"], bad)
    with pytest.raises(ValueError, match="flow_chain"):
        build("tiny_pi0", "noise").evaluate(obs, out["actions"], extras_of(policy, out))


def test_config_and_registry():
    policy = make_policy(
        {"name": "tiny_pi05", "flow_rl": "noise", "dim": 32, "heads": 2, "noise_min_std": 0.1, "noise_max_std": 0.2},
        STATE_DIM,
        D,
        K,
        image_size=SIZE,
    )
    assert type(policy) is TinyPi05Policy and policy.flow_rl == "noise"
    assert (policy.noise_net.min_std, policy.noise_net.max_std) == (0.1, 0.2)
    assert VLAConfig().flow_rl == "gaussian"
    for bad, match in [
        ({"flow_rl": "ddpm"}, "flow_rl must be one of"),
        ({"sde_a": 0.0}, "sde_a"),
        ({"noise_min_std": 0.3, "noise_max_std": 0.2}, "noise_min_std"),
        ({"noise_min_std": 0.0}, "noise_min_std"),
    ]:
        with pytest.raises(ValueError, match=match):
            VLAConfig(name="tiny_pi0", **bad)
