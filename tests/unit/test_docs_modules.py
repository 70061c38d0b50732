"""docs/architecture.md's module table names every module of the package (a new module gets a row)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _table_paths() -> set[str]:
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## Modules (one job each)", 1)[1].split("\n## ", 1)[0]
    return {
        m for row in table.splitlines() if row.startswith("| `") for m in re.findall(r"`([^`]+)`", row.split("|")[1])
    }


def test_every_module_has_a_row_in_the_architecture_table():
    listed = _table_paths()
    modules = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "rlfleet").rglob("*.py")
        if "wire/gen" not in p.as_posix()  # generated stubs: one row for the folder
        and (p.name != "__init__.py" or p.parent.name == "rlfleet")  # packages: their modules' rows
    )
    assert len(modules) > 90
    missing = [m for m in modules if m not in listed]
    assert not missing, f"docs/architecture.md's module table lacks: {', '.join(missing)}"
    assert "rlfleet/wire/gen/" in listed


def test_the_table_names_no_module_that_does_not_exist():
    stale = [p for p in _table_paths() if p.startswith("rlfleet/") and not (REPO / p).exists()]
    assert not stale, f"docs/architecture.md names modules that do not exist: {', '.join(stale)}"
