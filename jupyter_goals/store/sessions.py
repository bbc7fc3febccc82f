"""Sessions, work items and messages: sessions and their keyset pages (``page_sessions``); the work item's
shown phase (``set_phase``) and named transitions (``create_work``, ``finish_work``, ``set_retry_at``,
``set_control_version``, ``set_objective_revision``); ``accept_message`` (the request committed before
it is acknowledged: a new work item, or a steer joining the running one) and its consumption.

Functions take a ``Tx`` and run inside the caller's single transaction; each state change writes its event
row in the same transaction (``shared.emit``). Other aggregates are called through their module
(``sessions.set_phase``), never imported by name, so a test's wrapper of a transition
(``tests/faultstore.py``) sees every call. Callers outside ``store/`` use the facade ``control``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_goals.models import AttemptState, Phase, ReasonCode, reason_text
from jupyter_goals.models.reasons import NEEDS_PERSON
from jupyter_goals.store import shared
from jupyter_goals.store.db import NotFound, Row, Tx

__all__ = [
    "create_session",
    "get_session",
    "list_sessions",
    "page_sessions",
    "touch_session",
    "update_session",
    "turn_model",
    "work_view",
    "get_work",
    "current_work",
    "set_phase",
    "create_work",
    "running_work",
    "accept_message",
    "pending_steer",
    "consume_message",
    "finish_work",
    "consume_input",
    "set_retry_at",
    "set_control_version",
    "set_objective_revision",
    "unfinished_work_of_session",
    "running_children",
    "recent_work",
]


# --------------------------------------------------------------------------- sessions


def create_session(tx: Tx, title: str, cwd: str, model: str, permissions: dict[str, Any]) -> Row:
    now = time.time()
    sid = shared.new_id("ses")
    tx.execute(
        "INSERT INTO sessions (session_id, title, cwd, model, permissions, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (sid, title, cwd, model, shared.dumps(permissions), now, now),
    )
    shared.emit(tx, "session.created", {"title": title}, session_id=sid)
    return get_session(tx, sid)


def get_session(tx: Tx, session_id: str) -> Row:
    row = tx.one("SELECT * FROM sessions WHERE session_id = ?", (session_id,))
    if row is None:
        raise NotFound(f"session {session_id} not found")
    row["permissions"] = json.loads(row["permissions"])
    return row


def list_sessions(tx: Tx) -> list[Row]:
    rows = tx.all("SELECT * FROM sessions ORDER BY created_at DESC")
    for r in rows:
        r["permissions"] = json.loads(r["permissions"])
    return rows


# a session's state in lists: the phase of the work item it shows (current_work), "idle" without one
_SESSION_STATE = (
    "COALESCE((SELECT w.phase FROM work_items w WHERE w.session_id = s.session_id AND w.phase NOT IN"
    " ('done', 'cancelled') ORDER BY w.created_at LIMIT 1), (SELECT w.phase FROM work_items w"
    " WHERE w.session_id = s.session_id ORDER BY w.created_at DESC LIMIT 1), 'idle')"
)


# newest activity: created, renamed or re-permissioned (updated_at), a message accepted, a turn admitted
_SESSION_ACTIVITY = "CASE WHEN s.last_admitted_at > s.updated_at THEN s.last_admitted_at ELSE s.updated_at END"


def page_sessions(tx: Tx, *, limit: int, after: tuple[float, str] | None = None, states: list[str] | None = None,
                  text: str | None = None) -> list[Row]:
    """One page of sessions, newest activity first, keyset-paged on (activity, session_id): a page
    starts strictly after the ``after`` key of the previous page's last row, so sessions inserted
    meanwhile never shift or repeat the rest of a walk (no OFFSET). ``states`` filters on the shown
    work item's phase (or ``idle``); ``text`` is a case-insensitive substring of title or cwd."""
    where: list[str] = []
    params: list[Any] = []
    if after is not None:
        where.append("(activity < ? OR (activity = ? AND session_id < ?))")
        params += [after[0], after[0], after[1]]
    if states:
        where.append(f"state IN ({', '.join('?' * len(states))})")
        params += states
    if text:
        pattern = "%" + text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where.append("(LOWER(title) LIKE ? ESCAPE '\\' OR LOWER(cwd) LIKE ? ESCAPE '\\')")
        params += [pattern, pattern]
    rows = tx.all(
        f"SELECT * FROM (SELECT s.*, {_SESSION_ACTIVITY} AS activity, {_SESSION_STATE} AS state FROM sessions s) t"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " ORDER BY activity DESC, session_id DESC LIMIT ?",
        (*params, limit),
    )
    for r in rows:
        r["permissions"] = json.loads(r["permissions"])
    return rows


def touch_session(tx: Tx, session_id: str) -> None:
    """Record activity on a session (it moves to the top of the session list)."""
    tx.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (time.time(), session_id))


def update_session(tx: Tx, session_id: str, *, title: str | None = None, model: str | None = None) -> Row:
    """Rename the session or change its model (``None``: unchanged). A change moves it up the session
    list and writes ``session.updated`` with both values as they are now; the same values again change
    nothing. The new model applies from the next turn (``turn_model``): a running one keeps its own."""
    session = get_session(tx, session_id)
    changes = {k: v for k, v in (("title", title), ("model", model)) if v is not None and v != session[k]}
    if not changes:
        return session
    sets = ", ".join(f"{k} = ?" for k in changes)
    tx.execute(f"UPDATE sessions SET {sets}, updated_at = ? WHERE session_id = ?",
               (*changes.values(), time.time(), session_id))
    session = get_session(tx, session_id)
    shared.emit(tx, "session.updated", {"session_id": session_id, "title": session["title"], "model": session["model"]},
                session_id=session_id)
    return session


def turn_model(tx: Tx, turn_id: str, session_model: str) -> str:
    """The model a turn's requests go to: the session's (``session_model``) at the turn's first model
    request, kept on the turn for its later steps and attempts, so a model change made meanwhile
    (``update_session``) waits for the next turn."""
    row = tx.one("SELECT model FROM turns WHERE turn_id = ?", (turn_id,))
    if row is not None and row["model"]:
        return str(row["model"])
    tx.execute("UPDATE turns SET model = ? WHERE turn_id = ? AND model IS NULL", (session_model, turn_id))
    return session_model


# --------------------------------------------------------------------------- work items


def work_view(row: Row) -> dict[str, Any]:
    return {
        "work_id": row["work_id"],
        "kind": row["kind"],
        "desired_state": row["desired_state"],
        "phase": row["phase"],
        "reason_code": row["reason_code"],
        "reason": row["reason"],
        "control_version": row["control_version"],
        # while waiting: the durable retry time (provider or recovery backoff) holding the work back
        "retry_at": float(row["next_attempt_at"]) if row["phase"] == Phase.WAITING and row.get("next_attempt_at") else None,
    }


def get_work(tx: Tx, work_id: str) -> Row:
    row = tx.one("SELECT * FROM work_items WHERE work_id = ?", (work_id,))
    if row is None:
        raise NotFound(f"work item {work_id} not found")
    return row


def current_work(tx: Tx, session_id: str) -> Row | None:
    """The session's work item to show: the oldest unfinished one, else the newest."""
    row = tx.one(
        "SELECT * FROM work_items WHERE session_id = ? AND phase NOT IN ('done', 'cancelled')"
        " ORDER BY created_at LIMIT 1",
        (session_id,),
    )
    if row is None:
        row = tx.one("SELECT * FROM work_items WHERE session_id = ? ORDER BY created_at DESC LIMIT 1", (session_id,))
    return row


def set_phase(tx: Tx, work: Row, phase: Phase | str, code: ReasonCode | str, reason: str | None = None) -> None:
    phase, code = str(phase), str(code)
    text = reason if reason is not None else reason_text(code)
    if work["phase"] == phase and work["reason_code"] == code and work["reason"] == text:
        return
    now = time.time()
    ended = now if phase in (Phase.DONE, Phase.CANCELLED) else None
    tx.execute(
        "UPDATE work_items SET phase = ?, reason_code = ?, reason = ?, updated_at = ?, ended_at = COALESCE(?, ended_at)"
        " WHERE work_id = ?",
        (phase, code, text, now, ended, work["work_id"]),
    )
    work.update(phase=phase, reason_code=code, reason=text)
    shared.emit(
        tx,
        "work.phase",
        {"phase": phase, "reason_code": code, "reason": text, "desired_state": work["desired_state"],
         "needs_person": phase == Phase.FAILED or code in NEEDS_PERSON},
        session_id=work["session_id"],
        work_id=work["work_id"],
    )


def create_work(
    tx: Tx, session: Row, kind: str, input_: dict[str, Any], *, auto_recover: bool, host: str
) -> Row:
    now = time.time()
    wid = shared.new_id("wrk")
    tx.execute(
        "INSERT INTO work_items (work_id, session_id, kind, input, desired_state, control_version, phase,"
        " reason_code, reason, permission_scope, host_name, auto_recover, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, 'run', 1, 'queued', 'queued', ?, ?, ?, ?, ?, ?)",
        (
            wid,
            session["session_id"],
            kind,
            shared.dumps(input_),
            reason_text(ReasonCode.QUEUED),
            shared.dumps(session["permissions"]),
            host,
            1 if auto_recover else 0,
            now,
            now,
        ),
    )
    shared.emit(tx, "work.created", {"kind": kind, "phase": "queued"}, session_id=session["session_id"], work_id=wid)
    return get_work(tx, wid)


def running_work(tx: Tx, session_id: str) -> Row | None:
    return tx.one(
        "SELECT * FROM work_items WHERE session_id = ? AND desired_state = 'run'"
        " AND phase NOT IN ('done', 'cancelled', 'failed') AND input_consumed = 1 ORDER BY created_at LIMIT 1",
        (session_id,),
    )


# --------------------------------------------------------------------------- messages (and the work they join)


def _in_recovery(tx: Tx, work: Row) -> bool:
    """The work's executor died and no attempt has taken over yet: its next attempt is a recovery."""
    latest = tx.one("SELECT state FROM attempts WHERE work_id = ? ORDER BY admitted_at DESC LIMIT 1", (work["work_id"],))
    return latest is not None and latest["state"] == AttemptState.DEAD


def accept_message(
    tx: Tx, session: Row, text: str, client_request_id: str, delivery: str, *, auto_recover: bool, host: str
) -> tuple[Row, bool]:
    """Commit the original request before anything is acknowledged. Repeats return the first answer."""
    existing = tx.one(
        "SELECT * FROM messages WHERE session_id = ? AND client_request_id = ?",
        (session["session_id"], client_request_id),
    )
    if existing is not None:
        return existing, False
    target = running_work(tx, session["session_id"])
    if target is not None and delivery == "queue" and _in_recovery(tx, target):
        delivery = "steer"  # input sent during recovery wins over the old continuation: it joins it first
    elif delivery != "steer":
        target = None
    if target is None:
        work = create_work(tx, session, "chat", {"text": text}, auto_recover=auto_recover, host=host)
        work_id, consumed = work["work_id"], 1  # the work item carries the text as its input
    else:
        work_id, consumed = target["work_id"], 0  # consumed at the running turn's next step boundary
    mid = shared.new_id("msg")
    tx.execute(
        "INSERT INTO messages (message_id, session_id, client_request_id, work_id, text, delivery, consumed,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (mid, session["session_id"], client_request_id, work_id, text, delivery, consumed, time.time()),
    )
    shared.emit(tx, "message.accepted", {"message_id": mid, "delivery": delivery}, session_id=session["session_id"], work_id=work_id)
    touch_session(tx, session["session_id"])
    row = tx.one("SELECT * FROM messages WHERE message_id = ?", (mid,))
    assert row is not None
    return row, True


def pending_steer(tx: Tx, work_id: str) -> list[Row]:
    return tx.all(
        "SELECT * FROM messages WHERE work_id = ? AND consumed = 0 ORDER BY created_at", (work_id,)
    )


def consume_message(tx: Tx, message_id: str) -> None:
    """A steered message joined the running turn (its transcript item is appended beside this)."""
    tx.execute("UPDATE messages SET consumed = 1 WHERE message_id = ?", (message_id,))


# --------------------------------------------------------------------------- work item transitions


def consume_input(tx: Tx, work: Row) -> None:
    """The work item's original input is in the transcript (appended once, when its first turn starts)."""
    tx.execute("UPDATE work_items SET input_consumed = 1 WHERE work_id = ?", (work["work_id"],))
    work["input_consumed"] = 1


def finish_work(tx: Tx, work: Row, *, reset_deaths: bool = False) -> None:
    """``desired_state = done``: the work item continues no further (``reset_deaths``: it ended by
    itself, so its run of consecutive executor deaths ends too). The caller sets the phase."""
    if reset_deaths:
        tx.execute("UPDATE work_items SET desired_state = 'done', recovery_attempts = 0 WHERE work_id = ?",
                   (work["work_id"],))
    else:
        tx.execute("UPDATE work_items SET desired_state = 'done' WHERE work_id = ?", (work["work_id"],))
    work["desired_state"] = "done"


def set_retry_at(tx: Tx, work_id: str, at: float) -> None:
    """The durable time before which the work item is not admitted again (0: no hold)."""
    tx.execute("UPDATE work_items SET next_attempt_at = ? WHERE work_id = ?", (at, work_id))


def set_control_version(tx: Tx, work: Row, version: int, objective_revision: int) -> None:
    """A Goal change bumps its work item's control version (older continuations are refused)."""
    tx.execute("UPDATE work_items SET control_version = ?, objective_revision = ?, updated_at = ? WHERE work_id = ?",
               (version, objective_revision, time.time(), work["work_id"]))
    work["control_version"] = version


def set_objective_revision(tx: Tx, work_id: str, revision: int) -> None:
    tx.execute("UPDATE work_items SET objective_revision = ? WHERE work_id = ?", (revision, work_id))


def unfinished_work_of_session(tx: Tx, session_id: str, *, except_work_id: str | None = None) -> list[Row]:
    return tx.all("SELECT * FROM work_items WHERE session_id = ? AND phase NOT IN ('done', 'cancelled')"
                  " AND work_id != ?", (session_id, except_work_id or ""))


def running_children(tx: Tx, work_id: str) -> list[Row]:
    """Subtasks of a work item that have not ended (done, cancelled or failed)."""
    return tx.all("SELECT work_id FROM work_items WHERE parent_work_id = ? AND phase NOT IN"
                  " ('done', 'cancelled', 'failed')", (work_id,))


def recent_work(tx: Tx, limit: int = 50) -> list[Row]:
    """The newest work items with their session's title (``jupyter goals status``)."""
    return tx.all(
        "SELECT w.work_id, s.title, w.kind, w.desired_state, w.phase, w.reason_code, w.reason, w.control_version,"
        " w.host_name FROM work_items w JOIN sessions s ON s.session_id = w.session_id ORDER BY w.created_at DESC LIMIT ?",
        (limit,),
    )
