"""The run configuration: OmegaConf structured config, YAML recipes and `key=value` overrides.

Section and key names follow RLinf where one exists (runner.logger.log_path, env, algorithm),
so recipes read familiarly to its users; unknown keys are an error, not a silent no-op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlfleet.algorithms.ppo import PPOConfig
from rlfleet.envs.api import EnvConfig
from rlfleet.policies.gaussian_mlp import PolicyConfig


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


@dataclass
class ActorConfig:
    num_actors: int = 1
    num_envs: int = 16  # per actor
    num_workers: int = 2  # env worker subprocesses per actor
    pipeline_stage_num: int = 2  # env groups that step in turn (double buffering)
    rollout_len: int = 32  # T: steps per trajectory segment
    send_queue_size: int = 4  # segments buffered before the actor waits for the learner
    transport: str = "shm"  # shm (same host) | zmq | grpc


@dataclass
class InferenceConfig:
    host: str = "127.0.0.1"
    grpc_port: int = 0  # 0: any free port
    zmq_port: int = 0
    max_batch: int = 256  # rows
    max_wait_ms: float = 1.0
    device: str = "cpu"


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


@dataclass
class EvalConfig:
    episodes_per_task: int = 10
    num_workers: int = 2
    at_end: bool = True


@dataclass
class ModelDims:
    """Filled in by the learner from the env spec, so remote roles can build the same policy."""

    state_dim: int = 0
    action_dim: int = 0


@dataclass
class RunConfig:
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algorithm: PPOConfig = field(default_factory=PPOConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
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
    return cfg


def config_from_yaml(text: str) -> DictConfig:
    """Rebuild a run config sent by the learner (the source of truth for remote roles)."""
    return OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.create(text))


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def as_dict(section: Any) -> dict[str, Any]:
    return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
