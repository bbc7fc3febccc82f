"""PostgreSQL connections: the libpq options every connection shares, and how a lane sees that its idle
connection is already dead (the server restarted or ended the backend) before its next statement fails."""

from __future__ import annotations

import os
import select
from typing import Any

# libpq options of every PostgreSQL connection (the Database's lanes, wake-ups): a connect gives up after
# 5 s, and an idle connection notices a dead server or network within about 25 s (TCP keepalives) and
# unacknowledged data within 10 s, so a lost connection is seen (storage_unavailable) and redone.
PG_SIDE_OPTIONS: dict[str, Any] = {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 10,
                                   "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 10000}


def pg_connect(url: str, *, application_name: str) -> Any:
    """A raw autocommit ``psycopg.Connection`` to a PostgreSQL URL (outside any transaction lane)."""
    import psycopg

    return psycopg.connect(url, autocommit=True, application_name=application_name, **PG_SIDE_OPTIONS)


async def pg_connect_async(url: str, *, application_name: str) -> Any:
    """:func:`pg_connect` as a ``psycopg.AsyncConnection`` on the running loop (no thread)."""
    import psycopg

    return await psycopg.AsyncConnection.connect(url, autocommit=True, application_name=application_name,
                                                 **PG_SIDE_OPTIONS)


def lane_name(lane: str) -> str:
    """A lane connection's ``application_name`` (``jupyter_goals-db-<pid>``, ``jupyter_goals-db-read-<pid>``;
    beside ``jupyter_goals-notify-<pid>``): an operator (and a test) can tell in ``pg_stat_activity`` which
    process's writes or reads a backend serves."""
    return f"jupyter_goals-{lane.removeprefix('jupyter-goals-')}-{os.getpid()}"


def pg_stale(conn: Any) -> bool:
    """True when an idle autocommit connection is dead already: the server wrote to it unasked (the FATAL
    of a backend it ended) or closed it (a restart). A lane checks before each transaction and opens a new
    connection, so the first read or write after a database restart succeeds instead of failing on the
    old one. One ``poll`` with no wait, no round trip; a lane never LISTENs, so nothing else arrives idle."""
    if conn.closed:  # closed by us, or broken (psycopg: a broken connection is closed too)
        return True
    try:
        poller = select.poll()  # not select(): a server may hold more than FD_SETSIZE descriptors
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True
