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

from jupyter_goals import budget as budgets
from jupyter_goals import faults
from jupyter_goals.goals import lifecycle as goal_lifecycle
from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.models import (
    REASON_TEXT,
    Actions,
    CreateGoal,
    CreateJob,
    CreateSession,
    DesiredState,
    GoalAction,
    Phase,
    PostMessage,
    ReasonCode,
    UpdateGoal,
    UpdateSession,
)
from jupyter_goals.prices import PriceTable, PriceTableError, load_price_table
from jupyter_goals.recovery.coordinator import Coordinator
from jupyter_goals.runtime.supervisor import Supervisor, WorkerConfig
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as goal_store
from jupyter_goals.store import usage as u
from jupyter_goals.store import waits
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
    price_table: str = ""


def actions_for(work: Row | None) -> Actions:
    """Button permissions come from here; no client infers them from status strings."""
    if work is None:
        return Actions(reason_code="no_work")
    phase, desired = work["phase"], work["desired_state"]
    ended = phase in (Phase.DONE, Phase.CANCELLED)
    return Actions(
        can_pause=not ended and desired == DesiredState.RUN,
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
        self.price_error: str | None = None
        try:
            prices = load_price_table(config.price_table or None)
        except PriceTableError as exc:  # shown in health; every cost stays unknown rather than guessed
            self.price_error = str(exc)
            log.error("jupyter_goals: %s", exc)
            prices = PriceTable.parse(b'{"version": "unreadable", "models": {}}')
        self.prices = prices
        self.coordinator = Coordinator(
            self.control,
            state_dir=config.state_dir,
            default_model=config.default_model,
            registry=self.registry,
            max_concurrent_turns=config.max_concurrent_turns,
            allow_cross_host_takeover=config.allow_cross_host_takeover,
            max_recovery_attempts=config.max_recovery_attempts,
            recovery_backoff_s=config.recovery_backoff_s,
            prices=prices,
        )
        self.outbox = OutboxDispatcher(self.control, self.usage, prices)
        self.event_tail = EventTail(self.control)
        self.supervisor: Supervisor | None = None
        self.degraded: Degraded | None = None
        self.usage_degraded: str | None = None
        self.started = False  # the schema is migrated (or the store is degraded)
        self.usage_ready = False  # usage.db is migrated; until then receipts wait in the outbox
        self._usage_retry_at = 0.0
        self._ledger_published: str | None = None  # the ledger state last written to control.db
        self.last_recovery: dict[str, Any] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._recover_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        faults.configure(self.config.state_dir)
        await self._migrate_usage()
        if not await self._migrate_control():
            log.error("jupyter_goals degraded: %s", self.degraded)
            self.started = True
            if self.degraded is not None and self.degraded.code == ReasonCode.STORAGE_UNAVAILABLE:
                # a locked or briefly unreadable file heals by itself; a schema problem needs a person
                self._tasks.append(asyncio.create_task(self._retry_start()))
            return
        await self._run()

    async def _migrate_control(self) -> bool:
        try:
            await asyncio.to_thread(migrate, self.control, "control")
        except MigrationFailed as exc:
            self.degraded = Degraded(ReasonCode.MIGRATION_FAILED, str(exc))
        except StorageUnavailable as exc:
            self.degraded = Degraded(ReasonCode.STORAGE_UNAVAILABLE, str(exc))
        else:
            self.degraded = None
        return self.degraded is None

    async def _migrate_usage(self) -> bool:
        try:
            await asyncio.to_thread(migrate, self.usage, "usage")
        except (MigrationFailed, StorageUnavailable) as exc:
            self.usage_degraded = str(exc)  # chat goes on; receipts wait in the outbox
            self._usage_retry_at = time.monotonic() + 5.0
            return False
        try:
            await self.usage.run(lambda tx: u.record_prices(tx, self.prices))
        except StorageUnavailable as exc:
            self.usage_degraded = str(exc)
            self._usage_retry_at = time.monotonic() + 5.0
            return False
        self.usage_ready = True
        return True

    async def _retry_start(self) -> None:
        delay = 1.0
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
            if await self._migrate_control():
                log.info("jupyter_goals: control store readable again; starting")
                await self._run()
                return

    async def _run(self) -> None:
        self.started = True  # input and controls sent during recovery are accepted and win over old continuations
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
                    price_table=self.config.price_table,
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

    async def _worker_exited(self, worker_id: str, code: int) -> bool:
        """Recover at once; True when the death was charged to work that worker ran."""
        report = await self.recover()
        return worker_id in report.get("charged", {}).values()

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
                if self.usage_ready or (time.monotonic() >= self._usage_retry_at and await self._migrate_usage()):
                    await self.outbox.dispatch_due()
                    self.usage_degraded = self.outbox.last_error
            except Exception as exc:
                self.usage_degraded = str(exc)
            await self._publish_ledger_state()
            await asyncio.sleep(0.2)

    async def _publish_ledger_state(self) -> None:
        """Tell hard-budget checks (workers, Coordinator) whether the usage ledger is being written:
        while it is not, paid admission under a hard budget waits with ``budget_unverifiable``."""
        state = self.usage_degraded or ""
        if not self.started or self.degraded is not None or state == self._ledger_published:
            return
        try:
            await self.control.run(lambda tx: budgets.set_ledger_error(tx, state))
        except StorageUnavailable:
            return
        self._ledger_published = state
        self._wake.set()  # recheck budgets now

    # ------------------------------------------------------------------ guards
    def check(self) -> None:
        if self.degraded is not None:
            raise self.degraded
        if not self.started:  # requests that arrive while the schema is migrated: 503, not a missing table
            raise Degraded(ReasonCode.STARTING, REASON_TEXT[ReasonCode.STARTING])

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
        if self.degraded is None and not self.started:
            status = "starting"
        return {
            "status": status,
            "reason_code": self.degraded.code.value if self.degraded else ("" if self.started else "starting"),
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
            approvals = c.list_approvals(tx, "pending", session_id)
            goal = goal_store.current_goal(tx, session_id)  # the composer shows the current Goal only
            return {
                "session": _session_view(s),
                "work": c.work_view(work) if work else None,
                "goal": goal_lifecycle.view(tx, goal) if goal else None,
                "todo": goal_store.get_todo(tx, session_id)[0],
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
            lambda tx: tx.one("SELECT request_id FROM requests WHERE goal_id = ? LIMIT 1", (goal_id,)), write=False
        ) and not await self._goal_exists(goal_id):
            raise c.NotFound(f"goal {goal_id} not found")
        return await self.usage_summary(session_id=session_id, goal_id=goal_id)

    async def _goal_exists(self, goal_id: str) -> bool:
        def run(tx: Tx) -> bool:
            try:
                return tx.one("SELECT goal_id FROM goals WHERE goal_id = ?", (goal_id,)) is not None
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
                    goal_lifecycle.sync_with_work(tx, other, "stop")
            work = c.apply_control(tx, work, action, expected)
            goal_lifecycle.sync_with_work(tx, work, action)  # a Goal's work item moves its Goal too
            return work

        work = await self.control.run(run)
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
        self.wake()
        return answer

    async def goal_history(self, session_id: str) -> dict[str, Any]:
        self.check()

        def run(tx: Tx) -> list[Row]:
            c.get_session(tx, session_id)
            return goal_store.history(tx, session_id)

        return {"records": await self.control.run(run, write=False)}

    async def history_record(self, record_id: str) -> dict[str, Any]:
        self.check()
        return dict(await self.control.run(lambda tx: goal_store.history_record(tx, record_id), write=False))


def _session_view(s: Row) -> dict[str, Any]:
    return {k: s[k] for k in ("session_id", "title", "cwd", "model", "permissions", "created_at", "updated_at")}


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
