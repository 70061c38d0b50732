"""Every packaged recipe resolves to exactly the config in tests/unit/data/recipes_resolved.json.

The snapshot was taken from the flat recipe files before they were split into composed blocks
(rlfleet/recipes/{algo,model,env,scale}/); deliberate changes since are in the snapshot and listed
in docs/recipes.md. Regenerate after a deliberate change with
`python tests/unit/data/dump_resolved_recipes.py` and review the diff.
"""

import json
from pathlib import Path

import pytest

from rlfleet.config import as_dict, load_config, recipe_names

SNAPSHOT = json.loads((Path(__file__).parent / "data" / "recipes_resolved.json").read_text())


def test_snapshot_covers_every_recipe():
    assert sorted(SNAPSHOT) == recipe_names()


def _diff(a, b, path=""):
    """Dotted keys where two nested dicts differ (readable failure messages)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}.{k}" if path else k)
        return out
    return [] if a == b else [f"{path}: {a!r} != snapshot {b!r}"]


@pytest.mark.parametrize("name", sorted(SNAPSHOT))
def test_recipe_resolves_to_its_snapshot(name):
    resolved = as_dict(load_config(name))
    # A deliberate change (a recipe, a block, a schema default): rerun
    # `python tests/unit/data/dump_resolved_recipes.py` and review the JSON diff.
    assert _diff(resolved, SNAPSHOT[name]) == [], "resolved config differs from tests/unit/data/recipes_resolved.json"
    # also the types: 1 and 1.0 compare equal above but are different values in a YAML config
    assert json.dumps(resolved, sort_keys=True) == json.dumps(SNAPSHOT[name], sort_keys=True)
