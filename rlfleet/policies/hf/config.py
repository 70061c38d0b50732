"""Settings of the transformers VLA family (plain types: an OmegaConf structured config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlfleet.policies.vla.backbone import FLOW_RL_MODES, LOGPROB_TYPES, OFT_DECODERS

HF_NAMES = ("hf_oft", "hf_pi0", "hf_pi05")
OFT_HEADS = ("bins", "l1")


@dataclass
class HFVLAConfig:
    """A pretrained vision-language model from transformers as the prefix, a head as the model defines it.

    hf_oft   OpenVLA-OFT: K*D learned action queries after the prefix, decoded in parallel; the
             binned head (token log-probs, as tiny_oft) or the continuous L1 head (a Gaussian
             with a learned std around it for RL).
    hf_pi0   pi0: a Gemma-shaped action expert, one layer per prefix layer, attending to the
             prefix's key/value cache (computed once per act, reused over the denoise steps);
             flow matching; Gaussian, Flow-SDE or Flow-Noise RL (`flow_rl`).
    hf_pi05  pi0.5: as hf_pi0, with the state written into the prompt as discrete tokens and the
             critic on the prefix.
    """

    name: str = "hf_oft"
    # The VLM: a folder written by `save_pretrained`, hf://ORG/NAME[@REVISION] (resolved through
    # huggingface_hub's cache, pinned to its commit when a run starts), or builtin:tiny-paligemma /
    # builtin:tiny-smolvlm (random tiny configs of the same classes, for CPU runs and tests).
    backbone: str = "builtin:tiny-paligemma"
    # hf_pi0 / hf_pi05: a pi0 base checkpoint in openpi's PyTorch / LeRobot layout (a folder or
    # hf://...) whose VLM and expert weights replace the backbone's (rlfleet/policies/hf/keymap.py).
    pi0_weights: str = ""
    max_text_len: int = 24  # prompt tokens (instruction, and for hf_pi05 the state), right padded
    proprio_dims: int = 4
    # OFT heads
    oft_head: str = "bins"  # bins | l1
    num_bins: int = 256  # the binned head's bins; hf_pi05's state bins
    temperature: float = 1.0
    decode: str = "argmax"  # the binned head's deterministic action (as tiny_oft)
    logprob_type: str = "action"  # token: (K*D,) | action: (K,) | chunk: ()
    init_log_std: float = -1.0  # the L1 head's and the Gaussian flow mode's exploration std
    # Flow heads (pi0 / pi0.5)
    num_denoise_steps: int = 10
    expert_width: int = 0  # 0: the prefix model's width (pi0: 1024 beside Gemma-2B's 2048)
    expert_mlp: int = 0  # 0: 4 x expert_width
    max_action_dim: int = 32  # pi0's padded action and state widths (LeRobot / openpi layout)
    max_state_dim: int = 32
    flow_rl: str = "gaussian"
    sde_a: float = 0.5
    noise_min_std: float = 0.08
    noise_max_std: float = 0.16
    prefix_cache: bool = True  # False recomputes the prefix at every denoise step (for comparison)
    # Critic
    value_after_vlm: bool = False  # on the prefix (pi05 forces True); else on the expert's features
    critic_width: int = 256
    critic_detach: bool = True
    unnorm_key: str = "default"  # which entry of norm_stats.json this policy uses
    # Fine-tuning
    lora_rank: int = 0  # 0: no adapters (the prefix model trains whole unless frozen)
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0  # > 0 makes the learner's (train-mode) log-probs differ from the actor's
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    # hf_pi0 / hf_pi05: the same adapters on the expert's layers, its base frozen (for a pretrained
    # expert from pi0_weights); else the expert trains whole, as a head.
    lora_expert: bool = False
    freeze_vision: bool = True  # the vision tower and its projector never train
    freeze_backbone: bool = False  # the whole prefix model frozen: heads (and adapters) only
    gradient_checkpointing: bool = False  # the VLM's layers (transformers' own); pi0's cache then from hooks
    bf16: bool = True  # bf16 autocast on CUDA; float32 on CPU whatever this says

    def __post_init__(self) -> None:
        def choice(name: str, options: tuple[str, ...]) -> None:
            if getattr(self, name) not in options:
                raise ValueError(f"{name} must be one of {', '.join(options)}; got {getattr(self, name)!r}")

        choice("name", HF_NAMES)
        choice("oft_head", OFT_HEADS)
        choice("decode", OFT_DECODERS)
        choice("logprob_type", LOGPROB_TYPES)
        choice("flow_rl", FLOW_RL_MODES)
        if not self.backbone:
            raise ValueError("backbone must name a transformers VLM (a folder, hf://ORG/NAME or builtin:tiny-...)")
        for name in ("max_text_len", "num_denoise_steps", "max_action_dim", "max_state_dim", "critic_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("expert_width", "expert_mlp", "lora_rank", "proprio_dims"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.num_bins < 2:
            raise ValueError(f"num_bins must be >= 2, got {self.num_bins}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not -5.0 <= self.init_log_std <= 1.0:
            raise ValueError(f"init_log_std must be in [-5, 1], got {self.init_log_std}")
        if not 0 < self.noise_min_std <= self.noise_max_std:
            raise ValueError(f"need 0 < noise_min_std <= noise_max_std, got {self.noise_min_std}, {self.noise_max_std}")
        if not self.sde_a > 0:
            raise ValueError(f"sde_a must be > 0, got {self.sde_a}")
        if not self.unnorm_key:
            raise ValueError("unnorm_key must be a non-empty string")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.lora_rank and not self.lora_target_modules:
            raise ValueError("lora_rank > 0 needs lora_target_modules (e.g. [q_proj, v_proj])")
        if self.lora_expert and (self.name == "hf_oft" or not self.lora_rank or not self.pi0_weights):
            # a frozen expert must be the same in every process: a pretrained one, not a fresh init
            raise ValueError("lora_expert needs hf_pi0 / hf_pi05, lora_rank > 0 and pi0_weights (a pretrained expert)")
        if self.pi0_weights and self.name == "hf_oft":
            raise ValueError("pi0_weights is a pi0 checkpoint: it fits hf_pi0 / hf_pi05, not hf_oft")
        if self.name == "hf_pi05":
            self.value_after_vlm = True
