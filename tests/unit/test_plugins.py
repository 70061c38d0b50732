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
