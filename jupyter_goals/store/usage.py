"""Every usage.db statement. Receipts are inserted if absent on their key, so a retried outbox
operation (same key) can never count a receipt twice."""

from __future__ import annotations

import time
from typing import Any

from jupyter_goals.store.db import Row, Tx


def apply_receipt(tx: Tx, op_key: str, r: dict[str, Any]) -> bool:
    """Insert the receipt once; returns False when it was already applied."""
    usage = r.get("usage")
    n = tx.execute(
        "INSERT INTO receipts (receipt_key, request_id, session_id, work_id, turn_id, goal_id, goal_revision, job_id,"
        " purpose, provider, model, usage_known, input_tokens, output_tokens, cached_tokens, created_at, applied_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (receipt_key) DO NOTHING",
        (
            op_key,
            r["request_id"],
            r["session_id"],
            r.get("work_id"),
            r.get("turn_id"),
            r.get("goal_id"),
            r.get("goal_revision"),
            r.get("job_id"),
            r.get("purpose"),
            r.get("provider"),
            r.get("model"),
            1 if usage else 0,
            (usage or {}).get("input_tokens", 0),
            (usage or {}).get("output_tokens", 0),
            (usage or {}).get("cached_tokens", 0),
            r.get("created_at", time.time()),
            time.time(),
        ),
    )
    return n == 1


def summary(tx: Tx, session_id: str | None = None, work_id: str | None = None) -> dict[str, Any]:
    where, params = ("session_id = ?", (session_id,)) if session_id else ("work_id = ?", (work_id,))
    row: Row | None = tx.one(
        "SELECT COUNT(*) AS requests, COALESCE(SUM(input_tokens), 0) AS input, COALESCE(SUM(output_tokens), 0) AS output,"
        " COALESCE(SUM(cached_tokens), 0) AS cached, COALESCE(SUM(1 - usage_known), 0) AS unknown"
        f" FROM receipts WHERE {where}",
        params,
    )
    assert row is not None
    unknown = int(row["unknown"])
    known = {"input": int(row["input"]), "output": int(row["output"]), "cached": int(row["cached"])}
    display = f"Known tokens: {known['input']} in, {known['output']} out"
    if unknown:
        display += f"; usage unknown for {unknown} additional request{'s' if unknown != 1 else ''}"
    return {
        "known_tokens": known,
        "receipts": int(row["requests"]),
        "unknown_usage_requests": unknown,
        "known_cost_usd": None,
        "estimated_cost_usd": None,
        "display": display,
    }


def count_receipts(tx: Tx, request_id: str) -> int:
    return int(tx.scalar("SELECT COUNT(*) AS n FROM receipts WHERE request_id = ?", (request_id,)) or 0)
