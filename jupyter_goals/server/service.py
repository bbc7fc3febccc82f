"""GoalsService: the one object the handlers and ``GoalsApp`` hold. It builds the server's parts and
runs its start and stop; the work is theirs:

- ``stores`` (``server/startup.py``): control.db and usage.db, their migrations and storage states;
- ``loops`` (``server/loops.py``): admission and the usage outbox, the recovery passes;
- ``queries`` (``server/queries.py``) and ``commands`` (``server/commands.py``): the REST answers;
- ``health()`` (``server/health.py``).

A start that meets a store it cannot use leaves the server degraded (every route but health answers
503) and, when the problem heals by itself (a full disk, a lock, a control store put back), tries again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from jupyter_goals import faults
from jupyter_goals.config import GoalsConfig
from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.models import ReasonCode
from jupyter_goals.recovery.coordinator import Coordinator
from jupyter_goals.runtime.supervisor import Supervisor
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.server import catalog
from jupyter_goals.server.commands import Commands
from jupyter_goals.server.event_hub import EventHub
from jupyter_goals.server.health import Health, health
from jupyter_goals.server.loops import Loops
from jupyter_goals.server.queries import Queries
from jupyter_goals.server.startup import Stores, private_state_dir
from jupyter_goals.store import control as c
from jupyter_goals.store import recovery_passes
from jupyter_goals.store.db import StorageUnavailable
from jupyter_goals.store.events import EventTail
from jupyter_goals.usage.ledger import OutboxDispatcher
from jupyter_goals.usage.prices import PriceTable, PriceTableError, load_price_table

log = logging.getLogger(__name__)


class GoalsService:
    def __init__(self, config: GoalsConfig) -> None:
        self.config = config
        self.registry = ToolRegistry(config.trusted_tools)
        self.price_error: str | None = None
        try:
            prices = load_price_table(config.price_table or None)
        except PriceTableError as exc:  # every cost stays unknown rather than guessed
            self.price_error = str(exc)
            log.error("jupyter_goals: %s", exc)
            prices = PriceTable.parse(b'{"version": "unreadable", "models": {}}')
        self.prices = prices
        models_error: str | None = None
        try:
            specs = catalog.parse_specs(config.models or {})
        except ValueError as exc:  # shown in GET /models; the server runs with its default model
            models_error = str(exc)
            log.error("jupyter_goals: %s", exc)
            specs = {}
        self.catalog = catalog.ModelCatalog(config.default_model, specs, config.demo_model, prices)
        self.stores = Stores(config, prices)
        self.coordinator = Coordinator(self.stores.control, config, registry=self.registry, prices=prices)
        self.outbox = OutboxDispatcher(self.stores.control, self.stores.usage, prices)
        self.event_tail = EventTail(self.stores.control)
        self.loops = Loops(config, self.stores, self.coordinator, self.outbox)
        self.queries = Queries(self.stores, self.catalog, self.event_tail, started_at=time.time(),
                               models_error=models_error)
        self.commands = Commands(config, self.stores, self.queries, self.catalog, self.registry, self.loops.wake)
        self.event_hub = EventHub(config, self.queries, self.event_tail)  # GET /events streams follow it
        self.stores.control.after_commit = self.event_hub.committed
        self.supervisor: Supervisor | None = None
        self.event_streams = 0  # open SSE streams of GET /events (health shows it)
        self._tasks: list[asyncio.Task[None]] = []
        self._config_saved = False

    async def health(self) -> Health:
        return await health(self.stores, workers=self.supervisor.alive() if self.supervisor else [],
                            recovery=self.loops.last_recovery, admission_open=self.coordinator.admission_open,
                            event_streams=self.event_streams)

    async def notebook_renamed(self, old: str, new: str) -> int:
        """Follow the contents manager's rename (``old`` and ``new`` are API paths)."""
        return await self.commands.notebook_renamed(old, new)

    # ------------------------------------------------------------------ start and stop
    async def start(self) -> None:
        stores = self.stores
        private_state_dir(self.config.state_dir)
        faults.configure(self.config.state_dir)
        self._config_saved = self._save_config()
        os.environ[catalog.NAMED_ENV] = self.catalog.export_named()  # workers resolve named models with it
        stores.usage_was_new = await stores.usage_is_new()
        await stores.migrate_usage()
        migrated = await stores.migrate_control()
        private_state_dir(self.config.state_dir)  # the files the start created: databases, saved configuration
        if migrated and stores.usage_ready:
            await stores.rebuild_ledger()
        if not migrated:
            log.error("jupyter_goals degraded: %s", stores.degraded)
            stores.started = True
            if stores.heals_by_itself():
                self._tasks.append(asyncio.create_task(self._retry_start()))
            return
        await self._run()

    async def _retry_start(self) -> None:
        stores = self.stores
        delay = 1.0
        while True:
            missing = stores.degraded is not None and stores.degraded.code == ReasonCode.CONTROL_DB_MISSING
            await asyncio.sleep(2.0 if missing else delay)  # a store put back is used within seconds
            delay = min(delay * 2, 30.0)
            if await stores.migrate_control():
                log.info("jupyter_goals: control store readable again; starting")
                await self._run()
                return
            if stores.degraded is not None and stores.degraded.code == ReasonCode.MIGRATION_FAILED \
                    and stores.migration_action is None:
                log.error("jupyter_goals degraded: %s", stores.degraded)  # a broken migration: a person acts
                return
            if stores.degraded is not None and stores.degraded.code == ReasonCode.CONTROL_DB_MISSING:
                continue  # said once at the start (health and doctor say it meanwhile)
            if stores.migration_action is not None:
                log.warning("jupyter_goals: control migration tried again, still failing (%s); next try in %.0f s",
                            stores.degraded, delay)

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
        self.stores.started = True  # input and controls sent during recovery are accepted and win over old continuations
        delay = 1.0
        while True:
            try:
                await self._first_pass()
                break
            except StorageUnavailable as exc:  # the store went away mid-pass (a database restart): health says so
                log.warning("jupyter_goals: the first recovery pass failed (%s); trying again in %.0f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        if self.config.workers > 0:
            self.supervisor = Supervisor(self.config, on_exit=self.loops.worker_exited)
            await self.supervisor.start()
        self.loops.start()

    async def _first_pass(self) -> None:
        """The first recovery pass of this start and its summary (``GET /recovery``); harmless to repeat
        after the store failed part-way (each of its transactions commits whole or not at all)."""
        control = self.stores.control
        since = time.time()
        found = await control.run(lambda tx: recovery_passes.unfinished_work(tx, host_name()), write=False)
        await self.loops.recover()
        if found:
            pass_id = c.new_id("pass")
            await control.run(lambda tx: recovery_passes.record_pass(tx, pass_id, found, host=host_name(),
                                                                      boot=boot_id(), since=since))

    async def stop(self, grace_s: float = 10.0) -> None:
        """Graceful: stop admission, stop workers (they hand back checkpoints), close the stores."""
        self.coordinator.admission_open = False
        faults.crash_point("shutdown.after_admission_stop")
        self.loops.cancel()
        for t in self._tasks:
            t.cancel()
        if self.supervisor is not None:
            await self.supervisor.stop(grace_s=grace_s)
        await self.loops.drain()
        await self.event_hub.close()
        await self.event_tail.close()
        await self.stores.close()
