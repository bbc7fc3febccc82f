"""Every goals-table statement of control.db: goals, revisions, todos, acceptance results, history.

Functions take a ``Tx`` and run inside the caller's transaction; each state change writes its event
in the same transaction (``control.emit``). Revisions are optimistic: a write names the revision it
read, and zero updated rows is a ``VersionConflict``. The rules deciding *what* to write live in
``jupyter_goals/goals`` (pure ``rules.py``, composed in ``lifecycle.py``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_goals.models import LEGACY_GOAL_STATES, ReasonCode, reason_text
from jupyter_goals.store.control import dumps, emit, new_id
from jupyter_goals.store.db import NotFound, Row, Tx, VersionConflict

_JSON = ("requirements", "budget")


def _parse(row: Row) -> Row:
    for k in _JSON:
        if isinstance(row.get(k), str):
            row[k] = json.loads(row[k])
    legacy = LEGACY_GOAL_STATES.get(row["state"])
    if legacy is not None:  # an older record's state, read as paused with an explanation
        row["state"] = legacy.value
        row["reason_code"] = row["reason_code"] or ReasonCode.LEGACY_PAUSED_UNKNOWN.value
        row["reason"] = row["reason"] or reason_text(ReasonCode.LEGACY_PAUSED_UNKNOWN)
    return row


def insert_goal(tx: Tx, *, session_id: str, work_id: str, objective: str, requirements: list[dict[str, Any]],
                requirements_state: str, budget: dict[str, Any], created_by: str,
                client_request_id: str | None = None) -> Row:
    now = time.time()
    gid = new_id("goal")
    tx.execute(
        "INSERT INTO goals (goal_id, session_id, work_id, objective, original_objective, requirements,"
        " requirements_state, state, phase, reason_code, reason, revision, budget, created_by, created_at, updated_at,"
        " client_request_id) VALUES (?, ?, ?, ?, ?, ?, ?, 'active', 'working', '', '', 1, ?, ?, ?, ?, ?)",
        (gid, session_id, work_id, objective, objective, dumps(requirements), requirements_state, dumps(budget),
         created_by, now, now, client_request_id),
    )
    insert_revision(tx, gid, 1, objective, requirements, budget, "", created_by)
    emit(tx, "goal.created", {"goal_id": gid, "objective": objective, "revision": 1}, session_id=session_id,
         work_id=work_id)
    return get_goal(tx, gid)


def insert_revision(tx: Tx, goal_id: str, revision: int, objective: str, requirements: list[dict[str, Any]],
                    budget: dict[str, Any], reason: str, actor: str) -> None:
    tx.execute(
        "INSERT INTO goal_revisions (goal_id, revision, objective, requirements, budget, reason, actor, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (goal_id, revision, objective, dumps(requirements), dumps(budget), reason, actor, time.time()),
    )


def revisions(tx: Tx, goal_id: str) -> list[Row]:
    rows = tx.all("SELECT * FROM goal_revisions WHERE goal_id = ? ORDER BY revision", (goal_id,))
    for r in rows:
        r["requirements"], r["budget"] = json.loads(r["requirements"]), json.loads(r["budget"])
    return rows


def get_goal(tx: Tx, goal_id: str) -> Row:
    row = tx.one("SELECT * FROM goals WHERE goal_id = ?", (goal_id,))
    if row is None:
        raise NotFound(f"goal {goal_id} not found")
    return _parse(row)


def goal_by_request(tx: Tx, session_id: str, client_request_id: str) -> Row | None:
    """The Goal a ``POST /goals`` with this ``client_request_id`` created in the session (unique index
    ``goals_client_request``), whatever its state now; None when there is none."""
    row = tx.one("SELECT * FROM goals WHERE session_id = ? AND client_request_id = ?", (session_id, client_request_id))
    return None if row is None else _parse(row)


def find_goal(tx: Tx, goal_id: str) -> Row | None:
    row = tx.one("SELECT * FROM goals WHERE goal_id = ?", (goal_id,))
    return None if row is None else _parse(row)


def goal_of_work(tx: Tx, work_id: str) -> Row | None:
    row = tx.one("SELECT * FROM goals WHERE work_id = ?", (work_id,))
    return None if row is None else _parse(row)


def current_goal(tx: Tx, session_id: str) -> Row | None:
    """The session's Goal the composer shows: its newest one that has not ended."""
    row = tx.one(
        "SELECT * FROM goals WHERE session_id = ? AND state NOT IN ('achieved', 'cancelled')"
        " ORDER BY created_at DESC LIMIT 1",
        (session_id,),
    )
    return None if row is None else _parse(row)


def list_goals(tx: Tx, session_id: str | None) -> list[Row]:
    if session_id:
        rows = tx.all("SELECT * FROM goals WHERE session_id = ? ORDER BY created_at", (session_id,))
    else:
        rows = tx.all("SELECT * FROM goals ORDER BY created_at")
    return [_parse(r) for r in rows]


def update_goal(tx: Tx, goal: Row, expected_revision: int | None = None, **fields: Any) -> Row:
    """Write ``fields`` of one Goal; with ``expected_revision`` only if it still has that revision."""
    fields["updated_at"] = time.time()
    cols = ", ".join(f"{k} = ?" for k in fields)
    values = [dumps(v) if k in _JSON else v for k, v in fields.items()]
    sql, params = f"UPDATE goals SET {cols} WHERE goal_id = ?", [*values, goal["goal_id"]]
    if expected_revision is not None:
        sql, params = sql + " AND revision = ?", [*params, expected_revision]
    if tx.execute(sql, params) != 1:
        now = get_goal(tx, goal["goal_id"])
        raise VersionConflict(f"goal {goal['goal_id']} is at revision {now['revision']}, not {expected_revision};"
                              " reload and try again")
    goal.update(fields)
    emit(tx, "goal.updated", {"goal_id": goal["goal_id"], "state": goal["state"], "phase": goal["phase"],
                              "revision": goal["revision"], "reason_code": goal["reason_code"],
                              "changed": sorted(k for k in fields if k != "updated_at")},
         session_id=goal["session_id"], work_id=goal["work_id"])
    return goal


# --------------------------------------------------------------------------- todo


def get_todo(tx: Tx, session_id: str) -> tuple[list[dict[str, Any]], int, str | None]:
    """The session's plan: ``(items, version, goal_id it was written for)``."""
    row = tx.one("SELECT items, version, goal_id FROM todos WHERE session_id = ?", (session_id,))
    if row is None:
        return [], 0, None
    return list(json.loads(row["items"])), int(row["version"]), row["goal_id"]


def write_todo(tx: Tx, session_id: str, goal_id: str | None, items: list[dict[str, Any]]) -> int:
    """Replace the plan as a whole; returns its new version. Requirements are never touched here."""
    _, version, _ = get_todo(tx, session_id)
    version += 1
    tx.execute(
        "INSERT INTO todos (session_id, goal_id, items, version, updated_at) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (session_id) DO UPDATE SET goal_id = excluded.goal_id, items = excluded.items,"
        " version = excluded.version, updated_at = excluded.updated_at",
        (session_id, goal_id, dumps(items), version, time.time()),
    )
    emit(tx, "todo.updated", {"goal_id": goal_id, "version": version, "items": items}, session_id=session_id)
    return version


# --------------------------------------------------------------------------- acceptance


def insert_acceptance(tx: Tx, goal: Row, revision: int, outcome: str, verdicts: list[dict[str, Any]],
                      request_ids: list[str]) -> int:
    """One acceptance result with the next result version of its Goal."""
    version = int(tx.scalar("SELECT COALESCE(MAX(result_version), 0) AS v FROM acceptance_results WHERE goal_id = ?",
                            (goal["goal_id"],)) or 0) + 1
    tx.execute(
        "INSERT INTO acceptance_results (goal_id, result_version, revision, outcome, verdicts, request_ids, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (goal["goal_id"], version, revision, outcome, dumps(verdicts), dumps(request_ids), time.time()),
    )
    tx.execute("UPDATE goals SET result_version = ? WHERE goal_id = ?", (version, goal["goal_id"]))
    goal["result_version"] = version
    emit(tx, "goal.acceptance", {"goal_id": goal["goal_id"], "result_version": version, "revision": revision,
                                 "outcome": outcome}, session_id=goal["session_id"], work_id=goal["work_id"])
    return version


def evidence_effects(tx: Tx, work_id: str) -> list[Row]:
    """Acceptance evidence: the calls of a Goal's work item and of its subtasks (any depth), oldest
    first, with their capability, state, result and times."""
    return tx.all(
        "WITH RECURSIVE tree(work_id) AS (SELECT ? UNION SELECT w.work_id FROM work_items w"
        " JOIN tree ON w.parent_work_id = tree.work_id)"
        " SELECT work_id, call_id, tool, arguments, capability, state, result, dispatched_at, ended_at FROM effects"
        " WHERE work_id IN (SELECT work_id FROM tree) ORDER BY seq",
        (work_id,),
    )


def latest_acceptance(tx: Tx, goal_id: str) -> Row | None:
    row = tx.one("SELECT * FROM acceptance_results WHERE goal_id = ? ORDER BY result_version DESC LIMIT 1", (goal_id,))
    if row is not None:
        row["verdicts"], row["request_ids"] = json.loads(row["verdicts"]), json.loads(row["request_ids"])
    return row


def acceptance_count(tx: Tx, goal_id: str) -> int:
    return int(tx.scalar("SELECT COUNT(*) AS n FROM acceptance_results WHERE goal_id = ?", (goal_id,)) or 0)


# --------------------------------------------------------------------------- terminal history


def history_record_of(tx: Tx, goal_id: str) -> Row | None:
    row = tx.one("SELECT * FROM goal_history WHERE goal_id = ?", (goal_id,))
    return None if row is None else _record(row)


def insert_history(tx: Tx, goal: Row, snapshot: dict[str, Any], anchor_seq: int, anchor_item_id: str) -> str:
    rid = new_id("hist")
    tx.execute(
        "INSERT INTO goal_history (record_id, goal_id, session_id, state, snapshot, anchor_seq, anchor_item_id,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (rid, goal["goal_id"], goal["session_id"], goal["state"], dumps(snapshot), anchor_seq, anchor_item_id,
         time.time()),
    )
    emit(tx, "goal.history", {"record_id": rid, "goal_id": goal["goal_id"], "state": goal["state"],
                              "anchor_seq": anchor_seq}, session_id=goal["session_id"], work_id=goal["work_id"])
    return rid


def _record(row: Row) -> Row:
    return {
        "record_id": row["record_id"], "goal_id": row["goal_id"], "session_id": row["session_id"],
        "state": row["state"], "snapshot": json.loads(row["snapshot"]),
        "anchor": {"seq": row["anchor_seq"], "item_id": row["anchor_item_id"]}, "created_at": row["created_at"],
        "read_only": True,
    }


def history(tx: Tx, session_id: str) -> list[Row]:
    return [_record(r) for r in tx.all("SELECT * FROM goal_history WHERE session_id = ? ORDER BY anchor_seq",
                                       (session_id,))]


def history_record(tx: Tx, record_id: str) -> Row:
    row = tx.one("SELECT * FROM goal_history WHERE record_id = ?", (record_id,))
    if row is None:
        raise NotFound(f"history record {record_id} not found")
    return _record(row)
