"""The ``spawn_subtask`` tool: start a child work item and wait for its result durably.

A state tool (committed with its effect record, so never unknown and never run twice), but one that
creates work: unlike the Goal state tools it goes through the permission check (``ask`` needs an
approval unless an allow rule names it; after unknown effects it always needs one). The parent's
turn then waits (``awaiting_subtask``, no model turns) until the child's result is delivered once.
"""

from __future__ import annotations

from typing import Any

from jupyter_goals.goals.tools import StateCall
from jupyter_goals.store import control as c
from jupyter_goals.store import waits as w

CREATES_WORK = frozenset({"spawn_subtask"})
SCHEMA = (
    "Start a subtask: an independent agent works on `task` in its own conversation (same directory, model and"
    " permissions). Your turn waits without model calls; its result is delivered to you as a message.",
    {"task": {"type": "string"}, "timeout_s": {"type": "number"}},
)


def spawn_subtask(call: StateCall, args: dict[str, Any]) -> str:
    task = str(args.get("task", "")).strip()
    if not task:
        return "error: spawn_subtask needs a task"
    timeout = args.get("timeout_s")
    timeout_s = float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None
    eff = c.dispatched_call_of_tool(call.tx, call.work["work_id"], "spawn_subtask")
    try:
        child, _ = w.spawn_child(call.tx, call.work, task, host=call.host, call_id=eff["call_id"] if eff else None,
                                 timeout_s=timeout_s)
    except w.SpawnRefused as exc:
        return f"error: {exc}"
    return (f"started subtask {child['work_id']} (session {child['session_id']}); its result will be delivered"
            " here when it finishes")
