"""Write every packaged recipe's fully resolved config (as `rlfleet.config.load_config` gives it)
to recipes_resolved.json next to this file.

tests/unit/test_recipes_resolved.py checks each recipe still resolves to exactly this snapshot, so
a refactor of the recipe files cannot change a run by accident. After a deliberate change to a
recipe or a schema default, rerun this and review the JSON diff:

    python tests/unit/data/dump_resolved_recipes.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlfleet.config import as_dict, load_config, recipe_names

SNAPSHOT = Path(__file__).with_name("recipes_resolved.json")


def resolved_recipes() -> dict[str, Any]:
    return {name: as_dict(load_config(name)) for name in recipe_names()}


def main() -> None:
    SNAPSHOT.write_text(json.dumps(resolved_recipes(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT} ({len(resolved_recipes())} recipes)")


if __name__ == "__main__":
    main()
