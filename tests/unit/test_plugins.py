"""Name resolution for envs and policies (rlfleet.envs.plugins): built-ins, import paths, entry points,
and the one-line error for a name nothing provides."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from rlfleet.envs import plugins
from rlfleet.envs.api import EnvConfig
from rlfleet.envs.registry import chain_length, env_factory, make_env
from rlfleet.policies.registry import make_policy


def _fake_entry_points(monkeypatch, *eps: EntryPoint) -> None:
    monkeypatch.setattr(plugins, "entry_points", lambda group: [ep for ep in eps if ep.group == group])


def test_import_path_names_an_env() -> None:
    with make_env(EnvConfig(name="rlfleet.envs.bench_env:BenchEnv", task="state_dim=3,action_dim=2"), 2) as env:
        assert (env.spec.state_dim, env.spec.action_dim, env.spec.num_envs) == (3, 2, 2)


def test_entry_points_name_envs_and_policies(monkeypatch) -> None:
    _fake_entry_points(
        monkeypatch,
        EntryPoint("cheap", "rlfleet.envs.bench_env:BenchEnv", "rlfleet.envs"),
        EntryPoint("chains", "rlfleet.envs.calvin.env:CalvinEnv", "rlfleet.envs"),
        EntryPoint("mine", "tests_fake_module:Policy", "rlfleet.policies"),
    )
    with make_env(EnvConfig(name="cheap", task="state_dim=4"), 1) as env:
        assert env.spec.state_dim == 4
    if pytest.importorskip("pybullet"):
        assert chain_length("chains") == 5  # a capability the plugin's class declares
    with pytest.raises(ValueError) as err:
        make_policy({"name": "mine"}, 3, 1, 1)
    assert "\n" not in str(err.value) and "entry point 'tests_fake_module:Policy'" in str(err.value)


def test_unknown_names_are_one_line_saying_what_was_looked_up(monkeypatch) -> None:
    _fake_entry_points(monkeypatch, EntryPoint("cheap", "rlfleet.envs.bench_env:BenchEnv", "rlfleet.envs"))
    with pytest.raises(ValueError) as err:
        env_factory("nosuch")
    msg = str(err.value)
    assert "\n" not in msg and "'nosuch'" in msg and "group 'rlfleet.envs'" in msg
    assert "metaworld" in msg and "gym:<id>" in msg and "remote://..." in msg and "entry points: cheap" in msg
    with pytest.raises(ValueError) as err:
        make_policy({"name": "nosuch"}, 3, 1, 1)
    assert "\n" not in str(err.value) and "gaussian_mlp" in str(err.value) and "rlfleet.policies" in str(err.value)
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod'"):
        env_factory("no_such_mod:Env")
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        env_factory("rlfleet.envs.bench_env:Nope")


def test_a_policy_class_must_name_its_settings() -> None:
    with pytest.raises(ValueError, match="config_class"):
        make_policy({"name": "rlfleet.policies.gaussian_mlp:GaussianMLPPolicy"}, 3, 1, 1)


def _toy_policy_module(monkeypatch, settings_cls: type) -> str:
    """A plugin policy class in a module of its own; returns its `module:Class` name."""
    import sys
    import types

    from torch import nn

    class ToyPolicy(nn.Module):
        config_class = settings_cls

        def __init__(self, state_dim, action_dim, chunk_size, cfg):
            super().__init__()
            self.cfg = cfg

    module = types.ModuleType("toy_policy_mod")
    module.ToyPolicy = ToyPolicy
    monkeypatch.setitem(sys.modules, "toy_policy_mod", module)
    return "toy_policy_mod:ToyPolicy"


def test_plugin_settings_recorded_in_config_json_round_trip(monkeypatch, tmp_path) -> None:
    """config.json records a plugin's settings whole but not fields the dataclass computes itself
    (init=False), and `name` although its dataclass has no such field."""
    import dataclasses
    import json

    from rlfleet.policies.checkpoint_io import load_checkpoint, model_config, save_checkpoint_folder

    @dataclasses.dataclass
    class Settings:
        width: int = 4
        tags: list[str] = dataclasses.field(default_factory=lambda: ["a"])
        derived: int = dataclasses.field(init=False, default=0)

        def __post_init__(self):
            self.derived = 2 * self.width

    name = _toy_policy_module(monkeypatch, Settings)
    config = model_config({"name": name, "width": 3}, 2, 1, 1)
    assert config["policy"] == {"name": name, "width": 3, "tags": ["a"]}
    save_checkpoint_folder(tmp_path / "ck", make_policy({"name": name, "width": 3}, 2, 1, 1), config)
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["policy"]["width"] == 3
    policy, _ = load_checkpoint(tmp_path / "ck")
    assert policy.cfg == Settings(width=3)


def test_a_setting_json_cannot_hold_is_a_one_line_error(monkeypatch) -> None:
    import dataclasses
    from pathlib import Path

    from rlfleet.policies.checkpoint_io import model_config

    @dataclasses.dataclass
    class Settings:
        data_dir: Path = Path("/tmp/x")

    name = _toy_policy_module(monkeypatch, Settings)
    with pytest.raises(ValueError) as err:
        model_config({"name": name}, 2, 1, 1)
    assert "\n" not in str(err.value) and "setting 'data_dir'" in str(err.value) and "JSON values" in str(err.value)


def test_sft_with_a_setting_json_cannot_hold_fails_before_training(monkeypatch, tmp_path) -> None:
    import dataclasses
    import sys
    from pathlib import Path

    from rlfleet.config import SFTConfig
    from rlfleet.envs.api import EnvConfig
    from rlfleet.runs import sft
    from rlfleet.runs.collect import collect_env_demos

    @dataclasses.dataclass
    class Settings:
        data_dir: Path = Path("/tmp/x")

    name = _toy_policy_module(monkeypatch, Settings)
    monkeypatch.setattr(sys.modules["toy_policy_mod"].ToyPolicy, "obs_keys", ("states",), raising=False)
    env = EnvConfig(task="reach-v3", max_episode_steps=200)
    collect_env_demos(tmp_path / "demos", env, 1, progress=False)
    monkeypatch.setattr(sft, "train_sft", lambda *a, **k: pytest.fail("trained before the settings were checked"))
    with pytest.raises(ValueError, match="setting 'data_dir'"):
        sft.run_sft(tmp_path / "demos", tmp_path / "out", {"name": name}, env, SFTConfig(steps=1), progress=False)
    assert not (tmp_path / "out").exists()
