"""The server's background loops: admission (the Coordinator's passes, woken by commits) and the usage
outbox (receipts applied to usage.db, its loss found and rebuilt, the ledger's state published for the
hard-budget checks; woken by this host's workers' commits, else once per safety tick while all is well). ``Loops.recover`` is the one way a pass runs, so two never overlap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from jupyter_goals.config import GoalsConfig
from jupyter_goals.host.wake import ADMISSION, ATTEMPTS, CONTROLS, EVENTS, Listener, Notifier
from jupyter_goals.recovery.coordinator import Coordinator, RecoveryReport
from jupyter_goals.server.startup import Stores
from jupyter_goals.store.db import StorageUnavailable
from jupyter_goals.usage import budget as budgets
from jupyter_goals.usage.ledger import OutboxDispatcher

log = logging.getLogger(__name__)


class Loops:
    def __init__(self, config: GoalsConfig, stores: Stores, coordinator: Coordinator,
                 outbox: OutboxDispatcher) -> None:
        self.config = config
        self.stores = stores
        self.coordinator = coordinator
        self.outbox = outbox
        self.last_recovery: dict[str, Any] = {}  # health shows it (``LastRecovery``)
        # commits here call wake(); workers' and the CLI's arrive on the socket, other hosts' by NOTIFY
        self._name = f"server-{os.getpid()}"
        self._wakeups = Listener(config.state_dir, ADMISSION, self._name, url=config.control_db_url)
        self._notifier = Notifier(config.state_dir, url=config.control_db_url)
        # the outbox loop wakes when this host's workers commit (a settled request writes its outbox row):
        # a receipt reaches the ledger at once, and an idle server reads the outbox once per safety tick
        self._outbox_wakeups = Listener(config.state_dir, EVENTS, f"outbox-{os.getpid()}")
        # a shared PostgreSQL store: a control committed here may concern another host's work
        self._shared = config.control_db_url.startswith("postgresql")
        self._next_due: float | None = None  # wall-clock time of the earliest backoff end seen
        self._ledger_published: str | None = None  # the ledger state last written to control.db
        self._tasks: list[asyncio.Task[None]] = []
        self._recover_lock = asyncio.Lock()

    def start(self) -> None:
        self._wakeups.start()
        self._outbox_wakeups.start()
        self._tasks.append(asyncio.create_task(self._admission_loop()))
        self._tasks.append(asyncio.create_task(self._outbox_loop()))

    def cancel(self) -> None:
        for t in self._tasks:
            t.cancel()

    async def drain(self) -> None:
        """At shutdown: apply what the outbox holds (2 s at most), then stop listening for wake-ups."""
        try:
            await asyncio.wait_for(self.outbox.dispatch_due(), timeout=2)
        except Exception:
            pass
        self._wakeups.close()
        self._outbox_wakeups.close()
        self._notifier.close()

    def wake(self) -> None:
        """After a commit in this process that may create work or change a control: the admission loop runs
        now, this host's workers' running calls look for a Stop or cancel, and on a shared PostgreSQL store
        every other host's too (an approval, Resume or Stop given here for their work)."""
        self._wakeups.wake()
        self._notifier.notify(CONTROLS)
        if self._shared:
            self._notifier.notify(ADMISSION, exclude=self._name)

    # ------------------------------------------------------------------ recovery passes
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

    async def worker_exited(self, worker_id: str, code: int) -> bool:
        """Recover at once; True when the death was charged to work that worker ran."""
        report = await self.recover()
        return worker_id in report.get("charged", {}).values()

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

    # ------------------------------------------------------------------ the usage outbox
    async def _outbox_loop(self) -> None:
        stores = self.stores
        while True:
            applied = 0
            try:
                await self._watch_ledger(wrote=False)
                if not stores.usage_ready and time.monotonic() >= stores.usage_retry_at and await stores.migrate_usage():
                    await stores.rebuild_ledger()  # usage.db came back new: its ledger is rebuilt, once
                if stores.usage_ready:
                    applied = await self.outbox.dispatch_due()
                    stores.usage_degraded = self.outbox.last_error
                    await self._watch_ledger(wrote=applied > 0)
                    await stores.ledger_rebuilt()
            except Exception as exc:
                stores.usage_degraded = str(exc)
            await self._publish_ledger_state()
            # more may be due, or the ledger is failing (its backoff, its return): look again soon;
            # else when a worker commits, or after a safety tick (the server's own commits, backoffs)
            busy = applied > 0 or not stores.usage_ready or stores.usage_degraded is not None
            await self._outbox_wakeups.wait(0.2 if busy else self.config.safety_tick_s)

    async def _watch_ledger(self, wrote: bool) -> None:
        if await self.stores.watch_ledger(wrote):
            self.outbox.usage = self.stores.usage  # the database opened again in its place

    async def _publish_ledger_state(self) -> None:
        """Tell hard-budget checks (workers, Coordinator) whether the usage ledger is being written:
        while it is not, paid admission under a hard budget waits with ``budget_unverifiable``."""
        state = self.stores.ledger_state()
        if not self.stores.started or self.stores.degraded is not None or state == self._ledger_published:
            return
        try:
            await self.stores.control.run(lambda tx: budgets.set_ledger_error(tx, state))
        except StorageUnavailable:
            return
        self._ledger_published = state
        self.wake()  # recheck budgets now
