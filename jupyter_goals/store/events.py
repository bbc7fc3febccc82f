"""Read-only tail of the event log for SSE and polling clients (the server's ``EventHub`` reads the
new events once per wake-up for every stream; a JSON poll or a stream catching up reads its own page).

On SQLite it uses an aiosqlite connection of its own: WAL lets it read while the writer thread
commits, so a dozen browser tabs polling every 250 ms never queue behind durable writes. Each poll
is a single statement, so aiosqlite's one thread hop per statement costs nothing extra here (unlike
the write path, see docs/architecture.md). Other dialects read through ``Database.run``.
"""

from __future__ import annotations

import json
from typing import Any

import aiosqlite

from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Row, StorageUnavailable

_QUERY = (
    "SELECT seq, ts, session_id, work_id, kind, payload, (SELECT MAX(seq) FROM events) AS last"
    " FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
)


class EventTail:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._conn: aiosqlite.Connection | None = None

    async def _connection(self) -> aiosqlite.Connection:
        if self._conn is None:
            assert self.db.path is not None
            try:
                conn = await aiosqlite.connect(f"file:{self.db.path}?mode=ro", uri=True)
                await conn.execute(f"PRAGMA busy_timeout={self.db.busy_timeout_ms}")
            except Exception as exc:
                raise StorageUnavailable(f"cannot read events: {exc}") from exc
            conn.row_factory = aiosqlite.Row
            self._conn = conn
        return self._conn

    async def after(self, after: int, limit: int) -> dict[str, Any]:
        """Events with ``seq > after`` (oldest first) and the newest seq."""
        if self.db.dialect != "sqlite":
            return await self.db.run(
                lambda tx: {"events": c.events_after(tx, after, limit), "last_seq": c.last_event_seq(tx)}, write=False
            )
        conn = await self._connection()
        try:
            async with conn.execute(_QUERY, (after, limit)) as cur:
                rows = [dict(r) for r in await cur.fetchall()]
            if rows:
                last = int(rows[0]["last"])
            else:
                async with conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events") as cur:
                    row = await cur.fetchone()
                last = int(row[0]) if row else 0
        except Exception as exc:
            await self.close()
            raise StorageUnavailable(f"cannot read events: {exc}") from exc
        events: list[Row] = []
        for r in rows:
            r.pop("last")
            r["payload"] = json.loads(r["payload"])
            events.append(r)
        return {"events": events, "last_seq": last}

    async def last_seq(self) -> int:
        """The newest seq of the log (0 when empty): where a live follower starts."""
        if self.db.dialect != "sqlite":
            return await self.db.run(c.last_event_seq, write=False)
        conn = await self._connection()
        try:
            async with conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events") as cur:
                row = await cur.fetchone()
        except Exception as exc:
            await self.close()
            raise StorageUnavailable(f"cannot read events: {exc}") from exc
        return int(row[0]) if row else 0

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
