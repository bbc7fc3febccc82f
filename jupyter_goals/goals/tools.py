"""The state tools ``create_goal``, ``get_goal``, ``update_goal`` and ``todo_write`` (DESIGN §6).

They only read and write the Goal ledger in control.db, and each one commits in the same
transaction as its effect record (``planned`` → ``committed`` plus its result item), so their
outcome is never unknown and a crash can never run one twice. ``update_goal`` changes the objective
text or submits a complete candidate for independent acceptance; it never removes a requirement and
never marks a Goal achieved. ``todo_write`` replaces the plan; requirements are not touched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_goals.goals import lifecycle, rules
from jupyter_goals.models import TERMINAL_GOAL_STATES, EffectState, GoalPhase, GoalState, ItemKind, ReasonCode
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import Row, Tx


@dataclass
class StateCall:
    tx: Tx
    work: Row
    host: str


StateImpl = Callable[[StateCall, dict[str, Any]], str]


def _goal_of(call: StateCall) -> Row | None:
    goal = g.goal_of_work(call.tx, call.work["work_id"])
    return goal if goal is not None else g.current_goal(call.tx, call.work["session_id"])


def _brief(tx: Tx, goal: Row) -> str:
    v = lifecycle.view(tx, goal)
    keep = ("goal_id", "objective", "original_objective", "requirements", "state", "phase", "revision", "todo")
    return json.dumps({k: v[k] for k in keep}, sort_keys=True)


def create_goal(call: StateCall, args: dict[str, Any]) -> str:
    objective = str(args.get("objective", "")).strip()
    if not objective:
        return "error: create_goal needs an objective"
    session = c.get_session(call.tx, call.work["session_id"])
    goal = lifecycle.create(call.tx, session, objective, None, {}, host=call.host, auto_recover=bool(call.work["auto_recover"]),
                            actor="agent")
    return "created " + _brief(call.tx, goal)


def get_goal(call: StateCall, args: dict[str, Any]) -> str:
    goal = _goal_of(call)
    return "no Goal is set in this session" if goal is None else _brief(call.tx, goal)


def update_goal(call: StateCall, args: dict[str, Any]) -> str:
    goal = g.goal_of_work(call.tx, call.work["work_id"])
    if goal is None or goal["state"] in TERMINAL_GOAL_STATES:
        return "error: this work has no Goal to update"
    done: list[str] = []
    objective = args.get("objective")
    if objective:
        goal = lifecycle.revise(call.tx, goal["goal_id"], goal["revision"], objective=str(objective), actor="agent")
        done.append(f"objective is now revision {goal['revision']}")
    if args.get("candidate") and goal["state"] == GoalState.ACTIVE:
        g.update_goal(call.tx, goal, phase=GoalPhase.VERIFYING.value, reason_code=str(ReasonCode.GOAL_VERIFYING),
                      reason="The agent submitted a complete candidate; it is checked independently.")
        done.append("candidate submitted for independent acceptance (not yet achieved)")
    return "; ".join(done) if done else "nothing changed (give objective and/or candidate=true)"


def todo_write(call: StateCall, args: dict[str, Any]) -> str:
    raw = args.get("items", [])
    if not isinstance(raw, list):
        return "error: items must be a list"
    items = []
    for i, it in enumerate(raw, 1):
        if not isinstance(it, dict) or not str(it.get("text", "")).strip():
            return f"error: item {i} needs a text"
        status = str(it.get("status", "pending"))
        if status not in ("pending", "in_progress", "completed"):
            return f"error: item {i}: status must be pending, in_progress or completed"
        items.append({"id": str(it.get("id") or f"t{i}"), "text": str(it["text"]), "status": status,
                      "required": bool(it.get("required", True))})
    goal = g.goal_of_work(call.tx, call.work["work_id"])
    version = g.write_todo(call.tx, call.work["session_id"], goal["goal_id"] if goal else None, items)
    open_ = sum(1 for it in items if it["status"] != "completed")
    return f"todo version {version}: {len(items)} items, {open_} open"


IMPLS: dict[str, StateImpl] = {
    "create_goal": create_goal, "get_goal": get_goal, "update_goal": update_goal, "todo_write": todo_write,
}
# a read of the ledger: runs even in a restricted turn that follows unknown effects
STATE_QUERIES = frozenset({"get_goal"})
_S = {"type": "string"}
SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "create_goal": ("Create a Goal for this session (only when the user asks for one).", {"objective": _S}),
    "get_goal": ("Read the current Goal: objective, requirements, state, Todo.", {}),
    "update_goal": ("Revise the Goal's objective text, or submit the work as a complete candidate for"
                    " independent acceptance (candidate=true). Requirements cannot be removed.",
                    {"objective": _S, "candidate": {"type": "boolean"}}),
    "todo_write": ("Replace the plan: items [{id?, text, status: pending|in_progress|completed, required?}].",
                   {"items": {"type": "array", "items": {"type": "object"}}}),
}


def commit_state_tool(tx: Tx, impl: StateImpl, work: Row, eff: Row, attempt_id: str, host: str,
                      approval: Row | None = None) -> None:
    """Run a state tool and commit its effect record and result in the caller's transaction.

    The caller fences first. A rule violation is the tool's result (its partial writes roll back to a
    savepoint), never an unknown outcome."""
    c.mark_dispatched(tx, eff, attempt_id, approval)
    try:
        with tx.savepoint("state_tool"):
            content = impl(StateCall(tx, work, host), eff["arguments"])
    except (rules.InvalidGoalChange, c.VersionConflict, c.NotFound, ValueError) as exc:
        content = f"error: {exc}"
    c.set_effect_state(tx, eff, EffectState.COMMITTED, content)
    c.append_item(tx, eff["session_id"], ItemKind.TOOL_RESULT, "tool", content, item_id=f"result:{eff['call_id']}",
                  work_id=eff["work_id"], turn_id=eff["turn_id"], call_id=eff["call_id"], tool=eff["tool"],
                  state=str(EffectState.COMMITTED))


def runs_freely(tx: Tx, tool: str, work_id: str) -> bool:
    """State tools need no approval (they only touch the Goal ledger and are never unknown), except
    that after unknown effects only the state query ``get_goal`` runs without one: a restricted turn
    allows trusted reads and state queries only."""
    if tool in STATE_QUERIES:
        return True
    try:
        return not c.unknown_effects(tx, work_id)
    except Exception:  # unreadable recovery state: the permission step rejects the call
        return False
