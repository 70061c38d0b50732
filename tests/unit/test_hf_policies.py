"""The transformers VLA family (hf_oft, hf_pi0, hf_pi05) on tiny configs of the real classes:
the policy contract, the prefix cache, adapter-only weights in checkpoints and in flight, hf://
backbones from an offline cache, and the pi0 key map against a checkpoint laid out as LeRobot's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load as st_load
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("peft")

from test_hub import lay_hf_cache  # noqa: E402 (tests/unit is on the path: no __init__.py)
from test_weight_delta import Learner, served, wait_for  # noqa: E402, F401

from rlfleet.envs.api import encode_instructions  # noqa: E402
from rlfleet.inference_server.weight_subscriber import WeightSubscriber, pull_weights  # noqa: E402
from rlfleet.policies.checkpoint_io import load_tensors  # noqa: E402
from rlfleet.policies.hf.keymap import load_pi0_weights, map_pi0_key  # noqa: E402
from rlfleet.policies.hf.tiny import write_tiny_backbone  # noqa: E402
from rlfleet.policies.registry import make_policy  # noqa: E402
from rlfleet.wire.gen import learner_pb2_grpc  # noqa: E402

STATE, ACTION, CHUNK, IMAGE = 39, 4, 5, 64


@pytest.fixture(autouse=True)
def backbones(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RLFLEET_BACKBONES", str(tmp_path_factory.getbasetemp() / "backbones"))


def obs(n: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    texts = ["pick the red cube", "open the drawer", "press button"]
    return {
        "main_images": torch.randint(0, 256, (n, IMAGE, IMAGE, 3), dtype=torch.uint8, generator=g),
        "states": torch.randn(n, STATE, generator=g),
        "instructions": torch.from_numpy(encode_instructions([texts[i % 3] for i in range(n)])),
    }


def policy(seed: int = 0, **settings) -> nn.Module:
    torch.manual_seed(seed)
    cfg = {"name": "hf_oft", "backbone": "builtin:tiny-paligemma", "lora_rank": 4, "expert_width": 32, **settings}
    return make_policy(cfg, STATE, ACTION, CHUNK, image_size=IMAGE)


CASES = [
    {"name": "hf_oft", "oft_head": "bins"},
    {"name": "hf_oft", "oft_head": "l1", "backbone": "builtin:tiny-smolvlm"},
    {"name": "hf_pi0", "flow_rl": "gaussian"},
    {"name": "hf_pi0", "flow_rl": "sde", "backbone": "builtin:tiny-smolvlm"},
    {"name": "hf_pi0", "flow_rl": "noise"},
    {"name": "hf_pi05", "flow_rl": "gaussian", "max_text_len": 48},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_contract_act_then_evaluate_gives_the_same_logprob(case):
    p = policy(**case)
    o = obs()
    out = p.act(o)
    assert out["actions"].shape == (3, CHUNK, ACTION)
    assert out["logprobs"].shape == (3, *p.logprob_shape) and out["values"].shape == (3,)
    p.train()
    logp, entropy, values = p.evaluate(o, out["actions"], {k: out[k] for k in p.extra_outputs})
    assert torch.allclose(logp, out["logprobs"], atol=5e-4)
    assert torch.allclose(values, out["values"], atol=1e-5)
    assert torch.isfinite(entropy).all()
    loss = p.sft_loss(o, out["actions"])
    loss.backward()
    trained = {n for n, q in p.named_parameters() if q.grad is not None}
    assert any("lora_" in n for n in trained)
    frozen = {n for n, q in p.named_parameters() if not q.requires_grad}
    assert not frozen & trained and all(n.startswith("prefix.vlm.") for n in frozen)


def test_state_dict_holds_adapters_heads_and_normalisation_only():
    p = policy()
    names = set(p.state_dict())
    assert names and not {n for n in names if n.startswith("prefix.vlm.") and "lora_" not in n}
    assert {"action_queries", "norm.action_q01"} <= names
    total, sent = p.element_counts()
    assert sent < 0.2 * total
    other = policy(seed=1)  # same base from the backbone folder, other heads
    assert other.load_state_dict(p.state_dict()).missing_keys == []
    o = obs()
    torch.manual_seed(5)
    a = p.act(o, deterministic=True)["actions"]
    assert torch.equal(a, other.act(o, deterministic=True)["actions"])


def test_lora_off_trains_the_language_model_and_sends_it():
    p = policy(lora_rank=0)
    names = set(p.state_dict())
    assert any(".language_model.layers.0.self_attn.q_proj.weight" in n for n in names)
    assert not any(".vision_tower." in n for n in names)  # freeze_vision


@pytest.mark.parametrize("name", ["hf_pi0", "hf_pi05"])
def test_prefix_cache_act_equals_the_uncached_act(name):
    cached = policy(name=name, max_text_len=48, num_denoise_steps=5)
    uncached = policy(name=name, max_text_len=48, num_denoise_steps=5, prefix_cache=False)
    uncached.load_state_dict(cached.state_dict())
    o = obs()
    for deterministic in (True, False):
        torch.manual_seed(3)
        a = cached.act(o, deterministic)
        torch.manual_seed(3)
        b = uncached.act(o, deterministic)
        assert torch.equal(a["actions"], b["actions"]) and torch.equal(a["logprobs"], b["logprobs"])


@pytest.mark.parametrize("name", ["hf_oft", "hf_pi0"])
def test_adapter_only_versions_keep_learner_and_server_bit_identical(served, name):  # noqa: F811 (a fixture)
    """The learner publishes what its state_dict holds (adapters, heads, normalisation) over the real
    LearnerService; the server's replica, built on its own copy of the base, follows it exactly."""
    pub, channel = served
    learner = Learner(policy(name=name), pub)
    learner.publish()
    stub = learner_pb2_grpc.LearnerServiceStub(channel)
    initial = pull_weights(stub)
    replica = policy(seed=7, name=name)
    load_tensors(replica, st_load(initial.data))
    sub = WeightSubscriber(channel, initial, "inference-0", delta=True).start()
    base_storage = {n: t.data_ptr() for n, t in replica.prefix.vlm.state_dict().items()}
    opt = torch.optim.Adam([q for q in learner.model.parameters() if q.requires_grad], lr=1e-2)
    full_bytes = sum(t.numel() * t.element_size() for t in learner.model.parameters())
    try:
        for _ in range(3):
            o = obs(4, seed=learner.version)
            learner.model.train()
            loss = learner.model.sft_loss(o, torch.rand(4, CHUNK, ACTION) * 2 - 1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            learner.publish()
            want = learner.version - 1
            assert wait_for(lambda want=want: sub.known == want)
            update = sub.take()
            load_tensors(replica, update.tensors, partial=not update.complete)
            for key, t in learner.model.state_dict().items():
                assert torch.equal(replica.state_dict()[key], t), key
        version_bytes = len(pub.current().data)
        assert version_bytes < 0.35 * full_bytes
        for key, t in learner.model.prefix.vlm.state_dict().items():  # the frozen base and the adapters
            assert torch.equal(replica.prefix.vlm.state_dict()[key], t), key
        # one base, loaded in place: no version allocated a second copy of it
        assert {n: t.data_ptr() for n, t in replica.prefix.vlm.state_dict().items()} == base_storage
        learner.model.eval()
        o = obs()
        torch.manual_seed(9)
        a = learner.model.act(o)
        torch.manual_seed(9)
        b = replica.act(o)
        assert torch.equal(a["actions"], b["actions"])
    finally:
        sub.stop()


def test_hf_backbone_from_an_offline_cache_equals_the_local_folder(tmp_path):
    folder = write_tiny_backbone("tiny-paligemma", tmp_path / "tiny-paligemma", seed=3)
    commit = "c0ffee" + "0" * 34
    lay_hf_cache(tmp_path / "hub", "acme/tiny-paligemma", folder, commit, ("main",))
    script = """
import json, sys, torch
from rlfleet.envs.api import encode_instructions
from rlfleet.policies.registry import make_policy
torch.manual_seed(0)
p = make_policy({"name": "hf_pi0", "backbone": sys.argv[1], "expert_width": 32}, 39, 4, 5, image_size=64)
g = torch.Generator().manual_seed(0)
o = {"main_images": torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8, generator=g),
     "states": torch.randn(2, 39, generator=g),
     "instructions": torch.from_numpy(encode_instructions(["pick the cube", "open drawer"]))}
torch.manual_seed(1)
print(json.dumps(p.act(o)["actions"].flatten().tolist()))
"""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}

    def actions(spec: str) -> list[float]:
        res = subprocess.run(
            [sys.executable, "-c", script, spec],
            capture_output=True,
            text=True,
            timeout=180,
            env={**__import__("os").environ, **env},
        )
        assert res.returncode == 0, res.stderr[-2000:]
        return json.loads(res.stdout.strip().splitlines()[-1])

    local = actions(str(folder))
    assert actions("hf://acme/tiny-paligemma") == local
    assert actions(f"hf://acme/tiny-paligemma@{commit}") == local


def expert_gemma_config(p: nn.Module, vocab_size: int):
    """The transformers GemmaConfig of an hf_pi0 policy's expert (openpi builds its expert so)."""
    from transformers import GemmaConfig

    e = p.expert
    return GemmaConfig(
        hidden_size=e.width,
        intermediate_size=e.model.layers[0].mlp.gate_proj.out_features,
        num_hidden_layers=p.prefix.num_layers,
        num_attention_heads=p.prefix.num_heads,
        num_key_value_heads=p.prefix.kv_heads,
        head_dim=p.prefix.head_dim,
        vocab_size=vocab_size,
        rms_norm_eps=p.prefix.rms_eps,
    )


def lerobot_pi0_layout(p: nn.Module, old_paligemma: bool = False) -> dict[str, torch.Tensor]:
    """A pi0 checkpoint built as openpi's PyTorch port / LeRobot build theirs: a PaliGemma and a
    GemmaForCausalLM expert (its token embedding removed) from transformers, and the projections,
    all under `model.`; random weights."""
    from transformers import GemmaForCausalLM, PaliGemmaForConditionalGeneration

    torch.manual_seed(11)
    vlm = PaliGemmaForConditionalGeneration(p.prefix.vlm.config)
    e = p.expert
    expert = GemmaForCausalLM(expert_gemma_config(p, vocab_size=p.prefix.vlm.config.text_config.vocab_size))
    expert.model.embed_tokens = None
    out = {}
    for k, v in vlm.state_dict().items():
        if old_paligemma:  # the pre-4.52 transformers names
            k = k.replace("model.language_model.", "language_model.model.").replace(
                "model.vision_tower.", "vision_tower."
            )
            k = k.replace("model.multi_modal_projector.", "multi_modal_projector.").replace(
                "lm_head.", "language_model.lm_head."
            )
        out[f"model.paligemma_with_expert.paligemma.{k}"] = torch.randn_like(v)
    # PaliGemma ties its output head to the token embedding; the published files store the pair once
    pg = "model.paligemma_with_expert.paligemma."
    head = pg + ("language_model.lm_head.weight" if old_paligemma else "lm_head.weight")
    embed = pg + ("language_model.model." if old_paligemma else "model.language_model.") + "embed_tokens.weight"
    out[head] = out.pop(embed)
    for k, v in expert.state_dict().items():
        out[f"model.paligemma_with_expert.gemma_expert.{k}"] = torch.randn_like(v) * 0.1
    w, a, s = e.width, p.cfg.max_action_dim, p.cfg.max_state_dim
    shapes = {
        "state_proj": (w, s),
        "action_in_proj": (w, a),
        "action_out_proj": (a, w),
        "action_time_mlp_in": (w, 2 * w),
        "action_time_mlp_out": (w, w),
    }
    for name, shape in shapes.items():
        out[f"model.{name}.weight"] = torch.randn(shape) * 0.1
        out[f"model.{name}.bias"] = torch.randn(shape[0]) * 0.1
    return out


@pytest.mark.parametrize("old,tied", [(False, "lm_head"), (True, "lm_head"), (False, "embed_tokens")])
def test_pi0_key_map_loads_every_tensor_of_the_published_layout(old, tied):
    p = policy(name="hf_pi0")
    tensors = lerobot_pi0_layout(p, old_paligemma=old)
    if tied == "embed_tokens":  # the tied pair stored under its other name
        head = next(k for k in tensors if k.endswith("lm_head.weight") and "paligemma." in k)
        tensors[head.replace("lm_head.weight", "model.language_model.embed_tokens.weight")] = tensors.pop(head)
    report = load_pi0_weights(p, tensors)
    assert report == {"loaded": len(tensors) - 1, "unused": 1}  # the expert's lm_head
    own = {**{f"prefix.vlm.{k}": v for k, v in p.prefix.vlm.state_dict().items()}}
    own.update({f"expert.{k}": v for k, v in p.expert.state_dict().items()})
    for key, value in tensors.items():
        dst = map_pi0_key(key)
        if dst is None:
            continue
        dst = dst if dst in own else dst.replace(".weight", ".base_layer.weight")
        assert torch.equal(own[dst], value), key
    with pytest.raises(ValueError, match="unexpected"):
        load_pi0_weights(p, {**tensors, "model.something_else.weight": torch.zeros(1)})
    short = {k: v for k, v in tensors.items() if "action_out_proj" not in k}
    with pytest.raises(ValueError, match="missing"):
        load_pi0_weights(p, short)


def test_the_expert_is_a_gemma_attending_to_the_prefix_cache():
    """Our expert layers against transformers' own GemmaModel fed the same weights, the prefix's
    cache and pi0's mask and positions: the same hidden states."""
    from transformers import DynamicCache, GemmaModel

    p = policy(name="hf_pi0", lora_rank=0)
    p.eval()
    e = p.expert
    gemma = GemmaModel(expert_gemma_config(p, vocab_size=8))
    gemma.embed_tokens = None
    torch.manual_seed(2)
    with torch.no_grad():
        for q in e.model.parameters():
            q.normal_(0, 0.1)
    missing = gemma.load_state_dict(e.model.state_dict(), strict=False)
    assert not missing.unexpected_keys and set(missing.missing_keys) <= {"embed_tokens.weight"}
    o = obs()
    with torch.no_grad():
        cond = p.prefix_feature(o)
        x = torch.randn(3, CHUNK * ACTION)
        s = torch.full((3,), 0.3)
        ours = e.hidden(x, s, cond).reshape(3, CHUNK, e.width)
        # the same suffix tokens, through transformers
        b, n_state = 3, 1
        actions = torch.nn.functional.pad(x.reshape(b, CHUNK, ACTION), (0, p.cfg.max_action_dim - ACTION))
        from rlfleet.policies.hf.pi0 import pi0_time_embedding

        emb = e.action_in_proj(actions)
        t = pi0_time_embedding(1.0 - s, e.width)[:, None].expand_as(emb)
        tokens = e.action_time_mlp_out(torch.nn.functional.silu(e.action_time_mlp_in(torch.cat([emb, t], -1))))
        tokens = torch.cat([e.state_proj(cond.state)[:, None], tokens], 1)
        n = tokens.shape[1]
        cache = DynamicCache()
        for i, (k, v) in enumerate(zip(cond.keys, cond.values)):
            cache.update(k, v, i)
        own = torch.ones(n, n, dtype=torch.bool)
        own[0, 1:] = False
        mask = torch.cat([cond.valid[:, None, :].expand(b, n, -1), own.expand(b, n, n)], 2)[:, None]
        positions = cond.valid.sum(1, keepdim=True) + torch.arange(n)[None]
        theirs = gemma(inputs_embeds=tokens, attention_mask=mask, position_ids=positions, cache=cache).last_hidden_state
    assert torch.allclose(ours, theirs[:, n_state:], atol=1e-5)


def lora_checkpoint(folder) -> nn.Module:
    """An hf_oft (continuous head) with adapters that do something (lora_B starts at zero), saved."""
    from rlfleet.policies.checkpoint_io import model_config, save_checkpoint_folder

    settings = {"name": "hf_oft", "oft_head": "l1", "backbone": "builtin:tiny-paligemma", "lora_rank": 4}
    p = policy(**settings)
    with torch.no_grad():
        for name, q in p.named_parameters():
            if "lora_B" in name:
                q.normal_(0, 0.05)
    save_checkpoint_folder(folder, p, model_config(settings, STATE, ACTION, CHUNK, image_size=IMAGE))
    return p


def test_export_keeps_the_backbone_id_and_merging_gives_the_same_actions(tmp_path):
    from rlfleet.policies.checkpoint_io import load_checkpoint
    from rlfleet.policies.hub import export_checkpoint

    p = lora_checkpoint(tmp_path / "ckpt")
    plain = export_checkpoint(tmp_path / "ckpt", tmp_path / "plain")
    assert json.loads((plain / "config.json").read_text())["policy"]["backbone"] == "builtin:tiny-paligemma"
    assert not (plain / "backbone").exists()
    merged = export_checkpoint(tmp_path / "ckpt", tmp_path / "merged", merge_adapters=True)
    cfg = json.loads((merged / "config.json").read_text())["policy"]
    assert cfg["backbone"] == "./backbone" and cfg["lora_rank"] == 0 and cfg["freeze_backbone"] is True
    assert (merged / "backbone" / "config.json").exists() and (merged / "backbone" / "tokenizer.json").exists()
    loaded, _ = load_checkpoint(merged)
    assert not any("lora_" in k for k in loaded.state_dict())
    o = obs()
    a = p.act(o, deterministic=True)["actions"]
    b = loaded.act(o, deterministic=True)["actions"]
    assert torch.allclose(a, b, atol=1e-4)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        export_checkpoint(tmp_path / "merged", tmp_path / "again", merge_adapters=True)


def test_lora_on_a_pretrained_expert_sends_its_adapters_only(tmp_path):
    from safetensors.torch import save_file

    save_file(lerobot_pi0_layout(policy(name="hf_pi0")), tmp_path / "model.safetensors")
    settings = {"name": "hf_pi0", "lora_expert": True, "pi0_weights": str(tmp_path)}
    settings["lora_target_modules"] = ["q_proj", "v_proj", "gate_proj"]
    p = policy(**settings)
    names = set(p.state_dict())
    assert any(n.startswith("expert.model.") and "lora_" in n for n in names)
    assert not [n for n in names if n.startswith(("expert.model.", "prefix.vlm.")) and "lora_" not in n]
    assert {"expert.action_in_proj.weight", "expert.action_out_proj.weight"} <= names  # the projections train
    other = policy(seed=1, **settings)  # another process: the same frozen expert, from pi0_weights
    assert other.load_state_dict(p.state_dict()).missing_keys == []
    o = obs()
    assert torch.equal(p.act(o, deterministic=True)["actions"], other.act(o, deterministic=True)["actions"])
    with pytest.raises(ValueError, match="pi0_weights"):
        policy(name="hf_pi0", lora_expert=True)


def test_an_exported_checkpoint_restores_from_hf_offline(tmp_path):
    """`rlfleet export` (adapters + heads, and --merge-adapters) laid out in a huggingface_hub cache:
    policy.model_path=hf://ORG/NAME loads it offline and acts as the original."""
    from rlfleet.policies.hub import export_checkpoint

    p = lora_checkpoint(tmp_path / "ckpt")
    o = obs()
    want = p.act(o, deterministic=True)["actions"]
    torch.save(o, tmp_path / "obs.pt")
    script = """
import json, sys, torch
from rlfleet.policies.checkpoint_io import load_checkpoint
p, _ = load_checkpoint(sys.argv[1])
o = torch.load(sys.argv[2])
print(json.dumps(p.act(o, deterministic=True)["actions"].flatten().tolist()))
"""
    env = {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1",
        "RLFLEET_BACKBONES": __import__("os").environ["RLFLEET_BACKBONES"],
    }
    for i, merge in enumerate((False, True)):
        out = export_checkpoint(tmp_path / "ckpt", tmp_path / f"export{i}", merge_adapters=merge)
        commit = f"{i:040x}"
        if merge:  # a nested folder in the snapshot: lay its files out flat under backbone/
            flat = tmp_path / "flat"
            flat.mkdir()
            for f in out.iterdir():
                if f.is_file():
                    (flat / f.name).write_bytes(f.read_bytes())
            snap = lay_hf_cache(tmp_path / "hub", f"acme/policy{i}", flat, commit, ("main",))
            (snap / "backbone").mkdir()
            for f in (out / "backbone").iterdir():
                (snap / "backbone" / f.name).write_bytes(f.read_bytes())
        else:
            lay_hf_cache(tmp_path / "hub", f"acme/policy{i}", out, commit, ("main",))
        res = subprocess.run(
            [sys.executable, "-c", script, f"hf://acme/policy{i}", str(tmp_path / "obs.pt")],
            capture_output=True,
            text=True,
            timeout=180,
            env={**__import__("os").environ, **env},
        )
        assert res.returncode == 0, res.stderr[-2000:]
        got = torch.tensor(json.loads(res.stdout.strip().splitlines()[-1])).reshape(want.shape)
        assert torch.allclose(got, want, atol=1e-4), merge


@pytest.mark.parametrize("name", ["hf_oft", "hf_pi0"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(name):
    """Checkpointed layers recompute in the backward pass; pi0's prefix cache then comes from the
    layers' key/value projections (transformers keeps no cache under checkpointing): the same."""
    plain = policy(name=name, num_denoise_steps=3)
    ckpt = policy(name=name, num_denoise_steps=3, gradient_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    o = obs()
    actions = torch.rand(3, CHUNK, ACTION) * 2 - 1
    grads = []
    for p in (plain, ckpt):
        p.train()
        torch.manual_seed(4)
        loss = p.sft_loss(o, actions)
        p.zero_grad()
        loss.backward()
        grads.append((loss.detach(), {n: q.grad.clone() for n, q in p.named_parameters() if q.grad is not None}))
    assert ckpt.prefix.checkpointing() and not plain.prefix.checkpointing()
    with torch.no_grad():  # acting: no backward pass to recompute for, the cache as usual
        assert not ckpt.prefix.checkpointing()
    torch.testing.assert_close(grads[0][0], grads[1][0])
    assert grads[0][1].keys() == grads[1][1].keys() and any("lora_" in n for n in grads[0][1])
    for n, g in grads[0][1].items():
        torch.testing.assert_close(grads[1][1][n], g, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("lora_expert", [False, True])
def test_a_merged_pi0_export_holds_the_merge_and_the_expert(tmp_path, lora_expert):
    """--merge-adapters of an hf_pi0 built on a pi0 base: the export no longer reads pi0_weights
    (it would overwrite the merge), folds the expert's adapters too, and acts as the original."""
    from safetensors.torch import save_file

    from rlfleet.policies.checkpoint_io import load_checkpoint, model_config, save_checkpoint_folder
    from rlfleet.policies.hub import export_checkpoint

    save_file(lerobot_pi0_layout(policy(name="hf_pi0")), tmp_path / "model.safetensors")
    settings = {"name": "hf_pi0", "backbone": "builtin:tiny-paligemma", "lora_rank": 4, "expert_width": 32}
    settings.update({"pi0_weights": str(tmp_path), "lora_expert": lora_expert, "num_denoise_steps": 3})
    p = policy(**settings)
    with torch.no_grad():
        for name, q in p.named_parameters():
            if "lora_B" in name:
                q.normal_(0, 0.05)
    save_checkpoint_folder(tmp_path / "ckpt", p, model_config(settings, STATE, ACTION, CHUNK, image_size=IMAGE))
    merged = export_checkpoint(tmp_path / "ckpt", tmp_path / "merged", merge_adapters=True)
    cfg = json.loads((merged / "config.json").read_text())["policy"]
    assert cfg["pi0_weights"] == "" and cfg["lora_expert"] is False and cfg["lora_rank"] == 0
    loaded, _ = load_checkpoint(merged)
    assert not any("lora_" in k for k in loaded.state_dict())
    o = obs()
    a = p.act(o, deterministic=True)["actions"]
    b = loaded.act(o, deterministic=True)["actions"]
    assert torch.allclose(a, b, atol=1e-4)


def test_pi05_keeps_the_state_when_the_prompt_is_cut():
    p = policy(name="hf_pi05", max_text_len=28)
    o = obs()
    texts, suffixes = p.texts(o), p.prompt_suffixes(o)
    ids, valid = p.prefix.prompt_ids([t + " and then some more words to cut" * 3 for t in texts], suffixes)
    tail = p.prefix.tokenizer(suffixes[0], add_special_tokens=False)["input_ids"]
    n = int(valid[0].sum())
    assert n == 28 and ids[0, n - len(tail) : n].tolist() == tail  # the state tokens survive whole
    with pytest.raises(ValueError, match="max_text_len"):
        policy(name="hf_pi05", max_text_len=8).act(o)


def test_checkpoints_name_the_backbone_revision_they_were_built_on(tmp_path, monkeypatch):
    """A branch (hf://ORG/NAME or @main) in the policy settings is pinned to its commit in config.json."""
    from rlfleet.policies.checkpoint_io import model_config

    folder = write_tiny_backbone("tiny-paligemma", tmp_path / "tiny", seed=0)
    commit = "ab" * 20
    lay_hf_cache(tmp_path / "hub", "acme/tiny", folder, commit, ("main",))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    for spec in ("hf://acme/tiny", "hf://acme/tiny@main", f"hf://acme/tiny@{commit}"):
        cfg = model_config({"name": "hf_oft", "backbone": spec}, STATE, ACTION, CHUNK, image_size=IMAGE)
        assert cfg["policy"]["backbone"] == f"hf://acme/tiny@{commit}", spec
