"""The worker supervisor: starts ``python -m jupyter_goals.runtime.worker`` processes, reaps them, reports
each exit to the Coordinator (a reaped worker is a confirmed death) and restarts it.

A worker's command line names only its id; its configuration (``GoalsConfig``, the server's secrets
included) is one JSON document written to its stdin, so no setting or secret is in its argv (which
every local user can read) or its environment (which its tool processes could inherit)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_goals.config import GoalsConfig

log = logging.getLogger(__name__)


# set by GoalsApp for the kernels the server starts; a worker (and so every tool) never needs them
SERVER_ONLY_ENV = ("JUPYTER_GOALS_TOKEN", "JUPYTER_GOALS_SERVER_URL", "JUPYTER_TOKEN")


class Supervisor:
    def __init__(self, config: GoalsConfig, on_exit: Callable[[str, int], Awaitable[bool | None]]) -> None:
        """Keeps ``config.workers`` workers running. ``on_exit`` recovers after a worker exit; it answers
        True when the death was charged to work the worker ran (that work's own growing backoff then
        throttles it, so the worker comes back at once)."""
        self.config = config
        self.document = config.document().encode() + b"\n"
        self.on_exit = on_exit
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = False
        self.restarts = 0

    async def start(self) -> None:
        for slot in range(self.config.workers):
            self.tasks.append(asyncio.create_task(self._keep_running(slot)))

    async def _spawn(self) -> tuple[str, asyncio.subprocess.Process]:
        worker_id = f"w_{uuid.uuid4().hex[:12]}"
        args = [sys.executable, "-m", "jupyter_goals.runtime.worker", "--worker-id", worker_id]
        env = {k: v for k, v in os.environ.items() if k not in SERVER_ONLY_ENV}
        proc = await asyncio.create_subprocess_exec(*args, env=env, stdin=asyncio.subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(self.document)
        proc.stdin.close()  # the worker reads its stdin to the end: the configuration, then EOF
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
