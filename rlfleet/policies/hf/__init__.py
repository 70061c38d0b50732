"""VLA policies on pretrained transformers backbones (PaliGemma, SmolVLM): OpenVLA-OFT, pi0 and
pi0.5 heads, LoRA through peft. Needs the `hf` extra: pip install 'rlfleet[hf]'."""

from rlfleet.policies.hf.config import HF_NAMES, HFVLAConfig

__all__ = ["HF_NAMES", "HFVLAConfig"]
