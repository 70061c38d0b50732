"""A pretrained transformers VLM as the policy's prefix: images, prompt tokens (and learned query
tokens) through the vision tower and the language model, with LoRA adapters from peft.

The prefix is assembled here rather than by the model's own `forward`: image features first, then
the prompt, one block that attends bidirectionally (pi0's prefix-LM; PaliGemma's own layout), pad
tokens masked, head queries after it. This keeps one code path for PaliGemma and the
SmolVLM/Idefics3 family, and gives the pi0 expert the per-layer key/value cache of exactly the
tokens it should see.

What travels and what is saved: the frozen base (every tensor of the VLM that does not train)
is left out of the policy's `state_dict` (see `HFPolicyBase`), so checkpoints, weight versions and
deltas hold only adapters, heads and normalisation; each process loads the base itself from
`backbone`, pinned to one revision.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from rlfleet.policies.hf.config import HFVLAConfig
from rlfleet.policies.hf.tiny import BUILTIN_PREFIX, builtin_backbone
from rlfleet.policies.vla.backbone import ChunkPolicyBase

log = logging.getLogger(__name__)
SUPPORTED = ("paligemma", "smolvlm", "idefics3")


def resolve_backbone(spec: str) -> Path:
    """A backbone spec -> the folder `from_pretrained` reads (hf:// through huggingface_hub's cache)."""
    from rlfleet.policies.checkpoint_io import resolve_model_path  # checkpoint_io imports the registry

    if spec.startswith(BUILTIN_PREFIX):
        return builtin_backbone(spec)
    folder = resolve_model_path(spec)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"backbone {spec}: no config.json in {folder} (a transformers model folder)")
    return folder


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("the hf_* policies need transformers and peft: pip install 'rlfleet[hf]'") from exc
    return transformers


def _quiet(transformers: Any) -> None:
    """No progress bars: one per load would flood every role's log (called right before a load:
    importing peft turns them back on)."""
    transformers.utils.logging.disable_progress_bar()


def add_lora(module: nn.Module, cfg: HFVLAConfig) -> None:
    """peft LoRA adapters (rank, alpha, dropout, target modules of `cfg`) injected into `module`."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as exc:
        raise ImportError("lora_rank > 0 needs peft: pip install 'rlfleet[hf]'") from exc
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
    )
    inject_adapter_in_model(lora, module)


def merged_lora_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s state with every peft LoRA layer folded into its base weight (W + scale B A), under
    the names the module has without adapters."""
    from peft.tuners.lora import LoraLayer

    deltas = {name: m.get_delta_weight("default") for name, m in module.named_modules() if isinstance(m, LoraLayer)}
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in module.state_dict().items():
        if "lora_" in key:
            continue
        if ".base_layer." in key:
            owner, _, leaf = key.partition(".base_layer.")
            key = f"{owner}.{leaf}"
            if leaf == "weight":
                tensor = tensor + deltas[owner].to(tensor.dtype)
        merged[key] = tensor.detach()
    return merged


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], -1)


@dataclass
class PrefixOutput:
    hidden: torch.Tensor  # [B, T, C] last hidden states (prefix, then queries if any)
    valid: torch.Tensor  # [B, P] bool: prefix tokens that are not padding
    keys: list[torch.Tensor] | None  # per layer [B, kv_heads, P, head_dim], RoPE applied (pi0's expert)
    values: list[torch.Tensor] | None


class HFPrefix(nn.Module):
    """images uint8 [B, H, W, 3] + prompt ids -> the VLM's hidden states (and key/value cache)."""

    def __init__(self, cfg: HFVLAConfig):
        super().__init__()
        transformers = _import_transformers()
        self.folder = resolve_backbone(cfg.backbone)
        config = transformers.AutoConfig.from_pretrained(self.folder)
        if config.model_type not in SUPPORTED:
            raise ValueError(
                f"backbone {cfg.backbone}: model_type {config.model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED)})"
            )
        self.model_type = config.model_type
        _quiet(transformers)
        if any(self.folder.glob("*.safetensors")) or any(self.folder.glob("*.bin")):
            self.vlm = transformers.AutoModelForImageTextToText.from_pretrained(
                self.folder, attn_implementation="sdpa", dtype=torch.float32
            )
        else:  # a config without weights (builtin:*-random): the architecture at random, for sizing
            log.warning("backbone %s has no weight files: random weights (seed 0)", cfg.backbone)
            with torch.random.fork_rng():  # the same frozen base in every process of a run
                torch.manual_seed(0)
                self.vlm = transformers.AutoModelForImageTextToText.from_config(
                    config, attn_implementation="sdpa", dtype=torch.float32
                )
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.folder)
        text = self.vlm.config.get_text_config()
        self.width = text.hidden_size
        self.num_layers = text.num_hidden_layers
        self.num_heads = text.num_attention_heads
        self.kv_heads = getattr(text, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(text, "head_dim", None) or self.width // self.num_heads
        self.rms_eps = float(getattr(text, "rms_norm_eps", 1e-6))
        vision = self.vlm.config.vision_config
        self.image_side = int(vision.image_size)
        mean, std = self._image_stats()
        self.register_buffer("pixel_mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.max_text_len = cfg.max_text_len
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._prompt_cache: dict[bytes, list[int]] = {}
        self.bf16 = cfg.bf16
        self._freeze_and_adapt(cfg)

    @property
    def lm(self) -> nn.Module:
        """The language model inside the VLM (a property: registering it twice would save it twice)."""
        return self.vlm.model.language_model if self.model_type == "paligemma" else self.vlm.model.text_model

    def _image_stats(self) -> tuple[list[float], list[float]]:
        """The processor's image mean/std (preprocessor_config.json), else SigLIP's 0.5 / 0.5."""
        path = Path(self.folder) / "preprocessor_config.json"
        if path.is_file():
            data = json.loads(path.read_text())
            return list(data.get("image_mean", [0.5] * 3)), list(data.get("image_std", [0.5] * 3))
        return [0.5] * 3, [0.5] * 3

    def _freeze_and_adapt(self, cfg: HFVLAConfig) -> None:
        self.vlm.requires_grad_(False)
        if not cfg.freeze_backbone and not cfg.lora_rank:
            (self.lm if cfg.freeze_vision else self.vlm).requires_grad_(True)
        if cfg.lora_rank:
            # Adapters on the language model only when the vision tower is frozen.
            add_lora(self.lm if cfg.freeze_vision else self.vlm, cfg)
            for name, p in self.vlm.named_parameters():
                p.requires_grad_("lora_" in name)
        if cfg.gradient_checkpointing:
            self.vlm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})

    def checkpointing(self) -> bool:
        """Gradient checkpointing active now (training with gradients): transformers then keeps no cache."""
        enabled = bool(getattr(self.lm.layers[0], "gradient_checkpointing", False))
        return enabled and self.training and torch.is_grad_enabled()

    def _forward_capturing_kv(
        self, inputs: torch.Tensor, allowed: torch.Tensor, n_prefix: int
    ) -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
        """The language model under gradient checkpointing, each layer's keys and values taken from its
        k_proj / v_proj outputs (forward hooks) with RoPE applied as the model applies it at positions
        0..T-1: the cache transformers would have kept. The hooks live for this forward only; the
        captured tensors stay in the graph, so gradients reach k_proj / v_proj through them."""
        taken: dict[tuple[int, str], torch.Tensor] = {}
        handles = []
        for i, layer in enumerate(self.lm.layers):
            for name in ("k_proj", "v_proj"):

                def keep(_m: nn.Module, _in: Any, out: torch.Tensor, key: tuple[int, str] = (i, name)) -> None:
                    taken.setdefault(key, out)

                handles.append(getattr(layer.self_attn, name).register_forward_hook(keep))
        try:
            out = self.lm(inputs_embeds=inputs, attention_mask=allowed, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        b, t = inputs.shape[:2]
        # the model's own rotary tables and dtype rules (apply_rotary_pos_emb): the cache's keys exactly
        cos, sin = self.lm.rotary_emb(inputs, torch.arange(t, device=inputs.device)[None])
        cos, sin = cos[:, None], sin[:, None]
        keys, values = [], []
        for i in range(self.num_layers):
            k = taken[(i, "k_proj")].view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = taken[(i, "v_proj")].view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            k = k * cos + rotate_half(k) * sin
            keys.append(k[:, :, :n_prefix])
            values.append(v[:, :, :n_prefix])
        return out, keys, values

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on CUDA (`bf16`), nothing on CPU."""
        device = self.pixel_mean.device
        if self.bf16 and device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ---- inputs ----------------------------------------------------------------------------

    def image_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> image features in the language model's width [B, N, C]."""
        if images.dim() != 4 or images.shape[-1] != 3:
            raise ValueError(f"camera images must be uint8 [B, H, W, 3], got shape {tuple(images.shape)}")
        x = images.permute(0, 3, 1, 2).to(self.pixel_mean.dtype) / 255.0
        if x.shape[-2:] != (self.image_side, self.image_side):
            x = F.interpolate(x, size=(self.image_side, self.image_side), mode="bilinear", antialias=True)
        x = (x - self.pixel_mean) / self.pixel_std
        if self.model_type == "paligemma":
            return self.vlm.model.get_image_features(pixel_values=x).pooler_output
        out = self.vlm.model.get_image_features(pixel_values=x.unsqueeze(1)).pooler_output
        return torch.stack(list(out))  # one image per row: [B, N, C]

    def prompt_ids(self, texts: list[str], suffixes: list[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts -> ids [B, max_text_len] (bos, the instruction cut to fit, then the row's suffix
        whole: pi0.5's state tokens) right padded, and their valid mask. A suffix that does not fit
        is a ValueError: a state cut off would change the policy's input silently."""
        rows, lengths = [], []
        bos = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
        for i, text in enumerate(texts):
            ids = self._prompt_cache.get(text.encode())
            if ids is None:
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                if len(self._prompt_cache) < 65536:
                    self._prompt_cache[text.encode()] = ids
            tail = self.tokenizer(suffixes[i], add_special_tokens=False)["input_ids"] if suffixes else []
            room = self.max_text_len - len(bos) - len(tail)
            if room < 0:
                raise ValueError(
                    f"max_text_len {self.max_text_len} cannot hold the prompt's suffix ({len(tail)} tokens): "
                    "raise policy.max_text_len"
                )
            ids = bos + ids[:room] + tail
            rows.append(ids + [self.pad_id] * (self.max_text_len - len(ids)))
            lengths.append(len(ids))
        device = self.pixel_mean.device
        valid = torch.arange(self.max_text_len, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
        return torch.tensor(rows, dtype=torch.long, device=device), valid

    # ---- forward ---------------------------------------------------------------------------

    def forward(
        self,
        images: torch.Tensor,
        texts: list[str],
        queries: torch.Tensor | None = None,
        suffixes: list[str] | None = None,
        proprio: torch.Tensor | None = None,
        want_cache: bool = False,
    ) -> PrefixOutput:
        """The prefix [image tokens, prompt, proprio tokens [B, n, C] if given] attends to itself
        (minus pads); `queries` [Q, C] after it see the prefix and each other. With `want_cache`,
        each layer's keys/values of the prefix."""
        with self.autocast():
            img = self.image_tokens(images)
            ids, txt_valid = self.prompt_ids(texts, suffixes)
            txt = self.vlm.get_input_embeddings()(ids)
            b, n_img = img.shape[:2]
            parts = [img.to(txt.dtype), txt]
            valid = torch.cat([torch.ones(b, n_img, dtype=torch.bool, device=txt.device), txt_valid], 1)
            if proprio is not None:
                parts.append(proprio.to(txt.dtype))
                valid = torch.cat([valid, torch.ones(proprio.shape[:2], dtype=torch.bool, device=txt.device)], 1)
            n_prefix = valid.shape[1]
            keys_ok = valid
            if queries is not None:
                parts.append(queries.to(txt.dtype).unsqueeze(0).expand(b, -1, -1))
                keys_ok = torch.cat([valid, torch.ones(b, queries.shape[0], dtype=torch.bool, device=txt.device)], 1)
            total = keys_ok.shape[1]
            allowed = keys_ok[:, None, None, :].expand(b, 1, total, total).clone()
            allowed[:, :, :n_prefix, n_prefix:] = False  # the prefix never sees the queries
            eye = torch.eye(total, dtype=torch.bool, device=txt.device)
            allowed |= eye  # a pad row attends to itself (no empty softmax); nothing reads it
            inputs = torch.cat(parts, 1)
            if want_cache and self.checkpointing():
                out, keys, values = self._forward_capturing_kv(inputs, allowed, n_prefix)
            else:
                out = self.lm(inputs_embeds=inputs, attention_mask=allowed, use_cache=want_cache)
                keys = values = None
                if want_cache:
                    keys = [layer.keys[:, :, :n_prefix] for layer in out.cache.layers]
                    values = [layer.values[:, :, :n_prefix] for layer in out.cache.layers]
        return PrefixOutput(out.last_hidden_state.float(), valid, keys, values)


class HFPolicyBase(ChunkPolicyBase):
    """The shared contract parts, the transformers prefix, and a state_dict without the frozen base."""

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg: HFVLAConfig, image_size: int):
        super().__init__(state_dim, action_dim, chunk_size, cfg, image_size)
        self.prefix = HFPrefix(cfg)
        self.register_state_dict_post_hook(_drop_frozen_base)
        self.register_load_state_dict_post_hook(_ignore_missing_base)

    def record_frozen_base(self) -> None:
        """Called once a policy's modules and adapters are built: which tensors are the frozen base.
        Recorded, not read from `requires_grad` each time: freezing a copy later (a KL reference)
        must not drop its adapters and heads from what it saves and loads."""
        names: set[str] = set()
        for prefix, module in self.base_modules().items():
            tensors = module.state_dict(keep_vars=True)  # tied weights under each of their names
            names |= {f"{prefix}{n}" for n, t in tensors.items() if not t.requires_grad}
        self._frozen_base = frozenset(names)

    def frozen_base_names(self) -> frozenset[str]:
        """State-dict names of the pretrained tensors that never train: loaded from `backbone` (and
        `pi0_weights`) in every process, never saved or sent."""
        return getattr(self, "_frozen_base", frozenset())

    def base_modules(self) -> dict[str, nn.Module]:
        """The pretrained modules (state-dict prefix -> module) whose frozen tensors never travel."""
        return {"prefix.vlm.": self.prefix.vlm}

    def element_counts(self) -> tuple[int, int]:
        """(parameters of the whole policy, elements of what its state_dict holds: what travels)."""
        return sum(p.numel() for p in self.parameters()), sum(t.numel() for t in self.state_dict().values())

    def export_merged(self, out: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Fold every LoRA adapter into its base weight (W + scale B A) and write the merged VLM with
        its tokenizer to `out/backbone` (`save_pretrained`). Returns the policy settings that load it
        (`backbone: ./backbone`, no adapters, base frozen) and the tensors left to save: the heads
        and normalisation."""
        if not self.cfg.lora_rank:
            raise ValueError(f"{self.cfg.name} has no LoRA adapters to merge (lora_rank is 0)")
        vlm = self.prefix.vlm
        merged = merged_lora_state(vlm)
        clean = _import_transformers().AutoModelForImageTextToText.from_config(vlm.config)
        clean.load_state_dict(merged, strict=True)
        folder = Path(out) / "backbone"
        clean.save_pretrained(folder)
        self.prefix.tokenizer.save_pretrained(folder)
        processor = Path(self.prefix.folder) / "preprocessor_config.json"
        if processor.is_file():
            (folder / processor.name).write_bytes(processor.read_bytes())
        heads = {k: v for k, v in self.state_dict().items() if not k.startswith("prefix.")}
        return {"backbone": "./backbone", "lora_rank": 0, "freeze_backbone": True, "pi0_weights": ""}, heads

    def texts(self, obs: dict[str, torch.Tensor]) -> list[str]:
        """The prompt of each row: its instruction (bytes, zero padded)."""
        rows = obs["instructions"].detach().to("cpu", torch.uint8).numpy()
        return [r.tobytes().rstrip(b"\0").decode("utf-8", errors="replace") for r in rows]


def _drop_frozen_base(module: HFPolicyBase, state: dict[str, Any], prefix: str, _meta: Any) -> None:
    for name in module.frozen_base_names():
        state.pop(prefix + name, None)


def _ignore_missing_base(module: HFPolicyBase, incompatible: Any) -> None:
    frozen = module.frozen_base_names()
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in frozen]
