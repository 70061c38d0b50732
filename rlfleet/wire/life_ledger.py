"""An actor life's env-step account as a file (`DIR/CLIENT.LIFE.ledger`): three little-endian int64
(taken, accepted, rejected), rewritten in place by the actor as its counts change. The actor's next
life and the learner at the end of a run (and at resume) read the files of lives that never reported,
so a life killed before its report is still counted; whoever counts one renames it `.reported`.
The actor's own report and the learner's end-of-run sweep can meet on the same file, so a rename
finds it gone when the other side got there first (`mark_reported`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

RECORD = struct.Struct("<qqq")  # env steps taken, accepted, rejected
SUFFIX = ".ledger"


def ledger_path(folder: str | Path, client_id: str, life: int) -> Path:
    return Path(folder) / f"{client_id}.{life:08x}{SUFFIX}"


@dataclass(frozen=True)
class LifeAccount:
    path: Path
    client_id: str
    life: int
    taken: int
    accepted: int
    rejected: int


def read_account(path: Path) -> LifeAccount:
    """One ledger file; ValueError when its name or its 24 bytes do not parse, FileNotFoundError when
    it is gone (counted and renamed by someone else since it was listed)."""
    stem = path.name[: -len(SUFFIX)]
    client_id, sep, life_hex = stem.rpartition(".")
    if not sep or not client_id:
        raise ValueError(f"{path.name}: not CLIENT.LIFE{SUFFIX}")
    try:
        taken, accepted, rejected = RECORD.unpack(path.read_bytes()[: RECORD.size])
        return LifeAccount(path, client_id, int(life_hex, 16), taken, accepted, rejected)
    except FileNotFoundError:
        raise
    except (struct.error, OSError) as exc:
        raise ValueError(f"{path.name}: {exc}") from exc


def mark_reported(path: Path) -> bool:
    """Rename a counted ledger `.reported`; False when it was already gone (the other side, actor or
    learner, counted it between our listing and now; the learner ignores a repeated report)."""
    try:
        path.replace(path.with_suffix(".reported"))
    except FileNotFoundError:
        return False
    return True


def unreported(folder: str | Path, client_id: str = "*") -> list[Path]:
    """The ledger files in `folder` (of one client, or all) that nobody has counted yet."""
    return sorted(Path(folder).glob(f"{client_id}.*{SUFFIX}"))
