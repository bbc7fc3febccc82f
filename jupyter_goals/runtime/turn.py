"""The turn loop (DESIGN §7), resumable from durable facts alone.

Each step reads the next action from control.db under the attempt's fence: reattach a running
tool process, dispatch a planned call, deliver steered messages, call the provider, or finish. A new
attempt after a crash therefore resumes from the last committed step without any memory of the old
one. Commit order per call: ``dispatched`` before the side effect begins, the result after it ends.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_goals import budget
from jupyter_goals.faults import crash_point
from jupyter_goals.goals import lifecycle as goal_lifecycle
from jupyter_goals.goals import steps as goal_steps
from jupyter_goals.goals import tools as goal_tools
from jupyter_goals.models import (
    Capability,
    EffectState,
    ItemKind,
    Phase,
    ProviderRequest,
    ProviderResponse,
    Purpose,
    ReasonCode,
    TurnState,
    Usage,
    WorkKind,
)
from jupyter_goals.prices import PriceTable
from jupyter_goals.providers.base import ProviderError, ProviderUnavailable, resolve_provider
from jupyter_goals.recovery.repair import repair_history
from jupyter_goals.runtime.permissions import CallFacts, check_call
from jupyter_goals.runtime.subtasks import CREATES_WORK
from jupyter_goals.runtime.tools import (
    ToolContext,
    ToolRegistry,
    ToolResult,
    ToolSpec,
    trusted_probe,
    trusted_state_tool,
    wait_shell,
)
from jupyter_goals.store import control as c
from jupyter_goals.store import waits
from jupyter_goals.store.db import Database, FencedError, Row, Tx

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an agent working inside Jupyter. Use the tools to act; results marked as unknown outcome"
    " may or may not have happened: investigate with read-only tools before repeating any write."
)


@dataclass
class Step:
    kind: str  # stop | reattach | dispatch | approval | deliver | provider | finish
    effect: Row | None = None
    approval: Row | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def retry_delay(failures: int, base: float, cap: float = 60.0) -> float:
    return float(min(cap, base * (2 ** max(0, failures - 1))))


class TurnRunner:
    """Runs one admitted attempt to its end (finish, wait, control change, or fencing)."""

    def __init__(
        self,
        db: Database,
        attempt: Row,
        *,
        state_dir: Path,
        registry: ToolRegistry,
        default_model: str,
        cwd: str,
        retry_base_s: float = 1.0,
        prices: PriceTable | None = None,
    ) -> None:
        self.cwd = cwd
        self.prices = prices  # quotes each settled request for the hard-budget checks
        self.db = db
        self.attempt = attempt
        self.aid: str = attempt["attempt_id"]
        self.gen: int = int(attempt["generation"])
        self.effects_root = state_dir / "effects"
        self.state_dir = state_dir
        self.registry = registry
        self.default_model = default_model
        self.retry_base_s = retry_base_s
        # true while only waiting for a detached process: a graceful stop may cancel that wait at once
        self.awaiting_process = False

    # ------------------------------------------------------------------ main loop
    async def run(self) -> None:
        try:
            while True:
                step = await self.db.run(self._next_step)
                if step.kind in ("stop", "approval", "finish"):
                    return
                if step.kind == "reattach":
                    assert step.effect is not None
                    await self._reattach(step.effect)
                elif step.kind == "dispatch":
                    assert step.effect is not None
                    await self._dispatch(step.effect, step.approval)
                elif step.kind == "deliver":
                    await self._deliver()
                elif step.kind == "provider":
                    if not await self._provider_step():
                        return
                elif step.kind in ("requirements", "verify") and not await self._goal_step(step.kind):
                    return
        except FencedError as exc:
            log.info("attempt %s fenced: %s", self.aid, exc)

    # ------------------------------------------------------------------ deciding the next step
    def _next_step(self, tx: Tx) -> Step:
        c.fence(tx, self.aid, self.gen)
        work = c.get_work(tx, self.attempt["work_id"])
        if work["desired_state"] != "run" or int(work["control_version"]) != int(self.attempt["control_version"]):
            self._yield_to_control(tx, work)
            return Step("stop")
        turn_id = self.attempt["turn_id"]
        effects = c.effects_of_turn(tx, turn_id)
        for eff in effects:
            if eff["state"] == EffectState.DISPATCHED:
                return Step("reattach", effect=eff)
        for eff in effects:
            if eff["state"] == EffectState.PLANNED:
                if trusted_state_tool(self.registry.get(eff["tool"]), eff) and eff["tool"] not in CREATES_WORK \
                        and goal_tools.runs_freely(tx, eff["tool"], work["work_id"]):
                    return Step("dispatch", effect=eff)  # Goal-ledger writes, committed with their record
                return self._permission_step(tx, work, eff)
        if waits.open_wait_count(tx, work["work_id"]):  # a durable wait: no idle model turns until notified
            waits.observe(tx, work)
            c.end_attempt(tx, self.attempt, "awaiting_subtask")
            c.set_phase(tx, work, Phase.WAITING, ReasonCode.AWAITING_SUBTASK)
            return Step("stop")
        if waits.waits_of(tx, work["work_id"], "ready"):
            return Step("deliver")
        steer = c.pending_steer(tx, work["work_id"])
        for m in steer:
            c.append_item(tx, work["session_id"], ItemKind.USER, "user", m["text"], work_id=work["work_id"],
                          turn_id=turn_id, item_id=f"steer:{m['message_id']}")
            tx.execute("UPDATE messages SET consumed = 1 WHERE message_id = ?", (m["message_id"],))
        goal_step = goal_steps.next_step(tx, work, self.attempt) if goal_steps.is_goal_work(work) else None
        if goal_step is not None:
            return Step("stop" if goal_step == "wait" else goal_step)
        last = tx.one(
            "SELECT kind, response_id FROM transcript WHERE turn_id = ? ORDER BY seq DESC LIMIT 1", (turn_id,)
        )
        if not steer and last is not None and last["kind"] == ItemKind.ASSISTANT:
            has_calls = tx.one(
                "SELECT item_id FROM transcript WHERE response_id = ? AND kind = 'tool_call'", (last["response_id"],)
            )
            if has_calls is None:
                self._finish(tx, work, turn_id)
                return Step("finish")
        return Step("provider")

    def _yield_to_control(self, tx: Tx, work: Row) -> None:
        c.end_attempt(tx, self.attempt, "control")
        if work["desired_state"] == "cancelled":
            c.finish_cancelled(tx, work)
        elif work["desired_state"] == "paused":
            c.set_phase(tx, work, Phase.PAUSED, work["reason_code"] if work["phase"] == "paused" else ReasonCode.USER_PAUSED)
        else:
            c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)

    def _finish(self, tx: Tx, work: Row, turn_id: str) -> None:
        if goal_steps.is_goal_work(work):  # a Goal goes on turn after turn: the turn-completion check decides
            goal_steps.after_turn(tx, self.attempt, work, turn_id)
            return
        c.end_turn(tx, work, turn_id, TurnState.COMMITTED, "completed")
        c.end_attempt(tx, self.attempt, "completed")
        # an ordinary request continues only until it finishes
        tx.execute(
            "UPDATE work_items SET desired_state = 'done', recovery_attempts = 0 WHERE work_id = ?", (work["work_id"],)
        )
        work["desired_state"] = "done"
        c.set_phase(tx, work, Phase.DONE, ReasonCode.COMPLETED)
        if work["kind"] in (WorkKind.JOB, WorkKind.SUBTASK):  # its result is durable; its waiters are notified
            reply = tx.one("SELECT content FROM transcript WHERE turn_id = ? AND kind = 'assistant' ORDER BY seq DESC"
                           " LIMIT 1", (turn_id,))
            waits.save_result(tx, work, "completed", reply["content"] if reply else "")

    def _permission_step(self, tx: Tx, work: Row, eff: Row) -> Step:
        """Run, wait for an approval, or reject: ``check_call`` decides from the effect's saved
        capability and implementation identity, the work item's permission scope and its unknown-effect
        set (scoped to this work item). An approval is used only if it is bound to this call, its
        arguments and the current unknown-effect set; a changed set needs a fresh approval.
        """
        spec = self.registry.get(eff["tool"])
        if spec is None:
            return Step("dispatch", effect=eff)  # fails as unknown tool, recorded as a result
        facts = CallFacts(
            tool=eff["tool"],
            arguments=eff["arguments"],
            capability=Capability(eff["capability"]),
            trusted_probe=spec.identity == eff["impl_identity"] and trusted_probe(eff["impl_identity"], eff["impl_digest"]),
        )
        if facts.trusted_probe:
            return Step("dispatch", effect=eff)  # built-in reads and probes run whatever else is known
        try:
            unknown = c.unknown_effect_set(tx, work["work_id"])
        except Exception as exc:  # the recovery state cannot be read: reject the call, never dispatch it
            self._reject_unreadable(tx, work, eff, exc)
            return Step("stop")
        verdict = check_call(facts, json.loads(work["permission_scope"]), self.cwd, unknown)
        if verdict.run:
            return Step("dispatch", effect=eff)
        unknown_digest = c.unknown_set_digest(unknown)
        approval = c.approval_for_call(tx, eff["call_id"])
        if approval is not None and approval["arguments_digest"] == c.digest(eff["arguments"]):
            if approval["unknown_set_digest"] == unknown_digest:
                if approval["state"] == "approved":
                    return Step("dispatch", effect=eff, approval=approval)
                if approval["state"] == "denied":
                    self._deny(tx, work, eff)
                    return self._next_step(tx)
                if approval["state"] == "pending":
                    self._wait_for_approval(tx, work)
                    return Step("approval")
            elif approval["state"] in ("pending", "approved"):
                c.supersede_approval(tx, approval, "Withdrawn because the set of calls with an unknown outcome changed;"
                                     " a fresh approval is asked.")
        c.request_approval(tx, work, eff, unknown, verdict.reason)
        self._wait_for_approval(tx, work)
        return Step("approval")

    def _reject_unreadable(self, tx: Tx, work: Row, eff: Row, exc: Exception) -> None:
        log.error("attempt %s: unknown-effect records unreadable; rejecting %s: %s", self.aid, eff["call_id"], exc)
        c.end_attempt(tx, self.attempt, "recovery state unreadable")
        c.emit(tx, "effect.rejected", {"call_id": eff["call_id"], "tool": eff["tool"],
                                       "reason_code": str(ReasonCode.RECOVERY_STATE_UNREADABLE), "error": str(exc)[:300]},
               session_id=work["session_id"], work_id=work["work_id"])
        c.set_phase(tx, work, Phase.FAILED, ReasonCode.RECOVERY_STATE_UNREADABLE)
        c.bump_commit_point(tx, work["work_id"])

    def _wait_for_approval(self, tx: Tx, work: Row) -> None:
        c.end_attempt(tx, self.attempt, "awaiting_approval")
        c.set_phase(tx, work, Phase.WAITING, ReasonCode.AWAITING_APPROVAL)

    def _deny(self, tx: Tx, work: Row, eff: Row) -> None:
        c.set_effect_state(tx, eff, EffectState.DENIED)
        c.append_item(tx, work["session_id"], ItemKind.TOOL_RESULT, "tool", "[denied by the user: not executed]",
                      item_id=f"denied:{eff['call_id']}", work_id=work["work_id"], turn_id=eff["turn_id"],
                      call_id=eff["call_id"], tool=eff["tool"], state=str(EffectState.DENIED))
        c.bump_commit_point(tx, work["work_id"])

    async def _deliver(self) -> None:
        """Subtask results that arrived (while this work waited, was paused, or the server was down)
        join the transcript once: delivery and consumption commit together under the fence."""
        crash_point("child.before_delivery")

        def deliver(tx: Tx) -> None:
            c.fence(tx, self.aid, self.gen)
            waits.deliver(tx, c.get_work(tx, self.attempt["work_id"]), self.attempt["turn_id"])

        await self.db.run(deliver)
        crash_point("child.after_delivery")

    # ------------------------------------------------------------------ tools
    def _spec_and_ctx(self, eff: Row) -> tuple[ToolSpec | None, ToolContext]:
        return self.registry.get(eff["tool"]), ToolContext(
            cwd=self.cwd, effects_root=self.effects_root, effect_id=eff["effect_id"]
        )

    async def _dispatch(self, eff: Row, approval: Row | None) -> None:
        spec, ctx = self._spec_and_ctx(eff)
        crash_point("tool.before_dispatch")
        if spec is not None and spec.state_impl is not None and trusted_state_tool(spec, eff):
            impl = spec.state_impl

            def state_tool(tx: Tx) -> None:
                c.fence(tx, self.aid, self.gen)
                work = c.get_work(tx, eff["work_id"])
                goal_tools.commit_state_tool(tx, impl, work, eff, self.aid, work["host_name"], approval)

            await self.db.run(state_tool)
            return

        def dispatched(tx: Tx) -> None:
            c.fence(tx, self.aid, self.gen)
            n = tx.execute(
                "UPDATE effects SET state = 'dispatched', dispatched_at = ?, attempt_id = ? WHERE effect_id = ?"
                " AND state = 'planned'",
                (time.time(), self.aid, eff["effect_id"]),
            )
            if n != 1:
                raise FencedError(f"effect {eff['call_id']} is no longer planned")
            if approval is not None:
                used = tx.execute(
                    "UPDATE approvals SET state = 'consumed', consumed_by_attempt = ? WHERE approval_id = ?"
                    " AND state = 'approved'",
                    (self.aid, approval["approval_id"]),
                )
                if used != 1:
                    raise FencedError(f"approval {approval['approval_id']} was already consumed")
            c.emit(tx, "effect.state", {"call_id": eff["call_id"], "tool": eff["tool"], "state": "dispatched"},
                   session_id=eff["session_id"], work_id=eff["work_id"])

        await self.db.run(dispatched)
        if spec is None:
            result = ToolResult(f"error: unknown tool {eff['tool']!r}", ok=False)
        else:
            try:
                self.awaiting_process = eff["tool"] == "shell"
                result = await spec.impl(ctx, eff["arguments"])
                self.awaiting_process = False
            except Exception as exc:  # a tool's failure is its result, not the loop's
                result = ToolResult(f"error: {type(exc).__name__}: {exc}", ok=False)
        if eff["tool"] != "shell":
            crash_point("tool.after_dispatch")
        await self._commit_result(eff, result.content, EffectState.COMMITTED)

    async def _reattach(self, eff: Row) -> None:
        """A dispatched call from an earlier attempt: reconnect its live process, never start it again."""
        effect_dir = self.state_dir / "effects" / eff["effect_id"]
        self.awaiting_process = eff["tool"] == "shell"
        text = await wait_shell(effect_dir) if eff["tool"] == "shell" else None
        self.awaiting_process = False
        if text is None:
            await self._commit_result(eff, "", EffectState.UNKNOWN)
        else:
            await self._commit_result(eff, text, EffectState.COMMITTED)

    async def _commit_result(self, eff: Row, content: str, state: EffectState) -> None:
        crash_point("tool.before_result_commit")

        def commit(tx: Tx) -> None:
            c.fence(tx, self.aid, self.gen)
            c.set_effect_state(tx, eff, state, content)
            c.append_item(tx, eff["session_id"], ItemKind.TOOL_RESULT, "tool", content, item_id=f"result:{eff['call_id']}",
                          work_id=eff["work_id"], turn_id=eff["turn_id"], call_id=eff["call_id"], tool=eff["tool"],
                          state=str(state))

        await self.db.run(commit)
        crash_point("tool.after_result_commit")

    # ------------------------------------------------------------------ goal steps
    async def _goal_step(self, kind: str) -> bool:
        """Requirements extraction or acceptance (goals/steps.py); False when the attempt ended."""
        read_tools = {name: spec for name, spec in self.registry.tools.items()
                      if spec.capability in (Capability.READ_ONLY, Capability.STATE_PROBE)
                      and trusted_probe(spec.identity, spec.digest)}

        async def run_read_tool(name: str, args: dict[str, Any]) -> str:
            ctx = ToolContext(cwd=self.cwd, effects_root=self.effects_root, effect_id="acceptance")
            return (await read_tools[name].impl(ctx, args)).content

        ctx = goal_steps.StepContext(self.db, self.attempt, self.gen, self.cwd, self.default_model,
                                     [s.schema() for s in read_tools.values()], run_read_tool, self.prices)
        try:
            if kind == "requirements":
                await goal_steps.extract_requirements(ctx)
                return True
            return await goal_steps.verify(ctx)
        except goal_steps.StepProviderFault as exc:
            fault = exc
        except budget.BudgetHeld as held:
            problem = held.problem
            await self.db.run(lambda tx: self._budget_held(tx, problem))
            return False
        await self.db.run(lambda tx: self._provider_failed(tx, fault.request_id, fault.error, fault.code, fault.status))
        return False

    # ------------------------------------------------------------------ provider
    async def _provider_step(self) -> bool:
        def prepare(tx: Tx) -> tuple[ProviderRequest, Row, Row]:
            c.fence(tx, self.aid, self.gen)
            work = c.get_work(tx, self.attempt["work_id"])
            session = c.get_session(tx, work["session_id"])
            items = c.transcript(tx, work["session_id"])
            request_id = c.new_id("req")
            model = session["model"] or self.default_model
            goal = goal_lifecycle.attribute(tx, work)  # goal_id + revision fixed before dispatch
            # the Goal's hard budget (a Job's or subtask's too) is rechecked before every request;
            # BudgetHeld leaves nothing recorded and nothing sent
            governing = goal or budget.governing_goal(tx, work)
            held = budget.admit_request(tx, governing, model, self.prices)
            c.record_request(tx, work, request_id=request_id, attempt_id=self.aid, turn_id=self.attempt["turn_id"],
                             purpose=Purpose.WORK.value, model=model, reserved_usd=held.usd,
                             reserved_tokens=held.tokens, reservation_ttl_s=budget.RESERVATION_TTL_S)
            req = ProviderRequest(
                request_id=request_id,
                purpose=Purpose.WORK,
                messages=repair_history(items, SYSTEM_PROMPT),
                tools=self.registry.schemas(),
                goal_objective=goal["objective"] if goal else None,
                max_output_tokens=budget.goal_budget(governing).get("max_output_tokens_per_request") if governing else None,
            )
            return req, work, session

        try:
            request, work, session = await self.db.run(prepare)
        except budget.BudgetHeld as held:
            problem = held.problem
            await self.db.run(lambda tx: self._budget_held(tx, problem))
            return False
        model = session["model"] or self.default_model
        reserved_until = time.time() + budget.RESERVATION_TTL_S
        crash_point("provider.before_request")
        watermark: list[Usage] = []  # the last cumulative usage snapshot of this request (replaced, never summed)

        def on_usage(usage: Usage) -> None:
            watermark[:] = [usage]

        answered = True  # the provider answered (an HTTP error, or nothing sent at all): nothing consumed
        expired = time.time() > reserved_until  # an expired unstarted reservation cannot dispatch
        try:
            if expired:
                raise ProviderError("the budget reservation expired before the request was sent", retryable=True)
            provider = resolve_provider(model)
            response = await provider.complete(request, on_usage=on_usage)
        except ProviderUnavailable as unavailable:
            error, code, status = str(unavailable), unavailable.reason_code, None
        except ProviderError as fault:
            error, status, answered = str(fault), fault.status, fault.status is not None or expired
            code = ReasonCode.PROVIDER_RETRYING if fault.retryable else ReasonCode.PROVIDER_FAILED
        else:
            error = ""
        if error:
            used = watermark[0] if watermark else (Usage(input_tokens=0, output_tokens=0) if answered else None)

            def failed(tx: Tx) -> None:
                if used is None:
                    c.lose_request(tx, request.request_id, error)
                else:  # a stream lost after a usage snapshot consumed at least that much: a lower bound
                    c.settle_request(tx, request.request_id, used.model_dump(), error=error, partial=bool(watermark),
                                     prices=self.prices)
                self._provider_failed(tx, request.request_id, error, code, status)

            await self.db.run(failed)
            return False
        crash_point("provider.after_response")
        await self.db.run(lambda tx: self._commit_response(tx, work, request, response, model))
        crash_point("provider.after_commit")
        return True

    def _budget_held(self, tx: Tx, problem: budget.Problem) -> None:
        """No paid request may start: end the attempt before anything is recorded or sent; the work
        waits with the budget's reason and the Coordinator rechecks it on every pass."""
        c.fence(tx, self.aid, self.gen)
        work = c.get_work(tx, self.attempt["work_id"])
        c.end_attempt(tx, self.attempt, f"budget: {problem.code}")
        budget.hold(tx, work, problem)

    def _provider_failed(self, tx: Tx, request_id: str, error: str, code: ReasonCode, status: int | None) -> None:
        c.fence(tx, self.aid, self.gen)
        work = c.get_work(tx, self.attempt["work_id"])
        c.end_attempt(tx, self.attempt, f"provider: {error}"[:200])
        if code == ReasonCode.PROVIDER_RETRYING:
            failures = int(tx.scalar(
                "SELECT COUNT(*) AS n FROM requests WHERE turn_id = ? AND state IN ('failed', 'lost')",
                (self.attempt["turn_id"],)
            ) or 1)
            delay = retry_delay(failures, self.retry_base_s)
            tx.execute("UPDATE work_items SET next_attempt_at = ? WHERE work_id = ?", (time.time() + delay, work["work_id"]))
            c.set_phase(tx, work, Phase.WAITING, code,
                        f"The model provider had a temporary fault ({status or 'connection lost'}); retry {failures} in {delay:.1f} s.")
        else:
            c.set_phase(tx, work, Phase.FAILED, code, f"The model provider failed: {error}")
        c.bump_commit_point(tx, work["work_id"])

    def _commit_response(self, tx: Tx, work: Row, request: ProviderRequest, response: ProviderResponse, model: str) -> None:
        """Commit the assistant message, its tool calls (effects ``planned``) and the usage receipt together."""
        c.fence(tx, self.aid, self.gen)
        turn_id = self.attempt["turn_id"]
        rid = response.provider_response_id or request.request_id
        response_id = f"resp:{request.request_id}"
        c.append_item(tx, work["session_id"], ItemKind.ASSISTANT, "assistant", response.text, item_id=response_id,
                      work_id=work["work_id"], turn_id=turn_id, response_id=response_id, meta={"provider_response_id": rid})
        now = time.time()
        for i, call in enumerate(response.tool_calls):
            call_id = f"{request.request_id}:{i}"
            spec = self.registry.get(call.name)
            seq = c.append_item(tx, work["session_id"], ItemKind.TOOL_CALL, "assistant", "", item_id=f"call:{call_id}",
                                work_id=work["work_id"], turn_id=turn_id, call_id=call_id, provider_call_id=call.id,
                                response_id=response_id, tool=call.name, arguments=call.arguments)
            assert seq is not None  # a new call id
            tx.execute(
                "INSERT INTO effects (effect_id, call_id, work_id, turn_id, session_id, tool, arguments, capability,"
                " impl_identity, impl_digest, state, created_at, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'planned', ?, ?)",
                (c.new_id("eff"), call_id, work["work_id"], turn_id, work["session_id"], call.name, c.dumps(call.arguments),
                 str(spec.capability if spec else Capability.UNKNOWN), spec.identity if spec else "",
                 spec.digest if spec else "", now, seq),
            )
        c.settle_request(tx, request.request_id, response.usage.model_dump() if response.usage else None,
                         prices=self.prices)
        tx.execute("UPDATE work_items SET next_attempt_at = 0 WHERE work_id = ?", (work["work_id"],))
