"""Tiny random configs of the real transformers classes (PaliGemma, SmolVLM), written with
`save_pretrained`: the CPU stand-ins for pretrained checkpoints. The code that loads them is the
code that loads PaliGemma-3B or SmolVLM-256M on a GPU host; only the sizes and the weights differ."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

TINY_BACKBONES = ("tiny-paligemma", "tiny-smolvlm")
BUILTIN_PREFIX = "builtin:"
SEED = 0
# Byte-level BPE covers any text; the corpus only decides which words get single tokens.
_CORPUS = [
    "pick place push pull open close reach press slide turn lift stack put insert sweep",
    "the a an to of on in into from with and or toward away left right up down",
    "red green blue yellow black white block cube drawer door button window handle lever",
    "goal target object gripper arm table tray bowl cup mug plate peg hole shelf box lid",
    "State: Action: Task:",
    " ".join(str(i) for i in range(256)),
]
_SPECIAL = ["<pad>", "<bos>", "<eos>", "<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token=None
    )


def _model(kind: str, vocab: int, image_token: int):
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 64,
        "patch_size": 16,
    }
    if kind == "tiny-paligemma":
        from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

        text = {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,  # Gemma-2B's multi-query attention
            "head_dim": 16,
            "vocab_size": vocab,
        }
        cfg = PaliGemmaConfig(
            vision_config={**vision, "projection_dim": 64},
            text_config=text,
            image_token_id=image_token,
            projection_dim=64,
        )
        return PaliGemmaForConditionalGeneration(cfg)
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    text = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": vocab,
    }
    cfg = SmolVLMConfig(vision_config=vision, text_config=text, image_token_id=image_token, scale_factor=2)
    return SmolVLMForConditionalGeneration(cfg)


def write_tiny_backbone(kind: str, folder: str | os.PathLike, seed: int = SEED) -> Path:
    """A random `kind` VLM (weights from `seed`) and its tokenizer in `folder`, written atomically."""
    if kind not in TINY_BACKBONES:
        raise ValueError(f"unknown tiny backbone {kind!r} (known: {', '.join(TINY_BACKBONES)})")
    folder = Path(folder)
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = _tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = _model(kind, len(tokenizer), tokenizer.convert_tokens_to_ids("<image>"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process wrote it first: theirs is the same (same seed)
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def builtin_backbone(spec: str) -> Path:
    """`builtin:KIND` -> its folder under $RLFLEET_BACKBONES (default ~/.cache/rlfleet/backbones),
    written on first use: one place for every process of a run, whatever its working folder."""
    kind = spec[len(BUILTIN_PREFIX) :]
    root = Path(os.environ.get("RLFLEET_BACKBONES") or Path.home() / ".cache" / "rlfleet" / "backbones")
    folder = root / f"{kind}-seed{SEED}"
    if not (folder / "config.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        write_tiny_backbone(kind, folder)
    return folder
