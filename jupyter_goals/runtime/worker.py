"""The worker process (the "JobRunner"): ``python -m jupyter_goals.runtime.worker``.

It registers with a new generation, heartbeats its lease, claims admitted attempts and runs them
concurrently up to its capacity. It never decides recovery. It looks for an attempt to claim when
the admission loop wakes it (``host/wake.py``), when one of its attempts ends, and on a slow
safety tick; finding none takes a read only. An attempt's end wakes the admission loop. SQLite transactions run inline on its
event loop (one short fsync'd commit per step; see docs/architecture.md).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys

from jupyter_goals import faults
from jupyter_goals.config import ConfigError, GoalsConfig
from jupyter_goals.host.secrecy import Redactor
from jupyter_goals.host.wake import (
    ADMISSION,
    ATTEMPTS,
    CONTROLS,
    EVENTS,
    Broadcast,
    Coalesced,
    Listener,
    Notifier,
    WakingDatabase,
)
from jupyter_goals.identity import ProcessIdentity, host_name
from jupyter_goals.providers.base import key_file_secrets
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.runtime.turn import HistoryCache, TurnRunner
from jupyter_goals.store import control as c
from jupyter_goals.store import recovery as rs
from jupyter_goals.store.db import Row, StorageUnavailable, Tx
from jupyter_goals.usage.prices import PriceTable, PriceTableError, load_price_table

log = logging.getLogger("jupyter_goals.runtime.worker")
ATTEMPT_CRASHED_EXIT = 70  # EX_SOFTWARE: an attempt failed part-way; its recovery follows from the exit
INVALID_CONFIG_EXIT = 78  # EX_CONFIG: the configuration document on stdin is not one this code accepts


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: a worker never outlives its supervisor (the server)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)
    except OSError:  # pragma: no cover - not Linux
        pass


class Worker:
    def __init__(self, worker_id: str, config: GoalsConfig, *, redactor: Redactor | None = None) -> None:
        """A worker of the server configured by ``config``: its stores, state dir, capacity
        (``max_concurrent_turns``), lease, heartbeat, tools, prices and the settings its turns run with.
        ``redactor``: what it hides from tool output (default: this process's credentials and the
        server's ``secrets``)."""
        self.config = config
        self.worker_id = worker_id
        self.histories = HistoryCache()  # each session's provider-ready history, kept across its attempts
        self.redactor = redactor if redactor is not None else Redactor.from_environment(extra=config.secrets)
        self.prices = worker_prices(config.price_table)
        self.registry = ToolRegistry(config.trusted_tools)
        # admitted attempts, a stop, a finished task
        self.wakeups = Listener(config.state_dir, ATTEMPTS, worker_id, url=config.control_db_url)
        self.notifier = Notifier(config.state_dir, url=config.control_db_url)
        # a Stop or cancel committed on any host: its running calls' watches read at once
        self.controls = Broadcast(Listener(config.state_dir, CONTROLS, worker_id, url=config.control_db_url))
        # each commit's events reach the server's event streams within 2 ms (GET /events), a burst's in one wake-up
        self.db = WakingDatabase(config.control_db_url, inline=True,
                                 after_commit=Coalesced(lambda: self.notifier.notify(EVENTS)))
        self.generation = 0
        self.host = host_name()  # the host whose work it runs (DESIGN §3)
        self.tasks: dict[asyncio.Task[None], TurnRunner] = {}
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        me = ProcessIdentity.current()
        ttl = self.config.lease_ttl_s
        self.generation = await self.db.run(
            lambda tx: c.register_worker(tx, self.worker_id, me.host_name, me.boot_id, me.pid, me.start_time, ttl)
        )
        log.info("worker %s registered, generation %s", self.worker_id, self.generation)
        self.wakeups.start()  # bound before the first look, so no wake-up is missed
        self.controls.start()
        beat = asyncio.create_task(self._heartbeat())
        try:
            while not self.stopping.is_set():
                claimed = False
                if len(self.tasks) < self.config.max_concurrent_turns:
                    attempt = await self.db.run_write_if_needed(self._claim)  # nothing admitted: a read only
                    if attempt is not None:
                        claimed = True
                        runner = self._runner(attempt)
                        task = asyncio.create_task(self._run_attempt(runner))
                        self.tasks[task] = runner
                        task.add_done_callback(self._finished)
                if not claimed:
                    await self.wakeups.wait(self.config.safety_tick_s)
        finally:
            await self._shutdown()
            beat.cancel()
            self.wakeups.close()
            self.controls.close()
            self.notifier.close()

    def stop(self) -> None:
        """Graceful stop (SIGTERM): the claim loop ends and attempts are handed back."""
        self.stopping.set()
        self.wakeups.wake()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.tasks.pop(task, None)
        self.wakeups.wake()  # a free slot: look for admitted work at once

    def _claim(self, tx: Tx) -> Row | None:
        attempt = c.claim_attempt(tx, self.worker_id, self.generation, self.host)  # this host's work only
        if attempt is not None:
            attempt["cwd"] = c.get_session(tx, attempt["session_id"])["cwd"]
        return attempt

    def _runner(self, attempt: Row) -> TurnRunner:
        return TurnRunner(self.db, attempt, self.config, cwd=attempt["cwd"], registry=self.registry, prices=self.prices,
                          redactor=self.redactor.with_secrets(key_file_secrets()), histories=self.histories,
                          controls=self.controls)

    async def _run_attempt(self, runner: TurnRunner) -> None:
        attempt = runner.attempt
        try:
            await runner.run()
        except StorageUnavailable as exc:
            log.error("attempt %s: %s: %s; the worker exits so that the attempt is recovered", attempt["attempt_id"],
                      exc.code, exc)
            self._crash()
        except Exception:
            log.exception("attempt %s crashed; the worker exits so that the attempt is recovered", attempt["attempt_id"])
            self._crash()
        finally:
            # its end is committed: a free slot, a queued message behind it, a Goal's next turn, a
            # parent whose subtask delivered: the admission loop decides now, not at its next tick
            self.notifier.notify(ADMISSION)

    @staticmethod
    def _crash() -> None:
        """An attempt that failed part-way (a commit refused by a full disk or a held lock, a bug) is
        neither running nor handed back, and its worker lives on: nothing would ever recover it. Crash-only:
        the worker exits at once, as if killed, and the server's usual path takes over (the supervisor
        restarts a worker with a growing delay while nothing can be recorded; the Coordinator confirms the
        death, repairs the turn, charges the death to the work, and admits it again). Detached commands
        live on and are reconnected; nothing runs twice."""
        logging.shutdown()
        os._exit(ATTEMPT_CRASHED_EXIT)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            try:
                alive = await self.db.run(self._beat)
            except StorageUnavailable:
                continue
            if not alive:  # our generation was fenced: stop at once, write nothing more
                log.error("worker %s generation %s fenced; exiting", self.worker_id, self.generation)
                os._exit(3)

    def _beat(self, tx: Tx) -> bool:
        return c.heartbeat_worker(tx, self.worker_id, self.generation, self.config.lease_ttl_s)

    async def _shutdown(self, grace_s: float = 5.0) -> None:
        """Graceful stop: waits on detached processes are dropped at once (the next attempt reconnects
        them); other steps get ``grace_s`` to reach their commit. Attempts are handed back as checkpoints."""
        for task, runner in list(self.tasks.items()):
            if runner.awaiting_process:
                task.cancel()
        if self.tasks:
            _, pending = await asyncio.wait(list(self.tasks), timeout=grace_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)

        try:
            await self.db.run(lambda tx: rs.hand_back(tx, self.worker_id))
        except Exception:
            log.exception("worker %s: could not release its attempts", self.worker_id)
        self.notifier.notify(ADMISSION)  # handed-back attempts are queued again


def worker_prices(path: str) -> PriceTable | None:
    """The server's price table (``price_table``; empty: the bundled one). Unreadable: quotes stay
    unknown, so hard cost budgets are then unverifiable."""
    try:
        return load_price_table(path or None)
    except PriceTableError as exc:
        log.error("price table unreadable: %s", exc)
        return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m jupyter_goals.runtime.worker",
        description="A worker of a jupyter_goals server. Its configuration is one JSON document on stdin"
        " (jupyter_goals.config.GoalsConfig, the server's secrets included), never flags or environment"
        " variables.")
    p.add_argument("--worker-id", required=True)
    p.add_argument("--no-parent-death", action="store_true")
    args = p.parse_args(argv)
    try:
        config = GoalsConfig.from_document(sys.stdin.read())
    except ConfigError as exc:  # the server and its worker disagree: say so and exit, never run on defaults
        print(f"jupyter_goals worker {args.worker_id}: invalid configuration document on stdin: {exc}",
              file=sys.stderr, flush=True)
        sys.exit(INVALID_CONFIG_EXIT)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[worker %(process)d] %(levelname)s %(message)s")
    if not args.no_parent_death:
        die_with_parent()
    faults.configure(config.state_dir)
    worker = Worker(args.worker_id, config)

    async def amain() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    asyncio.run(amain())


if __name__ == "__main__":
    main()
