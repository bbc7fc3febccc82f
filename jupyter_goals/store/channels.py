"""The PostgreSQL statements of wake-ups across hosts (``host/wake.py`` owns the service around them).

A wake-up channel ``<name>`` is the PostgreSQL channel ``jupyter_goals_<name>``; ``notify`` sends one
notification per channel in one statement, ``listen`` subscribes a connection of the listener's own.
"""

from __future__ import annotations

from typing import Any

PG_CHANNEL_PREFIX = "jupyter_goals_"


def pg_channel(channel: str) -> str:
    """The PostgreSQL ``LISTEN`` / ``NOTIFY`` channel of a wake-up channel."""
    return PG_CHANNEL_PREFIX + channel


def notify(conn: Any, channels: list[str]) -> None:
    """``pg_notify`` each channel (a psycopg connection in autocommit)."""
    conn.execute("SELECT " + ", ".join(["pg_notify(%s, '')"] * len(channels)), [pg_channel(ch) for ch in channels])


async def listen(conn: Any, channel: str) -> None:
    """``LISTEN`` on ``channel`` (an async psycopg connection in autocommit)."""
    from psycopg import sql

    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(pg_channel(channel))))
