"""The run spec (rlfleet.wire.run_spec): round trips through the wire and JSON, one-line refusals
of a bad or absent spec, and the config keys it replaced refused in one line."""

from __future__ import annotations

import json

import pytest

from rlfleet.config import ConfigError, config_from_yaml, load_config
from rlfleet.wire.gen import learner_pb2
from rlfleet.wire.run_spec import RunSpec, RunSpecError, read_run_spec, registered_spec, write_run_spec

SPEC = RunSpec(
    state_dim=39,
    action_dim=4,
    logprob_shape=(8, 4),
    extra_outputs={"noise": (8, 4), "token_ids": (32,)},
    policy={"name": "tiny_oft", "dim": 16, "model_path": "hf://acme/sft@" + "a" * 40},
    resumed_from_env_steps=640,
)


def test_a_spec_comes_back_the_same_through_proto_bytes_and_json(tmp_path):
    wire = learner_pb2.RunSpec.FromString(SPEC.to_proto().SerializeToString())
    assert RunSpec.from_proto(wire) == SPEC
    assert RunSpec.from_json(SPEC.to_json()) == SPEC
    write_run_spec(tmp_path, SPEC)
    assert read_run_spec(tmp_path) == SPEC
    assert read_run_spec(tmp_path / "elsewhere") is None  # a run folder from before the spec
    fresh = RunSpec(3, 2, policy={"name": "gaussian_mlp"})  # no outputs declared, a fresh start
    assert RunSpec.from_proto(fresh.to_proto()) == fresh and fresh.resumed_from_env_steps == 0


def test_its_helpers_say_what_roles_build():
    assert SPEC.model_path.startswith("hf://acme/sft@")
    assert SPEC.fresh_policy_settings() == {"name": "tiny_oft", "dim": 16}
    assert SPEC.extras() == {"noise": ((8, 4), "float32"), "token_ids": ((32,), "float32")}
    assert RunSpec(3, 2, policy={"name": "gaussian_mlp"}).model_path == ""


def test_a_register_reply_without_a_spec_is_refused_in_one_line():
    reply = learner_pb2.RegisterReply(config_yaml="runner: {}\n")
    with pytest.raises(RunSpecError, match=r"^the learner at 127.0.0.1:5 sent no run spec") as info:
        registered_spec(reply, "127.0.0.1:5")
    assert "\n" not in str(info.value)
    reply.run_spec.CopyFrom(SPEC.to_proto())
    assert registered_spec(reply, "127.0.0.1:5") == SPEC


@pytest.mark.parametrize(
    "change, message",
    [
        ({"state_dim": -1}, "state_dim must be >= 0"),
        ({"action_dim": 0}, "action_dim >= 1"),
        ({"action_dim": 2.5}, "action_dim must be an int"),
        ({"logprob_shape": [8, 0]}, "logprob_shape must hold positive ints"),
        ({"logprob_shape": "8"}, "logprob_shape must be a list of sizes"),
        ({"extra_outputs": {"noise": [-1]}}, r"extra_outputs\[noise\] must hold positive ints"),
        ({"extra_outputs": [1]}, "extra_outputs must map names to shapes"),
        ({"policy": {"dim": 16}}, "policy must be a settings mapping with a name"),
        ({"resumed_from_env_steps": -5}, "resumed_from_env_steps must be >= 0"),
        ({"model_dims": {}}, "unknown keys model_dims"),
    ],
)
def test_a_bad_spec_is_refused_in_one_line_naming_the_field(change, message):
    data = {**json.loads(SPEC.to_json()), **change}
    with pytest.raises(RunSpecError, match=message) as info:
        RunSpec.from_json(json.dumps(data), "run_spec.json")
    assert str(info.value).startswith("run_spec.json: ") and "\n" not in str(info.value)


def test_a_spec_that_is_not_json_or_misses_keys_is_refused_in_one_line():
    with pytest.raises(RunSpecError, match=r"^run spec: not valid JSON"):
        RunSpec.from_json("{state_dim: 3")
    with pytest.raises(RunSpecError, match=r"^run spec: missing action_dim, policy$"):
        RunSpec.from_json('{"state_dim": 3}')
    with pytest.raises(RunSpecError, match="expected a mapping, got list"):
        RunSpec.from_json("[]")
    with pytest.raises(RunSpecError, match="no policy settings"):
        RunSpec.from_proto(learner_pb2.RunSpec(state_dim=3, action_dim=2))  # an empty message
    with pytest.raises(RunSpecError, match="policy_json is not valid JSON"):
        RunSpec.from_proto(learner_pb2.RunSpec(state_dim=3, action_dim=2, policy_json="{"))


@pytest.mark.parametrize(
    "override, key",
    [
        ("model_dims.state_dim=3", "model_dims"),
        ("runner.resumed_from_env_steps=640", "runner.resumed_from_env_steps"),
    ],
)
def test_the_keys_the_spec_replaced_are_refused_in_one_line(override, key):
    with pytest.raises(ConfigError) as info:
        load_config("metaworld_reach_ppo", [override])
    assert str(info.value).startswith(f"{key} is no longer a config key: ")
    assert "run spec" in str(info.value) and "\n" not in str(info.value)


def test_a_recipe_file_that_sets_model_dims_is_refused_in_one_line(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("defaults: [metaworld_reach_ppo]\nmodel_dims:\n  state_dim: 39\n")
    with pytest.raises(ConfigError, match=r"^model_dims is no longer a config key: .*\(in .*mine.yaml\)$"):
        load_config(str(recipe))


def test_a_run_folders_config_from_before_the_spec_still_loads():
    """config.yaml files the learner wrote before the run spec hold model_dims and the resume key:
    reading such a run (eval of its checkpoints, a resume) drops them."""
    old = "runner:\n  resumed_from_env_steps: 640\n  seed: 3\nmodel_dims:\n  state_dim: 39\n  action_dim: 4\n"
    cfg = config_from_yaml(old)
    assert cfg.runner.seed == 3 and "model_dims" not in cfg and "resumed_from_env_steps" not in cfg.runner
