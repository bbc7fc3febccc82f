"""User controls, the top of the store's aggregates: ``apply_control`` (pause / resume / stop / retry: bumps
``control_version`` so every older decision is refused, voids pending approvals, reaches subtasks),
``finish_cancelled`` (a stop persists as cancelled), ``stop_all`` and ``change_permissions`` (with who added
each allow rule, when and how: ``record_allow_rules``, ``allow_rules``).

Functions take a ``Tx`` and run inside the caller's single transaction; each state change writes its event
row in the same transaction (``shared.emit``). Other aggregates are called through their module
(``sessions.set_phase``), never imported by name, so a test's wrapper of a transition
(``tests/faultstore.py``) sees every call. Callers outside ``store/`` use the facade ``control``.
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_goals.models import DesiredState, ItemKind, Phase, ReasonCode, TurnState
from jupyter_goals.store import attempts, effects, sessions, shared, transcript
from jupyter_goals.store.db import Row, Tx, VersionConflict

__all__ = [
    "CONTROL_TARGET",
    "apply_control",
    "finish_cancelled",
    "stop_all",
    "change_permissions",
    "record_allow_rules",
    "inherit_allow_rules",
    "allow_rules",
]


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
    if work["desired_state"] == DesiredState.CANCELLED and action != "stop":
        # a stop is final: the step still running when it was committed ends, and nothing else may turn
        # the intent back (a Pause and then a Resume would otherwise run stopped work again)
        raise VersionConflict(f"work {work['work_id']} is being stopped; a stop cannot be undone (start new work instead)")
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
    shared.emit(
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
            attempts.bump_commit_point(tx, work["work_id"])
    live = tx.scalar(
        "SELECT COUNT(*) AS n FROM attempts WHERE work_id = ? AND state IN ('admitted', 'running')", (work["work_id"],)
    )
    if desired == DesiredState.PAUSED:
        sessions.set_phase(tx, work, Phase.PAUSED, ReasonCode.USER_PAUSED)
    elif desired == DesiredState.CANCELLED and not live:
        finish_cancelled(tx, work)
    elif desired == DesiredState.CANCELLED:
        sessions.set_phase(tx, work, work["phase"], ReasonCode.USER_STOPPED)
    elif desired == DesiredState.RUN and not live:
        sessions.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
    elif desired == DesiredState.RUN and work["phase"] == Phase.PAUSED:
        # resumed while the paused step still runs: it is working (that attempt yields at its next
        # step boundary and the work is admitted again), never shown paused while its intent is run
        sessions.set_phase(tx, work, Phase.WORKING, ReasonCode.WORKING)
    code, sentence = effects.INVALIDATION_REASONS[action]
    effects.invalidate_approvals(tx, work["work_id"], sentence, code)
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
    """A stop persists as cancelled: the open turn ends interrupted, unstarted calls never start, and an
    answer the stop cut short keeps its streamed text (``meta.interrupted = "stopped"``) before the marker."""
    turns = tx.all("SELECT turn_id FROM turns WHERE work_id = ? AND state = 'running'", (work["work_id"],))
    for turn in turns:
        transcript.partial_answer(tx, work, turn["turn_id"], "stopped")
        attempts.end_turn(tx, work, turn["turn_id"], TurnState.INTERRUPTED, "user_stopped")
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
        transcript.append_item(tx, work["session_id"], ItemKind.INTERRUPTION, "system", text,
                    item_id=f"stopped:{work['work_id']}", work_id=work["work_id"], turn_id=turns[-1]["turn_id"],
                    meta={"reason_code": str(ReasonCode.USER_STOPPED)})
    sessions.set_phase(tx, work, Phase.CANCELLED, ReasonCode.USER_STOPPED)


def stop_all(tx: Tx) -> list[str]:
    rows = tx.all(
        "SELECT * FROM work_items WHERE desired_state IN ('run', 'paused') AND phase NOT IN ('done', 'cancelled')"
    )
    for work in rows:
        work = sessions.get_work(tx, work["work_id"])  # a parent's stop may already have stopped this subtask
        if work["desired_state"] != DesiredState.CANCELLED:
            apply_control(tx, work, "stop", None)
    return [r["work_id"] for r in rows]


def change_permissions(tx: Tx, session_id: str, permissions: dict[str, Any], expected_version: int | None,
                       by: str | None = None, via: str = "permissions") -> Row:
    """Save a session's new permission scope and carry it to its unfinished work items.

    Each such item gets the new scope and a bumped ``control_version`` (a running attempt yields at
    its next step and is re-admitted under the new scope); pending approvals are invalidated with
    reason ``permission_revoked``. ``expected_version`` is checked against the session's current work.
    An allow rule the change adds is recorded with ``by`` and ``via``; one it drops loses its record.
    """
    session = sessions.get_session(tx, session_id)
    current = sessions.current_work(tx, session_id)
    if expected_version is not None and (current is None or int(current["control_version"]) != expected_version):
        have = None if current is None else current["control_version"]
        raise VersionConflict(f"control_version is {have}, not {expected_version}; reload and try again")
    now = time.time()
    tx.execute("UPDATE sessions SET permissions = ?, updated_at = ? WHERE session_id = ?",
               (shared.dumps(permissions), now, session_id))
    record_allow_rules(tx, session_id, session["permissions"].get("allow") or [], permissions.get("allow") or [],
                       by, via, now)
    shared.emit(tx, "session.permissions", {"permissions": permissions}, session_id=session_id)
    code, sentence = effects.INVALIDATION_REASONS["permissions"]
    for work in tx.all("SELECT * FROM work_items WHERE session_id = ? AND phase NOT IN ('done', 'cancelled')", (session_id,)):
        version = int(work["control_version"]) + 1
        tx.execute("UPDATE work_items SET permission_scope = ?, control_version = ?, updated_at = ? WHERE work_id = ?",
                   (shared.dumps(permissions), version, now, work["work_id"]))
        work["control_version"] = version
        shared.emit(tx, "work.control", {"action": "permissions", "desired_state": work["desired_state"], "control_version": version},
             session_id=session_id, work_id=work["work_id"])
        if effects.invalidate_approvals(tx, work["work_id"], sentence, code) and work["desired_state"] == DesiredState.RUN:
            sessions.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
        # a subtask never holds more authority than its parent: its session follows the new scope
        for child in tx.all("SELECT session_id FROM work_items WHERE parent_work_id = ? AND phase NOT IN ('done', 'cancelled')",
                            (work["work_id"],)):
            change_permissions(tx, child["session_id"], permissions, None, by, via)
    session = sessions.get_session(tx, session_id)
    return session


def record_allow_rules(tx: Tx, session_id: str, old: list[Any], new: list[Any], by: str | None, via: str,
                       now: float) -> None:
    """Provenance of a session's allow rules: a rule in ``new`` but not in ``old`` is recorded as added by
    ``by`` now (``via``: created, permissions, approval; ``by`` None: not recorded, it reads unknown); a rule
    ``new`` drops loses its record, so adding it again later records that time. A rule kept keeps its record
    (or stays unknown without one)."""
    before = {shared.dumps(rule) for rule in old}
    after = {shared.dumps(rule) for rule in new}
    for key in sorted(before - after):
        tx.execute("DELETE FROM allow_rules WHERE session_id = ? AND rule_key = ?", (session_id, key))
    for key in sorted(after - before) if by is not None else ():
        tx.execute(
            "INSERT INTO allow_rules (session_id, rule_key, added_by, via, added_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (session_id, rule_key) DO UPDATE SET added_by = excluded.added_by, via = excluded.via,"
            " added_at = excluded.added_at",
            (session_id, key, by, via, now))


def inherit_allow_rules(tx: Tx, session_id: str, parent_session_id: str, allow: list[Any]) -> None:
    """A session made from another (a subtask from its parent, a Job from its caller) with a copy of its
    permissions (``allow``): each copied rule keeps who added it to the parent and when, ``via =
    inherited``. A rule the parent has no record of stays unknown."""
    keys = {shared.dumps(rule) for rule in allow}
    for row in tx.all("SELECT rule_key, added_by, added_at FROM allow_rules WHERE session_id = ?", (parent_session_id,)):
        if row["rule_key"] in keys:
            tx.execute(
                "INSERT INTO allow_rules (session_id, rule_key, added_by, via, added_at) VALUES (?, ?, ?, 'inherited', ?)"
                " ON CONFLICT (session_id, rule_key) DO NOTHING",
                (session_id, row["rule_key"], row["added_by"], row["added_at"]))


def allow_rules(tx: Tx, session_id: str, allow: list[Any]) -> list[dict[str, Any]]:
    """Each rule of ``allow`` (the session's permissions) with who added it, when and how; ``None`` for
    all three where no record exists (a rule saved before records were kept)."""
    rows = {r["rule_key"]: r for r in tx.all(
        "SELECT rule_key, added_by, via, added_at FROM allow_rules WHERE session_id = ?", (session_id,))}
    out = []
    for rule in allow:
        row = rows.get(shared.dumps(rule))
        out.append({"rule": rule, "added_by": row["added_by"] if row else None,
                    "added_at": float(row["added_at"]) if row else None, "via": row["via"] if row else None})
    return out
