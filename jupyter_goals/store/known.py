"""Which control store this state dir has used, so that a start never takes a lost one for a first start.

A control.db deleted (or moved, or restored to the wrong place) while the server was down used to come
back as an empty database at the next start: every session, Goal, approval and intent gone without a
word. The state dir now remembers, per control URL (its password redacted), when the schema of the store
it used was created (``control_store.json``, 0600). At a start, a remembered store that is not there (no
file; a PostgreSQL schema without tables) or is another one (created at another time) is *lost*: the
server waits, degraded ``control_db_missing``, creates nothing, and says what to do: put the store back
(the waiting server then goes on by itself) or choose to begin again with an empty history
(``jupyter goals doctor --start-over``, which forgets the record). Deleting the whole state dir forgets
it too: that is a first start by anyone's reading.

Everything here blocks (file reads, one read transaction): call it off the event loop.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from jupyter_goals.store.db import Database, StorageUnavailable
from jupyter_goals.store.schema import created_at

FILE = "control_store.json"


def redact(url: str) -> str:
    """``url`` without its password (the key under which a store is remembered, and how it is shown)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def _key(url: str) -> str:
    """How a store is remembered: a SQLite file by its absolute path, a server's database by its URL
    without the password."""
    if url.startswith("sqlite:///"):
        return "sqlite:///" + os.path.abspath(url.removeprefix("sqlite:///"))
    return redact(url)


def _read(state_dir: Path) -> dict[str, float]:
    try:
        data = json.loads((state_dir / FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # unreadable: nothing is known (the store's own checks still hold)
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(state_dir: Path, data: dict[str, float]) -> None:
    """Atomically (a temp file renamed over it, both fsynced), readable by the owner only."""
    fd, tmp = tempfile.mkstemp(prefix=FILE, dir=state_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, state_dir / FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(state_dir)


def remembered(state_dir: Path, url: str) -> float | None:
    """When the schema of the control store this state dir used at ``url`` was created; None: none known."""
    return _read(state_dir).get(_key(url))


def remember(state_dir: Path, url: str, created: float) -> None:
    """Record the store a start has migrated (written only when it changed)."""
    data = _read(state_dir)
    if data.get(_key(url)) != created:
        data[_key(url)] = created
        _write(state_dir, data)


def forget(state_dir: Path, url: str) -> bool:
    """The person's choice to begin again with an empty history at ``url``; False: nothing was remembered."""
    data = _read(state_dir)
    if data.pop(_key(url), None) is None:
        return False
    _write(state_dir, data)
    return True


@dataclass(frozen=True)
class Lost:
    message: str  # what happened
    action: str  # what to do


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def lost(state_dir: Path, db: Database) -> Lost | None:
    """Whether the control store at ``db.url`` is gone or another one than this state dir used. Never
    creates a SQLite file. An unreachable store is not lost (its migration says why and is retried)."""
    created = remembered(state_dir, db.url)
    if created is None:
        return None
    where = db.path if db.path is not None else redact(db.url)
    action = (f"Put the control store back at {where} (from where it was moved, or a backup): the server goes on by "
              "itself within seconds. Or, to begin again with an empty history, run `jupyter goals doctor "
              "--start-over`.")
    known = f"this state dir's control store (created {_when(created)})"
    if db.path is not None and not os.path.exists(db.path):
        return Lost(f"{db.path} is gone: it was {known}. An empty one is not created in its place, so that no "
                    "history is lost unnoticed; work waits until it is back.", action)
    was, db.create = db.create, False  # a file that goes away meanwhile is not made again, empty, by this look
    try:
        now = db.transact(created_at, write=False)
    except StorageUnavailable:
        return None
    finally:
        db.create = was
    if now is None:
        return Lost(f"{where} holds no records: it was {known}, now it is empty (emptied, dropped, or replaced by "
                    "an empty file). Nothing is written to it; work waits until the store is back.", action)
    if now != created:
        return Lost(f"{where} is another control store (created {_when(now)}), not {known}. Nothing is written to "
                    "it; work waits until the right one is back.",
                    f"Put this state dir's control store back at {where}: the server goes on by itself within "
                    "seconds. Or, to use the one there now instead, run `jupyter goals doctor --start-over`.")
    return None
