"""Runs the policy on one gathered batch and swaps in new weights between batches."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from rlfleet.inference_server.batcher import InferenceRequest
from rlfleet.policies.checkpoint_io import load_tensors
from rlfleet.wire.codec import WireFormatError
from rlfleet.wire.slots import ObsSpec

log = logging.getLogger(__name__)


class PolicyRunner:
    def __init__(self, policy: nn.Module, version: int, device: str = "cpu", obs_spec: ObsSpec | None = None):
        self.policy = policy.to(device).eval()
        self.version = version
        self.device = device
        self.obs_spec = obs_spec or {"states": ((policy.state_dim,), "float32")}
        self.keys = tuple(policy.obs_keys)
        missing = [k for k in self.keys if k not in self.obs_spec]
        if missing:
            raise ValueError(
                f"the policy reads {missing}, which the env does not provide "
                f"(it provides {sorted(self.obs_spec)}; images need env.image_size > 0)"
            )
        self.batches = 0
        self.rows = 0
        self.errors = 0  # requests failed because the policy raised on their batch
        self.offloaded = False

    def validate(self, obs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check the keys the policy reads and return private copies of them.

        Rejects what the policy cannot take before it reaches a batch shared with others.
        """
        out: dict[str, np.ndarray] = {}
        rows = None
        for key in self.keys:
            if key not in obs:
                raise WireFormatError(
                    f"observation lacks {key!r} (the policy reads {list(self.keys)})", reason="missing_tensor"
                )
            arr = np.asarray(obs[key])
            shape, dtype = self.obs_spec[key]
            if arr.dtype != np.dtype(dtype) or arr.shape[1:] != tuple(shape) or arr.ndim != len(shape) + 1:
                raise WireFormatError(
                    f"{key} must be {dtype} [B, {', '.join(map(str, shape))}], got {arr.dtype} {list(arr.shape)}",
                    reason="bad_dtype" if arr.dtype != np.dtype(dtype) else "bad_shape",
                )
            if rows is not None and arr.shape[0] != rows:
                raise WireFormatError(f"{key} has {arr.shape[0]} rows, other keys {rows}", reason="bad_shape")
            rows = arr.shape[0]
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise WireFormatError(f"{key} contains NaN or inf", reason="non_finite")
            out[key] = np.array(arr)
        if not rows:
            raise WireFormatError("empty observation batch", reason="bad_shape")
        return out

    def offload(self) -> None:
        """Weights to host memory while idle, so a learner rank on the same GPU has the memory."""
        if self.offloaded or torch.device(self.device).type == "cpu":
            return
        self.policy.to("cpu")
        if torch.device(self.device).type == "cuda":
            torch.cuda.empty_cache()
        self.offloaded = True

    def restore(self) -> None:
        if self.offloaded:
            self.policy.to(self.device)
            self.offloaded = False

    def load_update(self, update) -> None:
        """A WeightUpdate from the subscriber: all tensors, or only the changed ones (delta sync)."""
        load_tensors(self.policy, update.tensors, partial=not update.complete)
        self.version = update.version

    @torch.no_grad()
    def run(self, batch: list[InferenceRequest]) -> None:
        try:
            self.restore()
        except RuntimeError as exc:  # e.g. out of GPU memory while a collocated learner holds it
            log.exception("could not move the weights back to %s", self.device)
            self.errors += len(batch)
            for r in batch:
                r.fail(f"inference server could not load its weights on {self.device}: {exc}")
            return
        for deterministic in (False, True):
            group = [r for r in batch if r.deterministic == deterministic]
            if not group:
                continue
            # one request's arrays are already private copies (validate): no need to copy them again
            parts = {k: [r.obs[k] for r in group] for k in self.keys}
            obs = {k: torch.from_numpy(v[0] if len(v) == 1 else np.concatenate(v)) for k, v in parts.items()}
            obs = {k: v.to(self.device) for k, v in obs.items()}
            try:
                out = self.policy.act(obs, deterministic=deterministic)
            except Exception as exc:  # a bug must answer the callers, not hang them
                log.exception("policy failed on a batch")
                self.errors += len(group)
                for r in group:
                    r.fail(f"policy failed: {exc}")
                continue
            arrays = {k: v.cpu().numpy() for k, v in out.items()}
            n = sum(r.rows for r in group)
            self.batches += 1
            self.rows += n
            start = 0
            for r in group:
                self._deliver(r, {k: v[start : start + r.rows] for k, v in arrays.items()})
                start += r.rows

    def _deliver(self, r: InferenceRequest, out: dict[str, np.ndarray]) -> None:
        """One caller's answer; a front end that cannot deliver it fails that request only,
        never the batching thread (and with it the server)."""
        try:
            r.respond(out, self.version)
        except Exception as exc:
            log.exception("could not deliver an answer")
            self.errors += 1
            try:
                r.fail(f"the answer could not be delivered: {type(exc).__name__}: {exc}")
            except Exception:
                log.exception("could not deliver an error either")
