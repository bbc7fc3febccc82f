"""The turn loop's next step as a pure function of loaded facts (issue 13).

``TurnRunner`` loads :class:`StepFacts` in one read of the attempt's transaction, asks
:func:`next_step`, then applies the decision (ends the attempt, appends steer messages, runs the call).
Nothing here touches the store, so the priority of the rules is tested without a database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jupyter_goals.models import ItemKind, StepKind


@dataclass(frozen=True)
class StepFacts:
    """What the next step of a running attempt depends on."""

    runnable: bool  # the work still wants to run at the control version the attempt was admitted under
    dispatched: dict[str, Any] | None = None  # the turn's first call already dispatched (a live process)
    planned: dict[str, Any] | None = None  # the turn's first call still to run
    planned_runs_freely: bool = False  # it is a trusted Goal-ledger write that creates no work
    open_waits: bool = False  # the work waits durably on subtasks or Jobs (a steer message is still read)
    ready_waits: bool = False  # results of subtasks or Jobs arrived and are not delivered yet
    steer: tuple[dict[str, Any], ...] = ()  # messages the person sent to steer this turn, not yet in it
    goal_step: StepKind | None = None  # a Goal's pending REQUIREMENTS or VERIFY step, or WAIT (clarifying)
    last_kind: str | None = None  # the newest item of the turn that the model reads
    last_has_calls: bool = False  # ... an answer that asked for tools


@dataclass(frozen=True)
class StepDecision:
    kind: StepKind
    effect: dict[str, Any] | None = None  # the call a REATTACH, DISPATCH or CHECK step is about
    consume_steer: bool = False  # append the steer messages to the turn first
    check_permission: bool = False  # DISPATCH only after the permission check (approval, denial)
    wait_for_subtasks: bool = False  # STOP because the work waits durably (not because of a control)
    wait_for_clarification: bool = False  # STOP because the Goal asks the person a question


def next_step(f: StepFacts) -> StepDecision:
    """A control change stops the attempt; an open call is finished first (a running one reattached,
    a planned one run or checked); durable waits stop or deliver, except that a person's steered message
    is read at once while a wait stays open (input first); then the Goal's own steps; an answer without
    tool calls, with nothing steered since, finishes the turn; anything else asks the model."""
    if not f.runnable:
        return StepDecision(StepKind.STOP)
    if f.dispatched is not None:
        return StepDecision(StepKind.REATTACH, effect=f.dispatched)
    if f.planned is not None:
        return StepDecision(StepKind.DISPATCH, effect=f.planned, check_permission=not f.planned_runs_freely)
    steer = bool(f.steer)
    if f.open_waits and not steer:
        return StepDecision(StepKind.STOP, wait_for_subtasks=True)
    if f.ready_waits:
        return StepDecision(StepKind.DELIVER)
    if f.open_waits:  # the model reads the person's message now; the wait stays open (no idle turns)
        return StepDecision(StepKind.PROVIDER, consume_steer=True)
    if f.goal_step == StepKind.WAIT:
        return StepDecision(StepKind.STOP, consume_steer=steer, wait_for_clarification=True)
    if f.goal_step is not None:
        return StepDecision(f.goal_step, consume_steer=steer)
    if not steer and f.last_kind == ItemKind.ASSISTANT and not f.last_has_calls:
        return StepDecision(StepKind.FINISH)
    return StepDecision(StepKind.PROVIDER, consume_steer=steer)


@dataclass
class Step:
    """A decision as applied: the step the loop runs next (with the call and approval it is about)."""

    kind: StepKind
    effect: dict[str, Any] | None = None
    approval: dict[str, Any] | None = None
