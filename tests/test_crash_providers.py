"""Real models behind real servers: a `jupyter server` process whose workers call the local
Anthropic-compatible server (tests/anthropic_server.py) over HTTP, killed with SIGKILL at the
provider interruption points; and a named model whose key file appears while its work waits.

"Counted once" is checked in usage.db itself: one receipt per provider request that answered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.anthropic_server import AnthropicTestServer, anthropic_usage
from tests.openai_server import Plan, ToolCallPlan
from tests.servers import APPEND_RULES, db_rows, fired, lines, new_session, server_env, usage_rows, wait_for

pytestmark = pytest.mark.slow

KEY = "sk-ant-crash-test"
TOOL_USAGE = anthropic_usage(20, 7, cache_read=30, cache_write=10)  # prompt = 60 tokens, 30 of them cache reads
TEXT_USAGE = anthropic_usage(25, 4, cache_read=40)


def appender(body: dict[str, Any]) -> Plan:
    """The model: append a line with the shell tool, then say so once the tool result is back."""
    last = body["messages"][-1]["content"]
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last):
        return Plan(text_chunks=["Appended ", "one line."], usage_chunks=[TEXT_USAGE])
    return Plan(text_chunks=["Appending."], tool_calls=[ToolCallPlan("shell", {"command": "echo line >> out.txt"})],
                usage_chunks=[TOOL_USAGE])


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with AnthropicTestServer(api_key=KEY, responder=appender) as api, server_env(tmp_path, APPEND_RULES) as e:
        yield {**e, "api": api}


def assert_each_answer_counted_once(state: Path) -> list[dict[str, Any]]:
    answered = {r["request_id"] for r in db_rows(state, "SELECT request_id FROM requests WHERE state = 'received'")}
    receipts = usage_rows(state, "SELECT request_id, input_tokens, cached_tokens, output_tokens, cost_usd FROM receipts"
                                 " WHERE usage_known = 1")
    assert answered and sorted(r["request_id"] for r in receipts) == sorted(answered)
    return receipts


@pytest.mark.parametrize("point", ["provider.after_response", "provider.after_commit"])
def test_an_anthropic_chat_finishes_after_a_crash_at_the_provider_and_each_answer_is_counted_once(
    env: dict[str, Any], point: str
) -> None:
    api: AnthropicTestServer = env["api"]
    anthropic = {"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": KEY}
    # the whole server dies at the point (faults.py): a live server would recover the worker's work at
    # once, and a request in flight at a later kill from here would be one more lost answer
    server = env["make"](env={**anthropic, "JUPYTER_GOALS_CRASH_SCOPE": "group"},
                         model_="anthropic:claude-sonnet-4-5").start(crash_at=point)
    sid = new_session(server, env["root"])
    server.client().send(sid, "please append a line", client_request_id="r1")
    assert server.wait_exit(timeout=60) == -9  # the server and its workers died at the point
    assert fired(env["state"], point)

    server = env["make"](env=anthropic, model_="anthropic:claude-sonnet-4-5").start()
    cl = server.client()
    snap = cl.wait(sid, timeout=60)
    assert snap["work"]["phase"] == "done" and lines(env["out"]) == 1
    assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "Appended one line."
    wait_for(lambda: cl.usage(session_id=sid)["ledger_writes_pending"] == 0, what="the outbox to drain")
    receipts = assert_each_answer_counted_once(env["state"])
    # each answered request once, with Anthropic's cache reads inside the prompt count
    assert sorted((r["input_tokens"], r["cached_tokens"], r["output_tokens"]) for r in receipts) == sorted(
        [(60, 30, 7)] * (len(receipts) - 1) + [(65, 40, 4)])
    answer = cl.usage(session_id=sid)
    assert answer["known_tokens"]["input"] == sum(r["input_tokens"] for r in receipts)
    # priced by the shipped table: cache writes at $3.75/MTok, reads at $0.30, the rest at $3 in, $15 out
    tool_cost, text_cost = (20 * 3 + 10 * 3.75 + 30 * 0.3 + 7 * 15) / 1e6, (25 * 3 + 40 * 0.3 + 4 * 15) / 1e6
    assert sorted(r["cost_usd"] for r in receipts) == pytest.approx(sorted([tool_cost] * (len(receipts) - 1) + [text_cost]))
    assert answer["known_cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in receipts), abs=1e-6)  # shown rounded
    lost = len(db_rows(env["state"], "SELECT 1 FROM requests WHERE state = 'lost'"))
    assert answer["unknown_usage_requests"] == lost == (1 if point == "provider.after_response" else 0)
    # the tool result went back to the model as a tool_result for the tool_use it answers
    final = api.completion_requests[-1].body
    uses = [b["id"] for m in final["messages"] for b in m["content"] if b.get("type") == "tool_use"]
    results = [b["tool_use_id"] for m in final["messages"] for b in m["content"] if b.get("type") == "tool_result"]
    assert results[-1] in uses and "exit status: 0" in str(final["messages"][-1]["content"])
    assert all(r.headers.get("x-api-key") == KEY for r in api.completion_requests)
    server.kill()


def test_work_waits_for_a_missing_key_and_continues_by_itself_once_the_key_file_appears(env: dict[str, Any]) -> None:
    api: AnthropicTestServer = env["api"]
    key_file = env["state"].parent / "keys" / "claude.key"
    config_dir = env["state"].parent / "jupyter_config"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_server_config.json").write_text(json.dumps({"GoalsApp": {"models": {"claude": {
        "provider": "anthropic", "model": "claude-haiku-4-5", "base_url": api.base_url, "api_key_file": str(key_file)}}}}))
    server = env["make"](env={"ANTHROPIC_API_KEY": ""}).start()
    cl = server.client()
    listed = {m["name"]: m for m in cl.http.get("/models").json()["models"]}
    assert listed["claude"]["credentials_present"] is False and listed["claude"]["priced"] is True
    assert listed["claude"]["price"] == {"input_usd_per_mtok": 1, "output_usd_per_mtok": 5, "cached_input_usd_per_mtok": 0.1,
                                         "cache_write_usd_per_mtok": 1.25}  # the shipped table's Haiku 4.5 row
    sid = str(cl.create_session(title="key", cwd=str(env["root"]), model="claude",
                                permissions={"mode": "bypass"})["session"]["session_id"])
    cl.send(sid, "please append a line", client_request_id="r1")
    wait_for(lambda: cl.session(sid)["work"]["reason_code"] == "resource_missing.credentials",
             what="the work to wait for its key")
    assert cl.session(sid)["work"]["phase"] == "waiting" and api.completion_requests == []

    key_file.parent.mkdir()
    key_file.write_text(KEY + "\n")  # no restart, no click: the next Coordinator pass sees it
    assert cl.wait(sid, timeout=60)["work"]["phase"] == "done" and lines(env["out"]) == 1
    assert {r.headers.get("x-api-key") for r in api.completion_requests} == {KEY}
    assert {m["name"]: m for m in cl.http.get("/models").json()["models"]}["claude"]["credentials_present"] is True

    def cat_key(body: dict[str, Any]) -> Plan:  # a tool prints the key file: redacted before any commit
        if any(b.get("type") == "tool_result" for b in body["messages"][-1]["content"]):
            return Plan(text_chunks=["Printed it."], usage_chunks=[TEXT_USAGE])
        return Plan(tool_calls=[ToolCallPlan("shell", {"command": f"cat {key_file}"})], usage_chunks=[TOOL_USAGE])

    api.responder = cat_key
    cl.send(sid, "print the key file", client_request_id="r2")
    snap = cl.wait(sid, timeout=60)
    printed = [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "tool_result"][-1]
    assert "[redacted: api_key_file:claude]" in printed and KEY not in printed
    assert KEY not in json.dumps(api.completion_requests[-1].body)  # nor sent back to the model
    # the key never reaches a stored record
    for table, column in (("transcript", "content"), ("requests", "error"), ("events", "payload")):
        assert not [r for r in db_rows(env["state"], f"SELECT {column} AS v FROM {table}") if KEY in str(r["v"])]
    server.kill()


def test_an_overloaded_anthropic_answer_waits_at_least_its_retry_after_then_continues(env: dict[str, Any]) -> None:
    api: AnthropicTestServer = env["api"]
    api.plan(status=529, error_message="Overloaded", headers={"retry-after": "3"})  # the test backoff base is 0.2 s
    server = env["make"](env={"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": KEY},
                         model_="anthropic:claude-sonnet-4-5").start()
    cl = server.client()
    sid = new_session(server, env["root"])
    cl.send(sid, "please append a line", client_request_id="r1")
    wait_for(lambda: cl.session(sid)["work"]["reason_code"] == "provider_retrying", what="the work to wait for the retry")
    assert "529" in cl.session(sid)["work"]["reason"]
    assert cl.wait(sid, timeout=60)["work"]["phase"] == "done" and lines(env["out"]) == 1
    first, second = api.completion_requests[:2]
    assert second.received_at - first.received_at >= 3.0
    server.kill()


def test_a_named_openai_model_asks_for_its_service_tier_which_is_recorded_on_the_request_and_priced(
    env: dict[str, Any]
) -> None:
    from tests.openai_server import OpenAITestServer, openai_usage

    def chunk(**fields: Any) -> dict[str, Any]:
        return {"id": "chatcmpl-flex", "service_tier": "flex", **fields}

    flex_answer = [chunk(choices=[{"index": 0, "delta": {"content": "Hi"}}]),
                   chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
                   chunk(choices=[], usage={**openai_usage(1000, 100, 200),
                                            "completion_tokens_details": {"reasoning_tokens": 60}})]
    with OpenAITestServer() as oa:
        oa.plan(raw_events=flex_answer)  # answered, then the worker dies before the commit
        oa.plan(raw_events=flex_answer)
        config_dir = env["state"].parent / "jupyter_config"
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "jupyter_server_config.json").write_text(json.dumps({"GoalsApp": {"models": {"flex": {
            "provider": "openai", "model": "gpt-5", "base_url": oa.base_url, "service_tier": "flex"}}}}))
        # the whole server dies at the point: a live server would send the retry at once, and a kill
        # from here could catch it in flight (a second lost request)
        server = env["make"](env={"JUPYTER_GOALS_CRASH_SCOPE": "group"}).start(crash_at="provider.after_response")
        cl = server.client()
        sid = str(cl.create_session(title="flex", cwd=str(env["root"]), model="flex")["session"]["session_id"])
        cl.send(sid, "hello", client_request_id="r1")
        assert server.wait_exit(timeout=60) == -9
        assert fired(env["state"], "provider.after_response")
        server = env["make"]().start()
        cl = server.client()
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
        wait_for(lambda: cl.usage(session_id=sid)["ledger_writes_pending"] == 0, what="the outbox to drain")
        assert [r.body["service_tier"] for r in oa.completion_requests] == ["flex", "flex"]
        server.kill()
    rows = usage_rows(env["state"], "SELECT q.state, q.service_tier, r.cost_usd FROM requests q"
                                    " LEFT JOIN receipts r ON r.request_id = q.request_id ORDER BY q.created_at")
    # the lost one carries the tier it asked for; the answered one the tier that served it, priced at flex rates
    assert [(r["state"], r["service_tier"]) for r in rows] == [("lost", "flex"), ("settled", "flex")]
    assert rows[1]["cost_usd"] == pytest.approx((800 * 0.625 + 200 * 0.0625 + 100 * 5) / 1e6)
    outbox = db_rows(env["state"], "SELECT payload FROM outbox WHERE kind = 'usage.receipt'")
    assert [json.loads(o["payload"])["usage"]["reasoning_tokens"] for o in outbox] == [60]  # kept with the receipt


def test_a_key_that_vanishes_mid_turn_makes_the_work_wait_and_it_continues_when_the_key_is_back(
    env: dict[str, Any]
) -> None:
    api: AnthropicTestServer = env["api"]
    key_file = env["state"].parent / "claude.key"
    key_file.write_text(KEY)

    def rotate(body: dict[str, Any]) -> Plan:  # the model's own command removes the key between two requests
        if any(b.get("type") == "tool_result" for b in body["messages"][-1]["content"]):
            return Plan(text_chunks=["Rotated."], usage_chunks=[TEXT_USAGE])
        return Plan(tool_calls=[ToolCallPlan("shell", {"command": f"rm {key_file}"})], usage_chunks=[TOOL_USAGE])

    api.responder = rotate
    config_dir = env["state"].parent / "jupyter_config"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_server_config.json").write_text(json.dumps({"GoalsApp": {"models": {"claude": {
        "provider": "anthropic", "model": "claude-haiku-4-5", "base_url": api.base_url, "api_key_file": str(key_file)}}}}))
    server = env["make"](env={"ANTHROPIC_API_KEY": ""}).start()
    cl = server.client()
    sid = str(cl.create_session(title="rotate", cwd=str(env["root"]), model="claude",
                                permissions={"mode": "bypass"})["session"]["session_id"])
    cl.send(sid, "rotate the key", client_request_id="r1")
    wait_for(lambda: cl.session(sid)["work"]["reason_code"] == "resource_missing.credentials",
             what="the work to wait for its key")
    assert cl.session(sid)["work"]["phase"] == "waiting" and len(api.completion_requests) == 1
    key_file.write_text(KEY)
    snap = cl.wait(sid, timeout=60)
    assert snap["work"]["phase"] == "done" and len(api.completion_requests) == 2
    assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "Rotated."
    server.kill()
