"""Statement text the dialects share, built once per shape (``functools.cache``): the append-only logs'
inserts. ``?`` placeholders, as everywhere (``Tx`` rewrites them for PostgreSQL)."""

from __future__ import annotations

import functools


@functools.cache
def insert_sql(table: str, columns: tuple[str, ...], unique: str | None, returning: bool) -> str:
    on_conflict = f" ON CONFLICT ({unique}) DO NOTHING" if unique else ""
    tail = " RETURNING seq" if returning else ""
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}){on_conflict}{tail}"


@functools.cache
def pg_insert_seq_sql(table: str, counter_is_events: bool, columns: tuple[str, ...]) -> str:
    """One round trip for a PostgreSQL append (parameters: the counter's name, then the row's values):
    the counter row's lock orders concurrent writers by commit and its new value is the row's ``seq``.
    Any other counter first locks the event counter (``lk``, read by the UPDATE's condition, so before
    the UPDATE takes its own row): every writer takes the two in the same order, as a transcript append
    that emits its event next must (the opposite order deadlocked)."""
    lock = "" if counter_is_events else (
        "lk AS (SELECT value FROM counters WHERE name = 'event_seq' FOR UPDATE), ")
    gate = "" if counter_is_events else " AND EXISTS (SELECT 1 FROM lk)"
    return (f"WITH {lock}c AS (UPDATE counters SET value = value + 1 WHERE name = ?{gate} RETURNING value) "
            f"INSERT INTO {table} (seq, {', '.join(columns)}) "
            f"VALUES ((SELECT value FROM c), {', '.join('?' * len(columns))}) RETURNING seq")
