"""Name -> factory lookup for simulators, so configs pick a simulator by `EnvConfig.name`.

`EnvConfig.name` may be a built-in name (`metaworld`, `robotwin`, `calvin`), a scheme
(`remote://HOST:PORT`, `gym:<gymnasium id>`), a `package.module:factory` path, or a name an
installed package publishes in the `rlfleet.envs` entry-point group (see docs/simulators.md).
Names resolve from the string alone (`rlfleet.envs.plugins`), so every process of a run finds the same
env. Built-ins are import paths resolved lazily: importing `rlfleet.envs` stays cheap (no
mujoco/metaworld/pybullet import) for processes that never step an env.

A factory is any callable (cfg, num_envs, env_offset) -> ChunkedEnv, usually the env class.
Capabilities are declared on it: `CHAIN_LENGTH` > 0 marks a chained-instruction env (CALVIN
metrics), `task_groups()` the groups an evaluation report averages over, `CONFIG_CLASS` its
settings (an `EnvConfig` subclass; `env_config_class`).
"""

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

from rlfleet.envs.api import ChunkedEnv, EnvConfig
from rlfleet.envs.plugins import resolve

EnvFactory = Callable[[EnvConfig, int, int], ChunkedEnv]
"""(cfg, num_envs, env_offset) -> ChunkedEnv."""

ENTRY_POINT_GROUP = "rlfleet.envs"
_BUILTIN: dict[str, str] = {
    "metaworld": "rlfleet.envs.metaworld.env:MetaWorldEnv",
    "calvin": "rlfleet.envs.calvin.env:CalvinEnv",  # pybullet playtable, chains of 5 subtasks
    "robotwin": "rlfleet.envs.robotwin.env:RoboTwinEnv",
    "bench": "rlfleet.envs.bench_env:BenchEnv",  # zero-cost steps: the fleet's own overhead
}
# Each family's settings class, from a module that imports no simulator (configs load without it);
# the env class names the same one as its CONFIG_CLASS. Other names use EnvConfig itself.
_BUILTIN_CONFIGS: dict[str, str] = {
    "metaworld": "rlfleet.envs.metaworld.config:MetaWorldEnvConfig",
    "calvin": "rlfleet.envs.calvin.config:CalvinEnvConfig",
    "robotwin": "rlfleet.envs.robotwin.config:RoboTwinEnvConfig",
    "gym": "rlfleet.envs.gymnasium_config:GymEnvConfig",  # every gym:<id>
}
_REGISTRY: dict[str, EnvFactory] = {}
_CONFIGS: dict[str, type[EnvConfig]] = {}  # in-process registrations' settings classes
# In-process registrations' chain lengths (built-ins and plugins declare CHAIN_LENGTH instead)
_CHAIN_LENGTHS: dict[str, int] = {}
_SCHEMES: dict[str, EnvFactory] = {}  # "remote" serves every name "remote://..."
_PREFIXES: dict[str, EnvFactory] = {}  # "gym" serves every name "gym:..."


# Simulators are extras of the rlfleet package: env name -> (extra, modules it provides)
ENV_EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "metaworld": ("metaworld", ("metaworld", "mujoco")),
    "robotwin": ("robotwin", ("sapien",)),
    "calvin": ("calvin", ("pybullet",)),
    "gym": ("gym", ("gymnasium",)),
}


def require_env_extra(name: str) -> None:
    """A built-in simulator whose extra is not installed: one ValueError line naming the extra."""
    key = name.split("://", 1)[0].split(":", 1)[0]
    if key not in ENV_EXTRAS:
        return
    extra, modules = ENV_EXTRAS[key]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"env.name={name} needs the [{extra}] extra ({', '.join(missing)} not installed): "
            f'pip install "rlfleet[{extra}]"'
        )


def register_env(
    name: str, factory: EnvFactory, chain_length: int = 0, config_class: type[EnvConfig] | None = None
) -> None:
    """Make `factory` available as `EnvConfig.name == name` in this process (tests, notebooks);
    re-registering a name replaces it. Roles started as other processes do not see it: publish
    a plugin through an entry point or name it `package.module:factory` instead.

    `chain_length` > 0 says an episode is a chain of that many subtasks whose sparse return is
    the number completed in a row (CALVIN's metrics then apply). `config_class`: the env's
    settings, an EnvConfig subclass (default: the factory's CONFIG_CLASS, else EnvConfig).
    """
    if not name:
        raise ValueError("env name must be a non-empty string")
    if chain_length < 0:
        raise ValueError(f"chain_length must be >= 0, got {chain_length}")
    config_class = config_class or getattr(factory, "CONFIG_CLASS", EnvConfig)
    if not (isinstance(config_class, type) and issubclass(config_class, EnvConfig)):
        raise ValueError(f"config_class of env {name} must be an EnvConfig subclass, got {config_class!r}")
    _REGISTRY[name] = factory
    _CHAIN_LENGTHS[name] = chain_length
    _CONFIGS[name] = config_class


def env_config_class(name: str) -> type[EnvConfig]:
    """The settings class of env `name` (its `env` section's keys), without importing a built-in
    simulator: a family's own subclass, EnvConfig for envs that declare none (the bench env, remote
    envs, plugins without CONFIG_CLASS). A one-line ValueError for a name no process could resolve."""
    if name in _CONFIGS:
        return _CONFIGS[name]
    key = name.split(":", 1)[0] if ":" in name and name.split(":", 1)[0] in _PREFIXES else name
    if key in _BUILTIN_CONFIGS:
        return _builtin_config(key)
    if name in _BUILTIN or ("://" in name and name.split("://", 1)[0] in _SCHEMES):
        return EnvConfig
    config_class = getattr(env_factory(name), "CONFIG_CLASS", EnvConfig)  # a plugin says, or not
    if not (isinstance(config_class, type) and issubclass(config_class, EnvConfig)):
        raise ValueError(f"env {name}: CONFIG_CLASS must be an EnvConfig subclass, got {config_class!r}")
    return config_class


def _builtin_config(key: str) -> type[EnvConfig]:
    module, attr = _BUILTIN_CONFIGS[key].split(":")
    return getattr(importlib.import_module(module), attr)


def family_configs() -> dict[str, type[EnvConfig]]:
    """The built-in families' settings classes by env name ("gym" for every gym:<id>), and the
    in-process registrations': where an error about another family's key looks it up."""
    return {**{key: _builtin_config(key) for key in _BUILTIN_CONFIGS}, **_CONFIGS}


def build_env_config(settings: Mapping[str, Any] | EnvConfig) -> EnvConfig:
    """An `env` section (a mapping of its settings, e.g. `as_dict(cfg.env)`) as its env's settings
    class (`env_config_class(settings["name"])`): the one way code turns a section into an
    EnvConfig. A key of another family is a one-line ValueError naming the env and its keys."""
    name = str(settings.name if isinstance(settings, EnvConfig) else settings.get("name", EnvConfig.name))
    config_class = env_config_class(name)
    keys = [f.name for f in dataclasses.fields(config_class)]
    if type(settings) is config_class:
        return settings
    if isinstance(settings, EnvConfig):  # another class's keys count only where set
        given = settings
        settings = {
            f.name: getattr(given, f.name)
            for f in dataclasses.fields(given)
            if f.name in keys or getattr(given, f.name) != _default(f)
        }
    unknown = [k for k in settings if k not in keys]
    if unknown:
        raise ValueError(f"env.{unknown[0]} is not a setting of env {name}; its keys: {', '.join(keys)}")
    return config_class(**settings)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def recorded_env_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Env settings recorded before each env owned its settings (a checkpoint's config.json "env",
    a run's config.yaml), which hold every family's keys, at their defaults where unused: without
    another family's keys that hold that family's default (a set one stays, to be refused)."""
    keys = {f.name for f in dataclasses.fields(env_config_class(str(settings.get("name", EnvConfig.name))))}
    defaults: dict[str, Any] = {}
    for config_class in family_configs().values():
        for f in dataclasses.fields(config_class):
            defaults.setdefault(f.name, _default(f))
    return {k: v for k, v in settings.items() if k in keys or k not in defaults or defaults[k] != v}


def recorded_env_config(settings: Mapping[str, Any]) -> EnvConfig:
    """An env a checkpoint recorded (its config.json's "env"), old records included
    (`recorded_env_settings`), as `build_env_config` builds it."""
    return build_env_config(recorded_env_settings(settings))


def env_factory(name: str) -> Any:
    """The factory `make_env` would call for env name `name` (one-line ValueError when unknown)."""
    if "://" in name and name.split("://", 1)[0] in _SCHEMES:
        return _SCHEMES[name.split("://", 1)[0]]
    prefix = name.split(":", 1)[0]
    if ":" in name and prefix in _PREFIXES:
        return _PREFIXES[prefix]
    forms = [f"{s}://..." for s in sorted(_SCHEMES)] + [f"{p}:<id>" for p in sorted(_PREFIXES)]
    return resolve(name, "env", ENTRY_POINT_GROUP, {**_BUILTIN, **_REGISTRY}, forms)


def check_env_name(name: str) -> None:
    """A one-line ValueError for a name no process could resolve, without importing a built-in
    simulator (config loading stays fast); plugin paths are imported to check them."""
    if name in _BUILTIN or name in _REGISTRY or ("://" in name and name.split("://", 1)[0] in _SCHEMES):
        return
    if ":" in name and name.split(":", 1)[0] in _PREFIXES:
        return
    env_factory(name)


def chain_length(name: str) -> int:
    """Subtasks per episode of a chained-instruction env (0: an ordinary env, or an unknown name)."""
    if name in _CHAIN_LENGTHS:
        return _CHAIN_LENGTHS[name]
    try:
        factory = env_factory(name)
    except ValueError:
        return 0
    return int(getattr(factory, "CHAIN_LENGTH", 0) or 0)


def scored_chain_length(name: str, reward_type: str) -> int:
    """`chain_length` where the episode return counts the subtasks done (sparse or dense reward),
    which the chain metrics are computed from; 0 otherwise (e.g. `success_once`)."""
    return chain_length(name) if reward_type in ("success", "dense") else 0


def task_groups(name: str) -> dict[str, list[str]]:
    """Groups of tasks an env declares for evaluation reports (MetaWorld: difficulty levels and
    ML45 held-out); {} when it declares none."""
    try:
        factory = env_factory(name)
    except ValueError:
        return {}
    groups = getattr(factory, "task_groups", None)
    return dict(groups()) if callable(groups) else {}


def check_held_out_splits(cfg: EnvConfig, test_seeds: range, validation_seeds: range) -> None:
    """The env's own check that its validation episodes meet no test or training ones
    (ChunkedEnv.check_held_out_splits; a one-line ValueError)."""
    check = getattr(env_factory(cfg.name), "check_held_out_splits", None)
    if callable(check):
        check(cfg, test_seeds, validation_seeds)


def gripper_action_dims(name: str) -> tuple[int, ...] | None:
    """The absolute gripper dims of an env's actions (see ChunkedEnv.GRIPPER_ACTION_DIMS); None
    when the env does not declare them or is unknown."""
    try:
        factory = env_factory(name)
    except ValueError:
        return None
    dims = getattr(factory, "GRIPPER_ACTION_DIMS", None)
    return tuple(int(d) for d in dims) if dims is not None else None


def demos_revision(name: str) -> int:
    """The env's ChunkedEnv.DEMOS_REVISION; 0 when it declares none or is unknown."""
    try:
        factory = env_factory(name)
    except ValueError:
        return 0
    return int(getattr(factory, "DEMOS_REVISION", 0))


def register_env_scheme(scheme: str, factory: EnvFactory) -> None:
    """Make `factory` build every env named `scheme://...` (it parses the rest of the name itself)."""
    if not scheme.isidentifier():
        raise ValueError(f"env scheme must be a plain word, got {scheme!r}")
    _SCHEMES[scheme] = factory


def registered_envs() -> list[str]:
    """Names `make_env` accepts (schemes as `scheme://...`; plugins as well, see `rlfleet.envs.plugins`)."""
    return (
        sorted({*_BUILTIN, *_REGISTRY}) + sorted(f"{s}://..." for s in _SCHEMES) + sorted(f"{p}:..." for p in _PREFIXES)
    )


def make_env(cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> ChunkedEnv:
    """Build `num_envs` envs of simulator `cfg.name`; `env_offset` is the global index of the first.

    The offset lets several worker processes each hold a slice of one big env batch while still
    getting distinct tasks and seeds.
    """
    require_env_extra(cfg.name)
    factory = env_factory(cfg.name)
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if env_offset < 0:
        raise ValueError(f"env_offset must be >= 0, got {env_offset}")
    return factory(build_env_config(cfg), num_envs, env_offset)  # the env's own settings class


def task_list(env_cfg: EnvConfig) -> list[str]:
    """The distinct tasks of a config, in order (envs are spread over them round-robin)."""
    tasks = getattr(env_factory(env_cfg.name), "config_tasks", lambda cfg: None)(env_cfg)
    if tasks is not None:
        return list(tasks)
    # other envs say themselves (no renderer)
    probe = make_env(dataclasses.replace(build_env_config(env_cfg), image_size=0, wrist_camera=False), 1)
    try:
        return probe.task_list
    finally:
        probe.close()


def _make_remote(cfg: EnvConfig, num_envs: int, env_offset: int) -> ChunkedEnv:
    from rlfleet.envs.remote import RemoteEnv  # the gRPC client stack: only remote:// envs load it

    return RemoteEnv(cfg, num_envs, env_offset=env_offset)


def _make_gym(cfg: EnvConfig, num_envs: int, env_offset: int) -> ChunkedEnv:
    from rlfleet.envs.gymnasium_env import GymEnv  # optional: the [gym] extra

    return GymEnv(cfg, num_envs, env_offset=env_offset)


register_env_scheme("remote", _make_remote)  # any simulator behind EnvService: remote://HOST:PORT
_PREFIXES["gym"] = _make_gym  # any gymnasium env with Box actions: gym:<id> or gym:package.module:Id
