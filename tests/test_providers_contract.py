"""One provider contract, the same cases against both local fake servers: the OpenAI-compatible
adapter on tests/openai_server.py and the Anthropic adapter on tests/anthropic_server.py (real HTTP
on 127.0.0.1, real streaming; only the model is scripted)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.models import (
    EffectState,
    ItemKind,
    ProviderMessage,
    ProviderRequest,
    ReasonCode,
    TranscriptItem,
    Usage,
)
from jupyter_goals.providers.anthropic import AnthropicProvider
from jupyter_goals.providers.base import Provider, ProviderError
from jupyter_goals.providers.openai_compat import OpenAICompatProvider
from jupyter_goals.providers.resolve import check_model, resolve_provider
from jupyter_goals.recovery.repair import repair_history
from jupyter_goals.usage.prices import load_price_table
from tests.anthropic_server import AnthropicTestServer, anthropic_usage
from tests.openai_server import OpenAITestServer, Recorder, openai_usage


@dataclass
class Fake:
    """One adapter + its fake server, with the wire details the shared cases need."""

    kind: str
    server: OpenAITestServer
    provider: Provider
    wire_usage: Callable[[Usage], dict[str, Any]]
    tool_uses: Callable[[dict[str, Any]], list[tuple[str, str]]]  # request body → [(id, name)]
    tool_results: Callable[[dict[str, Any]], list[tuple[str, str]]]  # request body → [(id, content)]


def _openai_tool_uses(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["id"], c["function"]["name"]) for m in body["messages"] for c in m.get("tool_calls") or []]


def _openai_tool_results(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], m["content"]) for m in body["messages"] if m["role"] == "tool"]


def _blocks(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [b for m in body["messages"] for b in m["content"] if isinstance(b, dict) and b.get("type") == kind]


@pytest.fixture(params=["openai", "anthropic"])
def fake(request: pytest.FixtureRequest) -> Iterator[Fake]:
    if request.param == "openai":
        with OpenAITestServer() as oa:
            yield Fake("openai", oa, OpenAICompatProvider("test-model", base_url=oa.base_url, api_key="sk-test"),
                       lambda u: openai_usage(u.input_tokens, u.output_tokens, u.cached_tokens),
                       _openai_tool_uses, _openai_tool_results)
    else:
        with AnthropicTestServer(api_key="sk-ant-test") as an:
            yield Fake("anthropic", an, AnthropicProvider("claude-test", base_url=an.base_url, api_key="sk-ant-test"),
                       lambda u: anthropic_usage(u.input_tokens - u.cached_tokens, u.output_tokens, u.cached_tokens),
                       lambda b: [(x["id"], x["name"]) for x in _blocks(b, "tool_use")],
                       lambda b: [(x["tool_use_id"], x["content"]) for x in _blocks(b, "tool_result")])


def _request(messages: list[ProviderMessage] | None = None, **kw: Any) -> ProviderRequest:
    return ProviderRequest(request_id="req-1", messages=messages or [ProviderMessage(role="user", content="hi")], **kw)


async def test_streaming_text_arrives_in_chunks_and_in_the_answer(fake: Fake) -> None:
    fake.server.plan(text_chunks=["Hel", "lo, ", "world"], usage_chunks=[fake.wire_usage(Usage(input_tokens=7, output_tokens=3))])
    rec = Recorder()
    answer = await fake.provider.complete(_request(), on_chunk=rec.on_chunk, on_usage=rec.on_usage)
    assert rec.chunks == ["Hel", "lo, ", "world"] and answer.text == "Hello, world"
    assert answer.tool_calls == [] and answer.stop_reason in ("stop", "end_turn")
    assert answer.usage == Usage(input_tokens=7, output_tokens=3)


async def test_tool_calls_are_assembled_from_streamed_argument_fragments(fake: Fake) -> None:
    fake.server.plan(text_chunks=["Let me look."], tool_calls=[
        {"id": "call_a", "name": "read_file", "arguments": {"path": "/tmp/a.txt", "limit": 100}},
        {"id": "call_b", "name": "shell", "arguments": {"command": "ls -la && echo 'done'"}},
    ], args_chunk_size=3)
    answer = await fake.provider.complete(_request(tools=[{"type": "function", "function": {
        "name": "read_file", "description": "read", "parameters": {"type": "object", "properties": {}}}}]))
    assert answer.text == "Let me look."
    assert [(c.name, c.arguments) for c in answer.tool_calls] == [
        ("read_file", {"path": "/tmp/a.txt", "limit": 100}), ("shell", {"command": "ls -la && echo 'done'"})]
    assert len({c.id for c in answer.tool_calls}) == 2 and answer.stop_reason in ("tool_calls", "tool_use")
    body = fake.server.completion_requests[0].body
    assert "read_file" in str(body["tools"])


async def test_cumulative_usage_snapshots_are_watermarks_never_summed(fake: Fake) -> None:
    snaps = [Usage(input_tokens=100, output_tokens=1, cached_tokens=40), Usage(input_tokens=100, output_tokens=5, cached_tokens=40),
             Usage(input_tokens=100, output_tokens=9, cached_tokens=40)]
    fake.server.plan(text_chunks=["ok"], usage_chunks=[fake.wire_usage(u) for u in snaps])
    rec = Recorder()
    answer = await fake.provider.complete(_request(), on_usage=rec.on_usage)
    assert rec.usages == snaps and answer.usage == snaps[-1]


@pytest.mark.parametrize("status", [429, 529])
async def test_rate_limit_and_overload_are_temporary_faults_with_the_providers_retry_after(fake: Fake, status: int) -> None:
    fake.server.plan(status=status, error_message="slow down", headers={"retry-after": "7"})
    with pytest.raises(ProviderError) as caught:
        await fake.provider.complete(_request())
    assert (caught.value.status, caught.value.retryable, caught.value.retry_after_s) == (status, True, 7.0)
    assert "slow down" in str(caught.value)


@pytest.mark.parametrize("status", [401, 404])
async def test_bad_key_and_unknown_model_are_persistent_faults(fake: Fake, status: int) -> None:
    fake.server.plan(status=status, error_message="no such thing")
    with pytest.raises(ProviderError) as caught:
        await fake.provider.complete(_request())
    assert (caught.value.status, caught.value.retryable) == (status, False)


async def test_a_connection_dropped_mid_stream_is_temporary_and_leaves_a_usage_lower_bound(fake: Fake) -> None:
    fake.server.plan(text_chunks=["Hel", "lo", " there"], usage_chunks=[fake.wire_usage(Usage(input_tokens=12, output_tokens=1)),
                                                                     fake.wire_usage(Usage(input_tokens=12, output_tokens=4))],
                     drop_after=3 if fake.kind == "anthropic" else 2)
    rec = Recorder()
    with pytest.raises(ProviderError) as caught:
        await fake.provider.complete(_request(), on_chunk=rec.on_chunk, on_usage=rec.on_usage)
    assert caught.value.retryable and caught.value.status is None
    assert rec.chunks == ["Hel"]
    if fake.kind == "anthropic":  # message_start carries the input side: a lower bound before any text
        assert rec.usages == [Usage(input_tokens=12, output_tokens=1)]
    else:  # OpenAI-compatible servers send usage only after the answer: unknown, never zero
        assert rec.usages == []


async def test_the_repaired_history_maps_each_tool_result_to_its_call(fake: Fake) -> None:
    """Transcript → history repair → wire: results follow their calls with the same id; a missing
    result is sent as the deterministic unknown-outcome placeholder."""
    items = [
        TranscriptItem(item_id="u1", seq=1, kind=ItemKind.USER, role="user", content="look twice"),
        TranscriptItem(item_id="a1", seq=2, kind=ItemKind.ASSISTANT, role="assistant", content="Looking.", response_id="r1"),
        TranscriptItem(item_id="c1", seq=3, kind=ItemKind.TOOL_CALL, role="assistant", call_id="req_1:0",
                       provider_call_id="toolu_01", tool="list_dir", arguments={"path": "."}, response_id="r1"),
        TranscriptItem(item_id="c2", seq=4, kind=ItemKind.TOOL_CALL, role="assistant", call_id="req_1:1",
                       provider_call_id="toolu_02", tool="shell", arguments={"command": "date"}, response_id="r1"),
        TranscriptItem(item_id="t1", seq=5, kind=ItemKind.TOOL_RESULT, role="tool", call_id="req_1:0", tool="list_dir",
                       content="a.txt", state=EffectState.COMMITTED),
    ]
    fake.server.plan(text_chunks=["Done."])
    await fake.provider.complete(_request(repair_history(items, "You are careful.")))
    body = fake.server.completion_requests[0].body
    uses, results = fake.tool_uses(body), fake.tool_results(body)
    if fake.kind == "anthropic":  # one system block; tools, system and the conversation end in cache breakpoints
        assert body["system"] == [{"type": "text", "text": "You are careful.", "cache_control": {"type": "ephemeral"}}]
        assert [m["content"][-1].get("cache_control") for m in body["messages"]][-1] == {"type": "ephemeral"}
        assert sum("cache_control" in b for m in body["messages"] for b in m["content"]) == 1
    assert [name for _, name in uses] == ["list_dir", "shell"]
    assert [rid for rid, _ in results] == [uid for uid, _ in uses]
    assert results[0][1] == "a.txt" and "[outcome unknown]" in results[1][1]


def test_named_and_prefixed_models_resolve_to_their_adapter_and_a_missing_key_is_a_credentials_wait(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from jupyter_goals.server import catalog

    key_file = tmp_path / "claude.key"
    specs = {"claude": {"provider": "anthropic", "model": "claude-x", "base_url": "http://127.0.0.1:9",
                        "api_key_file": str(key_file), "max_output_tokens": 512}}
    monkeypatch.setenv(catalog.NAMED_ENV, catalog.ModelCatalog("claude", catalog.parse_specs(specs), "none",
                                                               load_price_table(None)).export_named())
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    assert check_model("anthropic:claude-sonnet-4-5") == ReasonCode.RESOURCE_MISSING_CREDENTIALS
    assert check_model("claude") == ReasonCode.RESOURCE_MISSING_CREDENTIALS  # its key file is absent
    key_file.write_text("sk-ant-from-file\n")  # appears later: read at request time
    named = resolve_provider("claude")
    assert isinstance(named, AnthropicProvider)
    assert (named.api_key, named.base_url, named.max_output_tokens) == ("sk-ant-from-file", "http://127.0.0.1:9", 512)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    plain = resolve_provider("anthropic:claude-sonnet-4-5")
    assert isinstance(plain, AnthropicProvider) and plain.api_key == "sk-ant-env"


async def test_the_requests_of_one_loop_share_a_kept_alive_connection(fake: Fake) -> None:
    fake.server.keep_alive = True  # as a real provider keeps an idle connection for a while
    for i in range(3):
        fake.server.plan(text_chunks=[f"answer {i}"])
        assert (await fake.provider.complete(_request(), on_chunk=Recorder().on_chunk)).text == f"answer {i}"
    assert fake.server.connections == 1  # one TCP (and, for https, TLS) handshake for the three requests
    # a server that closes each stream: the kept connection serves one more request and is closed by the server;
    # the next request opens a new one and is still answered
    fake.server.keep_alive = False
    for text in ("again", "and again"):
        fake.server.plan(text_chunks=[text])
        assert (await fake.provider.complete(_request(), on_chunk=Recorder().on_chunk)).text == text
    assert fake.server.connections == 2


async def test_a_stream_held_open_after_its_end_marker_still_answers_and_its_connection_is_let_go(fake: Fake) -> None:
    # the server sends [DONE] (message_stop) and then neither the closing chunk nor anything else
    fake.server.plan(text_chunks=["all of it"], hold_after_done=True)
    started = time.monotonic()
    answer = await fake.provider.complete(_request(), on_chunk=Recorder().on_chunk)
    assert answer.text == "all of it"
    assert time.monotonic() - started < 10  # the drain gives up after 1 s; the read timeout is minutes
    deadline = time.monotonic() + 10
    while not fake.server.client_closes:  # the connection was closed, not put back in the pool
        assert time.monotonic() < deadline, "the held stream's connection was never closed"
        await asyncio.sleep(0.05)
    fake.server.plan(text_chunks=["next"])  # and the next request gets a connection of its own
    assert (await fake.provider.complete(_request(), on_chunk=Recorder().on_chunk)).text == "next"


# --------------------------------------------------------------------------- Anthropic-only wire details


async def test_anthropic_overload_inside_a_stream_is_temporary_and_thinking_is_not_carried() -> None:
    with AnthropicTestServer() as an:
        provider = AnthropicProvider("claude-test", base_url=an.base_url, api_key="k")
        start = {"type": "message_start", "message": {"id": "msg_1", "usage": anthropic_usage(9, 1)}}
        an.plan(raw_events=[start, {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
                            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}],
                send_done=False)
        rec = Recorder()
        with pytest.raises(ProviderError) as caught:
            await provider.complete(_request(), on_usage=rec.on_usage)
        assert (caught.value.status, caught.value.retryable) == (529, True)
        assert rec.usages == [Usage(input_tokens=9, output_tokens=1)]  # what was consumed stays a lower bound

        an.plan(raw_events=[start,
                            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
                            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
                            {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s1"}},
                            {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
                            {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Answer"}},
                            {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                             "usage": {"output_tokens": 30}}])
        answer = await provider.complete(_request(max_output_tokens=30))
        assert (answer.text, answer.stop_reason, answer.usage) == ("Answer", "max_tokens", Usage(input_tokens=9, output_tokens=30))
        body = an.completion_requests[-1].body
        assert body["max_tokens"] == 30 and body["stream"] is True and body["messages"][0]["role"] == "user"
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}  # the prefix is cached
        assert an.completion_requests[-1].headers["anthropic-version"] == "2023-06-01"
