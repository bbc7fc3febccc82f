"""The usage ledger: attribution per request, one count per receipt, prices kept apart from tokens,
active time from durable attempt records. Real SQLite files and the real PostgreSQL server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.store import control as c
from jupyter_goals.store import usage as u
from jupyter_goals.store.db import Database, Tx
from jupyter_goals.usage import ledger
from jupyter_goals.usage.ledger import OutboxDispatcher
from jupyter_goals.usage.prices import PriceTable, PriceTableError, load_price_table
from tests.storekit import Backend, new_chat, request

PRICES_V1 = {"version": "2026-11", "models": {"openai:m": {"input_usd_per_mtok": 1000.0, "output_usd_per_mtok": 2000.0}}}
PRICES_V2 = {"version": "2026-12", "models": {"openai:m": {"input_usd_per_mtok": 10.0, "output_usd_per_mtok": 20.0}}}


def table(raw: dict[str, Any]) -> PriceTable:
    return PriceTable.parse(json.dumps(raw).encode())


def usage(i: int, o: int) -> dict[str, int]:
    return {"input_tokens": i, "output_tokens": o, "cached_tokens": 0}


# --------------------------------------------------------------------------- prices


def test_price_table_quotes_known_prices_and_leaves_unknown_models_unknown() -> None:
    t = table({"version": "v", "models": {
        "openai:m": {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 4.0, "cached_input_usd_per_mtok": 0.5},
        "other:*": {"input_usd_per_mtok": 2.0, "output_usd_per_mtok": 2.0}}, "free_providers": ["scripted"]})
    from jupyter_goals.models import Usage

    assert t.quote("openai:m", Usage(input_tokens=1_000_000, output_tokens=500_000, cached_tokens=200_000)) == pytest.approx(
        0.8 + 0.1 + 2.0)
    assert t.quote("other:anything", Usage(input_tokens=1_000_000, output_tokens=0)) == pytest.approx(2.0)
    assert t.quote("openai:unlisted", Usage(input_tokens=10, output_tokens=10)) is None  # never a silent zero
    assert t.quote("scripted:/x.json", Usage(input_tokens=10, output_tokens=10)) == 0.0
    assert load_price_table(None).quote("openai:gpt-x", Usage(input_tokens=1, output_tokens=1)) is None


def test_price_table_version_changes_with_content_even_under_the_same_declared_version(tmp_path: Path) -> None:
    a = table(PRICES_V1)
    edited = json.loads(json.dumps(PRICES_V1))
    edited["models"]["openai:m"]["input_usd_per_mtok"] = 1.0
    assert a.version != table(edited).version and a.version.startswith("2026-11:")
    bad = tmp_path / "prices.json"
    bad.write_text('{"version": "x", "models": {"m": {"input_usd_per_mtok": -1, "output_usd_per_mtok": 0}}}')
    with pytest.raises(PriceTableError, match="not valid"):
        load_price_table(str(bad))
    with pytest.raises(PriceTableError, match="cannot read"):
        load_price_table(str(tmp_path / "missing.json"))


# --------------------------------------------------------------------------- ledger


def test_each_receipt_counts_once_whatever_is_retried(backend: Backend) -> None:
    db = backend.open("usage", migrated="usage")
    t = table(PRICES_V2)
    db.transact(lambda tx: u.apply_request(tx, request("req_1")))
    db.transact(lambda tx: u.apply_request(tx, request("req_1")))  # the same outbox op again
    for _ in range(3):
        db.transact(lambda tx: ledger.apply_receipt(tx, "receipt:req_1", {**request("req_1"), "usage": usage(1000, 500)}, t))
    s = db.transact(lambda tx: u.summary(tx, session_id="ses_1"), write=False)
    assert s["receipts"] == 1 and s["known_tokens"] == {"input": 1000, "output": 500, "cached": 0}
    assert s["known_cost_usd"] == pytest.approx(0.02)
    assert s["display"] == "Known $0.02"
    assert db.transact(lambda tx: u.summary(tx, goal_id="gol_1"), write=False)["receipts"] == 1


def test_unknown_usage_lower_bounds_and_unknown_prices_are_shown_apart_from_the_known_cost(backend: Backend) -> None:
    db = backend.open("usage", migrated="usage")
    t = table({"version": "v", "models": {"openai:m": {"input_usd_per_mtok": 100000.0, "output_usd_per_mtok": 0.0}}})

    def fill(tx: Tx) -> None:
        ledger.apply_receipt(tx, "receipt:a", {**request("a"), "usage": usage(4, 0)}, t)  # $0.40
        ledger.apply_receipt(tx, "receipt:b", {**request("b"), "usage": usage(0, 0)}, t)  # a 503: nothing consumed
        u.apply_lost(tx, request("c"))  # the worker died while it was out
        ledger.apply_receipt(tx, "receipt:d", {**request("d"), "usage": None}, t)  # answered without a usage report
        ledger.apply_receipt(tx, "receipt:e", {**request("e"), "usage": usage(1, 0), "partial": True}, t)  # lower bound
        ledger.apply_receipt(tx, "receipt:f", {**request("f", model="openai:unpriced"), "usage": usage(5, 5)}, t)
        u.apply_request(tx, request("g"))  # still in flight

    db.transact(fill)
    s = db.transact(lambda tx: u.summary(tx, session_id="ses_1"), write=False)
    assert s["known_cost_usd"] == pytest.approx(0.5)
    assert s["unknown_usage_requests"] == 2 and s["unpriced_requests"] == 1 and s["lower_bound_requests"] == 1
    assert s["in_flight_requests"] == 1
    assert s["known_tokens"] == {"input": 10, "output": 5, "cached": 0}
    assert s["display"].startswith("Known $0.50; usage unknown for 2 additional requests; price unknown for 1 request;"
                                   " 1 interrupted request counted as a lower bound; 1 request in flight")
    assert s["estimated_cost_usd"] > s["known_cost_usd"]
    # a late receipt for the lost request settles it: it is no longer unknown, and it counts once
    db.transact(lambda tx: ledger.apply_receipt(tx, "receipt:c", {**request("c"), "usage": usage(1, 0)}, t))
    assert db.transact(lambda tx: u.summary(tx, session_id="ses_1"), write=False)["unknown_usage_requests"] == 1


def test_the_spec_example_display(backend: Backend) -> None:
    db = backend.open("usage", migrated="usage")
    t = table({"version": "v", "models": {"openai:m": {"input_usd_per_mtok": 420000.0, "output_usd_per_mtok": 0.0}}})
    db.transact(lambda tx: ledger.apply_receipt(tx, "receipt:a", {**request("a"), "usage": usage(1, 0)}, t))
    db.transact(lambda tx: u.apply_lost(tx, request("b")))
    assert db.transact(lambda tx: u.summary(tx, session_id="ses_1"), write=False)["display"] == (
        "Known $0.42; usage unknown for 1 additional request; estimate $0.84")


def test_a_price_table_change_never_rewrites_old_quotes(backend: Backend) -> None:
    db = backend.open("usage", migrated="usage")
    old, new = table(PRICES_V1), table(PRICES_V2)
    db.transact(lambda tx: u.record_prices(tx, old.version, old.model_prices()))
    db.transact(lambda tx: ledger.apply_receipt(tx, "receipt:a", {**request("a"), "usage": usage(1000, 0)}, old))
    db.transact(lambda tx: u.record_prices(tx, new.version, new.model_prices()))
    db.transact(lambda tx: u.record_prices(tx, old.version, old.model_prices()))  # reloading an old table changes nothing
    db.transact(lambda tx: ledger.apply_receipt(tx, "receipt:b", {**request("b"), "usage": usage(1000, 0)}, new))
    db.transact(lambda tx: ledger.apply_receipt(tx, "receipt:a", {**request("a"), "usage": usage(1000, 0)}, new))  # a retry
    rows = db.transact(lambda tx: tx.all("SELECT request_id, price_version, cost_usd FROM receipts ORDER BY request_id"),
                       write=False)
    assert [(r["request_id"], r["price_version"]) for r in rows] == [("a", old.version), ("b", new.version)]
    assert rows[0]["cost_usd"] == pytest.approx(1.0) and rows[1]["cost_usd"] == pytest.approx(0.01)
    prices = db.transact(lambda tx: tx.all("SELECT price_version, input_usd_per_mtok FROM prices ORDER BY price_version"),
                         write=False)
    assert [(p["price_version"], p["input_usd_per_mtok"]) for p in prices] == [(old.version, 1000.0), (new.version, 10.0)]


async def test_attribution_fixed_before_dispatch_reaches_the_ledger_through_the_outbox(backend: Backend) -> None:
    control = backend.open("control", migrated="control")
    ledger = backend.open("usage", migrated="usage")

    def send(tx: Tx) -> str:
        _, work = new_chat(tx)
        attempt = c.admit(tx, work, mode="fresh", turn_id=None)
        work = {**c.get_work(tx, work["work_id"]), "goal_id": "gol_9", "goal_revision": 2}
        c.record_request(tx, work, request_id="req_a", attempt_id=attempt["attempt_id"], turn_id=attempt["turn_id"],
                         purpose="work", model="openai:m")
        return str(attempt["attempt_id"])

    attempt_id = control.transact(send)
    dispatcher = OutboxDispatcher(control, ledger, table(PRICES_V2))
    assert await dispatcher.dispatch_due() == 1
    row = ledger.transact(lambda tx: tx.one("SELECT * FROM requests WHERE request_id = 'req_a'"), write=False)
    assert row is not None
    assert (row["goal_id"], row["goal_revision"], row["attempt_id"], row["state"]) == ("gol_9", 2, attempt_id, "sent")
    # the attempt died while the request was out: the ledger learns its usage is unknown
    control.transact(lambda tx: c.lose_requests(tx, attempt_id))
    assert await dispatcher.dispatch_due() == 1
    s = ledger.transact(lambda tx: u.summary(tx, goal_id="gol_9"), write=False)
    assert s["unknown_usage_requests"] == 1 and s["in_flight_requests"] == 0
    assert control.transact(lambda tx: c.pending_outbox_count(tx), write=False) == 0


# --------------------------------------------------------------------------- active time


def test_active_time_counts_running_attempts_only_and_keeps_the_last_heartbeat_of_a_dead_one(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def history(tx: Tx) -> str:
        session, work = new_chat(tx)
        rows = [  # (state, started, ended, last heartbeat): 100 s of work, a pause, 30 s, a crash, 50 s running
            ("ended", 1000.0, 1100.0, 1100.0),
            ("dead", 5000.0, 9000.0, 5030.0),  # discovered dead at 9000: the downtime is not active time
            ("running", 9100.0, None, 9140.0),
        ]
        for i, (state, start, end, beat) in enumerate(rows):
            tx.execute(
                "INSERT INTO attempts (attempt_id, turn_id, work_id, session_id, state, mode, control_version,"
                " continuation_key, admitted_at, started_at, ended_at, heartbeat_at)"
                " VALUES (?, 'trn', ?, ?, ?, 'fresh', 1, ?, 0, ?, ?, ?)",
                (f"att_{i}", work["work_id"], session["session_id"], state, f"k{i}", start, end, beat),
            )
        return str(session["session_id"])

    sid = db.transact(history)
    t = db.transact(lambda tx: c.active_time(tx, session_id=sid, now=9150.0), write=False)
    assert t["active_seconds"] == pytest.approx(100 + 30 + 50)
    assert t["running"] is True
    assert t["unknown_intervals"] == [{"attempt_id": "att_1", "from": 5030.0, "to": 9000.0}]


def test_usage_db_is_its_own_file(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'usage.db'}")
    from jupyter_goals.store.schema import migrate

    try:
        assert migrate(db, "usage") == 2
        tables = {r["name"] for r in db.transact(
            lambda tx: tx.all("SELECT name FROM sqlite_master WHERE type = 'table'"), write=False)}
    finally:
        db.close()
    assert {"requests", "receipts", "prices", "activity"} <= tables and "work_items" not in tables
