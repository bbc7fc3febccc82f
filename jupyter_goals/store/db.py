"""Database access: one transaction = one call on the database thread (or inline in a worker).

Dialect differences (placeholders, DDL types, connection setup, error mapping) live here and in
``schema.py`` only. Every transaction is a plain function ``fn(tx) -> T`` so its statements run
back to back on one connection: one thread hop per transaction, never one per statement.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
Row = dict[str, Any]


class StorageUnavailable(Exception):
    """The database cannot be opened or read. Nothing is cleared; the caller shows the state."""


class MigrationFailed(Exception):
    """The schema could not be migrated (broken migration, or a schema newer than the code)."""


class FencedError(Exception):
    """A write from an attempt whose ownership was revoked (stale generation or ended attempt)."""


class VersionConflict(Exception):
    """An optimistic-concurrency check failed (control version, revision, approval state)."""


class NotFound(Exception):
    pass


@functools.cache
def _insert_sql(table: str, columns: tuple[str, ...], unique: str | None, returning: bool) -> str:
    on_conflict = f" ON CONFLICT ({unique}) DO NOTHING" if unique else ""
    tail = " RETURNING seq" if returning else ""
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}){on_conflict}{tail}"


class Tx:
    """A transaction handle. ``?`` placeholders everywhere; the PostgreSQL dialect rewrites them."""

    def __init__(self, conn: Any, dialect: str) -> None:
        self._conn = conn
        self.dialect = dialect

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.dialect == "postgresql" else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; returns the affected row count."""
        cur = self._conn.execute(self._sql(sql), tuple(params))
        return int(cur.rowcount)

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = self._conn.execute(self._sql(sql), tuple(params))
        rows = cur.fetchall()
        if self.dialect == "sqlite":
            return [dict(r) for r in rows]
        return list(rows)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = self.all(sql, params)
        return rows[0] if rows else None

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self.one(sql, params)
        return None if row is None else next(iter(row.values()))

    @property
    def row_lock(self) -> str:
        """Suffix for a SELECT that must hold its rows until commit (a fence read).

        SQLite needs none: every write transaction is ``BEGIN IMMEDIATE`` and holds the database's
        write lock. PostgreSQL: ``FOR SHARE`` makes a concurrent ``UPDATE`` of the row wait for us.
        """
        return "" if self.dialect == "sqlite" else " FOR SHARE"

    def insert_seq(
        self, table: str, counter: str, columns: Sequence[str], values: Sequence[Any], *, unique: str | None = None
    ) -> int | None:
        """Insert one row into an append-only log whose ``seq`` orders rows by commit; returns its seq.

        With ``unique`` (a unique column), a row whose key is already present is left alone and
        ``None`` is returned. SQLite: ``seq`` is the rowid (``INTEGER PRIMARY KEY``); writers are
        serialized, so max + 1 is commit order and no counter page is written (rows are never
        deleted, so a rowid is never reused). PostgreSQL: sequences are not commit-ordered, so a
        counter row's lock orders concurrent writers.
        """
        if self.dialect == "sqlite":
            cur = self._conn.execute(_insert_sql(table, tuple(columns), unique, True), tuple(values))
            row = cur.fetchone()
            cur.fetchall()  # let the statement finish
            return None if row is None else int(row[0])
        if unique and self.one(f"SELECT seq FROM {table} WHERE {unique} = ?", (values[list(columns).index(unique)],)):
            return None
        seq = int(self.scalar("UPDATE counters SET value = value + 1 WHERE name = ? RETURNING value", (counter,)))
        self.execute(_insert_sql(table, ("seq", *columns), None, False), (seq, *values))
        return seq

    def last_seq(self, table: str, counter: str) -> int:
        """The newest committed seq of an append-only log written by ``insert_seq``."""
        if self.dialect == "sqlite":
            return int(self.scalar(f"SELECT COALESCE(MAX(seq), 0) AS v FROM {table}") or 0)
        return int(self.scalar("SELECT value FROM counters WHERE name = ?", (counter,)) or 0)

    def script(self, sql: str) -> None:
        """Run several DDL statements (migrations). Statements are split on ';' at line ends."""
        for stmt in re.split(r";\s*\n", sql):
            if stmt.strip():
                self._conn.execute(stmt)


class Database:
    """A SQLite file (WAL, synchronous=FULL, busy timeout) or a PostgreSQL database.

    ``inline=True`` runs SQLite transactions directly in the calling thread: used by worker
    processes, whose event loop exists to run durable steps (see docs/architecture.md).
    """

    def __init__(self, url: str, *, inline: bool = False, busy_timeout_ms: int = 10000) -> None:
        self.url = url
        self.dialect = "postgresql" if url.startswith(("postgresql://", "postgres://")) else "sqlite"
        self.path = url.removeprefix("sqlite:///") if self.dialect == "sqlite" else None
        self.inline = inline and self.dialect == "sqlite"
        self.busy_timeout_ms = busy_timeout_ms
        self._executor: ThreadPoolExecutor | None = None
        self._conn: Any = None
        self._lock = threading.Lock()
        self._closed = False  # after close() nothing reopens the connection behind the owner's back

    # ------------------------------------------------------------------ connection
    def _connect(self) -> Any:
        if self.dialect == "sqlite":
            assert self.path is not None
            if not os.path.exists(self.path):
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            try:
                conn = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_ms / 1000
                )
                conn.row_factory = sqlite3.Row
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
            except sqlite3.DatabaseError as exc:
                raise StorageUnavailable(f"cannot open {self.path}: {exc}") from exc
            return conn
        import psycopg
        from psycopg.rows import dict_row

        try:
            return psycopg.connect(self.url, autocommit=True, row_factory=dict_row)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise StorageUnavailable(f"cannot connect to {self.url}: {exc}") from exc

    def _ensure(self) -> Any:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    # ------------------------------------------------------------------ transactions
    def transact(self, fn: Callable[[Tx], T], *, write: bool = True) -> T:
        """Run ``fn`` in one transaction on the calling thread (commit on return, rollback on raise)."""
        with self._lock:
            if self._closed:
                raise StorageUnavailable(f"{self.dialect} database {self.path or ''} is closed")
            conn = self._ensure()
            tx = Tx(conn, self.dialect)
            try:
                if self.dialect == "sqlite":
                    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                else:
                    conn.execute("BEGIN")
                result = fn(tx)
                conn.execute("COMMIT")
                return result
            except BaseException as exc:
                try:
                    conn.execute("ROLLBACK")
                except Exception:
                    self._reset()
                if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.IntegrityError):
                    msg = str(exc)
                    if "database is locked" not in msg:
                        self._reset()
                        raise StorageUnavailable(msg) from exc
                if self.dialect == "postgresql":
                    import psycopg

                    if isinstance(exc, psycopg.OperationalError):
                        self._reset()
                        raise StorageUnavailable(str(exc)) from exc
                raise

    def _reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    async def run(self, fn: Callable[[Tx], T], *, write: bool = True) -> T:
        """Run ``fn`` as one transaction with at most one thread hop."""
        if self.inline:
            return self.transact(fn, write=write)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jupyter-goals-db")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self.transact(fn, write=write))

    def close(self) -> None:
        def _close() -> None:
            with self._lock:
                self._closed = True
                self._reset()

        if self._executor is not None:
            self._executor.submit(_close).result(timeout=10)
            self._executor.shutdown(wait=True)
            self._executor = None
        else:
            _close()

    def is_integrity_error(self, exc: BaseException) -> bool:
        if isinstance(exc, sqlite3.IntegrityError):
            return True
        try:
            import psycopg

            return isinstance(exc, psycopg.errors.IntegrityError)
        except ImportError:  # pragma: no cover
            return False
