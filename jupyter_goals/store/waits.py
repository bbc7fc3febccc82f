"""Background Jobs, subtasks and durable waits: every jobs / work_results / waits statement.

A **wait** is a work item's durable dependency on a handle (for subtasks: the child's work_id). It
saves the waiter's ``work_id``, the Goal revision and control version it observed, the handle and a
unique consumption key, and moves ``waiting → ready → consumed``:

- ``notify_handle`` (completion, failure, cancellation) and ``reconcile_waits`` (missed notifications,
  timeouts; polled with backoff) turn ``waiting`` into ``ready`` with the outcome and result, once: a
  conditional update, so repeating a notification changes nothing. The result is saved whatever the
  waiter's state; ``may_wake`` decides whether the notification wakes the waiter (intent still
  ``run``, versions match, no other current execution, no other open wait). A pause, stop or Goal
  revision bumps the waiter's control version, so an old wakeup is refused; its result stays ``ready``
  and is delivered when the work next runs under the current version.
- ``deliver`` appends each ``ready`` result to the waiter's transcript (item ``delivery:<key>``) and
  marks it ``consumed`` in the same fenced transaction: exactly once across crashes.
- A query that fails or times out says nothing about the operation: the wait stays ``waiting``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_goals.models import DesiredState, ItemKind, Phase, ReasonCode
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import NotFound, Row, Tx, VersionConflict

MAX_SUBTASKS = 8  # per work item, counted from durable rows: a restart never grants more
RECONCILE_BACKOFF_BASE_S = 0.5
RECONCILE_BACKOFF_CAP_S = 30.0


class SpawnRefused(ValueError):
    """A subtask that may not be created (nested, over the limit): the tool's result, not a fault."""


# --------------------------------------------------------------------------- the wake rule (pure)


@dataclass(frozen=True)
class WakeFacts:
    desired_state: str
    control_version: int  # the waiter's, now
    observed_version: int  # saved on the wait when the waiter last observed it
    goal_revision: int
    observed_revision: int
    live_attempts: int  # admitted or running attempts of the waiter
    open_waits: int  # other waits of the waiter still ``waiting``


def may_wake(f: WakeFacts) -> tuple[bool, str]:
    """Whether a notification admits its waiter; otherwise why not (the result is kept either way)."""
    if f.desired_state != DesiredState.RUN:
        return False, "intent_not_run"
    if f.control_version != f.observed_version or f.goal_revision != f.observed_revision:
        return False, "stale_version"
    if f.live_attempts:
        return False, "execution_exists"
    if f.open_waits:
        return False, "other_waits_open"
    return True, ""


def reconcile_backoff(checks: int) -> float:
    return float(min(RECONCILE_BACKOFF_CAP_S, RECONCILE_BACKOFF_BASE_S * 2 ** max(0, checks)))


# --------------------------------------------------------------------------- waits


def consumption_key(work_id: str, kind: str, handle: str) -> str:
    return hashlib.sha256(f"{work_id}|{kind}|{handle}".encode()).hexdigest()


def open_wait(tx: Tx, work: Row, kind: str, handle: str, *, call_id: str | None = None,
              timeout_s: float | None = None) -> Row:
    now = time.time()
    wid = c.new_id("wait")
    key = consumption_key(work["work_id"], kind, handle)
    tx.execute(
        "INSERT INTO waits (wait_id, work_id, kind, handle, call_id, goal_revision, control_version, consumption_key,"
        " state, deadline_at, next_check_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'waiting', ?, ?, ?)",
        (wid, work["work_id"], kind, handle, call_id, int(work["objective_revision"] or 0), int(work["control_version"]),
         key, now + timeout_s if timeout_s else None, now, now),
    )
    c.emit(tx, "wait.opened", {"wait_id": wid, "kind": kind, "handle": handle, "call_id": call_id},
           session_id=work["session_id"], work_id=work["work_id"])
    row = tx.one("SELECT * FROM waits WHERE wait_id = ?", (wid,))
    assert row is not None
    return row


def waits_of(tx: Tx, work_id: str, state: str | None = None) -> list[Row]:
    if state is None:
        return tx.all("SELECT * FROM waits WHERE work_id = ? ORDER BY created_at", (work_id,))
    return tx.all("SELECT * FROM waits WHERE work_id = ? AND state = ? ORDER BY created_at, wait_id", (work_id, state))


def open_wait_count(tx: Tx, work_id: str) -> int:
    return int(tx.scalar("SELECT COUNT(*) AS n FROM waits WHERE work_id = ? AND state = 'waiting'", (work_id,)) or 0)


def observe(tx: Tx, work: Row) -> None:
    """The waiter (re)enters its wait under its current version: later notifications may wake it."""
    tx.execute("UPDATE waits SET control_version = ?, goal_revision = ? WHERE work_id = ? AND state = 'waiting'",
               (int(work["control_version"]), int(work["objective_revision"] or 0), work["work_id"]))


def _notify_wait(tx: Tx, wait: Row, outcome: str, result: str) -> dict[str, Any] | None:
    n = tx.execute(
        "UPDATE waits SET state = 'ready', outcome = ?, result = ?, notified_at = ? WHERE wait_id = ? AND state = 'waiting'",
        (outcome, result, time.time(), wait["wait_id"]),
    )
    if n != 1:
        return None  # a repeated notification: already saved, never admits twice
    work = c.get_work(tx, wait["work_id"])
    live = int(tx.scalar("SELECT COUNT(*) AS n FROM attempts WHERE work_id = ? AND state IN ('admitted', 'running')",
                         (work["work_id"],)) or 0)
    woke, why = may_wake(WakeFacts(
        desired_state=work["desired_state"], control_version=int(work["control_version"]),
        observed_version=int(wait["control_version"]), goal_revision=int(work["objective_revision"] or 0),
        observed_revision=int(wait["goal_revision"]), live_attempts=live, open_waits=open_wait_count(tx, work["work_id"]),
    ))
    if woke and work["phase"] not in (Phase.DONE, Phase.CANCELLED):
        c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)  # the Coordinator admits it with its continuation key
    c.emit(tx, "wait.notified", {"wait_id": wait["wait_id"], "handle": wait["handle"], "outcome": outcome,
                                 "woke": woke, "refused": why},
           session_id=work["session_id"], work_id=work["work_id"])
    return {"wait_id": wait["wait_id"], "work_id": work["work_id"], "woke": woke, "refused": why}


def notify_handle(tx: Tx, handle: str, outcome: str, result: str) -> list[dict[str, Any]]:
    """A completion / failure / cancellation of ``handle``: every wait on it becomes ``ready`` once."""
    out = []
    for wait in tx.all("SELECT * FROM waits WHERE handle = ? AND state = 'waiting'", (handle,)):
        note = _notify_wait(tx, wait, outcome, result)
        if note is not None:
            out.append(note)
    return out


def deliver(tx: Tx, work: Row, turn_id: str | None) -> int:
    """Append every ``ready`` result to the waiter's transcript and consume it, in the caller's
    (fenced) transaction; the stable item id makes a second delivery impossible."""
    delivered = 0
    for wait in waits_of(tx, work["work_id"], "ready"):
        n = tx.execute("UPDATE waits SET state = 'consumed', consumed_at = ? WHERE wait_id = ? AND state = 'ready'",
                       (time.time(), wait["wait_id"]))
        if n != 1:
            continue
        text = f"[subtask {wait['handle']} {wait['outcome']}]\n{wait['result'] or ''}"
        c.append_item(tx, work["session_id"], ItemKind.SUBTASK_RESULT, "user", text,
                      item_id=f"delivery:{wait['consumption_key']}", work_id=work["work_id"], turn_id=turn_id,
                      call_id=wait["call_id"], meta={"wait_id": wait["wait_id"], "handle": wait["handle"],
                                                     "outcome": wait["outcome"]})
        delivered += 1
    return delivered


def probe_handle(tx: Tx, wait: Row) -> tuple[str, str] | None:
    """The outcome of a wait's handle if it has one now (subtasks: the child's terminal phase)."""
    child = tx.one("SELECT work_id, phase, reason FROM work_items WHERE work_id = ?", (wait["handle"],))
    if child is None:
        return "failed", f"subtask {wait['handle']} does not exist"
    if child["phase"] == Phase.DONE:
        res = result_of(tx, wait["handle"])
        return "completed", "" if res is None else str(res["result"])
    if child["phase"] in (Phase.CANCELLED, Phase.FAILED):
        return str(child["phase"]), str(child["reason"])
    return None


def reconcile_waits(tx: Tx, now: float,
                    probe: Callable[[Tx, Row], tuple[str, str] | None] = probe_handle) -> list[dict[str, Any]]:
    """Find missed notifications and passed deadlines, each wait checked with a growing backoff.

    A probe that fails (or times out) leaves the wait ``waiting``: it does not mean the operation
    stopped. A deadline notifies ``timeout`` but does not stop the handle's work (its later result is
    still saved with the work item)."""
    notes: list[dict[str, Any]] = []
    for wait in tx.all("SELECT * FROM waits WHERE state = 'waiting' AND next_check_at <= ? ORDER BY created_at", (now,)):
        checks = int(wait["checks"]) + 1
        try:
            found = probe(tx, wait)
        except Exception as exc:
            tx.execute("UPDATE waits SET checks = ?, next_check_at = ?, last_error = ? WHERE wait_id = ?",
                       (checks, now + reconcile_backoff(checks), f"{type(exc).__name__}: {exc}"[:300], wait["wait_id"]))
            continue
        if found is None and wait["deadline_at"] is not None and now >= float(wait["deadline_at"]):
            found = ("timeout", f"No result from {wait['handle']} by its deadline; it may still be running"
                                " (a timeout does not mean it stopped).")
        if found is None:
            tx.execute("UPDATE waits SET checks = ?, next_check_at = ? WHERE wait_id = ?",
                       (checks, now + reconcile_backoff(checks), wait["wait_id"]))
            continue
        note = _notify_wait(tx, wait, *found)
        if note is not None:
            notes.append(note)
    return notes


# --------------------------------------------------------------------------- results


def save_result(tx: Tx, work: Row, outcome: str, text: str) -> None:
    """A Job's or subtask's result (its final assistant text), saved once, then its waiters notified."""
    tx.execute(
        "INSERT INTO work_results (work_id, outcome, result, created_at) VALUES (?, ?, ?, ?) ON CONFLICT (work_id) DO NOTHING",
        (work["work_id"], outcome, text, time.time()),
    )
    notify_handle(tx, work["work_id"], outcome, text)


def result_of(tx: Tx, work_id: str) -> Row | None:
    return tx.one("SELECT outcome, result, created_at FROM work_results WHERE work_id = ?", (work_id,))


def _goal_identity(tx: Tx, work: Row) -> tuple[str | None, int | None]:
    if work["kind"] == "goal":
        goal = g.goal_of_work(tx, work["work_id"])
        if goal is not None:
            return goal["goal_id"], int(goal["revision"])
    return work.get("goal_id"), work.get("goal_revision")


# --------------------------------------------------------------------------- subtasks


def spawn_child(tx: Tx, parent: Row, task: str, *, host: str, call_id: str | None = None,
                timeout_s: float | None = None) -> tuple[Row, Row]:
    """Create a subtask (its own session: cwd, model and the parent's permission scope) and the
    parent's wait on it, in the caller's transaction. The child inherits the parent's Goal and Job
    attribution; a subtask cannot start subtasks, and a work item starts at most ``MAX_SUBTASKS``."""
    if parent["kind"] == "subtask":
        raise SpawnRefused("a subtask cannot start subtasks")
    started = int(tx.scalar("SELECT COUNT(*) AS n FROM work_items WHERE parent_work_id = ?", (parent["work_id"],)) or 0)
    if started >= MAX_SUBTASKS:
        raise SpawnRefused(f"this work already started {started} subtasks (at most {MAX_SUBTASKS})")
    psession = c.get_session(tx, parent["session_id"])
    session = c.create_session(tx, f"Subtask: {task[:60]}", psession["cwd"], psession["model"],
                               json.loads(parent["permission_scope"]))
    c.inherit_allow_rules(tx, session["session_id"], psession["session_id"], session["permissions"].get("allow") or [])
    child = c.create_work(tx, session, "subtask", {"text": task}, auto_recover=bool(parent["auto_recover"]), host=host)
    goal_id, goal_revision = _goal_identity(tx, parent)
    tx.execute("UPDATE work_items SET parent_work_id = ?, goal_id = ?, goal_revision = ?, job_id = ? WHERE work_id = ?",
               (parent["work_id"], goal_id, goal_revision, parent.get("job_id"), child["work_id"]))
    wait = open_wait(tx, parent, "subtask", child["work_id"], call_id=call_id, timeout_s=timeout_s)
    return c.get_work(tx, child["work_id"]), wait


# --------------------------------------------------------------------------- jobs


def create_job(tx: Tx, caller_session_id: str, text: str, goal_id: str | None, client_request_id: str | None, *,
               host: str, auto_recover: bool) -> tuple[Row, bool]:
    """Commit a Job before it is acknowledged: its own session under the caller session's cwd, model and
    permissions (no broader), a work item of kind ``job``, and the Goal identity of the caller at this
    admission boundary (``goal_id``, else the caller session's active Goal). The caller session is
    provenance only, never a parent. A repeated ``client_request_id`` returns the first Job."""
    caller = c.get_session(tx, caller_session_id)
    if client_request_id:
        existing = tx.one("SELECT * FROM jobs WHERE caller_session_id = ? AND client_request_id = ?",
                          (caller_session_id, client_request_id))
        if existing is not None:
            return existing, False
    revision: int | None = None
    if goal_id:
        goal = g.get_goal(tx, goal_id)  # NotFound → 404
        if goal["state"] in ("achieved", "cancelled"):
            raise VersionConflict(f"goal {goal_id} already ended ({goal['state']})")
        revision = int(goal["revision"])
    else:
        current = g.current_goal(tx, caller_session_id)
        if current is not None and current["state"] == "active":
            goal_id, revision = current["goal_id"], int(current["revision"])
    caller_work = c.current_work(tx, caller_session_id)
    session = c.create_session(tx, f"Job: {text[:60]}", caller["cwd"], caller["model"], caller["permissions"])
    c.inherit_allow_rules(tx, session["session_id"], caller_session_id, session["permissions"].get("allow") or [])
    work = c.create_work(tx, session, "job", {"text": text}, auto_recover=auto_recover, host=host)
    job_id = c.new_id("job")
    tx.execute("UPDATE work_items SET goal_id = ?, goal_revision = ?, job_id = ? WHERE work_id = ?",
               (goal_id, revision, job_id, work["work_id"]))
    tx.execute(
        "INSERT INTO jobs (job_id, work_id, session_id, caller_session_id, caller_work_id, client_request_id, goal_id,"
        " goal_revision, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (job_id, work["work_id"], session["session_id"], caller_session_id,
         caller_work["work_id"] if caller_work else None, client_request_id, goal_id, revision, time.time()),
    )
    c.emit(tx, "job.created", {"job_id": job_id, "caller_session_id": caller_session_id, "goal_id": goal_id,
                               "goal_revision": revision}, session_id=session["session_id"], work_id=work["work_id"])
    row = tx.one("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
    assert row is not None
    return row, True


def get_job(tx: Tx, job_id: str) -> Row:
    row = tx.one("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return row


def job_view(tx: Tx, job: Row) -> dict[str, Any]:
    """The REST shape of a Job (``GET /jobs/{id}``): its work state, saved Goal identity and result."""
    work = c.get_work(tx, job["work_id"])
    result = result_of(tx, job["work_id"])
    return {
        "job_id": job["job_id"],
        "work_id": job["work_id"],
        "session_id": job["session_id"],
        "caller_session_id": job["caller_session_id"],
        "caller_work_id": job["caller_work_id"],
        "client_request_id": job["client_request_id"],
        "goal_id": job["goal_id"],
        "goal_revision": job["goal_revision"],
        "input": json.loads(work["input"]).get("text", ""),
        "work": c.work_view(work),
        "subtasks": [{"work_id": r["work_id"], "session_id": r["session_id"], "phase": r["phase"]}
                     for r in tx.all("SELECT work_id, session_id, phase FROM work_items WHERE parent_work_id = ?"
                                     " ORDER BY created_at", (job["work_id"],))],
        "result": None if result is None else {"outcome": result["outcome"], "text": result["result"],
                                               "created_at": result["created_at"]},
        "created_at": job["created_at"],
    }
