"""The transcript: append-only items per session (``append_item``: a given ``item_id`` is a stable repair
key, inserted at most once), reads and keyset pages by ``seq`` (``transcript_page``), the reads a turn
step makes of it (``last_item_of_turn``, ``response_has_calls``, ``last_reply``), the
``assistant.draft`` events of a streamed answer, and the partial answer an interruption keeps from them
(``partial_answer``: an assistant item ``partial:<request_id>`` with ``meta.interrupted``).

Functions take a ``Tx`` and run inside the caller's single transaction; each state change writes its event
row in the same transaction (``shared.emit``). Other aggregates are called through their module
(``sessions.set_phase``), never imported by name, so a test's wrapper of a transition
(``tests/faultstore.py``) sees every call. Callers outside ``store/`` use the facade ``control``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_goals.models import ItemKind, TranscriptItem
from jupyter_goals.store import shared
from jupyter_goals.store.db import Row, Tx

__all__ = [
    "append_item",
    "transcript",
    "transcript_page",
    "last_item_of_turn",
    "response_has_calls",
    "RESPONSE_CALLS_SQL",
    "last_reply",
    "emit_draft",
    "partial_answer",
    "PARTIAL_PREFIX",
]

#: the item id (and response id) prefix of an interrupted answer's partial text; such an item is never
#: the turn's answer (the turn goes on, or ended with its interruption marker)
PARTIAL_PREFIX = "partial:"


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
    item_id = item_id or shared.new_id("itm")
    seq = tx.insert_seq(
        "transcript",
        "transcript_seq",
        ("item_id", "session_id", "work_id", "turn_id", "kind", "role", "content", "call_id", "provider_call_id",
         "response_id", "tool", "arguments", "state", "meta", "created_at"),
        (item_id, session_id, work_id, turn_id, str(kind), role, content, call_id, provider_call_id, response_id, tool,
         None if arguments is None else shared.dumps(arguments), state, shared.dumps(meta or {}), time.time()),
        unique="item_id",
    )
    if seq is None:
        return None
    shared.emit(
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
                    before: int | None = None, work_id: str | None = None) -> dict[str, Any]:
    """One page of a transcript in seq order: the ``limit`` items after ``after``, or the ``limit``
    items just before ``before`` (``None`` for both: from the start). ``next_cursor`` (pass as
    ``after``) / ``prev_cursor`` (pass as ``before``) are set while newer / older items exist. Index
    seeks on (session_id, seq) only, so a page costs the same in a 20,000-item transcript. ``work_id``:
    only that work item's items (pages and cursors over them alone; the seek stays on (session_id, seq),
    the other work items' rows in between are skipped by the filter)."""
    only, args = ("", ()) if work_id is None else (" AND work_id = ?", (work_id,))
    if before is not None:
        rows = tx.all(f"SELECT * FROM transcript WHERE session_id = ?{only} AND seq < ? ORDER BY seq DESC LIMIT ?",
                      (session_id, *args, before, limit + 1))
        older = len(rows) > limit
        rows = rows[:limit][::-1]
        newer = bool(rows) and _has_item(tx, session_id, ">", rows[-1]["seq"], work_id)
    else:
        rows = tx.all(f"SELECT * FROM transcript WHERE session_id = ?{only} AND seq > ? ORDER BY seq LIMIT ?",
                      (session_id, *args, after or 0, limit + 1))
        newer = len(rows) > limit
        rows = rows[:limit]
        older = bool(rows) and _has_item(tx, session_id, "<", rows[0]["seq"], work_id)
    items = [_item(r) for r in rows]
    return {"items": [i.model_dump() for i in items],
            "next_cursor": items[-1].seq if newer else None,
            "prev_cursor": items[0].seq if older else None}


def with_call_states(tx: Tx, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``tool_call`` item's ``state`` set to its effect's state now (a tool call item is written
    ``planned``; a view opened while the call runs reads ``dispatched`` here, not from an event it never saw)."""
    ids = [i["call_id"] for i in items if i.get("kind") == "tool_call" and i.get("call_id")]
    if not ids:
        return items
    states = {r["call_id"]: r["state"] for r in tx.all(
        f"SELECT call_id, state FROM effects WHERE call_id IN ({', '.join('?' * len(ids))})", ids)}
    for i in items:
        if i.get("kind") == "tool_call" and i.get("call_id") in states:
            i["state"] = states[i["call_id"]]
    return items


def _has_item(tx: Tx, session_id: str, op: str, seq: int, work_id: str | None = None) -> bool:
    if work_id is not None:
        return tx.one(f"SELECT seq FROM transcript WHERE session_id = ? AND work_id = ? AND seq {op} ? LIMIT 1",
                      (session_id, work_id, seq)) is not None
    return tx.one(f"SELECT seq FROM transcript WHERE session_id = ? AND seq {op} ? LIMIT 1", (session_id, seq)) is not None


def last_item_of_turn(tx: Tx, turn_id: str) -> Row | None:
    """The newest item of a turn that the model reads (its kind and response id). Markers (an
    interruption, a notice, a compaction summary, a Goal record) never count: a worker that died right
    after committing its final answer leaves an interruption marker behind it, and the resumed attempt
    must finish the turn, not ask the model again. Nor does an interrupted answer's partial text: the
    resumed attempt asks the model again."""
    return tx.one("SELECT kind, response_id FROM transcript WHERE turn_id = ? AND kind NOT IN"
                  " ('interruption', 'notice', 'compaction', 'goal_record') AND item_id NOT LIKE ?"
                  " ORDER BY seq DESC LIMIT 1", (turn_id, f"{PARTIAL_PREFIX}%"))


def response_has_calls(tx: Tx, response_id: str) -> bool:
    return tx.one(RESPONSE_CALLS_SQL, (response_id,)) is not None


RESPONSE_CALLS_SQL = "SELECT item_id FROM transcript WHERE response_id = ? AND kind = 'tool_call' LIMIT 1"


def last_reply(tx: Tx, turn_id: str) -> str | None:
    """The text of a turn's newest assistant message (an interrupted answer's partial text is not one)."""
    row = tx.one("SELECT content FROM transcript WHERE turn_id = ? AND kind = 'assistant' AND item_id NOT LIKE ?"
                 " ORDER BY seq DESC LIMIT 1", (turn_id, f"{PARTIAL_PREFIX}%"))
    return None if row is None else str(row["content"])


# --------------------------------------------------------------------------- drafts (events only, never the transcript)


def emit_draft(tx: Tx, session_id: str, work_id: str, request_id: str, text: str) -> None:
    """The text streamed so far for a request, for open views only (``assistant.draft``, whole text each
    time); the answer itself is committed with its receipt, never from drafts."""
    shared.emit(tx, "assistant.draft", {"request_id": request_id, "text": text, "full": True}, session_id=session_id,
         work_id=work_id)


def partial_answer(tx: Tx, work: Row, turn_id: str, interrupted: str, *, attempt_id: str | None = None) -> int | None:
    """Keep what an interrupted work request streamed (DESIGN §7): the newest ``assistant.draft`` of the
    turn's newest work request, when that request has no committed answer, becomes an assistant item
    ``partial:<request_id>`` with ``meta.interrupted`` (``"restart"``: its attempt died; ``"stopped"``:
    a person's Stop). Written where the interruption is recorded, before its marker; the stable id makes a
    repeated recovery (or a stop after a death) add nothing. Repair sends it as partial text plus the
    interruption marker, with no reasoning state. ``attempt_id``: only that (dead) attempt's requests.
    The seq, or None (nothing streamed, answered, already kept)."""
    if attempt_id is not None:
        req = tx.one("SELECT request_id, created_at FROM requests WHERE attempt_id = ? AND purpose = 'work'"
                     " ORDER BY created_at DESC LIMIT 1", (attempt_id,))
    else:
        req = tx.one("SELECT r.request_id, r.created_at FROM attempts a JOIN requests r ON r.attempt_id = a.attempt_id"
                     " WHERE a.work_id = ? AND a.turn_id = ? AND r.purpose = 'work' ORDER BY r.created_at DESC LIMIT 1",
                     (work["work_id"], turn_id))
    if req is None:
        return None
    request_id = str(req["request_id"])
    if tx.one("SELECT seq FROM transcript WHERE item_id = ? OR item_id = ?",
              (f"resp:{request_id}", f"{PARTIAL_PREFIX}{request_id}")) is not None:
        return None  # answered (its answer is in the transcript), or already kept
    # drafts of this work since the request began: events have no index by work, so the scan is bounded
    # below by the request's start (a minute early, for a clock step between the two writers)
    since = _event_seq_at(tx, float(req["created_at"]) - 60.0)
    row = tx.one("SELECT payload FROM events WHERE seq >= ? AND work_id = ? AND kind = 'assistant.draft'"
                 " ORDER BY seq DESC LIMIT 1", (since, work["work_id"]))
    draft = json.loads(row["payload"]) if row is not None else {}
    if draft.get("request_id") != request_id or not draft.get("text"):
        return None  # the request streamed nothing durable
    return append_item(tx, work["session_id"], ItemKind.ASSISTANT, "assistant", str(draft["text"]),
                       item_id=f"{PARTIAL_PREFIX}{request_id}", work_id=work["work_id"], turn_id=turn_id,
                       response_id=f"{PARTIAL_PREFIX}{request_id}",
                       meta={"interrupted": interrupted, "request_id": request_id})


def _event_seq_at(tx: Tx, ts: float) -> int:
    """The first event seq written at or after ``ts``, by bisection over seq (commit-ordered, and each
    event's ``ts`` taken inside its commit, so they grow together): a few index seeks, never a scan."""
    lo, hi = 0, shared.last_event_seq(tx) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        row = tx.one("SELECT ts FROM events WHERE seq >= ? ORDER BY seq LIMIT 1", (mid,))
        if row is None or float(row["ts"]) >= ts:
            hi = mid
        else:
            lo = mid + 1
    return lo
