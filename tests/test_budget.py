"""Hard budgets (issue 5 item 4, spec "Cost"): unlimited by default; reservations before dispatch;
unknown usage, unknown prices and an unreadable ledger are never available balance.

The rules of ``budget.check`` are tested one by one; then Goals run in this process against a real
control.db, the real Coordinator and the real turn loop (``tests/inproc.py``) with a priced scripted
model, and the spend queries run on SQLite and PostgreSQL. The process-level test with the ledger
offline is in ``test_crash_usage.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.goals import lifecycle
from jupyter_goals.identity import host_name
from jupyter_goals.models import GoalState, ReasonCode, Requirement, Usage
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store import waits
from jupyter_goals.store.db import Row, Tx
from jupyter_goals.usage import budget
from jupyter_goals.usage.budget import Reservation, Spend, check
from jupyter_goals.usage.prices import PriceTable
from tests.inproc import Rig
from tests.storekit import Backend

BYPASS = {"mode": "bypass", "allow": []}
# $1.00 per 1000 input tokens and $0.02 per output token: one scripted answer below costs $1.20
PRICES = PriceTable.parse(json.dumps({"version": "test-1", "models": {
    "scripted:*": {"input_usd_per_mtok": 1000.0, "output_usd_per_mtok": 20000.0}}}).encode())
USAGE = {"input_tokens": 1000, "output_tokens": 10}  # $1.00 + $0.20
PER_REQUEST = {"max_input_tokens_per_request": 1000, "max_output_tokens_per_request": 10}  # reserves $1.20
NEVER_MET = [{"id": "r1", "text": "never.txt exists", "kind": "file_exists", "path": "never.txt"}]

RULES: list[dict[str, Any]] = [
    {"when": {"last_user_contains": "Job spend"},  # a Job that keeps calling tools: one paid request each
     "respond": {"text": "", "tool_calls": [{"name": "write_file", "arguments": {"path": "j.txt", "content": "x"}}],
                 "usage": USAGE}},
    {"when": {"goal_objective_contains": "Spend", "last_tool_result_contains": "wrote"},
     "respond": {"text": "step", "usage": USAGE}},
    {"when": {"goal_objective_contains": "Spend"},
     "respond": {"text": "", "tool_calls": [{"name": "write_file", "arguments": {"path": "p.txt", "content": "x"}}],
                 "usage": USAGE}},
    {"when": {"goal_objective_contains": "Unmetered"},  # no usage reported: consumption unknown
     "respond": {"text": "", "tool_calls": [{"name": "write_file", "arguments": {"path": "u.txt", "content": "x"}}]}},
    {"when": {"goal_objective_contains": "Slow", "last_tool_result_contains": "wrote"},
     "respond": {"text": "step", "delay_s": 0.3, "usage": USAGE}},
    {"when": {"goal_objective_contains": "Slow"},
     "respond": {"text": "", "tool_calls": [{"name": "write_file", "arguments": {"path": "s.txt", "content": "x"}}],
                 "delay_s": 0.3, "usage": USAGE}},
]


# --------------------------------------------------------------------------- the rules, one by one


def test_no_budget_is_unlimited_and_sets_no_reservation() -> None:
    assert not budget.is_hard({})
    assert check({}, Spend(known_cost_usd=1e9, uncertain=5, reserved_usd=None, ledger_error="down")) is None
    assert budget.reservation({}, "scripted:x", PRICES) == Reservation(None, None)


def test_known_cost_at_the_budget_is_exhausted() -> None:
    p = check({"max_cost_usd": 2.0}, Spend(known_cost_usd=2.0))
    assert p is not None and p.code == ReasonCode.BUDGET_EXHAUSTED and "$2.00 of $2.00" in p.reason
    assert check({"max_cost_usd": 2.0}, Spend(known_cost_usd=1.99)) is None


def test_unknown_usage_without_a_per_request_limit_is_not_available_balance() -> None:
    p = check({"max_cost_usd": 100.0}, Spend(known_cost_usd=0.1, uncertain=1, reserved_usd=None))
    assert p is not None and p.code == ReasonCode.BUDGET_UNVERIFIABLE and "no per-request limit" in p.reason


def test_unknown_usage_counts_at_its_reservation() -> None:
    assert check({"max_cost_usd": 5.0}, Spend(known_cost_usd=1.0, uncertain=1, reserved_usd=1.2)) is None
    p = check({"max_cost_usd": 2.0}, Spend(known_cost_usd=1.0, uncertain=1, reserved_usd=1.2))
    assert p is not None and p.code == ReasonCode.BUDGET_UNVERIFIABLE and "reserved" in p.reason


def test_the_next_request_must_fit_its_reservation() -> None:
    spend = Spend(known_cost_usd=3.6)
    assert check({"max_cost_usd": 5.0}, spend, Reservation(1.2, 1010)) is None  # 4.8 <= 5
    p = check({"max_cost_usd": 4.7}, spend, Reservation(1.2, 1010))
    assert p is not None and p.code == ReasonCode.BUDGET_EXHAUSTED and "cannot cover another request" in p.reason


def test_unknown_price_blocks_a_cost_budget_but_not_a_token_budget() -> None:
    spend = Spend(known_tokens=100, unpriced=1)
    p = check({"max_cost_usd": 5.0}, spend)
    assert p is not None and p.code == ReasonCode.BUDGET_UNVERIFIABLE and "no known price" in p.reason
    assert check({"max_tokens": 1000}, spend) is None


def test_an_unreadable_ledger_makes_cost_and_token_budgets_unverifiable_not_time_limits() -> None:
    down = Spend(ledger_error="usage.db: disk I/O error")
    for limits in ({"max_cost_usd": 5.0}, {"max_tokens": 10}):
        p = check(limits, down)
        assert p is not None and p.code == ReasonCode.BUDGET_UNVERIFIABLE and "disk I/O error" in p.reason
    assert check({"max_active_seconds": 60.0}, down) is None


def test_token_budget_rules() -> None:
    assert check({"max_tokens": 100}, Spend(known_tokens=100)).code == ReasonCode.BUDGET_EXHAUSTED  # type: ignore[union-attr]
    assert check({"max_tokens": 100}, Spend(uncertain=1, reserved_tokens=None)).code == ReasonCode.BUDGET_UNVERIFIABLE  # type: ignore[union-attr]
    assert check({"max_tokens": 100}, Spend(known_tokens=50), Reservation(None, 60)).code == ReasonCode.BUDGET_EXHAUSTED  # type: ignore[union-attr]
    assert check({"max_tokens": 100}, Spend(known_tokens=50), Reservation(None, 50)) is None


def test_active_time_limit_from_known_time_and_unknown_intervals() -> None:
    assert check({"max_active_seconds": 10.0}, Spend(active_seconds=10.0)).code == ReasonCode.BUDGET_EXHAUSTED  # type: ignore[union-attr]
    p = check({"max_active_seconds": 10.0}, Spend(active_seconds=6.0, unknown_seconds=5.0))
    assert p is not None and p.code == ReasonCode.BUDGET_UNVERIFIABLE and "executor vanished" in p.reason
    assert check({"max_active_seconds": 10.0}, Spend(active_seconds=6.0, unknown_seconds=1.0)) is None


def test_a_reservation_needs_audited_limits_and_a_known_price() -> None:
    assert budget.reservation({"max_cost_usd": 1.0}, "scripted:x", PRICES) == Reservation(None, None)
    r = budget.reservation(PER_REQUEST, "scripted:x", PRICES)
    assert r.tokens == 1010 and r.usd == pytest.approx(1.2)
    assert budget.reservation(PER_REQUEST, "openai:unpriced", PRICES) == Reservation(None, 1010)


# --------------------------------------------------------------------------- Goals under a budget


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES, prices=PRICES)
    yield r
    r.close()


def new_goal(rig: Rig, objective: str, limits: dict[str, Any]) -> Row:
    sid = rig.session(BYPASS)

    def run(tx: Tx) -> Row:
        reqs = [Requirement.model_validate(r) for r in NEVER_MET]
        return lifecycle.create(tx, c.get_session(tx, sid), objective, reqs, limits, host=host_name(), auto_recover=True)

    return rig.tx(run)  # type: ignore[no-any-return]


def goal(rig: Rig, goal_id: str) -> Row:
    return rig.db.transact(lambda tx: g.get_goal(tx, goal_id), write=False)  # type: ignore[no-any-return]


def requests(rig: Rig, goal_id: str) -> list[Row]:
    return rig.rows("SELECT * FROM requests WHERE goal_id = ? ORDER BY created_at", (goal_id,))


async def test_reservations_stop_a_goal_before_it_can_overspend_and_a_raised_budget_lets_it_go_on(rig: Rig) -> None:
    gl = new_goal(rig, "Spend carefully", {"max_cost_usd": 5.0, **PER_REQUEST})
    await rig.run_until_quiet(limit=40)
    sent = requests(rig, gl["goal_id"])
    assert len(sent) == 4  # 4 x $1.20 = $4.80; a fifth could reach $6.00
    assert sum(r["cost_usd"] for r in sent) == pytest.approx(4.8)
    assert all(r["reserved_usd"] == pytest.approx(1.2) and r["reserved_tokens"] == 1010 for r in sent)
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.BUDGET_EXHAUSTED
    work = rig.work(gl["work_id"])
    assert (work["phase"], work["reason_code"]) == ("waiting", "budget_exhausted")
    assert "cannot cover another request" in work["reason"]
    await rig.run_until_quiet()  # recovery passes keep it waiting: no request without a new budget
    assert len(requests(rig, gl["goal_id"])) == 4

    rig.tx(lambda tx: lifecycle.revise(tx, gl["goal_id"], now["revision"], budget={"max_cost_usd": 10.0, **PER_REQUEST}))
    assert goal(rig, gl["goal_id"])["state"] == GoalState.ACTIVE
    await rig.run_until_quiet(limit=40)
    assert len(requests(rig, gl["goal_id"])) == 8  # $9.60; a ninth could reach $10.80
    assert goal(rig, gl["goal_id"])["state"] == GoalState.BUDGET_EXHAUSTED


async def test_a_goal_without_a_budget_is_never_held(rig: Rig) -> None:
    gl = new_goal(rig, "Spend freely", {})
    for _ in range(12):
        await rig.step()
    assert len(requests(rig, gl["goal_id"])) >= 10
    assert goal(rig, gl["goal_id"])["state"] == GoalState.ACTIVE


async def test_unknown_usage_without_limits_pauses_paid_admission_with_the_reason(rig: Rig) -> None:
    gl = new_goal(rig, "Unmetered work", {"max_cost_usd": 50.0})
    await rig.run_until_quiet()
    assert len(requests(rig, gl["goal_id"])) == 1  # the first request's usage never became known
    work = rig.work(gl["work_id"])
    assert (work["phase"], work["reason_code"]) == ("waiting", "budget_unverifiable")
    assert "Usage is unknown for 1 request(s)" in work["reason"]
    assert goal(rig, gl["goal_id"])["state"] == GoalState.ACTIVE  # not exhausted: unverifiable


async def test_an_unwritable_ledger_holds_paid_admission_until_it_is_back(rig: Rig) -> None:
    gl = new_goal(rig, "Spend while the ledger is down", {"max_cost_usd": 50.0})
    rig.tx(lambda tx: budget.set_ledger_error(tx, "usage.db: disk I/O error"))
    await rig.run_until_quiet()
    assert requests(rig, gl["goal_id"]) == []
    work = rig.work(gl["work_id"])
    assert work["reason_code"] == "budget_unverifiable" and "disk I/O error" in work["reason"]

    rig.tx(lambda tx: budget.set_ledger_error(tx, ""))
    for _ in range(3):
        await rig.step()
    assert len(requests(rig, gl["goal_id"])) >= 3


async def test_an_active_time_limit_is_enforced_from_attempt_records(rig: Rig) -> None:
    gl = new_goal(rig, "Slow thinking", {"max_active_seconds": 1.2})
    await rig.run_until_quiet()
    n = len(requests(rig, gl["goal_id"]))
    assert 3 <= n <= 5  # each answer takes 0.3 s of active time
    work = rig.work(gl["work_id"])
    assert work["reason_code"] == "budget_exhausted" and "active-time limit" in work["reason"]


async def test_an_expired_unstarted_reservation_cannot_dispatch(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget, "RESERVATION_TTL_S", -1.0)
    gl = new_goal(rig, "Spend late", {"max_cost_usd": 5.0, **PER_REQUEST})
    await rig.step()
    [req] = requests(rig, gl["goal_id"])
    assert req["state"] == "failed" and "reservation expired" in req["error"]
    assert (req["usage_known"], req["tokens"], req["cost_usd"]) == (1, 0, 0.0)  # never sent: nothing consumed
    assert rig.work(gl["work_id"])["reason_code"] == "provider_retrying"
    assert not [i for i in rig.items(gl["session_id"]) if i.kind == "assistant"]


async def test_a_job_attributed_to_a_goal_spends_that_goals_budget(rig: Rig) -> None:
    gl = new_goal(rig, "Budget holder", {"max_cost_usd": 3.0, **PER_REQUEST})
    rig.tx(lambda tx: lifecycle.act(tx, gl["goal_id"], "pause", gl["revision"]))  # only the Job runs
    job, _ = rig.tx(lambda tx: waits.create_job(tx, gl["session_id"], "Job spend", gl["goal_id"], "j1",
                                                host=host_name(), auto_recover=True))
    await asyncio.wait_for(rig.run_until_quiet(), 30)  # without the budget, the Job's turn never ends
    sent = rig.rows("SELECT cost_usd, goal_id FROM requests WHERE work_id = ?", (job["work_id"],))
    assert len(sent) == 2 and all(r["goal_id"] == gl["goal_id"] for r in sent)  # $2.40; a third could reach $3.60
    work = rig.work(job["work_id"])
    assert (work["phase"], work["reason_code"]) == ("waiting", "budget_exhausted")


# --------------------------------------------------------------------------- spend on both backends


def test_goal_spend_counts_settled_requests_and_reservations_of_unknown_ones(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def run(tx: Tx) -> Spend:
        session = c.create_session(tx, "t", "/tmp", "scripted:x.json", BYPASS)
        gl = lifecycle.create(tx, session, "Spend", None, {"max_cost_usd": 10.0}, host="h", auto_recover=True)
        work = c.get_work(tx, gl["work_id"])
        lifecycle.attribute(tx, work)
        for rid in ("q1", "q2", "q3", "q4"):
            c.record_request(tx, work, request_id=rid, attempt_id="a1", turn_id="t1", purpose="work",
                             model="scripted:x.json", reserved_usd=1.2, reserved_tokens=1010)
        c.settle_request(tx, "q1", USAGE, cost_usd=PRICES.quote("scripted:x.json", Usage.model_validate(USAGE)))  # $1.20
        c.settle_request(tx, "q2", {"input_tokens": 500, "output_tokens": 0}, error="stream lost", partial=True,
                         cost_usd=PRICES.quote("scripted:x.json", Usage(input_tokens=500, output_tokens=0)))  # a lower
        # bound: counted at its reservation
        c.lose_request(tx, "q3", "connection lost")  # unknown: counted at its reservation
        return budget.goal_spend(tx, gl["goal_id"])  # q4 is in flight: reserved as well

    spend = db.transact(run)
    assert spend.known_cost_usd == pytest.approx(1.2 + 0.5)  # the partial one's lower bound is known
    assert spend.known_tokens == 1010 + 500
    assert spend.uncertain == 3 and spend.reserved_usd == pytest.approx(3 * 1.2) and spend.reserved_tokens == 3030


def test_the_audited_output_limit_is_sent_to_an_openai_compatible_provider() -> None:
    from jupyter_goals.models import ProviderMessage, ProviderRequest
    from jupyter_goals.providers.openai_compat import OpenAICompatProvider

    provider = OpenAICompatProvider("gpt-test", base_url="http://127.0.0.1:9/v1")
    msgs = [ProviderMessage(role="user", content="hi")]
    assert "max_tokens" not in provider.build_body(ProviderRequest(request_id="r", messages=msgs))
    body = provider.build_body(ProviderRequest(request_id="r", messages=msgs, max_output_tokens=10))
    assert body["max_tokens"] == 10
