"""A built-in word tokenizer, so a VLA needs no vocabulary file, download or extra package.

Words are hashed into a fixed vocabulary (the "hashing trick"): collisions are rare at a few
thousand ids for the short, repetitive instructions of robot benchmarks, and the mapping is the
same on every machine and Python process (FNV-1a, not Python's salted `hash`).
"""

from __future__ import annotations

import re

import numpy as np
import torch

PAD_ID = 0
_WORD = re.compile(r"[^\W_]+")  # runs of letters or digits; everything else separates words
_FNV_OFFSET, _FNV_PRIME = 0x811C9DC5, 0x01000193
_MAX_CACHE = 65536  # distinct instructions remembered; a batch holds few, a run rarely many


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a: stable across processes and platforms, unlike the built-in `hash`."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


class WordTokenizer:
    """Lowercased words -> ids in [1, vocab_size), 0 = pad, fixed length `max_len` (truncated)."""

    def __init__(self, vocab_size: int = 4096, max_len: int = 16):
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (id 0 is the pad), got {vocab_size}")
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.vocab_size, self.max_len = vocab_size, max_len
        self._cache: dict[bytes, np.ndarray] = {}

    def word_id(self, word: str) -> int:
        return 1 + fnv1a_32(word.encode("utf-8")) % (self.vocab_size - 1)

    def encode_text(self, text: str) -> list[int]:
        """Ids of the first `max_len` words of `text`, without padding."""
        return [self.word_id(w) for w in _WORD.findall(text.lower())[: self.max_len]]

    def _encode_row(self, raw: bytes) -> np.ndarray:
        ids = self._cache.get(raw)
        if ids is None:
            ids = np.zeros(self.max_len, np.int64)
            words = self.encode_text(raw.rstrip(b"\0").decode("utf-8", errors="replace"))
            ids[: len(words)] = words
            if len(self._cache) >= _MAX_CACHE:
                self._cache.clear()
            self._cache[raw] = ids
        return ids

    def __call__(self, instructions: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
        """uint8 [B, L] zero-padded UTF-8 (`encode_instructions`) -> int64 ids [B, max_len].

        Decoding runs once per distinct instruction (cached): a batch holds few distinct tasks.
        """
        if instructions.dim() != 2:
            raise ValueError(f"instructions must be uint8 [B, L], got shape {tuple(instructions.shape)}")
        rows = instructions.detach().to("cpu", torch.uint8).numpy()
        out = (
            np.stack([self._encode_row(row.tobytes()) for row in rows])
            if len(rows)
            else np.zeros((0, self.max_len), np.int64)
        )
        return torch.from_numpy(out).to(device if device is not None else instructions.device)
