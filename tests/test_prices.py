"""The shipped, dated price table; a user's file replacing or extending it; cache reads and writes and
service tiers priced at their own rates; named models priced as the model they stand for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_goals.models import Usage
from jupyter_goals.store import usage as u
from jupyter_goals.usage import ledger
from jupyter_goals.usage.prices import load_price_table, shipped_table_bytes
from tests.storekit import Backend, request

M = 1_000_000


def test_the_shipped_table_is_dated_and_prices_common_openai_and_anthropic_models() -> None:
    shipped = json.loads(shipped_table_bytes())
    assert shipped["as_of"] and shipped["version"].endswith(shipped["as_of"]) and "pricing" in shipped["source"]
    t = load_price_table(None)
    assert t.version.startswith(f"{shipped['version']}:")
    assert t.quote("openai:gpt-4o-mini", Usage(input_tokens=M, output_tokens=M, cached_tokens=M // 2)) == pytest.approx(
        0.075 + 0.0375 + 0.6)
    # Anthropic: cache reads and cache writes each at their own rate, the rest of the prompt at the input rate
    sonnet = Usage(input_tokens=4 * M, output_tokens=M, cached_tokens=M, cache_write_tokens=2 * M)
    assert t.quote("anthropic:claude-sonnet-4-5", sonnet) == pytest.approx(3 + 0.3 + 2 * 3.75 + 15)
    assert t.quote("anthropic:claude-sonnet-4-5-20250929", sonnet) == t.quote("anthropic:claude-sonnet-4-5", sonnet)
    assert t.quote("openai:some-future-model", Usage(input_tokens=1, output_tokens=1)) is None  # unknown, never zero
    assert t.quote("scripted:/demo.json", Usage(input_tokens=5, output_tokens=5)) == 0.0


def test_a_service_tier_is_priced_when_the_table_has_it_and_unknown_otherwise() -> None:
    t = load_price_table(None)
    flex = Usage(input_tokens=M, output_tokens=M, service_tier="flex")
    assert t.quote("openai:gpt-5", flex) == pytest.approx(0.625 + 5)
    assert t.quote("openai:gpt-5", flex.model_copy(update={"service_tier": "default"})) == pytest.approx(1.25 + 10)
    assert t.quote("openai:gpt-4o", flex) is None  # no flex price listed: unknown, not the standard price


def test_a_user_file_replaces_the_shipped_table_or_extends_it(tmp_path: Path) -> None:
    mine = tmp_path / "prices.json"
    mine.write_text(json.dumps({"version": "mine-1", "models": {"openai:gpt-4o": {
        "input_usd_per_mtok": 1, "output_usd_per_mtok": 1}}}))
    replaced = load_price_table(str(mine))
    assert replaced.version.startswith("mine-1:") and replaced.price("anthropic:claude-haiku-4-5") is None
    mine.write_text(json.dumps({"version": "mine-2", "extends_shipped": True, "models": {"openai:gpt-4o": {
        "input_usd_per_mtok": 1, "output_usd_per_mtok": 1}}}))
    extended = load_price_table(str(mine))
    assert extended.quote("openai:gpt-4o", Usage(input_tokens=M, output_tokens=0)) == pytest.approx(1)
    assert extended.quote("anthropic:claude-haiku-4-5", Usage(input_tokens=M, output_tokens=0)) == pytest.approx(1)
    assert extended.version.startswith("mine-2:") and extended.version != load_price_table(None).version


def test_a_named_model_is_priced_as_the_model_it_stands_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_goals.server import catalog

    monkeypatch.setenv(catalog.NAMED_ENV, json.dumps({"work": {"provider": "anthropic", "model": "claude-haiku-4-5",
                                                               "api_key_env": "WORK_KEY"}}))
    t = load_price_table(None)
    assert t.quote("work", Usage(input_tokens=M, output_tokens=M)) == pytest.approx(1 + 5)


def test_the_tier_that_served_a_request_is_recorded_on_it_in_the_ledger(backend: Backend) -> None:
    db = backend.open("usage", migrated="usage")
    t = load_price_table(None)
    served = {"input_tokens": M, "output_tokens": 0, "service_tier": "flex"}
    db.transact(lambda tx: u.apply_request(tx, request("a", "openai:gpt-5")))
    db.transact(lambda tx: ledger.apply_receipt(tx, "receipt:a", {**request("a", "openai:gpt-5"), "usage": served}, t))
    row = db.transact(lambda tx: tx.one("SELECT r.service_tier, x.cost_usd FROM requests r JOIN receipts x"
                                        " ON x.request_id = r.request_id WHERE r.request_id = 'a'"), write=False)
    assert row is not None and row["service_tier"] == "flex" and row["cost_usd"] == pytest.approx(0.625)
