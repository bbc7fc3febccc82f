"""The reads behind the REST answers: sessions (list, snapshot), Goals and their terminal records,
Jobs, approvals, usage, events, models and the recovery summary. Each reads in one read transaction
(control.db; usage.db for the ledger's totals) and answers with its model (``server/answers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from jupyter_goals.goals import lifecycle as goal_lifecycle
from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.models import DesiredState, Phase, ReasonCode, RecoveryOutcome, reason_text
from jupyter_goals.recovery import takeover
from jupyter_goals.server import answers as a
from jupyter_goals.server.catalog import ModelCatalog
from jupyter_goals.server.params import encode_cursor
from jupyter_goals.server.startup import Stores
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as goal_store
from jupyter_goals.store import recovery_passes, waits
from jupyter_goals.store import usage as u
from jupyter_goals.store.db import Row, Tx
from jupyter_goals.store.events import EventTail
from jupyter_goals.store.transcript import with_call_states
from jupyter_goals.usage import budget as budgets

T = TypeVar("T")

# waits that a person's Retry clears (a provider backoff cut short; a changed tool accepted)
RETRYABLE_WAITS = frozenset({ReasonCode.PROVIDER_RETRYING, ReasonCode.TOOL_CHANGED})
SESSION_KEYS = ("session_id", "title", "cwd", "model", "permissions", "created_at", "updated_at")


def actions_for(work: Mapping[str, Any] | None, owner: takeover.ForeignOwner | None = None) -> a.Actions:
    """Button permissions come from here; no client infers them from status strings. ``owner``: the
    other host that runs the work (``can_takeover`` while it is unreachable)."""
    if work is None:
        return a.Actions(reason_code="no_work")
    if takeover.may_take_over(work, owner):
        return a.Actions(can_pause=work["desired_state"] == DesiredState.RUN, can_stop=True, can_end=True,
                         can_takeover=True, reason_code=ReasonCode.OWNER_HOST_UNREACHABLE)
    phase, desired = work["phase"], work["desired_state"]
    ended = phase in (Phase.DONE, Phase.CANCELLED)
    return a.Actions(
        can_pause=not ended and desired == DesiredState.RUN,
        can_resume=not ended and desired == DesiredState.PAUSED,
        can_stop=not ended,
        can_end=not ended,  # the older name of can_stop for a session's work
        can_retry=not ended and (phase == Phase.FAILED or work["reason_code"] in RETRYABLE_WAITS),
        can_verify=False,
        reason_code=work["reason_code"],
    )


def session_view(s: Row) -> dict[str, Any]:
    return {k: s[k] for k in SESSION_KEYS}


def goal_view(tx: Tx, goal: Row) -> dict[str, Any]:
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


class Queries:
    def __init__(self, stores: Stores, catalog: ModelCatalog, event_tail: EventTail, *,
                 started_at: float, models_error: str | None) -> None:
        self.stores = stores
        self.catalog = catalog
        self.event_tail = event_tail
        self.started_at = started_at
        self.models_error = models_error

    async def read(self, fn: Callable[[Tx], T]) -> T:
        """``fn`` in one read transaction of control.db, once requests can be served (else 503)."""
        self.stores.check()
        return await self.stores.control.run(fn, write=False)

    # ------------------------------------------------------------------ sessions
    async def list_sessions(self, limit: int = 100, after: tuple[float, str] | None = None,
                            states: list[str] | None = None, text: str | None = None) -> a.SessionList:
        """One keyset page of session summaries, newest activity first (``next_cursor``: the next page)."""

        me = host_name()

        def run(tx: Tx) -> a.SessionList:
            out = []
            rows = c.page_sessions(tx, limit=limit + 1, after=after, states=states, text=text)
            for s in rows[:limit]:
                work = c.current_work(tx, s["session_id"])
                goal = goal_store.current_goal(tx, s["session_id"])
                owner = takeover.owner_of(tx, work, me) if work else None
                out.append(a.SessionSummary.model_validate({
                    **session_view(s), "work": takeover.owner_view(c.work_view(work), owner) if work else None,
                    "actions": actions_for(work, owner),
                    "state": s["state"], "activity_at": s["activity"],
                    "goal": {k: goal[k] for k in ("goal_id", "objective", "state", "revision")} if goal else None}))
            last = rows[limit - 1] if len(rows) > limit else None
            return a.SessionList(sessions=out, next_cursor=encode_cursor(last["activity"], last["session_id"])
                                 if last else None)

        return await self.read(run)

    async def snapshot(self, session_id: str, after: int = 0, limit: int = 500,
                       before: int | None = None, work_id: str | None = None) -> a.Snapshot:
        """The session snapshot; its transcript page is ``limit`` items after ``after`` or, with
        ``before`` (a seq, or ``LATEST``), the ``limit`` items just before it, in seq order; with
        ``work_id``, that work item's items only (404 for a work item not of this session)."""

        def run(tx: Tx) -> dict[str, Any]:
            s = c.get_session(tx, session_id)
            if work_id is not None and c.get_work(tx, work_id)["session_id"] != session_id:
                raise c.NotFound(f"work item {work_id} is not of session {session_id}")
            work = c.current_work(tx, session_id)
            owner = takeover.owner_of(tx, work, host_name()) if work else None  # another host's work
            goal = goal_store.current_goal(tx, session_id)  # the composer shows the current Goal only
            page = c.transcript_page(tx, session_id, limit=limit, after=after, before=before, work_id=work_id)
            page["items"] = with_call_states(tx, page["items"])  # a running call reads dispatched, not planned
            return {
                "session": session_view(s),
                "work": takeover.owner_view(c.work_view(work), owner) if work else None,
                "goal": goal_view(tx, goal) if goal else None,  # with its budget burn (the composer's Goal box)
                "todo": goal_store.get_todo(tx, session_id)[0],
                "approvals": c.list_approvals(tx, "pending", session_id),
                "transcript": page,
                "actions": actions_for(work, owner),
                "event_seq": c.last_event_seq(tx),
                "allow_rules": c.allow_rules(tx, session_id, s["permissions"].get("allow") or []),
            }

        snap = await self.read(run)
        if snap["goal"] is not None:  # with its usage, so a view of the session needs no second read
            snap["goal"] = {**snap["goal"], "usage": await self.usage_summary(goal_id=snap["goal"]["goal_id"])}
        return a.Snapshot.model_validate({**snap, "usage": await self.usage_summary(session_id=session_id)})

    # ------------------------------------------------------------------ usage
    async def usage_summary(self, session_id: str | None = None, goal_id: str | None = None) -> a.UsageSummary:
        """The ledger's totals (usage.db) beside active time (control.db's attempt records).

        usage.db being unreadable never blocks chat: the answer says so, and the receipts wait in
        the outbox until it is readable again."""
        control = self.stores.control
        active = await control.run(lambda tx: c.active_time(tx, session_id=session_id, goal_id=goal_id), write=False)
        try:
            ledger = await self.stores.usage.run(
                lambda tx: u.summary(tx, session_id=session_id, goal_id=goal_id), write=False
            )
        except Exception as exc:
            ledger = {"error": "storage_unavailable", "known_cost_usd": None, "estimated_cost_usd": None,
                      "known_tokens": None, "unknown_usage_requests": None,
                      "display": f"Usage temporarily unavailable (usage.db: {exc}); receipts are kept and counted later."}
        pending = await control.run(c.pending_outbox_count, write=False)
        return a.UsageSummary.model_validate({**ledger, **active, "ledger_writes_pending": pending,
                                              "price_version": self.stores.prices.version})

    async def usage_answer(self, session_id: str | None, goal_id: str | None) -> a.UsageSummary:
        """``GET /usage``: 404 for a session or Goal that does not exist (a Goal's requests count even
        in a schema without a goals table)."""
        if session_id:
            await self.read(lambda tx: c.get_session(tx, session_id))
        elif goal_id and not await self.read(lambda tx: c.goal_has_requests(tx, goal_id)) \
                and not await self.read(lambda tx: _goal_exists(tx, goal_id)):
            raise c.NotFound(f"goal {goal_id} not found")
        return await self.usage_summary(session_id=session_id, goal_id=goal_id)

    # ------------------------------------------------------------------ Goals
    async def goal_answer(self, fn: Callable[[Tx], Row], write: bool = False) -> a.Goal:
        """Run ``fn(tx) -> goal row`` and answer the Goal with its usage."""
        self.stores.check()
        view = await self.stores.control.run(lambda tx: goal_view(tx, fn(tx)), write=write)
        return a.Goal.model_validate({**view, "usage": await self.usage_summary(goal_id=view["goal_id"])})

    async def get_goal(self, goal_id: str) -> a.Goal:
        return await self.goal_answer(lambda tx: goal_store.get_goal(tx, goal_id))

    async def list_goals(self, session_id: str | None) -> a.GoalList:
        def run(tx: Tx) -> list[dict[str, Any]]:
            if session_id:
                c.get_session(tx, session_id)  # 404 when unknown
            return [goal_view(tx, goal) for goal in goal_store.list_goals(tx, session_id)]

        views = await self.read(run)
        return a.GoalList(goals=[a.Goal.model_validate({**v, "usage": await self.usage_summary(goal_id=v["goal_id"])})
                                 for v in views])

    async def goal_history(self, session_id: str) -> a.HistoryList:
        def run(tx: Tx) -> list[Row]:
            c.get_session(tx, session_id)
            return [goal_lifecycle.history_view(r) for r in goal_store.history(tx, session_id)]

        return a.HistoryList.model_validate({"records": await self.read(run)})

    async def history_record(self, record_id: str) -> a.HistoryRecord:
        record = await self.read(lambda tx: goal_store.history_record(tx, record_id))
        return a.HistoryRecord.model_validate(goal_lifecycle.history_view(record))

    # ------------------------------------------------------------------ Jobs, approvals, events
    async def get_job(self, job_id: str) -> a.Job:
        def run(tx: Tx) -> dict[str, Any]:
            view = waits.job_view(tx, waits.get_job(tx, job_id))
            return {**view, "actions": actions_for(c.get_work(tx, view["work_id"]))}

        return a.Job.model_validate(await self.read(run))

    async def approvals(self, state: str | None) -> a.ApprovalList:
        return a.ApprovalList.model_validate({"approvals": await self.read(lambda tx: c.list_approvals(tx, state))})

    async def approval(self, approval_id: str) -> a.Approval:
        """``GET /approvals/{id}``: one approval as ``GET /approvals`` lists it (404 when unknown)."""
        return a.Approval.model_validate(await self.read(lambda tx: c.get_approval(tx, approval_id)))

    async def events(self, after: int, limit: int) -> a.EventPage:
        self.stores.check()
        return a.EventPage.model_validate(await self.event_tail.after(after, limit))

    # ------------------------------------------------------------------ the server
    async def models(self) -> a.ModelList:
        """``GET /models``: the listed models (credentials are checked now, in this server's environment)."""
        return a.ModelList(models=[a.ModelInfo.model_validate(m.model_dump()) for m in self.catalog.info()],
                           default_model=self.catalog.default_name, config_error=self.models_error or None)

    async def recovery_summary(self, session_id: str | None = None) -> a.RecoverySummary:
        """``GET /recovery``: what the last recovery pass after a server start did with each unfinished
        work item (continued, waiting, paused, stopped, failed), with the actions allowed now; with
        ``session_id``, that session's items only (a chat's continuity banner; 404 for an unknown session)."""
        if session_id is not None:
            await self.read(lambda tx: c.get_session(tx, session_id))
        header, rows = await self.read(lambda tx: recovery_passes.last_pass(tx, host_name()))
        items = []
        counts = {o.value: 0 for o in RecoveryOutcome}
        for r in rows:
            if session_id is not None and r["session_id"] != session_id:
                continue
            outcome = r["detail"].get("outcome", RecoveryOutcome.CONTINUED.value)
            counts[outcome] = counts.get(outcome, 0) + 1
            now = {"phase": r["w_phase"], "desired_state": r["w_desired"], "reason_code": r["w_reason_code"]}
            items.append(a.RecoveredItem.model_validate({
                "work_id": r["work_id"], "session_id": r["session_id"], "session_title": r["title"], "kind": r["w_kind"],
                "outcome": outcome, "reason_code": r["reason_code"] or "",
                "reason": r["detail"].get("reason") or reason_text(r["reason_code"] or ""),
                "decided_at": r["created_at"], "phase": r["phase"], "current_phase": r["w_phase"],
                "actions": actions_for(now), "control_version": int(r["w_control_version"]),
                "mode": r["detail"].get("mode"), "unknown_outcomes": r["detail"].get("unknown") or [],
            }))
        return a.RecoverySummary(recovered_at=header["at"] if header else None,
                                 host_name=header["host_name"] if header else host_name(),
                                 boot_id=header["boot_id"] if header else boot_id(),
                                 server_started_at=self.started_at, counts=counts, items=items)


def _goal_exists(tx: Tx, goal_id: str) -> bool:
    try:
        return goal_store.find_goal(tx, goal_id) is not None
    except Exception:  # no goals table in this schema
        return False
