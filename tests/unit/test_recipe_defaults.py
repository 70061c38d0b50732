"""One place per default: a recipe file (a recipe or a block under rlfleet/recipes/) sets a key
only to change it. A value equal to what the key already holds where the file is merged (the
schema default, rlfleet/config.py's dataclasses, or an earlier block) is a second home for that
default, which drifts when the default changes: the test names it.

The free-form `policy` section is left out: a run's config records only the policy keys a recipe
states (the policy's own config class fills the rest when the policy is built).

A block merged into several recipes is flagged only when it restates the value in every one of
them (in some, it may override an earlier block). ALLOWED lists the few restatements kept on
purpose, each with its reason.

The other way a line holds no value: a block key that a later file (a later block, or the recipe)
sets again in every recipe using the block never reaches a resolved config, e.g. an `algorithm`
key in a scale/ block that the algo/ block listed after it sets too. Such a line is a default
that only looks like one, and is flagged as well (policy keys included: they merge key by key).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import rlfleet.config as config
from rlfleet.config import _env_names, _is_free_form, _recipe_layers, recipe_names, run_schema

# (file relative to rlfleet/recipes, dotted key): why the file states the default anyway.
# An env block names the simulator it configures, even the schema's default one.
ALLOWED: dict[tuple[str, str], str] = {
    ("env/metaworld_easy5.yaml", "env.name"): "an env block names its simulator",
    ("env/metaworld_mt50.yaml", "env.name"): "an env block names its simulator",
    ("env/metaworld_state.yaml", "env.name"): "an env block names its simulator",
}


def _leaves(node: Any, prefix: str = "", policy: bool = False) -> dict[str, Any]:
    """Dotted leaf keys of a recipe layer (free-form sections and lists are one value; `policy`,
    left out unless asked for, by its keys)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        full = f"{prefix}{key}"
        if full == "policy" and not policy:
            continue
        if isinstance(value, dict) and value and (full == "policy" or not _is_free_form(full)):
            out.update(_leaves(value, f"{full}.", policy))
        else:
            out[full] = value
    return out


_MISSING = object()


def _value_at(cfg: dict[str, Any], key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # 1 and 1.0 differ in YAML


def restated_defaults() -> dict[tuple[str, str], str]:
    """(file, key) -> the value it restates, for every file key that restates in every recipe using it."""
    root = Path(str(config.RECIPE_DIR))
    verdicts: dict[tuple[str, str], list[bool]] = defaultdict(list)
    values: dict[tuple[str, str], Any] = {}
    for recipe in recipe_names():
        layers = _recipe_layers(recipe)
        before = run_schema(*_env_names(layers))
        for source, layer in layers:
            if source.startswith("in "):
                name = Path(source[3:]).relative_to(root).as_posix()
                seen = OmegaConf.to_container(before)
                for key, value in _leaves(OmegaConf.to_container(layer)).items():
                    verdicts[(name, key)].append(_same(_value_at(seen, key), value))
                    values[(name, key)] = value
            before = OmegaConf.merge(before, layer)
    return {fk: repr(values[fk]) for fk, v in verdicts.items() if all(v)}


def _file_layers(recipe: str) -> list[tuple[str, dict[str, Any]]]:
    """(file relative to rlfleet/recipes, its leaves with policy keys) for each file a recipe merges."""
    root = Path(str(config.RECIPE_DIR))
    out = []
    for source, layer in _recipe_layers(recipe):
        if source.startswith("in "):
            name = Path(source[3:]).relative_to(root).as_posix()
            out.append((name, _leaves(OmegaConf.to_container(layer), policy=True)))
    return out


def overridden_lines() -> dict[tuple[str, str], list[str]]:
    """(file, key) -> the files that set the key again, for every file key that a later file sets
    again in every recipe merging the file (the line never reaches a resolved config)."""
    verdicts: dict[tuple[str, str], list[bool]] = defaultdict(list)
    by: dict[tuple[str, str], set[str]] = defaultdict(set)
    for recipe in recipe_names():
        layers = _file_layers(recipe)
        for i, (name, leaves) in enumerate(layers):
            for key in leaves:
                later = [other for other, theirs in layers[i + 1 :] if key in theirs]
                verdicts[(name, key)].append(bool(later))
                by[(name, key)].update(later)
    return {fk: sorted(by[fk]) for fk, v in verdicts.items() if all(v)}


def test_no_recipe_restates_a_default():
    found = {fk: v for fk, v in restated_defaults().items() if fk not in ALLOWED}
    lines = [f"{file}: {key}: {value}" for (file, key), value in sorted(found.items())]
    assert not lines, "these recipe lines restate the value the key already has there:\n" + "\n".join(lines)


def test_allowed_restatements_are_still_restatements():
    stale = set(ALLOWED) - set(restated_defaults())
    assert not stale, f"ALLOWED lists lines that no longer restate a default: {sorted(stale)}"


def test_no_block_line_is_overridden_in_every_recipe():
    found = overridden_lines()
    lines = [f"{file}: {key}: set again in {', '.join(by)}" for (file, key), by in sorted(found.items())]
    assert not lines, "these recipe lines never reach a resolved config:\n" + "\n".join(lines)


def test_a_restated_default_is_found(tmp_path, monkeypatch):
    """The check itself: a block restating the schema's actor.num_workers is named, one that
    changes it is not."""
    (tmp_path / "scale").mkdir()
    (tmp_path / "scale" / "mine.yaml").write_text("actor:\n  num_workers: 2\n  num_envs: 3\n")
    (tmp_path / "mine.yaml").write_text("defaults: [scale/mine]\n")
    monkeypatch.setattr(config, "RECIPE_DIR", tmp_path)
    assert restated_defaults() == {("scale/mine.yaml", "actor.num_workers"): "2"}


def test_an_overridden_block_line_is_found(tmp_path, monkeypatch):
    """The check itself: a scale block's algorithm key that the algo block after it sets again in
    every recipe is named; one that only some recipes set again is not, nor a policy key."""
    for folder in ("scale", "algo"):
        (tmp_path / folder).mkdir()
    (tmp_path / "scale" / "mine.yaml").write_text("algorithm:\n  lr: 0.5\n  gamma: 0.5\npolicy:\n  a: 1\n")
    (tmp_path / "algo" / "mine.yaml").write_text("algorithm:\n  lr: 0.25\n")
    (tmp_path / "one.yaml").write_text("defaults: [scale/mine, algo/mine]\n")
    (tmp_path / "two.yaml").write_text("defaults: [scale/mine, algo/mine]\nalgorithm:\n  gamma: 0.25\n")
    monkeypatch.setattr(config, "RECIPE_DIR", tmp_path)
    assert overridden_lines() == {("scale/mine.yaml", "algorithm.lr"): ["algo/mine.yaml"]}
