"""Goal lifecycle in one transaction each: create, revise, act, views, terminal records.

The shell around ``rules.py``: each function loads facts with ``store/goals.py`` and
``store/control.py``, applies a rule and commits the decision (with its events) in the caller's
transaction. A Goal drives one work item of kind ``goal`` in its session; the Goal's state and the
work item's run intent move together here:

| Goal state | work item |
| --- | --- |
| active | ``run`` (the Goal's phase says working / waiting / verifying) |
| paused | ``paused`` (user_paused) |
| blocked, budget_exhausted, awaiting_clarification | ``run`` but held by ``goal_wait()`` (a waiting reason) |
| achieved | ``done`` |
| cancelled | ``cancelled`` |
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_goals.goals import rules
from jupyter_goals.goals.rules import InvalidGoalChange
from jupyter_goals.models import (
    TERMINAL_GOAL_STATES,
    GoalPhase,
    GoalState,
    ItemKind,
    Phase,
    ReasonCode,
    Requirement,
    reason_text,
)
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import Row, Tx, VersionConflict


def view(tx: Tx, goal: Row) -> dict[str, Any]:
    """The REST shape of a Goal (``GET /goals/{id}``), with backend-computed actions."""
    acceptance = g.latest_acceptance(tx, goal["goal_id"])
    items, version, todo_goal = g.get_todo(tx, goal["session_id"])
    return {
        "goal_id": goal["goal_id"],
        "session_id": goal["session_id"],
        "work_id": goal["work_id"],
        "objective": goal["objective"],
        "original_objective": goal["original_objective"],
        "requirements": goal["requirements"],
        "requirements_state": goal["requirements_state"],
        "state": goal["state"],
        "phase": goal["phase"],
        "reason_code": goal["reason_code"],
        "reason": goal["reason"],
        "revision": goal["revision"],
        "budget": goal["budget"],
        "usage": None,  # filled by the service from usage.db
        "actions": rules.goal_actions(goal["state"], goal["phase"], goal["reason_code"]).model_dump(),
        "acceptance": None if acceptance is None else {
            "result_version": acceptance["result_version"], "revision": acceptance["revision"],
            "outcome": acceptance["outcome"], "verdicts": acceptance["verdicts"], "created_at": acceptance["created_at"],
        },
        # the verdicts that count now, one per requirement (clients render these, never compare revisions)
        "verdicts": rules.current_verdicts(goal["requirements"] or [], goal["revision"], acceptance),
        "verified_result_version": goal["verified_result_version"],
        "todo": items if todo_goal == goal["goal_id"] else [],
        "todo_version": version if todo_goal == goal["goal_id"] else 0,
        "turns": goal["turns"],
        "created_by": goal["created_by"],
        "created_at": goal["created_at"],
        "updated_at": goal["updated_at"],
        "ended_at": goal["ended_at"],
    }


def create(tx: Tx, session: Row, objective: str, requirements: list[Requirement] | None, budget: dict[str, Any],
           *, host: str, auto_recover: bool, actor: str = "user", client_request_id: str | None = None) -> Row:
    """Save the original objective, its requirements (or mark them for extraction) and the budget,
    with the work item that drives the Goal, before anything is acknowledged. A ``client_request_id``
    this session already created a Goal with returns that Goal (in whatever state it is now) and
    creates nothing: a retried request, not a second Goal."""
    if client_request_id is not None:
        earlier = g.goal_by_request(tx, session["session_id"], client_request_id)
        if earlier is not None:
            return earlier
    reqs = rules.normalize_requirements(requirements) if requirements else []
    if g.current_goal(tx, session["session_id"]) is not None:
        raise VersionConflict(f"session {session['session_id']} already has a Goal that has not ended; end it first")
    work = c.create_work(tx, session, "goal", {"text": objective}, auto_recover=auto_recover, host=host)
    goal = g.insert_goal(tx, session_id=session["session_id"], work_id=work["work_id"], objective=objective,
                         requirements=reqs, requirements_state="given" if reqs else "pending",
                         budget=budget, created_by=actor, client_request_id=client_request_id)
    c.set_objective_revision(tx, work["work_id"], 1)
    return goal


def revise(tx: Tx, goal_id: str, expected_revision: int, *, objective: str | None = None,
           requirements: list[Requirement] | None = None, budget: dict[str, Any] | None = None,
           reason: str | None = None, actor: str = "user") -> Row:
    """A new objective revision. Dropping or changing a requirement is a human waiver and needs a
    reason; the agent can never do it. Old acceptance and pending continuations stop counting."""
    goal = g.get_goal(tx, goal_id)
    if goal["revision"] != expected_revision:
        raise VersionConflict(f"goal {goal_id} is at revision {goal['revision']}, not {expected_revision};"
                              " reload and try again")
    if goal["state"] in TERMINAL_GOAL_STATES:
        raise VersionConflict(f"goal {goal_id} already ended ({goal['state']})")
    new_reqs = goal["requirements"]
    if requirements is not None:
        new_reqs = rules.normalize_requirements(requirements)
        dropped = rules.removed_ids(goal["requirements"], new_reqs)
        if dropped and actor != "user":
            raise InvalidGoalChange("the agent cannot remove or weaken requirements: " + ", ".join(dropped))
        if dropped and not reason:
            raise InvalidGoalChange("removing or changing requirements " + ", ".join(dropped)
                                    + " is a waiver: give a reason")
    revision = goal["revision"] + 1
    new_objective = objective or goal["objective"]
    new_budget = goal["budget"] if budget is None else budget
    g.insert_revision(tx, goal_id, revision, new_objective, new_reqs, new_budget, reason or "", actor)
    fields: dict[str, Any] = {"objective": new_objective, "requirements": new_reqs, "budget": new_budget,
                              "revision": revision}
    if requirements is not None:
        fields["requirements_state"] = "given" if new_reqs else "pending"
    if goal["phase"] == GoalPhase.VERIFYING:  # acceptance of the old revision no longer counts
        fields.update(phase=GoalPhase.WORKING.value, reason_code="", reason="")
    if budget is not None and goal["state"] == GoalState.BUDGET_EXHAUSTED:  # a new budget: checked again
        fields.update(state=GoalState.ACTIVE.value, reason_code="", reason="")
    goal = g.update_goal(tx, goal, expected_revision, **fields)
    if actor == "user":
        work = c.get_work(tx, goal["work_id"])
        _bump_control(tx, work, "revise", revision)
        if work["reason_code"] in (ReasonCode.BUDGET_EXHAUSTED, ReasonCode.BUDGET_UNVERIFIABLE):
            c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)  # admission rechecks the new budget
        code, sentence = str(ReasonCode.GOAL_REVISED), "Withdrawn because the Goal was edited; it is asked again if still needed."
        c.invalidate_approvals(tx, work["work_id"], sentence, code)
        note = f"The Goal was revised by the user (revision {revision})" + (f": {reason}" if reason else ".")
        _prompt(tx, goal, rules.continuation_prompt(goal["objective"], goal["requirements"], note=note))
    return goal


def act(tx: Tx, goal_id: str, action: str, expected_revision: int) -> Row:
    """pause / resume / verify / end, refused (409) on a stale revision or when not allowed now."""
    goal = g.get_goal(tx, goal_id)
    if goal["revision"] != expected_revision:
        raise VersionConflict(f"goal {goal_id} is at revision {goal['revision']}, not {expected_revision};"
                              " reload and try again")
    allowed = rules.goal_actions(goal["state"], goal["phase"], goal["reason_code"])
    if not getattr(allowed, f"can_{action}"):
        raise VersionConflict(f"cannot {action} a Goal that is {goal['state']} ({goal['phase']})")
    work = c.get_work(tx, goal["work_id"])
    work_open = work["phase"] not in (Phase.DONE, Phase.CANCELLED)
    if action == "pause":
        g.update_goal(tx, goal, state=GoalState.PAUSED.value, reason_code=str(ReasonCode.USER_PAUSED),
                      reason=reason_text(ReasonCode.USER_PAUSED))
        if work_open and work["desired_state"] != "paused":
            c.apply_control(tx, work, "pause", None)
    elif action == "resume":
        was = goal["state"]
        g.update_goal(tx, goal, state=GoalState.ACTIVE.value, phase=GoalPhase.WORKING.value, reason_code="",
                      reason="", blocker="", blocker_count=0)
        if work_open and work["desired_state"] == "paused":
            c.apply_control(tx, work, "resume", None)
        elif work_open:
            c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
        if was == GoalState.BLOCKED:
            _prompt(tx, goal, rules.continuation_prompt(goal["objective"], goal["requirements"],
                                                        note="The user resumed the Goal after it was blocked."))
    elif action == "verify":
        g.update_goal(tx, goal, state=GoalState.ACTIVE.value, phase=GoalPhase.VERIFYING.value,
                      reason_code=str(ReasonCode.GOAL_VERIFYING), reason=reason_text(ReasonCode.GOAL_VERIFYING))
        if work_open and work["desired_state"] == "run" and work["phase"] == Phase.WAITING:
            c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
    elif action == "end":
        g.update_goal(tx, goal, state=GoalState.CANCELLED.value, reason_code=str(ReasonCode.USER_STOPPED),
                      reason=reason_text(ReasonCode.USER_STOPPED), ended_at=time.time())
        if work_open and work["desired_state"] != "cancelled":
            c.apply_control(tx, work, "stop", None)
        write_terminal_record(tx, goal)
    return goal


def sync_with_work(tx: Tx, work: Row, action: str) -> None:
    """A session control (pause / resume / stop / retry) applied to a Goal's work item moves the Goal too."""
    goal = g.goal_of_work(tx, work["work_id"])
    if goal is None or goal["state"] in TERMINAL_GOAL_STATES:
        return
    if action == "pause" and goal["state"] == GoalState.ACTIVE:
        g.update_goal(tx, goal, state=GoalState.PAUSED.value, reason_code=str(ReasonCode.USER_PAUSED),
                      reason=reason_text(ReasonCode.USER_PAUSED))
    elif action in ("resume", "retry") and goal["state"] == GoalState.PAUSED:
        g.update_goal(tx, goal, state=GoalState.ACTIVE.value, reason_code="", reason="")
    elif action == "stop":
        g.update_goal(tx, goal, state=GoalState.CANCELLED.value, reason_code=str(ReasonCode.USER_STOPPED),
                      reason=reason_text(ReasonCode.USER_STOPPED), ended_at=time.time())
        write_terminal_record(tx, goal)


def goal_wait(tx: Tx, work_id: str) -> ReasonCode | None:
    """Why a Goal's work item must not be admitted although its run intent is ``run`` (None: it may)."""
    goal = g.goal_of_work(tx, work_id)
    if goal is None:
        return None
    if goal["state"] == GoalState.BLOCKED:
        return ReasonCode.GOAL_BLOCKED
    if goal["state"] == GoalState.BUDGET_EXHAUSTED:
        return ReasonCode.BUDGET_EXHAUSTED
    if goal["state"] == GoalState.ACTIVE and goal["requirements_state"] == "clarifying":
        return ReasonCode.AWAITING_CLARIFICATION
    return None


def message_delivery(tx: Tx, session_id: str, delivery: str) -> str:
    """User input outranks automatic continuation: while the session's Goal runs, a new message joins
    it at its next step boundary (steer); an answer to a clarification question releases the wait."""
    goal = g.current_goal(tx, session_id)
    if goal is None or goal["state"] != GoalState.ACTIVE:
        return delivery
    work = c.get_work(tx, goal["work_id"])
    if work["desired_state"] != "run" or not work["input_consumed"]:
        return delivery
    if goal["requirements_state"] == "clarifying":
        g.update_goal(tx, goal, requirements_state="pending", phase=GoalPhase.WORKING.value, reason_code="", reason="")
        c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
    return "steer"


def attribute(tx: Tx, work: Row) -> Row | None:
    """Fix the Goal attribution of a request before dispatch (``record_request`` reads these keys)."""
    goal = g.goal_of_work(tx, work["work_id"]) if work.get("kind") == "goal" else None
    if goal is not None:
        work["goal_id"], work["goal_revision"] = goal["goal_id"], goal["revision"]
    return goal


def history_view(record: Row) -> dict[str, Any]:
    """A terminal record as answered: its snapshot as saved, with the ``verdicts`` that counted when it
    ended computed for records saved before the Goal answer carried them (a compatibility read)."""
    snapshot = dict(record["snapshot"])
    if "verdicts" not in snapshot:
        snapshot["verdicts"] = rules.current_verdicts(snapshot.get("requirements") or [],
                                                      int(snapshot.get("revision") or 0), snapshot.get("acceptance"))
    return {**record, "snapshot": snapshot}


def write_terminal_record(tx: Tx, goal: Row) -> str:
    """One compact record at the ending transcript position, with its own Goal snapshot and anchor.
    At most one per Goal (unique goal_id), so a repeated ending never writes a second one."""
    existing = g.history_record_of(tx, goal["goal_id"])
    if existing is not None:
        return str(existing["record_id"])
    item_id = f"goal_record:{goal['goal_id']}"
    seq = c.append_item(tx, goal["session_id"], ItemKind.GOAL_RECORD, "system",
                        f"Goal {goal['state']}: {goal['objective']}", item_id=item_id, work_id=goal["work_id"],
                        meta={"goal_id": goal["goal_id"], "state": goal["state"]})
    assert seq is not None  # the item id is unique per Goal, and no record existed
    return g.insert_history(tx, goal, view(tx, goal), seq, item_id)


def _prompt(tx: Tx, goal: Row, text: str) -> None:
    """A continuation prompt: a user-role message for the model, an internal record for the chat."""
    c.append_item(tx, goal["session_id"], ItemKind.GOAL_PROMPT, "user", text, work_id=goal["work_id"],
                  meta={"goal_id": goal["goal_id"], "revision": goal["revision"]})


def _bump_control(tx: Tx, work: Row, action: str, revision: int) -> None:
    """Older admissions, wakeups and continuations were decided under the old version: refuse them."""
    version = int(work["control_version"]) + 1
    c.set_control_version(tx, work, version, revision)
    c.emit(tx, "work.control", {"action": action, "desired_state": work["desired_state"], "control_version": version},
           session_id=work["session_id"], work_id=work["work_id"])
