"""Versioned schema migrations for control.db and usage.db: the runner; the DDL is in ``store/migrations/``.

Each migration is portable SQL (SQLite and PostgreSQL): ``BIGINT``, ``DOUBLE PRECISION`` and
``TEXT`` only; JSON is stored as TEXT. Applied versions are recorded in ``schema_migrations``.
A schema newer than the code, or a migration that fails, raises ``MigrationFailed`` and leaves the
database as it was (the migration runs in one transaction; SQLite files are backed up first). One
that finds no space left (for its backup or its rewrite) says how much to free, and gives back the
space it took (its backup, the WAL's rolled-back frames): ``MigrationFailed.code`` ``storage_full``.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time

from jupyter_goals.store.db import Database, MigrationFailed, StorageUnavailable, Tx, storage_code
from jupyter_goals.store.migrations import Migration as Migration
from jupyter_goals.store.migrations.control import CONTROL_MIGRATIONS
from jupyter_goals.store.migrations.usage import USAGE_MIGRATIONS

MIGRATIONS: dict[str, list[Migration]] = {"control": CONTROL_MIGRATIONS, "usage": USAGE_MIGRATIONS}


def quick_check(tx: Tx) -> list[str]:
    """SQLite's ``PRAGMA quick_check``: ``["ok"]``, or the problems it found (for ``jupyter goals doctor``)."""
    return [str(r["quick_check"]) for r in tx.all("PRAGMA quick_check")]


def created_at(tx: Tx) -> float | None:
    """When this database's first migration was applied; None while it holds no schema. A database
    dropped and created again (or emptied) answers differently from the one a server opened, where
    a connection string cannot tell them apart (the identity of a PostgreSQL ledger)."""
    if current_version(tx) == 0:
        return None
    value = tx.scalar("SELECT applied_at FROM schema_migrations WHERE version = 1")
    return None if value is None else float(value)


def current_version(tx: Tx) -> int:
    if tx.dialect == "sqlite":
        exists = tx.one("SELECT name FROM sqlite_master WHERE type='table' AND name='schema_migrations'")
    else:
        exists = tx.one("SELECT to_regclass('schema_migrations') AS name")
        exists = exists if exists and exists["name"] else None
    if not exists:
        return 0
    return int(tx.scalar("SELECT COALESCE(MAX(version), 0) AS v FROM schema_migrations") or 0)


def backup_sqlite(path: str, version: int) -> str | None:
    """Copy the database beside itself before a migration (consistent copy via the backup API)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    now = time.time()
    stamp = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}.{int(now * 1e6) % 1_000_000:06d}Z"
    dest = f"{path}.v{version}.{stamp}.bak"
    n = 1
    while os.path.exists(dest):  # never overwrite an earlier backup
        dest = f"{path}.v{version}.{stamp}-{n}.bak"
        n += 1
    src = sqlite3.connect(path)
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)
        finally:
            dst.close()
    except BaseException:  # a partial copy (no space left for it) is no backup: it only holds the space
        _remove(dest)
        raise
    finally:
        src.close()
    return dest


def _remove(path: str | None) -> None:
    if path:
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                os.unlink(path + suffix)
            except OSError:
                pass


_RETRIED = "the migration is tried again by itself and nothing recorded is changed until it succeeds."


def file_system_trouble(path: str | None, exc: BaseException) -> str | None:
    """``storage_full`` / ``storage_readonly`` / ``storage_io_error`` when ``exc`` is the file system's
    fault (no space left, mounted read-only, an I/O error the disk reported), else None. Each heals
    without touching the database: free space, remount read-write, a disk that works again."""
    text = str(exc).lower()
    number = getattr(exc, "errno", None)
    if storage_code(text) == "storage_full" or number == errno.ENOSPC:
        return "storage_full"
    if number == errno.EROFS or "read-only file system" in text or (
            path is not None and ("readonly" in text or "unable to open" in text) and _read_only(path)):
        return "storage_readonly"
    if number == errno.EIO or "disk i/o error" in text:
        return "storage_io_error"
    return None


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _file_system_failed(db: Database, which: str, version: int | None, newest: int, step: str, code: str,
                        exc: BaseException) -> MigrationFailed:
    """A migration (or its backup) the file system failed: nothing was changed (SQLite rolled the
    transaction back whole; the file is still ``version``; None: it could not even be read), and it is
    tried again by itself."""
    assert db.path is not None
    if version is None:
        where = f"{which} database {db.path} could not be opened to migrate it to schema v{newest}"
        kept = "Nothing was changed."
    else:
        where = f"{which} database {db.path} could not be migrated from schema v{version} to v{newest}"
        kept = f"Nothing was changed: it is still schema v{version} with every record."
    if code == "storage_full":
        size = os.path.getsize(db.path) if os.path.exists(db.path) else 0
        need_mb = max(1, 2 * size // (1024 * 1024) + 1)
        return MigrationFailed(
            f"{where}: the file system that holds it has no space left {step} ({exc}). {kept} Free about {need_mb} MB "
            "there (a backup copy and the tables the migration rewrites); the migration is tried again by itself.",
            code, f"Free space on the file system that holds {db.path}; {_RETRIED}")
    if code == "storage_readonly":
        return MigrationFailed(
            f"{where}: the file system that holds it is read-only {step} ({exc}). {kept} Remount it read-write; the "
            "migration is tried again by itself.",
            code, f"Remount the file system that holds {db.path} read-write; {_RETRIED}")
    return MigrationFailed(
        f"{where}: the disk reported an I/O error {step} ({exc}). {kept} Check the disk (the kernel log says which "
        "blocks: dmesg); the migration is tried again by itself.",
        code, f"Check the disk that holds {db.path} (the kernel log, dmesg, says more); {_RETRIED}")


def _truncate_wal(path: str) -> None:
    """Give back the space the WAL frames of a rolled-back transaction hold (best effort)."""
    try:
        conn = sqlite3.connect(path, timeout=0.2)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    except sqlite3.Error:
        pass


def _storage_fault(exc: BaseException) -> bool:
    """Lock timeouts, I/O errors and lost connections say nothing about the migration itself."""
    if isinstance(exc, sqlite3.OperationalError):
        msg = str(exc).lower()
        return "locked" in msg or "disk i/o" in msg or "unable to open" in msg
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, psycopg.OperationalError)


def migrate(db: Database, which: str) -> int:
    """Bring ``db`` to the newest schema for ``which`` ('control' | 'usage'); returns the version.

    Runs synchronously (call it from a thread). Raises MigrationFailed, never half-applies.
    """
    migrations = MIGRATIONS[which]
    newest = migrations[-1][0]
    try:
        version = db.transact(current_version, write=False)
    except StorageUnavailable as exc:
        # a WAL database cannot even be read where its -shm file cannot be created (a read-only mount)
        if db.path and file_system_trouble(db.path, exc) == "storage_readonly":
            raise _file_system_failed(db, which, None, newest, "(its files cannot be opened)", "storage_readonly",
                                      exc) from exc
        raise
    if version > newest:
        raise MigrationFailed(f"{which} database schema v{version} is newer than this code (v{newest})")
    if version == newest:
        return version
    backup: str | None = None
    if db.dialect == "sqlite" and version > 0 and db.path:
        try:
            backup = backup_sqlite(db.path, version)
        except (sqlite3.Error, OSError) as exc:
            code = file_system_trouble(db.path, exc)
            if code is not None:
                raise _file_system_failed(db, which, version, newest, "for its backup", code, exc) from exc
            raise

    def apply(tx: Tx) -> int:
        if current_version(tx) == 0:
            tx.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at DOUBLE PRECISION NOT NULL)"
            )
        v = current_version(tx)
        for number, name, sql in migrations:
            if number <= v:
                continue
            try:
                tx.script(sql if isinstance(sql, str) else sql[tx.dialect])
                tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (number, name, time.time()),
                )
            except Exception as exc:
                code = file_system_trouble(db.path, exc) if db.path else None
                if code is not None:  # SQLITE_FULL / _READONLY / _IOERR: SQLite rolls the transaction back whole
                    raise _file_system_failed(db, which, version, newest, f"in migration v{number} ({name})", code,
                                              exc) from exc
                if _storage_fault(exc):
                    raise
                # a failing statement is a broken migration, not an unreadable database (db.transact
                # would otherwise report SQLite's OperationalError as storage_unavailable)
                raise MigrationFailed(f"{which} migration v{number} ({name}) failed: {exc}") from exc
        return newest

    try:
        return db.transact(apply)
    except MigrationFailed as exc:
        if exc.action is not None and db.path:
            # the database is as it was: its backup and the WAL's rolled-back frames only hold space
            # (each later try would leave one more backup behind)
            _remove(backup)
            _truncate_wal(db.path)
        raise
    except StorageUnavailable as exc:
        # the failing statement was the COMMIT (an fsync the disk refused): rolled back, as above
        code = file_system_trouble(db.path, exc) if db.path else None
        if code is None:
            raise
        _remove(backup)
        _truncate_wal(db.path or "")
        raise _file_system_failed(db, which, version, newest, "when it committed", code, exc) from exc
    except Exception as exc:
        raise MigrationFailed(f"{which} migration failed: {exc}") from exc
