"""The contract every policy implements, so the inference server, trainer and SFT never see model types.

Observations are a dict of batched tensors named as in the env API (RLinf names):

    states        float32 [B, S]        full simulator state (a policy may read only a prefix)
    main_images   uint8   [B, H, W, 3]  present when `EnvConfig.image_size > 0`
    wrist_images  uint8   [B, H, W, 3]  gripper camera, present with `EnvConfig.wrist_camera`
    instructions  uint8   [B, L]        UTF-8 bytes of the task instruction, zero padded
                                        (`rlfleet.envs.api.encode_instructions`)

A policy reads only the keys in `obs_keys`. Its outputs:

    act(obs, deterministic) -> {"actions":  float32 [B, K, D] in env units,
                                "logprobs": float32 [B, *logprob_shape],
                                "values":   float32 [B],
                                **extras}   one entry per `extra_outputs` item, [B, *shape]
    evaluate(obs, actions, extras) -> (logp [N, *logprob_shape], entropy [N, *logprob_shape], values [N])
    value(obs) -> [N]
    sft_loss(obs, actions) -> scalar behaviour-cloning loss (token CE, flow matching, or NLL)
    update_normalization(obs) -> None     (running statistics; a no-op for most policies)

`logprob_shape` is () when the log-prob is per chunk, (K,) per action step, (K*D,) per token;
the PPO loss takes the ratio per element and broadcasts the chunk's advantage over it.
`extra_outputs` names what the learner needs to recompute a log-prob that the actions alone do
not determine (for flow policies the initial noise or denoise step); the fleet carries them from
the inference server to the learner untouched.
"""

from __future__ import annotations

from typing import Protocol

import torch

Obs = dict[str, torch.Tensor]


class Policy(Protocol):
    obs_keys: tuple[str, ...]
    logprob_shape: tuple[int, ...]
    extra_outputs: dict[str, tuple[tuple[int, ...], str]]
    action_dim: int
    chunk_size: int

    def act(self, obs: Obs, deterministic: bool = False) -> dict[str, torch.Tensor]: ...

    def evaluate(
        self, obs: Obs, actions: torch.Tensor, extras: dict[str, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def value(self, obs: Obs) -> torch.Tensor: ...

    def sft_loss(self, obs: Obs, actions: torch.Tensor) -> torch.Tensor: ...

    def update_normalization(self, obs: Obs) -> None: ...
