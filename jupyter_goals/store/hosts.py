"""Several hosts on one store (DESIGN §3): whether a host is reachable (its workers' leases), and the
statements of a takeover (a lost host's work moved to another host, its attempts fenced, a durable
record of who took what over and when).

A host is reachable while one of its workers holds an unexpired lease; it was last heard from at its
workers' newest heartbeat. Nothing here judges a process or an effect file: that is each host's own
business (``recovery/coordinator.py``), and another host's are never looked at.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from jupyter_goals.store import attempts, requests, shared
from jupyter_goals.store.db import Row, Tx

__all__ = [
    "HostPresence",
    "host_presence",
    "expired_hosts",
    "work_of_host",
    "move_work",
    "end_unstarted_attempt",
    "fence_attempt",
    "dispatched_calls",
    "fence_host_workers",
    "record_takeover",
    "takeovers_of",
]


@dataclass(frozen=True)
class HostPresence:
    """What the store knows of a host: ``lease_until`` the latest lease of its live workers (None: none
    live), ``last_seen`` its workers' newest heartbeat (None: no worker ever registered)."""

    host: str
    lease_until: float | None
    last_seen: float | None

    def reachable(self, now: float) -> bool:
        return self.lease_until is not None and self.lease_until >= now


def host_presence(tx: Tx, host: str) -> HostPresence:
    row = tx.one(
        "SELECT MAX(CASE WHEN state = 'live' THEN lease_expires_at END) AS lease_until, MAX(heartbeat_at) AS last_seen"
        " FROM workers WHERE host_name = ?",
        (host,),
    )
    lease = row["lease_until"] if row else None
    seen = row["last_seen"] if row else None
    return HostPresence(host, None if lease is None else float(lease), None if seen is None else float(seen))


def expired_hosts(tx: Tx, me: str, now: float) -> list[str]:
    """Other hosts with workers registered as live whose every lease has expired (automatic takeover,
    ``allow_cross_host_takeover``): a host stopped on purpose has no live worker and is not among them."""
    rows = tx.all(
        "SELECT host_name, MAX(lease_expires_at) AS lease_until FROM workers WHERE state = 'live' AND host_name != ?"
        " GROUP BY host_name",
        (me,),
    )
    return sorted(r["host_name"] for r in rows if float(r["lease_until"]) < now)


def work_of_host(tx: Tx, host: str, session_id: str | None = None) -> list[Row]:
    """``host``'s unfinished work items, oldest first; with ``session_id``, that session's and the
    subtasks its work spawned (they run in sessions of their own)."""
    sql = "SELECT * FROM work_items WHERE host_name = ? AND phase NOT IN ('done', 'cancelled')"
    if session_id is None:
        return tx.all(sql + " ORDER BY created_at", (host,))
    return tx.all(
        sql + " AND (session_id = ? OR parent_work_id IN (SELECT work_id FROM work_items WHERE session_id = ?))"
        " ORDER BY created_at",
        (host, session_id, session_id),
    )


def move_work(tx: Tx, work: Row, to_host: str) -> bool:
    """The work item belongs to ``to_host`` from now on (conditional: a concurrent takeover of the same
    item moves it once)."""
    n = tx.execute("UPDATE work_items SET host_name = ? WHERE work_id = ? AND host_name = ?",
                   (to_host, work["work_id"], work["host_name"]))
    if n:
        work["host_name"] = to_host
    return n == 1


def end_unstarted_attempt(tx: Tx, attempt: Row, reason: str) -> None:
    """An admitted attempt no worker claimed yet ends (its turn continues from the same checkpoint on
    the new host); a worker of the old host claiming it at this moment finds it gone."""
    n = tx.execute("UPDATE attempts SET state = 'ended', ended_at = ?, end_reason = ? WHERE attempt_id = ?"
                   " AND state = 'admitted'", (time.time(), reason, attempt["attempt_id"]))
    if n:
        attempts.bump_commit_point(tx, attempt["work_id"])


def fence_attempt(tx: Tx, attempt: Row, reason: str) -> bool:
    """A running attempt of the old host dies here: its worker's next write (``fence``) is refused, its
    requests still out are lost (usage unknown), and the commit point moves."""
    n = tx.execute("UPDATE attempts SET state = 'dead', ended_at = ?, end_reason = ? WHERE attempt_id = ?"
                   " AND state = 'running'", (time.time(), reason, attempt["attempt_id"]))
    if n:
        attempts.bump_commit_point(tx, attempt["work_id"])
        requests.lose_requests(tx, attempt["attempt_id"])
    return n == 1


def dispatched_calls(tx: Tx, turn_id: str) -> list[Row]:
    """A turn's calls committed ``dispatched``: on another host, so their outcome is unknown here."""
    return tx.all("SELECT * FROM effects WHERE turn_id = ? AND state = 'dispatched' ORDER BY seq", (turn_id,))


def fence_host_workers(tx: Tx, host: str, reason: str) -> list[str]:
    """Every worker of ``host`` still registered as live is fenced (its generation refused: a heartbeat
    that arrives later makes it exit). Its attempts are not touched here: the takeover moved their work."""
    rows = tx.all("SELECT worker_id, generation FROM workers WHERE host_name = ? AND state = 'live'", (host,))
    now = time.time()
    for w in rows:
        tx.execute("UPDATE workers SET state = 'dead', ended_at = ?, end_reason = ? WHERE worker_id = ? AND state = 'live'",
                   (now, reason, w["worker_id"]))
        shared.emit(tx, "worker.dead", {"worker_id": w["worker_id"], "generation": w["generation"], "reason": reason})
    return [str(w["worker_id"]) for w in rows]


def record_takeover(tx: Tx, work: Row, *, from_host: str, to_host: str, by: str, now: float,
                    detail: dict[str, Any]) -> str:
    """The durable record (a ``recovery_decisions`` row ``takeover:<work_id>:<id>``, state ``recorded``) and
    the ``work.taken_over`` event of one work item taken over: who, from which host to which, when."""
    key = f"takeover:{work['work_id']}:{shared.new_id('tko')}"
    record = {"from_host": from_host, "to_host": to_host, "by": by, "at": now, **detail}
    tx.execute(
        "INSERT INTO recovery_decisions (decision_key, work_id, claimed_by, state, mode, detail, control_version,"
        " created_at, updated_at) VALUES (?, ?, ?, 'recorded', 'takeover', ?, ?, ?, ?)",
        (key, work["work_id"], by, shared.dumps(record), work["control_version"], now, now),
    )
    shared.emit(tx, "work.taken_over", {"work_id": work["work_id"], "from_host": from_host, "to_host": to_host,
                                        "by": by, "unknown_calls": list(detail.get("unknown_calls", []))},
                session_id=work["session_id"], work_id=work["work_id"])
    return key


def takeovers_of(tx: Tx, work_id: str) -> list[dict[str, Any]]:
    """The takeover records of a work item, oldest first."""
    rows = tx.all("SELECT detail FROM recovery_decisions WHERE work_id = ? AND mode = 'takeover' AND state = 'recorded'"
                  " ORDER BY created_at", (work_id,))
    return [json.loads(r["detail"]) for r in rows]
