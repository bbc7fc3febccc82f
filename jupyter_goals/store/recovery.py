"""Attempts, executor deaths and recovery claims: the statements the Coordinator's passes run.

Each function is one named transition or read inside the caller's transaction. A recovery claim is
one ``recovery_decisions`` row keyed ``recover:<attempt_id>`` (``claimed`` → ``decided`` →
``applied``); the recovery summary's ``pass:…`` rows live in ``recovery_passes.py``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_goals.models import Phase, ReasonCode
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Row, Tx

# --------------------------------------------------------------------------- executors and deaths


def live_workers(tx: Tx, host: str | None = None) -> list[Row]:
    """Workers registered as live (their death is confirmed by identity, not by this row); of ``host``
    only, when given."""
    if host is None:
        return tx.all("SELECT * FROM workers WHERE state = 'live'")
    return tx.all("SELECT * FROM workers WHERE state = 'live' AND host_name = ?", (host,))


def orphaned_attempts(tx: Tx, host: str | None = None) -> list[Row]:
    """Running attempts whose worker ended without releasing them (a crash during a graceful stop); of
    ``host``'s work only, when given."""
    return tx.all(
        "SELECT a.* FROM attempts a JOIN workers w ON a.worker_id = w.worker_id"
        " JOIN work_items i ON i.work_id = a.work_id"
        " WHERE a.state = 'running' AND w.state != 'live'" + _of_host("i", host), _host_param(host)
    )


def _of_host(alias: str, host: str | None) -> str:
    """The filter that keeps a host to its own work (DESIGN §3): the work item's ``host_name``."""
    return "" if host is None else f" AND {alias}.host_name = ?"


def _host_param(host: str | None) -> tuple[str, ...]:
    return () if host is None else (host,)


def mark_orphan_dead(tx: Tx, attempt: Row, now: float) -> None:
    """An orphaned attempt dies: its commit point moves and its open requests are lost."""
    tx.execute("UPDATE attempts SET state = 'dead', ended_at = ?, end_reason = 'worker ended' WHERE attempt_id = ?",
               (now, attempt["attempt_id"]))
    c.bump_commit_point(tx, attempt["work_id"])
    c.lose_requests(tx, attempt["attempt_id"])


def tool_in_flight(tx: Tx, turn_id: str) -> bool:
    """Whether the turn had a tool call ``dispatched`` (the death is charged to it)."""
    return tx.one(
        "SELECT effect_id FROM effects WHERE turn_id = ? AND state = 'dispatched' LIMIT 1", (turn_id,)
    ) is not None


def charge_death(tx: Tx, work: Row, attempt_id: str, worker_id: str, deaths: int, delay: float, now: float) -> None:
    """Charge one executor death to a work item: its consecutive-death count, its backoff, a note on
    the attempt and a ``recovery.charged`` event, in the transaction that confirms the death."""
    tx.execute("UPDATE work_items SET recovery_attempts = ?, next_attempt_at = ? WHERE work_id = ?",
               (deaths, now + delay if delay else 0, work["work_id"]))
    tx.execute("UPDATE attempts SET end_reason = COALESCE(end_reason, '') || ? WHERE attempt_id = ?",
               (f"; charged: death {deaths} in a row", attempt_id))
    c.emit(tx, "recovery.charged", {"attempt_id": attempt_id, "worker_id": worker_id,
                                    "recovery_attempts": deaths, "delay_s": delay},
           session_id=work["session_id"], work_id=work["work_id"])


def running_attempts_of_worker(tx: Tx, worker_id: str) -> list[Row]:
    return tx.all("SELECT * FROM attempts WHERE worker_id = ? AND state = 'running'", (worker_id,))


def hand_back(tx: Tx, worker_id: str) -> None:
    """A worker's graceful stop (SIGTERM): each attempt it still runs ends as a checkpoint (its requests
    still out become lost: usage unknown), its work queued again unless held; the worker is stopped."""
    for a in running_attempts_of_worker(tx, worker_id):
        c.end_attempt(tx, a, "worker shutdown")
        work = c.get_work(tx, a["work_id"])
        if work["desired_state"] == "run":
            c.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
    c.mark_worker_stopped(tx, worker_id)


# --------------------------------------------------------------------------- recovery claims


def unrecovered_attempts(tx: Tx, host: str | None = None) -> list[Row]:
    """Dead attempts whose recovery is not decided yet (no claim, or a claim not finished); of ``host``'s
    work only, when given. ``w_host``: the host of the worker that ran it (None: never claimed)."""
    return tx.all(
        "SELECT a.*, k.host_name AS w_host FROM attempts a JOIN work_items i ON i.work_id = a.work_id"
        " LEFT JOIN workers k ON k.worker_id = a.worker_id"
        " LEFT JOIN recovery_decisions d ON d.decision_key = 'recover:' || a.attempt_id"
        " WHERE a.state = 'dead' AND (d.state IS NULL OR d.state = 'claimed')" + _of_host("i", host)
        + " ORDER BY a.admitted_at", _host_param(host)
    )


def recovery_pending(tx: Tx, work_id: str) -> bool:
    """Whether a dead attempt of this work item still waits for its recovery decision."""
    return tx.one(
        "SELECT a.attempt_id FROM attempts a LEFT JOIN recovery_decisions d"
        " ON d.decision_key = 'recover:' || a.attempt_id WHERE a.work_id = ? AND a.state = 'dead'"
        " AND (d.state IS NULL OR d.state = 'claimed') LIMIT 1",
        (work_id,),
    ) is not None


def recovery_claim(tx: Tx, key: str) -> Row | None:
    return tx.one("SELECT * FROM recovery_decisions WHERE decision_key = ?", (key,))


def claim_recovery(tx: Tx, key: str, work: Row, claimant: str, now: float) -> None:
    """The first claim of a dead attempt's recovery (the key is unique: one owner)."""
    tx.execute(
        "INSERT INTO recovery_decisions (decision_key, work_id, claimed_by, state, control_version, created_at,"
        " updated_at) VALUES (?, ?, ?, 'claimed', ?, ?, ?)",
        (key, work["work_id"], claimant, work["control_version"], now, now),
    )


def take_over_claim(tx: Tx, key: str, claimant: str, now: float) -> None:
    """A dead claimant's unfinished claim passes to ``claimant``."""
    tx.execute("UPDATE recovery_decisions SET claimed_by = ?, updated_at = ? WHERE decision_key = ?",
               (claimant, now, key))


def record_recovery_decision(tx: Tx, key: str, mode: str, detail: dict[str, Any]) -> None:
    """The claim's one recovery mode is decided (the Coordinator emits ``recovery.decided`` beside it)."""
    tx.execute(
        "UPDATE recovery_decisions SET state = 'decided', mode = ?, updated_at = ?, detail = ? WHERE decision_key = ?",
        (str(mode), time.time(), c.dumps(detail), key),
    )


def apply_recovery_decisions(tx: Tx, work_id: str, now: float) -> None:
    """The work item was admitted: its decided recoveries are applied."""
    tx.execute(
        "UPDATE recovery_decisions SET state = 'applied', updated_at = ? WHERE work_id = ? AND state = 'decided'",
        (now, work_id),
    )


# --------------------------------------------------------------------------- a chunk of attempts, together

IN_LIST = 500  # ids per statement of the reads below (an IN-list)


def _by_ids(tx: Tx, sql: str, ids: list[str]) -> list[Row]:
    """``sql`` (with ``{marks}`` for an IN-list) run for the distinct non-null ``ids``, ``IN_LIST`` at a time."""
    distinct = [i for i in dict.fromkeys(ids) if i is not None]
    rows: list[Row] = []
    for i in range(0, len(distinct), IN_LIST):
        chunk = distinct[i:i + IN_LIST]
        rows += tx.all(sql.format(marks=", ".join("?" for _ in chunk)), chunk)
    return rows


def works_by_id(tx: Tx, work_ids: list[str]) -> dict[str, Row]:
    """``c.get_work`` of each of ``work_ids`` that exists, in one statement per ``IN_LIST`` ids."""
    return {str(w["work_id"]): w for w in _by_ids(tx, "SELECT * FROM work_items WHERE work_id IN ({marks})", work_ids)}


def claims_by_key(tx: Tx, keys: list[str]) -> dict[str, Row]:
    """``recovery_claim`` of each of ``keys`` that has one."""
    return {str(r["decision_key"]): r for r in _by_ids(
        tx, "SELECT * FROM recovery_decisions WHERE decision_key IN ({marks})", keys)}


def turns_by_id(tx: Tx, turn_ids: list[str]) -> dict[str, Row]:
    """``get_turn`` of each of ``turn_ids`` that exists."""
    return {str(t["turn_id"]): t for t in _by_ids(tx, "SELECT * FROM turns WHERE turn_id IN ({marks})", turn_ids)}


def open_effects_by_turn(tx: Tx, turn_ids: list[str]) -> dict[str, list[Row]]:
    """``c.open_effects_of_turn`` (without ``tidy``) of each of ``turn_ids``: its ``planned`` and
    ``dispatched`` calls in order, arguments and process parsed."""
    out: dict[str, list[Row]] = {t: [] for t in turn_ids}
    for e in _by_ids(tx, "SELECT * FROM effects WHERE turn_id IN ({marks}) AND listed = 1"
                         " AND state IN ('planned', 'dispatched') ORDER BY seq", turn_ids):
        e["arguments"] = json.loads(e["arguments"])
        e["process"] = json.loads(e["process"]) if e["process"] else None
        out.setdefault(str(e["turn_id"]), []).append(e)
    return out


def turns_with_tool_in_flight(tx: Tx, turn_ids: list[str]) -> set[str]:
    """The ones of ``turn_ids`` with a tool call ``dispatched`` (``tool_in_flight`` of each)."""
    return {str(r["turn_id"]) for r in _by_ids(
        tx, "SELECT DISTINCT turn_id FROM effects WHERE turn_id IN ({marks}) AND state = 'dispatched'", turn_ids)}


# --------------------------------------------------------------------------- facts for decide()


def get_turn(tx: Tx, turn_id: str) -> Row | None:
    return tx.one("SELECT * FROM turns WHERE turn_id = ?", (turn_id,))


def unknown_shell_effects(tx: Tx, host: str | None = None) -> list[Row]:
    """Shell calls whose outcome is unknown (a late exit file may settle them); with ``host``, those
    dispatched on that host (by one of its workers), whose exit files only it can read: after a
    takeover, the old host's late receipts are its own to report."""
    if host is None:
        return tx.all("SELECT * FROM effects WHERE state = 'unknown' AND tool = 'shell' ORDER BY seq")
    return tx.all(
        "SELECT e.* FROM effects e JOIN work_items i ON i.work_id = e.work_id"
        " LEFT JOIN attempts a ON a.attempt_id = e.attempt_id LEFT JOIN workers k ON k.worker_id = a.worker_id"
        " WHERE e.state = 'unknown' AND e.tool = 'shell' AND COALESCE(k.host_name, i.host_name) = ? ORDER BY e.seq",
        (host,),
    )


def unfinished_work(tx: Tx, host: str | None = None) -> list[Row]:
    """Every work item not done or cancelled, oldest first (the admission pass's input); of ``host``
    only, when given (each host admits, recovers and reconciles its own work)."""
    return tx.all("SELECT * FROM work_items WHERE phase NOT IN ('done', 'cancelled')" + _of_host("work_items", host)
                  + " ORDER BY created_at", _host_param(host))


def live_attempts_of(tx: Tx, work_id: str) -> list[Row]:
    """A work item's admitted or running attempts, with their worker's host and lease."""
    return tx.all(
        "SELECT a.*, w.host_name AS w_host, w.lease_expires_at AS w_lease FROM attempts a"
        " LEFT JOIN workers w ON a.worker_id = w.worker_id WHERE a.work_id = ? AND a.state IN ('admitted', 'running')"
        " ORDER BY a.admitted_at", (work_id,),
    )


def sessions_with_live_attempts(tx: Tx) -> set[str]:
    """Sessions with an admitted or running attempt (of any work item, finished or not)."""
    return {r["session_id"] for r in tx.all("SELECT DISTINCT session_id FROM attempts WHERE state IN ('admitted', 'running')")}


def planned_tool_digests(tx: Tx, turn_id: str) -> list[Row]:
    """The tool and implementation digest of each planned call of a turn."""
    return tx.all("SELECT tool, impl_digest FROM effects WHERE turn_id = ? AND state = 'planned'", (turn_id,))


def latest_attempt(tx: Tx, work_id: str) -> Row | None:
    return tx.one("SELECT state, control_version FROM attempts WHERE work_id = ? ORDER BY admitted_at DESC LIMIT 1",
                  (work_id,))


def works_with_pending_approval(tx: Tx) -> set[str]:
    """The work items with a ``pending`` approval, read once for a whole admission pass (one scan of the
    ``approvals_state`` index instead of one per work item, which grew with the number of items)."""
    return {str(r["work_id"]) for r in tx.all("SELECT DISTINCT work_id FROM approvals WHERE state = 'pending'")}


def has_pending_approval(tx: Tx, work_id: str) -> bool:
    return tx.one("SELECT approval_id FROM approvals WHERE work_id = ? AND state = 'pending' LIMIT 1",
                  (work_id,)) is not None


def pause_work(tx: Tx, work: Row) -> None:
    """``desired_state = paused`` without a control bump (automatic recovery is disabled)."""
    tx.execute("UPDATE work_items SET desired_state = 'paused' WHERE work_id = ?", (work["work_id"],))
    work["desired_state"] = "paused"


# --------------------------------------------------------------------------- one admission pass's reads


@dataclass
class PassReads:
    """What an admission pass reads about all the unfinished work of a host, in a few statements instead of
    about ten per work item (``recovery/facts.load_facts`` takes it; issue 33: a pass over 1,000 items).
    Each field answers what the per-item read of the same name answers."""

    sessions: dict[str, Row] = field(default_factory=dict)  # session_id → session (permissions parsed)
    live: dict[str, list[Row]] = field(default_factory=dict)  # live_attempts_of
    latest: dict[str, Row] = field(default_factory=dict)  # latest_attempt
    open_turns: dict[str, Row] = field(default_factory=dict)  # c.open_turn
    planned: dict[str, list[Row]] = field(default_factory=dict)  # planned_tool_digests, by turn
    open_waits: dict[str, int] = field(default_factory=dict)  # waits.open_wait_count
    unknown: dict[str, list[Row]] = field(default_factory=dict)  # c.unknown_effects
    recovery_pending: set[str] = field(default_factory=set)  # recovery_pending


_UNFINISHED = "SELECT work_id FROM work_items WHERE phase NOT IN ('done', 'cancelled')"


def pass_reads(tx: Tx, host: str | None = None) -> PassReads:
    """The reads of one admission pass over ``host``'s unfinished work (``unfinished_work``), together."""
    mine = _UNFINISHED + _of_host("work_items", host)
    p = _host_param(host)
    reads = PassReads()
    for s in tx.all("SELECT * FROM sessions WHERE session_id IN (SELECT session_id FROM work_items"
                    " WHERE phase NOT IN ('done', 'cancelled')" + _of_host("work_items", host) + ")", p):
        s["permissions"] = json.loads(s["permissions"])
        reads.sessions[s["session_id"]] = s
    for a in tx.all("SELECT a.*, w.host_name AS w_host, w.lease_expires_at AS w_lease FROM attempts a"
                    " LEFT JOIN workers w ON a.worker_id = w.worker_id WHERE a.state IN ('admitted', 'running')"
                    " ORDER BY a.admitted_at"):
        reads.live.setdefault(a["work_id"], []).append(a)
    for a in tx.all(f"SELECT work_id, state, control_version, admitted_at FROM attempts WHERE work_id IN ({mine})"
                    " ORDER BY admitted_at", p):
        reads.latest[a["work_id"]] = a  # the newest wins
    for t in tx.all("SELECT * FROM turns WHERE state = 'running' ORDER BY started_at"):
        reads.open_turns[t["work_id"]] = t  # the newest wins
    for e in tx.all("SELECT turn_id, tool, impl_digest FROM effects WHERE state = 'planned' AND turn_id IN"
                    " (SELECT turn_id FROM turns WHERE state = 'running')"):
        reads.planned.setdefault(e["turn_id"], []).append(e)
    for w in tx.all("SELECT work_id, COUNT(*) AS n FROM waits WHERE state = 'waiting' GROUP BY work_id"):
        reads.open_waits[w["work_id"]] = int(w["n"])
    reads.recovery_pending = {str(r["work_id"]) for r in tx.all(
        "SELECT DISTINCT a.work_id FROM attempts a LEFT JOIN recovery_decisions d"
        " ON d.decision_key = 'recover:' || a.attempt_id WHERE a.state = 'dead'"
        f" AND (d.state IS NULL OR d.state = 'claimed') AND a.work_id IN ({mine})", p)}
    # an unknown outcome counts for its own work item, its parent (a subtask's) and the caller of its Job
    # (effects.UNKNOWN_EFFECTS_SQL, per work item); unknown outcomes are few (a partial index holds them)
    unknown = tx.all("SELECT effect_id, call_id, tool, arguments, capability, work_id FROM effects"
                     " WHERE state = 'unknown' AND capability NOT IN ('read_only', 'state_probe') ORDER BY seq")
    if unknown:
        owners: dict[str, set[str]] = {str(e["work_id"]): {str(e["work_id"])} for e in unknown}
        marks = ", ".join("?" for _ in owners)
        for r in tx.all(f"SELECT work_id, parent_work_id FROM work_items WHERE work_id IN ({marks})"
                        " AND parent_work_id IS NOT NULL", tuple(owners)):
            owners[str(r["work_id"])].add(str(r["parent_work_id"]))
        for r in tx.all(f"SELECT work_id, caller_work_id FROM jobs WHERE work_id IN ({marks})"
                        " AND caller_work_id IS NOT NULL", tuple(owners)):
            owners[str(r["work_id"])].add(str(r["caller_work_id"]))
        for e in unknown:
            row = {k: e[k] for k in ("effect_id", "call_id", "tool", "arguments", "capability")}
            for owner in owners[str(e["work_id"])]:
                reads.unknown.setdefault(owner, []).append(row)
    return reads
