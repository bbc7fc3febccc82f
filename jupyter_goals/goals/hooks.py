"""The Goal hooks inside the turn loop's own steps (the turn loop calls these, never the reverse).

- ``pending_step`` (a read) and ``wait_for_clarification``: in the turn's fenced step read, whether a
  Goal extracts requirements, waits for the person's answer, or is verified before another work request.
- ``after_turn``: the turn-completion check, committed with the end of the turn.
- ``back_to_work``: missing or failing evidence sends the Goal back to another work turn.
The steps with model calls (requirements, acceptance) are in ``goals/acceptance.py``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from jupyter_goals.goals import lifecycle, rules
from jupyter_goals.models import (
    TERMINAL_GOAL_STATES,
    Capability,
    EffectState,
    GoalPhase,
    GoalState,
    Phase,
    ReasonCode,
    StepKind,
    TurnState,
    reason_text,
)
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import Row, Tx


def pending_step(tx: Tx, work: Row) -> StepKind | None:
    """A Goal's own next step: ``requirements``, ``verify``, ``wait`` (it asks the person a question:
    see ``wait_for_clarification``), or None: work on. Reads only."""
    goal = g.goal_of_work(tx, work["work_id"])
    if goal is None or goal["state"] != GoalState.ACTIVE:
        return None
    if goal["requirements_state"] == "pending":
        return StepKind.REQUIREMENTS
    if goal["requirements_state"] == "clarifying":
        return StepKind.WAIT
    if goal["phase"] == GoalPhase.VERIFYING:
        return StepKind.VERIFY
    return None


def wait_for_clarification(tx: Tx, attempt: Row, work: Row) -> None:
    """The attempt ends; the Goal waits for the person's answer."""
    c.end_attempt(tx, attempt, "awaiting_clarification")
    c.set_phase(tx, work, Phase.WAITING, ReasonCode.AWAITING_CLARIFICATION)


def is_goal_work(work: Row) -> bool:
    return work.get("kind") == "goal"


def after_turn(tx: Tx, attempt: Row, work: Row, turn_id: str) -> None:
    """The turn-completion check: commit the turn, then continue, verify, block or stop (no round cap)."""
    goal = g.goal_of_work(tx, work["work_id"])
    c.end_turn(tx, work, turn_id, TurnState.COMMITTED, "completed")
    c.end_attempt(tx, attempt, "completed")
    if goal is None or goal["state"] in TERMINAL_GOAL_STATES:
        c.finish_work(tx, work)
        c.set_phase(tx, work, Phase.DONE, ReasonCode.COMPLETED)
        return
    effects = c.turn_effect_states(tx, turn_id)
    progress = any(e["state"] == EffectState.COMMITTED and e["tool"] != "get_goal"
                   and e["capability"] not in (Capability.READ_ONLY, Capability.STATE_PROBE) for e in effects)
    reply = c.last_reply(tx, turn_id) or ""
    items, todo_version, todo_goal = g.get_todo(tx, work["session_id"])
    mine = items if todo_goal == goal["goal_id"] else []
    required = [it for it in mine if it.get("required", True)]
    facts = rules.TurnFacts(
        state=GoalState(goal["state"]), phase=GoalPhase(goal["phase"]), made_progress=progress,
        reply_digest=hashlib.sha256(reply.encode()).hexdigest()[:16],
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
        excerpt = reply[:200]
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


def back_to_work(tx: Tx, goal: Row, work: Row, attempt: Row, note: str, open_verdicts: list[dict[str, Any]],
                  todo_version: int) -> None:
    """Missing or failing evidence: another work turn, never fabricated acceptance."""
    g.update_goal(tx, goal, phase=GoalPhase.WORKING.value, reason_code="", reason="",
                  verified_todo_version=todo_version)
    lifecycle._prompt(tx, goal, rules.continuation_prompt(goal["objective"], goal["requirements"], open_verdicts, note))
    c.end_turn(tx, work, attempt["turn_id"], TurnState.COMMITTED, "verified")
    c.end_attempt(tx, attempt, "verified")
    if work["desired_state"] == "run":
        c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
