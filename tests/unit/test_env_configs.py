"""Each env family owns its settings class (registered by env name), its held-out form, and the
run config's `env` and `eval_env` sections are typed by it (docs/configuration.md, "Env settings")."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rlfleet.config import ConfigError, as_dict, config_from_yaml, load_config, to_yaml
from rlfleet.envs.api import EnvConfig
from rlfleet.envs.calvin.config import CalvinEnvConfig
from rlfleet.envs.gymnasium_config import GymEnvConfig
from rlfleet.envs.metaworld.config import MetaWorldEnvConfig
from rlfleet.envs.registry import (
    build_env_config,
    env_config_class,
    recorded_env_config,
    register_env,
)
from rlfleet.envs.robotwin.config import RoboTwinEnvConfig
from rlfleet.eval.splits import eval_env_config

FAMILIES = {
    "metaworld": MetaWorldEnvConfig,
    "calvin": CalvinEnvConfig,
    "robotwin": RoboTwinEnvConfig,
    "gym:InvertedPendulum-v5": GymEnvConfig,
    "bench": EnvConfig,
    "remote://127.0.0.1:1": EnvConfig,
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_env_name_has_its_family_class(name):
    assert env_config_class(name) is FAMILIES[name]
    cfg = build_env_config({"name": name, "task": "x"})
    assert type(cfg) is FAMILIES[name] and cfg.task == "x"


def test_family_keys_live_in_their_family_only():
    base = {f.name for f in dataclasses.fields(EnvConfig)}
    own = {cls: {f.name for f in dataclasses.fields(cls)} - base for cls in set(FAMILIES.values())}
    assert own[MetaWorldEnvConfig] == {"goal_marker_size"}
    assert own[CalvinEnvConfig] == {"pool", "subtask_steps", "progress_reward"}
    assert own[RoboTwinEnvConfig] == {"pool", "progress_reward"}
    assert own[GymEnvConfig] == {"success_key", "gym_kwargs", "gym_render_quality"}
    assert own[EnvConfig] == set()


def test_config_modules_import_no_simulator():
    """Configs load on a host without the simulators: the settings modules import none of them."""
    code = (
        "import sys\n"
        "import rlfleet.envs.metaworld.config, rlfleet.envs.calvin.config, rlfleet.envs.robotwin.config\n"
        "import rlfleet.envs.gymnasium_config\n"
        "from rlfleet.config import load_config\n"
        "load_config('metaworld_reach_ppo'); load_config('calvin_d_d_ppo_mlp_cpu')\n"
        "heavy = [m for m in ('mujoco', 'metaworld', 'sapien', 'pybullet', 'gymnasium') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "module, cls",
    [
        ("rlfleet.envs.metaworld.env:MetaWorldEnv", MetaWorldEnvConfig),
        ("rlfleet.envs.calvin.env:CalvinEnv", CalvinEnvConfig),
        ("rlfleet.envs.robotwin.env:RoboTwinEnv", RoboTwinEnvConfig),
        ("rlfleet.envs.gymnasium_env:GymEnv", GymEnvConfig),
    ],
)
def test_env_classes_declare_the_class_the_registry_names(module, cls):
    import importlib

    path, attr = module.split(":")
    needs = {"metaworld": "mujoco", "calvin": "pybullet", "robotwin": "sapien", "gymnasium_env": "gymnasium"}
    pytest.importorskip(needs[path.split(".")[2]])
    assert getattr(importlib.import_module(path), attr).CONFIG_CLASS is cls


def test_a_key_of_another_family_is_one_line_naming_the_env_and_its_keys():
    with pytest.raises(ValueError, match=r"^env.subtask_steps is not a setting of env metaworld; its keys: name, task"):
        build_env_config({"name": "metaworld", "subtask_steps": 3})
    with pytest.raises(ValueError, match="env.goal_marker_size is not a setting of env bench"):
        build_env_config(MetaWorldEnvConfig(name="bench", goal_marker_size=0.1))
    # an env built from a plain EnvConfig gets its family's defaults
    assert MetaWorldEnvConfig.of(EnvConfig(task="reach-v3")) == MetaWorldEnvConfig(task="reach-v3")
    with pytest.raises(ValueError, match="env.pool of env calvin is not a setting of MetaWorldEnvConfig"):
        MetaWorldEnvConfig.of(CalvinEnvConfig(name="calvin"))


def test_family_settings_check_themselves():
    for bad in (
        lambda: MetaWorldEnvConfig(goal_marker_size=-1.0),
        lambda: CalvinEnvConfig(subtask_steps=-1),
        lambda: CalvinEnvConfig(pool="test"),
        lambda: RoboTwinEnvConfig(progress_reward=-0.5),
        lambda: GymEnvConfig(gym_render_quality="best"),
    ):
        with pytest.raises(ValueError, match="must be"):
            bad()
    with pytest.raises(ConfigError, match="bad value in env: goal_marker_size must be >= 0"):
        load_config("metaworld_reach_ppo", ["env.goal_marker_size=-1"])


def test_a_plugin_registers_its_own_settings_class():
    @dataclasses.dataclass
    class WindConfig(EnvConfig):
        gust: float = 0.0

    register_env("h_windy", lambda cfg, n, off: None, config_class=WindConfig)  # type: ignore[arg-type, return-value]
    cfg = build_env_config({"name": "h_windy", "gust": 2.5})
    assert isinstance(cfg, WindConfig) and cfg.gust == 2.5
    assert load_config("metaworld_reach_ppo", ["env.name=h_windy", "env.gust=2.5"]).eval_env.gust == 2.5
    with pytest.raises(ValueError, match="must be an EnvConfig subclass"):
        register_env("h_bad", lambda cfg, n, off: None, config_class=dict)  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize("split, pool", [("test", "eval"), ("validation", "validation")])
def test_held_out_forms(split, pool):
    # seed-keyed envs: a split is its seeds, the settings stay
    for cfg in (MetaWorldEnvConfig(task="reach-v3", goal_marker_size=0.05), GymEnvConfig(name="gym:X"), EnvConfig()):
        assert cfg.held_out(split) == cfg and cfg.held_out(split) is not cfg
    calvin = CalvinEnvConfig(name="calvin", task="D", subtask_steps=120, progress_reward=0.1)
    assert calvin.held_out(split) == dataclasses.replace(calvin, pool=pool, subtask_steps=0)
    robotwin = RoboTwinEnvConfig(name="robotwin", task="click_bell:eval", progress_reward=0.1)
    assert robotwin.held_out(split) == dataclasses.replace(robotwin, pool=pool)
    with pytest.raises(ValueError, match="evaluation split must be one of test, validation"):
        calvin.held_out("train")


def test_config_errors_name_the_family():
    with pytest.raises(ConfigError) as err:
        load_config("metaworld_reach_ppo", ["env.subtask_steps=3"])
    msg = str(err.value)
    assert msg.startswith("env.subtask_steps is not a setting of env metaworld (a setting of env calvin)")
    assert "its keys: name, task," in msg and "goal_marker_size" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match=r"eval_env.goal_marker_size is not a setting of env calvin"):
        load_config("calvin_d_d_ppo_mlp_cpu", ["eval_env.goal_marker_size=0.1"])
    with pytest.raises(
        ConfigError, match=r"env.chunksize is not a setting of env metaworld \(did you mean env.chunk_size"
    ):
        load_config("metaworld_reach_ppo", ["env.chunksize=2"])
    # a recipe's key of the family it switches away from is refused the same way
    with pytest.raises(ConfigError, match="env.pool is not a setting of env metaworld"):
        load_config("calvin_d_d_ppo_mlp_cpu", ["env.name=metaworld", "env.pool=eval"])


def test_old_eval_task_key_says_its_new_name():
    with pytest.raises(ConfigError, match=r"^eval.task was renamed to eval_env.task"):
        load_config("metaworld_reach_ppo", ["eval.task=push-v3"])


def test_eval_env_defaults_to_the_train_env_and_takes_overrides():
    cfg = load_config("metaworld_reach_ppo", ["env.max_episode_steps=77", "env.goal_marker_size=0.05"])
    assert as_dict(cfg.eval_env) == as_dict(cfg.env)
    cfg.env.task = "push-v3"  # an env key set later still reaches evaluation
    assert cfg.eval_env.task == "push-v3"
    cfg = load_config("metaworld_reach_ppo", ["eval_env.task=push-v3", "eval_env.image_size=32"])
    assert (cfg.env.task, cfg.env.image_size) == ("reach-v3", 0)
    assert (cfg.eval_env.task, cfg.eval_env.image_size, cfg.eval_env.max_episode_steps) == ("push-v3", 32, 150)
    # the held-out form is applied when evaluation runs, on top of the section
    calvin = load_config("calvin_abc_d_ppo_tinypi0_cpu", ["env.subtask_steps=100"])
    assert (calvin.env.task, calvin.eval_env.task, calvin.eval_env.subtask_steps) == ("ABC", "D", 100)
    env = eval_env_config(calvin, "validation")
    assert isinstance(env, CalvinEnvConfig) and (env.task, env.pool, env.subtask_steps) == ("D", "validation", 0)


def test_remote_roles_rebuild_both_sections_typed():
    cfg = load_config("calvin_abc_d_ppo_tinypi0_cpu", ["eval_env.max_episode_steps=900"])
    back = config_from_yaml(to_yaml(cfg))
    assert OmegaConf.get_type(back.env) is CalvinEnvConfig and OmegaConf.get_type(back.eval_env) is CalvinEnvConfig
    assert as_dict(back) == as_dict(cfg)
    # a config without an eval_env section evaluates on its train env
    old = config_from_yaml(OmegaConf.to_yaml({k: v for k, v in as_dict(cfg).items() if k != "eval_env"}))
    assert as_dict(old.eval_env) == as_dict(old.env)


def test_recorded_envs_from_before_the_split_still_load():
    """A checkpoint's config.json written when EnvConfig held every family's keys: the other
    families' keys at their defaults are dropped; a set one is still refused."""
    flat = {**FLAT_DEFAULTS, "name": "metaworld", "task": "reach-v3", "goal_marker_size": 0.05}
    assert recorded_env_config(flat) == MetaWorldEnvConfig(task="reach-v3", goal_marker_size=0.05)
    with pytest.raises(ValueError, match="env.subtask_steps is not a setting of env metaworld"):
        recorded_env_config({**flat, "subtask_steps": 100})


@pytest.mark.parametrize(
    "recipe", ["metaworld_45_ppo_tinyoft_cpu", "calvin_abc_d_ppo_tinypi0_cpu", "gym_inverted_pendulum_ppo"]
)
def test_a_run_config_written_before_the_split_still_loads(recipe):
    """A run folder's config.yaml from before (every family's keys in `env`, `eval.task`) loads
    as today's config of the same recipe: resume and `rlfleet eval` of older runs keep working."""
    cfg = load_config(recipe)
    old = as_dict(cfg)
    old["env"] = {**as_dict(cfg.env), **{k: v for k, v in FLAT_DEFAULTS.items() if k not in old["env"]}}
    old["eval"]["task"] = cfg.eval_env.task if cfg.eval_env.task != cfg.env.task else ""
    del old["eval_env"]
    assert as_dict(config_from_yaml(OmegaConf.to_yaml(old))) == as_dict(cfg)


FLAT_DEFAULTS = {  # the family keys EnvConfig held before each env owned its settings
    "goal_marker_size": 0.0,
    "pool": "train",
    "subtask_steps": 0,
    "progress_reward": 0.0,
    "success_key": "",
    "gym_kwargs": {},
    "gym_render_quality": "fast",
}


def test_env_server_overrides_are_the_envs_own_settings():
    from rlfleet.envs.env_server import env_config

    cfg = env_config("metaworld", "reach-v3", ["goal_marker_size=0.05", "max_episode_steps=20"])
    assert cfg == MetaWorldEnvConfig(task="reach-v3", goal_marker_size=0.05, max_episode_steps=20)
    assert isinstance(env_config("calvin", "D", ["subtask_steps=100"]), CalvinEnvConfig)
    with pytest.raises(ValueError, match="subtask_steps"):
        env_config("metaworld", "reach-v3", ["subtask_steps=100"])


def test_the_error_names_the_env_the_recipe_composes_to(tmp_path):
    """The family is picked from the composed env.name, also when one file sets the name and a key."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("env:\n  name: calvin\n  task: D\n  goal_marker_size: 0.1\n")
    with pytest.raises(
        ConfigError, match=r"^env.goal_marker_size is not a setting of env calvin \(a setting of env metaworld\) \(in "
    ):
        load_config(str(recipe))
    recipe.write_text("env:\n  name: calvin\n  task: D\n  subtask_steps: 90\n")
    assert load_config(str(recipe)).env.subtask_steps == 90


def test_eval_against_an_env_server_leaves_the_family_settings_to_the_server():
    """`rlfleet eval CKPT --env-address` of a checkpoint whose env set a family key (the quickstart's
    goal marker, CALVIN's pool): the remote env takes the shared keys, the server owns the rest."""
    from rlfleet.envs.registry import recorded_env_config
    from rlfleet.eval.main import env_on_server

    recorded = {"name": "metaworld", "task": "reach-v3", "goal_marker_size": 0.05, "chunk_size": 4}
    env = env_on_server(recorded, "127.0.0.1:5000")
    cfg = recorded_env_config(env)
    assert cfg.name == "remote://127.0.0.1:5000" and cfg.chunk_size == 4 and "goal_marker_size" not in env
    query = env_on_server({"name": "remote://10.0.0.1:1?timeout=9", "pool": "eval"}, "127.0.0.1:5000")
    assert query == {"name": "remote://127.0.0.1:5000?timeout=9"}


def test_a_recipe_run_on_another_env_leaves_out_its_blocks_family_settings_with_a_warning(caplog):
    """The quickstart's MetaWorld block sets the goal marker; `env.name=remote://...` runs it against
    an env server, which owns its settings: the block's key is left out (a warning names it), while
    the same key given on the command line is still refused."""
    from rlfleet.config import ConfigError, load_config

    cfg = load_config("metaworld_quickstart_tinyoft", ["env.name=remote://127.0.0.1:50070"])
    assert "goal_marker_size" not in cfg.env and cfg.eval_env.name == "remote://127.0.0.1:50070"
    assert "left out" in caplog.text and "goal_marker_size" in caplog.text
    assert load_config("metaworld_quickstart_tinyoft").env.goal_marker_size > 0  # the recipe alone keeps it
    with pytest.raises(ConfigError, match="env.goal_marker_size is not a setting of env remote"):
        load_config("metaworld_reach_ppo", ["env.name=remote://127.0.0.1:50070", "env.goal_marker_size=0.1"])
