"""The one paid-request path, used by every model request a worker makes (work, compaction, Goal
requirements and acceptance; Jobs and subtasks run through the same turn loop).

1. ``reserve`` (in the caller's fenced transaction): the hard-budget check (``BudgetHeld``: nothing
   recorded, nothing sent), then the request's attribution and reservation (``record_request``),
   written before it is sent.
2. ``call``: the provider call, closed at once when its work is stopped (``watch_stop``); the last
   cumulative usage snapshot is kept (a watermark, replaced, never summed); errors are mapped to a
   ``Failure`` with its reason code and redacted text.
3. ``settle`` (in the caller's fenced transaction): a receipt (the answer, or the watermark as a
   lower bound when the stream broke or was stopped) or ``lost`` (usage unknown).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jupyter_goals.models import DesiredState, ProviderRequest, ProviderResponse, Purpose, ReasonCode, Usage
from jupyter_goals.providers.base import ProviderError, ProviderUnavailable, requested_service_tier
from jupyter_goals.providers.resolve import resolve_provider
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, Row, Tx
from jupyter_goals.usage import budget
from jupyter_goals.usage.prices import PriceTable

T = TypeVar("T")
STOP_POLL_S = 0.2  # how often an open model request checks for a stop of its work (one indexed read)
STOPPED_ERROR = "stopped by the person while the model was answering"


class StoppedByPerson(Exception):
    """The work was stopped while a model request was in flight (the request is closed), or a control
    was committed before a Goal's requirements or acceptance request was recorded (none is sent)."""


@dataclass
class Failure:
    """A provider request that produced no answer. ``used`` is None when its usage is unknown (lost)."""

    error: str
    code: ReasonCode
    status: int | None = None
    retry_after_s: float | None = None
    used: Usage | None = None
    partial: bool = False


@dataclass
class Outcome:
    """What one paid request came to: an answer, a failure, or a stop (with what it consumed so far)."""

    response: ProviderResponse | None = None
    failure: Failure | None = None
    stopped: bool = False
    watermark: list[Usage] = field(default_factory=list)


def reserve(tx: Tx, work: Row, *, governing: Row | None, model: str, purpose: Purpose, attempt_id: str,
            turn_id: str, prices: PriceTable | None) -> tuple[str, budget.Reservation]:
    """Check the governing Goal's hard budget and record the request (attribution + reservation)
    before it is sent. Raises ``budget.BudgetHeld`` with nothing written."""
    held = budget.admit_request(tx, governing, model, prices)
    request_id = c.new_id("req")
    c.record_request(tx, work, request_id=request_id, attempt_id=attempt_id, turn_id=turn_id, purpose=purpose.value,
                     model=model, reserved_usd=held.usd, reserved_tokens=held.tokens,
                     reservation_ttl_s=budget.RESERVATION_TTL_S, service_tier=requested_service_tier(model))
    return request_id, held


async def unless_stopped(db: Database, work_id: str, waiting: Awaitable[T]) -> T:
    """Await ``waiting``, closing it at once (``StoppedByPerson``) when its work is stopped."""
    task: asyncio.Future[T] = asyncio.ensure_future(waiting)

    async def stopped() -> None:
        while True:
            work = await db.run(lambda tx: c.get_work(tx, work_id), write=False)
            if work["desired_state"] == DesiredState.CANCELLED:
                return
            await asyncio.sleep(STOP_POLL_S)

    watch: asyncio.Future[None] = asyncio.ensure_future(stopped())
    try:
        both: set[asyncio.Future[Any]] = {task, watch}
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise StoppedByPerson()
    finally:
        for f in (task, watch):
            if not f.done():
                f.cancel()


async def call(request: ProviderRequest, model: str, *, reserved_until: float,
               watch_stop: Callable[[Awaitable[ProviderResponse]], Awaitable[ProviderResponse]] | None = None,
               redact: Callable[[str], str] | None = None,
               on_chunk: Callable[[str], Awaitable[None]] | None = None) -> Outcome:
    """Send a recorded request. Never raises for a provider fault: the outcome says what to settle."""
    out = Outcome()

    def on_usage(usage: Usage) -> None:
        out.watermark[:] = [usage]

    answered = True  # the provider answered (an HTTP error, or nothing sent at all): nothing consumed
    retry_after_s: float | None = None  # the provider's own retry-after (429/529), honoured as a minimum
    expired = time.time() > reserved_until  # an expired unstarted reservation cannot dispatch
    status: int | None = None
    try:
        if expired:
            raise ProviderError("the budget reservation expired before the request was sent", retryable=True)
        sending = resolve_provider(model).complete(request, on_chunk=on_chunk, on_usage=on_usage)
        out.response = await (watch_stop(sending) if watch_stop is not None else sending)
        return out
    except StoppedByPerson:  # the stream is closed; what it consumed so far is a lower bound, or unknown
        out.stopped = True
        return out
    except ProviderUnavailable as unavailable:
        error, code = str(unavailable), unavailable.reason_code
    except ProviderError as fault:
        error, status, answered = str(fault), fault.status, fault.status is not None or expired
        code = ReasonCode.PROVIDER_RETRYING if fault.retryable else ReasonCode.PROVIDER_FAILED
        retry_after_s = fault.retry_after_s
    error = redact(error) if redact is not None else error  # a provider may echo the key it refused
    used = out.watermark[0] if out.watermark else (Usage(input_tokens=0, output_tokens=0) if answered else None)
    out.failure = Failure(error, code, status, retry_after_s, used, partial=bool(out.watermark))
    return out


def _cost(tx: Tx, request_id: str, usage: Usage | None, prices: PriceTable | None) -> float | None:
    """The quote of a request's usage with the worker's price table (None: usage or price unknown)."""
    model = c.request_model(tx, request_id) if (usage is not None and prices is not None) else None
    return prices.quote(model, usage) if (prices is not None and usage is not None and model is not None) else None


def settle_answer(tx: Tx, request_id: str, response: ProviderResponse, prices: PriceTable | None) -> None:
    """The answered request's receipt (committed with what the answer changes)."""
    used = response.usage
    c.settle_request(tx, request_id, used.model_dump() if used else None, cost_usd=_cost(tx, request_id, used, prices))


def settle(tx: Tx, request_id: str, outcome: Outcome, prices: PriceTable | None) -> None:
    """The request's one receipt or its loss, in the caller's fenced transaction."""
    if outcome.response is not None:
        settle_answer(tx, request_id, outcome.response, prices)
    elif outcome.stopped:
        if outcome.watermark:
            used = outcome.watermark[0]
            c.settle_request(tx, request_id, used.model_dump(), error=STOPPED_ERROR, partial=True,
                             cost_usd=_cost(tx, request_id, used, prices))
        else:
            c.lose_request(tx, request_id, STOPPED_ERROR)
    elif outcome.failure is not None:
        f = outcome.failure
        if f.used is None:
            c.lose_request(tx, request_id, f.error)
        else:  # a stream lost after a usage snapshot consumed at least that much: a lower bound
            c.settle_request(tx, request_id, f.used.model_dump(), error=f.error, partial=f.partial,
                             cost_usd=_cost(tx, request_id, f.used, prices))
