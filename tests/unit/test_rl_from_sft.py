"""Keeping RL near its SFT start: the KL penalty to the reference policy (the estimator against
exact categorical KLs, and its effect in `Trainer`) and the learning-rate warm-up."""

from __future__ import annotations

import copy

import pytest
import torch
from test_ddp_trainer import make_policy, update_segments

from rlfleet.algorithms import PPOConfig, kl_to_reference
from rlfleet.learner.trainer import Trainer


def test_k3_estimator_matches_exact_categorical_kl():
    gen = torch.Generator().manual_seed(0)
    pi = torch.softmax(torch.randn(6, generator=gen), 0)
    ref = torch.softmax(torch.randn(6, generator=gen), 0)
    exact = float((pi * (pi.log() - ref.log())).sum())  # KL(pi || ref), written out
    actions = torch.multinomial(pi, 200_000, replacement=True, generator=gen)
    estimate = kl_to_reference(pi.log()[actions], ref.log()[actions]).mean().item()
    assert estimate == pytest.approx(exact, rel=0.03)


def test_k3_is_zero_on_the_reference_and_nonnegative():
    logp = torch.randn(50)
    assert torch.equal(kl_to_reference(logp, logp), torch.zeros(50))
    assert (kl_to_reference(logp, logp + torch.randn(50)) >= 0).all()


def test_k3_gradient_points_towards_the_reference():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    kl_to_reference(logp, torch.tensor([-1.5, -1.5])).sum().backward()
    # above the reference: lower it (positive gradient); below it: raise it
    assert logp.grad[0] > 0 and logp.grad[1] < 0


def _distance_after_updates(kl_beta: float) -> float:
    torch.manual_seed(3)
    policy = make_policy(0)
    reference = copy.deepcopy(policy)
    cfg = PPOConfig(update_epochs=4, num_minibatches=2, lr=3e-2, max_policy_lag=4, kl_beta=kl_beta)
    trainer = Trainer(policy, cfg, reference=reference)
    for version in range(4):
        stats = trainer.step(update_segments(version), version)
        assert ("train/actor/kl_ref" in stats) == (kl_beta > 0)
    batch = trainer.prepare(update_segments(9), 9)
    with torch.no_grad():
        logp, _, _ = policy.evaluate(batch.obs, batch.actions, batch.extras)
        logp_ref, _, _ = reference.evaluate(batch.obs, batch.actions, batch.extras)
    return kl_to_reference(logp, logp_ref).mean().item()


def test_penalty_keeps_policy_near_reference():
    free, held = _distance_after_updates(0.0), _distance_after_updates(5.0)
    assert held < 0.5 * free


def test_first_update_sees_zero_kl_and_penalty_needs_a_reference():
    policy = make_policy(0)
    trainer = Trainer(
        policy, PPOConfig(update_epochs=1, num_minibatches=1, kl_beta=0.1), reference=copy.deepcopy(policy)
    )
    batch = trainer.prepare(update_segments(0), 0)
    with torch.no_grad():
        logp, _, _ = policy.evaluate(batch.obs, batch.actions, batch.extras)
    assert torch.allclose(batch.logp_ref, logp)
    with pytest.raises(ValueError, match="reference"):
        Trainer(make_policy(0), PPOConfig(kl_beta=0.1))
    with pytest.raises(ValueError, match="kl_beta"):
        PPOConfig(kl_beta=-1.0)


def test_lr_warms_up_linearly_after_the_critic_warmup():
    cfg = PPOConfig(update_epochs=1, num_minibatches=1, lr=1e-3, critic_warmup_updates=2, lr_warmup_updates=4)
    trainer = Trainer(make_policy(0), cfg)
    assert [trainer.lr_scale(i) for i in range(8)] == [1.0, 1.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    lrs = [trainer.step(update_segments(v), v)["train/lr"] for v in range(4)]
    assert lrs == pytest.approx([1e-3, 1e-3, 2.5e-4, 5e-4])
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
    with pytest.raises(ValueError, match="lr_warmup_updates"):
        PPOConfig(lr_warmup_updates=-1)


def test_critic_lr_is_its_own_group_outside_the_actor_warmup():
    cfg = PPOConfig(update_epochs=1, num_minibatches=1, lr=1e-4, critic_lr=1e-3, lr_warmup_updates=4)
    policy = make_policy(0)
    trainer = Trainer(policy, cfg)
    actor, critic = trainer.optimizer.param_groups
    assert {id(p) for p in critic["params"]} == {id(p) for p in policy.critic.parameters()}
    assert len(actor["params"]) + len(critic["params"]) == len(list(policy.parameters()))
    trainer.step(update_segments(0), 0)
    assert actor["lr"] == pytest.approx(2.5e-5) and critic["lr"] == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="critic_lr"):
        PPOConfig(critic_lr=0.0)


def test_every_parameter_group_is_gradient_clipped():
    """The critic's own group (critic_lr) is clipped to max_grad_norm like the actor's."""
    cfg = PPOConfig(update_epochs=1, num_minibatches=1, critic_lr=1e-3, max_grad_norm=1e-3, critic_warmup_updates=0)
    trainer = Trainer(make_policy(0), cfg, reward_scale=100.0)
    norms: list[float] = []
    step = trainer.optimizer.step

    def record_then_step(*args, **kwargs):
        for group in trainer.optimizer.param_groups:
            grads = [p.grad.norm() for p in group["params"] if p.grad is not None]
            norms.append(float(torch.stack(grads).norm()))
        return step(*args, **kwargs)

    trainer.optimizer.step = record_then_step
    trainer.step(update_segments(0), 0)
    assert norms and max(norms) <= 1e-3 * (1 + 1e-4)


def test_optimizer_state_saved_without_group_names_still_updates():
    """Checkpoints written before critic_lr have unnamed groups; resuming them must still train."""
    trainer = Trainer(make_policy(0), PPOConfig(update_epochs=1, num_minibatches=1, lr=1e-3))
    state = trainer.optimizer.state_dict()
    for group in state["param_groups"]:
        group.pop("name")
    trainer.optimizer.load_state_dict(state)
    assert "name" not in trainer.optimizer.param_groups[0]
    assert trainer.step(update_segments(0), 0)["train/lr"] == pytest.approx(1e-3)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_frozen_normalization_keeps_the_starting_statistics():
    policy = make_policy(0)
    before = {k: v.clone() for k, v in policy.state_dict().items() if "obs_norm" in k}
    Trainer(policy, PPOConfig(update_epochs=1, num_minibatches=1), freeze_normalization=True).step(
        update_segments(0), 0
    )
    after = {k: v for k, v in policy.state_dict().items() if "obs_norm" in k}
    assert before and all(torch.equal(before[k], after[k]) for k in before)
    moving = make_policy(0)
    Trainer(moving, PPOConfig(update_epochs=1, num_minibatches=1)).step(update_segments(0), 0)
    assert not torch.equal(moving.state_dict()["obs_norm.mean"], before["obs_norm.mean"])


def test_k3_stays_finite_for_far_apart_densities():
    logp = torch.tensor([-500.0, 0.0], requires_grad=True)
    kl = kl_to_reference(logp, torch.tensor([50.0, 0.0]))
    assert torch.isfinite(kl).all() and kl[0] == 10.0 and kl[1] == 0.0
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_nonfinite_loss_leaves_the_weights_alone():
    policy = make_policy(0)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    segments = update_segments(0)
    segments[0].rewards[...] = float("inf")  # advantages, and so the loss, become non-finite
    trainer = Trainer(policy, PPOConfig(update_epochs=1, num_minibatches=1, norm_adv=False))
    stats = trainer.step(segments, 0)
    assert stats["train/nonfinite_steps"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items() if "obs_norm" not in k)


def _sft_checkpoint(folder):
    """A tiny_pi0 SFT checkpoint (Flow-SDE mode: no exploration parameters), as the SFT bootstrap writes."""
    from test_flow_policies import SIZE, STATE_DIM, D, K, build

    from rlfleet.policies.checkpoint_io import model_config, save_checkpoint_folder

    settings = dict(name="tiny_pi0", dim=32, heads=2, depth=1, flow_hidden=32, num_denoise_steps=4)
    policy = build("tiny_pi0", "sde")
    save_checkpoint_folder(
        folder, policy, model_config({**settings, "flow_rl": "sde"}, STATE_DIM, D, K, image_size=SIZE)
    )
    return policy, settings


def test_flow_noise_starts_from_an_sft_checkpoint_without_a_noise_net(tmp_path):
    from rlfleet.policies.checkpoint_io import load_checkpoint

    sft, _ = _sft_checkpoint(tmp_path / "sft")
    noisy, cfg = load_checkpoint(tmp_path / "sft", overrides={"flow_rl": "noise"})
    assert noisy.flow_rl == "noise" and cfg["policy"]["flow_rl"] == "noise"
    theirs = sft.state_dict()
    for name, value in noisy.state_dict().items():
        if name.startswith("noise_net."):
            assert name not in theirs
        else:
            assert torch.equal(value, theirs[name]), name


def test_a_checkpoint_missing_other_weights_is_still_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    from rlfleet.policies.checkpoint_io import load_checkpoint

    _sft_checkpoint(tmp_path / "sft")
    weights = load_file(tmp_path / "sft" / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("critic.")}, tmp_path / "sft" / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing \['critic\."):
        load_checkpoint(tmp_path / "sft", overrides={"flow_rl": "noise"})


def test_flow_noise_reference_shares_the_trained_copys_fresh_noise_net(tmp_path):
    from omegaconf import OmegaConf
    from test_flow_policies import SIZE, STATE_DIM, D

    from rlfleet.policies.checkpoint_io import load_checkpoint, reference_policy
    from rlfleet.wire.run_spec import RunSpec

    _, settings = _sft_checkpoint(tmp_path / "sft")
    policy, _ = load_checkpoint(tmp_path / "sft", overrides={"flow_rl": "noise"})
    cfg = OmegaConf.create(
        {
            "algorithm": {"kl_beta": 0.1},
            "env": {"chunk_size": policy.chunk_size, "image_size": SIZE},
        }
    )
    spec = RunSpec(STATE_DIM, D, policy={**settings, "flow_rl": "noise", "model_path": str(tmp_path / "sft")})
    reference = reference_policy(cfg, spec, policy)
    for name, value in policy.state_dict().items():
        assert torch.equal(value, reference.state_dict()[name]), name


def test_flow_sde_starts_from_a_flow_noise_checkpoint(tmp_path):
    from test_flow_policies import SIZE, STATE_DIM, D, K, build

    from rlfleet.policies.checkpoint_io import load_checkpoint, model_config, save_checkpoint_folder

    noisy = build("tiny_pi0", "noise")
    settings = dict(name="tiny_pi0", dim=32, heads=2, depth=1, flow_hidden=32, num_denoise_steps=4, flow_rl="noise")
    save_checkpoint_folder(tmp_path / "sft", noisy, model_config(settings, STATE_DIM, D, K, image_size=SIZE))
    sde, _ = load_checkpoint(tmp_path / "sft", overrides={"flow_rl": "sde"})
    assert not hasattr(sde, "noise_net")
    theirs = noisy.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in sde.state_dict().items())
