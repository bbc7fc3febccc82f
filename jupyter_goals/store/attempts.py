"""Workers, fencing, turns and attempts: worker registration, heartbeats and confirmed death
(``mark_worker_dead`` fences the generation: its attempts become dead, later writes are refused);
``fence()``, the read every attempt write starts with; the work item's commit point and the
continuation key; turns (``new_turn``, ``end_turn``) and attempts (``admit`` under a unique
continuation key, ``claim_attempt``, ``end_attempt``). The Coordinator's statements about executor
deaths and recovery claims live in ``recovery.py``.

Functions take a ``Tx`` and run inside the caller's single transaction; each state change writes its event
row in the same transaction (``shared.emit``). Other aggregates are called through their module
(``sessions.set_phase``), never imported by name, so a test's wrapper of a transition
(``tests/faultstore.py``) sees every call. Callers outside ``store/`` use the facade ``control``.
"""

from __future__ import annotations

import hashlib
import json
import time

from jupyter_goals.models import DesiredState, EffectState, ItemKind, Phase, ReasonCode, TurnState
from jupyter_goals.store import effects, requests, sessions, shared, transcript
from jupyter_goals.store.db import FencedError, Row, Tx, VersionConflict

__all__ = [
    "continuation_key",
    "register_worker",
    "heartbeat_worker",
    "mark_worker_dead",
    "mark_worker_stopped",
    "fence",
    "fence_with_run_state",
    "runs_as_admitted",
    "bump_commit_point",
    "open_turn",
    "rebind_planned_calls",
    "new_turn",
    "end_turn",
    "admit",
    "claim_attempt",
    "end_attempt",
    "live_attempts",
    "attempt_ended",
]


def continuation_key(work_id: str, control_version: int, commit_point: int) -> str:
    """sha256(work_id | control_version | predecessor commit point): unique in ``attempts``."""
    return hashlib.sha256(f"{work_id}|{control_version}|{commit_point}".encode()).hexdigest()


# --------------------------------------------------------------------------- workers and fencing


def register_worker(tx: Tx, worker_id: str, host: str, boot: str, pid: int, start_time: int | None, ttl: float) -> int:
    generation = shared.next_counter(tx, "worker_generation")
    now = time.time()
    tx.execute(
        "INSERT INTO workers (worker_id, generation, host_name, boot_id, pid, start_time, state, registered_at,"
        " heartbeat_at, lease_expires_at) VALUES (?, ?, ?, ?, ?, ?, 'live', ?, ?, ?)",
        (worker_id, generation, host, boot, pid, start_time, now, now, now + ttl),
    )
    shared.emit(tx, "worker.registered", {"worker_id": worker_id, "generation": generation, "pid": pid})
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
        requests.lose_requests(tx, a["attempt_id"])
    shared.emit(tx, "worker.dead", {"worker_id": worker["worker_id"], "generation": worker["generation"], "reason": reason})
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


def runs_as_admitted(work: Row, attempt: Row) -> bool:
    """The work still wants to run at the control version ``attempt`` was admitted under: no Pause, Stop
    or permission change since. Before any new model request or tool call (``work`` may be the row of
    ``fence_with_run_state``)."""
    return work["desired_state"] == "run" and int(work["control_version"]) == int(attempt["control_version"])


def fence_with_run_state(tx: Tx, attempt_id: str, generation: int) -> Row:
    """``fence``, and what a worker checks before each tool call, in one statement: whether the work still
    wants to run at its control version (``desired_state``, ``control_version``) and its
    ``permission_scope`` (three columns: the whole work row cost every call ~10 µs more)."""
    lock = "" if tx.dialect == "sqlite" else " FOR SHARE OF a"
    row = tx.one(
        "SELECT w.desired_state, w.control_version, w.permission_scope FROM attempts a"
        " JOIN work_items w ON w.work_id = a.work_id"
        " WHERE a.attempt_id = ? AND a.generation = ? AND a.state = 'running'" + lock,
        (attempt_id, generation),
    )
    if row is None:
        raise FencedError(f"attempt {attempt_id} (generation {generation}) is fenced")
    return row


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
        shared.emit(tx, "effect.rebound", {"work_id": work["work_id"], "calls": n}, session_id=work["session_id"],
             work_id=work["work_id"])
    return n


def new_turn(tx: Tx, work: Row, restricted: bool) -> str:
    tid = shared.new_id("turn")
    tx.execute(
        "INSERT INTO turns (turn_id, work_id, session_id, state, restricted, started_at) VALUES (?, ?, ?, 'running', ?, ?)",
        (tid, work["work_id"], work["session_id"], 1 if restricted else 0, time.time()),
    )
    shared.emit(tx, "turn.started", {"turn_id": tid, "restricted": restricted}, session_id=work["session_id"], work_id=work["work_id"])
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
        effects.set_effect_state(tx, eff, EffectState.NEVER_STARTED)
        transcript.append_item(
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
    shared.emit(tx, "turn.ended", {"turn_id": turn_id, "state": str(state), "reason": reason}, session_id=work["session_id"], work_id=work["work_id"])


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
        transcript.append_item(tx, work["session_id"], ItemKind.USER, "user", text, work_id=work["work_id"], turn_id=turn_id,
                    item_id=f"input:{work['work_id']}")
        sessions.consume_input(tx, work)
    aid = shared.new_id("att")
    now = time.time()
    tx.execute(
        "INSERT INTO attempts (attempt_id, turn_id, work_id, session_id, state, mode, control_version,"
        " continuation_key, admitted_at) VALUES (?, ?, ?, ?, 'admitted', ?, ?, ?, ?)",
        (aid, turn_id, work["work_id"], work["session_id"], str(mode), work["control_version"], key, now),
    )
    tx.execute("UPDATE sessions SET last_admitted_at = ? WHERE session_id = ?", (now, work["session_id"]))
    shared.emit(tx, "attempt.admitted", {"attempt_id": aid, "turn_id": turn_id, "mode": str(mode)}, session_id=work["session_id"], work_id=work["work_id"])
    sessions.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED if mode == "fresh" else ReasonCode.RECOVERED)
    row = tx.one("SELECT * FROM attempts WHERE attempt_id = ?", (aid,))
    assert row is not None
    return row


def claim_attempt(tx: Tx, worker_id: str, generation: int, host: str | None = None) -> Row | None:
    """A worker takes the oldest admitted attempt (of its ``host``'s work, when given: a host runs only
    its own work); the conditional update makes the claim exclusive, and checks the host again, so an
    attempt whose work was taken over meanwhile is not claimed."""
    if host is None:
        row = tx.one("SELECT * FROM attempts WHERE state = 'admitted' ORDER BY admitted_at LIMIT 1")
    else:
        row = tx.one("SELECT a.* FROM attempts a JOIN work_items w ON w.work_id = a.work_id"
                     " WHERE a.state = 'admitted' AND w.host_name = ? ORDER BY a.admitted_at LIMIT 1", (host,))
    if row is None:
        return None
    same_host = "" if host is None else " AND work_id IN (SELECT work_id FROM work_items WHERE host_name = ?)"
    n = tx.execute(
        "UPDATE attempts SET state = 'running', worker_id = ?, generation = ?, started_at = ?, heartbeat_at = ?"
        " WHERE attempt_id = ? AND state = 'admitted'" + same_host,
        (worker_id, generation, time.time(), time.time(), row["attempt_id"], *(() if host is None else (host,))),
    )
    if n != 1:
        return None
    row.update(state="running", worker_id=worker_id, generation=generation)
    work = sessions.get_work(tx, row["work_id"])
    # an attempt admitted before a pause/stop is claimed only to yield to that control: never show
    # paused or stopped work as working (the turn's first fenced read ends the attempt)
    if work["desired_state"] == DesiredState.RUN and int(work["control_version"]) == int(row["control_version"]):
        sessions.set_phase(tx, work, Phase.WORKING, ReasonCode.WORKING)
    return row


def end_attempt(tx: Tx, attempt: Row, reason: str) -> None:
    """An attempt that ends by itself also breaks its work item's run of consecutive executor deaths."""
    n = tx.execute(
        "UPDATE attempts SET state = 'ended', ended_at = ?, end_reason = ? WHERE attempt_id = ? AND state = 'running'",
        (time.time(), reason, attempt["attempt_id"]),
    )
    if n:
        bump_commit_point(tx, attempt["work_id"])
        requests.lose_requests(tx, attempt["attempt_id"])
        tx.execute("UPDATE work_items SET recovery_attempts = 0 WHERE work_id = ? AND recovery_attempts != 0",
                   (attempt["work_id"],))


def live_attempts(tx: Tx, host: str | None = None) -> int:
    """Admitted or running attempts (of ``host``'s work, when given: each host's own quota)."""
    if host is None:
        return int(tx.scalar("SELECT COUNT(*) AS n FROM attempts WHERE state IN ('admitted', 'running')") or 0)
    return int(tx.scalar("SELECT COUNT(*) AS n FROM attempts a JOIN work_items w ON w.work_id = a.work_id"
                         " WHERE a.state IN ('admitted', 'running') AND w.host_name = ?", (host,)) or 0)


def attempt_ended(tx: Tx, attempt_id: str) -> bool:
    """Whether the attempt is no longer running (it ended, died or was fenced)."""
    return tx.one("SELECT attempt_id FROM attempts WHERE attempt_id = ? AND state != 'running'",
                  (attempt_id,)) is not None
