"""The shared-memory slot convention between env workers, actors and same-host inference servers.

One block per actor holds a row per env: its observation, the policy's answer and the step's
results. Names are the contract: observation keys as in the env API (plus a `final_` twin for
the observation an episode ended in), `actions`/`logprobs`/`values`, and `extra.<name>` for any
other policy output the learner needs.
"""

from __future__ import annotations

from rlfleet.wire.shm import ArraySpec, Layout

ObsSpec = dict[str, tuple[tuple[int, ...], str]]
BASE_OUTPUTS = ("actions", "logprobs", "values")


def output_slot(name: str) -> str:
    """Slot (and segment field) name of a policy output."""
    return name if name in BASE_OUTPUTS else f"extra.{name}"


def slot_layout(
    num_envs: int,
    obs_spec: ObsSpec,
    action_dim: int,
    chunk_size: int,
    logprob_shape: tuple[int, ...] = (),
    extra_outputs: ObsSpec | None = None,
) -> Layout:
    """The shared-memory slots of one actor's E envs (also read by a same-host inference server).

    Every observation key `k` gets a slot `k` and a slot `final_k` (the observation an episode
    ended in); policy outputs the learner needs beyond actions/logprobs/values go in `extra.<name>`.
    """
    E, K, D = num_envs, chunk_size, action_dim
    layout: Layout = {}
    for key, (shape, dtype) in obs_spec.items():
        layout[key] = ArraySpec((E, *shape), dtype)
        layout[f"final_{key}"] = ArraySpec((E, *shape), dtype)
    for name, (shape, dtype) in (extra_outputs or {}).items():
        layout[f"extra.{name}"] = ArraySpec((E, *shape), dtype)
    layout.update(
        {
            "task_ids": ArraySpec((E,), "int64"),
            "actions": ArraySpec((E, K, D), "float32"),
            "logprobs": ArraySpec((E, *logprob_shape), "float32"),
            "values": ArraySpec((E,), "float32"),
            "rewards": ArraySpec((E, K), "float32"),
            "terminated": ArraySpec((E,), "bool"),
            "truncated": ArraySpec((E,), "bool"),
            "success": ArraySpec((E,), "bool"),
            "episode_done": ArraySpec((E,), "bool"),
            "episode_return": ArraySpec((E,), "float32"),
            "episode_length": ArraySpec((E,), "int32"),
            "episode_success_once": ArraySpec((E,), "bool"),
            "substeps": ArraySpec((E,), "int32"),  # simulated in the last chunk (env steps count these)
        }
    )
    return layout


def obs_keys(layout: Layout) -> list[str]:
    """The observation keys of a slot layout (those with a `final_` twin)."""
    return [k for k in layout if f"final_{k}" in layout]
