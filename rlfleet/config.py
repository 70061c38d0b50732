"""The run configuration: OmegaConf structured config, YAML recipes and `key=value` overrides.

Section and key names follow RLinf where one exists (runner.logger.log_path, env, algorithm),
so recipes read familiarly to its users; unknown keys are an error, not a silent no-op.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlfleet.algorithms.dagger import DAggerConfig
from rlfleet.algorithms.ppo import PPOConfig
from rlfleet.envs.api import EnvConfig, observation_spec
from rlfleet.eval_video import VideoConfig


@dataclass
class LoggerConfig:
    log_path: str = "runs/${runner.experiment_name}"
    tensorboard: bool = True


@dataclass
class RunnerConfig:
    experiment_name: str = "rlfleet"
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    total_env_steps: int = 1_000_000
    max_wall_seconds: float = 0.0  # 0: no limit; otherwise stop training after this long
    checkpoint_every: int = 50  # updates
    seed: int = 0
    resume: bool = False
    # Evaluate policy.model_path (or the bootstrapped SFT checkpoint) and stop: RLinf's *_eval recipes
    only_eval: bool = False


@dataclass
class InferenceFailoverConfig:
    """How an actor rides out a failed inference server (see docs/fault_tolerance.md)."""

    request_timeout_s: float = 60.0  # no answer within this: the server counts as down
    probe_interval_s: float = 2.0  # health-check a downed server this often, to use it again
    all_down_timeout_s: float = 120.0  # every server down this long: the actor stops with an error


@dataclass
class ActorConfig:
    num_actors: int = 1
    num_envs: int = 16  # per actor
    num_workers: int = 2  # env worker subprocesses per actor
    pipeline_stage_num: int = 2  # env groups that step in turn (double buffering)
    rollout_len: int = 32  # T: steps per trajectory segment
    send_queue_size: int = 4  # segments buffered before the actor waits for the learner
    transport: str = "shm"  # shm (same host) | zmq | grpc
    failover: InferenceFailoverConfig = field(default_factory=InferenceFailoverConfig)
    max_restarts: int = 3  # local mode: times a crashed actor process is restarted (per actor)
    restart_backoff_s: float = 2.0  # local mode: wait before the first restart, doubled each time


@dataclass
class InferenceConfig:
    host: str = "127.0.0.1"
    grpc_port: int = 0  # 0: any free port
    zmq_port: int = 0
    max_batch: int = 256  # rows
    max_wait_ms: float = 1.0
    device: str = "cpu"
    weight_delta: bool = True  # pull only the tensors changed since the version held (frozen ones never)


@dataclass
class DistributedConfig:
    """DDP across the ranks torchrun starts (it sets WORLD_SIZE/RANK/LOCAL_RANK); see
    docs/distributed_learner.md. A learner started without torchrun is one plain process."""

    backend: str = "auto"  # auto: nccl where CUDA is available (rank r on cuda:LOCAL_RANK), else gloo on CPU
    timeout_s: float = 1800.0  # a collective inside an update that takes longer is an error
    idle_timeout_s: float = 7 * 24 * 3600.0  # how long ranks > 0 wait for rank 0's next batch of segments
    # DDP searches each step for parameters left out of the loss; None: only in runs that leave some
    # out (critic warm-up, GRPO). Set true for a policy with parameters its evaluate() never uses.
    find_unused_parameters: bool | None = None


@dataclass
class LearnerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    batch_env_steps: int = 4096  # samples per PPO update
    ingest_queue_size: int = 16  # segments
    reward_scale: float = 1.0
    device: str = "cpu"
    weight_chunk_bytes: int = 4 * 1024 * 1024
    consume_only: bool = False  # benchmarks: take segments but skip the PPO update
    distributed: DistributedConfig = field(default_factory=DistributedConfig)  # under torchrun


@dataclass
class EvalConfig:
    episodes_per_task: int = 10
    num_workers: int = 2
    at_end: bool = True
    task: str = ""  # task or task set to evaluate on; empty: the training tasks (ML45: "ML45_test")
    before: bool = False  # also evaluate the starting policy, for a before/after table
    seed: int = 10_000  # episode seeds start here (demos and training use other seeds)
    video_cfg: VideoConfig = field(default_factory=VideoConfig)  # MP4s of eval episodes (RLinf's names)


@dataclass
class DemosConfig:
    """Expert demonstrations for SFT (`rlfleet collect`), and whether a run without a
    `policy.model_path` first builds its own SFT checkpoint from them (cached)."""

    bootstrap: bool = False
    path: str = ""  # an existing demo dataset; empty: collect one into cache_dir
    episodes_per_task: int = 10
    num_workers: int = 2
    seed: int = 0
    cache_dir: str = "cache"


@dataclass
class SFTConfig:
    """Behaviour cloning (`rlfleet sft`)."""

    steps: int = 2000  # optimiser steps
    batch_size: int = 64
    lr: float = 3e-4
    weight_decay: float = 1e-4
    max_grad_norm: float = 1.0
    shift_augment: int = 2  # random image shift in pixels (0: off); helps a small CNN generalise
    eval_every: int = 0  # steps between evaluations in the simulator (0: none during training)
    eval_episodes_per_task: int = 5
    seed: int = 0
    threads: int = 2


@dataclass
class ClusterConfig:
    """Where roles run when `rlfleet train` spawns them together (see rlfleet.placement).

    Empty `component_placement`: one learner rank, one inference server, `actor.num_actors`
    actors. On a host without CUDA the device indices are process slots (`cpu_slots`, 0: the
    number of CPU cores)."""

    component_placement: dict[str, Any] = field(default_factory=dict)
    cpu_slots: int = 0


@dataclass
class ModelDims:
    """Filled in by the learner from the env spec and its policy, so remote roles size the same slots."""

    state_dim: int = 0
    action_dim: int = 0
    logprob_shape: list[int] = field(default_factory=list)  # [] per chunk, [K] per action, [K*D] per token
    extra_outputs: dict[str, list[int]] = field(default_factory=dict)  # float32 outputs the learner needs


@dataclass
class RunConfig:
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    # Free-form: each policy validates its own keys (see rlfleet.policies.registry); `model_path`
    # starts from a checkpoint folder (e.g. an SFT checkpoint) instead of fresh weights.
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "gaussian_mlp"})
    algorithm: PPOConfig = field(default_factory=PPOConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    demos: DemosConfig = field(default_factory=DemosConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    dagger: DAggerConfig = field(default_factory=DAggerConfig)  # enabled: DAgger instead of PPO
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model_dims: ModelDims = field(default_factory=ModelDims)


def recipe_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("rlfleet.recipes").iterdir() if p.name.endswith(".yaml"))


def _recipe_path(recipe: str) -> Path:
    path = Path(recipe)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    packaged = resources.files("rlfleet.recipes") / f"{recipe}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    raise FileNotFoundError(f"unknown recipe {recipe!r}: not a YAML file, nor one of {', '.join(recipe_names())}")


def load_config(recipe: str | None, overrides: list[str] | None = None) -> DictConfig:
    """Schema defaults <- recipe YAML <- command-line `key=value` overrides, type-checked."""
    cfg = OmegaConf.structured(RunConfig)
    if recipe:
        cfg = OmegaConf.merge(cfg, OmegaConf.load(_recipe_path(recipe)))
    if overrides:
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ValueError(f"overrides must look like key=value, got {bad}")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    from rlfleet.envs.registry import check_env_name
    from rlfleet.policies.registry import check_policy_config

    check_env_name(cfg.env.name)
    check_policy_config(as_dict(cfg.policy))
    if cfg.cluster.component_placement:
        resolve_placement(cfg)  # a bad placement fails here, before anything is spawned
    return cfg


def resolve_placement(cfg: DictConfig):
    """The run's PlacementPlan, or None without `cluster.component_placement`."""
    if not cfg.cluster.component_placement:
        return None
    from rlfleet.placement import detect_devices, plan_placement

    num, kind = detect_devices(cfg.cluster.cpu_slots or os.cpu_count() or 1)
    return plan_placement(as_dict(cfg.cluster.component_placement), num, kind)


def config_from_yaml(text: str) -> DictConfig:
    """Rebuild a run config sent by the learner (the source of truth for remote roles)."""
    return OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.create(text))


def policy_settings(cfg: DictConfig) -> dict[str, Any]:
    """The run's policy section without `model_path` (what builds a fresh policy of the same kind)."""
    return {k: v for k, v in as_dict(cfg.policy).items() if k != "model_path"}


def eval_env_config(cfg: DictConfig) -> EnvConfig:
    """The env evaluation runs in: the training env, or `eval.task` (held-out tasks) on it, with
    held-out episodes where the env keeps them apart (CALVIN's eval chain pool)."""
    env = dataclasses.replace(EnvConfig(**as_dict(cfg.env)), pool="eval")
    return dataclasses.replace(env, task=cfg.eval.task) if cfg.eval.task else env


def run_observation_spec(cfg: DictConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """The observation tensors of this run's env (needs `model_dims` filled in by the learner)."""
    return observation_spec(EnvConfig(**as_dict(cfg.env)), cfg.model_dims.state_dim)


def run_slot_layout(cfg: DictConfig, num_envs: int):
    """An actor's shared-memory slots for this run's env and policy."""
    from rlfleet.wire.slots import slot_layout

    dims = cfg.model_dims
    extras = {name: (tuple(shape), "float32") for name, shape in dims.extra_outputs.items()}
    return slot_layout(num_envs, run_observation_spec(cfg), dims.action_dim, cfg.env.chunk_size,
                       tuple(dims.logprob_shape), extras)


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def as_dict(section: Any) -> dict[str, Any]:
    return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
