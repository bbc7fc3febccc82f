"""Database access: one transaction = one call on the database thread (or inline in a worker).

Dialect differences (placeholders, DDL types, connection setup, error mapping) live here and in
``schema.py`` only. Every transaction is a plain function ``fn(tx) -> T`` so its statements run
back to back on one connection: one thread hop per transaction, never one per statement.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from jupyter_goals.store.pgconn import PG_SIDE_OPTIONS, lane_name, pg_stale
from jupyter_goals.store.sql import insert_sql, pg_insert_seq_sql

T = TypeVar("T")
Row = dict[str, Any]


class StorageUnavailable(Exception):
    """The database cannot be opened, read or written. Nothing is cleared; the caller shows the state.
    ``code``: ``storage_full`` (no space left for a commit), ``storage_locked`` (another process held
    the write lock past the busy timeout) or ``storage_unavailable`` (anything else)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code or storage_code(message)


class StorageLocked(StorageUnavailable, sqlite3.OperationalError):
    """SQLite's write lock was not free within the busy timeout (still an ``OperationalError``)."""


def storage_code(message: str) -> str:
    text = message.lower()
    if "disk is full" in text or "no space left" in text or "could not extend file" in text:
        return "storage_full"
    if "database is locked" in text or "lock timeout" in text:
        return "storage_locked"
    return "storage_unavailable"


class MigrationFailed(Exception):
    """The schema could not be migrated (broken migration, or a schema newer than the code). ``code``:
    ``storage_full`` / ``storage_readonly`` / ``storage_io_error`` when the file system failed the
    migration or its backup (nothing was changed; it can succeed once the file system works again:
    ``action`` says what to do, and the server tries again by itself), else ``migration_failed`` (a
    person must act; ``action`` is None)."""

    def __init__(self, message: str, code: str = "migration_failed", action: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.action = action


class FencedError(Exception):
    """A write from an attempt whose ownership was revoked (stale generation or ended attempt)."""


class VersionConflict(Exception):
    """An optimistic-concurrency check failed (control version, revision, approval state)."""


class NotFound(Exception):
    pass


class WouldWrite(Exception):
    """A read-only probe (:meth:`Database.run_write_if_needed`) reached its first write."""


_READS = ("SELECT", "WITH", "PRAGMA")


def dialect_of(url: str) -> str:
    """``postgresql`` for a PostgreSQL URL, else ``sqlite`` (as :class:`Database` reads it)."""
    return "postgresql" if url.startswith(("postgresql://", "postgres://")) else "sqlite"


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
        write lock. PostgreSQL: ``FOR SHARE`` makes a concurrent ``UPDATE`` of the row wait for us."""
        return "" if self.dialect == "sqlite" else " FOR SHARE"

    def insert_seq(
        self, table: str, counter: str, columns: Sequence[str], values: Sequence[Any], *, unique: str | None = None
    ) -> int | None:
        """Insert one row into an append-only log whose ``seq`` orders rows by commit; returns its seq.

        With ``unique`` (a unique column), a row whose key is already present is left alone and ``None``
        is returned. SQLite: ``seq`` is the rowid (``INTEGER PRIMARY KEY``); writers are serialized, so
        max + 1 is commit order and no counter page is written (rows are never deleted, so a rowid is
        never reused). PostgreSQL: sequences are not commit-ordered, so a counter row's lock orders
        concurrent writers, the event counter's first (a transcript append emits its event next: a
        writer holding the transcript counter while another held the event counter deadlocked), in one
        round trip (``sql.pg_insert_seq_sql``; a ``unique`` key is looked up first)."""
        if self.dialect == "sqlite":
            cur = self._conn.execute(insert_sql(table, tuple(columns), unique, True), tuple(values))
            row = cur.fetchone()
            cur.fetchall()  # let the statement finish
            return None if row is None else int(row[0])
        if unique and self.one(f"SELECT seq FROM {table} WHERE {unique} = ?", (values[list(columns).index(unique)],)):
            return None
        return int(self.scalar(pg_insert_seq_sql(table, counter == "event_seq", tuple(columns)), (counter, *values)))

    def last_seq(self, table: str, counter: str) -> int:
        """The newest committed seq of an append-only log written by ``insert_seq``."""
        if self.dialect == "sqlite":
            return int(self.scalar(f"SELECT COALESCE(MAX(seq), 0) AS v FROM {table}") or 0)
        return int(self.scalar("SELECT value FROM counters WHERE name = ?", (counter,)) or 0)

    @contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        """Statements inside the block are undone (and the exception re-raised) if it raises; the
        rest of the transaction stays."""
        self._conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self._conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
            self._conn.execute(f"RELEASE SAVEPOINT {name}")
            raise
        self._conn.execute(f"RELEASE SAVEPOINT {name}")

    def script(self, sql: str) -> None:
        """Run several DDL statements (migrations). Statements are split on ';' at line ends."""
        for stmt in re.split(r";\s*\n", sql):
            if stmt.strip():
                self._conn.execute(stmt)


class _ProbeTx(Tx):
    """A read transaction that stops at the first statement that would write (``WouldWrite``)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        if not sql.lstrip().upper().startswith(_READS):
            raise WouldWrite(sql)
        return super().execute(sql, params)

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        if not sql.lstrip().upper().startswith(_READS):
            raise WouldWrite(sql)
        return super().all(sql, params)

    def insert_seq(self, table: str, counter: str, columns: Sequence[str], values: Sequence[Any], *,
                   unique: str | None = None) -> int | None:
        raise WouldWrite(f"INSERT INTO {table}")

    @contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        raise WouldWrite(f"SAVEPOINT {name}")
        yield  # pragma: no cover

    def script(self, sql: str) -> None:
        raise WouldWrite(sql)


class _Lane:
    """One connection, the lock that serializes its transactions, and (off-loop) its own thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.conn: Any = None
        self.lock = threading.Lock()
        self.executor: ThreadPoolExecutor | None = None


class Database:
    """A SQLite file (WAL, synchronous=FULL, busy timeout) or a PostgreSQL database.

    ``inline=True`` runs SQLite transactions directly in the calling thread: used by worker
    processes, whose event loop exists to run durable steps (see docs/architecture.md).
    Otherwise read-only transactions (``write=False``) run on a connection and thread of their own,
    so a read never queues behind a write transaction that waits for the database's write lock."""

    def __init__(self, url: str, *, inline: bool = False, busy_timeout_ms: int = 10000) -> None:
        self.url = url
        self.dialect = "postgresql" if url.startswith(("postgresql://", "postgres://")) else "sqlite"
        self.path = url.removeprefix("sqlite:///") if self.dialect == "sqlite" else None
        self.inline = inline and self.dialect == "sqlite"
        self.busy_timeout_ms = busy_timeout_ms
        # False: a SQLite file that is not there is an error, never created empty (a server's connections
        # opened again after its start: an empty control.db in place of a deleted one would pass for a
        # first start; store/known.py)
        self.create = True
        self._writer = _Lane("jupyter-goals-db")
        self._reader = self._writer if self.inline else _Lane("jupyter-goals-db-read")
        self._wal_writer = False  # the write connection stays at busy_timeout=0 (``_polls_for_lock``)
        self._closed = False  # after close() nothing reopens the connection behind the owner's back
        # the last storage failure of a read / a write transaction, until one succeeds again (health)
        self.problems: dict[str, StorageUnavailable] = {}

    # ------------------------------------------------------------------ connection
    def _connect(self, lane: str = "jupyter-goals-db") -> Any:
        if self.dialect == "sqlite":
            assert self.path is not None
            if self.create and not os.path.exists(self.path):
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            target = self.path if self.create else f"file:{urllib.parse.quote(os.path.abspath(self.path))}?mode=rw"
            try:
                conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False,
                                       timeout=self.busy_timeout_ms / 1000, uri=not self.create)
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
            return psycopg.connect(self.url, autocommit=True, row_factory=dict_row,  # type: ignore[arg-type]
                                   application_name=lane_name(lane), **PG_SIDE_OPTIONS)
        except psycopg.Error as exc:
            raise StorageUnavailable(f"cannot connect to {self.url}: {exc}") from exc

    def _lane(self, write: bool) -> _Lane:
        return self._writer if write else self._reader

    def _ensure(self) -> Any:
        """The write connection, opened if needed (tests trace its statements)."""
        if self._writer.conn is None:
            self._writer.conn = self._connect()
            self._wal_writer = self.dialect == "sqlite" and self._polls_for_lock(self._writer.conn)
        return self._writer.conn

    # ------------------------------------------------------------------ transactions
    def transact(self, fn: Callable[[Tx], T], *, write: bool = True, probe: bool = False,
                 lock_wait_ms: int | None = None, durable: bool = True) -> T:
        """Run ``fn`` in one transaction on the calling thread (commit on return, rollback on raise).
        ``probe``: a read transaction in which the first write raises ``WouldWrite``. ``durable=False``: the
        commit does not wait for the disk (SQLite ``synchronous=NORMAL``, PostgreSQL ``synchronous_commit
        off``); it is durable with the next durable commit; a power loss (or a PostgreSQL crash) before may undo it."""
        if probe:
            write = False
        lane = self._lane(write)
        with lane.lock:
            if self._closed:
                raise StorageUnavailable(f"{self.dialect} database {self.path or ''} is closed")
            if lane.conn is not None and self.dialect == "postgresql" and pg_stale(lane.conn):
                self._reset(lane)  # the database restarted or ended the backend meanwhile
            if lane.conn is None:
                try:
                    lane.conn = self._connect(lane.name)
                except StorageUnavailable as exc:
                    self.problems["write" if write else "read"] = exc
                    raise
                if lane is self._writer and self.dialect == "sqlite":
                    self._wal_writer = self._polls_for_lock(lane.conn)
            conn = lane.conn
            tx = _ProbeTx(conn, self.dialect) if probe else Tx(conn, self.dialect)
            restore = False  # the write connection's busy_timeout=0 to put back after an inline read
            # PostgreSQL reads run outside a transaction: in READ COMMITTED each statement reads its own snapshot
            # either way, so BEGIN and COMMIT were two round trips that bought nothing
            began = write or self.dialect == "sqlite"
            try:
                if self.dialect == "sqlite":
                    if write:
                        if not durable:
                            conn.execute("PRAGMA synchronous=NORMAL")
                        self._begin_immediate(conn, self.busy_timeout_ms if lock_wait_ms is None else lock_wait_ms)
                    else:
                        if lane is self._writer and self._wal_writer:
                            # inline: a read on the write connection waits as SQLite's readers do (a reader
                            # is only ever busy while another connection recovers the WAL index)
                            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
                            restore = True
                        conn.execute("BEGIN")
                elif write:
                    conn.execute("BEGIN" if durable else "BEGIN; SET LOCAL synchronous_commit TO off")
                result = fn(tx)
                if began:
                    conn.execute("COMMIT")
                if self.problems:
                    self.problems.pop("write" if write else "read", None)
                return result
            except BaseException as exc:
                try:
                    if began:
                        conn.execute("ROLLBACK")
                except Exception:
                    self._reset(lane)
                failure: StorageUnavailable | None = exc if isinstance(exc, StorageUnavailable) else None
                if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.IntegrityError):
                    msg = str(exc)
                    if "database is locked" in msg:
                        failure = StorageLocked(msg, "storage_locked")
                    else:
                        self._reset(lane)
                        failure = StorageUnavailable(msg)
                elif self.dialect == "postgresql":
                    import psycopg

                    if isinstance(exc, psycopg.OperationalError):
                        self._reset(lane)
                        failure = StorageUnavailable(str(exc))
                if failure is None:
                    raise
                self.problems["write" if write else "read"] = failure
                if failure is exc:
                    raise
                raise failure from exc
            finally:
                if (restore or not durable and write and self.dialect == "sqlite") and lane.conn is conn:
                    try:
                        conn.execute("PRAGMA busy_timeout=0" if restore else "PRAGMA synchronous=FULL")
                    except sqlite3.Error:
                        self._reset(lane)

    def recheck(self) -> dict[str, StorageUnavailable]:
        """Whether the recorded problems still hold, without writing anything (for health): no space is
        rechecked from the file system's free space, a lock by taking and releasing the write lock, a
        read problem by a read. A problem that is gone is forgotten; the next failure records it again."""
        for kind, problem in list(self.problems.items()):
            try:
                if problem.code == "storage_full" and self.path:
                    st = os.statvfs(os.path.dirname(os.path.abspath(self.path)))
                    if st.f_bavail * st.f_frsize >= 4 * 1024 * 1024:
                        self.problems.pop(kind, None)
                else:
                    # commits nothing; a lock still held answers within 200 ms, not the busy timeout
                    self.transact(lambda tx: tx.scalar("SELECT 1 AS one"), write=kind == "write", lock_wait_ms=200)
            except (StorageUnavailable, OSError):
                pass
        return dict(self.problems)

    @staticmethod
    def _polls_for_lock(conn: sqlite3.Connection) -> bool:
        """Whether the write connection can stay at ``busy_timeout=0`` for good (``_begin_immediate``
        polls for the lock itself). In WAL mode a transaction that holds the write lock never waits on
        another connection again: its statements and its COMMIT take no further lock, and the automatic
        checkpoint after a commit is PASSIVE (it skips frames readers still need instead of waiting). In
        a rollback journal (a file system without shared memory, where WAL cannot be set) COMMIT waits
        for readers to leave, so that connection keeps the busy timeout and toggles it per transaction."""
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            return False
        conn.execute("PRAGMA busy_timeout=0")
        return True

    def _begin_immediate(self, conn: sqlite3.Connection, wait_ms: int) -> None:
        """Take SQLite's write lock, trying again about every millisecond while another process holds
        it, up to the busy timeout. SQLite's own busy handler backs off to 100 ms sleeps, so a process
        that writes in a tight loop (a busy worker) takes the lock again and again while the others
        sleep: another session's message waited ~70 ms for its commit (bench/long_session.py). Short
        polls make the wait about one of the busy writer's transactions, not a backoff step. The WAL
        write connection is at ``busy_timeout=0`` for good (``_polls_for_lock``): setting it per
        transaction cost 9 µs of each tool call's two commits (bench/step_overhead.py)."""
        toggle = not self._wal_writer
        if toggle:
            conn.execute("PRAGMA busy_timeout=0")
        try:
            deadline = time.monotonic() + wait_ms / 1000
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() >= deadline:
                        raise
                time.sleep(0.0005 + random.random() * 0.001)  # jitter: waiters do not retry in step
        finally:
            if toggle:
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")

    @staticmethod
    def _reset(lane: _Lane) -> None:
        conn, lane.conn = lane.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    async def run(self, fn: Callable[[Tx], T], *, write: bool = True, durable: bool = True) -> T:
        """Run ``fn`` as one transaction with at most one thread hop (``durable``: see ``transact``)."""
        if self.inline:
            return self.transact(fn, write=write, durable=durable)
        return await self._on_lane(self._lane(write), lambda: self.transact(fn, write=write, durable=durable))

    async def _on_lane(self, lane: _Lane, call: Callable[[], T]) -> T:
        if lane.executor is None:
            lane.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=lane.name)
        return await asyncio.get_running_loop().run_in_executor(lane.executor, call)

    def transact_write_if_needed(self, fn: Callable[[Tx], T]) -> T:
        """:meth:`run_write_if_needed` on the calling thread."""
        try:
            return self.transact(fn, probe=True)
        except WouldWrite:
            return self.transact(fn)

    async def run_write_if_needed(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a read transaction; only when it reaches a write, run it again from the start
        in a write transaction. So a pass that finds nothing to change (an idle admission tick, a
        worker finding nothing to claim) takes no write lock and commits nothing. ``fn`` must be
        harmless to repeat up to its first write (reads, and pure bookkeeping it redoes)."""
        try:
            if self.inline:
                return self.transact(fn, probe=True)
            return await self._on_lane(self._reader, lambda: self.transact(fn, probe=True))
        except WouldWrite:
            return await self.run(fn)

    def close(self) -> None:
        self._closed = True  # after close() nothing reopens a connection behind the owner's back
        self._close_connections(shutdown=True)

    def disconnect(self) -> None:
        """Close the connections (blocking); the next transaction opens new ones, on the file at the path
        then (a SQLite connection holds the file it opened, even once another is put in its place)."""
        self._close_connections(shutdown=False)

    def _close_connections(self, *, shutdown: bool) -> None:
        for lane in {id(self._writer): self._writer, id(self._reader): self._reader}.values():

            def _close(lane: _Lane = lane) -> None:
                with lane.lock:
                    self._reset(lane)

            if lane.executor is not None:
                lane.executor.submit(_close).result(timeout=10)
                if shutdown:
                    lane.executor.shutdown(wait=True)
                    lane.executor = None
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
