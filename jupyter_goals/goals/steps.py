"""The Goal hooks the turn loop calls (the turn loop calls these, never the reverse).

- ``next_step``: inside the turn's fenced step read: extract requirements, wait for a clarification,
  or verify, before another work request is made.
- ``after_turn``: the turn-completion check, committed with the end of the turn.
- ``extract_requirements`` and ``verify``: steps with model calls (purposes ``requirements`` and
  ``acceptance``), each committed by fenced transactions; a crash between them repeats the step,
  never its commit (acceptance results and the terminal record are written once).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_goals import budget
from jupyter_goals.faults import crash_point
from jupyter_goals.goals import lifecycle, rules
from jupyter_goals.models import (
    TERMINAL_GOAL_STATES,
    Capability,
    EffectState,
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
    reason_text,
)
from jupyter_goals.prices import PriceTable
from jupyter_goals.providers.base import ProviderError, ProviderUnavailable, resolve_provider
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import Database, Row, Tx

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

    def __init__(self, request_id: str, error: str, code: ReasonCode, status: int | None) -> None:
        super().__init__(error)
        self.request_id, self.error, self.code, self.status = request_id, error, code, status


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

    @property
    def aid(self) -> str:
        return str(self.attempt["attempt_id"])

    def fence(self, tx: Tx) -> None:
        c.fence(tx, self.aid, self.generation)


# --------------------------------------------------------------------------- in the step read


def next_step(tx: Tx, work: Row, attempt: Row) -> str | None:
    """``requirements`` / ``verify`` / ``wait`` (the attempt ended, the Goal waits), or None: work on."""
    goal = g.goal_of_work(tx, work["work_id"])
    if goal is None or goal["state"] != GoalState.ACTIVE:
        return None
    if goal["requirements_state"] == "pending":
        return "requirements"
    if goal["requirements_state"] == "clarifying":
        c.end_attempt(tx, attempt, "awaiting_clarification")
        c.set_phase(tx, work, Phase.WAITING, ReasonCode.AWAITING_CLARIFICATION)
        return "wait"
    if goal["phase"] == GoalPhase.VERIFYING:
        return "verify"
    return None


def is_goal_work(work: Row) -> bool:
    return work.get("kind") == "goal"


def after_turn(tx: Tx, attempt: Row, work: Row, turn_id: str) -> None:
    """The turn-completion check: commit the turn, then continue, verify, block or stop (no round cap)."""
    goal = g.goal_of_work(tx, work["work_id"])
    c.end_turn(tx, work, turn_id, TurnState.COMMITTED, "completed")
    c.end_attempt(tx, attempt, "completed")
    if goal is None or goal["state"] in TERMINAL_GOAL_STATES:
        tx.execute("UPDATE work_items SET desired_state = 'done' WHERE work_id = ?", (work["work_id"],))
        work["desired_state"] = "done"
        c.set_phase(tx, work, Phase.DONE, ReasonCode.COMPLETED)
        return
    effects = tx.all("SELECT tool, capability, state FROM effects WHERE turn_id = ?", (turn_id,))
    progress = any(e["state"] == EffectState.COMMITTED and e["tool"] != "get_goal"
                   and e["capability"] not in (Capability.READ_ONLY, Capability.STATE_PROBE) for e in effects)
    reply = tx.one("SELECT content FROM transcript WHERE turn_id = ? AND kind = 'assistant' ORDER BY seq DESC LIMIT 1",
                   (turn_id,))
    items, todo_version, todo_goal = g.get_todo(tx, work["session_id"])
    mine = items if todo_goal == goal["goal_id"] else []
    required = [it for it in mine if it.get("required", True)]
    facts = rules.TurnFacts(
        state=GoalState(goal["state"]), phase=GoalPhase(goal["phase"]), made_progress=progress,
        reply_digest=hashlib.sha256((reply["content"] if reply else "").encode()).hexdigest()[:16],
        blocker=goal["blocker"], blocker_count=int(goal["blocker_count"]),
        required_todo=len(required), open_required_todo=sum(1 for it in required if it["status"] != "completed"),
        todo_version=todo_version if mine else 0, verified_todo_version=int(goal["verified_todo_version"]),
    )
    d = rules.after_turn(facts)
    fields: dict[str, Any] = {"turns": int(goal["turns"]) + 1, "blocker": d.blocker, "blocker_count": d.blocker_count}
    if d.next == rules.Next.VERIFY:
        fields.update(phase=GoalPhase.VERIFYING.value, reason_code=str(ReasonCode.GOAL_VERIFYING),
                      reason=reason_text(ReasonCode.GOAL_VERIFYING))
        g.update_goal(tx, goal, **fields)
        c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
    elif d.next == rules.Next.BLOCK:
        excerpt = (reply["content"] if reply else "")[:200]
        fields.update(state=GoalState.BLOCKED.value, reason_code=str(ReasonCode.GOAL_BLOCKED),
                      reason=f"{reason_text(ReasonCode.GOAL_BLOCKED)} Last reply: {excerpt}")
        g.update_goal(tx, goal, **fields)
        c.set_phase(tx, work, Phase.WAITING, ReasonCode.GOAL_BLOCKED, goal["reason"])
    else:
        g.update_goal(tx, goal, **fields)
        if d.next == rules.Next.CONTINUE:
            lifecycle._prompt(tx, goal, rules.continuation_prompt(goal["objective"], goal["requirements"]))
        if work["desired_state"] == "run":
            c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)


def _back_to_work(tx: Tx, goal: Row, work: Row, attempt: Row, note: str, open_verdicts: list[dict[str, Any]],
                  todo_version: int) -> None:
    """Missing or failing evidence: another work turn, never fabricated acceptance."""
    g.update_goal(tx, goal, phase=GoalPhase.WORKING.value, reason_code="", reason="",
                  verified_todo_version=todo_version)
    lifecycle._prompt(tx, goal, rules.continuation_prompt(goal["objective"], goal["requirements"], open_verdicts, note))
    c.end_turn(tx, work, attempt["turn_id"], TurnState.COMMITTED, "verified")
    c.end_attempt(tx, attempt, "verified")
    if work["desired_state"] == "run":
        c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)


# --------------------------------------------------------------------------- model calls


async def _complete(ctx: StepContext, request: ProviderRequest, model: str) -> ProviderResponse:
    try:
        return await resolve_provider(model).complete(request)
    except ProviderUnavailable as exc:
        error, code, status = str(exc), exc.reason_code, None
    except ProviderError as exc:
        error, status = str(exc), exc.status
        code = ReasonCode.PROVIDER_RETRYING if exc.retryable else ReasonCode.PROVIDER_FAILED
    await ctx.db.run(lambda tx: c.lose_request(tx, request.request_id, error))
    raise StepProviderFault(request.request_id, error, code, status)


def _record(ctx: StepContext, tx: Tx, purpose: Purpose) -> tuple[Row, Row, str, str]:
    ctx.fence(tx)
    work = c.get_work(tx, ctx.attempt["work_id"])
    goal = lifecycle.attribute(tx, work)
    assert goal is not None
    model = c.get_session(tx, work["session_id"])["model"] or ctx.default_model
    rid = c.new_id("req")
    held = budget.admit_request(tx, goal, model, ctx.prices)  # rechecked before requirements and acceptance
    c.record_request(tx, work, request_id=rid, attempt_id=ctx.aid, turn_id=ctx.attempt["turn_id"],
                     purpose=purpose.value, model=model, reserved_usd=held.usd, reserved_tokens=held.tokens,
                     reservation_ttl_s=budget.RESERVATION_TTL_S)
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
        c.settle_request(tx, request.request_id, response.usage.model_dump() if response.usage else None,
                         prices=ctx.prices)
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
    runs: list[rules.CommandRun]
    writes: dict[str, float]
    unknown_since: float


def _exit_status(text: str | None) -> int | None:
    if not text or not text.startswith("exit status: "):
        return None
    head = text.split("\n", 1)[0].removeprefix("exit status: ").strip()
    return int(head) if head.lstrip("-").isdigit() else None


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
            _back_to_work(tx, goal, work, ctx.attempt, note, [], todo_version)
            return None
        running = tx.all("SELECT work_id FROM work_items WHERE parent_work_id = ? AND phase NOT IN"
                         " ('done', 'cancelled', 'failed')", (work["work_id"],))
        if running:  # e.g. a subtask whose wait timed out but which still runs: its outcome is not known yet
            note = ("Subtasks are still running (" + ", ".join(r["work_id"] for r in running)
                    + "); the Goal cannot be accepted before their results are known.")
            _back_to_work(tx, goal, work, ctx.attempt, note, [], todo_version)
            return None
        runs: list[rules.CommandRun] = []
        writes: dict[str, float] = {}
        unknown_since = 0.0
        for e in tx.all("SELECT call_id, tool, arguments, state, result, dispatched_at, ended_at FROM effects"
                        " WHERE work_id = ? ORDER BY seq", (work["work_id"],)):
            args = json.loads(e["arguments"])
            if e["state"] == EffectState.UNKNOWN:
                unknown_since = max(unknown_since, float(e["dispatched_at"] or 0))
            elif e["state"] in (EffectState.COMMITTED, EffectState.RECONCILED):
                if e["tool"] == "shell":
                    runs.append(rules.CommandRun(e["call_id"], str(args.get("command", "")), _exit_status(e["result"]),
                                                 float(e["dispatched_at"] or 0)))
                elif e["tool"] in ("write_file", "edit_file") and args.get("path"):
                    writes[str(args["path"])] = max(writes.get(str(args["path"]), 0.0), float(e["ended_at"] or 0))
        model = c.get_session(tx, work["session_id"])["model"] or ctx.default_model
        return _Plan(dict(goal), goal["revision"], todo_version if mine else 0, model, runs, writes, unknown_since)

    plan = await ctx.db.run(prepare)
    if plan is None:
        return not await ctx.db.run(lambda tx: tx.one(
            "SELECT attempt_id FROM attempts WHERE attempt_id = ? AND state != 'running'", (ctx.aid,)))
    crash_point("goal.todo_complete_before_acceptance")
    reqs = plan.goal["requirements"]
    paths = sorted({r["path"] for r in reqs if r.get("path")})
    files, mtimes = await asyncio.to_thread(_observe, ctx.cwd, paths)
    last_write = {p: max(plan.writes.get(p, 0.0), mtimes.get(p, 0.0)) for p in paths}
    facts = rules.EvidenceFacts(files=files, runs=tuple(plan.runs), last_write=last_write,
                                unknown_since=plan.unknown_since)
    det = [v for r in reqs if r["kind"] in _DETERMINISTIC and (v := rules.check_requirement(r, facts)) is not None]
    semantic = [r for r in reqs if r["kind"] not in _DETERMINISTIC]
    review, request_ids = (await _review(ctx, plan, semantic)) if semantic else ([], [])
    verdicts = rules.merge_verdicts(reqs, det, review)
    result = rules.outcome(verdicts)

    def commit(tx: Tx) -> bool:
        ctx.fence(tx)
        work = c.get_work(tx, ctx.attempt["work_id"])
        goal = g.get_goal(tx, plan.goal["goal_id"])
        version = g.insert_acceptance(tx, goal, plan.revision, result.value, verdicts, request_ids)
        if rules.may_achieve(state=goal["state"], phase=goal["phase"], revision=goal["revision"],
                             checked_revision=plan.revision, result_version=version,
                             newest_result_version=int(goal["result_version"]), result=result):
            g.update_goal(tx, goal, plan.revision, state=GoalState.ACHIEVED.value,
                          reason_code=str(ReasonCode.GOAL_ACHIEVED), reason=reason_text(ReasonCode.GOAL_ACHIEVED),
                          verified_result_version=version, verified_todo_version=plan.todo_version,
                          ended_at=time.time())
            c.end_turn(tx, work, ctx.attempt["turn_id"], TurnState.COMMITTED, "achieved")
            c.end_attempt(tx, ctx.attempt, "achieved")
            tx.execute("UPDATE work_items SET desired_state = 'done' WHERE work_id = ?", (work["work_id"],))
            work["desired_state"] = "done"
            c.set_phase(tx, work, Phase.DONE, ReasonCode.COMPLETED, reason_text(ReasonCode.GOAL_ACHIEVED))
            lifecycle.write_terminal_record(tx, goal)
            return True
        if goal["state"] == GoalState.ACTIVE and goal["revision"] == plan.revision:
            open_verdicts = [v for v in verdicts if v["verdict"] != "met"]
            _back_to_work(tx, goal, work, ctx.attempt, "Independent acceptance found requirements not yet met.",
                          open_verdicts, plan.todo_version)
        else:  # revised, paused or ended while it was checked: the result is kept, the old check is void
            c.end_turn(tx, work, ctx.attempt["turn_id"], TurnState.COMMITTED, "verification superseded")
            c.end_attempt(tx, ctx.attempt, "verification superseded")
            if work["desired_state"] == "run":
                c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
        return False

    if await ctx.db.run(commit):
        crash_point("goal.after_completion_commit")
    return False


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
    c.settle_request(tx, request_id, response.usage.model_dump() if response.usage else None, prices=ctx.prices)


async def _read_only(ctx: StepContext, call: ToolCallSpec) -> str:
    names = {s["function"]["name"] for s in ctx.read_tool_schemas}
    if call.name not in names or ctx.run_read_tool is None:
        return f"error: the acceptance review may use read-only tools only ({call.name} refused)"
    return await ctx.run_read_tool(call.name, call.arguments)
