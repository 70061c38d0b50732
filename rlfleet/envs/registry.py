"""Name -> factory lookup for simulators, so configs pick a simulator by `EnvConfig.name`.

Factories are registered as callables and the simulator ones import their modules lazily: importing
`rlfleet.envs` stays cheap (no mujoco/metaworld/pybullet import) for processes that never step an env,
such as the learner.
"""

import importlib.util
from collections.abc import Callable

from rlfleet.envs.api import ChunkedEnv, EnvConfig

EnvFactory = Callable[[EnvConfig, int, int], ChunkedEnv]
"""(cfg, num_envs, env_offset) -> ChunkedEnv."""

_REGISTRY: dict[str, EnvFactory] = {}
# Envs whose episode is a chain of instructions scored by how many succeed in a row (CALVIN):
# name -> chain length, for the avg_num_subtasks / success_len_k metrics (rlfleet.chain_metrics)
_CHAIN_LENGTHS: dict[str, int] = {}
_SCHEMES: dict[str, EnvFactory] = {}  # "remote" serves every name "remote://..."


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
        raise ValueError(f"env.name={name} needs the [{extra}] extra ({', '.join(missing)} not installed): "
                         f'pip install "rlfleet[{extra}]"')


def register_env(name: str, factory: EnvFactory, chain_length: int = 0) -> None:
    """Make `factory` available as `EnvConfig.name == name`; re-registering a name replaces it.

    `chain_length` > 0 says an episode is a chain of that many subtasks whose sparse return is
    the number completed in a row (CALVIN's metrics then apply).
    """
    if not name:
        raise ValueError("env name must be a non-empty string")
    if chain_length < 0:
        raise ValueError(f"chain_length must be >= 0, got {chain_length}")
    _REGISTRY[name] = factory
    _CHAIN_LENGTHS[name] = chain_length


def chain_length(name: str) -> int:
    """Subtasks per episode of a chained-instruction env (0: an ordinary env)."""
    return _CHAIN_LENGTHS.get(name, 0)


def scored_chain_length(name: str, reward_type: str) -> int:
    """`chain_length` where the episode return counts the subtasks done (sparse or dense reward),
    which the chain metrics are computed from; 0 otherwise (e.g. `success_once`)."""
    return chain_length(name) if reward_type in ("success", "dense") else 0


def register_env_scheme(scheme: str, factory: EnvFactory) -> None:
    """Make `factory` build every env named `scheme://...` (it parses the rest of the name itself)."""
    if not scheme.isidentifier():
        raise ValueError(f"env scheme must be a plain word, got {scheme!r}")
    _SCHEMES[scheme] = factory


def registered_envs() -> list[str]:
    """Names `make_env` accepts (schemes as `scheme://...`)."""
    return sorted(_REGISTRY) + sorted(f"{s}://..." for s in _SCHEMES)


def make_env(cfg: EnvConfig, num_envs: int, env_offset: int = 0) -> ChunkedEnv:
    """Build `num_envs` envs of simulator `cfg.name`; `env_offset` is the global index of the first.

    The offset lets several worker processes each hold a slice of one big env batch while still
    getting distinct tasks and seeds.
    """
    factory = _REGISTRY.get(cfg.name)
    if factory is None and "://" in cfg.name:
        factory = _SCHEMES.get(cfg.name.split("://", 1)[0])
    if factory is None:
        raise ValueError(f"unknown env name {cfg.name!r}; registered: {', '.join(registered_envs())}")
    require_env_extra(cfg.name)
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if env_offset < 0:
        raise ValueError(f"env_offset must be >= 0, got {env_offset}")
    return factory(cfg, num_envs, env_offset)


def _make_metaworld(cfg: EnvConfig, num_envs: int, env_offset: int) -> ChunkedEnv:
    from rlfleet.envs.metaworld.env import MetaWorldEnv

    return MetaWorldEnv(cfg, num_envs, env_offset=env_offset)


def _make_robotwin(cfg: EnvConfig, num_envs: int, env_offset: int) -> ChunkedEnv:
    from rlfleet.envs.robotwin.env import RoboTwinEnv

    return RoboTwinEnv(cfg, num_envs, env_offset=env_offset, num_total_envs=cfg.fleet_envs or None)


def _make_calvin(cfg: EnvConfig, num_envs: int, env_offset: int) -> ChunkedEnv:
    from rlfleet.envs.calvin.env import CalvinEnv

    return CalvinEnv(cfg, num_envs, env_offset=env_offset)


def _make_remote(cfg: EnvConfig, num_envs: int, env_offset: int) -> ChunkedEnv:
    from rlfleet.envs.remote import RemoteEnv

    return RemoteEnv(cfg, num_envs, env_offset=env_offset)


register_env("metaworld", _make_metaworld)
register_env("calvin", _make_calvin, chain_length=5)  # pybullet playtable, chains of 5 subtasks
register_env("robotwin", _make_robotwin)
register_env_scheme("remote", _make_remote)  # any simulator behind EnvService: remote://HOST:PORT
