"""Runs the policy on one gathered batch and swaps in new weights between batches."""
from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from rlfleet.inference_server.batcher import InferenceRequest
from rlfleet.policies.checkpoint_io import load_state_dict_bytes
from rlfleet.wire.codec import WireFormatError

log = logging.getLogger(__name__)


class PolicyRunner:
    def __init__(self, policy: nn.Module, version: int, device: str = "cpu"):
        self.policy = policy.to(device).eval()
        self.version = version
        self.device = device
        self.batches = 0
        self.rows = 0
        self.errors = 0

    def validate(self, states: np.ndarray) -> None:
        """Reject what the policy cannot take before it reaches a batch shared with others."""
        dim = self.policy.state_dim
        if states.dtype != np.float32 or states.ndim != 2 or states.shape[1] != dim:
            raise WireFormatError(f"states must be float32 [B, {dim}], got {states.dtype} {list(states.shape)}")
        if not np.isfinite(states).all():
            raise WireFormatError("states contain NaN or inf")

    def load_weights(self, version: int, data: bytes) -> None:
        load_state_dict_bytes(self.policy, data)
        self.version = version

    @torch.no_grad()
    def run(self, batch: list[InferenceRequest]) -> None:
        for deterministic in (False, True):
            group = [r for r in batch if r.deterministic == deterministic]
            if not group:
                continue
            states = torch.from_numpy(np.concatenate([r.states for r in group]))
            try:
                out = self.policy.act(states.to(self.device), deterministic=deterministic)
            except Exception as exc:  # a bug must answer the callers, not hang them
                log.exception("policy failed on a batch")
                for r in group:
                    r.fail(f"policy failed: {exc}")
                continue
            arrays = {k: v.cpu().numpy() for k, v in out.items()}
            self.batches += 1
            self.rows += states.shape[0]
            start = 0
            for r in group:
                r.respond({k: v[start : start + r.rows] for k, v in arrays.items()}, self.version)
                start += r.rows
