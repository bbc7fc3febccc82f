"""The worker process (the "JobRunner"): ``python -m jupyter_goals.worker``.

It registers with a new generation, heartbeats its lease, claims admitted attempts and runs them
concurrently up to its capacity. It never decides recovery. SQLite transactions run inline on its
event loop (one short fsync'd commit per step; see docs/architecture.md).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
from pathlib import Path

from jupyter_goals import faults
from jupyter_goals.identity import ProcessIdentity
from jupyter_goals.prices import PriceTable, PriceTableError, load_price_table
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.runtime.turn import TurnRunner
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Row, StorageUnavailable, Tx

log = logging.getLogger("jupyter_goals.worker")


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: a worker never outlives its supervisor (the server)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)
    except OSError:  # pragma: no cover - not Linux
        pass


class Worker:
    def __init__(
        self,
        worker_id: str,
        control_url: str,
        state_dir: Path,
        *,
        capacity: int,
        heartbeat_s: float,
        lease_ttl_s: float,
        default_model: str,
        trusted_tools: dict[str, dict[str, str]] | None = None,
        poll_s: float = 0.05,
        retry_base_s: float = 1.0,
        prices: PriceTable | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.prices = prices
        self.db = Database(control_url, inline=True)
        self.state_dir = state_dir
        self.capacity = capacity
        self.heartbeat_s = heartbeat_s
        self.lease_ttl_s = lease_ttl_s
        self.default_model = default_model
        self.registry = ToolRegistry(trusted_tools)
        self.poll_s = poll_s
        self.retry_base_s = retry_base_s
        self.generation = 0
        self.tasks: dict[asyncio.Task[None], TurnRunner] = {}
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        me = ProcessIdentity.current()
        self.generation = await self.db.run(
            lambda tx: c.register_worker(tx, self.worker_id, me.host_name, me.boot_id, me.pid, me.start_time, self.lease_ttl_s)
        )
        log.info("worker %s registered, generation %s", self.worker_id, self.generation)
        beat = asyncio.create_task(self._heartbeat())
        try:
            while not self.stopping.is_set():
                claimed = False
                if len(self.tasks) < self.capacity:
                    attempt = await self.db.run(self._claim)
                    if attempt is not None:
                        claimed = True
                        runner = self._runner(attempt)
                        task = asyncio.create_task(self._run_attempt(runner))
                        self.tasks[task] = runner
                        task.add_done_callback(lambda t: self.tasks.pop(t, None))
                if not claimed:
                    try:
                        await asyncio.wait_for(self.stopping.wait(), self.poll_s)
                    except TimeoutError:
                        pass
        finally:
            await self._shutdown()
            beat.cancel()

    def _claim(self, tx: Tx) -> Row | None:
        attempt = c.claim_attempt(tx, self.worker_id, self.generation)
        if attempt is not None:
            attempt["cwd"] = c.get_session(tx, attempt["session_id"])["cwd"]
        return attempt

    def _runner(self, attempt: Row) -> TurnRunner:
        return TurnRunner(
            self.db, attempt, state_dir=self.state_dir, registry=self.registry, default_model=self.default_model,
            cwd=attempt["cwd"], retry_base_s=self.retry_base_s, prices=self.prices,
        )

    async def _run_attempt(self, runner: TurnRunner) -> None:
        attempt = runner.attempt
        try:
            await runner.run()
        except StorageUnavailable as exc:
            log.error("attempt %s: storage unavailable: %s", attempt["attempt_id"], exc)
        except Exception:
            log.exception("attempt %s crashed", attempt["attempt_id"])

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                alive = await self.db.run(lambda tx: c.heartbeat_worker(tx, self.worker_id, self.generation, self.lease_ttl_s))
            except StorageUnavailable:
                continue
            if not alive:  # our generation was fenced: stop at once, write nothing more
                log.error("worker %s generation %s fenced; exiting", self.worker_id, self.generation)
                os._exit(3)

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

        def release(tx: Tx) -> None:
            for a in tx.all("SELECT * FROM attempts WHERE worker_id = ? AND state = 'running'", (self.worker_id,)):
                c.end_attempt(tx, a, "worker shutdown")
                c.bump_commit_point(tx, a["work_id"])
                work = c.get_work(tx, a["work_id"])
                if work["desired_state"] == "run":
                    c.set_phase(tx, work, "queued", "queued")
            c.mark_worker_stopped(tx, self.worker_id)

        try:
            await self.db.run(release)
        except Exception:
            log.exception("worker %s: could not release its attempts", self.worker_id)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m jupyter_goals.worker")
    p.add_argument("--worker-id", required=True)
    p.add_argument("--control-url", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--capacity", type=int, default=8)
    p.add_argument("--heartbeat-s", type=float, default=2.0)
    p.add_argument("--lease-ttl-s", type=float, default=10.0)
    p.add_argument("--default-model", required=True)
    p.add_argument("--trusted-tools", default="{}")
    p.add_argument("--retry-base-s", type=float, default=1.0)
    p.add_argument("--price-table", default="", help="the server's price table file (empty: the bundled one)")
    p.add_argument("--no-parent-death", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[worker %(process)d] %(levelname)s %(message)s")
    if not args.no_parent_death:
        die_with_parent()
    faults.configure(args.state_dir)
    try:
        prices: PriceTable | None = load_price_table(args.price_table or None)
    except PriceTableError as exc:  # quotes stay unknown: hard cost budgets are then unverifiable
        log.error("price table unreadable: %s", exc)
        prices = None
    worker = Worker(
        args.worker_id, args.control_url, Path(args.state_dir), capacity=args.capacity, heartbeat_s=args.heartbeat_s,
        lease_ttl_s=args.lease_ttl_s, default_model=args.default_model, trusted_tools=json.loads(args.trusted_tools),
        retry_base_s=args.retry_base_s, prices=prices,
    )

    async def amain() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stopping.set)
        await worker.run()

    asyncio.run(amain())


if __name__ == "__main__":
    main()
