"""GoalsService: the server-side facade the handlers call (stores, Coordinator, supervisor, outbox).

Storage failures put the service in a degraded state (``storage_unavailable`` /
``migration_failed``) instead of stopping the server; old files are never touched.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_goals import faults
from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.models import (
    Actions,
    CreateSession,
    DesiredState,
    Phase,
    PostMessage,
    ReasonCode,
)
from jupyter_goals.recovery.coordinator import Coordinator
from jupyter_goals.runtime.supervisor import Supervisor, WorkerConfig
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.store import control as c
from jupyter_goals.store import usage as u
from jupyter_goals.store.db import Database, MigrationFailed, Row, StorageUnavailable, Tx
from jupyter_goals.store.events import EventTail
from jupyter_goals.store.outbox import OutboxDispatcher
from jupyter_goals.store.schema import migrate

log = logging.getLogger(__name__)


class Degraded(Exception):
    def __init__(self, code: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ServiceConfig:
    state_dir: Path
    control_db_url: str
    usage_db_url: str
    default_model: str
    workers: int = 1
    max_concurrent_turns: int = 4
    lease_ttl_s: float = 10.0
    heartbeat_s: float = 2.0
    auto_recover: bool = True
    allow_cross_host_takeover: bool = False
    reconcile_interval_s: float = 5.0
    trusted_tools: dict[str, Any] | None = None
    max_recovery_attempts: int = 5
    recovery_backoff_s: float = 1.0
    retry_base_s: float = 1.0


def actions_for(work: Row | None) -> Actions:
    """Button permissions come from here; no client infers them from status strings."""
    if work is None:
        return Actions(reason_code="no_work")
    phase, desired = work["phase"], work["desired_state"]
    ended = phase in (Phase.DONE, Phase.CANCELLED)
    return Actions(
        can_pause=not ended and desired == DesiredState.RUN and phase != Phase.FAILED,
        can_resume=not ended and desired == DesiredState.PAUSED,
        can_end=not ended,
        can_retry=not ended and (phase == Phase.FAILED or work["reason_code"] == ReasonCode.PROVIDER_RETRYING),
        can_verify=False,
        reason_code=work["reason_code"],
    )


class GoalsService:
    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.control = Database(config.control_db_url)
        self.usage = Database(config.usage_db_url)
        self.registry = ToolRegistry(config.trusted_tools)
        self.coordinator = Coordinator(
            self.control,
            state_dir=config.state_dir,
            default_model=config.default_model,
            registry=self.registry,
            max_concurrent_turns=config.max_concurrent_turns,
            allow_cross_host_takeover=config.allow_cross_host_takeover,
            max_recovery_attempts=config.max_recovery_attempts,
            recovery_backoff_s=config.recovery_backoff_s,
        )
        self.outbox = OutboxDispatcher(self.control, self.usage)
        self.event_tail = EventTail(self.control)
        self.supervisor: Supervisor | None = None
        self.degraded: Degraded | None = None
        self.usage_degraded: str | None = None
        self.last_recovery: dict[str, Any] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._recover_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        faults.configure(self.config.state_dir)
        try:
            await asyncio.to_thread(migrate, self.control, "control")
        except MigrationFailed as exc:
            self.degraded = Degraded(ReasonCode.MIGRATION_FAILED, str(exc))
        except StorageUnavailable as exc:
            self.degraded = Degraded(ReasonCode.STORAGE_UNAVAILABLE, str(exc))
        try:
            await asyncio.to_thread(migrate, self.usage, "usage")
        except (MigrationFailed, StorageUnavailable) as exc:
            self.usage_degraded = str(exc)  # chat goes on; receipts wait in the outbox
        if self.degraded is not None:
            log.error("jupyter_goals degraded: %s", self.degraded)
            return
        await self.recover()
        if self.config.workers > 0:
            self.supervisor = Supervisor(
                self.config.workers,
                WorkerConfig(
                    control_url=self.config.control_db_url,
                    state_dir=str(self.config.state_dir),
                    default_model=self.config.default_model,
                    capacity=self.config.max_concurrent_turns,
                    heartbeat_s=self.config.heartbeat_s,
                    lease_ttl_s=self.config.lease_ttl_s,
                    retry_base_s=self.config.retry_base_s,
                    trusted_tools=self.config.trusted_tools or {},
                ),
                on_exit=self._worker_exited,
            )
            await self.supervisor.start()
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
        await asyncio.to_thread(self.control.close)
        await asyncio.to_thread(self.usage.close)

    async def recover(self) -> dict[str, Any]:
        async with self._recover_lock:
            report = await self.coordinator.recover()
        self.last_recovery = {"at": time.time(), **report.as_dict()}
        return self.last_recovery

    async def _worker_exited(self, worker_id: str, code: int) -> None:
        await self.recover()

    def wake(self) -> None:
        self._wake.set()

    async def _admission_loop(self) -> None:
        last_full = time.monotonic()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), 0.1)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                if time.monotonic() - last_full >= self.config.reconcile_interval_s:
                    last_full = time.monotonic()
                    await self.recover()
                else:
                    async with self._recover_lock:
                        await self.coordinator.admit()
            except StorageUnavailable as exc:
                log.warning("admission: storage unavailable: %s", exc)
                await asyncio.sleep(1)
            except Exception:
                log.exception("admission loop")
                await asyncio.sleep(1)

    async def _outbox_loop(self) -> None:
        while True:
            try:
                await self.outbox.dispatch_due()
                self.usage_degraded = None
            except Exception as exc:
                self.usage_degraded = str(exc)
            await asyncio.sleep(0.2)

    # ------------------------------------------------------------------ guards
    def check(self) -> None:
        if self.degraded is not None:
            raise self.degraded

    # ------------------------------------------------------------------ queries
    async def health(self) -> dict[str, Any]:
        databases: dict[str, Any] = {
            "control": {"url": _redact(self.config.control_db_url), "ok": self.degraded is None},
            "usage": {"url": _redact(self.config.usage_db_url), "ok": self.usage_degraded is None},
        }
        if self.degraded is not None:
            databases["control"]["error"] = {"code": self.degraded.code.value, "message": str(self.degraded)}
        if self.usage_degraded:
            databases["usage"]["error"] = {"code": "storage_unavailable", "message": self.usage_degraded}
        status = "ok" if self.degraded is None and self.usage_degraded is None else "degraded"
        return {
            "status": status,
            "reason_code": self.degraded.code.value if self.degraded else "",
            "databases": databases,
            "workers": self.supervisor.alive() if self.supervisor else [],
            "recovery": self.last_recovery,
            "admission_open": self.coordinator.admission_open,
            "host_name": host_name(),
            "boot_id": boot_id(),
        }

    async def create_session(self, body: CreateSession) -> dict[str, Any]:
        self.check()
        cwd = os.path.abspath(body.cwd or os.getcwd())  # noqa: ASYNC240 - path arithmetic, no disk access
        model = body.model or self.config.default_model
        perms = (body.permissions.model_dump() if body.permissions else {"mode": "ask", "allow": []})
        row = await self.control.run(lambda tx: c.create_session(tx, body.title or "Untitled chat", cwd, model, perms))
        return await self.snapshot(row["session_id"])

    async def list_sessions(self) -> dict[str, Any]:
        self.check()

        def run(tx: Tx) -> list[dict[str, Any]]:
            out = []
            for s in c.list_sessions(tx):
                work = c.current_work(tx, s["session_id"])
                out.append({**_session_view(s), "work": c.work_view(work) if work else None,
                            "actions": actions_for(work).model_dump()})
            return out

        return {"sessions": await self.control.run(run, write=False)}

    async def snapshot(self, session_id: str, after: int = 0, limit: int = 500) -> dict[str, Any]:
        self.check()

        def run(tx: Tx) -> dict[str, Any]:
            s = c.get_session(tx, session_id)
            work = c.current_work(tx, session_id)
            items = c.transcript(tx, session_id, after, limit + 1)
            more = len(items) > limit
            items = items[:limit]
            approvals = [a for a in c.list_approvals(tx, "pending") if a["session_id"] == session_id]
            return {
                "session": _session_view(s),
                "work": c.work_view(work) if work else None,
                "goal": None,
                "todo": [],
                "approvals": approvals,
                "transcript": {
                    "items": [i.model_dump() for i in items],
                    "next_cursor": items[-1].seq if more and items else None,
                },
                "actions": actions_for(work).model_dump(),
                "event_seq": c.last_event_seq(tx),
            }

        snap = await self.control.run(run, write=False)
        snap["usage"] = await self.usage_summary(session_id=session_id)
        return snap

    async def usage_summary(self, session_id: str | None = None) -> dict[str, Any]:
        try:
            return await self.usage.run(lambda tx: u.summary(tx, session_id=session_id), write=False)
        except Exception as exc:
            return {"error": "storage_unavailable", "display": f"Usage temporarily unavailable: {exc}"}

    async def post_message(self, session_id: str, body: PostMessage) -> tuple[dict[str, Any], bool]:
        self.check()
        faults.crash_point("input.before_accept")

        def run(tx: Tx) -> tuple[Row, bool]:
            s = c.get_session(tx, session_id)
            return c.accept_message(tx, s, body.text, body.client_request_id, body.delivery,
                                    auto_recover=self.config.auto_recover, host=host_name())

        msg, created = await self.control.run(run)
        faults.crash_point("input.after_accept")
        self.wake()
        return {"message_id": msg["message_id"], "work_id": msg["work_id"], "delivery": msg["delivery"]}, created

    async def session_action(self, session_id: str, action: str, expected: int | None) -> dict[str, Any]:
        self.check()

        def run(tx: Tx) -> Row:
            c.get_session(tx, session_id)
            work = c.current_work(tx, session_id)
            if work is None:
                raise c.NotFound(f"session {session_id} has no work to {action}")
            if action == "stop":
                # End applies to the whole session: everything queued behind it stops too
                for other in tx.all("SELECT * FROM work_items WHERE session_id = ? AND phase NOT IN ('done', 'cancelled')"
                                    " AND work_id != ?", (session_id, work["work_id"])):
                    c.apply_control(tx, other, "stop", None)
            return c.apply_control(tx, work, action, expected)

        work = await self.control.run(run)
        self.wake()
        return {"work_id": work["work_id"], "control_version": work["control_version"],
                "desired_state": work["desired_state"], "phase": work["phase"]}

    async def stop_all(self) -> dict[str, Any]:
        self.check()
        stopped = await self.control.run(c.stop_all)
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


def _session_view(s: Row) -> dict[str, Any]:
    return {k: s[k] for k in ("session_id", "title", "cwd", "model", "permissions", "created_at", "updated_at")}


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
