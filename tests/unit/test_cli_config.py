"""`rlfleet config` and `rlfleet recipes`: the resolved config, and config mistakes as one or two
lines (the key, the value, what is allowed, the nearest keys) with a non-zero exit."""

import logging
import os
import subprocess
import sys

import pytest
import yaml

from rlfleet.cli import build_parser, main, parse_command_line
from rlfleet.config import load_config, recipe_description, recipe_names, recipe_scale, to_yaml


def test_config_prints_the_resolved_config_with_overrides(capsys):
    assert main(["config", "metaworld_reach_ppo", "actor.num_envs=8", "runner.experiment_name=x"]) == 0
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out)
    assert cfg["actor"]["num_envs"] == 8
    assert cfg["runner"]["logger"]["log_path"] == "runs/x"  # interpolations resolved
    assert cfg["algorithm"]["update_epochs"] == 5  # from the recipe's algo/ppo_mlp block
    assert out == to_yaml(load_config("metaworld_reach_ppo", ["actor.num_envs=8", "runner.experiment_name=x"]))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["runner.nosuchkey=1"],
            ["unknown config key runner.nosuchkey", "runner.nosuchkey=1", "keys under runner: experiment_name"],
        ),
        (["actor.num_env=3"], ["unknown config key actor.num_env", "did you mean actor.num_envs?"]),
        (["actor.max_batch=3"], ["did you mean inference.max_batch?"]),
        (["nosuch=1"], ["unknown config key nosuch", "keys: runner, env, eval_env, policy"]),
        (["actor.num_envs=abc"], ["bad value for actor.num_envs", "expected an int, got 'abc'"]),
        (["algorithm.lr=fast"], ["bad value for algorithm.lr", "expected a float, got 'fast'"]),
        (["runner.resume=maybe"], ["bad value for runner.resume", "'maybe'"]),
        (["actor.num_envs="], ["bad value for actor.num_envs", "needs a value"]),
        (["runner=1"], ["runner is a section"]),
        (["actor.num_envs.x=1"], ["actor.num_envs is an int, not a section"]),
        (["policy.hidden_sizes=[1"], ["override policy.hidden_sizes=[1: cannot parse the value"]),
        (["policy.hidden_sizes=abc"], ["bad value for policy.hidden_sizes", "expected list[int], got 'abc'"]),
        (
            ["policy.hiden_sizes=[1]"],
            [
                "unknown config key policy.hiden_sizes for policy gaussian_mlp",
                "did you mean policy.hidden_sizes?",
                "keys of gaussian_mlp: name",
            ],
        ),
        (["policy.name=nope"], ["unknown policy 'nope'", "tiny_oft"]),
        (["runner.seed=${nope}"], ["runner.seed", "'nope' not found"]),
        (["actor.num_envs"], ["overrides must look like key=value"]),
        (["cluster.component_placement.actor=0-9999"], ["device 9999"]),
        (["algorithm.adv_type=foo"], ["bad value in algorithm: adv_type must be 'gae' or 'grpo', got 'foo'"]),
        (["algorithm.clip_ratio_low=2"], ["bad value in algorithm: clip_ratio_low must be in [0, 1)"]),
        (["dagger.beta0=5"], ["bad value in dagger", "beta0 must be in [0, 1]"]),
    ],
)
def test_config_mistakes_are_short_messages(caplog, capsys, args, expected):
    with caplog.at_level(logging.ERROR, logger="rlfleet"):
        assert main(["config", "metaworld_reach_ppo", *args]) == 2
    assert capsys.readouterr().out == ""
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    message = record.getMessage()
    assert len(message.splitlines()) <= 2 and record.exc_info is None
    for text in expected:
        assert text in message


def test_a_policy_settings_check_is_one_line(caplog):
    with caplog.at_level(logging.ERROR, logger="rlfleet"):
        assert main(["config", "metaworld_quickstart_tinyoft", "policy.dim=65"]) == 2
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == "bad value in policy (tiny_oft): dim (65) must be divisible by heads (4)"


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        ("metaworld_reach", "nearest: metaworld_reach_ppo"),
        ("missing.yaml", "recipe file missing.yaml does not exist"),
    ],
)
def test_unknown_recipe_is_one_line(caplog, recipe, expected):
    with caplog.at_level(logging.ERROR, logger="rlfleet"):
        assert main(["config", recipe]) == 2
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert expected in record.getMessage() and len(record.getMessage().splitlines()) == 1


def test_mistakes_in_a_recipe_file_name_the_file(caplog, tmp_path):
    bad_yaml = tmp_path / "broken.yaml"
    bad_yaml.write_text("actor:\n  num_envs: [1\n")
    bad_key = tmp_path / "key.yaml"
    bad_key.write_text("defaults:\n  - algo/ppo_vla\nalgorithm:\n  klbeta: 0.1\n")
    with caplog.at_level(logging.ERROR, logger="rlfleet"):
        assert main(["config", str(bad_yaml)]) == 2
        assert main(["config", str(bad_key)]) == 2
    first, second = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"{bad_yaml}:" in first and "not valid YAML" in first
    assert "unknown config key algorithm.klbeta" in second and str(bad_key) in second
    assert "did you mean algorithm.kl_beta?" in second


def test_unknown_key_from_the_command_line_exits_non_zero_without_a_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "config", "metaworld_reach_ppo", "runner.nosuchkey=1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "unknown config key runner.nosuchkey" in lines[0]
    assert "keys under runner:" in lines[1]


def test_recipes_lists_each_recipe_with_its_sizing_and_description(capsys):
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = recipe_names()
    assert [line.split()[0] for line in lines] == names
    for line, name in zip(lines, names):
        scale = line.split()[1]
        assert scale in ("CPU", "GPU")
        assert line.endswith(recipe_description(name)) and len(recipe_description(name)) > 10
    row = dict((line.split()[0], line.split()[1]) for line in lines)
    assert row["metaworld_quickstart_tinyoft"] == "CPU" and row["metaworld_50_ppo_tinyoft"] == "GPU"
    assert row["metaworld_50_ppo_tinyoft_cpu"] == "CPU" and row["robotwin_place_empty_cup_ppo_tinyoft_eval"] == "GPU"


def test_every_recipe_has_a_one_line_description_and_a_scale():
    for name in recipe_names():
        assert recipe_description(name) and "\n" not in recipe_description(name), name
        assert recipe_scale(name) in ("cpu", "gpu"), name
        # the _cpu recipes are laptop-sized, by name and by block
        if name.endswith("_cpu"):
            assert recipe_scale(name) == "cpu", name


def test_overrides_may_follow_the_options():
    """`rlfleet sft RECIPE --demos D --out O sft.steps=500` keeps the override (argparse alone
    stops the positional list at the first option and rejects what follows)."""
    parser = build_parser()
    args = parse_command_line(
        parser, ["sft", "metaworld_reach_ppo", "a=1", "--demos", "d", "--out", "o", "sft.steps=5"]
    )
    assert args.overrides == ["a=1", "sft.steps=5"] and args.demos == "d" and args.out == "o"
    with pytest.raises(SystemExit):
        parse_command_line(parser, ["sft", "metaworld_reach_ppo", "--demos", "d", "--out", "o", "--nope"])
    with pytest.raises(SystemExit):  # a command without overrides takes none
        parse_command_line(parser, ["recipes", "a=1"])
