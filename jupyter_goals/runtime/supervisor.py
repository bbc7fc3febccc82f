"""The worker supervisor: starts ``python -m jupyter_goals.worker`` processes, reaps them, reports
each exit to the Coordinator (a reaped worker is a confirmed death) and restarts it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class WorkerConfig:
    control_url: str
    state_dir: str
    default_model: str
    capacity: int
    heartbeat_s: float
    lease_ttl_s: float
    retry_base_s: float
    trusted_tools: dict[str, Any] = field(default_factory=dict)
    price_table: str = ""


class Supervisor:
    def __init__(self, count: int, config: WorkerConfig, on_exit: Callable[[str, int], Awaitable[bool | None]]) -> None:
        """``on_exit`` recovers after a worker exit; it answers True when the death was charged to work
        the worker ran (that work's own growing backoff then throttles it, so the worker comes back at once)."""
        self.count = count
        self.config = config
        self.on_exit = on_exit
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = False
        self.restarts = 0

    async def start(self) -> None:
        for slot in range(self.count):
            self.tasks.append(asyncio.create_task(self._keep_running(slot)))

    async def _spawn(self) -> tuple[str, asyncio.subprocess.Process]:
        worker_id = f"w_{uuid.uuid4().hex[:12]}"
        cfg = self.config
        args = [
            sys.executable, "-m", "jupyter_goals.worker", "--worker-id", worker_id,
            "--control-url", cfg.control_url, "--state-dir", cfg.state_dir, "--capacity", str(cfg.capacity),
            "--heartbeat-s", str(cfg.heartbeat_s), "--lease-ttl-s", str(cfg.lease_ttl_s),
            "--default-model", cfg.default_model, "--trusted-tools", json.dumps(cfg.trusted_tools),
            "--retry-base-s", str(cfg.retry_base_s), "--price-table", cfg.price_table,
        ]
        proc = await asyncio.create_subprocess_exec(*args, env=dict(os.environ), stdin=asyncio.subprocess.DEVNULL)
        self.procs[worker_id] = proc
        log.info("started worker %s (pid %s)", worker_id, proc.pid)
        return worker_id, proc

    async def _keep_running(self, slot: int) -> None:
        delay = 0.2
        while not self.stopping:
            worker_id, proc = await self._spawn()
            code = await proc.wait()
            self.procs.pop(worker_id, None)
            if self.stopping:
                return
            log.warning("worker %s exited with %s; recovering and restarting", worker_id, code)
            self.restarts += 1
            charged: bool | None = False
            try:
                charged = await self.on_exit(worker_id, code)
            except Exception:
                log.exception("recovery after worker exit failed")
            # a worker that dies running nothing (a broken start) backs off; one killed by the work it
            # ran restarts at once, so a crash-looping item does not hold back every other session
            if code == 0 or charged:
                delay = 0.2
            await asyncio.sleep(delay)
            if code != 0 and not charged:
                delay = min(delay * 2, 10.0)

    def alive(self) -> list[dict[str, Any]]:
        return [{"worker_id": w, "pid": p.pid} for w, p in self.procs.items() if p.returncode is None]

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every worker (they hand their attempts back), SIGKILL what is left after ``grace_s``."""
        self.stopping = True
        procs = list(self.procs.values())
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        if procs:
            done, pending = await asyncio.wait([asyncio.create_task(p.wait()) for p in procs], timeout=grace_s)
            for p in procs:
                if p.returncode is None:
                    p.kill()
            if pending:
                await asyncio.wait(pending, timeout=2)
        for t in self.tasks:
            t.cancel()
