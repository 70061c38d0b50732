"""The trajectory segment: T steps x B envs from one actor, as it travels to the learner.

One schema shared by the producer (actor) and the consumer (learner); `from_tensors` checks
every field's dtype and shape against the others, so a malformed push is rejected cleanly.
Observations are dicts keyed like the env API (`states`, `main_images`, `instructions`); on the
wire they are flattened to `obs.<key>`, `final_obs.<key>`, `next_obs.<key>` and `extra.<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from rlfleet.wire.codec import WireFormatError, require

_DICT_FIELDS = {"obs": "obs.", "final_obs": "final_obs.", "next_obs": "next_obs.", "extras": "extra."}


@dataclass
class Segment:
    obs: dict[str, np.ndarray]  # [T,B,...] each: observation each action was chosen from
    actions: np.ndarray  # [T,B,K,D] float32: the sampled (unclipped) action chunk
    logprobs: np.ndarray  # [T,B,*P] float32: behaviour log-prob (P: the policy's logprob_shape)
    values: np.ndarray  # [T,B] float32: behaviour value estimate
    rewards: np.ndarray  # [T,B] float32: reward summed over the chunk
    terminated: np.ndarray  # [T,B] bool
    truncated: np.ndarray  # [T,B] bool
    final_obs: dict[str, np.ndarray]  # [T,B,...] each: observation an episode ended in (zeros elsewhere)
    next_obs: dict[str, np.ndarray]  # [B,...] each: observation after the last step (bootstrap)
    versions: np.ndarray  # [T] int64: policy version that produced step t
    task_ids: np.ndarray  # [B] int64
    env_steps: np.ndarray  # [] int64: simulator steps taken (T*B*K less skipped substeps)
    ep_returns: np.ndarray  # [N] float32: episodes that ended in this segment
    ep_lengths: np.ndarray  # [N] int32
    ep_success: np.ndarray  # [N] bool: success_once
    ep_task_ids: np.ndarray  # [N] int64
    extras: dict[str, np.ndarray]  # [T,B,...] each: policy outputs the learner needs (e.g. flow noise)
    # [B] int64: GRPO group of each env column (envs reset to the same state); empty: no groups.
    # Optional on the wire (absent when empty), so segments from before it decode unchanged.
    group_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def num_steps(self) -> int:
        return int(self.actions.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.actions.shape[1])

    def to_tensors(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _DICT_FIELDS:
                out.update({_DICT_FIELDS[f.name] + k: v for k, v in value.items()})
            elif f.name == "group_ids" and len(value) == 0:
                continue
            else:
                out[f.name] = value
        return out

    def check_schema(
        self,
        obs_spec: dict,
        action_dim: int,
        chunk_size: int,
        logprob_shape: tuple[int, ...],
        extra_outputs: dict[str, tuple[int, ...]],
        group_size: int = 0,
    ) -> None:
        """Reject a well-formed segment that does not fit this run (another env or policy).

        ``group_size`` > 0 (a GRPO run): every env column needs a group of exactly that many
        columns, and every env must end its episode inside the segment (whole episodes).
        """
        if group_size:
            self._check_groups(group_size)
        if set(self.obs) != set(obs_spec):
            raise WireFormatError(
                f"observation keys {sorted(self.obs)} differ from this run's {sorted(obs_spec)}", reason="run_mismatch"
            )
        for key, (shape, dtype) in obs_spec.items():
            arr = self.obs[key]
            if arr.dtype != np.dtype(dtype) or arr.shape[2:] != tuple(shape):
                raise WireFormatError(
                    f"obs.{key} is {arr.dtype} {list(arr.shape[2:])} per env, this run needs {dtype} {list(shape)}",
                    reason="run_mismatch",
                )
        if self.actions.shape[2:] != (chunk_size, action_dim):
            raise WireFormatError(
                f"action chunks are {list(self.actions.shape[2:])}, this run needs [{chunk_size}, {action_dim}]",
                reason="run_mismatch",
            )
        if self.logprobs.shape[2:] != tuple(logprob_shape):
            raise WireFormatError(
                f"logprobs are {list(self.logprobs.shape[2:])} per sample, the policy gives {list(logprob_shape)}",
                reason="run_mismatch",
            )
        want = {k: tuple(v) for k, v in extra_outputs.items()}
        got = {k: tuple(v.shape[2:]) for k, v in self.extras.items()}
        if got != want:
            raise WireFormatError(f"extra outputs {got} differ from the policy's {want}", reason="run_mismatch")

    def _check_groups(self, group_size: int) -> None:
        if self.group_ids.shape != (self.num_envs,):
            raise WireFormatError(
                f"this run trains with GRPO and needs group_ids [{self.num_envs}], "
                f"the segment has {list(self.group_ids.shape)} (an actor not in GRPO mode?)",
                reason="grpo_groups",
            )
        _, counts = np.unique(self.group_ids, return_counts=True)
        if (counts != group_size).any():
            raise WireFormatError(
                f"GRPO groups must have {group_size} envs each, got sizes {sorted(set(counts.tolist()))}",
                reason="grpo_groups",
            )
        if not (self.terminated | self.truncated).any(axis=0).all():
            raise WireFormatError(
                "GRPO segments must hold whole episodes: some env did not end its episode", reason="grpo_groups"
            )

    @classmethod
    def from_tensors(cls, t: dict) -> Segment:
        actions = require(t, "actions", "float32", (None, None, None, None), finite=True)
        T, B = actions.shape[:2]
        if T == 0 or B == 0:
            raise WireFormatError(f"empty segment: actions shape {list(actions.shape)}", reason="bad_shape")
        groups = {name: _prefixed(t, prefix) for name, prefix in _DICT_FIELDS.items()}
        obs = groups["obs"]
        if not obs:
            raise WireFormatError("segment has no observations (obs.<key> tensors)", reason="missing_tensor")
        for name, lead in (("obs", (T, B)), ("final_obs", (T, B)), ("next_obs", (B,))):
            if set(groups[name]) != set(obs):
                raise WireFormatError(
                    f"{name} keys {sorted(groups[name])} differ from obs keys {sorted(obs)}", reason="missing_tensor"
                )
            for key, arr in groups[name].items():
                want = (*lead, *obs[key].shape[2:])
                _check(f"{name}.{key}", arr, obs[key].dtype, want)
        for key, arr in groups["extras"].items():
            if arr.shape[:2] != (T, B):
                raise WireFormatError(
                    f"extra.{key} must lead with [{T}, {B}], got {list(arr.shape)}", reason="bad_shape"
                )
            _check(f"extra.{key}", arr, np.dtype("float32"), arr.shape)
        logprobs = require(t, "logprobs", "float32", None, finite=True)
        if logprobs.shape[:2] != (T, B):
            raise WireFormatError(f"logprobs must lead with [{T}, {B}], got {list(logprobs.shape)}", reason="bad_shape")
        n = require(t, "ep_returns", "float32", (None,), finite=True).shape[0]
        return cls(
            obs=obs,
            actions=actions,
            logprobs=logprobs,
            values=require(t, "values", "float32", (T, B), finite=True),
            rewards=require(t, "rewards", "float32", (T, B), finite=True),
            terminated=require(t, "terminated", "bool", (T, B)),
            truncated=require(t, "truncated", "bool", (T, B)),
            final_obs=groups["final_obs"],
            next_obs=groups["next_obs"],
            versions=require(t, "versions", "int64", (T,)),
            task_ids=require(t, "task_ids", "int64", (B,)),
            env_steps=_env_steps(t, T * B * int(actions.shape[2])),
            ep_returns=t["ep_returns"],
            ep_lengths=require(t, "ep_lengths", "int32", (n,)),
            ep_success=require(t, "ep_success", "bool", (n,)),
            ep_task_ids=require(t, "ep_task_ids", "int64", (n,)),
            extras=groups["extras"],
            group_ids=require(t, "group_ids", "int64", (B,)) if "group_ids" in t else np.zeros(0, np.int64),
        )


def _env_steps(t: dict, most: int) -> np.ndarray:
    """Simulator steps the segment claims: at most one per action of its chunks (T*B*K), never
    negative; the learner's step count (and the run's end) is built from these."""
    steps = require(t, "env_steps", "int64", ())
    if not 0 <= int(steps) <= most:
        raise WireFormatError(
            f"env_steps {int(steps)} is outside 0..{most} (T*B*K of this segment)", reason="bad_env_steps"
        )
    return steps


def _prefixed(t: dict, prefix: str) -> dict[str, np.ndarray]:
    out = {k[len(prefix) :]: v for k, v in t.items() if k.startswith(prefix)}
    for key, value in out.items():
        if not isinstance(value, np.ndarray):
            raise WireFormatError(f"{prefix}{key} must be a tensor", reason="bad_dtype")
    return out


def _check(name: str, arr: np.ndarray, dtype: np.dtype, shape: tuple) -> None:
    if arr.dtype != dtype or tuple(arr.shape) != tuple(shape):
        raise WireFormatError(
            f"{name} must be {dtype} {list(shape)}, got {arr.dtype} {list(arr.shape)}",
            reason="bad_dtype" if arr.dtype != dtype else "bad_shape",
        )
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise WireFormatError(f"{name} contains NaN or inf", reason="non_finite")
