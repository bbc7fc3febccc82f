"""A Goal's steps with model calls, run by the turn loop: ``extract_requirements`` (purpose
``requirements``) and ``verify`` (purpose ``acceptance``: deterministic checks, then an independent
reviewer with read-only tools). Each is committed by fenced transactions; a crash between them repeats
the step, never its commit (acceptance results and the terminal record are written once). The hooks
inside the turn's own steps are in ``goals/hooks.py``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_goals.faults import crash_point
from jupyter_goals.goals import lifecycle, rules
from jupyter_goals.goals.hooks import back_to_work
from jupyter_goals.models import (
    GoalPhase,
    GoalState,
    ItemKind,
    Phase,
    ProviderMessage,
    ProviderRequest,
    ProviderResponse,
    Purpose,
    ReasonCode,
    ToolCallSpec,
    TurnState,
    Verdict,
    reason_text,
)
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import Database, Row, Tx
from jupyter_goals.usage import budget, paid
from jupyter_goals.usage.prices import PriceTable

REQUIREMENTS_PROMPT = (
    "Extract the verifiable requirements of the user's Goal. Call record_requirements with"
    " requirements [{id, text, kind: semantic|command|file_exists|file_digest, command?, path?, sha256?}]."
    " Only if an ambiguity would change the scope, give ambiguity: the question to ask the user."
)
ACCEPTANCE_PROMPT = (
    "You are an independent acceptance reviewer. Judge each listed requirement from the current state"
    " only, using read-only tools; the worker's own claims are not evidence. Call submit_verdicts with"
    " verdicts [{requirement_id, verdict: met|unmet|unknown, evidence}]."
)
MAX_REVIEW_ROUNDS = 6
_REQ_TOOL = {"type": "function", "function": {
    "name": "record_requirements", "description": "Record the Goal's verifiable requirements.",
    "parameters": {"type": "object", "properties": {"requirements": {"type": "array", "items": {"type": "object"}},
                                                   "ambiguity": {"type": "string"}}}}}
_VERDICT_TOOL = {"type": "function", "function": {
    "name": "submit_verdicts", "description": "Submit one verdict per requirement.",
    "parameters": {"type": "object", "properties": {"verdicts": {"type": "array", "items": {"type": "object"}}}}}}
_DETERMINISTIC = ("command", "file_exists", "file_digest")


class StepProviderFault(Exception):
    """A provider fault during a Goal step: the turn loop handles it like a work request's fault."""

    def __init__(self, request_id: str, error: str, code: ReasonCode, status: int | None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(error)
        self.request_id, self.error, self.code, self.status = request_id, error, code, status
        self.retry_after_s = retry_after_s


@dataclass
class StepContext:
    db: Database
    attempt: Row
    generation: int
    cwd: str
    default_model: str
    read_tool_schemas: list[dict[str, Any]] = field(default_factory=list)
    run_read_tool: Callable[[str, dict[str, Any]], Awaitable[str]] | None = None
    prices: PriceTable | None = None
    # the turn loop's stop watcher and redactor: Goal requests are closed and redacted like work requests
    watch_stop: Callable[[Awaitable[ProviderResponse]], Awaitable[ProviderResponse]] | None = None
    redact: Callable[[str], str] | None = None

    @property
    def aid(self) -> str:
        return str(self.attempt["attempt_id"])

    def fence(self, tx: Tx) -> None:
        c.fence(tx, self.aid, self.generation)


# --------------------------------------------------------------------------- model calls


async def _complete(ctx: StepContext, request: ProviderRequest, model: str) -> ProviderResponse:
    """The paid-request path's call; a stop or a fault is settled here (fenced) and raised to the turn loop."""
    outcome = await paid.call(request, model, reserved_until=time.time() + budget.RESERVATION_TTL_S,
                              watch_stop=ctx.watch_stop, redact=ctx.redact)
    if outcome.response is not None:
        return outcome.response

    def settle(tx: Tx) -> None:
        ctx.fence(tx)
        paid.settle(tx, request.request_id, outcome, ctx.prices)

    await ctx.db.run(settle)
    if outcome.stopped:
        raise paid.StoppedByPerson()
    fault = outcome.failure
    assert fault is not None
    raise StepProviderFault(request.request_id, fault.error, fault.code, fault.status, fault.retry_after_s)


def _record(ctx: StepContext, tx: Tx, purpose: Purpose) -> tuple[Row, Row, str, str]:
    ctx.fence(tx)
    work = c.get_work(tx, ctx.attempt["work_id"])
    if not c.runs_as_admitted(work, ctx.attempt):
        # a Pause, Stop or permission change committed since this attempt was admitted (another process may
        # commit one between two of our transactions, as before an acceptance review): no new paid request;
        # nothing of this transaction is kept and the attempt yields to the control
        raise paid.StoppedByPerson(f"work {work['work_id']} is {work['desired_state']} at control version "
                                   f"{work['control_version']}")
    goal = lifecycle.attribute(tx, work)
    assert goal is not None
    model = c.get_session(tx, work["session_id"])["model"] or ctx.default_model
    # the hard budget is rechecked before requirements and acceptance requests too
    rid, _ = paid.reserve(tx, work, governing=goal, model=model, purpose=purpose, attempt_id=ctx.aid,
                          turn_id=ctx.attempt["turn_id"], prices=ctx.prices)
    return work, goal, model, rid


async def extract_requirements(ctx: StepContext) -> None:
    """At creation: keep the original objective, extract verifiable requirements; ask the person only
    when the model reports an ambiguity that would change the scope (``awaiting_clarification``)."""

    def prepare(tx: Tx) -> tuple[ProviderRequest, str]:
        work, goal, model, rid = _record(ctx, tx, Purpose.REQUIREMENTS)
        msgs = [ProviderMessage(role="system", content=REQUIREMENTS_PROMPT),
                ProviderMessage(role="user", content=goal["original_objective"])]
        for it in c.transcript(tx, work["session_id"]):
            if it.work_id == work["work_id"] and it.item_id != f"input:{work['work_id']}":
                if it.kind == ItemKind.USER:
                    msgs.append(ProviderMessage(role="user", content=it.content))
                elif it.kind == ItemKind.ASSISTANT and it.meta.get("goal_clarification"):
                    msgs.append(ProviderMessage(role="assistant", content=it.content))
        return ProviderRequest(request_id=rid, purpose=Purpose.REQUIREMENTS, messages=msgs, tools=[_REQ_TOOL],
                               goal_objective=goal["objective"]), model

    request, model = await ctx.db.run(prepare)
    response = await _complete(ctx, request, model)

    def commit(tx: Tx) -> None:
        ctx.fence(tx)
        paid.settle_answer(tx, request.request_id, response, ctx.prices)
        work = c.get_work(tx, ctx.attempt["work_id"])
        goal = g.goal_of_work(tx, work["work_id"])
        if goal is None or goal["requirements_state"] != "pending":
            return
        call = next((t for t in response.tool_calls if t.name == "record_requirements"), None)
        args = call.arguments if call else {}
        question = str(args.get("ambiguity") or "").strip()
        if question:
            g.update_goal(tx, goal, requirements_state="clarifying", phase=GoalPhase.WAITING.value,
                          reason_code=str(ReasonCode.AWAITING_CLARIFICATION), reason=question)
            c.append_item(tx, work["session_id"], ItemKind.ASSISTANT, "assistant", question,
                          item_id=f"clarify:{request.request_id}", work_id=work["work_id"],
                          turn_id=ctx.attempt["turn_id"], response_id=f"clarify:{request.request_id}",
                          meta={"goal_clarification": goal["goal_id"]})
            c.end_attempt(tx, ctx.attempt, "awaiting_clarification")
            c.set_phase(tx, work, Phase.WAITING, ReasonCode.AWAITING_CLARIFICATION, question)
            return
        try:
            reqs = rules.normalize_requirements(args.get("requirements") or [])
        except (ValueError, TypeError):
            reqs = []
        g.update_goal(tx, goal, requirements=reqs or rules.fallback_requirements(goal["original_objective"]),
                      requirements_state="extracted")

    await ctx.db.run(commit)


# --------------------------------------------------------------------------- acceptance


@dataclass
class _Plan:
    goal: Row
    revision: int
    todo_version: int
    model: str
    effects: list[Row]  # the calls of the work item and its subtasks (rules.evidence_facts reads them)


STALE_AT_COMMIT = ("The evidence changed while acceptance ran (a file, a later write or a new result);"
                   " it is checked again before the Goal can be achieved.")


def _observe(cwd: str, paths: list[str]) -> tuple[dict[str, rules.FileFact], dict[str, float]]:
    """Current file facts (existence, digest, mtime): runs in a thread, never on an event loop."""
    files: dict[str, rules.FileFact] = {}
    mtimes: dict[str, float] = {}
    for p in paths:
        full = Path(p) if os.path.isabs(p) else Path(cwd) / p
        try:
            data = full.read_bytes()
            mtime = full.stat().st_mtime
        except OSError:
            files[p] = rules.FileFact(False)
            continue
        files[p] = rules.FileFact(True, hashlib.sha256(data).hexdigest(), mtime)
        mtimes[p] = mtime
    return files, mtimes


async def verify(ctx: StepContext) -> bool:
    """Check revision, required Todo, unfinished subtasks and unknown effects, then one independent
    acceptance review.

    Commits ``achieved`` only for the goal_id + revision the check started from and the result version
    it wrote (optimistic concurrency); otherwise records the result and returns to work. Returns
    whether the turn loop should go on (False: this attempt ended)."""

    def prepare(tx: Tx) -> _Plan | None:
        ctx.fence(tx)
        work = c.get_work(tx, ctx.attempt["work_id"])
        goal = g.goal_of_work(tx, work["work_id"])
        if goal is None or goal["state"] != GoalState.ACTIVE or goal["phase"] != GoalPhase.VERIFYING:
            return None
        items, todo_version, todo_goal = g.get_todo(tx, work["session_id"])
        mine = items if todo_goal == goal["goal_id"] else []
        open_required = [it for it in mine if it.get("required", True) and it["status"] != "completed"]
        if open_required:
            note = "Required Todo items are still open: " + ", ".join(it["text"] for it in open_required)
            back_to_work(tx, goal, work, ctx.attempt, note, [], todo_version)
            return None
        running = c.running_children(tx, work["work_id"])
        if running:  # e.g. a subtask whose wait timed out but which still runs: its outcome is not known yet
            note = ("Subtasks are still running (" + ", ".join(r["work_id"] for r in running)
                    + "); the Goal cannot be accepted before their results are known.")
            back_to_work(tx, goal, work, ctx.attempt, note, [], todo_version)
            return None
        model = c.get_session(tx, work["session_id"])["model"] or ctx.default_model
        return _Plan(dict(goal), goal["revision"], todo_version if mine else 0, model,
                     g.evidence_effects(tx, work["work_id"]))

    plan = await ctx.db.run(prepare)
    if plan is None:
        return not await ctx.db.run(lambda tx: c.attempt_ended(tx, ctx.aid))
    crash_point("goal.todo_complete_before_acceptance")
    reqs = plan.goal["requirements"]
    paths = sorted({r["path"] for r in reqs if r.get("path")})
    work_id = str(ctx.attempt["work_id"])
    files, mtimes = await asyncio.to_thread(_observe, ctx.cwd, paths)
    facts = rules.evidence_facts(work_id, plan.effects, reqs, files, mtimes)
    det = [v for r in reqs if r["kind"] in _DETERMINISTIC and (v := rules.check_requirement(r, facts)) is not None]
    semantic = [r for r in reqs if r["kind"] not in _DETERMINISTIC]
    review, request_ids = (await _review(ctx, plan, semantic)) if semantic else ([], [])
    verdicts = rules.merge_verdicts(reqs, det, review)
    result = rules.outcome(verdicts)
    # the files again, just before the commit that may say ``achieved`` (they live outside any transaction)
    files_now, mtimes_now = await asyncio.to_thread(_observe, ctx.cwd, paths)

    def commit(tx: Tx) -> bool:
        ctx.fence(tx)
        work = c.get_work(tx, work_id)
        goal = g.get_goal(tx, plan.goal["goal_id"])
        # every requirement's evidence must still be what was judged: the calls and files read again in
        # the transaction that commits ``achieved``; a change of permissions (or any control) since this
        # attempt was admitted voids the acceptance in progress (spec: permission changes invalidate it)
        current = rules.evidence_facts(work_id, g.evidence_effects(tx, work_id), reqs, files_now, mtimes_now)
        stale = result == Verdict.MET and current != facts
        controlled = int(work["control_version"]) != int(ctx.attempt["control_version"])
        final, outcome = verdicts, result
        if stale:
            final = [{**v, "verdict": Verdict.UNKNOWN.value, "evidence": [*v["evidence"], {
                "kind": "stale", "detail": STALE_AT_COMMIT}]} for v in verdicts]
            outcome = Verdict.UNKNOWN
        again = stale and _was_stale(g.latest_acceptance(tx, goal["goal_id"]))  # changing under every check
        version = g.insert_acceptance(tx, goal, plan.revision, outcome.value, final, request_ids)
        if stale and not again and not controlled and goal["state"] == GoalState.ACTIVE \
                and goal["revision"] == plan.revision and goal["phase"] == GoalPhase.VERIFYING:
            g.update_goal(tx, goal, reason=STALE_AT_COMMIT)  # still verifying: the next attempt checks again
            c.end_turn(tx, work, ctx.attempt["turn_id"], TurnState.COMMITTED, "evidence changed")
            c.end_attempt(tx, ctx.attempt, "evidence changed")
            if work["desired_state"] == "run":
                c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
            return False
        if not controlled and rules.may_achieve(state=goal["state"], phase=goal["phase"], revision=goal["revision"],
                                                checked_revision=plan.revision, result_version=version,
                                                newest_result_version=int(goal["result_version"]), result=outcome):
            g.update_goal(tx, goal, plan.revision, state=GoalState.ACHIEVED.value,
                          reason_code=str(ReasonCode.GOAL_ACHIEVED), reason=reason_text(ReasonCode.GOAL_ACHIEVED),
                          verified_result_version=version, verified_todo_version=plan.todo_version,
                          ended_at=time.time())
            c.end_turn(tx, work, ctx.attempt["turn_id"], TurnState.COMMITTED, "achieved")
            c.end_attempt(tx, ctx.attempt, "achieved")
            c.finish_work(tx, work)
            c.set_phase(tx, work, Phase.DONE, ReasonCode.COMPLETED, reason_text(ReasonCode.GOAL_ACHIEVED))
            lifecycle.write_terminal_record(tx, goal)
            return True
        if goal["state"] == GoalState.ACTIVE and goal["revision"] == plan.revision and not controlled:
            open_verdicts = [v for v in final if v["verdict"] != "met"]
            note = STALE_AT_COMMIT if stale else "Independent acceptance found requirements not yet met."
            back_to_work(tx, goal, work, ctx.attempt, note, open_verdicts, plan.todo_version)
        else:  # revised, paused, ended or permissions changed while it was checked: the result is kept, the
            # old check is void; a Goal still verifying is checked again under the new control version
            c.end_turn(tx, work, ctx.attempt["turn_id"], TurnState.COMMITTED, "verification superseded")
            c.end_attempt(tx, ctx.attempt, "verification superseded")
            if work["desired_state"] == "run":
                c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
        return False

    if await ctx.db.run(commit):
        crash_point("goal.after_completion_commit")
    return False


def _was_stale(result: Row | None) -> bool:
    return result is not None and any(e.get("kind") == "stale" and e.get("detail") == STALE_AT_COMMIT
                                      for v in result["verdicts"] for e in v.get("evidence") or []
                                      if isinstance(e, dict))


async def _review(ctx: StepContext, plan: _Plan, semantic: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """One independent read-only review of the semantic requirements (its own conversation, not chat)."""
    lines = [f"Goal: {plan.goal['objective']}", f"Working directory: {ctx.cwd}", "Requirements to judge:"]
    lines += [f"- {r['id']}: {r['text']}" for r in semantic]
    messages = [ProviderMessage(role="system", content=ACCEPTANCE_PROMPT), ProviderMessage(role="user", content="\n".join(lines))]
    tools = [*ctx.read_tool_schemas, _VERDICT_TOOL]
    request_ids: list[str] = []
    for _ in range(MAX_REVIEW_ROUNDS):
        _, _, model, rid = await ctx.db.run(lambda tx: _record(ctx, tx, Purpose.ACCEPTANCE))
        request_ids.append(rid)
        request = ProviderRequest(request_id=rid, purpose=Purpose.ACCEPTANCE, messages=messages, tools=tools,
                                  goal_objective=plan.goal["objective"])
        response = await _complete(ctx, request, model)
        await ctx.db.run(functools.partial(_settle, ctx, request_id=rid, response=response))
        if response.verdicts:
            return response.verdicts, request_ids
        submitted = next((t for t in response.tool_calls if t.name == "submit_verdicts"), None)
        if submitted is not None:
            found = submitted.arguments.get("verdicts")
            return (found if isinstance(found, list) else []), request_ids
        if not response.tool_calls:
            break
        messages.append(ProviderMessage(role="assistant", content=response.text, tool_calls=response.tool_calls))
        for call in response.tool_calls:
            messages.append(ProviderMessage(role="tool", tool_call_id=call.id, content=await _read_only(ctx, call)))
    return [], request_ids


def _settle(ctx: StepContext, tx: Tx, *, request_id: str, response: ProviderResponse) -> None:
    ctx.fence(tx)
    paid.settle_answer(tx, request_id, response, ctx.prices)


async def _read_only(ctx: StepContext, call: ToolCallSpec) -> str:
    names = {s["function"]["name"] for s in ctx.read_tool_schemas}
    if call.name not in names or ctx.run_read_tool is None:
        return f"error: the acceptance review may use read-only tools only ({call.name} refused)"
    return await ctx.run_read_tool(call.name, call.arguments)
