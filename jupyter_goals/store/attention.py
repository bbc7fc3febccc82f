"""What waits for a person across every session (``GET /attention``): unfinished work stopped on a reason
only a person can lift, calls whose outcome is unknown in unfinished work, and pending approvals. One
read transaction; each list is bounded by what is open, not by history."""

from __future__ import annotations

import json
from typing import Any

from jupyter_goals.models.reasons import NEEDS_PERSON
from jupyter_goals.store.db import Row, Tx
from jupyter_goals.store.effects import list_approvals

_OPEN = "w.phase NOT IN ('done', 'cancelled')"


def waiting_work(tx: Tx) -> list[Row]:
    """Unfinished work that failed or waits on a reason only a person can lift, newest change first,
    with its session's title and its Goal (if it is a Goal's work)."""
    marks = ", ".join("?" * len(NEEDS_PERSON))
    return tx.all(
        "SELECT w.work_id, w.session_id, w.kind, w.phase, w.reason_code, w.reason, w.desired_state,"
        " w.control_version, w.updated_at, s.title,"
        " (SELECT g.goal_id FROM goals g WHERE g.work_id = w.work_id) AS goal_id"
        f" FROM work_items w JOIN sessions s ON s.session_id = w.session_id WHERE {_OPEN}"
        f" AND (w.phase = 'failed' OR w.reason_code IN ({marks}))"
        " ORDER BY w.updated_at DESC",
        NEEDS_PERSON,
    )


def unknown_calls(tx: Tx) -> list[Row]:
    """Calls whose outcome is unknown in work that has not ended (ended work's are history)."""
    rows = tx.all(
        "SELECT e.effect_id, e.call_id, e.work_id, e.session_id, e.tool, e.arguments, e.ended_at, e.dispatched_at,"
        " e.created_at, s.title FROM effects e JOIN work_items w ON w.work_id = e.work_id"
        f" JOIN sessions s ON s.session_id = e.session_id WHERE e.state = 'unknown' AND {_OPEN}"
        " ORDER BY e.created_at DESC",
    )
    for r in rows:
        r["arguments"] = json.loads(r["arguments"]) if isinstance(r["arguments"], str) else r["arguments"]
    return rows


def pending_approvals(tx: Tx) -> list[dict[str, Any]]:
    """Pending approvals with their session's title."""
    titles = {r["session_id"]: r["title"] for r in tx.all(
        "SELECT s.session_id, s.title FROM sessions s WHERE s.session_id IN"
        " (SELECT a.session_id FROM approvals a WHERE a.state = 'pending')")}
    return [{**a, "title": titles.get(str(a["session_id"]), "")} for a in list_approvals(tx, "pending")]
