"""The run configuration: OmegaConf structured config, YAML recipes and `key=value` overrides.

Section and key names follow RLinf where one exists (runner.logger.log_path, env, algorithm),
so recipes read familiarly to its users; unknown keys are an error, not a silent no-op.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlfleet.algorithms.dagger import DAggerConfig
from rlfleet.algorithms.estimators import episode_schedule
from rlfleet.algorithms.ppo import PPOConfig
from rlfleet.envs.api import EVAL_SPLITS, TEST_SEED_BASE, VALIDATION_SEED_BASE, EnvConfig
from rlfleet.envs.registry import (
    check_env_name,
    env_config_class,
    family_configs,
    recorded_env_settings,
    require_env_extra,
)
from rlfleet.policies.registry import check_policy_config, policy_classes
from rlfleet.telemetry.trackers import check_backends, logger_backends

log = logging.getLogger(__name__)


@dataclass
class LoggerConfig:
    log_path: str = "runs/${runner.experiment_name}"
    tensorboard: bool = True  # false: drop tensorboard from logger_backends
    # Experiment trackers (RLinf's key), any of tensorboard, wandb, swanlab, trackio: see docs/tracking.md
    logger_backends: list[str] = field(default_factory=lambda: ["tensorboard"])
    project_name: str = "rlfleet"  # the W&B / SwanLab / trackio project; the run is runner.experiment_name


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
    num_workers: int = 2  # env worker subprocesses per actor (0: the actor steps its envs itself)
    pipeline_stage_num: int = 2  # env groups that step in turn (double buffering)
    rollout_len: int = 32  # T: steps per trajectory segment
    send_queue_size: int = 4  # segments buffered before the actor waits for the learner
    transport: str = "shm"  # shm (same host) | zmq | grpc
    failover: InferenceFailoverConfig = field(default_factory=InferenceFailoverConfig)
    max_restarts: int = 3  # local mode: restarts of a crashed actor in a burst (per actor; a token bucket)
    restart_backoff_s: float = 2.0  # local mode: wait before the first restart, doubled each time
    restart_refill_s: float = 600.0  # local mode: one restart earned back per this many seconds (0: never)


@dataclass
class InferenceConfig:
    host: str = "127.0.0.1"
    grpc_port: int = 0  # 0: any free port
    zmq_port: int = 0
    max_batch: int = 256  # rows
    # After a batch's first request, wait this long for more (0: take what has arrived). Requests
    # that arrive while the policy runs join the next batch anyway, so under load batches grow
    # without a wait; a wait only delays the actors when few envs are in flight.
    max_wait_ms: float = 0.0
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
    # samples per update, each a chunk of up to env.chunk_size env steps (fewer where an episode
    # ends mid-chunk: env steps count the substeps simulated). Exactly this many: whole segments,
    # then env columns of the last one, the rest carried to the next update (rounded up to whole
    # columns of T steps, and whole GRPO groups)
    batch_samples: int = 4096
    ingest_queue_size: int = 16  # segments
    # pace: actors start a segment only when the learner could train it within
    # algorithm.max_policy_lag (credit-based flow control, rlfleet.learner.pacing); drop: actors run
    # free and the trainer masks rows older than that (counted: train/dropped_samples, masked_env_steps)
    flow_control: str = "pace"
    reward_scale: float = 1.0
    device: str = "cpu"
    weight_chunk_bytes: int = 4 * 1024 * 1024
    consume_only: bool = False  # benchmarks: take segments but skip the PPO update
    distributed: DistributedConfig = field(default_factory=DistributedConfig)  # under torchrun

    def __post_init__(self) -> None:
        if self.flow_control not in FLOW_CONTROL:
            raise ValueError(
                f"learner.flow_control must be one of {', '.join(FLOW_CONTROL)}, got {self.flow_control!r}"
            )


FLOW_CONTROL = ("pace", "drop")


@dataclass
class VideoConfig:
    """Eval video settings (RLinf's key names), read by `rlfleet.eval.video.EpisodeRecorder`."""

    save_video: bool = False
    video_base_dir: str = "videos"  # relative paths are resolved against the recorder's `root`
    fps: int = 20
    info_overlay: bool = True  # task, step, cumulative reward and success drawn on every frame
    max_videos_per_task: int = 1
    tensorboard: bool = False  # periodic evaluation during RL also logs the videos to TensorBoard (eval/video/<task>)


@dataclass
class EvalConfig:
    episodes_per_task: int = 10
    num_workers: int = 2
    at_end: bool = True
    before: bool = False  # also evaluate the starting policy, for a before/after table
    # Which held-out split evaluations play: "test" (what results report) or "validation" (where
    # every choice made by looking at success is made): rlfleet.envs.api.EVAL_SPLITS.
    split: str = "test"
    seed: int = TEST_SEED_BASE  # test episode seeds start here: held out from training and demos (eval_seed_range)
    validation_seed: int = VALIDATION_SEED_BASE  # validation episode seeds start here, apart from the test ones
    video_cfg: VideoConfig = field(default_factory=VideoConfig)  # MP4s of eval episodes (RLinf's names)
    # Periodic evaluation during RL on the same held-out seeds, written to TensorBoard as eval/*
    # (success curves for every run); 0 turns each trigger off, both set: whichever comes first.
    every_updates: int = 0
    every_seconds: float = 0.0
    periodic_episodes_per_task: int = 0  # 0: episodes_per_task


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
    # The env.task string the demos are collected on (empty: env.task): RL
    # can then train on every layout (RoboTwin split `any`) while the demos come from the
    # expert-solvable train split.
    task: str = ""
    # LeRobot datasets (`demos.path` or `rlfleet sft --demos`: a folder with meta/info.json or
    # hf://datasets/ORG/NAME): rlfleet key (states, actions, main_images, wrist_images, rewards,
    # success) -> the dataset's feature name, or a list of names concatenated (docs/datasets.md)
    features: dict[str, Any] = field(default_factory=dict)


@dataclass
class SFTConfig:
    """Behaviour cloning (`rlfleet sft`)."""

    steps: int = 2000  # optimiser steps
    batch_size: int = 64
    lr: float = 3e-4
    weight_decay: float = 1e-4
    max_grad_norm: float = 1.0
    shift_augment: int = 2  # random image shift in pixels (0: off); helps a small CNN generalise
    # Train without the demos' no-op frames (no arm motion, gripper command unchanged: a waypoint
    # expert waiting for the arm), which teach the policy to stop at waypoints; needs the env to
    # declare its gripper action dims (GRIPPER_ACTION_DIMS). docs/vla.md "No-op frames".
    drop_noop_frames: bool = False
    eval_every: int = 0  # steps between evaluations in the simulator (0: none during training)
    eval_episodes_per_task: int = 5
    seed: int = 0
    threads: int = 2
    device: str = "cpu"  # where the policy trains (cuda on a GPU host); the checkpoint is saved from the CPU


@dataclass
class ClusterConfig:
    """Where roles run when `rlfleet train` spawns them together (see rlfleet.runs.placement).

    Empty `component_placement`: one learner rank, one inference server, `actor.num_actors`
    actors. On a host without CUDA the device indices are process slots (`cpu_slots`, 0: the
    number of CPU cores)."""

    component_placement: dict[str, Any] = field(default_factory=dict)
    cpu_slots: int = 0


@dataclass
class RunConfig:
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    # The env training plays and the env evaluation plays, each typed by the env's own settings
    # class (`rlfleet.envs.registry.env_config_class`; load_config picks it from env.name).
    # `eval_env` defaults to the train env's settings (each key `${env.KEY}`), with the recipe's
    # overrides (held-out tasks: eval_env.task); evaluation applies the split's held-out form
    # (`EnvConfig.held_out`, rlfleet.eval.splits.eval_env_config).
    env: EnvConfig = field(default_factory=EnvConfig)
    eval_env: EnvConfig = field(default_factory=EnvConfig)
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


RECIPE_DIR = resources.files("rlfleet.recipes")
# Keys a recipe file may hold besides config sections: read by the loader, never merged.
_RECIPE_META = ("defaults", "description")


def recipe_names() -> list[str]:
    """The packaged recipes users run (the building blocks in algo/, model/, env/, scale/ are not)."""
    return sorted(p.name[:-5] for p in RECIPE_DIR.iterdir() if p.name.endswith(".yaml"))


class ConfigError(ValueError):
    """A config mistake a user can make (unknown key, bad value, bad recipe): its message is one
    or two lines naming the key, the value, what is allowed and the nearest valid keys."""


def _recipe_path(recipe: str) -> Path:
    path = Path(recipe)
    if path.suffix in (".yaml", ".yml"):
        if path.exists():
            return path
        raise FileNotFoundError(f"recipe file {recipe} does not exist")
    packaged = RECIPE_DIR / f"{recipe}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    near = difflib.get_close_matches(recipe, recipe_names(), n=3, cutoff=0.5)
    hint = f"; nearest: {', '.join(near)}" if near else ""
    raise FileNotFoundError(
        f"unknown recipe {recipe!r}: not a YAML file nor a packaged recipe{hint} (`rlfleet recipes` lists them)"
    )


def _block_path(name: str, parent: Path) -> Path:
    """A `defaults:` entry: a block (`algo/ppo_vla`) or recipe name, next to the including file
    first, then among the packaged recipes."""
    for base in (parent.parent, Path(str(RECIPE_DIR))):
        path = base / f"{name}.yaml"
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{parent}: unknown entry {name!r} in defaults (no {name}.yaml next to it or in {RECIPE_DIR})"
    )


def recipe_files(recipe: str) -> list[Path]:
    """The files a recipe is merged from, in order: its `defaults:` (recursively, depth first)
    then the recipe itself, as Hydra's defaults list with `_self_` last."""
    out: list[Path] = []

    def visit(path: Path, stack: tuple[Path, ...]) -> None:
        if path in stack:
            raise ValueError(f"recipe defaults form a cycle: {' -> '.join(p.stem for p in (*stack, path))}")
        defaults = _read_yaml(path).get("defaults") or []
        if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
            raise ValueError(f"{path}: defaults must be a list of block names, got {defaults!r}")
        for name in defaults:
            visit(_block_path(name, path), (*stack, path))
        if path not in out:
            out.append(path)

    visit(_recipe_path(recipe), ())
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = OmegaConf.to_container(OmegaConf.load(path)) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    return data  # type: ignore[return-value]


def recipe_description(recipe: str) -> str:
    """The recipe's one-line `description:` (empty when it has none)."""
    return str(_read_yaml(_recipe_path(recipe)).get("description", "")).strip()


def recipe_blocks(recipe: str) -> list[str]:
    """The building blocks a recipe is composed of (`scale/cpu_vla`, `algo/ppo_vla`, ...)."""
    root = Path(str(RECIPE_DIR))
    out = []
    for path in recipe_files(recipe):
        try:
            out.append(path.relative_to(root).with_suffix("").as_posix())
        except ValueError:
            out.append(str(path))
    return out


def recipe_scale(recipe: str) -> str:
    """ "cpu" or "gpu": what the recipe is sized for, from its `scale/` block ("" without one)."""
    scales = [b.split("/", 1)[1] for b in recipe_blocks(recipe) if b.startswith("scale/")]
    return scales[-1].split("_", 1)[0] if scales else ""


def _recipe_layers(recipe: str) -> list[tuple[str, DictConfig]]:
    layers = []
    packaged = not Path(recipe).suffix and (RECIPE_DIR / f"{recipe}.yaml").is_file()
    # A recipe's runs are named after it (a packaged recipe's name, a YAML file's stem) unless it
    # says otherwise, so two recipes never share a run folder.
    name = recipe if packaged else Path(recipe).stem
    layers.append(("recipe name", OmegaConf.create({"runner": {"experiment_name": name}})))
    for path in recipe_files(recipe):
        body = {k: v for k, v in _read_yaml(path).items() if k not in _RECIPE_META}
        layers.append((f"in {path}", OmegaConf.create(body)))
    return layers


def _env_names(layers: list[tuple[str, DictConfig]]) -> tuple[str, str]:
    """The env names the layers compose to (env.name, eval_env.name; the latter defaults to the
    former), read before the typed merge so the `env` and `eval_env` sections get their family's
    class. A value that is not a plain string is left to the typed merge to refuse."""
    name, eval_name = EnvConfig.name, ""
    for _, layer in layers:
        for section in ("env", "eval_env"):
            node = layer.get(section) if OmegaConf.is_dict(layer) else None
            value = node._get_node("name")._value() if OmegaConf.is_dict(node) and "name" in node else None
            if isinstance(value, str) and not value.startswith("${"):
                if section == "env":
                    name = value
                else:
                    eval_name = value
    return name, eval_name or name


def _settings_of_the_recipes_env_left_out(
    layers: list[tuple[str, DictConfig]], names: tuple[str, str], schema: DictConfig
) -> list[tuple[str, DictConfig]]:
    """An override that runs a recipe on another env (`env.name=remote://...` for the quickstart):
    the settings the recipe's own files give its env's family (the goal marker of a MetaWorld
    block) are left out, with a warning naming them, since the new env has no such keys and an
    override cannot unset one. A key of another family set by an override stays an error."""
    recipe = [(s, layer) for s, layer in layers if not s.startswith("override ")]
    recipe_names = _env_names(recipe)
    out = []
    for source, layer in layers:
        if not source.startswith("override ") and OmegaConf.is_dict(layer):
            for i, section in enumerate(("env", "eval_env")):
                node = layer.get(section)
                if names[i] == recipe_names[i] or not OmegaConf.is_dict(node):
                    continue
                keys = {f.name for f in dataclasses.fields(OmegaConf.get_type(schema[section]))}  # type: ignore[arg-type]
                foreign = [k for k in node if k not in keys]
                if foreign:
                    layer = layer.copy()
                    for key in foreign:
                        layer[section].pop(key)
                    log.warning(
                        "%s.name=%s: left out %s's settings of env %s that it does not take (%s)",
                        section,
                        names[i],
                        source.removeprefix("in "),
                        recipe_names[i],
                        ", ".join(foreign),
                    )
        out.append((source, layer))
    return out


def run_schema(env_name: str = EnvConfig.name, eval_env_name: str = "") -> DictConfig:
    """The run config's schema for these envs: RunConfig with `env` typed by env `env_name`'s
    settings class and `eval_env` by `eval_env_name`'s (default the same), each eval_env key the
    train env has defaulting to `${env.KEY}`. A one-line ValueError for an unknown env name."""
    cfg = OmegaConf.structured(RunConfig)
    train_class, eval_class = env_config_class(env_name), env_config_class(eval_env_name or env_name)
    cfg.env = OmegaConf.structured(train_class)
    cfg.eval_env = OmegaConf.structured(eval_class)
    train_keys = {f.name for f in dataclasses.fields(train_class)}
    for f in dataclasses.fields(eval_class):
        if f.name in train_keys:
            cfg.eval_env[f.name] = f"${{env.{f.name}}}"
    return cfg  # type: ignore[return-value]


def load_config(recipe: str | None, overrides: list[str] | None = None) -> DictConfig:
    """Schema defaults <- recipe (its `defaults:` blocks, then itself) <- `key=value` overrides,
    type-checked; `env` and `eval_env` are typed by their env's settings class, picked from the
    composed env.name (`run_schema`). A mistake raises ConfigError (or FileNotFoundError for a
    missing recipe) with a short message, never an OmegaConf traceback."""
    layers = _recipe_layers(recipe) if recipe else []
    if overrides:
        bad = [o for o in overrides if "=" not in o or o.startswith("=")]
        if bad:
            raise ConfigError(f"overrides must look like key=value, got {bad}")
        for override in overrides:
            try:
                layers.append((f"override {override}", OmegaConf.from_dotlist([override])))
            except (yaml.YAMLError, OmegaConfBaseException) as exc:
                raise ConfigError(
                    f"override {override}: cannot parse the value ({getattr(exc, 'problem', None) or _first_line(exc)})"
                ) from None
    names = _env_names(layers)
    try:
        cfg = run_schema(*names)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    layers = _settings_of_the_recipes_env_left_out(layers, names, cfg)
    for source, layer in layers:
        cfg = _merge(cfg, layer, source, names)
    try:
        OmegaConf.to_container(cfg, resolve=True)  # a bad ${...} interpolation fails now, not mid-run
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{getattr(exc, 'full_key', '') or 'config'}: {_first_line(exc)}") from None
    for section in ("algorithm", "dagger", "learner", "env", "eval_env"):
        try:
            OmegaConf.to_object(cfg[section])  # the section's own checks (its dataclass's __post_init__)
        except ValueError as exc:
            raise ConfigError(f"bad value in {section}: {_first_line(exc)}") from None
    try:
        check_backends(logger_backends(cfg.runner.logger))  # a tracker that is not installed: fail before the run
        for section in ("env", "eval_env"):
            require_env_extra(cfg[section].name)  # a simulator whose extra is not installed: the same
            check_env_name(cfg[section].name)  # a name no process could resolve: one line, before anything starts
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_policy(cfg)
    _check_budget(cfg)
    _check_pacing(cfg)
    if cfg.eval.split not in EVAL_SPLITS:
        raise ConfigError(f"eval.split must be one of {', '.join(EVAL_SPLITS)}, got {cfg.eval.split!r}")
    return cfg


def _check_budget(cfg: DictConfig) -> None:
    """A PPO run whose env-step budget ends before its first update would train nothing and report
    the untrained policy as its result: refused in one line (an only-eval or DAgger run has no update).
    An update takes `learner.batch_samples` samples, one per chunk of up to `env.chunk_size` env
    steps (fewer where an episode ends mid-chunk); a budget under a full chunk per sample is refused."""
    if cfg.runner.only_eval or cfg.dagger.enabled:
        return
    total, batch, chunk = cfg.runner.total_env_steps, cfg.learner.batch_samples, cfg.env.chunk_size
    if batch < 1 or total < batch * chunk:
        raise ConfigError(
            f"runner.total_env_steps={total} is less than one update (up to {batch * chunk} env steps: "
            f"learner.batch_samples={batch} samples of env.chunk_size={chunk}): no update would run"
        )


def _check_pacing(cfg: DictConfig) -> None:
    """With `learner.flow_control: pace` an actor starts only when the learner could train its
    segments within `algorithm.max_policy_lag` updates; one actor's segments (one per pipeline
    stage) larger than max(max_policy_lag, 1) x batch_samples could never all be granted, so the
    actor would wait forever (rlfleet.learner.pacing). Refused in one line, with the ways out."""
    if cfg.learner.flow_control != "pace" or cfg.runner.only_eval or cfg.dagger.enabled:
        return
    try:
        rows = episode_schedule(cfg.algorithm, cfg.env, cfg.actor).segment_len * cfg.actor.num_envs
    except ValueError:
        return  # the schedule's own error comes from the roles, in their words
    lag, batch = cfg.algorithm.max_policy_lag, cfg.learner.batch_samples
    room = max(lag, 1) * batch
    if rows > room:
        raise ConfigError(
            f"one actor's segments hold {rows} samples ({cfg.actor.num_envs} envs x {rows // cfg.actor.num_envs} "
            f"steps), more than the learner may owe within the lag bound (max(algorithm.max_policy_lag, 1) x "
            f"learner.batch_samples = {room}), so flow control could never start them: raise learner.batch_samples "
            f"to at least {-(-rows // max(lag, 1))}, use fewer envs per actor or a shorter actor.rollout_len, or set "
            "learner.flow_control=drop"
        )


def _first_line(exc: BaseException) -> str:
    return (getattr(exc, "msg", None) or str(exc)).strip().splitlines()[0]


def config_keys(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a config (sections and leaves), for suggestions."""
    out = []
    for key in node.keys() if OmegaConf.is_dict(node) else []:
        full = f"{prefix}{key}"
        out.append(full)
        child = node._get_node(key)
        if OmegaConf.is_dict(child) and not _is_free_form(full):
            out += config_keys(child, f"{full}.")
    return out


def _is_free_form(key: str) -> bool:
    free = (
        "policy",
        "cluster.component_placement",
        "env.gym_kwargs",
        "eval_env.gym_kwargs",
        "demos.features",
    )
    return key in free


def _unknown_key_message(key: str, known: list[str], source: str) -> str:
    parent, leaf = key.rsplit(".", 1) if "." in key else ("", key)
    siblings = [k.rsplit(".", 1)[-1] for k in known if (k.rsplit(".", 1)[0] if "." in k else "") == parent]
    # a misspelt key in its own section first, then the same name in another section (actor.max_batch)
    near = [f"{parent}.{n}" if parent else n for n in difflib.get_close_matches(leaf, siblings, n=3, cutoff=0.6)]
    near += [k for k in difflib.get_close_matches(key, known, n=3, cutoff=0.8) if k not in near]
    near += [k for k in known if k.rsplit(".", 1)[-1] == leaf and k not in near]
    hint = f"; did you mean {' or '.join(near[:3])}?" if near else ""
    return (
        f"unknown config key {key} ({source}){hint}\n"
        f"  keys{' under ' + parent if parent else ''}: {', '.join(siblings)}"
    )


# Keys a release renamed: the old name gets one line saying the new one (and what it counts).
_RENAMED = {
    "learner.batch_env_steps": "learner.batch_samples: it counts samples (chunks of env.chunk_size "
    "env steps) per update, not env steps",
    "eval.task": "eval_env.task: the env evaluation plays is its own section, eval_env (the train "
    "env's settings unless set)",
}

# Keys the learner used to write into the config: what it learns at start (the env's dimensions,
# the policy's outputs, a resume's env steps) now travels as the run spec (rlfleet.wire.run_spec).
_REMOVED = {
    "model_dims": "the learner sends the env's and policy's dimensions as the run spec (run_spec.json)",
    "runner.resumed_from_env_steps": "a resumed learner sends its checkpoint's env steps in the run spec "
    "(run_spec.json)",
}


def _removed_key(key: str) -> str | None:
    return next((old for old in _REMOVED if key == old or key.startswith(old + ".")), None)


def _env_key_message(cfg: DictConfig, key: str, source: str, name: str) -> str:
    """One line for a key the `env` or `eval_env` section's settings class (that of env `name`)
    lacks: the env, the family the key belongs to (or the nearest key), and the class's keys."""
    section, leaf = key.split(".", 1)
    keys = [f.name for f in dataclasses.fields(OmegaConf.get_type(cfg[section]))]  # type: ignore[arg-type]
    owners = [fam for fam, cls in family_configs().items() if leaf in {f.name for f in dataclasses.fields(cls)}]
    near = difflib.get_close_matches(leaf, keys, n=2, cutoff=0.6)
    if owners:
        hint = f" (a setting of env {' and '.join(owners)})"
    else:
        hint = f" (did you mean {' or '.join(f'{section}.{n}' for n in near)}?)" if near else ""
    return f"{key} is not a setting of env {name}{hint} ({source}); its keys: {', '.join(keys)}"


_CONVERT = re.compile(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", re.S)


def _merge(cfg: DictConfig, layer: DictConfig, source: str, env_names: tuple[str, str]) -> DictConfig:
    """`layer` merged onto `cfg`; a mistake is a ConfigError naming the key and `source`
    (`env_names`: the envs whose settings classes type `env` and `eval_env`)."""
    try:
        return OmegaConf.merge(cfg, layer)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        if isinstance(exc, KeyError):  # ConfigKeyError: a key the schema does not have
            if key in _RENAMED:
                raise ConfigError(f"{key} was renamed to {_RENAMED[key]} ({source})") from None
            if (old := _removed_key(key)) is not None:
                raise ConfigError(f"{old} is no longer a config key: {_REMOVED[old]} ({source})") from None
            if key.split(".", 1)[0] in ("env", "eval_env") and key.count(".") == 1:
                name = env_names[0] if key.startswith("env.") else env_names[1]
                raise ConfigError(_env_key_message(cfg, key, source, name)) from None
            raise ConfigError(_unknown_key_message(key, config_keys(cfg), source)) from None
        if not key and source.startswith("override "):
            key = source.split(" ", 1)[1].split("=", 1)[0]
        msg = _first_line(exc)
        m = _CONVERT.match(msg)
        if m:
            value, expected = m.group(1), m.group(3).lower().replace("integer", "an int").replace("float", "a float")
            expected = expected if expected.startswith("a") else f"a {expected}"
            msg = (
                f"expected {expected}, got {value!r}"
                if not value.startswith("{")
                else f"{key} is {expected}, not a section"
            )
        elif msg.startswith("Merge error"):
            msg = f"{key} is a section: set its keys ({key}.KEY=VALUE)"
        elif "Incompatible value 'None'" in msg:
            msg = "needs a value (this key cannot be null)"
        raise ConfigError(f"bad value for {key or 'config'} ({source}): {msg}") from None


def _check_policy(cfg: DictConfig) -> None:
    """The free-form `policy` section against the chosen policy's own settings."""
    settings = as_dict(cfg.policy)
    name = settings.get("name", "gaussian_mlp")
    try:
        cfg_cls = policy_classes(name)[1]
    except ValueError as exc:  # an unknown name, or a plugin that is not a policy class
        raise ConfigError(f"policy.name: {_first_line(exc)}") from None
    fields = [f.name for f in dataclasses.fields(cfg_cls)]
    try:
        check_policy_config(settings)
        raw = {k: v for k, v in settings.items() if k != "model_path" and (k != "name" or "name" in fields)}
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cfg_cls), raw))  # its __post_init__
    except OmegaConfBaseException as exc:
        key = f"policy.{getattr(exc, 'full_key', '')}"
        if isinstance(exc, KeyError):
            near = difflib.get_close_matches(key.split(".", 1)[1], fields + ["model_path"], n=3, cutoff=0.5)
            hint = f"; did you mean {' or '.join('policy.' + n for n in near)}?" if near else ""
            raise ConfigError(
                f"unknown config key {key} for policy {name}{hint}\n"
                f"  keys of {name}: {', '.join(fields + ['model_path'])}"
            ) from None
        field_type = {f.name: f.type for f in dataclasses.fields(cfg_cls)}.get(key.split(".")[1], "?")
        value = settings.get(key.split(".")[1])
        raise ConfigError(f"bad value for {key} (policy {name}): expected {field_type}, got {value!r}") from None
    except ValueError as exc:  # the policy's own checks (its settings dataclass's __post_init__)
        raise ConfigError(f"bad value in policy ({name}): {_first_line(exc)}") from None
    if settings.get("wrist_camera") and not cfg.env.get("wrist_camera", False):
        raise ConfigError("policy.wrist_camera reads wrist_images: set env.wrist_camera=true too")


def config_from_yaml(text: str) -> DictConfig:
    """Rebuild a run config sent by the learner (the source of truth for remote roles), or a run
    folder's config.yaml, its `env` and `eval_env` typed by their env's settings class as
    load_config types them. A config.yaml written before each env owned its settings loads too:
    other families' keys at their defaults are dropped and `eval.task` becomes `eval_env.task`."""
    data = OmegaConf.to_container(OmegaConf.create(text))
    if isinstance(data, dict):
        _upgrade_recorded(data)
    layer = OmegaConf.create(data)
    return OmegaConf.merge(run_schema(*_env_names([("yaml", layer)])), layer)  # type: ignore[arg-type, return-value]


def _upgrade_recorded(data: dict[str, Any]) -> None:
    """A recorded run config of an earlier layout in today's (see config_from_yaml). Keys the
    learner used to write into it before the run spec (`_REMOVED`) are dropped."""
    data.pop("model_dims", None)
    if isinstance(data.get("runner"), dict):
        data["runner"].pop("resumed_from_env_steps", None)
    evaluation = data.get("eval")
    if isinstance(evaluation, dict) and "task" in evaluation:
        task = evaluation.pop("task")
        if task:
            data.setdefault("eval_env", {}).setdefault("task", task)
    for section in ("env", "eval_env"):
        settings = data.get(section)
        if isinstance(settings, dict) and isinstance(settings.get("name", EnvConfig.name), str):
            try:
                data[section] = recorded_env_settings(settings)
            except ValueError:  # an env name no process here resolves: left for the merge to refuse
                pass


def policy_settings(cfg: DictConfig) -> dict[str, Any]:
    """The run's policy section without `model_path` (what builds a fresh policy of the same kind)."""
    return {k: v for k, v in as_dict(cfg.policy).items() if k != "model_path"}


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def as_dict(section: Any) -> dict[str, Any]:
    return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
