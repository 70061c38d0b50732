"""The run spec: what the learner learns at start and every other role needs, sent beside the
user's config (`RegisterReply.run_spec`, the run folder's run_spec.json) instead of written into it.

The learner probes the env for its dimensions, builds the policy (which declares its log-prob
shape and extra outputs), pins the settings it built it with (`model_path` to one Hub commit) and,
on a resume, knows the checkpoint's env steps. Actors size their slots and segments from the spec,
inference servers and DDP ranks build the same policy from it, and a resumed run's actors start a
new episode stream from its `resumed_from_env_steps`. A spec that is absent or does not hold
together is refused here, in one line (`RunSpecError`), not deep inside a role.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfleet.wire.gen import learner_pb2

RUN_SPEC_FILE = "run_spec.json"
"""Where the learner writes the spec in the run folder, beside config.yaml (the user's config)."""


class RunSpecError(ValueError):
    """A run spec that is missing or malformed; its message is one line."""


@dataclass(frozen=True)
class RunSpec:
    state_dim: int
    action_dim: int
    logprob_shape: tuple[int, ...] = ()  # () per chunk, (K,) per action, (K*D,) per token
    extra_outputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # float32, by name
    policy: Mapping[str, Any] = field(default_factory=dict)  # the settings it was built with; model_path pinned
    resumed_from_env_steps: int = 0  # the resumed checkpoint's env steps; 0: a fresh start

    def __post_init__(self) -> None:
        for name in ("state_dim", "action_dim", "resumed_from_env_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise RunSpecError(f"run spec: {name} must be an int, got {value!r}")
        if self.state_dim < 0 or self.action_dim < 1:
            raise RunSpecError(
                f"run spec: state_dim must be >= 0 and action_dim >= 1, got {self.state_dim}, {self.action_dim}"
            )
        if self.resumed_from_env_steps < 0:
            raise RunSpecError(f"run spec: resumed_from_env_steps must be >= 0, got {self.resumed_from_env_steps}")
        object.__setattr__(self, "logprob_shape", _shape("logprob_shape", self.logprob_shape))
        if not isinstance(self.extra_outputs, Mapping):
            raise RunSpecError(f"run spec: extra_outputs must map names to shapes, got {self.extra_outputs!r}")
        extras = {}
        for name, shape in self.extra_outputs.items():
            if not isinstance(name, str) or not name:
                raise RunSpecError(f"run spec: extra output names must be non-empty strings, got {name!r}")
            extras[name] = _shape(f"extra_outputs[{name}]", shape)
        object.__setattr__(self, "extra_outputs", extras)
        if not isinstance(self.policy, Mapping) or not isinstance(self.policy.get("name"), str):
            raise RunSpecError(f"run spec: policy must be a settings mapping with a name, got {self.policy!r}")
        object.__setattr__(self, "policy", dict(self.policy))

    @property
    def model_path(self) -> str:
        """The checkpoint the policy started from (pinned), "" for fresh weights."""
        return str(self.policy.get("model_path") or "")

    def fresh_policy_settings(self) -> dict[str, Any]:
        """The policy settings without `model_path`: a fresh policy of the same kind (an inference
        server's copy, whose weights then come from the learner)."""
        return {k: v for k, v in self.policy.items() if k != "model_path"}

    def extras(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The extra outputs as slot and segment schemas take them (name -> (shape, dtype))."""
        return {name: (shape, "float32") for name, shape in self.extra_outputs.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "logprob_shape": list(self.logprob_shape),
            "extra_outputs": {name: list(shape) for name, shape in self.extra_outputs.items()},
            "policy": dict(self.policy),
            "resumed_from_env_steps": self.resumed_from_env_steps,
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "run spec") -> RunSpec:
        if not isinstance(data, Mapping):
            raise RunSpecError(f"{source}: expected a mapping, got {type(data).__name__}")
        known = {"state_dim", "action_dim", "logprob_shape", "extra_outputs", "policy", "resumed_from_env_steps"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RunSpecError(f"{source}: unknown keys {', '.join(map(str, unknown))}")
        missing = sorted({"state_dim", "action_dim", "policy"} - set(data))
        if missing:
            raise RunSpecError(f"{source}: missing {', '.join(missing)}")
        try:
            return cls(**data)
        except RunSpecError as exc:
            raise RunSpecError(f"{source}: {str(exc).removeprefix('run spec: ')}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "run spec") -> RunSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunSpecError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(data, source)

    def to_proto(self) -> learner_pb2.RunSpec:
        return learner_pb2.RunSpec(
            state_dim=self.state_dim,
            action_dim=self.action_dim,
            logprob_shape=list(self.logprob_shape),
            extra_outputs={name: learner_pb2.Shape(dims=list(shape)) for name, shape in self.extra_outputs.items()},
            policy_json=json.dumps(self.policy, sort_keys=True),
            resumed_from_env_steps=self.resumed_from_env_steps,
        )

    @classmethod
    def from_proto(cls, msg: learner_pb2.RunSpec, source: str = "run spec") -> RunSpec:
        if not msg.policy_json:
            raise RunSpecError(f"{source}: no policy settings (an empty spec)")
        try:
            policy = json.loads(msg.policy_json)
        except json.JSONDecodeError as exc:
            raise RunSpecError(f"{source}: policy_json is not valid JSON ({exc.msg})") from None
        return cls.from_dict(
            {
                "state_dim": msg.state_dim,
                "action_dim": msg.action_dim,
                "logprob_shape": tuple(msg.logprob_shape),
                "extra_outputs": {name: tuple(s.dims) for name, s in msg.extra_outputs.items()},
                "policy": policy,
                "resumed_from_env_steps": msg.resumed_from_env_steps,
            },
            source,
        )


def registered_spec(reply: learner_pb2.RegisterReply, learner: str) -> RunSpec:
    """The spec a learner's RegisterReply carries; one line when it carries none or a bad one."""
    if not reply.HasField("run_spec"):
        raise RunSpecError(f"the learner at {learner} sent no run spec (is it an older rlfleet?)")
    return RunSpec.from_proto(reply.run_spec, f"run spec from the learner at {learner}")


def write_run_spec(run_dir: Path, spec: RunSpec) -> Path:
    """run_spec.json in the run folder, written whole (a reader never sees half a file)."""
    path = Path(run_dir) / RUN_SPEC_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(spec.to_json())
    tmp.replace(path)
    return path


def read_run_spec(run_dir: Path) -> RunSpec | None:
    """The run folder's run_spec.json, None where there is none (a run from before the spec)."""
    path = Path(run_dir) / RUN_SPEC_FILE
    return RunSpec.from_json(path.read_text(), str(path)) if path.is_file() else None


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise RunSpecError(f"run spec: {name} must be a list of sizes, got {shape!r}")
    dims = tuple(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims):
        raise RunSpecError(f"run spec: {name} must hold positive ints, got {list(dims)!r}")
    return dims
