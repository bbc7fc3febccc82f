"""The turn loop (DESIGN §7), resumable from durable facts alone.

Each step reads the next action from control.db under the attempt's fence: reattach a running
tool process, dispatch a planned call, deliver steered messages, call the provider, or finish. A new
attempt after a crash therefore resumes from the last committed step without any memory of the old
one. Commit order per call: ``dispatched`` before the side effect begins, the result after it ends.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from jupyter_goals.faults import crash_point
from jupyter_goals.goals import acceptance as goal_acceptance
from jupyter_goals.goals import hooks as goal_hooks
from jupyter_goals.goals import lifecycle as goal_lifecycle
from jupyter_goals.goals import tools as goal_tools
from jupyter_goals.host.effect_files import (
    cancel_shell,
    cancelled_result_text,
    recovered_result_text,
    wait_shell,
)
from jupyter_goals.host.secrecy import Redactor
from jupyter_goals.models import (
    Capability,
    EffectState,
    ItemKind,
    Phase,
    ProviderMessage,
    ProviderRequest,
    ProviderResponse,
    Purpose,
    ReasonCode,
    StepKind,
    TurnState,
    WorkKind,
)
from jupyter_goals.providers.named import named_from_env
from jupyter_goals.recovery.repair import IncrementalHistory
from jupyter_goals.runtime.drafts import DraftStream
from jupyter_goals.runtime.permissions import CallFacts, ReadFence, check_call, read_fence, secret_places
from jupyter_goals.runtime.steps import StepDecision, StepFacts, next_step
from jupyter_goals.runtime.subtasks import CREATES_WORK
from jupyter_goals.runtime.tools import (
    ToolContext,
    ToolRegistry,
    ToolResult,
    ToolSpec,
    path_reader,
    trusted_probe,
    trusted_state_tool,
)
from jupyter_goals.store import control as c
from jupyter_goals.store import waits
from jupyter_goals.store.db import Database, FencedError, Row, Tx
from jupyter_goals.usage import budget, paid
from jupyter_goals.usage.prices import PriceTable

log = logging.getLogger(__name__)
T = TypeVar("T")
CANCEL_POLL_S = 0.2  # how often a running tool call checks for a stop or cancel (one indexed read)

SYSTEM_PROMPT = (
    "You are an agent working inside Jupyter. Use the tools to act; results marked as unknown outcome"
    " may or may not have happened: investigate with read-only tools before repeating any write."
)


COMPACT_AT = 0.8  # compact when a request would fill this share of the model's context window
COMPACTION_PROMPT = (
    "You compact a long agent conversation. Write a faithful summary that lets the agent continue: the"
    " user's requests and constraints verbatim where short, decisions made, files and commands touched with"
    " their outcomes (say which outcomes are unknown), and what remains to do."
)
COMPACTION_REQUEST = "Summarize the conversation above for the agent that continues it."


@functools.lru_cache(maxsize=64)
def _env_allow(permission_scope: str | None) -> tuple[str, ...]:
    """The environment names a work item's permission scope lets its tools see (parsed once per
    distinct scope: a worker reads the scope before every call)."""
    scope = json.loads(permission_scope or "{}")
    return tuple(str(name) for name in scope.get("env_allow") or ())


def context_window(model: str) -> int | None:
    """The context window of a named model (``GoalsApp.models``, exported to workers); None: unknown,
    never compacted."""
    spec = named_from_env().get(model)
    return spec.context_window if spec is not None else None


class HistoryCache:
    """A worker's incremental histories by session (least recently used dropped past ``capacity``).
    Rebuilt from durable records whenever missing: after a restart, a drop, or an error."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._by_session: OrderedDict[str, IncrementalHistory] = OrderedDict()

    def get(self, session_id: str) -> IncrementalHistory:
        history = self._by_session.pop(session_id, None) or IncrementalHistory(SYSTEM_PROMPT)
        self._by_session[session_id] = history
        while len(self._by_session) > self.capacity:
            self._by_session.popitem(last=False)
        return history

    def drop(self, session_id: str) -> None:
        self._by_session.pop(session_id, None)


@dataclass
class Step:
    kind: StepKind
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
        tool_env_allow: Sequence[str] = (),
        redactor: Redactor | None = None,
        cancel_grace_s: float = 5.0,
        histories: HistoryCache | None = None,
    ) -> None:
        # provider-ready histories by session, kept by the worker across steps and attempts
        self.histories = histories if histories is not None else HistoryCache()
        self.cancel_grace_s = cancel_grace_s  # SIGTERM → SIGKILL grace for a cancelled tool (GoalsApp.cancel_grace_s)
        self.cwd = cwd
        # what a tool process may see beyond the base allow-list (GoalsApp.tool_env_allow)
        self.tool_env_allow = list(tool_env_allow)
        # credentials never reach the transcript or a provider, whatever a tool printed
        self.redactor = redactor if redactor is not None else Redactor.from_environment()
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
                if step.kind in (StepKind.STOP, StepKind.APPROVAL, StepKind.FINISH):
                    return
                if step.kind == StepKind.REATTACH:
                    assert step.effect is not None
                    await self._reattach(step.effect)
                elif step.kind == StepKind.DISPATCH:
                    assert step.effect is not None
                    if not await self._dispatch(step.effect, step.approval):
                        return
                elif step.kind == StepKind.DELIVER:
                    await self._deliver()
                elif step.kind == StepKind.PROVIDER:
                    if not await self._provider_step():
                        return
                elif step.kind in (StepKind.REQUIREMENTS, StepKind.VERIFY) and not await self._goal_step(step.kind):
                    return
        except FencedError as exc:
            log.info("attempt %s fenced: %s", self.aid, exc)

    # ------------------------------------------------------------------ deciding the next step
    def _next_step(self, tx: Tx) -> Step:
        c.fence(tx, self.aid, self.gen)
        work = c.get_work(tx, self.attempt["work_id"])
        facts = self._step_facts(tx, work)
        return self._apply(tx, work, facts, next_step(facts))

    def _step_facts(self, tx: Tx, work: Row) -> StepFacts:
        """Everything ``next_step`` may read, from indexed reads of the attempt's transaction (a turn's
        settled calls and its older items are never read: a step costs the same in a long session)."""
        if not self._runnable(work):
            return StepFacts(runnable=False)
        turn_id = self.attempt["turn_id"]
        effects = c.open_effects_of_turn(tx, turn_id, tidy=True)
        dispatched = next((e for e in effects if e["state"] == EffectState.DISPATCHED), None)
        planned = next((e for e in effects if e["state"] == EffectState.PLANNED), None)
        last = c.last_item_of_turn(tx, turn_id)
        return StepFacts(
            runnable=True,
            dispatched=dispatched,
            planned=planned,
            # Goal-ledger writes run at once, committed with their record
            planned_runs_freely=planned is not None and trusted_state_tool(self.registry.get(planned["tool"]), planned)
            and planned["tool"] not in CREATES_WORK and goal_tools.runs_freely(tx, planned["tool"], work["work_id"]),
            open_waits=bool(waits.open_wait_count(tx, work["work_id"])),
            ready_waits=bool(waits.waits_of(tx, work["work_id"], "ready")),
            steer=tuple(c.pending_steer(tx, work["work_id"])),
            goal_step=goal_hooks.pending_step(tx, work) if goal_hooks.is_goal_work(work) else None,
            last_kind=last["kind"] if last is not None else None,
            last_has_calls=last is not None and last["kind"] == ItemKind.ASSISTANT
            and c.response_has_calls(tx, last["response_id"]),
        )

    def _apply(self, tx: Tx, work: Row, facts: StepFacts, d: StepDecision) -> Step:
        """Do what the decision says in the same transaction; the step the loop runs next."""
        turn_id = self.attempt["turn_id"]
        if d.consume_steer:
            for m in facts.steer:
                c.append_item(tx, work["session_id"], ItemKind.USER, "user", m["text"], work_id=work["work_id"],
                              turn_id=turn_id, item_id=f"steer:{m['message_id']}")
                c.consume_message(tx, m["message_id"])
        if d.wait_for_subtasks:  # a durable wait: no idle model turns until notified
            waits.observe(tx, work)
            c.end_attempt(tx, self.attempt, "awaiting_subtask")
            c.set_phase(tx, work, Phase.WAITING, ReasonCode.AWAITING_SUBTASK)
        elif d.wait_for_clarification:
            goal_hooks.wait_for_clarification(tx, self.attempt, work)
        elif d.kind == StepKind.STOP:
            self._yield_to_control(tx, work)
        elif d.kind == StepKind.DISPATCH and d.check_permission:
            assert d.effect is not None
            return self._permission_step(tx, work, d.effect)
        elif d.kind == StepKind.FINISH:
            self._finish(tx, work, turn_id)
        return Step(d.kind, effect=d.effect)

    def _yield_to_control(self, tx: Tx, work: Row) -> None:
        c.end_attempt(tx, self.attempt, "control")
        if work["desired_state"] == "cancelled":
            c.finish_cancelled(tx, work)
        elif work["desired_state"] == "paused":
            c.set_phase(tx, work, Phase.PAUSED, work["reason_code"] if work["phase"] == "paused" else ReasonCode.USER_PAUSED)
        else:
            c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)

    def _finish(self, tx: Tx, work: Row, turn_id: str) -> None:
        if goal_hooks.is_goal_work(work):  # a Goal goes on turn after turn: the turn-completion check decides
            goal_hooks.after_turn(tx, self.attempt, work, turn_id)
            return
        c.end_turn(tx, work, turn_id, TurnState.COMMITTED, "completed")
        c.end_attempt(tx, self.attempt, "completed")
        # an ordinary request continues only until it finishes
        c.finish_work(tx, work, reset_deaths=True)
        c.set_phase(tx, work, Phase.DONE, ReasonCode.COMPLETED)
        if work["kind"] in (WorkKind.JOB, WorkKind.SUBTASK):  # its result is durable; its waiters are notified
            waits.save_result(tx, work, "completed", c.last_reply(tx, turn_id) or "")

    def _permission_step(self, tx: Tx, work: Row, eff: Row) -> Step:
        """Run, wait for an approval, or reject: ``check_call`` decides from the effect's saved
        capability and implementation identity, the work item's permission scope and its unknown-effect
        set (scoped to this work item). An approval is used only if it is bound to this call, its
        arguments and the current unknown-effect set; a changed set needs a fresh approval. A built-in
        read outside the chat's folders (or where credentials are kept) asks in ask mode, even in a
        restricted turn, with a reason that names the resolved path.
        """
        spec = self.registry.get(eff["tool"])
        if spec is None:
            return Step(StepKind.DISPATCH, effect=eff)  # fails as unknown tool, recorded as a result
        facts = self._call_facts(spec, eff)
        scope = json.loads(work["permission_scope"])
        secret = self._secret_for(facts, scope)
        if facts.trusted_probe and check_call(facts, scope, self.cwd, (), secret).run:
            # built-in probes, and reads where the chat may read, run whatever else is known
            return Step(StepKind.DISPATCH, effect=eff)
        try:
            unknown = c.unknown_effect_set(tx, work["work_id"])
        except Exception as exc:  # the recovery state cannot be read: reject the call, never dispatch it
            self._reject_unreadable(tx, work, eff, exc)
            return Step(StepKind.STOP)
        # the reason names a read's resolved path; the approval binds the call and the unknown-effect set
        verdict = check_call(facts, scope, self.cwd, unknown, secret)
        if verdict.run:
            return Step(StepKind.DISPATCH, effect=eff)
        unknown_digest = c.unknown_set_digest(unknown)
        approval = c.approval_for_call(tx, eff["call_id"])
        if approval is not None and approval["arguments_digest"] == c.digest(eff["arguments"]):
            if approval["unknown_set_digest"] == unknown_digest:
                if approval["state"] == "approved":
                    return Step(StepKind.DISPATCH, effect=eff, approval=approval)
                if approval["state"] == "denied":
                    self._deny(tx, work, eff)
                    return self._next_step(tx)
                if approval["state"] == "pending":
                    self._wait_for_approval(tx, work)
                    return Step(StepKind.APPROVAL)
            elif approval["state"] in ("pending", "approved"):
                c.supersede_approval(tx, approval, "Withdrawn because the set of calls with an unknown outcome changed;"
                                     " a fresh approval is asked.")
        c.request_approval(tx, work, eff, unknown, verdict.reason)
        self._wait_for_approval(tx, work)
        return Step(StepKind.APPROVAL)

    @functools.cached_property
    def secret_places(self) -> tuple[str, ...]:
        """Where credentials live (permissions.py rule 2): a built-in read there asks in ask mode. Looked
        up at the first check of a read (a few hundred µs of path lookups), not for every attempt."""
        return secret_places(self.state_dir)

    def _secret_for(self, facts: CallFacts, scope: dict[str, Any]) -> tuple[str, ...]:
        """The places holding credentials when rule 2 can use them: a built-in read in ask mode."""
        return self.secret_places if facts.reader is not None and scope.get("mode") != "bypass" else ()

    @staticmethod
    def _call_facts(spec: ToolSpec, eff: Row) -> CallFacts:
        """What ``check_call`` knows of a planned call: its saved capability and implementation identity
        (a built-in read by identity is ``reader``, whatever the call's tool is named)."""
        probe = spec.identity == eff["impl_identity"] and trusted_probe(eff["impl_identity"], eff["impl_digest"])
        return CallFacts(tool=eff["tool"], arguments=eff["arguments"], capability=Capability(eff["capability"]),
                         trusted_probe=probe, reader=path_reader(eff["impl_identity"], eff["impl_digest"]) if probe else None)

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
    def _tool_context(self, eff: Row, env_allow: Sequence[str] = (), scope: str | None = None) -> ToolContext:
        return ToolContext(cwd=self.cwd, effects_root=self.effects_root, effect_id=eff["effect_id"],
                           env_allow=(*self.tool_env_allow, *env_allow), fence=self._fence(eff, scope))

    def _fence(self, eff: Row, scope: str | None) -> ReadFence | None:
        """A built-in read's walk stays where the check let it read (ask mode: the scope read with the dispatch)."""
        spec = self.registry.get(eff["tool"])
        facts = self._call_facts(spec, eff) if spec is not None else None
        if facts is None or facts.reader is None or scope is None:
            return None
        permissions = json.loads(scope)
        return read_fence(facts, permissions, self.cwd, self._secret_for(facts, permissions))

    def _runnable(self, work: Row) -> bool:
        """The work still wants to run at the control version this attempt was admitted under."""
        return c.runs_as_admitted(work, self.attempt)

    def _controlled(self, tx: Tx, work: Row) -> bool:
        """A pause, stop or other control committed since this step was chosen (another process may
        commit one between two of our transactions): the attempt yields and nothing new starts."""
        if not self._runnable(work):
            self._yield_to_control(tx, work)
            return True
        return False

    async def _dispatch(self, eff: Row, approval: Row | None) -> bool:
        """Run one call; False when a control committed in the meantime ended the attempt first."""
        spec = self.registry.get(eff["tool"])
        crash_point("tool.before_dispatch")
        if spec is not None and spec.state_impl is not None and trusted_state_tool(spec, eff):
            impl = spec.state_impl

            def state_tool(tx: Tx) -> bool:
                c.fence(tx, self.aid, self.gen)
                work = c.get_work(tx, eff["work_id"])
                if self._controlled(tx, work):
                    return False
                goal_tools.commit_state_tool(tx, impl, work, eff, self.aid, work["host_name"], approval)
                return True

            return await self.db.run(state_tool)

        def dispatched(tx: Tx) -> str | None:
            run = c.fence_with_run_state(tx, self.aid, self.gen)
            if not self._runnable(run):
                self._yield_to_control(tx, c.get_work(tx, eff["work_id"]))
                return None
            c.mark_dispatched(tx, eff, self.aid, approval)
            c.emit(tx, "effect.state", {"call_id": eff["call_id"], "tool": eff["tool"], "state": "dispatched"},
                   session_id=eff["session_id"], work_id=eff["work_id"])
            return str(run["permission_scope"] or "{}")

        # the session's own env_allow is read with the dispatch, so a permission change applies to the next call
        scope = await self.db.run(dispatched)
        if scope is None:
            return False
        ctx = self._tool_context(eff, _env_allow(scope), scope)
        if spec is None:
            result = ToolResult(f"error: unknown tool {eff['tool']!r}", ok=False)
        elif eff["tool"] == "shell":
            self.awaiting_process = True
            try:
                shell_result, cancelled = await self._cancellable(eff, spec.impl(ctx, eff["arguments"]))
            except Exception as exc:  # a tool's failure is its result, not the loop's
                shell_result, cancelled = ToolResult(f"error: {type(exc).__name__}: {exc}", ok=False), None
            self.awaiting_process = False
            if shell_result is None:
                await self._commit_cancelled(eff, cancelled or "")
                return True
            result = shell_result
        else:
            try:
                result = await spec.impl(ctx, eff["arguments"])
            except Exception as exc:  # a tool's failure is its result, not the loop's
                result = ToolResult(f"error: {type(exc).__name__}: {exc}", ok=False)
        if eff["tool"] != "shell":
            crash_point("tool.after_dispatch")
        await self._commit_result(eff, result.content, EffectState.COMMITTED)
        return True

    async def _cancellable(self, eff: Row, waiting: Awaitable[T]) -> tuple[T | None, str | None]:
        """Wait for a running shell call while watching for a stop of its work or a cancel of the call
        (a durable read every ``CANCEL_POLL_S``). On one, its process group gets SIGTERM, then SIGKILL
        after ``cancel_grace_s``; answers (result, None) or (None, text of the cancelled result)."""
        task: asyncio.Future[T] = asyncio.ensure_future(waiting)
        watch: asyncio.Future[str] = asyncio.ensure_future(self._cancel_cause(eff["effect_id"]))
        try:
            both: set[asyncio.Future[Any]] = {task, watch}
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result(), None
            cause = watch.result()
            effect_dir = self.effects_root / eff["effect_id"]
            signalled = await cancel_shell(effect_dir, self.cancel_grace_s)
            try:
                await task  # returns once the process has ended
            except Exception as exc:  # noqa: BLE001 - the cancelled call's own error changes nothing
                log.info("cancelled call %s ended with %s", eff["call_id"], exc)
            return None, cancelled_result_text(effect_dir, cause, signalled)
        finally:
            for f in (task, watch):
                if not f.done():
                    f.cancel()

    async def _unless_stopped(self, waiting: Awaitable[T]) -> T:
        """Await a model request, closing it at once (``StoppedByPerson``) when its work is stopped."""
        return await paid.unless_stopped(self.db, self.attempt["work_id"], waiting)

    async def _cancel_cause(self, effect_id: str) -> str:
        while True:
            cause = await self.db.run(lambda tx: c.cancel_cause(tx, effect_id), write=False)
            if cause is not None:
                return cause
            await asyncio.sleep(CANCEL_POLL_S)

    async def _commit_cancelled(self, eff: Row, content: str) -> None:
        clean = self.redactor.redact(content)

        def commit(tx: Tx) -> None:
            c.fence(tx, self.aid, self.gen)
            c.commit_cancelled(tx, eff, clean.text, clean.names)

        await self.db.run(commit)

    async def _reattach(self, eff: Row) -> None:
        """A dispatched call from an earlier attempt: reconnect its live process, never start it again."""
        effect_dir = self.state_dir / "effects" / eff["effect_id"]
        self.awaiting_process = eff["tool"] == "shell"
        text: str | None = None
        if eff["tool"] == "shell":
            text, cancelled = await self._cancellable(eff, wait_shell(effect_dir))
            if cancelled is not None:
                self.awaiting_process = False
                await self._commit_cancelled(eff, cancelled)
                return
        self.awaiting_process = False
        if text is None:
            await self._commit_result(eff, "", EffectState.UNKNOWN)
        else:
            await self._commit_result(eff, recovered_result_text(text), EffectState.COMMITTED)

    async def _commit_result(self, eff: Row, content: str, state: EffectState) -> None:
        """Commits the result with credentials replaced by ``[redacted: NAME]``; the result item's
        ``meta.redacted`` names what was hidden."""
        crash_point("tool.before_result_commit")
        clean = self.redactor.redact(content)
        meta = {"redacted": list(clean.names)} if clean.names else None

        def commit(tx: Tx) -> None:
            c.fence(tx, self.aid, self.gen)
            c.set_effect_state(tx, eff, state, clean.text)
            c.append_item(tx, eff["session_id"], ItemKind.TOOL_RESULT, "tool", clean.text,
                          item_id=f"result:{eff['call_id']}", work_id=eff["work_id"], turn_id=eff["turn_id"],
                          call_id=eff["call_id"], tool=eff["tool"], state=str(state), meta=meta)

        await self.db.run(commit)
        crash_point("tool.after_result_commit")

    # ------------------------------------------------------------------ goal steps
    async def _goal_step(self, kind: StepKind) -> bool:
        """Requirements extraction or acceptance (goals/acceptance.py); False when the attempt ended."""
        read_tools = {name: spec for name, spec in self.registry.tools.items()
                      if spec.capability in (Capability.READ_ONLY, Capability.STATE_PROBE)
                      and trusted_probe(spec.identity, spec.digest)}

        scopes: list[dict[str, Any]] = []

        async def run_read_tool(name: str, args: dict[str, Any]) -> str:
            spec = read_tools[name]
            if not scopes:  # the review cannot ask: a read the work's scope would ask for is refused
                row = await self.db.run(lambda tx: c.get_work(tx, self.attempt["work_id"]), write=False)
                scopes.append(json.loads(row["permission_scope"] or "{}"))
            facts = CallFacts(tool=name, arguments=args, capability=spec.capability, trusted_probe=True,
                              reader=path_reader(spec.identity, spec.digest))
            verdict = check_call(facts, scopes[0], self.cwd, (), self._secret_for(facts, scopes[0]))
            if not verdict.run:
                return f"error: not read: {verdict.reason} The acceptance review cannot ask for approvals."
            ctx = ToolContext(cwd=self.cwd, effects_root=self.effects_root, effect_id="acceptance",
                              fence=read_fence(facts, scopes[0], self.cwd, self._secret_for(facts, scopes[0])))
            return self.redactor((await spec.impl(ctx, args)).content)

        ctx = goal_acceptance.StepContext(self.db, self.attempt, self.gen, self.cwd, self.default_model,
                                     [s.schema() for s in read_tools.values()], run_read_tool, self.prices,
                                     watch_stop=self._unless_stopped, redact=self.redactor)
        try:
            if kind == StepKind.REQUIREMENTS:
                await goal_acceptance.extract_requirements(ctx)
                return True
            return await goal_acceptance.verify(ctx)
        except goal_acceptance.StepProviderFault as exc:
            fault = exc
        except budget.BudgetHeld as held:
            problem = held.problem
            await self.db.run(lambda tx: self._budget_held(tx, problem))
            return False
        except paid.StoppedByPerson:  # the request was settled; the attempt yields to the stop

            def stopped(tx: Tx) -> None:
                c.fence(tx, self.aid, self.gen)
                self._yield_to_control(tx, c.get_work(tx, self.attempt["work_id"]))

            await self.db.run(stopped)
            return False
        await self.db.run(lambda tx: self._provider_failed(tx, fault.request_id, fault.error, fault.code, fault.status,
                                                           fault.retry_after_s))
        return False

    # ------------------------------------------------------------------ provider
    async def _provider_step(self) -> bool:
        compacts: list[int] = []  # the seq a compaction request covers (empty: a work request)

        def prepare(tx: Tx) -> tuple[ProviderRequest, Row, Row]:
            c.fence(tx, self.aid, self.gen)
            work = c.get_work(tx, self.attempt["work_id"])
            session = c.get_session(tx, work["session_id"])
            model = session["model"] or self.default_model
            # only the items committed since the last step are read and re-projected (issue 14)
            history = self.histories.get(work["session_id"])
            try:
                messages = history.update(c.transcript(tx, work["session_id"], after=history.last_seq))
            except Exception:
                self.histories.drop(work["session_id"])  # rebuilt from durable records next time
                raise
            purpose, tools = Purpose.WORK, self.registry.schemas()
            window = context_window(model)
            cover = history.compactable() if window and history.tokens > window * COMPACT_AT else None
            if cover is not None:  # compact older history into a durable summary before the next work request
                up_to, older = cover
                compacts[:] = [up_to]
                purpose, tools = Purpose.COMPACTION, []
                messages = [ProviderMessage(role="system", content=COMPACTION_PROMPT), *older,
                            ProviderMessage(role="user", content=COMPACTION_REQUEST)]
            goal = goal_lifecycle.attribute(tx, work)  # goal_id + revision fixed before dispatch
            # the Goal's hard budget (a Job's or subtask's too) is rechecked before every request;
            # BudgetHeld leaves nothing recorded and nothing sent
            governing = goal or budget.governing_goal(tx, work)
            request_id, _ = paid.reserve(tx, work, governing=governing, model=model, purpose=purpose,
                                         attempt_id=self.aid, turn_id=self.attempt["turn_id"], prices=self.prices)
            req = ProviderRequest(
                request_id=request_id,
                purpose=purpose,
                messages=messages,
                tools=tools,
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
        # a work answer streams to open views as drafts (events, not the ledger); a summary does not
        drafts = (DraftStream(self.db, work["session_id"], work["work_id"], request.request_id)
                  if request.purpose == Purpose.WORK else None)
        outcome = await paid.call(request, model, reserved_until=reserved_until, watch_stop=self._unless_stopped,
                                  redact=self.redactor, on_chunk=drafts)
        if outcome.stopped:

            def stopped(tx: Tx) -> None:
                c.fence(tx, self.aid, self.gen)
                paid.settle(tx, request.request_id, outcome, self.prices)
                self._yield_to_control(tx, c.get_work(tx, self.attempt["work_id"]))

            await self.db.run(stopped)
            return False
        if (fault := outcome.failure) is not None:

            def failed(tx: Tx) -> None:
                paid.settle(tx, request.request_id, outcome, self.prices)
                self._provider_failed(tx, request.request_id, fault.error, fault.code, fault.status,
                                      fault.retry_after_s)

            await self.db.run(failed)
            return False
        response = outcome.response
        assert response is not None
        crash_point("provider.after_response")
        if compacts:
            await self.db.run(lambda tx: self._commit_compaction(tx, work, request, response, compacts[0]))
        else:
            await self.db.run(lambda tx: self._commit_response(tx, work, request, response, model))
        crash_point("provider.after_commit")
        return True

    def _commit_compaction(self, tx: Tx, work: Row, request: ProviderRequest, response: ProviderResponse,
                           up_to: int) -> None:
        """The summary item (stable id per covered seq: a repeated compaction adds nothing) and the
        request's receipt, together. Requests then carry the summary instead of what it covers."""
        c.fence(tx, self.aid, self.gen)
        c.append_item(tx, work["session_id"], ItemKind.COMPACTION, "system", response.text,
                      item_id=f"compaction:{work['session_id']}:{up_to}", work_id=work["work_id"],
                      turn_id=self.attempt["turn_id"], meta={"up_to_seq": up_to, "request_id": request.request_id})
        paid.settle_answer(tx, request.request_id, response, self.prices)

    def _budget_held(self, tx: Tx, problem: budget.Problem) -> None:
        """No paid request may start: end the attempt before anything is recorded or sent; the work
        waits with the budget's reason and the Coordinator rechecks it on every pass."""
        c.fence(tx, self.aid, self.gen)
        work = c.get_work(tx, self.attempt["work_id"])
        c.end_attempt(tx, self.attempt, f"budget: {problem.code}")
        budget.hold(tx, work, problem)

    def _provider_failed(self, tx: Tx, request_id: str, error: str, code: ReasonCode, status: int | None,
                         retry_after_s: float | None = None) -> None:
        c.fence(tx, self.aid, self.gen)
        work = c.get_work(tx, self.attempt["work_id"])
        c.end_attempt(tx, self.attempt, f"provider: {error}"[:200])
        if code == ReasonCode.PROVIDER_RETRYING:
            failures = c.failed_request_count(tx, self.attempt["turn_id"]) or 1
            delay = max(retry_delay(failures, self.retry_base_s), retry_after_s or 0.0)
            c.set_retry_at(tx, work["work_id"], time.time() + delay)
            c.set_phase(tx, work, Phase.WAITING, code,
                        f"The model provider had a temporary fault ({status or 'connection lost'}); retry {failures} in {delay:.1f} s.")
        elif code in (ReasonCode.RESOURCE_MISSING_CREDENTIALS, ReasonCode.RESOURCE_MISSING_MODEL):
            # e.g. a key file being rewritten: wait like the Coordinator's check does, which admits
            # the work again by itself once the key (or model) is back
            c.set_phase(tx, work, Phase.WAITING, code, error)
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
        for i, call in enumerate(response.tool_calls):
            call_id = f"{request.request_id}:{i}"
            spec = self.registry.get(call.name)
            seq = c.append_item(tx, work["session_id"], ItemKind.TOOL_CALL, "assistant", "", item_id=f"call:{call_id}",
                                work_id=work["work_id"], turn_id=turn_id, call_id=call_id, provider_call_id=call.id,
                                response_id=response_id, tool=call.name, arguments=call.arguments)
            assert seq is not None  # a new call id
            c.plan_call(tx, work, turn_id, call_id, call.name, call.arguments,
                        capability=str(spec.capability if spec else Capability.UNKNOWN),
                        impl_identity=spec.identity if spec else "", impl_digest=spec.digest if spec else "", seq=seq)
        paid.settle_answer(tx, request.request_id, response, self.prices)
        c.set_retry_at(tx, work["work_id"], 0)
