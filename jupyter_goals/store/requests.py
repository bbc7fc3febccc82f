"""Provider requests and usage attribution: ``record_request`` fixes a request's attribution and budget
reservation before it is sent; ``settle_request`` (answered, or a lower bound) and ``lose_request(s)``
(usage unknown, never zero) record what came back. Each queues its usage-ledger operation in the
outbox (``enqueue_outbox`` … ``outbox_done``; applied to usage.db by ``outbox.py``). Also the
reads behind hard budgets (``goal_requests``) and ``active_time``.

Functions take a ``Tx`` and run inside the caller's single transaction; each state change writes its event
row in the same transaction (``shared.emit``). Other aggregates are called through their module
(``sessions.set_phase``), never imported by name, so a test's wrapper of a transition
(``tests/faultstore.py``) sees every call. Callers outside ``store/`` use the facade ``control``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_goals.models import Usage
from jupyter_goals.store import shared
from jupyter_goals.store.db import NotFound, Row, Tx

__all__ = [
    "record_request",
    "settle_request",
    "request_model",
    "lose_requests",
    "lose_request",
    "failed_request_count",
    "goal_has_requests",
    "goal_requests",
    "active_time",
    "enqueue_outbox",
    "due_outbox",
    "outbox_done",
    "outbox_retry",
    "requeue_done_outbox",
    "done_outbox_count",
    "pending_outbox_count",
]


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


def request_model(tx: Tx, request_id: str) -> str | None:
    """The model a recorded request was sent to (what its caller prices it with)."""
    row = tx.one("SELECT model FROM requests WHERE request_id = ?", (request_id,))
    return str(row["model"]) if row else None


def settle_request(
    tx: Tx, request_id: str, usage: dict[str, Any] | None, *, error: str | None = None, partial: bool = False,
    cost_usd: float | None = None,
) -> None:
    """The provider answered (or failed after reporting usage): one receipt, same key on every retry.
    The request row keeps what it consumed (tokens, and ``cost_usd``, the quote its caller priced, when
    the price is known) for the hard-budget checks, which must not wait for the ledger."""
    known = Usage.model_validate(usage) if usage else None
    cost = cost_usd if known is not None else None
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


# --------------------------------------------------------------------------- active time


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


# --------------------------------------------------------------------------- outbox


def enqueue_outbox(tx: Tx, op_key: str, kind: str, payload: dict[str, Any]) -> None:
    tx.execute(
        "INSERT INTO outbox (op_key, kind, payload, state, next_attempt_at, created_at) VALUES (?, ?, ?, 'pending', ?, ?)"
        " ON CONFLICT (op_key) DO NOTHING",
        (op_key, kind, shared.dumps(payload), 0.0, time.time()),
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
        shared.emit(tx, "usage.updated", {"op_key": op_key, "request_id": payload.get("request_id")},
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
