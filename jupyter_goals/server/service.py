"""GoalsService: the server-side facade the handlers call (stores, Coordinator, supervisor, outbox).

Storage failures put the service in a degraded state (``storage_unavailable`` /
``migration_failed``) instead of stopping the server; old files are never touched. While it runs,
a damaged control.db is answered 503 ``storage_corrupt`` and named in health until it checks out
again, and a usage.db deleted or replaced behind its back is reopened and rebuilt from control.db.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import posixpath
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jupyter_goals import faults
from jupyter_goals.config import GoalsConfig
from jupyter_goals.goals import lifecycle as goal_lifecycle
from jupyter_goals.host.wake import ADMISSION, ATTEMPTS, Listener, Notifier
from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.models import (
    REASON_TEXT,
    Actions,
    CreateGoal,
    CreateJob,
    CreateSession,
    DesiredState,
    GoalAction,
    NotebookSession,
    Phase,
    PostMessage,
    ReasonCode,
    RecoveryOutcome,
    UpdateGoal,
    UpdateSession,
    reason_text,
)
from jupyter_goals.recovery.coordinator import Coordinator, RecoveryReport
from jupyter_goals.runtime.supervisor import Supervisor, WorkerConfig
from jupyter_goals.runtime.tools import ToolRegistry, cancellable
from jupyter_goals.server import catalog
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as goal_store
from jupyter_goals.store import known, notebooks, recovery_passes, waits
from jupyter_goals.store import usage as u
from jupyter_goals.store.db import Database, MigrationFailed, Row, StorageUnavailable, Tx
from jupyter_goals.store.events import EventTail
from jupyter_goals.store.schema import created_at, current_version, migrate, quick_check
from jupyter_goals.usage import budget as budgets
from jupyter_goals.usage.ledger import OutboxDispatcher
from jupyter_goals.usage.prices import PriceTable, PriceTableError, load_price_table

log = logging.getLogger(__name__)
T = TypeVar("T")


class Degraded(Exception):
    def __init__(self, code: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.code = code


# waits that a person's Retry clears (a provider backoff cut short; a changed tool accepted)
RETRYABLE_WAITS = frozenset({ReasonCode.PROVIDER_RETRYING, ReasonCode.TOOL_CHANGED})


def actions_for(work: Row | None) -> Actions:
    """Button permissions come from here; no client infers them from status strings."""
    if work is None:
        return Actions(reason_code="no_work")
    phase, desired = work["phase"], work["desired_state"]
    ended = phase in (Phase.DONE, Phase.CANCELLED)
    return Actions(
        can_pause=not ended and desired == DesiredState.RUN,
        can_resume=not ended and desired == DesiredState.PAUSED,
        can_stop=not ended,
        can_end=not ended,  # the older name of can_stop for a session's work
        can_retry=not ended and (phase == Phase.FAILED or work["reason_code"] in RETRYABLE_WAITS),
        can_verify=False,
        reason_code=work["reason_code"],
    )


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
    where = _redact(url).removeprefix("sqlite:///")
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


STORAGE_CORRUPT = "storage_corrupt"
USAGE_DB_MISSING = "usage_db_missing"
# SQLite's words for a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB)
_CORRUPTION = ("malformed", "not a database", "corrupt")


def is_corruption(message: str) -> bool:
    text = message.lower()
    return any(word in text for word in _CORRUPTION)


class WatchedDatabase(Database):
    """control.db as the server uses it: a transaction that meets a damaged file (a page of garbage,
    a truncated file) fails 503 ``storage_corrupt`` naming the file and what to do, and the damage is
    remembered (``corruption``) for health, which checks it again before it forgets it. Every user of
    the database in this process (requests, the Coordinator, the outbox) goes through here."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.corruption: str | None = None

    def transact(self, fn: Callable[[Tx], T], *, write: bool = True, probe: bool = False,
                 lock_wait_ms: int | None = None) -> T:
        try:
            return super().transact(fn, write=write, probe=probe, lock_wait_ms=lock_wait_ms)
        except StorageUnavailable as exc:
            if exc.code == STORAGE_CORRUPT or not is_corruption(str(exc)):
                raise
            self.corruption = str(exc)
            where = _redact(self.url).removeprefix("sqlite:///")
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


class GoalsService:
    def __init__(self, config: GoalsConfig) -> None:
        self.config = config
        self.control = WatchedDatabase(config.control_db_url)
        self.usage = Database(config.usage_db_url)
        self.registry = ToolRegistry(config.trusted_tools)
        self.price_error: str | None = None
        try:
            prices = load_price_table(config.price_table or None)
        except PriceTableError as exc:  # shown in health; every cost stays unknown rather than guessed
            self.price_error = str(exc)
            log.error("jupyter_goals: %s", exc)
            prices = PriceTable.parse(b'{"version": "unreadable", "models": {}}')
        self.prices = prices
        self.models_error: str | None = None
        try:
            specs = catalog.parse_specs(config.models or {})
        except ValueError as exc:  # shown in GET /models; the server runs with its default model
            self.models_error = str(exc)
            log.error("jupyter_goals: %s", exc)
            specs = {}
        self.catalog = catalog.ModelCatalog(config.default_model, specs, config.demo_model, prices)
        self.started_at = time.time()
        self.coordinator = Coordinator.from_config(self.control, config, registry=self.registry, prices=prices)
        self.outbox = OutboxDispatcher(self.control, self.usage, prices)
        self.event_tail = EventTail(self.control)
        self.supervisor: Supervisor | None = None
        self.degraded: Degraded | None = None
        # what to do about a control migration the file system failed (full, read-only, I/O error): it is
        # tried again by itself meanwhile; None: no such failure (a broken migration needs a person)
        self.migration_action: str | None = None
        self.control_checked_at: float | None = None  # the last start try's look at the control store (health)
        self.usage_degraded: str | None = None
        self.started = False  # the schema is migrated (or the store is degraded)
        self.usage_ready = False  # usage.db is migrated; until then receipts wait in the outbox
        self._usage_was_new = False  # usage.db held no schema at start: its ledger is rebuilt once ready
        self._usage_retry_at = 0.0
        self._ledger_published: str | None = None  # the ledger state last written to control.db
        # usage.db's (device, inode) when it was opened: a different one (or none) at its path means the
        # file was deleted or replaced while this server ran (its connections keep writing the old one)
        # the usage database this server's connections opened: a SQLite file's (device, inode), or when a
        # PostgreSQL ledger was created (``created_at``); None until it is migrated
        self._usage_identity: tuple[Any, ...] | None = None
        self._usage_checked_at = 0.0
        self.usage_lost: dict[str, Any] | None = None  # the ledger being rebuilt after that (health)
        self.usage_repaired: dict[str, Any] | None = None  # the last such rebuild, once done (health)
        self._corruption_checked_at = 0.0
        self.last_recovery: dict[str, Any] = {}
        self.event_streams = 0  # open SSE streams of GET /events (health shows it)
        # commits here call wake(); workers' and the CLI's arrive on the socket, other hosts' by NOTIFY (store/notify.py)
        self._wakeups = Listener(config.state_dir, ADMISSION, f"server-{os.getpid()}", url=config.control_db_url)
        self._notifier = Notifier(config.state_dir, url=config.control_db_url)
        self._next_due: float | None = None  # wall-clock time of the earliest backoff end seen
        self._tasks: list[asyncio.Task[None]] = []
        self._recover_lock = asyncio.Lock()
        self._config_saved = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        private_state_dir(self.config.state_dir)
        faults.configure(self.config.state_dir)
        self._config_saved = self._save_config()
        os.environ[catalog.NAMED_ENV] = self.catalog.export_named()  # workers resolve named models with it
        self._usage_was_new = await self._usage_is_new()
        await self._migrate_usage()
        migrated = await self._migrate_control()
        private_state_dir(self.config.state_dir)  # the files the start created: databases, saved configuration
        if migrated and self.usage_ready:
            await self._rebuild_ledger()
        if not migrated:
            log.error("jupyter_goals degraded: %s", self.degraded)
            self.started = True
            if self.degraded is not None and (self.degraded.code == ReasonCode.STORAGE_UNAVAILABLE
                                              or self.migration_action is not None):
                # a locked or briefly unreadable file, a full, read-only or failing disk heals by itself; a schema problem
                # needs a person
                self._tasks.append(asyncio.create_task(self._retry_start()))
            return
        await self._run()

    async def _usage_is_new(self) -> bool:
        """Whether the usage database holds no schema yet (a first start, or it was deleted)."""
        try:
            return await asyncio.to_thread(self.usage.transact, current_version, write=False) == 0
        except StorageUnavailable:
            return False

    async def _rebuild_ledger(self) -> None:
        """A new usage database beside a control.db that already applied operations to a ledger: the
        ledger was lost (usage.db deleted, a fresh shared schema). control.db's outbox still records
        every operation; they are applied again, once each (receipt keys)."""
        if not self._usage_was_new:
            return
        self._usage_was_new = False
        n = await self.control.run(c.requeue_done_outbox)
        if n:
            log.warning("usage ledger: the usage database was new while control.db had applied %s operations "
                        "to one; rebuilding the ledger from them (active-time intervals are not rebuilt)", n)
        if self.usage_lost is not None:
            self.usage_lost["operations"] = n

    async def _usage_identity_now(self) -> tuple[Any, ...] | None:
        """The identity of the usage database at the configured place now (None: there is none). Raises
        StorageUnavailable when a PostgreSQL ledger cannot be reached (that is not a loss)."""
        if self.usage.path is not None:
            return await asyncio.to_thread(file_identity, self.usage.path)
        created = await self.usage.run(created_at, write=False)
        return None if created is None else (created,)

    async def _usage_file_changed(self) -> str | None:
        """Whether the usage database is no longer the one this server's connections opened: usage.db at
        its path deleted or replaced by another file (a stat off the loop), or a PostgreSQL ledger dropped
        and created again, or emptied (one read of when its schema was created)."""
        if self._usage_identity is None:
            return None
        try:
            now = await self._usage_identity_now()
        except StorageUnavailable:
            return None  # unreachable, not lost: the outbox says so and keeps the receipts
        if now == self._usage_identity:
            return None
        if self.usage.path is not None:
            what = "deleted" if now is None else "replaced by another file"
            return (f"{self.usage.path} was {what} while the server ran; receipts written since went to a file "
                    "nobody sees. The ledger is reopened and rebuilt from control.db's outbox, each receipt once.")
        what = "emptied or dropped and created again (its tables are gone)" if now is None else "created again"
        return (f"the usage database {_redact(self.config.usage_db_url)} was {what} while the server ran. The "
                "ledger is migrated again and rebuilt from control.db's outbox, each receipt once.")

    async def _watch_ledger(self, wrote: bool) -> None:
        """On a slow tick (1 s) and right after receipts were written: a usage.db deleted or replaced (or a
        PostgreSQL ledger emptied, or dropped and created again) is closed, opened again (created and
        migrated) and rebuilt from control.db's outbox (as the next start would), each receipt once;
        health says so meanwhile. What went to the old file
        is applied again too: every operation control.db marked done is queued again."""
        now = time.monotonic()
        if not self.usage_ready or not (wrote or now - self._usage_checked_at >= 1.0):
            return
        self._usage_checked_at = now
        reason = await self._usage_file_changed()
        if reason is None:
            return
        log.warning("usage ledger: %s", reason)
        self.usage_lost = {"code": USAGE_DB_MISSING, "message": reason, "since": time.time(), "operations": None}
        old, self.usage = self.usage, Database(self.config.usage_db_url)
        self.outbox.usage = self.usage
        self.usage_ready, self._usage_was_new, self._usage_retry_at, self._usage_identity = False, True, 0.0, None
        await asyncio.to_thread(old.close)  # waits for a transaction still running on it

    async def _migrate_control(self) -> bool:
        """Migrate the control store, unless it is lost (store/known.py): gone, emptied or replaced since
        this state dir used it. Then nothing is created or written there: degraded ``control_db_missing``
        with what to do, tried again every 2 s (``_retry_start``) until it is back or the person chose
        to start over."""
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

    async def _migrate_usage(self) -> bool:
        try:
            await asyncio.to_thread(migrate, self.usage, "usage")
        except (MigrationFailed, StorageUnavailable) as exc:
            self.usage_degraded = str(exc)  # chat goes on; receipts wait in the outbox
            self._usage_retry_at = time.monotonic() + 5.0
            return False
        try:
            await self.usage.run(lambda tx: u.record_prices(tx, self.prices.version, self.prices.model_prices()))
        except StorageUnavailable as exc:
            self.usage_degraded = str(exc)
            self._usage_retry_at = time.monotonic() + 5.0
            return False
        try:  # the file its connections now hold open, or when the PostgreSQL ledger was created
            self._usage_identity = await self._usage_identity_now()
        except StorageUnavailable as exc:
            self.usage_degraded = str(exc)
            self._usage_retry_at = time.monotonic() + 5.0
            return False
        self.usage_ready = True
        return True

    async def _retry_start(self) -> None:
        delay = 1.0
        while True:
            missing = self.degraded is not None and self.degraded.code == ReasonCode.CONTROL_DB_MISSING
            await asyncio.sleep(2.0 if missing else delay)  # a store put back is used within seconds
            delay = min(delay * 2, 30.0)
            if await self._migrate_control():
                log.info("jupyter_goals: control store readable again; starting")
                await self._run()
                return
            if self.degraded is not None and self.degraded.code == ReasonCode.MIGRATION_FAILED \
                    and self.migration_action is None:
                log.error("jupyter_goals degraded: %s", self.degraded)  # a broken migration: a person acts
                return
            if self.degraded is not None and self.degraded.code == ReasonCode.CONTROL_DB_MISSING:
                continue  # said once at the start (health and doctor say it meanwhile)
            if self.migration_action is not None:
                log.warning("jupyter_goals: control migration tried again, still failing (%s); next try in %.0f s",
                            self.degraded, delay)

    def _save_config(self) -> bool:
        """Save the configuration, so that `jupyter goals recover --explain` decides with it. A state dir
        that cannot be written (a read-only mount) does not stop the start: the migration says why
        and is retried, and the configuration is saved once the store can be written (``_run``)."""
        try:
            self.config.save()
        except OSError as exc:
            log.warning("jupyter_goals: cannot save the configuration in %s: %s", self.config.state_dir, exc)
            return False
        return True

    async def _run(self) -> None:
        if not self._config_saved:
            self._config_saved = await asyncio.to_thread(self._save_config)
        self.started = True  # input and controls sent during recovery are accepted and win over old continuations
        found = await self.control.run(recovery_passes.unfinished_work, write=False)
        await self.recover()
        if found:  # the recovery summary (GET /recovery) of this start
            pass_id = c.new_id("pass")
            await self.control.run(lambda tx: recovery_passes.record_pass(tx, pass_id, found, host=host_name(),
                                                                           boot=boot_id()))
        if self.config.workers > 0:
            self.supervisor = Supervisor(
                self.config.workers,
                WorkerConfig.from_config(self.config),
                on_exit=self._worker_exited,
            )
            await self.supervisor.start()
        self._wakeups.start()
        self._tasks.append(asyncio.create_task(self._admission_loop()))
        self._tasks.append(asyncio.create_task(self._outbox_loop()))

    async def stop(self, grace_s: float = 10.0) -> None:
        """Graceful: stop admission, stop workers (they hand back checkpoints), close the stores."""
        self.coordinator.admission_open = False
        faults.crash_point("shutdown.after_admission_stop")
        for t in self._tasks:
            t.cancel()
        if self.supervisor is not None:
            await self.supervisor.stop(grace_s=grace_s)
        try:
            await asyncio.wait_for(self.outbox.dispatch_due(), timeout=2)
        except Exception:
            pass
        await self.event_tail.close()
        self._wakeups.close()
        self._notifier.close()
        await asyncio.to_thread(self.control.close)
        await asyncio.to_thread(self.usage.close)

    async def recover(self) -> dict[str, Any]:
        async with self._recover_lock:
            try:
                report = await self.coordinator.recover()
            except StorageUnavailable as exc:
                # a pass the store failed (damaged, full, locked) is still a pass: health shows when and why
                self.last_recovery = {"at": time.time(), "error": {"code": exc.code, "message": str(exc)}}
                raise
        self._passed(report)
        self.last_recovery = {"at": time.time(), **report.as_dict()}
        return self.last_recovery

    def _passed(self, report: RecoveryReport) -> None:
        """After a pass: wake the workers when it admitted work; remember when the next backoff ends."""
        self._next_due = report.next_due
        if report.admitted:
            self._notifier.notify(ATTEMPTS)

    async def _worker_exited(self, worker_id: str, code: int) -> bool:
        """Recover at once; True when the death was charged to work that worker ran."""
        report = await self.recover()
        return worker_id in report.get("charged", {}).values()

    def wake(self) -> None:
        """After a commit in this process that may create work: the admission loop runs now."""
        self._wakeups.wake()

    async def _admission_loop(self) -> None:
        """Admit when woken (a commit that creates work), when a backoff ends, on the safety tick and
        on the full reconcile pass; each reads only when nothing is to change."""
        last_full = time.monotonic()
        while True:
            now = time.monotonic()
            until = min(last_full + self.config.reconcile_interval_s, now + self.config.safety_tick_s)
            if self._next_due is not None:
                until = min(until, now + max(0.0, self._next_due - time.time()) + 0.01)
            await self._wakeups.wait(until - now)
            try:
                if time.monotonic() - last_full >= self.config.reconcile_interval_s:
                    last_full = time.monotonic()
                    await self.recover()
                else:
                    async with self._recover_lock:
                        self._passed(await self.coordinator.admit())
            except StorageUnavailable as exc:
                log.warning("admission: storage unavailable: %s", exc)
                await asyncio.sleep(1)
            except Exception:
                log.exception("admission loop")
                await asyncio.sleep(1)

    async def _outbox_loop(self) -> None:
        while True:
            try:
                await self._watch_ledger(wrote=False)
                if not self.usage_ready and time.monotonic() >= self._usage_retry_at and await self._migrate_usage():
                    await self._rebuild_ledger()  # usage.db came back new: its ledger is rebuilt, once
                if self.usage_ready:
                    applied = await self.outbox.dispatch_due()
                    self.usage_degraded = self.outbox.last_error
                    await self._watch_ledger(wrote=applied > 0)
                    await self._ledger_rebuilt()
            except Exception as exc:
                self.usage_degraded = str(exc)
            await self._publish_ledger_state()
            await asyncio.sleep(0.2)

    async def _ledger_rebuilt(self) -> None:
        """A rebuild after usage.db was lost ends when control.db has no operation left to apply."""
        if self.usage_lost is None or not self.usage_ready or self.usage_lost["operations"] is None:
            return
        if await self.control.run(c.pending_outbox_count, write=False):
            return
        lost, self.usage_lost = self.usage_lost, None
        self.usage_repaired = {**lost, "repaired_at": time.time()}
        log.warning("usage ledger: rebuilt from control.db's outbox (%s operations applied again)", lost["operations"])

    async def _publish_ledger_state(self) -> None:
        """Tell hard-budget checks (workers, Coordinator) whether the usage ledger is being written:
        while it is not, paid admission under a hard budget waits with ``budget_unverifiable``."""
        state = self.usage_degraded or (self.usage_lost or {}).get("message") or ""
        if not self.started or self.degraded is not None or state == self._ledger_published:
            return
        try:
            await self.control.run(lambda tx: budgets.set_ledger_error(tx, state))
        except StorageUnavailable:
            return
        self._ledger_published = state
        self.wake()  # recheck budgets now

    # ------------------------------------------------------------------ guards
    def check(self) -> None:
        if self.degraded is not None:
            raise self.degraded
        if not self.started:  # requests that arrive while the schema is migrated: 503, not a missing table
            raise Degraded(ReasonCode.STARTING, REASON_TEXT[ReasonCode.STARTING])

    # ------------------------------------------------------------------ queries
    async def health(self) -> dict[str, Any]:
        # a write or read that failed at run time (disk full, a lock held past the busy timeout, an
        # unreadable file), rechecked now without writing: the state, the reason and what to do
        problems = await asyncio.to_thread(self.control.recheck) if self.control.problems else {}
        problem = problems.get("write") or problems.get("read")
        corruption = await self._corruption_rechecked()
        if corruption is not None:  # a damaged file outranks what an empty transaction could not see
            problem = StorageUnavailable(corruption, STORAGE_CORRUPT)
        lost = self.usage_lost
        if lost is None and self.started and self.usage_ready:  # said at once; the outbox loop rebuilds it
            reason = await self._usage_file_changed()
            if reason is not None:
                lost = {"code": USAGE_DB_MISSING, "message": reason}
        databases: dict[str, Any] = {
            "control": {"url": _redact(self.config.control_db_url), "ok": self.degraded is None and problem is None},
            "usage": {"url": _redact(self.config.usage_db_url), "ok": self.usage_degraded is None and lost is None},
        }
        if self.degraded is not None:
            databases["control"]["error"] = {"code": self.degraded.code.value, "message": str(self.degraded)}
            if self.migration_action is not None:
                databases["control"]["error"]["action"] = self.migration_action
                databases["control"]["error"]["checked_at"] = self.control_checked_at  # tried again meanwhile
        elif problem is not None:
            databases["control"]["error"] = {"code": problem.code, "message": str(problem),
                                             "action": storage_action(problem.code, self.config.control_db_url)}
        if self.usage_degraded:
            databases["usage"]["error"] = {"code": "storage_unavailable", "message": self.usage_degraded}
        elif lost is not None:
            databases["usage"]["error"] = {
                "code": lost["code"], "message": lost["message"],
                "action": "Nothing to do: the ledger is being rebuilt from control.db by itself; usage totals are "
                          "incomplete until then. Receipts are never counted twice."}
        if self.usage_repaired is not None:
            databases["usage"]["repaired"] = {k: self.usage_repaired[k] for k in ("code", "message", "operations",
                                                                                  "since", "repaired_at")}
        ok = self.degraded is None and problem is None and self.usage_degraded is None and lost is None
        status = "ok" if ok else "degraded"
        if self.degraded is None and not self.started:
            status = "starting"
        reason = self.degraded.code.value if self.degraded else (problem.code if problem is not None else "")
        if not reason and lost is not None and not self.usage_degraded:
            reason = lost["code"]
        return {
            "status": status,
            "reason_code": reason or ("" if self.started else "starting"),
            "databases": databases,
            "workers": self.supervisor.alive() if self.supervisor else [],
            "recovery": self.last_recovery,
            "admission_open": self.coordinator.admission_open,
            "event_streams": self.event_streams,
            "host_name": host_name(),
            "boot_id": boot_id(),
        }

    async def _corruption_rechecked(self) -> str | None:
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

    async def create_session(self, body: CreateSession, root_dir: str) -> dict[str, Any]:
        """A new session; its folder is ``body.cwd`` (absolute, or relative to the server's root directory
        ``root_dir``), and the root directory itself when none is given — never the server process's cwd."""
        self.check()
        cwd = session_folder(body.cwd, root_dir)
        model = self.catalog.resolve(body.model) if body.model else self.catalog.default_model  # UnknownModel → 400
        perms = (body.permissions.model_dump() if body.permissions else {"mode": "ask", "allow": []})
        row = await self.control.run(lambda tx: c.create_session(tx, body.title or "Untitled chat", cwd, model, perms))
        return await self.snapshot(row["session_id"])

    async def list_sessions(self, limit: int = 100, after: tuple[float, str] | None = None,
                            states: list[str] | None = None, text: str | None = None) -> dict[str, Any]:
        """One keyset page of session summaries, newest activity first (``next_cursor``: the next page)."""
        self.check()

        def run(tx: Tx) -> tuple[list[dict[str, Any]], str | None]:
            out = []
            rows = c.page_sessions(tx, limit=limit + 1, after=after, states=states, text=text)
            for s in rows[:limit]:
                work = c.current_work(tx, s["session_id"])
                goal = goal_store.current_goal(tx, s["session_id"])
                out.append({**_session_view(s), "work": c.work_view(work) if work else None,
                            "actions": actions_for(work).model_dump(), "state": s["state"],
                            "activity_at": s["activity"],
                            "goal": {k: goal[k] for k in ("goal_id", "objective", "state", "revision")} if goal else None})
            last = rows[limit - 1] if len(rows) > limit else None
            return out, (encode_cursor(last["activity"], last["session_id"]) if last else None)

        sessions, cursor = await self.control.run(run, write=False)
        return {"sessions": sessions, "next_cursor": cursor}

    async def models(self) -> dict[str, Any]:
        """``GET /models``: the listed models (credentials are checked now, in this server's environment)."""
        answer: dict[str, Any] = {"models": [m.model_dump() for m in self.catalog.info()],
                                  "default_model": self.catalog.default_name}
        if self.models_error:
            answer["config_error"] = self.models_error
        return answer

    async def recovery_summary(self) -> dict[str, Any]:
        """``GET /recovery``: what the last recovery pass after a server start did with each unfinished
        work item (continued, waiting, paused, stopped, failed), with the actions allowed now."""
        self.check()
        header, rows = await self.control.run(recovery_passes.last_pass, write=False)
        items = []
        counts = {o.value: 0 for o in RecoveryOutcome}
        for r in rows:
            outcome = r["detail"].get("outcome", RecoveryOutcome.CONTINUED.value)
            counts[outcome] = counts.get(outcome, 0) + 1
            now = {"phase": r["w_phase"], "desired_state": r["w_desired"], "reason_code": r["w_reason_code"]}
            items.append({
                "work_id": r["work_id"], "session_id": r["session_id"], "session_title": r["title"], "kind": r["w_kind"],
                "outcome": outcome, "reason_code": r["reason_code"] or "",
                "reason": r["detail"].get("reason") or reason_text(r["reason_code"] or ""),
                "decided_at": r["created_at"], "phase": r["phase"], "current_phase": r["w_phase"],
                "actions": actions_for(now).model_dump(),
            })
        return {"recovered_at": header["at"] if header else None,
                "host_name": header["host_name"] if header else host_name(),
                "boot_id": header["boot_id"] if header else boot_id(),
                "server_started_at": self.started_at, "counts": counts, "items": items}

    async def snapshot(self, session_id: str, after: int = 0, limit: int = 500, before: int | None = None) -> dict[str, Any]:
        """The session snapshot; its transcript page is ``limit`` items after ``after`` or, with
        ``before`` (a seq, or ``LATEST``), the ``limit`` items just before it, in seq order."""
        self.check()

        def run(tx: Tx) -> dict[str, Any]:
            s = c.get_session(tx, session_id)
            work = c.current_work(tx, session_id)
            page = c.transcript_page(tx, session_id, limit=limit, after=after, before=before)
            approvals = c.list_approvals(tx, "pending", session_id)
            goal = goal_store.current_goal(tx, session_id)  # the composer shows the current Goal only
            return {
                "session": _session_view(s),
                "work": c.work_view(work) if work else None,
                "goal": goal_lifecycle.view(tx, goal) if goal else None,
                "todo": goal_store.get_todo(tx, session_id)[0],
                "approvals": approvals,
                "transcript": page,
                "actions": actions_for(work).model_dump(),
                "event_seq": c.last_event_seq(tx),
            }

        snap = await self.control.run(run, write=False)
        snap["usage"] = await self.usage_summary(session_id=session_id)
        return snap

    async def usage_summary(self, session_id: str | None = None, goal_id: str | None = None) -> dict[str, Any]:
        """The ledger's totals (usage.db) beside active time (control.db's attempt records).

        usage.db being unreadable never blocks chat: the answer says so, and the receipts wait in
        the outbox until it is readable again."""
        active = await self.control.run(
            lambda tx: c.active_time(tx, session_id=session_id, goal_id=goal_id), write=False
        )
        try:
            ledger = await self.usage.run(
                lambda tx: u.summary(tx, session_id=session_id, goal_id=goal_id), write=False
            )
        except Exception as exc:
            ledger = {"error": "storage_unavailable", "known_cost_usd": None, "estimated_cost_usd": None,
                      "known_tokens": None, "unknown_usage_requests": None,
                      "display": f"Usage temporarily unavailable (usage.db: {exc}); receipts are kept and counted later."}
        pending = await self.control.run(c.pending_outbox_count, write=False)
        return {**ledger, **active, "ledger_writes_pending": pending, "price_version": self.prices.version}

    async def usage_answer(self, session_id: str | None, goal_id: str | None) -> dict[str, Any]:
        self.check()
        if session_id:
            await self.control.run(lambda tx: c.get_session(tx, session_id), write=False)  # 404 when unknown
        elif goal_id and not await self.control.run(
            lambda tx: c.goal_has_requests(tx, goal_id), write=False
        ) and not await self._goal_exists(goal_id):
            raise c.NotFound(f"goal {goal_id} not found")
        return await self.usage_summary(session_id=session_id, goal_id=goal_id)

    async def _goal_exists(self, goal_id: str) -> bool:
        def run(tx: Tx) -> bool:
            try:
                return goal_store.find_goal(tx, goal_id) is not None
            except Exception:  # no goals table in this schema
                return False

        return await self.control.run(run, write=False)

    async def post_message(self, session_id: str, body: PostMessage) -> tuple[dict[str, Any], bool]:
        self.check()
        faults.crash_point("input.before_accept")

        def run(tx: Tx) -> tuple[Row, bool]:
            s = c.get_session(tx, session_id)
            delivery = goal_lifecycle.message_delivery(tx, session_id, body.delivery)  # user input outranks continuation
            return c.accept_message(tx, s, body.text, body.client_request_id, delivery,
                                    auto_recover=self.config.auto_recover, host=host_name())

        msg, created = await self.control.run(run)
        faults.crash_point("input.after_accept")
        self.wake()
        return {"message_id": msg["message_id"], "work_id": msg["work_id"], "delivery": msg["delivery"]}, created

    async def session_action(self, session_id: str, action: str, expected: int | None,
                             effect_id: str | None = None) -> dict[str, Any]:
        self.check()
        if action == "cancel_tool":  # never the control path below: it has no cancel_tool (SessionAction needs effect_id)

            def cancel(tx: Tx) -> Row:
                eff = c.request_cancel_tool(tx, session_id, effect_id or "")  # 404 unknown, 409 not running
                if not cancellable(eff["tool"]):  # raising undoes the request: nothing is recorded
                    raise c.VersionConflict(
                        f"tool call {eff['call_id']} ({eff['tool']}) cannot be cancelled: only a running shell"
                        " command can; this call ends by itself")
                return eff

            eff = await self.control.run(cancel)
            return {"effect_id": eff["effect_id"], "call_id": eff["call_id"], "cancel_requested": True}

        def run(tx: Tx) -> Row:
            c.get_session(tx, session_id)
            work = c.current_work(tx, session_id)
            if work is None:  # the session exists: its state, not its id, refuses the action
                raise c.VersionConflict(f"session {session_id} has no work to {action}")
            if action == "stop":
                # End applies to the whole session: everything queued behind it stops too
                for other in c.unfinished_work_of_session(tx, session_id, except_work_id=work["work_id"]):
                    c.apply_control(tx, other, "stop", None)
                    goal_lifecycle.sync_with_work(tx, other, "stop")
            if action == "retry" and work["reason_code"] == ReasonCode.TOOL_CHANGED:
                # the person accepts the new implementations: planned calls are bound to them
                c.rebind_planned_calls(tx, work, {n: (s.identity, s.digest) for n, s in self.registry.tools.items()})
            work = c.apply_control(tx, work, action, expected)
            goal_lifecycle.sync_with_work(tx, work, action)  # a Goal's work item moves its Goal too
            return work

        work = await self.control.run(run)
        if action == "stop":
            faults.crash_point("control.after_stop_commit")
        self.wake()
        return {"work_id": work["work_id"], "control_version": work["control_version"],
                "desired_state": work["desired_state"], "phase": work["phase"]}

    async def update_session(self, session_id: str, body: UpdateSession) -> dict[str, Any]:
        """Change the permission scope; unfinished work follows it and pending approvals are voided."""
        self.check()
        perms = body.permissions.model_dump()
        await self.control.run(lambda tx: c.change_permissions(tx, session_id, perms, body.expected_control_version))
        self.wake()
        return await self.snapshot(session_id)

    async def stop_all(self) -> dict[str, Any]:
        self.check()
        stopped = await self.control.run(c.stop_all)
        faults.crash_point("control.after_stop_commit")  # the intent is durable; kills follow (worker, sweep)
        self.wake()
        return {"stopped": stopped}

    async def approvals(self, state: str | None) -> dict[str, Any]:
        self.check()
        return {"approvals": await self.control.run(lambda tx: c.list_approvals(tx, state), write=False)}

    async def decide_approval(self, approval_id: str, decision: str) -> dict[str, Any]:
        self.check()
        row = await self.control.run(lambda tx: c.decide_approval(tx, approval_id, decision))
        self.wake()
        return {"approval_id": approval_id, "state": row["state"]}

    async def events(self, after: int, limit: int) -> dict[str, Any]:
        self.check()
        return await self.event_tail.after(after, limit)


    # ------------------------------------------------------------------ jobs
    async def create_job(self, body: CreateJob) -> tuple[dict[str, Any], bool]:
        """Commit the Job (its work item, saved Goal identity and permissions) before answering 202."""
        self.check()
        faults.crash_point("input.before_accept")
        job, created = await self.control.run(lambda tx: waits.create_job(
            tx, body.session_id, body.input, body.goal_id, body.client_request_id, host=host_name(),
            auto_recover=self.config.auto_recover))
        faults.crash_point("input.after_accept")
        self.wake()
        return {"job_id": job["job_id"], "work_id": job["work_id"], "session_id": job["session_id"]}, created

    async def get_job(self, job_id: str) -> dict[str, Any]:
        self.check()

        def run(tx: Tx) -> dict[str, Any]:
            view = waits.job_view(tx, waits.get_job(tx, job_id))
            view["actions"] = actions_for(c.get_work(tx, view["work_id"])).model_dump()
            return view

        return await self.control.run(run, write=False)

    # ------------------------------------------------------------------ goals
    async def _goal_answer(self, fn: Any, write: bool = False) -> dict[str, Any]:
        """Run ``fn(tx) -> goal row`` and answer the goal view with its usage."""
        view = await self.control.run(lambda tx: self._goal_view(tx, fn(tx)), write=write)
        view["usage"] = await self.usage_summary(goal_id=view["goal_id"])
        return view

    def _goal_view(self, tx: Tx, goal: Row) -> dict[str, Any]:
        """The Goal's REST view; with a hard budget, also what is spent, reserved and unknown."""
        view = goal_lifecycle.view(tx, goal)
        limits = budgets.goal_budget(goal)
        if budgets.is_hard(limits):
            spend = budgets.goal_spend(tx, goal["goal_id"])
            view["budget_status"] = {
                "known_cost_usd": round(spend.known_cost_usd, 6), "known_tokens": spend.known_tokens,
                "uncertain_requests": spend.uncertain, "reserved_usd": spend.reserved_usd,
                "reserved_tokens": spend.reserved_tokens, "unpriced_requests": spend.unpriced,
                "active_seconds": round(spend.active_seconds, 3), "unknown_active_seconds": round(spend.unknown_seconds, 3),
                "ledger_error": spend.ledger_error or None,
            }
        return view

    async def create_goal(self, body: CreateGoal) -> dict[str, Any]:
        """Commit the objective, requirements, budget and the Goal's work item before answering 201."""
        self.check()
        faults.crash_point("input.before_accept")
        budget = body.budget.model_dump(exclude_none=True) if body.budget else {}

        def run(tx: Tx) -> Row:
            session = c.get_session(tx, body.session_id)
            return goal_lifecycle.create(tx, session, body.objective, body.requirements, budget, host=host_name(),
                                         auto_recover=self.config.auto_recover)

        answer = await self._goal_answer(run, write=True)
        faults.crash_point("input.after_accept")
        self.wake()
        return answer

    async def get_goal(self, goal_id: str) -> dict[str, Any]:
        self.check()
        return await self._goal_answer(lambda tx: goal_store.get_goal(tx, goal_id))

    async def list_goals(self, session_id: str | None) -> dict[str, Any]:
        self.check()

        def run(tx: Tx) -> list[dict[str, Any]]:
            if session_id:
                c.get_session(tx, session_id)  # 404 when unknown
            return [self._goal_view(tx, goal) for goal in goal_store.list_goals(tx, session_id)]

        goals = await self.control.run(run, write=False)
        for view in goals:
            view["usage"] = await self.usage_summary(goal_id=view["goal_id"])
        return {"goals": goals}

    async def update_goal(self, goal_id: str, body: UpdateGoal) -> dict[str, Any]:
        self.check()
        budget = body.budget.model_dump(exclude_none=True) if body.budget else None
        answer = await self._goal_answer(lambda tx: goal_lifecycle.revise(
            tx, goal_id, body.expected_revision, objective=body.objective, requirements=body.requirements,
            budget=budget, reason=body.reason), write=True)
        self.wake()
        return answer

    async def goal_action(self, goal_id: str, body: GoalAction) -> dict[str, Any]:
        self.check()
        answer = await self._goal_answer(
            lambda tx: goal_lifecycle.act(tx, goal_id, body.action, body.expected_revision), write=True)
        if body.action == "end":
            faults.crash_point("control.after_stop_commit")
        self.wake()
        return answer

    async def goal_history(self, session_id: str) -> dict[str, Any]:
        self.check()

        def run(tx: Tx) -> list[Row]:
            c.get_session(tx, session_id)
            return [goal_lifecycle.history_view(r) for r in goal_store.history(tx, session_id)]

        return {"records": await self.control.run(run, write=False)}

    async def history_record(self, record_id: str) -> dict[str, Any]:
        self.check()
        record = await self.control.run(lambda tx: goal_store.history_record(tx, record_id), write=False)
        return goal_lifecycle.history_view(record)

    # ------------------------------------------------------------------ notebooks
    async def notebook_session(self, body: NotebookSession, path: str, root_dir: str) -> tuple[dict[str, Any], bool]:
        """The session bound to the notebook at API ``path`` (created on first use, cwd = the notebook's
        folder), or ``body.session_id`` bound to it. One row per path in control.db. A folder's key
        (``work/``, ``./`` for the root: kernels that cannot know their notebook) gets the folder as cwd."""
        self.check()
        if body.session_id:
            sid = body.session_id
            row = await self.control.run(lambda tx: notebooks.bind(tx, path, sid))
            return notebooks.view(row), False
        folder = os.path.normpath(os.path.join(root_dir, os.path.dirname(path)))  # noqa: ASYNC240 - no disk access
        cwd = folder if await asyncio.to_thread(os.path.isdir, folder) else root_dir
        model = self.catalog.resolve(body.model) if body.model else self.catalog.default_model  # names as POST /sessions
        perms = body.permissions.model_dump() if body.permissions else {"mode": "ask", "allow": []}
        title = body.title or (os.path.basename(folder) + "/" if path.endswith("/") else os.path.basename(path))
        row, created = await self.control.run(lambda tx: notebooks.get_or_create(tx, path, title, cwd, model, perms))
        return notebooks.view(row), created

    async def notebook_renamed(self, old: str, new: str) -> int:
        """Follow the contents manager's rename (``old`` and ``new`` are API paths)."""
        if self.degraded is not None or not self.started:
            return 0
        return int(await self.control.run(lambda tx: notebooks.rename(tx, old.strip("/"), new.strip("/"))))


def session_folder(cwd: str | None, root_dir: str) -> str:
    """A session's folder as an absolute path: ``cwd`` (``~`` expanded) when absolute, else resolved
    against the server's root directory, which an empty ``cwd`` means. Path arithmetic, no disk access."""
    root = os.path.abspath(os.path.expanduser(root_dir))
    given = os.path.expanduser((cwd or "").strip())
    return os.path.normpath(os.path.join(root, given)) if given else root


def notebook_api_path(path: str, root_dir: str) -> str:
    """A notebook's API path (relative to the server root, ``/``-separated), from an API path or from
    the absolute OS path a kernel gets in ``JPY_SESSION_NAME``. ValueError when it leaves the root.
    A path ending in ``/`` names a folder, and keeps its ``/`` (``./`` for the root): the key of the
    kernels working there that cannot know their notebook (nbconvert, papermill)."""
    raw = path.strip()
    folder = raw.endswith(("/", os.sep))
    if os.path.isabs(raw):
        root = os.path.abspath(root_dir)
        full = os.path.abspath(raw)
        if os.path.commonpath([root, full]) != root:
            raise ValueError(f"{path!r} is outside the server root {root}")
        raw = os.path.relpath(full, root)
    norm = posixpath.normpath(raw.replace(os.sep, "/")).lstrip("/")
    if folder and norm in ("", "."):
        return "./"
    if norm in ("", ".") or norm == ".." or norm.startswith("../"):
        raise ValueError(f"{path!r} is not a notebook path inside the server root")
    return norm + "/" if folder else norm


LATEST = 2**62  # ``?before=latest``: before every seq


# the cursor of GET /sessions, as the OpenAPI document states it: every string it matches is one the
# server reads (a base64 cursor was opaque to the document, so a client could not tell a good one)
CURSOR_PATTERN = r"^[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,2})?~[A-Za-z0-9_\-]{1,100}$"
_CURSOR = re.compile(CURSOR_PATTERN)


def encode_cursor(activity: float, session_id: str) -> str:
    """The ``next_cursor`` of ``GET /sessions``: the last row's keyset key, ``<activity>~<session_id>``
    (``repr`` of the float, so it reads back exactly)."""
    return f"{float(activity)!r}~{session_id}"


def decode_cursor(cursor: str) -> tuple[float, str]:
    """ValueError when ``cursor`` is not one :func:`encode_cursor` made (or, before it, the base64 of
    ``[activity, session_id]``, still read so that a listing survives an upgrade)."""
    if _CURSOR.fullmatch(cursor):
        activity, session_id = cursor.split("~")
        return float(activity), session_id
    try:
        activity, session_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except Exception as exc:
        raise ValueError("cursor is not a next_cursor of GET /sessions") from exc
    if not isinstance(activity, (int, float)) or isinstance(activity, bool) or not isinstance(session_id, str):
        raise ValueError("cursor is not a next_cursor of GET /sessions")
    return float(activity), session_id


def _session_view(s: Row) -> dict[str, Any]:
    return {k: s[k] for k in ("session_id", "title", "cwd", "model", "permissions", "created_at", "updated_at")}


_redact = known.redact
