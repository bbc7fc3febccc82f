"""What every control.db aggregate shares: time-ordered ids (``new_id``), the JSON encoding (``dumps``,
``digest``), counters, the event log (``emit``: one row per state change, monotonic ``seq``;
``events_after``, ``last_event_seq``) and the ``server_state`` flags (``get_flag``, ``set_flag``).

Functions take a ``Tx`` and run inside the caller's single transaction; each state change writes its event
row in the same transaction (``shared.emit``). Other aggregates are called through their module
(``sessions.set_phase``), never imported by name, so a test's wrapper of a transition
(``tests/faultstore.py``) sees every call. Callers outside ``store/`` use the facade ``control``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any

from jupyter_goals.store.db import Row, Tx

__all__ = [
    "new_id",
    "dumps",
    "digest",
    "next_counter",
    "emit",
    "events_after",
    "last_event_seq",
    "get_flag",
    "set_flag",
]


# --------------------------------------------------------------------------- ids, JSON, counters


def new_id(prefix: str) -> str:
    """Time-ordered: milliseconds since the epoch, then 48 random bits (UUIDv7's layout, shorter). New
    rows land at the end of each primary-key B-tree, so a commit dirties the same few pages however long
    the history is; random ids spread inserts over every page of a large table (issue 14)."""
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{secrets.randbits(48):012x}"


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))  # built once: dumps() is on the hot path


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def digest(value: Any) -> str:
    return hashlib.sha256(dumps(value).encode()).hexdigest()


def next_counter(tx: Tx, name: str) -> int:
    # the row lock orders concurrent writers, so seq order is commit order on PostgreSQL too
    return int(tx.scalar("UPDATE counters SET value = value + 1 WHERE name = ? RETURNING value", (name,)))


# --------------------------------------------------------------------------- events


def emit(tx: Tx, kind: str, payload: dict[str, Any], session_id: str | None = None, work_id: str | None = None) -> int:
    seq = tx.insert_seq(
        "events", "event_seq", ("ts", "session_id", "work_id", "kind", "payload"),
        (time.time(), session_id, work_id, kind, dumps(payload)),
    )
    assert seq is not None
    return seq


def events_after(tx: Tx, after: int, limit: int) -> list[Row]:
    rows = tx.all(
        "SELECT seq, ts, session_id, work_id, kind, payload FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
        (after, limit),
    )
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    return rows


def last_event_seq(tx: Tx) -> int:
    return tx.last_seq("events", "event_seq")


# --------------------------------------------------------------------------- server state


def get_flag(tx: Tx, key: str) -> str | None:
    row = tx.one("SELECT value FROM server_state WHERE key = ?", (key,))
    return None if row is None else str(row["value"])


def set_flag(tx: Tx, key: str, value: str) -> None:
    tx.execute(
        "INSERT INTO server_state (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )
