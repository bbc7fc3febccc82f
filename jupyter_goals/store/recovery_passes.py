"""The recovery summary: what the last recovery pass after a server start did with each work item it
found unfinished or interrupted (``GET /recovery``).

Each reported item is a ``recovery_decisions`` row (``decision_key = pass:<pass_id>:<work_id>``,
``claimed_by = pass_id``, ``state = 'reported'``: the Coordinator's own ``recover:<attempt>`` claims
never match it), and ``server_state['recovery.last_pass']`` names the newest pass. A pass that found
nothing unfinished records nothing, so the summary keeps showing the last one that did.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_goals.models import RecoveryOutcome, reason_text, recovery_outcome
from jupyter_goals.store import control as c
from jupyter_goals.store.db import NotFound, Row, Tx

LAST_PASS = "recovery.last_pass"


def unfinished_work(tx: Tx, host: str | None = None) -> list[str]:
    """The work items a recovery pass starting now is about to decide on: the unfinished ones, and
    those with an attempt that was admitted or running when the server stopped (interrupted: a stopped
    chat whose command still ran, for one), oldest first; of ``host``'s work only, when given."""
    mine = "" if host is None else "host_name = ? AND "
    return [r["work_id"] for r in tx.all(
        f"SELECT work_id FROM work_items WHERE {mine}(phase NOT IN ('done', 'cancelled') OR work_id IN"
        " (SELECT work_id FROM attempts WHERE state IN ('admitted', 'running'))) ORDER BY created_at",
        () if host is None else (host,))]


IN_LIST = 500  # work ids per statement of ``record_pass`` (an IN-list, or the rows of one INSERT)


def record_pass(tx: Tx, pass_id: str, work_ids: list[str], *, host: str, boot: str,
                since: float = 0.0) -> dict[str, int]:
    """Write what the pass decided for each of ``work_ids`` (their state right after it; how an interrupted
    turn goes on, the recovery mode decided since ``since``; the calls whose outcome is unknown), in one
    transaction with the pass header and a ``recovery.summary`` event. Returns the counts. Reads and writes
    ``IN_LIST`` items per statement (issue 33: a pass over 1,000 items), the same rows as one item at a time."""
    now = time.time()
    counts = {o.value: 0 for o in RecoveryOutcome}
    for i in range(0, len(work_ids), IN_LIST):
        chunk = work_ids[i:i + IN_LIST]
        works, modes, unknown = _pass_facts(tx, chunk, since)
        rows: list[tuple[Any, ...]] = []
        for work_id in chunk:
            work = works.get(work_id)
            if work is None:
                raise NotFound(f"work item {work_id} not found")
            outcome = recovery_outcome(work["desired_state"], work["phase"])
            counts[outcome.value] += 1
            detail = {"outcome": outcome.value, "reason": work["reason"] or reason_text(work["reason_code"]),
                      "kind": work["kind"], "session_id": work["session_id"], "desired_state": work["desired_state"],
                      "mode": modes.get(work_id), "unknown": unknown.get(work_id, [])}
            rows.append((f"pass:{pass_id}:{work_id}", work_id, pass_id, work["phase"], work["reason_code"],
                         c.dumps(detail), work["control_version"], now, now))
        tx.execute(
            "INSERT INTO recovery_decisions (decision_key, work_id, claimed_by, state, mode, phase, reason_code, detail,"
            " control_version, created_at, updated_at) VALUES "
            + ", ".join("(?, ?, ?, 'reported', NULL, ?, ?, ?, ?, ?, ?)" for _ in rows)
            + " ON CONFLICT (decision_key) DO NOTHING",
            [v for row in rows for v in row],
        )
    header = c.dumps({"pass_id": pass_id, "at": now, "host_name": host, "boot_id": boot})
    c.set_flag(tx, LAST_PASS, header)
    c.set_flag(tx, f"{LAST_PASS}:{host}", header)  # each host of a shared store shows its own last pass
    c.emit(tx, "recovery.summary", {"pass_id": pass_id, "counts": counts})
    return counts


def _pass_facts(tx: Tx, work_ids: list[str], since: float) -> tuple[dict[str, Row], dict[str, str], dict[str, list[Row]]]:
    """For ``work_ids`` (at most ``IN_LIST``), in three statements: each work item; the recovery mode decided
    for its interrupted turn since ``since`` (``resume_checkpoint`` or ``new_turn``, the newest; absent when
    no turn of it was running); its calls whose outcome is unknown (``call_id``, ``tool``; oldest first)."""
    ids = list(dict.fromkeys(work_ids))
    marks = ", ".join("?" for _ in ids)
    works = {str(w["work_id"]): w for w in tx.all(f"SELECT * FROM work_items WHERE work_id IN ({marks})", ids)}
    modes: dict[str, str] = {}
    for r in tx.all(f"SELECT work_id, mode FROM recovery_decisions WHERE work_id IN ({marks}) AND decision_key LIKE ?"
                    " AND updated_at >= ? AND mode IN ('resume_checkpoint', 'new_turn') ORDER BY updated_at",
                    (*ids, "recover:%", since)):
        modes[str(r["work_id"])] = str(r["mode"])  # the newest wins
    unknown: dict[str, list[Row]] = {}
    for e in tx.all(f"SELECT work_id, call_id, tool FROM effects WHERE work_id IN ({marks}) AND state = 'unknown'"
                    " ORDER BY seq", ids):
        unknown.setdefault(str(e["work_id"]), []).append({"call_id": e["call_id"], "tool": e["tool"]})
    return works, modes, unknown


def last_pass(tx: Tx, host: str | None = None) -> tuple[dict[str, Any] | None, list[Row]]:
    """The newest recorded pass header (of ``host``, when given) and its rows (oldest work first), each
    with its session's title and the work item as it is now (for the actions a person can take from the
    summary)."""
    raw = c.get_flag(tx, LAST_PASS if host is None else f"{LAST_PASS}:{host}") or c.get_flag(tx, LAST_PASS)
    if not raw:
        return None, []
    header = json.loads(raw)
    if host is not None and header.get("host_name") != host:  # another host's pass (a store shared by hosts)
        return None, []
    rows = tx.all(
        "SELECT d.work_id, d.phase, d.reason_code, d.detail, d.created_at, s.session_id, s.title, w.kind AS w_kind,"
        " w.desired_state AS w_desired, w.phase AS w_phase, w.reason_code AS w_reason_code, w.created_at AS w_created,"
        " w.control_version AS w_control_version"
        " FROM recovery_decisions d JOIN work_items w ON w.work_id = d.work_id"
        " JOIN sessions s ON s.session_id = w.session_id WHERE d.claimed_by = ? AND d.state = 'reported'"
        " ORDER BY w.created_at",
        (header["pass_id"],),
    )
    for r in rows:
        r["detail"] = json.loads(r["detail"] or "{}")
    return header, rows
