"""pi0 base checkpoints in the layout of openpi's PyTorch port and LeRobot's `pi0` policy, loaded
into `hf_pi0` through a written key map.

Their `model.safetensors` (LeRobot: `PI0Policy.model = PI0Pytorch`, whose module tree openpi's
`PI0Pytorch` defines) holds, each under `model.`:

    paligemma_with_expert.paligemma.<PaliGemmaForConditionalGeneration keys>  -> prefix.vlm.<same>
    paligemma_with_expert.gemma_expert.model.layers.N.<Gemma decoder layer>   -> expert.model.layers.N.<same>
    paligemma_with_expert.gemma_expert.model.norm.weight                      -> expert.model.norm.weight
    paligemma_with_expert.gemma_expert.lm_head.weight                         -> (unused: the expert decodes
                                                                                  actions, not tokens)
    state_proj, action_in_proj, action_out_proj,                              -> expert.<same>
    action_time_mlp_in, action_time_mlp_out

PaliGemma ties its output head to the token embedding, and these files store the pair once (under
`lm_head` or `embed_tokens`): either name fills both. pi0.5 files (`time_mlp_*`, adaRMS norms) are
another layout: their keys are refused.

Older files keep PaliGemma's pre-4.52 transformers layout (`paligemma.language_model.model.*`,
`paligemma.vision_tower.*`, ...): those names are moved to the current one first. With LoRA on,
a base weight lands in its adapted layer's `base_layer`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

_OLD_PALIGEMMA = [
    (r"^paligemma\.language_model\.model\.", "paligemma.model.language_model."),
    (r"^paligemma\.language_model\.lm_head\.", "paligemma.lm_head."),
    (r"^paligemma\.vision_tower\.", "paligemma.model.vision_tower."),
    (r"^paligemma\.multi_modal_projector\.", "paligemma.model.multi_modal_projector."),
]
_HEAD_LAYERS = ("state_proj", "action_in_proj", "action_out_proj", "action_time_mlp_in", "action_time_mlp_out")
UNUSED = ("paligemma_with_expert.gemma_expert.lm_head.",)


def map_pi0_key(key: str) -> str | None:
    """One checkpoint key -> the hf_pi0 policy's name for it; None for a tensor the policy does not use.
    A key outside the layout is a ValueError."""
    k = key.removeprefix("model.")
    if k.startswith(UNUSED):
        return None
    if k.startswith("paligemma_with_expert."):
        inner = k.removeprefix("paligemma_with_expert.")
        for old, new in _OLD_PALIGEMMA:
            inner = re.sub(old, new, inner)
        if inner.startswith("paligemma."):
            return "prefix.vlm." + inner.removeprefix("paligemma.")
        if inner.startswith("gemma_expert.model."):
            return "expert.model." + inner.removeprefix("gemma_expert.model.")
    if k.split(".", 1)[0] in _HEAD_LAYERS:
        return "expert." + k
    raise ValueError(f"{key}: not a key of the pi0 layout (openpi PyTorch / LeRobot)")


def base_tensor_names(policy: torch.nn.Module) -> set[str]:
    """What a pi0 base checkpoint must provide: the whole VLM (frozen or not) and the expert, without
    the adapters (they start fresh) and without what the file has no place for (the critic, the
    exploration parameters, the normalisation statistics)."""
    vlm = {f"prefix.vlm.{k}" for k in policy.prefix.vlm.state_dict() if "lora_" not in k}
    expert = {f"expert.{k}" for k in policy.expert.state_dict()}
    return vlm | expert


def _tied_names(own: Mapping[str, torch.Tensor]) -> list[set[str]]:
    """Groups of names that are one tensor (tied weights: the same storage under several names)."""
    by_storage: dict[tuple[int, int], set[str]] = {}
    for name, tensor in own.items():
        if tensor.device.type != "meta" and tensor.numel():
            by_storage.setdefault((tensor.data_ptr(), tensor.numel()), set()).add(name)
    return [names for names in by_storage.values() if len(names) > 1]


def load_pi0_weights(policy: torch.nn.Module, tensors: Mapping[str, torch.Tensor] | str | Path) -> dict[str, int]:
    """Load a pi0 base checkpoint (a tensor dict, a model.safetensors file, or its folder) into an
    hf_pi0 / hf_pi05 policy. Every tensor the layout defines must land and every policy tensor
    `base_tensor_names` lists must be given, else one ValueError listing what does not fit.
    Returns {"loaded": n, "unused": n}."""
    if not isinstance(tensors, Mapping):
        path = Path(tensors)
        tensors = load_file(path / "model.safetensors" if path.is_dir() else path)
    own = {**{f"prefix.vlm.{k}": v for k, v in policy.prefix.vlm.state_dict(keep_vars=True).items()}}
    own.update({f"expert.{k}": v for k, v in policy.expert.state_dict(keep_vars=True).items()})
    mapped: dict[str, torch.Tensor] = {}
    unexpected, unused = [], 0
    for key, value in tensors.items():
        try:
            dst = map_pi0_key(key)
        except ValueError:
            unexpected.append(key)
            continue
        if dst is None:
            unused += 1
            continue
        if dst not in own:  # with LoRA on, the adapted layer keeps its base weight as base_layer
            adapted = re.sub(r"\.(weight|bias)$", r".base_layer.\1", dst)
            if adapted in own:
                dst = adapted
        if dst not in own:
            unexpected.append(key)
        elif own[dst].shape != value.shape:
            unexpected.append(f"{key} (shape {tuple(value.shape)}, policy {tuple(own[dst].shape)})")
        else:
            mapped[dst] = value
    want = {re.sub(r"\.base_layer\.", ".", n) for n in base_tensor_names(policy)}
    got = {re.sub(r"\.base_layer\.", ".", n) for n in mapped}
    for group in _tied_names(own):  # one stored tensor fills every name it is tied to
        if group & got:
            got |= group
    missing = sorted(want - got)
    if unexpected or missing:
        parts = [f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"] if unexpected else []
        if missing:
            parts.append(f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        raise ValueError(
            f"pi0 checkpoint does not fit this policy ({len(unexpected)} unexpected, "
            f"{len(missing)} missing): " + "; ".join(parts)
        )
    with torch.no_grad():
        for name, value in mapped.items():
            own[name].copy_(value.to(own[name].dtype))
    return {"loaded": len(mapped), "unused": unused}
