"""Provider for Anthropic's Messages API (``anthropic:<model>``), streaming over httpx + httpx-sse.

One ``complete()`` call is one HTTP request: no retries here, the caller does durable retries
(``ProviderError.retryable``; 429 and 529/overloaded are temporary and carry ``retry-after``,
401/403/404/400 are persistent).

Requests are built from the provider-neutral message list of history repair: system messages become
the top-level ``system``; an assistant message becomes ``text`` + ``tool_use`` blocks; each ``tool``
message becomes a ``tool_result`` block in the following user turn (consecutive same-role messages
are merged, so results stay adjacent to their calls). Tool ids are kept, with characters the API
rejects replaced, identically on the call and its result.

Usage is cumulative: ``message_start`` reports the input side and ``message_delta`` the running
output count. Each snapshot is reported through ``on_usage`` as a watermark, so a stream dropped
after ``message_start`` still leaves a lower bound. ``Usage.input_tokens`` is the whole prompt
(``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``); ``cached_tokens`` are the
cache reads and ``cache_write_tokens`` the cache creation, which the price table prices separately.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource

from jupyter_goals.models import (
    ModelSpec,
    ProviderMessage,
    ProviderRequest,
    ProviderResponse,
    ToolCallSpec,
    Usage,
)
from jupyter_goals.providers.base import ChunkCallback, ProviderError, UsageCallback, endpoint, notify
from jupyter_goals.providers.http import content_type, drain, not_event_stream, post_stream
from jupyter_goals.providers.openai_compat import parse_arguments

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_OUTPUT_TOKENS = 8192  # the Messages API requires max_tokens; a model's max_output_tokens overrides it
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0
_TOOL_ID = re.compile(r"[^a-zA-Z0-9_-]")
# error ``type`` → HTTP status, for errors that arrive inside a stream (after the 200)
_ERROR_STATUS = {
    "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
    "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
    "overloaded_error": 529,
}


def tool_id(raw: str) -> str:
    """A tool id the API accepts (``^[a-zA-Z0-9_-]+$``), the same for a call and its result."""
    return _TOOL_ID.sub("_", raw) or "call"


# --------------------------------------------------------------------------- request shape


def to_anthropic(messages: list[ProviderMessage]) -> tuple[str, list[dict[str, Any]]]:
    """ProviderMessage list → (``system`` text, Messages API ``messages``)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system":
            if m.content:
                system.append(m.content)
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [{"type": "tool_use", "id": tool_id(c.id), "name": c.name, "input": c.arguments}
                       for c in m.tool_calls]
            add("assistant", blocks)
        elif m.role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": tool_id(m.tool_call_id or ""),
                          "content": m.content or "(no output)"}])
        elif m.content:
            add("user", [{"type": "text", "text": m.content}])
    if turns and turns[0]["role"] != "user":  # the API wants a user turn first
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": "(continuing)"}]})
    return "\n\n".join(system), turns


def to_anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style function schemas (the registry's shape) → Anthropic ``tools``."""
    out = []
    for t in tools:
        fn = t.get("function", t)
        out.append({"name": fn["name"], "description": fn.get("description", ""),
                    "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}})
    return out


def mark_cache_breakpoints(body: dict[str, Any]) -> None:
    """Prompt caching: the tools, the system prompt and the conversation so far end in an ephemeral
    cache breakpoint, so each turn of an agent loop reads the prefix the previous turn wrote (cache
    reads cost a tenth of input; prompts under the model's minimum are simply not cached)."""
    marks = [body["tools"][-1]] if body.get("tools") else []
    marks += [body["system"][-1]] if body.get("system") else []
    if body["messages"]:
        marks.append(body["messages"][-1]["content"][-1])
    for block in marks:
        block["cache_control"] = {"type": "ephemeral"}


def parse_usage(raw: dict[str, Any]) -> Usage | None:
    """The running Anthropic usage fields → Usage (None until the input side is known)."""
    base = raw.get("input_tokens")
    if not isinstance(base, int):
        return None
    write = raw.get("cache_creation_input_tokens")
    read = raw.get("cache_read_input_tokens")
    out = raw.get("output_tokens")
    tier = raw.get("service_tier")
    write_n = write if isinstance(write, int) else 0
    read_n = read if isinstance(read, int) else 0
    return Usage(input_tokens=base + write_n + read_n, output_tokens=out if isinstance(out, int) else 0,
                 cached_tokens=read_n, cache_write_tokens=write_n,
                 service_tier=tier if isinstance(tier, str) else None)


# --------------------------------------------------------------------------- stream accumulation


@dataclass
class _Block:
    kind: str
    text: str = ""
    id: str = ""
    name: str = ""
    partial_json: str = ""
    input: dict[str, Any] = field(default_factory=dict)


class _Accumulator:
    """Folds Messages API stream events into text, tool calls, usage and the stop reason."""

    def __init__(self) -> None:
        self.blocks: dict[int, _Block] = {}
        self.raw_usage: dict[str, Any] = {}
        self.usage: Usage | None = None
        self.message_id: str | None = None
        self.stop_reason: str | None = None
        self.stopped = False

    @property
    def complete(self) -> bool:
        return self.stopped or self.stop_reason is not None

    def text(self) -> str:
        return "".join(b.text for _, b in sorted(self.blocks.items()) if b.kind == "text")

    def tool_calls(self, request_id: str) -> list[ToolCallSpec]:
        calls = [b for _, b in sorted(self.blocks.items()) if b.kind == "tool_use"]
        return [
            ToolCallSpec(id=b.id or f"{request_id}-c{i}", name=b.name,
                         arguments=parse_arguments(b.partial_json) if b.partial_json else dict(b.input))
            for i, b in enumerate(calls)
        ]

    def merge_usage(self, raw: Any) -> Usage | None:
        """Cumulative fields replace earlier values (a watermark, never a sum); the new snapshot or None."""
        if not isinstance(raw, dict):
            return None
        self.raw_usage.update({k: v for k, v in raw.items() if v is not None})
        usage = parse_usage(self.raw_usage)
        if usage is not None:
            self.usage = usage
        return usage


def _error_detail(data: Any) -> str:
    """``type: message`` of an Anthropic error body ``{"type": "error", "error": {type, message}}``."""
    err = data.get("error") if isinstance(data, dict) else None
    return f"{err.get('type', 'error')}: {err.get('message', '')}" if isinstance(err, dict) else ""


def _error_from_payload(err: Any) -> ProviderError:
    """An ``error`` event inside a 200 stream (e.g. overloaded mid-answer), mapped to its HTTP status."""
    kind = err.get("type") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    status = _ERROR_STATUS.get(str(kind)) if kind else None
    return ProviderError(f"provider stream error: {kind or 'error'}: {message or err!r}", status=status)


# --------------------------------------------------------------------------- provider


class AnthropicProvider:
    name = "anthropic"

    def __init__(
        self,
        model: str,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        *,
        service_tier: str | None = None,
        max_output_tokens: int | None = None,
        timeout: httpx.Timeout | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url.strip().rstrip("/")
        self.api_key = api_key or None
        self.service_tier = service_tier
        self.max_output_tokens = max_output_tokens
        self.timeout = timeout or httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        self._transport = transport

    @classmethod
    def for_spec(cls, spec: ModelSpec) -> AnthropicProvider:
        """The adapter for a spec (``ANTHROPIC_BASE_URL`` when the spec has no ``base_url``)."""
        base_url, api_key = endpoint(spec, DEFAULT_BASE_URL, "ANTHROPIC_BASE_URL")
        return cls(spec.model, base_url=base_url, api_key=api_key, service_tier=spec.service_tier,
                   max_output_tokens=spec.max_output_tokens)

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1/messages"

    def build_body(self, request: ProviderRequest) -> dict[str, Any]:
        system, messages = to_anthropic(request.messages)
        limits = [n for n in (request.max_output_tokens, self.max_output_tokens) if n is not None]
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": min(limits) if limits else DEFAULT_MAX_OUTPUT_TOKENS,
            "messages": messages,
            "stream": True,
        }
        if system:
            body["system"] = [{"type": "text", "text": system}]
        if request.tools:
            body["tools"] = to_anthropic_tools(request.tools)
        if self.service_tier:
            body["service_tier"] = self.service_tier
        mark_cache_breakpoints(body)
        return body

    def build_headers(self, request: ProviderRequest) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "anthropic-version": API_VERSION,
            "X-Request-Id": request.request_id,
        }
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    async def complete(
        self,
        request: ProviderRequest,
        on_chunk: ChunkCallback | None = None,
        on_usage: UsageCallback | None = None,
    ) -> ProviderResponse:
        acc = _Accumulator()
        try:
            async with post_stream(self.url, self.build_body(request), self.build_headers(request), limits=self.timeout,
                                   transport=self._transport, detail_of=_error_detail) as response:
                if content_type(response) != "text/event-stream":
                    raise not_event_stream(self.url, response)
                await self._consume(EventSource(response), acc, on_chunk, on_usage)
        except ProviderError:
            raise
        except (httpx.TransportError, httpx.StreamError) as exc:
            if not acc.complete:
                raise ProviderError(f"connection to {self.base_url} failed: {exc!r}", status=None) from exc
            # the answer was complete (stop_reason seen); only message_stop was lost
        if not acc.complete:
            raise ProviderError("the provider stream ended before message_stop or a stop reason", status=None)
        return ProviderResponse(
            text=acc.text(),
            tool_calls=acc.tool_calls(request.request_id),
            usage=acc.usage,
            provider_response_id=acc.message_id,
            stop_reason=acc.stop_reason,
        )

    async def _consume(
        self, source: EventSource, acc: _Accumulator, on_chunk: ChunkCallback | None, on_usage: UsageCallback | None
    ) -> None:
        events = source.aiter_sse()
        async for sse in events:
            payload = sse.data.strip()
            if not payload:
                continue
            try:
                data = json.loads(payload)
            except ValueError as exc:
                raise ProviderError(f"malformed stream event: {payload[:200]!r}", status=None) from exc
            if not isinstance(data, dict):
                continue
            kind = data.get("type") or sse.event
            if kind == "error":
                raise _error_from_payload(data.get("error", data))
            if kind == "message_start":
                message = data.get("message") or {}
                if isinstance(message.get("id"), str):
                    acc.message_id = message["id"]
                usage = acc.merge_usage(message.get("usage"))
                if usage is not None:
                    await notify(on_usage, usage)
            elif kind == "content_block_start":
                block = data.get("content_block") or {}
                given = block.get("input")
                acc.blocks[int(data.get("index", len(acc.blocks)))] = _Block(
                    kind=str(block.get("type", "")), text=str(block.get("text") or ""), id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""), input=given if isinstance(given, dict) else {},
                )
                if block.get("type") == "text" and block.get("text"):
                    await notify(on_chunk, block["text"])
            elif kind == "content_block_delta":
                await self._delta(data, acc, on_chunk)
            elif kind == "message_delta":
                delta = data.get("delta") or {}
                if delta.get("stop_reason"):
                    acc.stop_reason = str(delta["stop_reason"])
                usage = acc.merge_usage(data.get("usage"))
                if usage is not None:
                    await notify(on_usage, usage)
            elif kind == "message_stop":
                acc.stopped = True
                await drain(events)
                break
            # ping, content_block_stop and unknown event types carry nothing to keep

    @staticmethod
    async def _delta(data: dict[str, Any], acc: _Accumulator, on_chunk: ChunkCallback | None) -> None:
        index = int(data.get("index", 0))
        block = acc.blocks.setdefault(index, _Block(kind="text"))
        delta = data.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            block.text += delta["text"]
            if delta["text"]:
                await notify(on_chunk, delta["text"])
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            block.partial_json += delta["partial_json"]
        # thinking and signature deltas are not kept: reasoning signatures are never carried over
