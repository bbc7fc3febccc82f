"""The server's two stores as it holds them: the schema migrations at start, and the storage states
that follow (``Stores``).

Storage failures put the server in a degraded state (``storage_unavailable`` / ``migration_failed``)
instead of stopping it; old files are never touched. A control store that is gone, emptied or replaced
since this state dir used it is ``control_db_missing``: nothing is created in its place. While the
server runs, a damaged control.db is answered 503 ``storage_corrupt`` and named in health until it
checks out again, and a usage.db deleted or replaced behind its back is reopened and rebuilt from
control.db's outbox.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jupyter_goals.config import GoalsConfig
from jupyter_goals.host.wake import WakingDatabase
from jupyter_goals.models import REASON_TEXT, ReasonCode
from jupyter_goals.store import control as c
from jupyter_goals.store import known
from jupyter_goals.store import usage as u
from jupyter_goals.store.db import Database, MigrationFailed, StorageUnavailable, Tx
from jupyter_goals.store.schema import created_at, current_version, migrate, quick_check
from jupyter_goals.usage.prices import PriceTable

log = logging.getLogger(__name__)
T = TypeVar("T")

STORAGE_CORRUPT = "storage_corrupt"
USAGE_DB_MISSING = "usage_db_missing"
# SQLite's words for a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB)
_CORRUPTION = ("malformed", "not a database", "corrupt")
redact = known.redact


class Degraded(Exception):
    """The server cannot serve requests now (503 with ``code``): starting, or a store it cannot use."""

    def __init__(self, code: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def private_state_dir(state_dir: Path) -> None:
    """Only the owner may enter the state dir (transcripts, tool output, usage): mode 0700, tightened if
    it existed looser. The files at its top level (the databases and their -wal/-shm, which SQLite
    creates with the database file's mode; server_config.json) are made 0600."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        state_dir.chmod(0o700)
        for f in state_dir.iterdir():
            if f.is_file() and f.stat().st_mode & 0o077:
                f.chmod(0o600)
    except OSError as exc:  # not ours to change (a shared mount): said, not fatal
        log.warning("jupyter_goals: cannot make the state dir %s private: %s", state_dir, exc)


def storage_action(code: str, url: str) -> str:
    """What a person can do about a storage problem (health), in one sentence."""
    where = redact(url).removeprefix("sqlite:///")
    if code == ReasonCode.STORAGE_FULL:
        return (f"Free space on the file system that holds {where}; waiting work continues by itself and "
                "nothing recorded is lost.")
    if code == ReasonCode.STORAGE_LOCKED:
        return (f"Another process holds the write lock of {where} (an open sqlite3 shell or a backup?); "
                "work continues by itself once it is released.")
    if code == STORAGE_CORRUPT:
        return (f"{where} is damaged: stop the server and run `jupyter goals doctor`, which checks the file and "
                "names the newest backup; nothing is repaired or cleared by itself.")
    return f"{where} cannot be read or written: check the disk and its permissions; `jupyter goals doctor` explains more."


def is_corruption(message: str) -> bool:
    text = message.lower()
    return any(word in text for word in _CORRUPTION)


class WatchedDatabase(WakingDatabase):
    """control.db as the server uses it: a transaction that meets a damaged file (a page of garbage,
    a truncated file) fails 503 ``storage_corrupt`` naming the file and what to do, and the damage is
    remembered (``corruption``) for health, which checks it again before it forgets it. Every user of
    the database in this process (requests, the Coordinator, the outbox) goes through here, and each
    committed write wakes the event streams (``after_commit``, set by the service's ``EventHub``)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.corruption: str | None = None

    def transact(self, fn: Callable[[Tx], T], *, write: bool = True, probe: bool = False,
                 lock_wait_ms: int | None = None, durable: bool = True) -> T:
        try:
            return super().transact(fn, write=write, probe=probe, lock_wait_ms=lock_wait_ms, durable=durable)
        except StorageUnavailable as exc:
            if exc.code == STORAGE_CORRUPT or not is_corruption(str(exc)):
                raise
            self.corruption = str(exc)
            where = redact(self.url).removeprefix("sqlite:///")
            raise StorageUnavailable(
                f"{where} is damaged ({exc}); nothing was changed. Stop the server and run `jupyter goals doctor`.",
                STORAGE_CORRUPT) from exc


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None when there is none (blocking: run off the loop)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class Stores:
    """control.db and usage.db, their migrations and what is known about their state (health reads it)."""

    def __init__(self, config: GoalsConfig, prices: PriceTable) -> None:
        self.config = config
        self.prices = prices
        self.control = WatchedDatabase(config.control_db_url)
        self.usage = Database(config.usage_db_url)
        self.degraded: Degraded | None = None
        # what to do about a control migration the file system failed (full, read-only, I/O error): it is
        # tried again by itself meanwhile; None: no such failure (a broken migration needs a person)
        self.migration_action: str | None = None
        self.control_checked_at: float | None = None  # the last start try's look at the control store (health)
        self.usage_degraded: str | None = None
        self.started = False  # the schema is migrated (or the store is degraded)
        self.usage_ready = False  # usage.db is migrated; until then receipts wait in the outbox
        self.usage_was_new = False  # usage.db held no schema at start: its ledger is rebuilt once ready
        self.usage_retry_at = 0.0
        # the usage database this server's connections opened: a SQLite file's (device, inode), or when a
        # PostgreSQL ledger was created (``created_at``); None until it is migrated. A different one (or
        # none) at its place means it was deleted or replaced while this server ran
        self._usage_identity: tuple[Any, ...] | None = None
        self._usage_checked_at = 0.0
        self.usage_lost: dict[str, Any] | None = None  # the ledger being rebuilt after that (health)
        self.usage_repaired: dict[str, Any] | None = None  # the last such rebuild, once done (health)
        self._corruption_checked_at = 0.0

    def check(self) -> None:
        """Raise ``Degraded`` (a 503) unless requests can be served now."""
        if self.degraded is not None:
            raise self.degraded
        if not self.started:  # requests that arrive while the schema is migrated: 503, not a missing table
            raise Degraded(ReasonCode.STARTING, REASON_TEXT[ReasonCode.STARTING])

    async def close(self) -> None:
        await asyncio.to_thread(self.control.close)
        await asyncio.to_thread(self.usage.close)

    # ------------------------------------------------------------------ control.db
    async def migrate_control(self) -> bool:
        """Migrate the control store, unless it is lost (store/known.py): gone, emptied or replaced since
        this state dir used it. Then nothing is created or written there: degraded ``control_db_missing``
        with what to do, tried again every 2 s (the service's start retry) until it is back or the person
        chose to start over."""
        lost = await asyncio.to_thread(known.lost, self.config.state_dir, self.control)
        self.control_checked_at = time.time()
        if lost is not None:
            await asyncio.to_thread(self.control.disconnect)  # the next look opens what is at the path then
            self.degraded = Degraded(ReasonCode.CONTROL_DB_MISSING, lost.message)
            self.migration_action = lost.action
            return False
        try:
            await asyncio.to_thread(migrate, self.control, "control")
            created = await self.control.run(created_at, write=False)
            if created is not None:  # from now on a start that finds it gone or another one says so
                await asyncio.to_thread(known.remember, self.config.state_dir, self.config.control_db_url, created)
        except MigrationFailed as exc:
            self.degraded = Degraded(ReasonCode.MIGRATION_FAILED, str(exc))
            self.migration_action = exc.action
        except StorageUnavailable as exc:
            self.degraded = Degraded(ReasonCode.STORAGE_UNAVAILABLE, str(exc))
        except OSError as exc:  # the record could not be written (a read-only or full state dir)
            self.degraded = Degraded(ReasonCode.STORAGE_UNAVAILABLE,
                                     f"cannot record the control store in {self.config.state_dir}: {exc}")
        else:
            self.degraded = None
            self.migration_action = None
            self.control.create = False  # a connection opened again never creates an empty control.db
        return self.degraded is None

    def heals_by_itself(self) -> bool:
        """A locked or briefly unreadable file, a full, read-only or failing disk heals by itself (the
        start is tried again); a schema problem needs a person."""
        return self.degraded is not None and (self.degraded.code == ReasonCode.STORAGE_UNAVAILABLE
                                              or self.migration_action is not None)

    async def corruption_rechecked(self) -> str | None:
        """The damage a control.db transaction met, while it still holds: ``PRAGMA quick_check`` (at
        most every 5 s, on the read connection) forgets it only once the file checks out again."""
        if self.control.corruption is None:
            return None
        if time.monotonic() - self._corruption_checked_at >= 5.0:
            self._corruption_checked_at = time.monotonic()
            try:
                found = await self.control.run(quick_check, write=False)
            except StorageUnavailable as exc:
                found = [str(exc.__cause__ or exc)]
            if found == ["ok"]:
                self.control.corruption = None
            else:
                self.control.corruption = "; ".join(found[:3])
        return self.control.corruption

    # ------------------------------------------------------------------ usage.db
    async def usage_is_new(self) -> bool:
        """Whether the usage database holds no schema yet (a first start, or it was deleted)."""
        try:
            return await asyncio.to_thread(self.usage.transact, current_version, write=False) == 0
        except StorageUnavailable:
            return False

    async def migrate_usage(self) -> bool:
        """Migrate usage.db and record the price table's version; on failure chat goes on (the receipts
        wait in the outbox) and it is tried again after 5 s."""
        try:
            await asyncio.to_thread(migrate, self.usage, "usage")
            await self.usage.run(lambda tx: u.record_prices(tx, self.prices.version, self.prices.model_prices()))
            # the file its connections now hold open, or when the PostgreSQL ledger was created
            self._usage_identity = await self.usage_identity_now()
        except (MigrationFailed, StorageUnavailable) as exc:
            self.usage_degraded = str(exc)
            self.usage_retry_at = time.monotonic() + 5.0
            return False
        self.usage_ready = True
        return True

    async def rebuild_ledger(self) -> None:
        """A new usage database beside a control.db that already applied operations to a ledger: the
        ledger was lost (usage.db deleted, a fresh shared schema). control.db's outbox still records
        every operation; they are applied again, once each (receipt keys)."""
        if not self.usage_was_new:
            return
        self.usage_was_new = False
        n = await self.control.run(c.requeue_done_outbox)
        if n:
            log.warning("usage ledger: the usage database was new while control.db had applied %s operations "
                        "to one; rebuilding the ledger from them (active-time intervals are not rebuilt)", n)
        if self.usage_lost is not None:
            self.usage_lost["operations"] = n

    async def usage_identity_now(self) -> tuple[Any, ...] | None:
        """The identity of the usage database at the configured place now (None: there is none). Raises
        StorageUnavailable when a PostgreSQL ledger cannot be reached (that is not a loss)."""
        if self.usage.path is not None:
            return await asyncio.to_thread(file_identity, self.usage.path)
        created = await self.usage.run(created_at, write=False)
        return None if created is None else (created,)

    async def usage_file_changed(self) -> str | None:
        """Whether the usage database is no longer the one this server's connections opened: usage.db at
        its path deleted or replaced by another file (a stat off the loop), or a PostgreSQL ledger dropped
        and created again, or emptied (one read of when its schema was created)."""
        if self._usage_identity is None:
            return None
        try:
            now = await self.usage_identity_now()
        except StorageUnavailable:
            return None  # unreachable, not lost: the outbox says so and keeps the receipts
        if now == self._usage_identity:
            return None
        if self.usage.path is not None:
            what = "deleted" if now is None else "replaced by another file"
            return (f"{self.usage.path} was {what} while the server ran; receipts written since went to a file "
                    "nobody sees. The ledger is reopened and rebuilt from control.db's outbox, each receipt once.")
        what = "emptied or dropped and created again (its tables are gone)" if now is None else "created again"
        return (f"the usage database {redact(self.config.usage_db_url)} was {what} while the server ran. The "
                "ledger is migrated again and rebuilt from control.db's outbox, each receipt once.")

    async def watch_ledger(self, wrote: bool) -> bool:
        """On a slow tick (1 s) and right after receipts were written: a usage.db deleted or replaced (or a
        PostgreSQL ledger emptied, or dropped and created again) is closed, opened again (created and
        migrated) and rebuilt from control.db's outbox (as the next start would), each receipt once;
        health says so meanwhile. What went to the old file is applied again too: every operation
        control.db marked done is queued again. True when ``usage`` is a new ``Database`` now."""
        now = time.monotonic()
        if not self.usage_ready or not (wrote or now - self._usage_checked_at >= 1.0):
            return False
        self._usage_checked_at = now
        reason = await self.usage_file_changed()
        if reason is None:
            return False
        log.warning("usage ledger: %s", reason)
        self.usage_lost = {"code": USAGE_DB_MISSING, "message": reason, "since": time.time(), "operations": None}
        old, self.usage = self.usage, Database(self.config.usage_db_url)
        self.usage_ready, self.usage_was_new, self.usage_retry_at, self._usage_identity = False, True, 0.0, None
        await asyncio.to_thread(old.close)  # waits for a transaction still running on it
        return True

    async def ledger_rebuilt(self) -> None:
        """A rebuild after usage.db was lost ends when control.db has no operation left to apply."""
        if self.usage_lost is None or not self.usage_ready or self.usage_lost["operations"] is None:
            return
        if await self.control.run(c.pending_outbox_count, write=False):
            return
        lost, self.usage_lost = self.usage_lost, None
        self.usage_repaired = {**lost, "repaired_at": time.time()}
        log.warning("usage ledger: rebuilt from control.db's outbox (%s operations applied again)", lost["operations"])

    def ledger_state(self) -> str:
        """Why the usage ledger is not being written now ("" when it is)."""
        return self.usage_degraded or (self.usage_lost or {}).get("message") or ""
