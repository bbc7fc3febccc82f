"""One attempt's tool calls, each from its check to its committed result (DESIGN §6, §7).

A planned call is checked (``check_call``: run, wait for a person's approval, or rejected), committed
``dispatched`` before its side effect begins, run, and its result committed (credentials redacted);
a shell command runs detached and is waited for while the call watches for a stop of its work or a
cancel of the call (SIGTERM to its process group, SIGKILL after ``cancel_grace_s``). A later attempt
reattaches a call an earlier one dispatched: it reconnects the live process, never starts it again.
The turn loop (``runtime/turn.py``) decides when a call runs; this module runs it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from jupyter_goals.config import GoalsConfig
from jupyter_goals.faults import crash_point
from jupyter_goals.goals import tools as goal_tools
from jupyter_goals.host.effect_files import (
    cancel_shell,
    cancelled_result_text,
    recovered_result_text,
    wait_shell,
)
from jupyter_goals.host.secrecy import Redactor
from jupyter_goals.host.wake import Broadcast
from jupyter_goals.models import Capability, EffectState, ItemKind, Phase, ReasonCode, StepKind
from jupyter_goals.runtime.permissions import CallFacts, ReadFence, check_call, read_fence, secret_places
from jupyter_goals.runtime.steps import Step
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
from jupyter_goals.store.db import Database, FencedError, Row, StorageUnavailable, Tx

log = logging.getLogger(__name__)
T = TypeVar("T")
CANCEL_POLL_S = 0.2  # without a worker's controls channel: how often a running call checks for a stop or cancel
#: failures of the store, never a tool's outcome: recorded as the call's result they would stand for a command
#: that in fact ran on (its process is detached) and the model would start it again; they end the attempt
#: instead, and the next attempt reconnects the command and records its one real result
NOT_THE_TOOLS = (StorageUnavailable, FencedError)


@functools.lru_cache(maxsize=64)
def _env_allow(permission_scope: str | None) -> tuple[str, ...]:
    """The environment names a work item's permission scope lets its tools see (parsed once per
    distinct scope: a worker reads the scope before every call)."""
    scope = json.loads(permission_scope or "{}")
    return tuple(str(name) for name in scope.get("env_allow") or ())


class ToolCalls:
    """The tool calls of one attempt (``attempt``, fenced by its generation). ``on_control`` ends the
    attempt when a control (pause, stop) committed since the step was chosen: the turn loop's own way."""

    def __init__(self, db: Database, attempt: Row, config: GoalsConfig, *, cwd: str, registry: ToolRegistry,
                 redactor: Redactor, on_control: Callable[[Tx, Row], None],
                 controls: Broadcast | None = None) -> None:
        self.db = db
        self.attempt = attempt
        self.aid: str = attempt["attempt_id"]
        self.gen: int = int(attempt["generation"])
        self.config = config  # its cancel_grace_s, tool_env_allow and state_dir
        self.cwd = cwd
        self.registry = registry
        # credentials never reach the transcript or a provider, whatever a tool printed
        self.redactor = redactor
        # a Stop or cancel committed anywhere wakes the call's watch (host/wake.py CONTROLS); None: it polls
        self.controls = controls
        self.on_control = on_control
        self.effects_root = config.state_dir / "effects"
        # true while only waiting for a detached process: a graceful stop may cancel that wait at once
        self.awaiting_process = False

    # ------------------------------------------------------------------ permission and approval
    def permission_step(self, tx: Tx, work: Row, eff: Row) -> Step | None:
        """Run, wait for an approval, or reject (None: denied by a person, the loop decides again): ``check_call`` decides from the effect's saved
        capability and implementation identity, the work item's permission scope and its unknown-effect
        set (scoped to this work item). An approval is used only if it is bound to this call, its
        arguments and the current unknown-effect set; a changed set needs a fresh approval. A built-in
        read outside the chat's folders (or where credentials are kept) asks in ask mode, even in a
        restricted turn, with a reason that names the resolved path.
        """
        spec = self.registry.get(eff["tool"])
        if spec is None:
            return Step(StepKind.DISPATCH, effect=eff)  # fails as unknown tool, recorded as a result
        facts = self.call_facts(spec, eff)
        scope = json.loads(work["permission_scope"])
        secret = self.secret_for(facts, scope)
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
                    return None
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
        return secret_places(self.config.state_dir)

    def secret_for(self, facts: CallFacts, scope: dict[str, Any]) -> tuple[str, ...]:
        """The places holding credentials when rule 2 can use them: a built-in read in ask mode."""
        return self.secret_places if facts.reader is not None and scope.get("mode") != "bypass" else ()

    @staticmethod
    def call_facts(spec: ToolSpec, eff: Row) -> CallFacts:
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

    # ------------------------------------------------------------------ tools
    def _tool_context(self, eff: Row, env_allow: Sequence[str] = (), scope: str | None = None) -> ToolContext:
        return ToolContext(cwd=self.cwd, effects_root=self.effects_root, effect_id=eff["effect_id"],
                           env_allow=(*self.config.tool_env_allow, *env_allow), fence=self._fence(eff, scope))

    def _fence(self, eff: Row, scope: str | None) -> ReadFence | None:
        """A built-in read's walk stays where the check let it read (ask mode: the scope read with the dispatch)."""
        spec = self.registry.get(eff["tool"])
        facts = self.call_facts(spec, eff) if spec is not None else None
        if facts is None or facts.reader is None or scope is None:
            return None
        permissions = json.loads(scope)
        return read_fence(facts, permissions, self.cwd, self.secret_for(facts, permissions))

    def _controlled(self, tx: Tx, work: Row) -> bool:
        """A pause, stop or other control committed since this step was chosen (another process may
        commit one between two of our transactions): the attempt yields and nothing new starts."""
        if not c.runs_as_admitted(work, self.attempt):
            self.on_control(tx, work)
            return True
        return False

    async def dispatch(self, eff: Row, approval: Row | None) -> bool:
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
            if not c.runs_as_admitted(run, self.attempt):
                self.on_control(tx, c.get_work(tx, eff["work_id"]))
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
            except NOT_THE_TOOLS:
                raise
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
            except NOT_THE_TOOLS:
                raise
            except Exception as exc:  # a tool's failure is its result, not the loop's
                result = ToolResult(f"error: {type(exc).__name__}: {exc}", ok=False)
        if eff["tool"] != "shell":
            crash_point("tool.after_dispatch")
        await self._commit_result(eff, result.content, EffectState.COMMITTED)
        return True

    async def _cancellable(self, eff: Row, waiting: Awaitable[T]) -> tuple[T | None, str | None]:
        """Wait for a running shell call while watching for a stop of its work or a cancel of the call
        (a durable read whenever a control is committed, on any host sharing the store, and every
        ``safety_tick_s`` without one; every ``CANCEL_POLL_S`` without a controls channel). On one, its process group gets SIGTERM, then SIGKILL
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
            signalled = await cancel_shell(effect_dir, self.config.cancel_grace_s)
            try:
                await task  # returns once the process has ended
            except Exception as exc:  # noqa: BLE001 - the cancelled call's own error changes nothing
                log.info("cancelled call %s ended with %s", eff["call_id"], exc)
            return None, cancelled_result_text(effect_dir, cause, signalled)
        finally:
            for f in (task, watch):
                if not f.done():
                    f.cancel()

    async def _cancel_cause(self, effect_id: str) -> str:
        """Why the running call must be cancelled, once there is a reason. A read the store refuses (the
        database restarting, a connection cut) is no reason: the watch reads again at its next tick, and
        the command's outcome, read from its files, is committed (or the commit fails and ends the attempt)."""
        failing = False
        while True:
            mark = self.controls.mark() if self.controls is not None else None  # before the read: none missed
            try:
                cause = await self.db.run(lambda tx: c.cancel_cause(tx, effect_id), write=False)
                failing = False
            except StorageUnavailable as exc:
                if not failing:
                    log.warning("call watch of %s: %s; reading again at each tick", effect_id, exc)
                cause, failing = None, True
            if cause is not None:
                return cause
            if mark is None:
                await asyncio.sleep(CANCEL_POLL_S)
            else:
                await Broadcast.wait(mark, self.config.safety_tick_s)

    async def _commit_cancelled(self, eff: Row, content: str) -> None:
        clean = self.redactor.redact(content)

        def commit(tx: Tx) -> None:
            c.fence(tx, self.aid, self.gen)
            c.commit_cancelled(tx, eff, clean.text, clean.names)

        await self.db.run(commit)

    async def reattach(self, eff: Row) -> None:
        """A dispatched call from an earlier attempt: reconnect its live process, never start it again."""
        effect_dir = self.effects_root / eff["effect_id"]
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
        ``meta.redacted`` names what was hidden. One fsync per tool call: this commit rides on the next."""
        crash_point("tool.before_result_commit")
        clean = self.redactor.redact(content)
        meta = {"redacted": list(clean.names)} if clean.names else None

        def commit(tx: Tx) -> None:
            c.fence(tx, self.aid, self.gen)
            c.set_effect_state(tx, eff, state, clean.text)
            c.append_item(tx, eff["session_id"], ItemKind.TOOL_RESULT, "tool", clean.text,
                          item_id=f"result:{eff['call_id']}", work_id=eff["work_id"], turn_id=eff["turn_id"],
                          call_id=eff["call_id"], tool=eff["tool"], state=str(state), meta=meta)

        # not waited onto the disk: the loop's next step commits durably before anything leaves this process
        # (the next model request's record, the next call's ``dispatched``, the turn's end; the worker's
        # heartbeat meanwhile), and that commit carries this one with it. A kill -9 loses nothing; a power
        # loss or a PostgreSQL crash in between leaves the call ``dispatched`` without its result: the next
        # attempt reads it from the command's files, or it is unknown; never run twice.
        await self.db.run(commit, durable=False)
        crash_point("tool.after_result_commit")

