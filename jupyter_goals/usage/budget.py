"""Hard budgets: what may still be spent, decided from durable records only.

Budgets are unlimited by default; a Goal (and the Jobs that carry its identity) may set
``max_cost_usd``, ``max_tokens`` and ``max_active_seconds``. Spending is read from control.db: each
request row carries its reservation (fixed before dispatch) and, once the provider answered, the
usage and quote it was settled with, the same values the outbox then writes to usage.db.

Rules (spec "Cost"):

- unknown prices or unknown consumption are never available balance: a request whose usage is not
  (fully) known counts at its reservation; without one the budget cannot be verified;
- a reservation is the maximum amount of one request, computable only from audited per-request
  limits (``max_input_tokens_per_request`` / ``max_output_tokens_per_request``) and a known price;
  started requests keep theirs (never released automatically); unknown tokens and unknown cost are
  reserved separately;
- while the usage ledger cannot be written, a hard token or cost budget is unverifiable: new paid
  admission pauses with ``budget_unverifiable`` and resumes once the ledger is readable again;
- an explicit active-time limit counts the known active time; an unknown interval (an executor that
  vanished) that could reach the limit makes it unverifiable.

``check`` is pure; ``goal_spend`` and ``goal_budget_problem`` read one transaction.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from jupyter_goals.models import GoalState, Phase, ReasonCode, Usage
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import Row, Tx
from jupyter_goals.usage.prices import PriceTable

LEDGER_KEY = "usage_ledger"  # server_state: "" while usage.db is written, else why it is not
RESERVATION_TTL_S = 60.0  # an unstarted reservation older than this cannot dispatch


@dataclass(frozen=True)
class Spend:
    """What a Goal's requests consumed, with the unknowns kept apart."""

    known_cost_usd: float = 0.0
    known_tokens: int = 0
    uncertain: int = 0  # requests whose consumption is not fully known (in flight, lost, partial)
    reserved_usd: float | None = 0.0  # reservations of the uncertain ones; None: one has no cost bound
    reserved_tokens: int | None = 0  # likewise for tokens
    unpriced: int = 0  # known tokens of a model with no known price
    active_seconds: float = 0.0
    unknown_seconds: float = 0.0  # active time that may or may not have been spent (vanished executors)
    ledger_error: str = ""


@dataclass(frozen=True)
class Reservation:
    usd: float | None
    tokens: int | None


@dataclass(frozen=True)
class Problem:
    code: ReasonCode
    reason: str


def _money(x: float) -> str:
    return f"${x:.2f}" if x >= 0.01 or x == 0 else f"${x:.4f}"


def is_hard(budget: dict[str, Any]) -> bool:
    return any(budget.get(k) is not None for k in ("max_cost_usd", "max_tokens", "max_active_seconds"))


def reservation(budget: dict[str, Any], model: str, prices: PriceTable | None) -> Reservation:
    """The most one request can consume under the budget's audited per-request limits."""
    max_in, max_out = budget.get("max_input_tokens_per_request"), budget.get("max_output_tokens_per_request")
    if max_in is None or max_out is None:
        return Reservation(None, None)
    usd = prices.quote(model, Usage(input_tokens=int(max_in), output_tokens=int(max_out))) if prices else None
    return Reservation(usd, int(max_in) + int(max_out))


def check(budget: dict[str, Any], spend: Spend, nxt: Reservation | None = None) -> Problem | None:
    """Why no new paid request may start under ``budget`` (None: it may). ``nxt`` is the reservation
    the next request would take (its amounts None when not computable)."""
    nxt = nxt or Reservation(None, None)
    max_cost, max_tokens, max_time = budget.get("max_cost_usd"), budget.get("max_tokens"), budget.get("max_active_seconds")
    if max_time is not None:
        if spend.active_seconds >= max_time:
            return Problem(ReasonCode.BUDGET_EXHAUSTED,
                           f"The active-time limit is used up ({spend.active_seconds:.0f} s of {max_time:.0f} s).")
        if spend.active_seconds + spend.unknown_seconds >= max_time:
            return Problem(ReasonCode.BUDGET_UNVERIFIABLE,
                           f"The active-time limit cannot be verified: {spend.active_seconds:.0f} s are known and"
                           f" {spend.unknown_seconds:.0f} s more are unknown because an executor vanished; the limit is"
                           f" {max_time:.0f} s. Raise the limit or end the Goal.")
    if (max_cost is not None or max_tokens is not None) and spend.ledger_error:
        return Problem(ReasonCode.BUDGET_UNVERIFIABLE,
                       "The usage ledger cannot be written, so spending cannot be checked against the hard budget;"
                       f" no new paid request starts until it is readable again ({spend.ledger_error}).")
    if max_cost is not None:
        if spend.known_cost_usd >= max_cost:
            return Problem(ReasonCode.BUDGET_EXHAUSTED,
                           f"The cost budget is used up: known {_money(spend.known_cost_usd)} of {_money(max_cost)}.")
        if spend.unpriced:
            return Problem(ReasonCode.BUDGET_UNVERIFIABLE,
                           f"{spend.unpriced} request(s) used a model with no known price, so the {_money(max_cost)}"
                           " budget cannot be checked; add the model to the price table or raise the budget.")
        if spend.uncertain and spend.reserved_usd is None:
            return Problem(ReasonCode.BUDGET_UNVERIFIABLE,
                           f"Usage is unknown for {spend.uncertain} request(s) and no per-request limit bounds it,"
                           f" so the {_money(max_cost)} budget cannot be checked (known {_money(spend.known_cost_usd)}).")
        upper = spend.known_cost_usd + (spend.reserved_usd or 0.0)
        if upper >= max_cost:
            return Problem(ReasonCode.BUDGET_UNVERIFIABLE,
                           f"Known {_money(spend.known_cost_usd)}; up to {_money(spend.reserved_usd or 0.0)} more is"
                           f" reserved by {spend.uncertain} request(s) whose usage is unknown, which may reach the"
                           f" {_money(max_cost)} budget.")
        if nxt.usd is not None and upper + nxt.usd > max_cost:
            return Problem(ReasonCode.BUDGET_EXHAUSTED,
                           f"The cost budget cannot cover another request: {_money(max_cost - upper)} left of"
                           f" {_money(max_cost)}, one request may cost up to {_money(nxt.usd)}.")
    if max_tokens is not None:
        if spend.known_tokens >= max_tokens:
            return Problem(ReasonCode.BUDGET_EXHAUSTED,
                           f"The token budget is used up: {spend.known_tokens} of {max_tokens} tokens.")
        if spend.uncertain and spend.reserved_tokens is None:
            return Problem(ReasonCode.BUDGET_UNVERIFIABLE,
                           f"Token usage is unknown for {spend.uncertain} request(s) and no per-request limit bounds"
                           f" it, so the {max_tokens}-token budget cannot be checked.")
        upper_t = spend.known_tokens + (spend.reserved_tokens or 0)
        if upper_t >= max_tokens:
            return Problem(ReasonCode.BUDGET_UNVERIFIABLE,
                           f"{spend.known_tokens} tokens are known; up to {spend.reserved_tokens} more are reserved by"
                           f" {spend.uncertain} request(s) whose usage is unknown, which may reach the"
                           f" {max_tokens}-token budget.")
        if nxt.tokens is not None and upper_t + nxt.tokens > max_tokens:
            return Problem(ReasonCode.BUDGET_EXHAUSTED,
                           f"The token budget cannot cover another request: {max_tokens - upper_t} tokens left,"
                           f" one request may use up to {nxt.tokens}.")
    return None


# --------------------------------------------------------------------------- reading the records


def ledger_error(tx: Tx) -> str:
    return c.get_flag(tx, LEDGER_KEY) or ""


def set_ledger_error(tx: Tx, error: str) -> None:
    c.set_flag(tx, LEDGER_KEY, error[:300])


def goal_spend(tx: Tx, goal_id: str, now: float | None = None) -> Spend:
    """A Goal's spending from its requests (every purpose: work, requirements, acceptance, Jobs)."""
    known_cost, known_tokens, uncertain, unpriced = 0.0, 0, 0, 0
    reserved_usd: float | None = 0.0
    reserved_tokens: int | None = 0
    for r in c.goal_requests(tx, goal_id):
        settled = r["usage_known"] == 1 and not r["partial"] and r["state"] in ("received", "failed")
        if settled:
            known_tokens += int(r["tokens"] or 0)
            if r["cost_usd"] is None:
                unpriced += 1
            else:
                known_cost += float(r["cost_usd"])
            continue
        uncertain += 1  # in flight, lost, or a lower bound only: counted at its reservation
        known_tokens += int(r["tokens"] or 0) if r["partial"] else 0
        known_cost += float(r["cost_usd"] or 0.0) if r["partial"] else 0.0
        reserved_usd = None if reserved_usd is None or r["reserved_usd"] is None else reserved_usd + float(r["reserved_usd"])
        reserved_tokens = (None if reserved_tokens is None or r["reserved_tokens"] is None
                           else reserved_tokens + int(r["reserved_tokens"]))
    at = c.active_time(tx, goal_id=goal_id, now=now)
    unknown_s = sum(max(0.0, float(i["to"] or time.time()) - float(i["from"])) for i in at["unknown_intervals"])
    return Spend(known_cost, known_tokens, uncertain, reserved_usd, reserved_tokens, unpriced,
                 float(at["active_seconds"]), unknown_s, ledger_error(tx))


def goal_budget(goal: Row) -> dict[str, Any]:
    b = goal["budget"]
    return json.loads(b) if isinstance(b, str) else dict(b or {})


def goal_budget_problem(tx: Tx, goal: Row, model: str, prices: PriceTable | None,
                        now: float | None = None) -> Problem | None:
    """The hard-budget check of a Goal before a paid request (None when it has no hard budget)."""
    budget = goal_budget(goal)
    if not is_hard(budget):
        return None
    return check(budget, goal_spend(tx, goal["goal_id"], now), reservation(budget, model, prices))


# --------------------------------------------------------------------------- before a paid request


class BudgetHeld(Exception):
    """A paid request may not start: the work waits with the problem's reason."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.reason)
        self.problem = problem


def admit_request(tx: Tx, goal: Row | None, model: str, prices: PriceTable | None) -> Reservation:
    """Recheck the Goal's hard budget right before a request is recorded and sent; the answer is the
    reservation to record with it. Raises ``BudgetHeld`` when no paid request may start."""
    if goal is None:
        return Reservation(None, None)
    budget = goal_budget(goal)
    if not is_hard(budget):
        return Reservation(None, None)
    nxt = reservation(budget, model, prices)
    problem = check(budget, goal_spend(tx, goal["goal_id"]), nxt)
    if problem is not None:
        raise BudgetHeld(problem)
    return nxt


def governing_goal(tx: Tx, work: Row) -> Row | None:
    """The Goal whose budget a work item spends: its own, or the one a Job or subtask was attributed
    to at its admission boundary."""
    if work.get("kind") == "goal":
        return g.goal_of_work(tx, work["work_id"])
    goal_id = work.get("goal_id")
    return g.find_goal(tx, goal_id) if goal_id else None


def admission_problem(tx: Tx, work: Row, model: str, prices: PriceTable | None, now: float) -> Problem | None:
    """The Coordinator's check before admitting (recovery included). A Goal that is not active waits
    for its own reason; a Job or subtask of an exhausted Goal waits with it."""
    goal = governing_goal(tx, work)
    if goal is None:
        return None
    if goal["state"] != GoalState.ACTIVE:
        if work.get("kind") != "goal" and goal["state"] == GoalState.BUDGET_EXHAUSTED:
            return Problem(ReasonCode.BUDGET_EXHAUSTED, str(goal["reason"]) or "The Goal's budget is used up.")
        if work.get("kind") == "goal":
            return None
    return goal_budget_problem(tx, goal, model, prices, now)


def hold(tx: Tx, work: Row, problem: Problem) -> None:
    """The work waits on its budget: exhausted moves the governing Goal to ``budget_exhausted``
    (Resume, or a raised budget, lets it go on); unverifiable keeps the Goal active and is rechecked
    on every pass."""
    if problem.code == ReasonCode.BUDGET_EXHAUSTED:
        goal = governing_goal(tx, work)
        if goal is not None and goal["state"] == GoalState.ACTIVE:
            g.update_goal(tx, goal, state=GoalState.BUDGET_EXHAUSTED.value, reason_code=str(problem.code),
                          reason=problem.reason)
    c.set_phase(tx, work, Phase.WAITING, problem.code, problem.reason)
