"""Every control.db statement lives here, so the guarantees can be read in one place.

Functions take a ``Tx`` and run inside the caller's single transaction. Each state change writes
its event row (monotonic ``seq``) in the same transaction. Attempt writes go through ``fence()``
first: ``UPDATE attempts … WHERE generation = ? AND state = 'running'``; zero rows → FencedError.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from jupyter_goals.models import (
    AttemptState,
    DesiredState,
    EffectState,
    ItemKind,
    Phase,
    ReasonCode,
    TranscriptItem,
    TurnState,
    Usage,
    reason_text,
)
from jupyter_goals.prices import PriceTable
from jupyter_goals.store.db import FencedError, NotFound, Row, Tx, VersionConflict


def new_id(prefix: str) -> str:
    """Time-ordered: milliseconds since the epoch, then 48 random bits (UUIDv7's layout, shorter). New
    rows land at the end of each primary-key B-tree, so a commit dirties the same few pages however long
    the history is; random ids spread inserts over every page of a large table (issue 14)."""
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{secrets.randbits(48):012x}"


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))  # built once: dumps() is on the hot path


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def digest(value: Any) -> str:
    return hashlib.sha256(dumps(value).encode()).hexdigest()


def continuation_key(work_id: str, control_version: int, commit_point: int) -> str:
    """sha256(work_id | control_version | predecessor commit point): unique in ``attempts``."""
    return hashlib.sha256(f"{work_id}|{control_version}|{commit_point}".encode()).hexdigest()


def next_counter(tx: Tx, name: str) -> int:
    # the row lock orders concurrent writers, so seq order is commit order on PostgreSQL too
    return int(tx.scalar("UPDATE counters SET value = value + 1 WHERE name = ? RETURNING value", (name,)))


# --------------------------------------------------------------------------- events


def emit(tx: Tx, kind: str, payload: dict[str, Any], session_id: str | None = None, work_id: str | None = None) -> int:
    seq = tx.insert_seq(
        "events", "event_seq", ("ts", "session_id", "work_id", "kind", "payload"),
        (time.time(), session_id, work_id, kind, dumps(payload)),
    )
    assert seq is not None
    return seq


def events_after(tx: Tx, after: int, limit: int) -> list[Row]:
    rows = tx.all(
        "SELECT seq, ts, session_id, work_id, kind, payload FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
        (after, limit),
    )
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    return rows


def last_event_seq(tx: Tx) -> int:
    return tx.last_seq("events", "event_seq")


# --------------------------------------------------------------------------- sessions


def create_session(tx: Tx, title: str, cwd: str, model: str, permissions: dict[str, Any]) -> Row:
    now = time.time()
    sid = new_id("ses")
    tx.execute(
        "INSERT INTO sessions (session_id, title, cwd, model, permissions, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (sid, title, cwd, model, dumps(permissions), now, now),
    )
    emit(tx, "session.created", {"title": title}, session_id=sid)
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
    emit(
        tx,
        "work.phase",
        {"phase": phase, "reason_code": code, "reason": text, "desired_state": work["desired_state"]},
        session_id=work["session_id"],
        work_id=work["work_id"],
    )


def create_work(
    tx: Tx, session: Row, kind: str, input_: dict[str, Any], *, auto_recover: bool, host: str
) -> Row:
    now = time.time()
    wid = new_id("wrk")
    tx.execute(
        "INSERT INTO work_items (work_id, session_id, kind, input, desired_state, control_version, phase,"
        " reason_code, reason, permission_scope, host_name, auto_recover, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, 'run', 1, 'queued', 'queued', ?, ?, ?, ?, ?, ?)",
        (
            wid,
            session["session_id"],
            kind,
            dumps(input_),
            reason_text(ReasonCode.QUEUED),
            dumps(session["permissions"]),
            host,
            1 if auto_recover else 0,
            now,
            now,
        ),
    )
    emit(tx, "work.created", {"kind": kind, "phase": "queued"}, session_id=session["session_id"], work_id=wid)
    return get_work(tx, wid)


def running_work(tx: Tx, session_id: str) -> Row | None:
    return tx.one(
        "SELECT * FROM work_items WHERE session_id = ? AND desired_state = 'run'"
        " AND phase NOT IN ('done', 'cancelled', 'failed') AND input_consumed = 1 ORDER BY created_at LIMIT 1",
        (session_id,),
    )


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
    mid = new_id("msg")
    tx.execute(
        "INSERT INTO messages (message_id, session_id, client_request_id, work_id, text, delivery, consumed,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (mid, session["session_id"], client_request_id, work_id, text, delivery, consumed, time.time()),
    )
    emit(tx, "message.accepted", {"message_id": mid, "delivery": delivery}, session_id=session["session_id"], work_id=work_id)
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
        "SELECT w.work_id, s.title, w.kind, w.desired_state, w.phase, w.reason_code, w.reason, w.control_version"
        " FROM work_items w JOIN sessions s ON s.session_id = w.session_id ORDER BY w.created_at DESC LIMIT ?",
        (limit,),
    )


CONTROL_TARGET = {
    "pause": DesiredState.PAUSED,
    "resume": DesiredState.RUN,
    "stop": DesiredState.CANCELLED,
    "retry": DesiredState.RUN,
}


def apply_control(tx: Tx, work: Row, action: str, expected_version: int | None) -> Row:
    """Persist a user control: bumps ``control_version`` so every older decision is refused."""
    if expected_version is not None and expected_version != work["control_version"]:
        raise VersionConflict(
            f"control_version is {work['control_version']}, not {expected_version}; reload and try again"
        )
    if work["phase"] in (Phase.DONE, Phase.CANCELLED):
        raise VersionConflict(f"work {work['work_id']} already ended ({work['phase']})")
    desired = CONTROL_TARGET[action]
    version = int(work["control_version"]) + 1
    now = time.time()
    tx.execute(
        "UPDATE work_items SET desired_state = ?, control_version = ?, updated_at = ?, recovery_attempts ="
        " CASE WHEN ? IN ('retry', 'resume') THEN 0 ELSE recovery_attempts END, next_attempt_at ="
        " CASE WHEN ? IN ('retry', 'resume') THEN 0 ELSE next_attempt_at END WHERE work_id = ?",
        (desired, version, now, action, action, work["work_id"]),
    )
    work.update(desired_state=str(desired), control_version=version)
    emit(
        tx,
        "work.control",
        {"action": action, "desired_state": str(desired), "control_version": version},
        session_id=work["session_id"],
        work_id=work["work_id"],
    )
    if desired != DesiredState.RUN:
        # an attempt admitted but not yet claimed by a worker would only hold a quota slot until claimed
        n = tx.execute(
            "UPDATE attempts SET state = 'ended', ended_at = ?, end_reason = 'control' WHERE work_id = ?"
            " AND state = 'admitted'",
            (now, work["work_id"]),
        )
        if n:
            bump_commit_point(tx, work["work_id"])
    live = tx.scalar(
        "SELECT COUNT(*) AS n FROM attempts WHERE work_id = ? AND state IN ('admitted', 'running')", (work["work_id"],)
    )
    if desired == DesiredState.PAUSED:
        set_phase(tx, work, Phase.PAUSED, ReasonCode.USER_PAUSED)
    elif desired == DesiredState.CANCELLED and not live:
        finish_cancelled(tx, work)
    elif desired == DesiredState.CANCELLED:
        set_phase(tx, work, work["phase"], ReasonCode.USER_STOPPED)
    elif desired == DesiredState.RUN and not live:
        set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
    elif desired == DesiredState.RUN and work["phase"] == Phase.PAUSED:
        # resumed while the paused step still runs: it is working (that attempt yields at its next
        # step boundary and the work is admitted again), never shown paused while its intent is run
        set_phase(tx, work, Phase.WORKING, ReasonCode.WORKING)
    code, sentence = INVALIDATION_REASONS[action]
    invalidate_approvals(tx, work["work_id"], sentence, code)
    # a child never outlives its parent's stop: stop and pause reach every unfinished subtask, resume
    # the paused ones (they share the parent's run intent)
    if action in ("pause", "stop", "resume"):
        for child in tx.all("SELECT * FROM work_items WHERE parent_work_id = ? AND phase NOT IN ('done', 'cancelled')",
                            (work["work_id"],)):
            if child["desired_state"] == {"pause": "run", "resume": "paused"}.get(action, child["desired_state"]) \
                    and child["desired_state"] != DesiredState.CANCELLED:
                apply_control(tx, child, action, None)
    return work


def finish_cancelled(tx: Tx, work: Row) -> None:
    """A stop persists as cancelled: the open turn ends interrupted, unstarted calls never start."""
    turns = tx.all("SELECT turn_id FROM turns WHERE work_id = ? AND state = 'running'", (work["work_id"],))
    for turn in turns:
        end_turn(tx, work, turn["turn_id"], TurnState.INTERRUPTED, "user_stopped")
    if turns:  # said in words where it happened (work stopped before it ever ran has no turn to end)
        # a command this stop terminated: a shell call still running (the Coordinator kills what no live
        # worker owns) or one the stop itself cancelled (an earlier Cancel of that call alone sets
        # cancel_requested_at); a planned call never started and a finished one was not terminated
        terminated = any(tx.one(
            "SELECT call_id FROM effects WHERE turn_id = ? AND ((state = 'dispatched' AND tool = 'shell')"
            " OR (state = 'cancelled' AND cancel_requested_at IS NULL)) LIMIT 1", (turn["turn_id"],),
        ) is not None for turn in turns)
        text = "Stopped by you: this turn ended here" + (
            "; a command still running was terminated." if terminated else ".")
        append_item(tx, work["session_id"], ItemKind.INTERRUPTION, "system", text,
                    item_id=f"stopped:{work['work_id']}", work_id=work["work_id"], turn_id=turns[-1]["turn_id"],
                    meta={"reason_code": str(ReasonCode.USER_STOPPED)})
    set_phase(tx, work, Phase.CANCELLED, ReasonCode.USER_STOPPED)


def stop_all(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT * FROM work_items WHERE desired_state IN ('run', 'paused') AND phase NOT IN ('done', 'cancelled')"
    )
    for work in rows:
        work = get_work(tx, work["work_id"])  # a parent's stop may already have stopped this subtask
        if work["desired_state"] != DesiredState.CANCELLED:
            apply_control(tx, work, "stop", None)
    return [r["work_id"] for r in rows]


def change_permissions(tx: Tx, session_id: str, permissions: dict[str, Any], expected_version: int | None) -> Row:
    """Save a session's new permission scope and carry it to its unfinished work items.

    Each such item gets the new scope and a bumped ``control_version`` (a running attempt yields at
    its next step and is re-admitted under the new scope); pending approvals are invalidated with
    reason ``permission_revoked``. ``expected_version`` is checked against the session's current work.
    """
    session = get_session(tx, session_id)
    current = current_work(tx, session_id)
    if expected_version is not None and (current is None or int(current["control_version"]) != expected_version):
        have = None if current is None else current["control_version"]
        raise VersionConflict(f"control_version is {have}, not {expected_version}; reload and try again")
    now = time.time()
    tx.execute("UPDATE sessions SET permissions = ?, updated_at = ? WHERE session_id = ?",
               (dumps(permissions), now, session_id))
    emit(tx, "session.permissions", {"permissions": permissions}, session_id=session_id)
    code, sentence = INVALIDATION_REASONS["permissions"]
    for work in tx.all("SELECT * FROM work_items WHERE session_id = ? AND phase NOT IN ('done', 'cancelled')", (session_id,)):
        version = int(work["control_version"]) + 1
        tx.execute("UPDATE work_items SET permission_scope = ?, control_version = ?, updated_at = ? WHERE work_id = ?",
                   (dumps(permissions), version, now, work["work_id"]))
        work["control_version"] = version
        emit(tx, "work.control", {"action": "permissions", "desired_state": work["desired_state"], "control_version": version},
             session_id=session_id, work_id=work["work_id"])
        if invalidate_approvals(tx, work["work_id"], sentence, code) and work["desired_state"] == DesiredState.RUN:
            set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
        # a subtask never holds more authority than its parent: its session follows the new scope
        for child in tx.all("SELECT session_id FROM work_items WHERE parent_work_id = ? AND phase NOT IN ('done', 'cancelled')",
                            (work["work_id"],)):
            change_permissions(tx, child["session_id"], permissions, None)
    session = get_session(tx, session_id)
    return session


# --------------------------------------------------------------------------- transcript


def append_item(
    tx: Tx,
    session_id: str,
    kind: ItemKind,
    role: str,
    content: str = "",
    *,
    item_id: str | None = None,
    work_id: str | None = None,
    turn_id: str | None = None,
    call_id: str | None = None,
    provider_call_id: str | None = None,
    response_id: str | None = None,
    tool: str | None = None,
    arguments: dict[str, Any] | None = None,
    state: str | None = None,
    meta: dict[str, Any] | None = None,
) -> int | None:
    """Append one transcript item; returns its seq. A given ``item_id`` is a stable repair key:
    inserted at most once (``None`` when it was already there)."""
    item_id = item_id or new_id("itm")
    seq = tx.insert_seq(
        "transcript",
        "transcript_seq",
        ("item_id", "session_id", "work_id", "turn_id", "kind", "role", "content", "call_id", "provider_call_id",
         "response_id", "tool", "arguments", "state", "meta", "created_at"),
        (item_id, session_id, work_id, turn_id, str(kind), role, content, call_id, provider_call_id, response_id, tool,
         None if arguments is None else dumps(arguments), state, dumps(meta or {}), time.time()),
        unique="item_id",
    )
    if seq is None:
        return None
    emit(
        tx,
        "transcript.item",
        {"item_id": item_id, "seq": seq, "kind": str(kind), "call_id": call_id, "state": state},
        session_id=session_id,
        work_id=work_id,
    )
    return seq


def _item(row: Row) -> TranscriptItem:
    return TranscriptItem(
        item_id=row["item_id"],
        seq=row["seq"],
        kind=ItemKind(row["kind"]),
        role=row["role"],
        content=row["content"],
        call_id=row["call_id"],
        provider_call_id=row["provider_call_id"],
        response_id=row["response_id"],
        tool=row["tool"],
        arguments=None if row["arguments"] is None else json.loads(row["arguments"]),
        state=row["state"],
        turn_id=row["turn_id"],
        work_id=row["work_id"],
        meta=json.loads(row["meta"] or "{}"),
    )


def transcript(tx: Tx, session_id: str, after: int = 0, limit: int = 100000) -> list[TranscriptItem]:
    rows = tx.all(
        "SELECT * FROM transcript WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?", (session_id, after, limit)
    )
    return [_item(r) for r in rows]


def transcript_page(tx: Tx, session_id: str, *, limit: int, after: int | None = None,
                    before: int | None = None) -> dict[str, Any]:
    """One page of a transcript in seq order: the ``limit`` items after ``after``, or the ``limit``
    items just before ``before`` (``None`` for both: from the start). ``next_cursor`` (pass as
    ``after``) / ``prev_cursor`` (pass as ``before``) are set while newer / older items exist. Index
    seeks on (session_id, seq) only, so a page costs the same in a 20,000-item transcript."""
    if before is not None:
        rows = tx.all("SELECT * FROM transcript WHERE session_id = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                      (session_id, before, limit + 1))
        older = len(rows) > limit
        rows = rows[:limit][::-1]
        newer = bool(rows) and _has_item(tx, session_id, ">", rows[-1]["seq"])
    else:
        rows = tx.all("SELECT * FROM transcript WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                      (session_id, after or 0, limit + 1))
        newer = len(rows) > limit
        rows = rows[:limit]
        older = bool(rows) and _has_item(tx, session_id, "<", rows[0]["seq"])
    items = [_item(r) for r in rows]
    return {"items": [i.model_dump() for i in items],
            "next_cursor": items[-1].seq if newer else None,
            "prev_cursor": items[0].seq if older else None}


def _has_item(tx: Tx, session_id: str, op: str, seq: int) -> bool:
    return tx.one(f"SELECT seq FROM transcript WHERE session_id = ? AND seq {op} ? LIMIT 1", (session_id, seq)) is not None


def last_item_of_turn(tx: Tx, turn_id: str) -> Row | None:
    """The newest item of a turn that the model reads (its kind and response id). Markers (an
    interruption, a notice, a compaction summary, a Goal record) never count: a worker that died right
    after committing its final answer leaves an interruption marker behind it, and the resumed attempt
    must finish the turn, not ask the model again."""
    return tx.one("SELECT kind, response_id FROM transcript WHERE turn_id = ? AND kind NOT IN"
                  " ('interruption', 'notice', 'compaction', 'goal_record') ORDER BY seq DESC LIMIT 1", (turn_id,))


def response_has_calls(tx: Tx, response_id: str) -> bool:
    return tx.one(RESPONSE_CALLS_SQL, (response_id,)) is not None


RESPONSE_CALLS_SQL = "SELECT item_id FROM transcript WHERE response_id = ? AND kind = 'tool_call' LIMIT 1"


def last_reply(tx: Tx, turn_id: str) -> str | None:
    """The text of a turn's newest assistant message."""
    row = tx.one("SELECT content FROM transcript WHERE turn_id = ? AND kind = 'assistant' ORDER BY seq DESC LIMIT 1",
                 (turn_id,))
    return None if row is None else str(row["content"])


# --------------------------------------------------------------------------- workers and fencing


def register_worker(tx: Tx, worker_id: str, host: str, boot: str, pid: int, start_time: int | None, ttl: float) -> int:
    generation = next_counter(tx, "worker_generation")
    now = time.time()
    tx.execute(
        "INSERT INTO workers (worker_id, generation, host_name, boot_id, pid, start_time, state, registered_at,"
        " heartbeat_at, lease_expires_at) VALUES (?, ?, ?, ?, ?, ?, 'live', ?, ?, ?)",
        (worker_id, generation, host, boot, pid, start_time, now, now, now + ttl),
    )
    emit(tx, "worker.registered", {"worker_id": worker_id, "generation": generation, "pid": pid})
    return generation


def heartbeat_worker(tx: Tx, worker_id: str, generation: int, ttl: float) -> bool:
    now = time.time()
    ok = tx.execute(
        "UPDATE workers SET heartbeat_at = ?, lease_expires_at = ? WHERE worker_id = ? AND generation = ?"
        " AND state = 'live'",
        (now, now + ttl, worker_id, generation),
    )
    tx.execute(
        "UPDATE attempts SET heartbeat_at = ? WHERE worker_id = ? AND generation = ? AND state = 'running'",
        (now, worker_id, generation),
    )
    return ok == 1


def mark_worker_dead(tx: Tx, worker: Row, reason: str) -> list[Row]:
    """Confirmed death: fence the generation (its attempts become dead; later writes are refused)."""
    now = time.time()
    tx.execute(
        "UPDATE workers SET state = 'dead', ended_at = ?, end_reason = ? WHERE worker_id = ? AND state = 'live'",
        (now, reason, worker["worker_id"]),
    )
    attempts = tx.all(
        "SELECT * FROM attempts WHERE worker_id = ? AND state = 'running'", (worker["worker_id"],)
    )
    for a in attempts:
        tx.execute(
            "UPDATE attempts SET state = 'dead', ended_at = ?, end_reason = ? WHERE attempt_id = ?",
            (now, f"worker dead: {reason}", a["attempt_id"]),
        )
        bump_commit_point(tx, a["work_id"])
        lose_requests(tx, a["attempt_id"])
    emit(tx, "worker.dead", {"worker_id": worker["worker_id"], "generation": worker["generation"], "reason": reason})
    return attempts


def mark_worker_stopped(tx: Tx, worker_id: str) -> None:
    tx.execute(
        "UPDATE workers SET state = 'stopped', ended_at = ?, end_reason = 'graceful' WHERE worker_id = ? AND state = 'live'",
        (time.time(), worker_id),
    )


def fence(tx: Tx, attempt_id: str, generation: int) -> None:
    """Every attempt write starts here. No running row → the attempt no longer owns its work.

    A read, not a write: the transaction's lock (SQLite's write lock, PostgreSQL's row share lock)
    keeps the row as read until commit, so marking the attempt dead waits for or precedes us; the
    worker's heartbeat, not each commit, renews ``heartbeat_at``.
    """
    row = tx.one(
        "SELECT attempt_id FROM attempts WHERE attempt_id = ? AND generation = ? AND state = 'running'" + tx.row_lock,
        (attempt_id, generation),
    )
    if row is None:
        raise FencedError(f"attempt {attempt_id} (generation {generation}) is fenced")


def bump_commit_point(tx: Tx, work_id: str) -> None:
    """The work item's checkpoint ordinal: bumped whenever one of its attempts ends (ended or dead),
    so the next admission gets a new continuation key while two recoveries of the same checkpoint
    collide on it. Commits inside an attempt leave it alone (no extra page per tool-call commit)."""
    tx.execute("UPDATE work_items SET commit_point = commit_point + 1 WHERE work_id = ?", (work_id,))


# --------------------------------------------------------------------------- turns and attempts


def open_turn(tx: Tx, work: Row) -> Row | None:
    return tx.one(
        "SELECT * FROM turns WHERE work_id = ? AND state = 'running' ORDER BY started_at DESC LIMIT 1",
        (work["work_id"],),
    )


def rebind_planned_calls(tx: Tx, work: Row, identities: dict[str, tuple[str, str]]) -> int:
    """Bind the open turn's planned (never started) calls to the tools' current implementations
    ({tool: (identity, digest)}): a person's Retry after ``tool_changed``. Returns the calls rebound."""
    turn = open_turn(tx, work)
    if turn is None:
        return 0
    n = 0
    for eff in tx.all("SELECT effect_id, tool FROM effects WHERE turn_id = ? AND state = 'planned'", (turn["turn_id"],)):
        if eff["tool"] in identities:
            identity, digest = identities[eff["tool"]]
            n += tx.execute("UPDATE effects SET impl_identity = ?, impl_digest = ? WHERE effect_id = ?",
                            (identity, digest, eff["effect_id"]))
    if n:
        emit(tx, "effect.rebound", {"work_id": work["work_id"], "calls": n}, session_id=work["session_id"],
             work_id=work["work_id"])
    return n


def new_turn(tx: Tx, work: Row, restricted: bool) -> str:
    tid = new_id("turn")
    tx.execute(
        "INSERT INTO turns (turn_id, work_id, session_id, state, restricted, started_at) VALUES (?, ?, ?, 'running', ?, ?)",
        (tid, work["work_id"], work["session_id"], 1 if restricted else 0, time.time()),
    )
    emit(tx, "turn.started", {"turn_id": tid, "restricted": restricted}, session_id=work["session_id"], work_id=work["work_id"])
    return tid


def end_turn(tx: Tx, work: Row, turn_id: str, state: TurnState, reason: str) -> None:
    n = tx.execute(
        "UPDATE turns SET state = ?, ended_at = ?, end_reason = ? WHERE turn_id = ? AND state = 'running'",
        (str(state), time.time(), reason, turn_id),
    )
    if not n:
        return
    # calls that were planned but never dispatched never started
    for eff in tx.all("SELECT * FROM effects WHERE turn_id = ? AND state = 'planned'", (turn_id,)):
        set_effect_state(tx, eff, EffectState.NEVER_STARTED)
        append_item(
            tx,
            work["session_id"],
            ItemKind.TOOL_RESULT,
            "tool",
            f"[call {eff['call_id']} to {eff['tool']} never started: the turn ended ({reason})]",
            item_id=f"never:{eff['call_id']}",
            work_id=work["work_id"],
            turn_id=turn_id,
            call_id=eff["call_id"],
            tool=eff["tool"],
            state=str(EffectState.NEVER_STARTED),
        )
    emit(tx, "turn.ended", {"turn_id": turn_id, "state": str(state), "reason": reason}, session_id=work["session_id"], work_id=work["work_id"])


def admit(tx: Tx, work: Row, *, mode: str, turn_id: str | None, restricted: bool = False) -> Row:
    """Admit one attempt. The continuation key makes a second admission of the same continuation fail."""
    key = continuation_key(work["work_id"], int(work["control_version"]), int(work["commit_point"]))
    if tx.one("SELECT attempt_id FROM attempts WHERE continuation_key = ?", (key,)) is not None:
        raise VersionConflict(f"continuation {key[:12]} of {work['work_id']} was already admitted")
    if turn_id is None:
        turn_id = new_turn(tx, work, restricted)
    if not work["input_consumed"]:
        # the original input joins the transcript once, when its first turn starts
        text = json.loads(work["input"]).get("text", "")
        append_item(tx, work["session_id"], ItemKind.USER, "user", text, work_id=work["work_id"], turn_id=turn_id,
                    item_id=f"input:{work['work_id']}")
        tx.execute("UPDATE work_items SET input_consumed = 1 WHERE work_id = ?", (work["work_id"],))
        work["input_consumed"] = 1
    aid = new_id("att")
    now = time.time()
    tx.execute(
        "INSERT INTO attempts (attempt_id, turn_id, work_id, session_id, state, mode, control_version,"
        " continuation_key, admitted_at) VALUES (?, ?, ?, ?, 'admitted', ?, ?, ?, ?)",
        (aid, turn_id, work["work_id"], work["session_id"], str(mode), work["control_version"], key, now),
    )
    tx.execute("UPDATE sessions SET last_admitted_at = ? WHERE session_id = ?", (now, work["session_id"]))
    emit(tx, "attempt.admitted", {"attempt_id": aid, "turn_id": turn_id, "mode": str(mode)}, session_id=work["session_id"], work_id=work["work_id"])
    set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED if mode == "fresh" else ReasonCode.RECOVERED)
    row = tx.one("SELECT * FROM attempts WHERE attempt_id = ?", (aid,))
    assert row is not None
    return row


def claim_attempt(tx: Tx, worker_id: str, generation: int) -> Row | None:
    """A worker takes the oldest admitted attempt; the conditional update makes the claim exclusive."""
    row = tx.one("SELECT * FROM attempts WHERE state = 'admitted' ORDER BY admitted_at LIMIT 1")
    if row is None:
        return None
    n = tx.execute(
        "UPDATE attempts SET state = 'running', worker_id = ?, generation = ?, started_at = ?, heartbeat_at = ?"
        " WHERE attempt_id = ? AND state = 'admitted'",
        (worker_id, generation, time.time(), time.time(), row["attempt_id"]),
    )
    if n != 1:
        return None
    row.update(state="running", worker_id=worker_id, generation=generation)
    work = get_work(tx, row["work_id"])
    # an attempt admitted before a pause/stop is claimed only to yield to that control: never show
    # paused or stopped work as working (the turn's first fenced read ends the attempt)
    if work["desired_state"] == DesiredState.RUN and int(work["control_version"]) == int(row["control_version"]):
        set_phase(tx, work, Phase.WORKING, ReasonCode.WORKING)
    return row


def end_attempt(tx: Tx, attempt: Row, reason: str) -> None:
    """An attempt that ends by itself also breaks its work item's run of consecutive executor deaths."""
    n = tx.execute(
        "UPDATE attempts SET state = 'ended', ended_at = ?, end_reason = ? WHERE attempt_id = ? AND state = 'running'",
        (time.time(), reason, attempt["attempt_id"]),
    )
    if n:
        bump_commit_point(tx, attempt["work_id"])
        lose_requests(tx, attempt["attempt_id"])
        tx.execute("UPDATE work_items SET recovery_attempts = 0 WHERE work_id = ? AND recovery_attempts != 0",
                   (attempt["work_id"],))


def live_attempts(tx: Tx) -> int:
    return int(tx.scalar("SELECT COUNT(*) AS n FROM attempts WHERE state IN ('admitted', 'running')") or 0)


def attempt_ended(tx: Tx, attempt_id: str) -> bool:
    """Whether the attempt is no longer running (it ended, died or was fenced)."""
    return tx.one("SELECT attempt_id FROM attempts WHERE attempt_id = ? AND state != 'running'",
                  (attempt_id,)) is not None


# --------------------------------------------------------------------------- effects


def set_effect_state(tx: Tx, eff: Row, state: EffectState, result: str | None = None) -> None:
    now = time.time()
    tx.execute(
        "UPDATE effects SET state = ?, result = COALESCE(?, result), ended_at = ? WHERE effect_id = ?",
        (str(state), result, now, eff["effect_id"]),
    )
    eff["state"] = str(state)
    emit(tx, "effect.state", {"call_id": eff["call_id"], "tool": eff["tool"], "state": str(state)},
         session_id=eff["session_id"], work_id=eff["work_id"])


def emit_draft(tx: Tx, session_id: str, work_id: str, request_id: str, text: str) -> None:
    """The text streamed so far for a request, for open views only (``assistant.draft``, whole text each
    time); the answer itself is committed with its receipt, never from drafts."""
    emit(tx, "assistant.draft", {"request_id": request_id, "text": text, "full": True}, session_id=session_id,
         work_id=work_id)


def open_effects_of_turn(tx: Tx, turn_id: str) -> list[Row]:
    """A turn's calls still to run or running (``planned`` / ``dispatched``), in order. A step reads only
    these (the partial index ``effects_open``): a turn with thousands of settled calls costs no more
    per step than one with none (issue 14)."""
    return _effect_rows(tx.all(OPEN_EFFECTS_SQL, (turn_id,)))


OPEN_EFFECTS_SQL = "SELECT * FROM effects WHERE turn_id = ? AND state IN ('planned', 'dispatched') ORDER BY seq"


def _effect_rows(rows: list[Row]) -> list[Row]:
    for r in rows:
        r["arguments"] = json.loads(r["arguments"])
        r["process"] = json.loads(r["process"]) if r["process"] else None
    return rows


def plan_call(tx: Tx, work: Row, turn_id: str, call_id: str, tool: str, arguments: dict[str, Any], *,
              capability: str, impl_identity: str, impl_digest: str, seq: int) -> None:
    """A tool call the model asked for: its effect record, ``planned`` (committed with the response)."""
    tx.execute(
        "INSERT INTO effects (effect_id, call_id, work_id, turn_id, session_id, tool, arguments, capability,"
        " impl_identity, impl_digest, state, created_at, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'planned', ?, ?)",
        (new_id("eff"), call_id, work["work_id"], turn_id, work["session_id"], tool, dumps(arguments), capability,
         impl_identity, impl_digest, time.time(), seq),
    )


def mark_dispatched(tx: Tx, eff: Row, attempt_id: str, approval: Row | None = None) -> None:
    """``planned`` → ``dispatched``, committed before the side effect starts, consuming its approval
    (if any) once. The caller fences first; a call no longer planned or an approval already used →
    ``FencedError``."""
    n = tx.execute(
        "UPDATE effects SET state = 'dispatched', dispatched_at = ?, attempt_id = ? WHERE effect_id = ?"
        " AND state = 'planned'",
        (time.time(), attempt_id, eff["effect_id"]),
    )
    if n != 1:
        raise FencedError(f"effect {eff['call_id']} is no longer planned")
    if approval is not None and tx.execute(
        "UPDATE approvals SET state = 'consumed', consumed_by_attempt = ? WHERE approval_id = ? AND state = 'approved'",
        (attempt_id, approval["approval_id"]),
    ) != 1:
        raise FencedError(f"approval {approval['approval_id']} was already consumed")


def turn_effect_states(tx: Tx, turn_id: str) -> list[Row]:
    return tx.all("SELECT tool, capability, state FROM effects WHERE turn_id = ?", (turn_id,))


def effects_of_work(tx: Tx, work_id: str) -> list[Row]:
    """A work item's calls in order, with results and times (evidence for acceptance)."""
    return tx.all("SELECT call_id, tool, arguments, state, result, dispatched_at, ended_at FROM effects"
                  " WHERE work_id = ? ORDER BY seq", (work_id,))


def dispatched_call_of_tool(tx: Tx, work_id: str, tool: str) -> Row | None:
    """The newest dispatched call of ``tool`` in a work item (the call a state tool runs as)."""
    return tx.one("SELECT call_id FROM effects WHERE work_id = ? AND tool = ? AND state = 'dispatched'"
                  " ORDER BY seq DESC LIMIT 1", (work_id, tool))


def reconcile_effect(tx: Tx, eff: Row, content: str, redacted: Sequence[str] = ()) -> bool:
    """A late verifiable receipt for an ``unknown`` effect: ``reconciled`` plus one reconciliation
    item (stable id ``reconcile:<call_id>``, so at most once). The old turn's items stay as they were.
    ``redacted`` names the credentials hidden from ``content`` (the item's ``meta.redacted``)."""
    meta: dict[str, Any] = {"effect_id": eff["effect_id"], "late_receipt": True}
    if redacted:
        meta["redacted"] = list(redacted)
    return _settle_effect(tx, eff, EffectState.UNKNOWN, EffectState.RECONCILED, content, ItemKind.RECONCILIATION,
                          f"reconcile:{eff['call_id']}", meta)


def _settle_effect(tx: Tx, eff: Row, before: EffectState, after: EffectState, content: str, kind: ItemKind,
                   item_id: str, meta: dict[str, Any] | None = None) -> bool:
    """``before`` → ``after`` with its result and one transcript item (stable ``item_id``), at most once."""
    n = tx.execute("UPDATE effects SET state = ?, result = ?, ended_at = ? WHERE effect_id = ? AND state = ?",
                   (str(after), content, time.time(), eff["effect_id"], str(before)))
    if n != 1:
        return False
    append_item(tx, eff["session_id"], kind, "tool", content, item_id=item_id, work_id=eff["work_id"],
                turn_id=eff["turn_id"], call_id=eff["call_id"], tool=eff["tool"], state=str(after), meta=meta)
    emit(tx, "effect.state", {"call_id": eff["call_id"], "tool": eff["tool"], "state": str(after)},
         session_id=eff["session_id"], work_id=eff["work_id"])
    return True


def request_cancel_tool(tx: Tx, session_id: str, effect_id: str) -> Row:
    """A person cancels one running call: a durable request the worker (or, after a crash, the
    Coordinator) acts on; the turn goes on with the cancelled result. 404 unknown, 409 not running."""
    # the call's effect id, or its call id (what a transcript item carries)
    eff = tx.one("SELECT * FROM effects WHERE (effect_id = ? OR call_id = ?) AND session_id = ?",
                 (effect_id, effect_id, session_id))
    if eff is None:
        raise NotFound(f"no tool call {effect_id} in session {session_id}")
    if eff["state"] != EffectState.DISPATCHED:
        raise VersionConflict(f"tool call {effect_id} is not running ({eff['state']})")
    tx.execute("UPDATE effects SET cancel_requested_at = COALESCE(cancel_requested_at, ?) WHERE effect_id = ?",
               (time.time(), eff["effect_id"]))
    emit(tx, "effect.cancel_requested", {"effect_id": eff["effect_id"], "call_id": eff["call_id"], "tool": eff["tool"]},
         session_id=session_id, work_id=eff["work_id"])
    return eff


def cancel_cause(tx: Tx, effect_id: str) -> str | None:
    """Why a running call must be cancelled now: ``stop`` (its work was stopped or ended), ``tool``
    (a person cancelled this call), or None."""
    row = tx.one(
        "SELECT e.cancel_requested_at, w.desired_state FROM effects e JOIN work_items w ON w.work_id = e.work_id"
        " WHERE e.effect_id = ?", (effect_id,),
    )
    if row is None:
        return None
    if row["desired_state"] == DesiredState.CANCELLED:
        return "stop"
    return "tool" if row["cancel_requested_at"] is not None else None


def tools_to_cancel(tx: Tx) -> list[Row]:
    """Running shell calls that a stop or a cancel request has condemned, with whether an attempt of a
    live worker still owns them (that worker cancels and commits; the Coordinator only makes sure)."""
    return tx.all(TOOLS_TO_CANCEL_SQL)


TOOLS_TO_CANCEL_SQL = (
    "SELECT e.*, w.desired_state, (SELECT COUNT(*) FROM attempts a WHERE a.attempt_id = e.attempt_id"
    " AND a.state = 'running') AS owned FROM effects e JOIN work_items w ON w.work_id = e.work_id"
    # the ``IN`` term lets SQLite read the partial index of open calls (effects_open), not every call
    " WHERE e.state IN ('planned', 'dispatched') AND e.state = 'dispatched' AND e.tool = 'shell'"
    " AND (w.desired_state = 'cancelled' OR e.cancel_requested_at IS NOT NULL) ORDER BY e.seq"
)


def commit_cancelled(tx: Tx, eff: Row, content: str, redacted: Sequence[str] = ()) -> bool:
    """A cancelled call's result (real exit status and the output so far), once; ``dispatched`` only.
    ``redacted`` names the credentials hidden from ``content`` (the item's ``meta.redacted``)."""
    return _settle_effect(tx, eff, EffectState.DISPATCHED, EffectState.CANCELLED, content, ItemKind.TOOL_RESULT,
                          f"result:{eff['call_id']}", {"redacted": list(redacted)} if redacted else None)


def unknown_effects(tx: Tx, work_id: str) -> list[Row]:
    """The unknown-effect set of a work item, scoped by conversation provenance: its own executions
    and those of the subtasks and Jobs it invoked, never every execution of an invoked session."""
    return tx.all(UNKNOWN_EFFECTS_SQL, (work_id, work_id, work_id))


# the partial index ``effects_unknown`` holds unknown outcomes only: an admission pass costs nothing per
# settled call (issue 14)
UNKNOWN_EFFECTS_SQL = (
    "SELECT effect_id, call_id, tool, arguments, capability FROM effects WHERE state = 'unknown'"
    " AND capability NOT IN ('read_only', 'state_probe') AND (work_id = ?"
    " OR work_id IN (SELECT work_id FROM work_items WHERE parent_work_id = ?)"
    " OR work_id IN (SELECT work_id FROM jobs WHERE caller_work_id = ?)) ORDER BY seq"
)


# --------------------------------------------------------------------------- approvals


# Why a control voids a pending approval: (reason_code, the sentence shown on the approval)
INVALIDATION_REASONS: dict[str, tuple[str, str]] = {
    "pause": (ReasonCode.USER_PAUSED, "Withdrawn because you paused this work; it is asked again if still needed after Resume."),
    "stop": (ReasonCode.USER_STOPPED, "Withdrawn because you stopped this work; the call will not run."),
    "resume": ("control_changed", "Withdrawn because the work was resumed; it is asked again if still needed."),
    "retry": ("control_changed", "Withdrawn because the work was retried; it is asked again if still needed."),
    "permissions": (ReasonCode.PERMISSION_REVOKED,
                    "Withdrawn because the session's permissions changed; it is asked again under the new permissions if still needed."),
}


def invalidate_approvals(tx: Tx, work_id: str, reason: str, reason_code: str = "control_changed") -> int:
    """Void every pending approval of a work item with a visible reason (state ``invalidated``)."""
    rows = tx.all(
        "SELECT approval_id, session_id, call_id, tool FROM approvals WHERE work_id = ? AND state = 'pending'", (work_id,)
    )
    for r in rows:
        tx.execute(
            "UPDATE approvals SET state = 'invalidated', reason = ?, decided_at = ? WHERE approval_id = ? AND state = 'pending'",
            (reason, time.time(), r["approval_id"]),
        )
        emit(tx, "approval.invalidated", {"approval_id": r["approval_id"], "call_id": r["call_id"], "tool": r["tool"],
                                          "reason_code": str(reason_code), "reason": reason},
             session_id=r["session_id"], work_id=work_id)
    return len(rows)


def unknown_effect_set(tx: Tx, work_id: str) -> list[dict[str, Any]]:
    """The unknown-effect set an approval is bound to: ``[{call_id, tool, arguments}]`` in call order.

    Raises when the records cannot be read (the caller then rejects the call, never dispatches it).
    """
    return [
        {"call_id": r["call_id"], "tool": r["tool"], "arguments": json.loads(r["arguments"])}
        for r in unknown_effects(tx, work_id)
    ]


def unknown_set_digest(unknown: list[dict[str, Any]]) -> str:
    return digest([u["call_id"] for u in unknown]) if unknown else ""


def request_approval(tx: Tx, work: Row, eff: Row, unknown: list[dict[str, Any]], reason: str) -> str:
    """A durable ``pending`` approval bound to the call (id, tool, arguments digest), the work item's
    control version and the digest of the unknown-effect set; ``approval.requested`` in the same tx."""
    aid = new_id("apr")
    tx.execute(
        "INSERT INTO approvals (approval_id, call_id, work_id, session_id, tool, arguments, arguments_digest,"
        " capability, control_version, unknown_set_digest, unknown_set, state, reason, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
        (aid, eff["call_id"], work["work_id"], work["session_id"], eff["tool"], dumps(eff["arguments"]),
         digest(eff["arguments"]), eff["capability"], work["control_version"], unknown_set_digest(unknown),
         dumps(unknown), reason, time.time()),
    )
    emit(tx, "approval.requested", {"approval_id": aid, "call_id": eff["call_id"], "tool": eff["tool"],
                                    "capability": eff["capability"], "reason": reason, "unknown_effects": unknown},
         session_id=work["session_id"], work_id=work["work_id"])
    return aid


def approval_view(row: Row) -> dict[str, Any]:
    """The REST shape of an approval (``GET /approvals``, snapshots)."""
    def parsed(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    return {
        "approval_id": row["approval_id"],
        "session_id": row["session_id"],
        "work_id": row["work_id"],
        "call_id": row["call_id"],
        "tool": row["tool"],
        "arguments": parsed(row["arguments"]),
        "arguments_digest": row["arguments_digest"],
        "capability": row["capability"],
        "reason": row["reason"],
        "state": row["state"],
        "unknown_effects": parsed(row["unknown_set"]),
        "unknown_set_digest": row["unknown_set_digest"],
        "control_version": row["control_version"],
        "created_at": row["created_at"],
        "decided_at": row["decided_at"],
        "consumed_by_attempt": row["consumed_by_attempt"],
    }


def supersede_approval(tx: Tx, approval: Row, reason: str) -> None:
    """Void one pending or approved-but-unused approval that no longer fits its call."""
    n = tx.execute(
        "UPDATE approvals SET state = 'invalidated', reason = ?, decided_at = ? WHERE approval_id = ?"
        " AND state IN ('pending', 'approved')",
        (reason, time.time(), approval["approval_id"]),
    )
    if n:
        emit(tx, "approval.invalidated", {"approval_id": approval["approval_id"], "call_id": approval["call_id"],
                                          "tool": approval["tool"], "reason_code": "unknown_effects_changed", "reason": reason},
             session_id=approval["session_id"], work_id=approval["work_id"])


def approval_for_call(tx: Tx, call_id: str) -> Row | None:
    return tx.one("SELECT * FROM approvals WHERE call_id = ? ORDER BY created_at DESC LIMIT 1", (call_id,))


def decide_approval(tx: Tx, approval_id: str, decision: str) -> Row:
    row = tx.one("SELECT * FROM approvals WHERE approval_id = ?", (approval_id,))
    if row is None:
        raise NotFound(f"approval {approval_id} not found")
    state = "approved" if decision == "approve" else "denied"
    n = tx.execute(
        "UPDATE approvals SET state = ?, decided_at = ? WHERE approval_id = ? AND state = 'pending'",
        (state, time.time(), approval_id),
    )
    if n != 1:
        raise VersionConflict(f"approval {approval_id} is no longer pending ({row['state']})")
    work = get_work(tx, row["work_id"])
    version = int(work["control_version"]) + 1
    tx.execute("UPDATE work_items SET control_version = ? WHERE work_id = ?", (version, work["work_id"]))
    work["control_version"] = version
    emit(tx, "approval.decided", {"approval_id": approval_id, "decision": state, "call_id": row["call_id"],
                                  "tool": row["tool"], "control_version": version},
         session_id=row["session_id"], work_id=row["work_id"])
    if work["desired_state"] == DesiredState.RUN and work["phase"] not in (Phase.DONE, Phase.CANCELLED):
        set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
    row["state"] = state
    return row


def list_approvals(tx: Tx, state: str | None, session_id: str | None = None) -> list[dict[str, Any]]:
    sql, params = "SELECT * FROM approvals WHERE 1 = 1", list[str]()
    if state:
        sql, params = sql + " AND state = ?", [*params, state]
    if session_id:
        sql, params = sql + " AND session_id = ?", [*params, session_id]
    return [approval_view(r) for r in tx.all(sql + " ORDER BY created_at", params)]


# --------------------------------------------------------------------------- outbox


# --------------------------------------------------------------------------- provider requests (usage attribution)


def record_request(
    tx: Tx, work: Row, *, request_id: str, attempt_id: str, turn_id: str, purpose: str, model: str,
    parent_request_id: str | None = None, service_tier: str | None = None,
    reserved_usd: float | None = None, reserved_tokens: int | None = None, reservation_ttl_s: float = 60.0,
) -> None:
    """Fix a request's attribution (and its budget reservation) before it is sent, in control.db and
    (through the outbox) usage.db."""
    now = time.time()
    goal_id, goal_revision = work.get("goal_id"), work.get("goal_revision")
    tx.execute(
        "INSERT INTO requests (request_id, session_id, work_id, turn_id, attempt_id, purpose, model, goal_id,"
        " goal_revision, state, created_at, reserved_usd, reserved_tokens, reservation_expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'sent', ?, ?, ?, ?)",
        (request_id, work["session_id"], work["work_id"], turn_id, attempt_id, purpose, model, goal_id, goal_revision,
         now, reserved_usd, reserved_tokens, now + reservation_ttl_s),
    )
    enqueue_outbox(tx, f"request:{request_id}", "usage.request", {
        **_attribution(tx, request_id, work), "parent_request_id": parent_request_id, "service_tier": service_tier,
    })


def _attribution(tx: Tx, request_id: str, work: Row | None = None) -> dict[str, Any]:
    r = tx.one("SELECT * FROM requests WHERE request_id = ?", (request_id,))
    if r is None:
        raise NotFound(f"request {request_id} not found")
    if work is None:
        work = tx.one("SELECT * FROM work_items WHERE work_id = ?", (r["work_id"],)) or {}
    return {
        "request_id": request_id, "attempt_id": r["attempt_id"], "session_id": r["session_id"], "work_id": r["work_id"],
        "turn_id": r["turn_id"], "goal_id": r["goal_id"], "goal_revision": r["goal_revision"],
        "job_id": work.get("job_id"), "reservation_id": work.get("reservation_id"), "purpose": r["purpose"],
        "provider": str(r["model"]).partition(":")[0], "model": r["model"], "created_at": r["created_at"],
    }


def settle_request(
    tx: Tx, request_id: str, usage: dict[str, Any] | None, *, error: str | None = None, partial: bool = False,
    prices: PriceTable | None = None,
) -> None:
    """The provider answered (or failed after reporting usage): one receipt, same key on every retry.
    The request row keeps what it consumed (tokens, and the quote when the price is known) for the
    hard-budget checks, which must not wait for the ledger."""
    known = Usage.model_validate(usage) if usage else None
    row = tx.one("SELECT model FROM requests WHERE request_id = ?", (request_id,))
    cost = prices.quote(str(row["model"]), known) if (known is not None and prices is not None and row) else None
    tx.execute(
        "UPDATE requests SET state = ?, error = ?, ended_at = ?, usage_known = ?, partial = ?, tokens = ?, cost_usd = ?"
        " WHERE request_id = ?",
        ("failed" if error else "received", error[:500] if error else None, time.time(), 1 if known else 0,
         1 if partial else 0, (known.input_tokens + known.output_tokens) if known else None, cost, request_id),
    )
    enqueue_outbox(tx, f"receipt:{request_id}", "usage.receipt", {
        **_attribution(tx, request_id), "usage": usage, "partial": partial,
    })


def lose_requests(tx: Tx, attempt_id: str) -> None:
    """The attempt ended or died while a request was out: its usage is unknown, not zero."""
    for r in tx.all("SELECT request_id FROM requests WHERE attempt_id = ? AND state = 'sent'", (attempt_id,)):
        lose_request(tx, r["request_id"])


def lose_request(tx: Tx, request_id: str, error: str | None = None) -> None:
    """No answer and no usage report (the connection or the process was lost): usage unknown."""
    tx.execute("UPDATE requests SET state = 'lost', usage_known = 0, error = COALESCE(?, error), ended_at = ?"
               " WHERE request_id = ?",
               (error[:500] if error else None, time.time(), request_id))
    enqueue_outbox(tx, f"lost:{request_id}", "usage.lost", _attribution(tx, request_id))


def failed_request_count(tx: Tx, turn_id: str) -> int:
    """Requests of a turn that failed or were lost (the provider retry's ordinal)."""
    return int(tx.scalar("SELECT COUNT(*) AS n FROM requests WHERE turn_id = ? AND state IN ('failed', 'lost')",
                         (turn_id,)) or 0)


def goal_has_requests(tx: Tx, goal_id: str) -> bool:
    return tx.one("SELECT request_id FROM requests WHERE goal_id = ? LIMIT 1", (goal_id,)) is not None


def goal_requests(tx: Tx, goal_id: str) -> list[Row]:
    """A Goal's requests with what each consumed or reserved (every purpose)."""
    return tx.all(
        "SELECT state, usage_known, partial, tokens, cost_usd, reserved_usd, reserved_tokens FROM requests"
        " WHERE goal_id = ?",
        (goal_id,),
    )


def active_time(tx: Tx, *, session_id: str | None = None, work_id: str | None = None,
                goal_id: str | None = None, now: float | None = None) -> dict[str, Any]:
    """Active time from the attempts' durable start/stop records (never reset by recovery).

    Pauses, approval waits and downtime have no running attempt, so they never count. A dead
    attempt counts up to its last heartbeat (a known lower bound); from there to when its death was
    discovered is an unknown interval, shown as such (discovery time is not stop time).
    """
    params: tuple[str | None, ...]
    if session_id:
        where, params = "session_id = ?", (session_id,)
    elif work_id:
        where, params = "work_id = ?", (work_id,)
    else:  # a Goal's work items are the ones its requests were attributed to
        where, params = "work_id IN (SELECT DISTINCT work_id FROM requests WHERE goal_id = ?)", (goal_id,)
    now = time.time() if now is None else now
    known = 0.0
    running = False
    unknown: list[dict[str, Any]] = []
    for a in tx.all(
        f"SELECT attempt_id, state, started_at, ended_at, heartbeat_at FROM attempts WHERE {where}"
        " AND started_at IS NOT NULL ORDER BY started_at",
        params,
    ):
        start = float(a["started_at"])
        if a["state"] == "running":
            known += max(0.0, now - start)
            running = True
        elif a["state"] == "dead":
            last = float(a["heartbeat_at"] or start)
            known += max(0.0, last - start)
            unknown.append({"attempt_id": a["attempt_id"], "from": last, "to": a["ended_at"]})
        elif a["ended_at"] is not None:
            known += max(0.0, float(a["ended_at"]) - start)
    return {"active_seconds": round(known, 3), "running": running, "unknown_intervals": unknown}


def enqueue_outbox(tx: Tx, op_key: str, kind: str, payload: dict[str, Any]) -> None:
    tx.execute(
        "INSERT INTO outbox (op_key, kind, payload, state, next_attempt_at, created_at) VALUES (?, ?, ?, 'pending', ?, ?)"
        " ON CONFLICT (op_key) DO NOTHING",
        (op_key, kind, dumps(payload), 0.0, time.time()),
    )


def due_outbox(tx: Tx, now: float, limit: int = 100) -> list[Row]:
    rows = tx.all(
        "SELECT * FROM outbox WHERE state = 'pending' AND next_attempt_at <= ? ORDER BY created_at LIMIT ?",
        (now, limit),
    )
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    return rows


def outbox_done(tx: Tx, op_key: str, payload: dict[str, Any]) -> None:
    n = tx.execute("UPDATE outbox SET state = 'done', done_at = ? WHERE op_key = ? AND state = 'pending'", (time.time(), op_key))
    if n:
        emit(tx, "usage.updated", {"op_key": op_key, "request_id": payload.get("request_id")},
             session_id=payload.get("session_id"), work_id=payload.get("work_id"))


def outbox_retry(tx: Tx, op_key: str, error: str, delay: float) -> None:
    tx.execute(
        "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? WHERE op_key = ?",
        (error[:500], time.time() + delay, op_key),
    )


def requeue_done_outbox(tx: Tx) -> int:
    """Every operation already applied to the usage ledger, pending again: a usage database that is
    new (deleted, or a fresh shared schema) is rebuilt from control.db's own record of them. Applying
    is idempotent per key, so nothing is counted twice."""
    return tx.execute("UPDATE outbox SET state = 'pending', next_attempt_at = 0, attempts = 0 WHERE state = 'done'")


def done_outbox_count(tx: Tx) -> int:
    return int(tx.scalar("SELECT COUNT(*) AS n FROM outbox WHERE state = 'done'") or 0)


def pending_outbox_count(tx: Tx) -> int:
    return int(tx.scalar("SELECT COUNT(*) AS n FROM outbox WHERE state = 'pending'") or 0)


# --------------------------------------------------------------------------- server state


def get_flag(tx: Tx, key: str) -> str | None:
    row = tx.one("SELECT value FROM server_state WHERE key = ?", (key,))
    return None if row is None else str(row["value"])


def set_flag(tx: Tx, key: str, value: str) -> None:
    tx.execute(
        "INSERT INTO server_state (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


__all__ = [
    "AttemptState",
    "FencedError",
    "NotFound",
    "VersionConflict",
]
