"""Effects and approvals: a tool call's effect record (``plan_call`` → ``mark_dispatched``, committed before
the side effect → ``set_effect_state`` with its result; ``commit_cancelled``, ``reconcile_effect``, a
person's ``settle_effect``), cancel requests, the unknown-effect set; approvals bound to the call, the work item's control version
and the digest of the unknown-effect set (``request_approval``, ``decide_approval``,
``invalidate_approvals``, ``supersede_approval``), consumed once by ``mark_dispatched``.

Functions take a ``Tx`` and run inside the caller's single transaction; each state change writes its event
row in the same transaction (``shared.emit``). Other aggregates are called through their module
(``sessions.set_phase``), never imported by name, so a test's wrapper of a transition
(``tests/faultstore.py``) sees every call. Callers outside ``store/`` use the facade ``control``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from jupyter_goals.models import DesiredState, EffectState, ItemKind, Phase, ReasonCode
from jupyter_goals.store import sessions, shared, transcript
from jupyter_goals.store.db import FencedError, NotFound, Row, Tx, VersionConflict

__all__ = [
    "set_effect_state",
    "open_effects_of_turn",
    "OPEN_EFFECTS_SQL",
    "plan_call",
    "mark_dispatched",
    "turn_effect_states",
    "effects_of_work",
    "dispatched_call_of_tool",
    "reconcile_effect",
    "SETTLED_WORDS",
    "effect_to_settle",
    "shell_call_host",
    "settle_effect",
    "lift_unknown_restriction",
    "request_cancel_tool",
    "cancel_cause",
    "tools_to_cancel",
    "TOOLS_TO_CANCEL_SQL",
    "commit_cancelled",
    "unknown_effects",
    "UNKNOWN_EFFECTS_SQL",
    "INVALIDATION_REASONS",
    "invalidate_approvals",
    "unknown_effect_set",
    "unknown_set_digest",
    "request_approval",
    "approval_view",
    "supersede_approval",
    "approval_for_call",
    "get_approval",
    "decide_approval",
    "list_approvals",
]


# --------------------------------------------------------------------------- effects


def set_effect_state(tx: Tx, eff: Row, state: EffectState, result: str | None = None) -> None:
    """A call settles: its terminal state, result and ``ended_at``. Its ``effects_open`` entry stays
    until a later step unlists it with others (``open_effects_of_turn``): this commit moves no index."""
    if state in (EffectState.PLANNED, EffectState.DISPATCHED):
        raise ValueError(f"{state} is not a settled state (see mark_dispatched)")
    now = time.time()
    tx.execute(
        "UPDATE effects SET state = ?, result = COALESCE(?, result), ended_at = ? WHERE effect_id = ?",
        (str(state), result, now, eff["effect_id"]),
    )
    eff["state"] = str(state)
    shared.emit(tx, "effect.state", {"call_id": eff["call_id"], "tool": eff["tool"], "state": str(state)},
         session_id=eff["session_id"], work_id=eff["work_id"])


#: settled calls a step finds still listed before it unlists them (one UPDATE for the batch)
UNLIST_AFTER = 32


def open_effects_of_turn(tx: Tx, turn_id: str, *, tidy: bool = False) -> list[Row]:
    """A turn's calls still to run or running (``planned`` / ``dispatched``), in order. A step reads only
    the calls listed in the partial index ``effects_open`` (issue 14: a turn with thousands of settled
    calls costs no more per step than one with none). Settling a call leaves it listed (so neither of a
    call's two commits moves an index entry); with ``tidy`` (a write transaction: the worker's step),
    once ``UNLIST_AFTER`` settled calls are listed they are unlisted together, so a step reads at most
    that many settled calls."""
    rows = tx.all(OPEN_EFFECTS_SQL, (turn_id,))
    open_rows = [r for r in rows if r["state"] in (EffectState.PLANNED, EffectState.DISPATCHED)]
    if tidy and len(rows) - len(open_rows) >= UNLIST_AFTER:
        tx.execute("UPDATE effects SET listed = NULL WHERE turn_id = ? AND listed = 1"
                   " AND state NOT IN ('planned', 'dispatched')", (turn_id,))
    return _effect_rows(open_rows)


OPEN_EFFECTS_SQL = "SELECT * FROM effects WHERE turn_id = ? AND listed = 1 ORDER BY seq"


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
        (shared.new_id("eff"), call_id, work["work_id"], turn_id, work["session_id"], tool, shared.dumps(arguments), capability,
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
    if not _settle_effect(tx, eff, EffectState.UNKNOWN, EffectState.RECONCILED, content, ItemKind.RECONCILIATION,
                          f"reconcile:{eff['call_id']}", meta):
        return False
    lift_unknown_restriction(tx, eff)
    return True


#: what the transcript says of a person's answer (``settle``); the model reads ``repair.settled_text``
SETTLED_WORDS: dict[str, str] = {"ran": "You said it ran.", "did_not_run": "You said it did not run."}


def effect_to_settle(tx: Tx, session_id: str, effect_id: str) -> Row:
    """The call a person settles, by its effect id or its call id (what a transcript item carries): 404 when
    no call has it, 409 when it is another session's or its outcome is no longer unknown."""
    eff = tx.one("SELECT * FROM effects WHERE effect_id = ? OR call_id = ?", (effect_id, effect_id))
    if eff is None:
        raise NotFound(f"no tool call {effect_id}")
    if eff["session_id"] != session_id:
        raise VersionConflict(f"tool call {effect_id} belongs to another session, not {session_id}")
    if eff["state"] != EffectState.UNKNOWN:
        raise VersionConflict(f"the outcome of {eff['tool']} ({eff['call_id']}) is not unknown any more"
                              f" ({eff['state']}): there is nothing to settle")
    return eff


def shell_call_host(tx: Tx, eff: Row) -> str | None:
    """The host whose files hold a call's evidence: the host of the worker that dispatched it, else its
    work's host (only that host may read them: a late receipt is reported by the host that ran it)."""
    row = tx.one(
        "SELECT COALESCE(k.host_name, i.host_name) AS host FROM effects e JOIN work_items i ON i.work_id = e.work_id"
        " LEFT JOIN attempts a ON a.attempt_id = e.attempt_id LEFT JOIN workers k ON k.worker_id = a.worker_id"
        " WHERE e.effect_id = ?", (eff["effect_id"],))
    return None if row is None else str(row["host"])


def settle_effect(tx: Tx, eff: Row, outcome: str, by: str, evidence: str | None = None,
                  redacted: Sequence[str] = ()) -> tuple[float, list[str]]:
    """A person's durable reconciliation of an ``unknown`` call: ``reconciled`` with one ``reconciliation``
    item (stable id ``reconcile:<call_id>``, the one a late receipt would have) whose words say what they
    answered (``SETTLED_WORDS``), or for ``check`` the ``evidence`` read again; ``meta``: the answer
    (``settled``), who (``by``) and when (``at``). Then the approvals asked only because of unknown outcomes
    are withdrawn (``lift_unknown_restriction``) and ``effect.settled`` is written. 409 when the outcome is
    no longer unknown (another answer or a late receipt came first). → (when, withdrawn approval ids)."""
    at = time.time()
    meta: dict[str, Any] = {"effect_id": eff["effect_id"], "settled": outcome, "by": by, "at": at}
    if outcome == "check":
        meta["late_receipt"] = True
    if redacted:
        meta["redacted"] = list(redacted)
    text = (evidence or "") if outcome == "check" else SETTLED_WORDS[outcome]
    if not _settle_effect(tx, eff, EffectState.UNKNOWN, EffectState.RECONCILED, text, ItemKind.RECONCILIATION,
                          f"reconcile:{eff['call_id']}", meta):
        raise VersionConflict(f"the outcome of {eff['tool']} ({eff['call_id']}) is not unknown any more:"
                              " there is nothing to settle")
    withdrawn = lift_unknown_restriction(tx, eff)
    shared.emit(tx, "effect.settled", {"effect_id": eff["effect_id"], "call_id": eff["call_id"], "tool": eff["tool"],
                                       "outcome": outcome, "by": by, "withdrawn": withdrawn},
                session_id=eff["session_id"], work_id=eff["work_id"])
    return at, withdrawn


def lift_unknown_restriction(tx: Tx, eff: Row) -> list[str]:
    """``eff``'s outcome is known now: every pending approval bound to an unknown-effect set holding it (asked
    while it was unknown) is withdrawn, and its work queued again with a new control version (as after a
    decision), so that its call is checked again under the chat's permissions: with no unknown outcome left
    open, bypass runs it; otherwise a fresh approval is asked, bound to the set as it is now. → the ids."""
    withdrawn: list[str] = []
    for ap in tx.all("SELECT * FROM approvals WHERE state = 'pending' AND unknown_set_digest != ''"):
        if eff["call_id"] not in {u.get("call_id") for u in json.loads(ap["unknown_set"] or "[]")}:
            continue
        supersede_approval(tx, ap, f"Withdrawn because the outcome of {eff['tool']} ({eff['call_id']}) is known now;"
                           " this call is checked again under the chat's permissions and asked again only if they"
                           " need it.")
        work = sessions.get_work(tx, ap["work_id"])
        version = int(work["control_version"]) + 1
        tx.execute("UPDATE work_items SET control_version = ? WHERE work_id = ?", (version, work["work_id"]))
        work["control_version"] = version
        if work["desired_state"] == DesiredState.RUN and work["phase"] not in (Phase.DONE, Phase.CANCELLED):
            sessions.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
        withdrawn.append(ap["approval_id"])
    return withdrawn


def _settle_effect(tx: Tx, eff: Row, before: EffectState, after: EffectState, content: str, kind: ItemKind,
                   item_id: str, meta: dict[str, Any] | None = None) -> bool:
    """``before`` → ``after`` with its result and one transcript item (stable ``item_id``), at most once."""
    n = tx.execute("UPDATE effects SET state = ?, result = ?, ended_at = ? WHERE effect_id = ? AND state = ?",
                   (str(after), content, time.time(), eff["effect_id"], str(before)))
    if n != 1:
        return False
    transcript.append_item(tx, eff["session_id"], kind, "tool", content, item_id=item_id, work_id=eff["work_id"],
                turn_id=eff["turn_id"], call_id=eff["call_id"], tool=eff["tool"], state=str(after), meta=meta)
    shared.emit(tx, "effect.state", {"call_id": eff["call_id"], "tool": eff["tool"], "state": str(after)},
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
    shared.emit(tx, "effect.cancel_requested", {"effect_id": eff["effect_id"], "call_id": eff["call_id"], "tool": eff["tool"]},
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


def tools_to_cancel(tx: Tx, host: str | None = None) -> list[Row]:
    """Running shell calls that a stop or a cancel request has condemned, with whether an attempt of a
    live worker still owns them (that worker cancels and commits; the Coordinator only makes sure); of
    ``host``'s work only, when given (a host never signals another host's process)."""
    if host is None:
        return tx.all(TOOLS_TO_CANCEL_SQL)
    return tx.all(TOOLS_TO_CANCEL_SQL.replace(" ORDER BY e.seq", " AND w.host_name = ? ORDER BY e.seq"), (host,))


TOOLS_TO_CANCEL_SQL = (
    "SELECT e.*, w.desired_state, (SELECT COUNT(*) FROM attempts a WHERE a.attempt_id = e.attempt_id"
    " AND a.state = 'running') AS owned FROM effects e JOIN work_items w ON w.work_id = e.work_id"
    # ``listed = 1`` lets SQLite read the partial index of open calls (effects_open), not every call
    " WHERE e.listed = 1 AND e.state = 'dispatched' AND e.tool = 'shell'"
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
        shared.emit(tx, "approval.invalidated", {"approval_id": r["approval_id"], "call_id": r["call_id"], "tool": r["tool"],
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
    return shared.digest([u["call_id"] for u in unknown]) if unknown else ""


def request_approval(tx: Tx, work: Row, eff: Row, unknown: list[dict[str, Any]], reason: str) -> str:
    """A durable ``pending`` approval bound to the call (id, tool, arguments digest), the work item's
    control version and the digest of the unknown-effect set; ``approval.requested`` in the same tx."""
    aid = shared.new_id("apr")
    tx.execute(
        "INSERT INTO approvals (approval_id, call_id, work_id, session_id, tool, arguments, arguments_digest,"
        " capability, control_version, unknown_set_digest, unknown_set, state, reason, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
        (aid, eff["call_id"], work["work_id"], work["session_id"], eff["tool"], shared.dumps(eff["arguments"]),
         shared.digest(eff["arguments"]), eff["capability"], work["control_version"], unknown_set_digest(unknown),
         shared.dumps(unknown), reason, time.time()),
    )
    shared.emit(tx, "approval.requested", {"approval_id": aid, "call_id": eff["call_id"], "tool": eff["tool"],
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
        shared.emit(tx, "approval.invalidated", {"approval_id": approval["approval_id"], "call_id": approval["call_id"],
                                          "tool": approval["tool"], "reason_code": "unknown_effects_changed", "reason": reason},
             session_id=approval["session_id"], work_id=approval["work_id"])


def approval_for_call(tx: Tx, call_id: str) -> Row | None:
    return tx.one("SELECT * FROM approvals WHERE call_id = ? ORDER BY created_at DESC LIMIT 1", (call_id,))


def get_approval(tx: Tx, approval_id: str) -> dict[str, Any]:
    """One approval as ``list_approvals`` shows it (``GET /approvals/{id}``); NotFound when unknown."""
    row = tx.one("SELECT * FROM approvals WHERE approval_id = ?", (approval_id,))
    if row is None:
        raise NotFound(f"approval {approval_id} not found")
    return approval_view(row)


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
    work = sessions.get_work(tx, row["work_id"])
    version = int(work["control_version"]) + 1
    tx.execute("UPDATE work_items SET control_version = ? WHERE work_id = ?", (version, work["work_id"]))
    work["control_version"] = version
    shared.emit(tx, "approval.decided", {"approval_id": approval_id, "decision": state, "call_id": row["call_id"],
                                  "tool": row["tool"], "control_version": version},
         session_id=row["session_id"], work_id=row["work_id"])
    if work["desired_state"] == DesiredState.RUN and work["phase"] not in (Phase.DONE, Phase.CANCELLED):
        sessions.set_phase(tx, work, Phase.QUEUED, ReasonCode.QUEUED)
    row["state"] = state
    return row


def list_approvals(tx: Tx, state: str | None, session_id: str | None = None) -> list[dict[str, Any]]:
    sql, params = "SELECT * FROM approvals WHERE 1 = 1", list[str]()
    if state:
        sql, params = sql + " AND state = ?", [*params, state]
    if session_id:
        sql, params = sql + " AND session_id = ?", [*params, session_id]
    return [approval_view(r) for r in tx.all(sql + " ORDER BY created_at", params)]
