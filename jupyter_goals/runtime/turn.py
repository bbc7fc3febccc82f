"""The turn loop (DESIGN §7), resumable from durable facts alone.

Each step reads the next action from control.db under the attempt's fence: reattach a running
tool process, dispatch a planned call, deliver steered messages, call the provider, or finish. A new
attempt after a crash therefore resumes from the last committed step without any memory of the old
one. Commit order per call: ``dispatched`` before the side effect begins, the result after it ends
(the calls themselves: ``runtime/calls.py``; the model requests and Goal steps: here).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, TypeVar

from jupyter_goals.config import GoalsConfig
from jupyter_goals.faults import crash_point
from jupyter_goals.goals import acceptance as goal_acceptance
from jupyter_goals.goals import hooks as goal_hooks
from jupyter_goals.goals import lifecycle as goal_lifecycle
from jupyter_goals.goals import tools as goal_tools
from jupyter_goals.host.secrecy import Redactor
from jupyter_goals.host.wake import Broadcast
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
from jupyter_goals.runtime.calls import ToolCalls
from jupyter_goals.runtime.drafts import DraftStream
from jupyter_goals.runtime.permissions import CallFacts, check_call, read_fence
from jupyter_goals.runtime.steps import Step, StepDecision, StepFacts, next_step
from jupyter_goals.runtime.subtasks import CREATES_WORK
from jupyter_goals.runtime.tools import (
    ToolContext,
    ToolRegistry,
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


def retry_delay(failures: int, base: float, cap: float = 60.0) -> float:
    return float(min(cap, base * (2 ** max(0, failures - 1))))


class TurnRunner:
    """Runs one admitted attempt to its end (finish, wait, control change, or fencing)."""

    def __init__(self, db: Database, attempt: Row, config: GoalsConfig, *, cwd: str,
                 registry: ToolRegistry | None = None, prices: PriceTable | None = None,
                 redactor: Redactor | None = None, histories: HistoryCache | None = None,
                 controls: Broadcast | None = None) -> None:
        """``config``: the server's configuration (the turn reads its ``state_dir``, ``default_model``,
        ``provider_retry_base_s``, ``tool_env_allow``, ``cancel_grace_s``); ``registry``: default the
        built-ins and ``trusted_tools``; ``prices`` quote each settled request for the hard-budget checks;
        ``redactor``: default this process's credentials and the server's ``secrets``; ``controls``: the
        worker's wake-ups on a committed Stop or cancel (else a running command's watch polls)."""
        self.config = config
        self.db = db
        self.attempt = attempt
        self.aid: str = attempt["attempt_id"]
        self.gen: int = int(attempt["generation"])
        self.cwd = cwd
        self.registry = registry if registry is not None else ToolRegistry(config.trusted_tools)
        self.prices = prices
        # credentials never reach the transcript or a provider, whatever a tool printed
        self.redactor = redactor if redactor is not None else Redactor.from_environment(extra=config.secrets)
        # provider-ready histories by session, kept by the worker across steps and attempts
        self.histories = histories if histories is not None else HistoryCache()
        self.calls = ToolCalls(db, attempt, config, cwd=cwd, registry=self.registry, redactor=self.redactor,
                               on_control=self._yield_to_control, controls=controls)

    @property
    def awaiting_process(self) -> bool:
        """Only waiting for a detached process: a graceful stop may cancel that wait at once."""
        return self.calls.awaiting_process

    # ------------------------------------------------------------------ main loop
    async def run(self) -> None:
        try:
            while True:
                step = await self.db.run(self._next_step)
                if step.kind in (StepKind.STOP, StepKind.APPROVAL, StepKind.FINISH):
                    return
                if step.kind == StepKind.REATTACH:
                    assert step.effect is not None
                    await self.calls.reattach(step.effect)
                elif step.kind == StepKind.DISPATCH:
                    assert step.effect is not None
                    if not await self.calls.dispatch(step.effect, step.approval):
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
        if not c.runs_as_admitted(work, self.attempt):  # a control changed what the attempt was admitted for
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
            # a call a person denied is settled now: the loop decides again
            return self.calls.permission_step(tx, work, d.effect) or self._next_step(tx)
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

    async def _deliver(self) -> None:
        """Subtask results that arrived (while this work waited, was paused, or the server was down)
        join the transcript once: delivery and consumption commit together under the fence."""
        crash_point("child.before_delivery")

        def deliver(tx: Tx) -> None:
            c.fence(tx, self.aid, self.gen)
            waits.deliver(tx, c.get_work(tx, self.attempt["work_id"]), self.attempt["turn_id"])

        await self.db.run(deliver)
        crash_point("child.after_delivery")

    async def _unless_stopped(self, waiting: Awaitable[T]) -> T:
        """Await a model request, closing it at once (``StoppedByPerson``) when its work is stopped."""
        return await paid.unless_stopped(self.db, self.attempt["work_id"], waiting)

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
            verdict = check_call(facts, scopes[0], self.cwd, (), self.calls.secret_for(facts, scopes[0]))
            if not verdict.run:
                return f"error: not read: {verdict.reason} The acceptance review cannot ask for approvals."
            ctx = ToolContext(cwd=self.cwd, effects_root=self.calls.effects_root, effect_id="acceptance",
                              fence=read_fence(facts, scopes[0], self.cwd, self.calls.secret_for(facts, scopes[0])))
            return self.redactor((await spec.impl(ctx, args)).content)

        ctx = goal_acceptance.StepContext(self.db, self.attempt, self.gen, self.cwd, self.config.default_model,
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

        def prepare(tx: Tx) -> tuple[ProviderRequest, Row, str]:
            c.fence(tx, self.aid, self.gen)
            work = c.get_work(tx, self.attempt["work_id"])
            session = c.get_session(tx, work["session_id"])
            # the model the turn began with: a session's model change applies from its next turn
            model = c.turn_model(tx, self.attempt["turn_id"], session["model"] or self.config.default_model)
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
            return req, work, model

        try:
            request, work, model = await self.db.run(prepare)
        except budget.BudgetHeld as held:
            problem = held.problem
            await self.db.run(lambda tx: self._budget_held(tx, problem))
            return False
        reserved_until = time.time() + budget.RESERVATION_TTL_S
        crash_point("provider.before_request")
        # a work answer streams to open views as drafts (events, not the ledger); a summary does not
        drafts = (DraftStream(self.db, work["session_id"], work["work_id"], request.request_id)
                  if request.purpose == Purpose.WORK else None)
        try:
            outcome = await paid.call(request, model, reserved_until=reserved_until, watch_stop=self._unless_stopped,
                                      redact=self.redactor, on_chunk=drafts)
        except BaseException:
            if drafts is not None:
                drafts.abandon()
            raise
        if drafts is not None:  # a stopped answer's text so far is durable before its stop marker reads it
            await drafts.close(flush=outcome.stopped)
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
            delay = max(retry_delay(failures, self.config.provider_retry_base_s), retry_after_s or 0.0)
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
                      work_id=work["work_id"], turn_id=turn_id, response_id=response_id,
                      # the provider's stop reason, where it gave one (max_tokens: the answer was cut at the limit)
                      meta={"provider_response_id": rid, **({"stop_reason": response.stop_reason}
                                                            if response.stop_reason else {})})
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
