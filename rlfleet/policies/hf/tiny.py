"""Tiny random configs of the real transformers classes (PaliGemma, SmolVLM), written with
`save_pretrained`: the CPU stand-ins for pretrained checkpoints. The code that loads them is the
code that loads PaliGemma-3B or SmolVLM-256M on a GPU host; only the sizes and the weights differ."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

TINY_BACKBONES = ("tiny-paligemma", "tiny-smolvlm")
# The real architectures' sizes with random weights (config and tokenizer only, no weight files):
# memory and latency of the real shapes on a GPU host without downloading a checkpoint.
RANDOM_REAL = ("paligemma-3b-random", "smolvlm-256m-random")
BUILTIN_PREFIX = "builtin:"
SEED = 0
LAYOUT = 2  # in the cached folder's name: a change of these configs writes a new folder, never reuses an old one
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


def _real_config(kind: str, vocab: int, image_token: int):
    """PaliGemma-3B-pt-224 (SigLIP So400m/14 at 224 + Gemma-2B, vocabulary 257,216) or SmolVLM-256M
    (a SigLIP-B/16 at 512 + a 30-layer SmolLM2-shaped text model, vocabulary 49,280), as their
    published config.json describe them. The tiny tokenizer's ids all fall inside those vocabularies."""
    if kind == "paligemma-3b-random":
        from transformers import PaliGemmaConfig

        return PaliGemmaConfig(
            vision_config={
                "hidden_size": 1152,
                "intermediate_size": 4304,
                "num_hidden_layers": 27,
                "num_attention_heads": 16,
                "image_size": 224,
                "patch_size": 14,
                "projection_dim": 2048,
            },
            text_config={
                "hidden_size": 2048,
                "intermediate_size": 16384,
                "num_hidden_layers": 18,
                "num_attention_heads": 8,
                "num_key_value_heads": 1,
                "head_dim": 256,
                "vocab_size": max(vocab, 257216),
            },
            image_token_id=image_token,
            projection_dim=2048,
        )
    from transformers import SmolVLMConfig

    return SmolVLMConfig(
        vision_config={
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "image_size": 512,
            "patch_size": 16,
        },
        text_config={
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "vocab_size": max(vocab, 49280),
        },
        image_token_id=image_token,
        scale_factor=4,
    )


_TINY_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 16,
}


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

        text = {**_TINY_TEXT, "num_key_value_heads": 1, "vocab_size": vocab}  # Gemma-2B's multi-query attention
        cfg = PaliGemmaConfig(
            vision_config={**vision, "projection_dim": 64},
            text_config=text,
            image_token_id=image_token,
            projection_dim=64,
        )
        return PaliGemmaForConditionalGeneration(cfg)
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    text = {**_TINY_TEXT, "num_key_value_heads": 2, "vocab_size": vocab}
    cfg = SmolVLMConfig(vision_config=vision, text_config=text, image_token_id=image_token, scale_factor=2)
    return SmolVLMForConditionalGeneration(cfg)


def write_tiny_backbone(kind: str, folder: str | os.PathLike, seed: int = SEED) -> Path:
    """A random `kind` VLM (weights from `seed`) and its tokenizer in `folder`, written atomically; a
    real-sized kind gets its config and tokenizer only (the policy initialises it at random)."""
    if kind not in TINY_BACKBONES + RANDOM_REAL:
        raise ValueError(f"unknown builtin backbone {kind!r} (known: {', '.join(TINY_BACKBONES + RANDOM_REAL)})")
    folder = Path(folder)
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # a bar in every role's log otherwise
    tokenizer = _tokenizer()
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    if kind in RANDOM_REAL:
        _real_config(kind, len(tokenizer), image_token).save_pretrained(tmp)
    else:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            _model(kind, len(tokenizer), image_token).save_pretrained(tmp)
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
    folder = root / f"{kind}-v{LAYOUT}-seed{SEED}"
    if not (folder / "config.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        write_tiny_backbone(kind, folder)
    return folder
