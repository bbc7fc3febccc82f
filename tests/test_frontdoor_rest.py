"""The front door's REST routes (issue 12) through a real in-process Jupyter server (pytest-jupyter):
``GET /models`` and model names on ``POST /sessions``, keyset-paged and filtered ``GET /sessions``, and
transcript paging of ``GET /sessions/{id}`` in both directions on a 20,000-item transcript.

``workers = 0``: nothing executes turns. Sessions and transcripts are seeded through the real store
functions (``jupyter_goals/testing/seed.py``) into the server's own control.db.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.server.app import demo_model
from jupyter_goals.server.params import LATEST
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database
from jupyter_goals.testing.seed import seed_long_session, seed_sessions
from tests import restkit
from tests.restkit import Api, assert_error

Json = dict[str, Any]
# the REST tests' fixtures: their event loop, isolated state dir, and the started server's client
jp_asyncio_loop = restkit.jp_asyncio_loop
goals_state_dir = restkit.goals_state_dir
api = restkit.api

MODELS = {
    "fast": {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "FRONTDOOR_TEST_KEY", "context_window": 128000},
    "local": {"provider": "openai", "model": "llama3", "base_url": "http://127.0.0.1:9/v1"},
    "claude": {"provider": "anthropic", "model": "claude-sonnet-4"},
    "mini": {"provider": "openai", "model": "gpt-4o-mini"},
}


@pytest.fixture
def jp_server_config(goals_state_dir: Path, request: pytest.FixtureRequest, tmp_path: Path) -> Json:
    marker = request.node.get_closest_marker("goals_config")
    prices = tmp_path / "prices.json"
    prices.write_text('{"version": "t1", "models": {"openai:gpt-4o-mini": {"input_usd_per_mtok": 0.15,'
                      ' "output_usd_per_mtok": 0.6}}, "free_providers": ["scripted"]}')
    goals: Json = {"workers": 0, "models": MODELS, "price_table": str(prices)}
    goals.update(marker.kwargs if marker else {})
    return {"ServerApp": {"jpserver_extensions": {"jupyter_goals": True}, "reraise_server_extension_failures": True},
            "GoalsApp": goals}


def control_db(state: Path) -> Database:
    return Database(f"sqlite:///{state / 'control.db'}")


# --------------------------------------------------------------------------- models


async def test_models_lists_the_demo_default_and_each_configured_model_with_credentials_and_prices(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRONTDOOR_TEST_KEY", "sk-test")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    answer = await api.ok("GET", "models")
    assert answer["default_model"] == "demo"
    by_name = {m["name"]: m for m in answer["models"]}
    assert list(by_name) == ["demo", "fast", "local", "claude", "mini"]
    for m in answer["models"]:
        assert {"name", "provider", "model", "credentials_present", "priced", "default", "description"} <= set(m)
    demo = by_name["demo"]
    assert (demo["provider"], demo["model"], demo["default"]) == ("scripted", demo_model().removeprefix("scripted:"), True)
    assert demo["credentials_present"] is True and demo["priced"] is True  # scripted: no key, free
    for word in ('"list"', '"slow"', '"write hello.txt"', "Goal"):
        assert word in demo["description"]
    assert (by_name["fast"]["credentials_present"], by_name["fast"]["priced"], by_name["fast"]["default"]) == (True, True, False)
    assert by_name["fast"]["context_window"] == 128000
    # a local endpoint with no key named needs none (resolve_provider serves it without OPENAI_API_KEY)
    assert by_name["local"]["credentials_present"] is True and by_name["local"]["priced"] is False
    assert by_name["claude"]["credentials_present"] is False

    monkeypatch.delenv("FRONTDOOR_TEST_KEY")
    again = {m["name"]: m for m in (await api.ok("GET", "models"))["models"]}
    assert again["fast"]["credentials_present"] is False  # read from the server's environment at each request


async def test_a_session_model_is_a_listed_name_or_a_provider_string_and_an_unknown_name_is_400(api: Api) -> None:
    async def stored(model: str | None) -> str:
        body = {"title": "m"} if model is None else {"title": "m", "model": model}
        sid = (await api.ok("POST", "sessions", body, expect=201))["session_id"]
        return str((await api.ok("GET", f"sessions/{sid}"))["session"]["model"])

    assert await stored(None) == demo_model()
    assert await stored("demo") == demo_model()
    assert await stored("mini") == "openai:gpt-4o-mini"  # resolved: workers need no catalog
    assert await stored("fast") == "fast"  # keeps its own key variable: workers resolve the name
    assert await stored("local") == "local"  # keeps its own base_url
    assert await stored("openai:gpt-4.1") == "openai:gpt-4.1"
    code, answer = await api.call("POST", "sessions", {"title": "x", "model": "gpt-5-turbo"})
    assert code == 400, answer
    assert_error(answer, "unknown_model")
    for name in ("demo", "fast", "local", "claude"):
        assert name in answer["message"]
    assert (await api.ok("GET", "sessions"))["sessions"][0]["model"] == "openai:gpt-4.1"


@pytest.mark.goals_config(models={"broken": {"provider": "carrier-pigeon", "model": ""}, "fine": {"provider": "openai"}})
async def test_a_bad_models_config_is_reported_and_the_server_still_serves_its_default(api: Api) -> None:
    answer = await api.ok("GET", "models")
    assert "broken.provider" in answer["config_error"] and "fine.model" in answer["config_error"]
    assert [m["name"] for m in answer["models"]] == ["demo"]
    assert (await api.ok("GET", "health"))["status"] == "ok"
    await api.ok("POST", "sessions", {"title": "still works"}, expect=201)


# --------------------------------------------------------------------------- session list paging


async def walk(api: Api, limit: int, **params: Any) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        query = [("limit", limit), *((k, x) for k, v in params.items() for x in (v if isinstance(v, list) else [v]))]
        page = await api.ok("GET", "sessions", params=query + ([("cursor", cursor)] if cursor else []))
        assert len(page["sessions"]) <= limit
        ids += [s["session_id"] for s in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


async def test_sessions_page_newest_activity_first_with_a_cursor_that_survives_concurrent_inserts(
    api: Api, goals_state_dir: Path
) -> None:
    old = seed_sessions(goals_state_dir, 230)
    first = await api.ok("GET", "sessions")
    assert len(first["sessions"]) == 100 and first["next_cursor"]  # default limit 100
    assert [s["session_id"] for s in first["sessions"]] == old[::-1][:100]  # newest first
    summary = first["sessions"][0]
    assert {"session_id", "title", "cwd", "model", "permissions", "created_at", "updated_at", "work", "actions",
            "goal", "state"} <= set(summary)
    assert summary["state"] == "done" and summary["goal"] is None and summary["work"]["phase"] == "done"

    # a walk that new sessions interleave with still sees every old session exactly once, in order
    seen: list[str] = []
    cursor = None
    while True:
        page = await api.ok("GET", "sessions", params={"limit": 50, **({"cursor": cursor} if cursor else {})})
        seen += [s["session_id"] for s in page["sessions"]]
        seed_sessions(goals_state_dir, 3, prefix="Inserted")
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == old[::-1]

    # activity moves a session to the top: a message accepted in the oldest one
    await api.send(old[0], "hello again", "again-1")
    assert (await api.ok("GET", "sessions", params={"limit": 1}))["sessions"][0]["session_id"] == old[0]


async def test_sessions_filter_by_state_and_text_and_refuse_bad_paging_arguments(
    api: Api, goals_state_dir: Path
) -> None:
    done = seed_sessions(goals_state_dir, 5, prefix="Report")
    idle = seed_sessions(goals_state_dir, 4, with_work=False, prefix="Scratch 100%_sure")
    queued = await api.new_session(title="Queued analysis", cwd=str(goals_state_dir))
    await api.send(queued, "work on it", "q-1")

    assert set(await walk(api, 2, state="idle")) == set(idle)
    assert set(await walk(api, 3, state="done,queued")) == {*done, queued}
    assert set(await walk(api, 3, state=["queued", "idle"])) == {*idle, queued}
    assert set(await walk(api, 2, q="REPORT")) == set(done)  # case-insensitive title
    assert set(await walk(api, 2, q="project-3")) == {done[3], idle[3]}  # cwd
    assert set(await walk(api, 10, q="100%_")) == set(idle)  # % and _ are literal text
    assert await walk(api, 10, q="1_0") == []  # an unescaped _ would match "100"
    assert set(await walk(api, 10, q="report", state="queued")) == set()

    for params in ({"limit": 0}, {"limit": 501}, {"limit": "ten"}, {"cursor": "not-a-cursor"},
                   {"cursor": "WzEsMl0"}, {"state": "sleeping"}):
        code, answer = await api.call("GET", "sessions", params=params)
        assert code == 400, (params, answer)
        assert_error(answer, "bad_request")
    assert len((await api.ok("GET", "sessions", params={"limit": 500}))["sessions"]) == 10


# --------------------------------------------------------------------------- transcript paging


async def test_a_20000_item_transcript_pages_back_from_latest_and_forward_from_a_seq(
    api: Api, goals_state_dir: Path
) -> None:
    sid = seed_long_session(goals_state_dir, 20_000)
    other = seed_long_session(goals_state_dir, 100, title="later session")  # newer items of another session

    t0 = time.perf_counter()
    snap = await api.ok("GET", f"sessions/{sid}", params={"before": "latest", "limit": 200})
    elapsed = time.perf_counter() - t0
    page = snap["transcript"]
    seqs = [i["seq"] for i in page["items"]]
    assert len(seqs) == 200 and seqs == sorted(seqs)
    assert page["items"][-1]["content"] == "answer 4999: those are the files."  # the newest item
    assert page["next_cursor"] is None and page["prev_cursor"] == seqs[0]
    print(f"\nlatest page of a 20,000-item transcript: {elapsed * 1000:.1f} ms")

    # back to the start: every item once, in order
    back = list(seqs)
    cursor = page["prev_cursor"]
    while cursor is not None:
        page = (await api.ok("GET", f"sessions/{sid}", params={"before": cursor, "limit": 1000}))["transcript"]
        back = [i["seq"] for i in page["items"]] + back
        assert page["next_cursor"] == page["items"][-1]["seq"]  # newer items exist
        cursor = page["prev_cursor"]
    assert len(back) == len(set(back)) == 20_000 and back == sorted(back)

    # forward from a seq
    fwd: list[int] = []
    after = 0
    while True:
        page = (await api.ok("GET", f"sessions/{sid}", params={"after": after, "limit": 1500}))["transcript"]
        fwd += [i["seq"] for i in page["items"]]
        assert page["prev_cursor"] == (None if after == 0 else page["items"][0]["seq"])
        if page["next_cursor"] is None:
            break
        after = page["next_cursor"]
    assert fwd == back
    middle = (await api.ok("GET", f"sessions/{sid}", params={"after": back[9_999], "limit": 3}))["transcript"]
    assert [i["seq"] for i in middle["items"]] == back[10_000:10_003]
    assert [i["kind"] for i in middle["items"]] == ["user", "tool_call", "tool_result"]
    assert middle["items"][2]["state"] == "committed" and middle["items"][1]["tool"] == "shell"

    assert len((await api.ok("GET", f"sessions/{other}", params={"before": "latest", "limit": 500}))["transcript"]["items"]) == 100
    for params in ({"before": "soon"}, {"before": "latest", "after": 5}, {"after": "x"}):
        code, answer = await api.call("GET", f"sessions/{sid}", params=params)
        assert code == 400, (params, answer)
        assert_error(answer, "bad_request")


def test_transcript_pages_are_index_seeks_not_scans(goals_state_dir: Path) -> None:
    """A page of any transcript costs index seeks: SQLite's plan for every statement
    ``transcript_page`` runs (both directions, and the "are there more" probes) searches
    (session_id, seq) and never scans the table."""
    sid = seed_long_session(goals_state_dir, 40)
    db = control_db(goals_state_dir)
    try:
        statements: list[str] = []
        conn = db._ensure()
        conn.set_trace_callback(statements.append)  # the statements as run, parameters bound
        for kwargs in ({"before": LATEST}, {"before": 20}, {"after": 0}, {"after": 10}):
            db.transact(lambda tx, kw=kwargs: c.transcript_page(tx, sid, limit=5, **kw))
        conn.set_trace_callback(None)
        reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert len(reads) >= 8
        for sql in reads:
            plan = " ".join(str(r["detail"]) for r in db.transact(lambda tx, sql=sql: tx.all("EXPLAIN QUERY PLAN " + sql)))
            assert "transcript_session_seq" in plan and "SCAN" not in plan, (sql, plan)
    finally:
        db.close()


def test_a_worker_resolves_a_named_model_from_the_servers_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that keeps its own endpoint or key variable is resolved in the worker from
    ``JUPYTER_GOALS_MODELS`` (set by the server before it starts workers), credentials included."""
    from jupyter_goals.models import ReasonCode
    from jupyter_goals.providers.openai_compat import OpenAICompatProvider
    from jupyter_goals.providers.resolve import check_model, resolve_provider
    from jupyter_goals.server import catalog
    from jupyter_goals.usage.prices import load_price_table

    cat = catalog.ModelCatalog(demo_model(), catalog.parse_specs(MODELS), demo_model(), load_price_table(None))
    exported = cat.export_named()
    assert set(json.loads(exported)) == {"fast", "local"}  # plain ones travel as provider:model
    monkeypatch.setenv(catalog.NAMED_ENV, exported)
    monkeypatch.delenv("FRONTDOOR_TEST_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    local = resolve_provider("local")
    assert isinstance(local, OpenAICompatProvider) and (local.model, local.base_url) == ("llama3", "http://127.0.0.1:9/v1")
    assert check_model("fast") == ReasonCode.RESOURCE_MISSING_CREDENTIALS  # its own key variable is unset
    monkeypatch.setenv("FRONTDOOR_TEST_KEY", "sk-test")
    fast = resolve_provider("fast")
    assert isinstance(fast, OpenAICompatProvider) and fast.api_key == "sk-test"
    assert check_model("nobody") == ReasonCode.RESOURCE_MISSING_MODEL
