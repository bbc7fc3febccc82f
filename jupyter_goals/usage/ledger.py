"""The outbox dispatcher: applies control.db operations to usage.db, insert-if-absent on their key.

A failure (including a commit whose acknowledgement is lost) retries with a durable
``next_attempt_at`` and bounded exponential backoff; the unique key makes the retry harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from jupyter_goals.faults import crash_point
from jupyter_goals.models import Usage
from jupyter_goals.store import control as c
from jupyter_goals.store import usage as u
from jupyter_goals.store.db import Database, Tx
from jupyter_goals.usage.prices import PriceTable, load_price_table

log = logging.getLogger(__name__)


def backoff(attempts: int, base: float = 0.5, cap: float = 60.0) -> float:
    return float(min(cap, base * 2**attempts))


def apply_receipt(tx: Tx, op_key: str, payload: dict[str, Any], prices: PriceTable) -> bool:
    """A ``usage.receipt`` operation: priced once, with ``prices`` as they are now, and inserted once
    (False when it was already applied: its first quote stays)."""
    raw = payload.get("usage")
    quote = prices.receipt_quote(str(payload.get("model") or ""), Usage.model_validate(raw) if raw else None)
    return u.apply_receipt(tx, op_key, payload, quote)


class OutboxDispatcher:
    def __init__(self, control: Database, usage: Database, prices: PriceTable | None = None) -> None:
        self.control = control
        self.usage = usage
        self.prices = prices or load_price_table(None)  # receipts are priced once, when they are applied
        self.last_error: str | None = None  # the latest usage.db failure, cleared by the next success
        # test seam for fault injection around the usage.db commit (a fault-injecting wrapper, not a mock)
        self.after_usage_commit: Callable[[str], None] | None = None

    async def dispatch_due(self) -> int:
        """Apply every due operation once; returns how many were applied."""
        rows = await self.control.run(lambda tx: c.due_outbox(tx, time.time()), write=False)
        applied = 0
        for row in rows:
            applied += await self._dispatch_one(row)
        return applied

    async def _dispatch_one(self, row: dict[str, Any]) -> int:
        key, kind, payload = str(row["op_key"]), str(row["kind"]), dict(row["payload"])
        applied = False
        try:
            crash_point("usage.before_persist")
            await self.usage.run(lambda tx: self._apply(tx, kind, key, payload))
            crash_point("usage.after_persist")
            if self.after_usage_commit is not None:
                self.after_usage_commit(key)
            applied, self.last_error = True, None
            await self.control.run(lambda tx: c.outbox_done(tx, key, payload))
            return 1
        except Exception as exc:
            # only a usage.db failure degrades the ledger: a lost done mark (control.db) is retried
            # harmlessly, and nothing later might clear an error reported for it
            if not applied:
                self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("outbox %s failed (attempt %s): %s", key, row["attempts"] + 1, exc)
            error, delay = str(exc), backoff(int(row["attempts"]))
            try:
                await self.control.run(lambda tx: c.outbox_retry(tx, key, error, delay))
            except Exception:
                log.exception("outbox %s: could not record the retry", key)
            return 0

    def _apply(self, tx: Tx, kind: str, key: str, payload: dict[str, Any]) -> None:
        if kind == "usage.receipt":
            apply_receipt(tx, key, payload, self.prices)
        elif kind == "usage.request":
            u.apply_request(tx, payload)
        elif kind == "usage.lost":
            u.apply_lost(tx, payload)
        else:
            raise ValueError(f"unknown outbox operation {kind!r}")
