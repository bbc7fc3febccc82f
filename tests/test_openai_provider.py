"""OpenAICompatProvider against the scripted OpenAI-compatible test server (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from jupyter_goals.models import (
    ProviderMessage,
    ProviderRequest,
    ReasonCode,
    ToolCallSpec,
    Usage,
)
from jupyter_goals.providers.base import ProviderError, ProviderUnavailable
from jupyter_goals.providers.openai_compat import (
    DEFAULT_BASE_URL,
    OpenAICompatProvider,
    parse_arguments,
    to_openai_messages,
)
from jupyter_goals.providers.resolve import resolve_provider
from tests.openai_server import OpenAITestServer, Recorder, openai_usage, running_server


@pytest.fixture
def openai_server() -> Iterator[OpenAITestServer]:
    yield from running_server()


@pytest.fixture
def provider(openai_server: OpenAITestServer) -> OpenAICompatProvider:
    return OpenAICompatProvider("test-model", base_url=openai_server.base_url, api_key="sk-test")


def _request(request_id: str = "req-1", **kw: object) -> ProviderRequest:
    messages = kw.pop("messages", None) or [ProviderMessage(role="user", content="hi")]
    return ProviderRequest(request_id=request_id, messages=messages, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- text and tool calls


async def test_text_chunks_stream_in_order(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(text_chunks=["Hel", "lo, ", "wor", "ld"])
    rec = Recorder()
    resp = await provider.complete(_request(), on_chunk=rec.on_chunk, on_usage=rec.on_usage)
    assert rec.chunks == ["Hel", "lo, ", "wor", "ld"]
    assert resp.text == "Hello, world"
    assert resp.tool_calls == []
    assert resp.provider_response_id == "chatcmpl-test-1"


async def test_two_parallel_tool_calls_assembled_from_deltas(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(
        text_chunks=["Let me check."],
        tool_calls=[
            {"id": "call_a", "name": "read_file", "arguments": {"path": "/tmp/a.txt", "limit": 100}},
            {"id": "call_b", "name": "shell", "arguments": {"command": "ls -la && echo 'done'"}},
        ],
        args_chunk_size=3,
        interleave_tool_calls=True,
    )
    resp = await provider.complete(_request())
    assert resp.text == "Let me check."
    assert resp.tool_calls == [
        ToolCallSpec(id="call_a", name="read_file", arguments={"path": "/tmp/a.txt", "limit": 100}),
        ToolCallSpec(id="call_b", name="shell", arguments={"command": "ls -la && echo 'done'"}),
    ]


async def test_invalid_tool_arguments_kept_raw(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(tool_calls=[{"id": "c1", "name": "shell", "arguments": '{"command": "ls'}])
    resp = await provider.complete(_request())
    assert resp.tool_calls == [ToolCallSpec(id="c1", name="shell", arguments={"_raw": '{"command": "ls'})]


def test_parse_arguments_edge_cases() -> None:
    assert parse_arguments("") == {}
    assert parse_arguments('{"a": 1}') == {"a": 1}
    assert parse_arguments("[1, 2]") == {"_raw": "[1, 2]"}
    assert parse_arguments("nope") == {"_raw": "nope"}


async def test_tool_call_without_id_gets_a_stable_one(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    head = {"index": 0, "type": "function", "function": {"name": "shell", "arguments": '{"command"'}}
    tail = {"index": 0, "function": {"arguments": ': "pwd"}'}}
    openai_server.plan(
        raw_events=[
            {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}]},
            {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [tail]}, "finish_reason": None}]},
            {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]
    )
    resp = await provider.complete(_request("r-7"))
    assert resp.tool_calls == [ToolCallSpec(id="r-7-c0", name="shell", arguments={"command": "pwd"})]


# --------------------------------------------------------------------------- usage


async def test_cumulative_usage_reported_as_watermarks(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(
        text_chunks=["a", "b"],
        usage_chunks=[openai_usage(100, 1), openai_usage(100, 5, cached_tokens=40), openai_usage(100, 9, 40)],
    )
    rec = Recorder()
    resp = await provider.complete(_request(), on_chunk=rec.on_chunk, on_usage=rec.on_usage)
    assert rec.usages == [
        Usage(input_tokens=100, output_tokens=1, cached_tokens=0),
        Usage(input_tokens=100, output_tokens=5, cached_tokens=40),
        Usage(input_tokens=100, output_tokens=9, cached_tokens=40),
    ]
    # the last snapshot, not the sum
    assert resp.usage == Usage(input_tokens=100, output_tokens=9, cached_tokens=40)


async def test_no_usage_means_unknown(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(text_chunks=["ok"])
    rec = Recorder()
    resp = await provider.complete(_request(), on_usage=rec.on_usage)
    assert resp.usage is None
    assert rec.usages == []


# --------------------------------------------------------------------------- faults


async def test_503_is_retryable(openai_server: OpenAITestServer, provider: OpenAICompatProvider) -> None:
    openai_server.plan(status=503, error_message="overloaded")
    with pytest.raises(ProviderError) as info:
        await provider.complete(_request())
    assert info.value.status == 503
    assert info.value.retryable is True
    assert "overloaded" in str(info.value)
    assert len(openai_server.completion_requests) == 1  # no retry inside the provider


async def test_429_is_retryable(openai_server: OpenAITestServer, provider: OpenAICompatProvider) -> None:
    openai_server.plan(status=429)
    with pytest.raises(ProviderError) as info:
        await provider.complete(_request())
    assert info.value.status == 429
    assert info.value.retryable is True


async def test_400_is_not_retryable(openai_server: OpenAITestServer, provider: OpenAICompatProvider) -> None:
    openai_server.plan(status=400, error_message="bad messages")
    with pytest.raises(ProviderError) as info:
        await provider.complete(_request())
    assert info.value.status == 400
    assert info.value.retryable is False
    assert "bad messages" in str(info.value)


async def test_connection_dropped_mid_stream_is_retryable(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(text_chunks=["one", "two", "three"], drop_after=2)  # role chunk + "one"
    rec = Recorder()
    with pytest.raises(ProviderError) as info:
        await provider.complete(_request(), on_chunk=rec.on_chunk)
    assert info.value.status is None
    assert info.value.retryable is True
    assert rec.chunks == ["one"]


async def test_clean_eof_before_done_or_finish_is_retryable(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(text_chunks=["one", "two"], drop_after=2, drop_mode="eof")
    with pytest.raises(ProviderError) as info:
        await provider.complete(_request())
    assert info.value.status is None
    assert info.value.retryable is True


async def test_finish_without_done_is_accepted(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(text_chunks=["fine"], send_done=False)
    resp = await provider.complete(_request())
    assert resp.text == "fine"


async def test_connection_refused_is_retryable() -> None:
    with OpenAITestServer() as server:
        base_url = server.base_url
    provider = OpenAICompatProvider("m", base_url=base_url)
    with pytest.raises(ProviderError) as info:
        await provider.complete(_request())
    assert info.value.status is None
    assert info.value.retryable is True


async def test_in_stream_error_payload_raises(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(raw_events=[{"error": {"message": "model crashed", "code": 500}}])
    with pytest.raises(ProviderError) as info:
        await provider.complete(_request())
    assert info.value.status == 500
    assert info.value.retryable is True


async def test_cancellation_propagates(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(text_chunks=["a", "b"], hang_after=2)
    rec = Recorder()
    task = asyncio.create_task(provider.complete(_request(), on_chunk=rec.on_chunk))
    for _ in range(200):
        if rec.chunks:
            break
        await asyncio.sleep(0.01)
    assert rec.chunks == ["a"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    openai_server.release()


# --------------------------------------------------------------------------- request shape


async def test_request_body_and_headers(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    tool_schema = {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "run",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    messages = [
        ProviderMessage(role="system", content="be brief"),
        ProviderMessage(role="user", content="list files"),
        ProviderMessage(
            role="assistant",
            content="",
            tool_calls=[ToolCallSpec(id="call_1", name="shell", arguments={"command": "ls"})],
        ),
        ProviderMessage(role="tool", tool_call_id="call_1", content="exit 0\nstdout: a.txt"),
    ]
    openai_server.plan(text_chunks=["a.txt"])
    await provider.complete(_request("req-42", messages=messages, tools=[tool_schema]))

    (req,) = openai_server.completion_requests
    assert req.headers["idempotency-key"] == "req-42"
    assert req.headers["x-request-id"] == "req-42"
    assert req.headers["authorization"] == "Bearer sk-test"
    body = req.body
    assert body["model"] == "test-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["tools"] == [tool_schema]
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "exit 0\nstdout: a.txt"},
    ]
    assert json.loads(body["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}


async def test_no_tools_key_when_tools_empty(
    openai_server: OpenAITestServer, provider: OpenAICompatProvider
) -> None:
    openai_server.plan(text_chunks=["x"])
    await provider.complete(_request())
    body = openai_server.completion_requests[0].body
    assert "tools" not in body


def test_assistant_text_with_tool_calls_keeps_content() -> None:
    msgs = to_openai_messages(
        [ProviderMessage(role="assistant", content="thinking", tool_calls=[ToolCallSpec(id="c", name="n")])]
    )
    assert msgs[0]["content"] == "thinking"
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == "{}"


# --------------------------------------------------------------------------- from_env


def test_from_env_without_key_against_default_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ProviderUnavailable) as info:
        OpenAICompatProvider.from_env("gpt-4o-mini")
    assert info.value.reason_code == ReasonCode.RESOURCE_MISSING_CREDENTIALS
    with pytest.raises(ProviderUnavailable) as info2:
        resolve_provider("openai:gpt-4o-mini")
    assert info2.value.reason_code == ReasonCode.RESOURCE_MISSING_CREDENTIALS


def test_from_env_explicit_default_url_still_needs_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", DEFAULT_BASE_URL + "/")
    with pytest.raises(ProviderUnavailable) as info:
        OpenAICompatProvider.from_env("gpt-4o-mini")
    assert info.value.reason_code == ReasonCode.RESOURCE_MISSING_CREDENTIALS


async def test_from_env_local_url_without_key(
    monkeypatch: pytest.MonkeyPatch, openai_server: OpenAITestServer
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    provider = OpenAICompatProvider.from_env("local-model")
    assert provider.api_key is None
    openai_server.plan(text_chunks=["hi"])
    resp = await provider.complete(_request())
    assert resp.text == "hi"
    req = openai_server.completion_requests[0]
    assert "authorization" not in req.headers
    assert req.body["model"] == "local-model"


def test_from_env_with_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    provider = OpenAICompatProvider.from_env("gpt-4o-mini")
    assert provider.base_url == DEFAULT_BASE_URL
    assert provider.api_key == "sk-x"
    with pytest.raises(ProviderUnavailable) as info:
        OpenAICompatProvider.from_env("")
    assert info.value.reason_code == ReasonCode.RESOURCE_MISSING_MODEL


# --------------------------------------------------------------------------- non-streaming servers


def _mock_provider(handler: httpx.MockTransport) -> OpenAICompatProvider:
    return OpenAICompatProvider("m", base_url="http://127.0.0.1:9/v1", transport=handler)


async def test_json_answer_from_server_ignoring_stream() -> None:
    body = {
        "id": "chatcmpl-json",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "whole",
                    "tool_calls": [
                        {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": openai_usage(3, 4),
    }
    provider = _mock_provider(httpx.MockTransport(lambda req: httpx.Response(200, json=body)))
    rec = Recorder()
    resp = await provider.complete(_request(), on_chunk=rec.on_chunk, on_usage=rec.on_usage)
    assert resp.text == "whole" and rec.chunks == ["whole"]
    assert resp.tool_calls == [ToolCallSpec(id="c9", name="f", arguments={})]
    assert resp.usage == Usage(input_tokens=3, output_tokens=4) and rec.usages == [resp.usage]
    assert resp.provider_response_id == "chatcmpl-json"


async def test_html_answer_is_not_retryable() -> None:
    provider = _mock_provider(
        httpx.MockTransport(
            lambda req: httpx.Response(200, text="<html></html>", headers={"content-type": "text/html"})
        )
    )
    with pytest.raises(ProviderError) as info:
        await provider.complete(_request())
    assert info.value.retryable is False


def test_default_timeouts() -> None:
    provider = OpenAICompatProvider("m")
    assert provider.timeout.connect == 10.0
    assert provider.timeout.read == 120.0
