"""`cluster.component_placement`: which devices each role gets when roles are spawned together.

RLinf's grammar, with RLinf's component names:

    component_placement:          component_placement:          component_placement:
      env,rollout,actor: all        env: 0-1                      env: 0-3
                                    rollout: 2-5                  rollout: 4-7
                                    actor: 6-7                    actor: 0-7
      (collocated)                  (disaggregated)               (hybrid)

`env` are the simulator actors (rlfleet actor processes), `rollout` the inference servers and
`actor` the learner ranks (RLinf's "actor" is the trained model, not an rlfleet actor);
`RLINF_COMPONENTS` below is the one mapping, and `PlacementPlan` speaks rlfleet's role names. A value
is `all`, one index, a range `a-b` (inclusive) or a comma list of those. Each listed device gets
one instance of the role: `rollout: 4-7` starts four inference servers, `actor: 0-7` an
8-rank learner under torchrun.

The mode follows from the overlap between the learner's and the inference servers' devices:
none is disaggregated, identical sets are collocated, anything else hybrid. Where they share a
device the inference server hands its weights back to the CPU while it is idle (the learner's
update phase) so the learner has the memory.

Without CUDA the devices are process slots on this host: the plan keeps the same shape (how
many learner ranks, inference servers and actor processes) and says so in its message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig

from rlfleet.config import as_dict

# The one place RLinf's component names meet rlfleet's roles (docs/glossary.md): RLinf's key ->
# the PlacementPlan field, named after the rlfleet role it places. RLinf's "actor" is the model
# being trained (rlfleet's learner ranks); an rlfleet actor is an env-stepping process ("env").
RLINF_COMPONENTS: dict[str, str] = {"env": "actors", "rollout": "inference", "actor": "learner"}
COMPONENTS = tuple(RLINF_COMPONENTS)
_ROLE_WORDS = {"actors": "actor processes", "inference": "inference servers", "learner": "learner ranks"}


class PlacementError(ValueError):
    """A component_placement that cannot be satisfied (bad syntax, unknown role, no such device)."""


def parse_devices(spec: str | int, num_devices: int) -> list[int]:
    """'all' | 3 | '0-3' | '0,2,4-5' -> sorted distinct device indices, each < num_devices."""
    if isinstance(spec, bool):
        raise PlacementError(f"bad device list {spec!r}")
    if isinstance(spec, int):
        parts = [str(spec)]
    else:
        text = str(spec).strip()
        if text == "all":
            return list(range(num_devices))
        parts = [p.strip() for p in text.split(",")]
    devices: set[int] = set()
    for part in parts:
        devices.update(_parse_range(part, spec))
    out = sorted(devices)
    if not out:
        raise PlacementError(f"device list {spec!r} is empty")
    if out[-1] >= num_devices:
        raise PlacementError(
            f"device {out[-1]} in {spec!r} does not exist: this host has {num_devices} "
            f"device(s), numbered 0-{num_devices - 1}"
        )
    return out


def _parse_range(part: str, spec) -> range:
    lo, sep, hi = part.partition("-")
    try:
        start = int(lo)
        stop = int(hi) if sep else start
    except ValueError:
        raise PlacementError(f"bad device list {spec!r}: {part!r} is not an index or a range a-b") from None
    if start < 0 or stop < start:
        raise PlacementError(f"bad device range {part!r} in {spec!r}")
    return range(start, stop + 1)


@dataclass
class PlacementPlan:
    """Devices per rlfleet role (one process per listed device); `device_kind` is 'cuda' or 'cpu'
    (process slots)."""

    actors: list[int]  # RLinf's `env`
    inference: list[int]  # RLinf's `rollout`
    learner: list[int]  # RLinf's `actor`
    device_kind: str
    mode: str = field(init=False)

    def __post_init__(self) -> None:
        learner, inference = set(self.learner), set(self.inference)
        if not learner & inference:
            self.mode = "disaggregated"
        elif learner == inference:
            self.mode = "collocated"
        else:
            self.mode = "hybrid"

    @property
    def num_learner_ranks(self) -> int:
        return len(self.learner)

    @property
    def num_inference_servers(self) -> int:
        return len(self.inference)

    @property
    def num_actors(self) -> int:
        return len(self.actors)

    def shares_device(self, inference_device: int) -> bool:
        """Whether an inference server's device is also a learner rank's (offload while idle)."""
        return inference_device in self.learner

    def device_name(self, index: int) -> str:
        return f"cuda:{index}" if self.device_kind == "cuda" else "cpu"

    def visible_devices(self, *indices: int) -> dict[str, str]:
        """Environment for a process pinned to these devices (nothing to pin on CPU). Indices count
        the devices this process sees, so a parent's own CUDA_VISIBLE_DEVICES mask is honoured."""
        if self.device_kind != "cuda":
            return {}
        parent = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        return {"CUDA_VISIBLE_DEVICES": ",".join(parent[i] if parent else str(i) for i in indices)}

    def describe(self) -> str:
        lines = [f"placement: {self.mode}"]
        for comp, role in RLINF_COMPONENTS.items():
            devs = getattr(self, role)
            lines.append(f"  {comp:8s} -> {len(devs)} {_ROLE_WORDS[role]} on {self.device_kind} {_ranges(devs)}")
        if self.device_kind == "cpu":
            lines.append(
                "  no CUDA device here: device indices are process slots on this host "
                "(one process per index, all on the CPU)"
            )
        return "\n".join(lines)


def _ranges(devs: list[int]) -> str:
    out, start = [], devs[0]
    for prev, cur in zip(devs, devs[1:] + [None]):
        if cur != prev + 1:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(out)


def plan_placement(spec: Mapping[str, str | int], num_devices: int, device_kind: str) -> PlacementPlan:
    """Resolve a component_placement mapping; every component must be placed exactly once."""
    if num_devices < 1:
        raise PlacementError("component_placement needs at least one device (or process slot)")
    found: dict[str, list[int]] = {}
    for key, value in spec.items():
        if value is None:  # YAML flow style splits an unquoted `{env,rollout: all}` at the comma
            raise PlacementError(
                f"component_placement gives {key!r} no devices; in flow style or on the "
                "command line quote a comma-joined key: \"{'env,rollout,actor': all}\""
            )
        for comp in (c.strip() for c in str(key).split(",")):
            if comp not in COMPONENTS:
                raise PlacementError(
                    f"unknown component {comp!r} in component_placement; use {', '.join(COMPONENTS)} (RLinf's names)"
                )
            if comp in found:
                raise PlacementError(f"component {comp!r} is placed twice in component_placement")
            found[comp] = parse_devices(value, num_devices)
    missing = [c for c in COMPONENTS if c not in found]
    if missing:
        raise PlacementError(
            f"component_placement does not place {', '.join(missing)}; "
            "give every one of env, rollout, actor (e.g. 'env,rollout,actor: all')"
        )
    return PlacementPlan(**{RLINF_COMPONENTS[c]: devs for c, devs in found.items()}, device_kind=device_kind)


def detect_devices(num_slots: int) -> tuple[int, str]:
    """(number of devices, kind): the CUDA devices if any, else `num_slots` CPU process slots."""
    if torch.cuda.is_available():
        return torch.cuda.device_count(), "cuda"
    return max(1, num_slots), "cpu"


def resolve_placement(cfg: DictConfig) -> PlacementPlan | None:
    """The run's PlacementPlan, or None without `cluster.component_placement`; a bad placement is
    a PlacementError before anything is spawned."""
    if not cfg.cluster.component_placement:
        return None
    num, kind = detect_devices(cfg.cluster.cpu_slots or os.cpu_count() or 1)
    return plan_placement(as_dict(cfg.cluster.component_placement), num, kind)
