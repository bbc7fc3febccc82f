"""Every usage.db statement: the ledger of record for provider usage and cost.

Three outbox operations reach it, each insert-if-absent on its key, so a retried operation can
never count anything twice:

- ``usage.request``: the request's attribution (session, work item, turn, goal + revision, job,
  reservation, provider, model, service tier), fixed in control.db before the request is sent;
- ``usage.receipt``: what the provider reported for that request (one receipt per provider
  attempt; a retry is a new request). A streamed answer's usage is its last cumulative snapshot,
  a watermark, never a sum; a stream lost after a snapshot gives a ``partial`` receipt, a lower
  bound. The quote is priced once, with the price version of the moment, and never recomputed;
- ``usage.lost``: a request whose attempt died before any answer: its usage is unknown.

Totals are always computed from these rows, so a restart rebuilds them from the receipts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jupyter_goals.models import Usage
from jupyter_goals.store.db import Row, Tx

ATTRIBUTION = ("request_id", "attempt_id", "session_id", "work_id", "turn_id", "goal_id", "goal_revision", "job_id",
               "reservation_id", "parent_request_id", "purpose", "provider", "model", "service_tier")


@dataclass(frozen=True)
class Quote:
    """A receipt's cost as priced by its caller (``usage/prices.py``), with the price table version used."""

    cost_usd: float
    price_version: str


@dataclass(frozen=True)
class PriceRecord:
    """One model's known prices in one price table version (USD per million tokens), as usage.db keeps them."""

    model: str
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None


def _ensure_request(tx: Tx, r: dict[str, Any], state: str) -> None:
    values = [r.get(k) for k in ATTRIBUTION]
    values[ATTRIBUTION.index("purpose")] = r.get("purpose") or "work"
    values[ATTRIBUTION.index("provider")] = r.get("provider") or str(r.get("model", "")).partition(":")[0]
    values[ATTRIBUTION.index("model")] = r.get("model") or ""
    tx.execute(
        f"INSERT INTO requests ({', '.join(ATTRIBUTION)}, state, created_at)"
        f" VALUES ({', '.join('?' * len(ATTRIBUTION))}, ?, ?) ON CONFLICT (request_id) DO NOTHING",
        (*values, state, r.get("created_at") or time.time()),
    )


def apply_request(tx: Tx, r: dict[str, Any]) -> None:
    """The attribution of a request about to be sent (state ``sent``)."""
    _ensure_request(tx, r, "sent")


def apply_lost(tx: Tx, r: dict[str, Any]) -> None:
    """The request's attempt died with no answer: its usage is unknown (a settled one stays settled)."""
    _ensure_request(tx, r, "lost")
    tx.execute("UPDATE requests SET state = 'lost' WHERE request_id = ? AND state = 'sent'", (r["request_id"],))


def apply_receipt(tx: Tx, op_key: str, r: dict[str, Any], quote: Quote | None = None) -> bool:
    """Insert the receipt once with the ``quote`` its caller priced (None: price unknown); returns False
    when it was already applied (the first quote stays: a receipt is never priced again)."""
    raw = r.get("usage")
    usage = Usage.model_validate(raw) if raw else None
    _ensure_request(tx, r, "settled")
    n = tx.execute(
        "INSERT INTO receipts (receipt_key, request_id, attempt_id, session_id, work_id, turn_id, goal_id, goal_revision,"
        " job_id, purpose, provider, model, usage_known, partial, input_tokens, output_tokens, cached_tokens,"
        " price_version, cost_usd, created_at, applied_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (receipt_key) DO NOTHING",
        (
            op_key,
            r["request_id"],
            r.get("attempt_id"),
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
            1 if r.get("partial") else 0,
            usage.input_tokens if usage else 0,
            usage.output_tokens if usage else 0,
            usage.cached_tokens if usage else 0,
            quote.price_version if quote is not None else None,
            quote.cost_usd if quote is not None else None,
            r.get("created_at", time.time()),
            time.time(),
        ),
    )
    if n == 1:
        tx.execute("UPDATE requests SET state = 'settled', settled_at = ? WHERE request_id = ?",
                   (time.time(), r["request_id"]))
        if usage is not None and usage.service_tier:  # the tier that served it, as the provider reported
            tx.execute("UPDATE requests SET service_tier = ? WHERE request_id = ?", (usage.service_tier, r["request_id"]))
    return n == 1


def record_prices(tx: Tx, version: str, prices: Iterable[PriceRecord]) -> None:
    """Keep the known prices of a table version (insert-if-absent: an old version is never rewritten)."""
    now = time.time()
    for p in prices:
        tx.execute(
            "INSERT INTO prices (price_version, model, input_usd_per_mtok, output_usd_per_mtok,"
            " cached_input_usd_per_mtok, loaded_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (price_version, model) DO NOTHING",
            (version, p.model, p.input_usd_per_mtok, p.output_usd_per_mtok, p.cached_input_usd_per_mtok, now),
        )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary(tx: Tx, *, session_id: str | None = None, goal_id: str | None = None,
            work_id: str | None = None) -> dict[str, Any]:
    """Known tokens, known cost, and what is not known, kept apart (never an invented zero)."""
    column, value = (("session_id", session_id) if session_id else ("goal_id", goal_id) if goal_id
                     else ("work_id", work_id))
    params = (value,)
    row: Row | None = tx.one(
        "SELECT COUNT(*) AS receipts, COALESCE(SUM(input_tokens), 0) AS input, COALESCE(SUM(output_tokens), 0) AS output,"
        " COALESCE(SUM(cached_tokens), 0) AS cached, COALESCE(SUM(1 - usage_known), 0) AS unknown,"
        " COALESCE(SUM(partial), 0) AS partial,"
        " COALESCE(SUM(CASE WHEN usage_known = 1 AND cost_usd IS NULL THEN 1 ELSE 0 END), 0) AS unpriced,"
        " COALESCE(SUM(cost_usd), 0) AS cost, COALESCE(SUM(CASE WHEN cost_usd IS NOT NULL THEN 1 ELSE 0 END), 0) AS priced"
        f" FROM receipts WHERE {column} = ?",
        params,
    )
    assert row is not None
    in_flight = int(tx.scalar(f"SELECT COUNT(*) AS n FROM requests WHERE {column} = ? AND state = 'sent'", params) or 0)
    # a lost request may still get a late receipt: only the ones without one are unknown
    lost = int(tx.scalar(
        f"SELECT COUNT(*) AS n FROM requests q WHERE q.{column} = ? AND q.state = 'lost'"
        " AND NOT EXISTS (SELECT 1 FROM receipts r WHERE r.request_id = q.request_id)",
        params,
    ) or 0)
    unknown = int(row["unknown"]) + lost
    unpriced, partial, priced = int(row["unpriced"]), int(row["partial"]), int(row["priced"])
    known_cost = float(row["cost"])  # what is known; the unknowns are listed beside it, never priced at zero
    missing = unknown + unpriced
    estimate: float | None = known_cost
    if missing:
        estimate = known_cost + known_cost / priced * missing if priced else None
    known = {"input": int(row["input"]), "output": int(row["output"]), "cached": int(row["cached"])}
    parts = [f"Known ${known_cost:.2f}"]
    if unknown:
        parts.append(f"usage unknown for {_plural(unknown, 'additional request')}")
    if unpriced:
        parts.append(f"price unknown for {_plural(unpriced, 'request')}")
    if partial:
        parts.append(f"{_plural(partial, 'interrupted request')} counted as a lower bound")
    if in_flight:
        parts.append(f"{_plural(in_flight, 'request')} in flight")
    if estimate is not None and estimate > known_cost:
        parts.append(f"estimate ${estimate:.2f}")
    return {
        "known_tokens": known,
        "known_cost_usd": round(known_cost, 6),
        "estimated_cost_usd": None if estimate is None else round(estimate, 6),
        "receipts": int(row["receipts"]),
        "unknown_usage_requests": unknown,
        "unpriced_requests": unpriced,
        "lower_bound_requests": partial,
        "in_flight_requests": in_flight,
        "display": "; ".join(parts),
    }


def count_receipts(tx: Tx, request_id: str) -> int:
    return int(tx.scalar("SELECT COUNT(*) AS n FROM receipts WHERE request_id = ?", (request_id,)) or 0)
