"""Provider for any OpenAI-compatible Chat Completions endpoint (``openai:<model>``), streaming.

One ``complete()`` call is one HTTP request: no retries here, the caller does durable retries
(``ProviderError.retryable``). The request id travels as ``Idempotency-Key`` and ``X-Request-Id``.

Usage arrives as cumulative snapshots (``stream_options.include_usage``); a server may send
several. Each snapshot is reported through ``on_usage`` as a watermark (never summed) and the
last one becomes ``ProviderResponse.usage``; no snapshot at all means unknown usage (``None``).
``Usage.input_tokens`` is the server's ``prompt_tokens`` (which includes cached tokens);
``Usage.cached_tokens`` is ``prompt_tokens_details.cached_tokens``; ``reasoning_tokens`` (part of the
output) is ``completion_tokens_details.reasoning_tokens``. Responses-style fields (``input_tokens``,
``output_tokens``, ``input_tokens_details``, ``output_tokens_details``) are read where a server sends
them. A model's ``service_tier`` is sent with the request; the tier the server reports is kept on the
usage, so the price table can price it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource

from jupyter_goals.models import (
    ModelSpec,
    ProviderMessage,
    ProviderRequest,
    ProviderResponse,
    ReasonCode,
    ToolCallSpec,
    Usage,
)
from jupyter_goals.providers.base import (
    ChunkCallback,
    ProviderError,
    ProviderUnavailable,
    UsageCallback,
    endpoint,
    notify,
)
from jupyter_goals.providers.http import content_type, drain, not_event_stream, post_stream

DEFAULT_BASE_URL = "https://api.openai.com/v1"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0


def _normalize_base_url(url: str) -> str:
    return url.strip().rstrip("/")


def _smallest(*limits: int | None) -> int | None:
    """The tightest of several output-token limits (a hard budget's, the model's), None if none."""
    known = [n for n in limits if n is not None]
    return min(known) if known else None


# --------------------------------------------------------------------------- request shape


def to_openai_messages(messages: list[ProviderMessage]) -> list[dict[str, Any]]:
    """ProviderMessage list → OpenAI Chat Completions ``messages``."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant"}
            if m.tool_calls:
                msg["content"] = m.content or None
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in m.tool_calls
                ]
            else:
                msg["content"] = m.content
            out.append(msg)
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _detail(raw: dict[str, Any], keys: tuple[str, ...], field: str) -> int:
    for key in keys:
        details = raw.get(key)
        if isinstance(details, dict) and isinstance(details.get(field), int):
            return int(details[field])
    return 0


def parse_usage(raw: Any, service_tier: str | None = None) -> Usage | None:
    """OpenAI ``usage`` object (Chat Completions or Responses field names) → Usage, or None when
    absent/malformed."""
    if not isinstance(raw, dict):
        return None
    prompt = raw.get("prompt_tokens", raw.get("input_tokens"))
    completion = raw.get("completion_tokens", raw.get("output_tokens"))
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        cached_tokens=_detail(raw, ("prompt_tokens_details", "input_tokens_details"), "cached_tokens"),
        reasoning_tokens=_detail(raw, ("completion_tokens_details", "output_tokens_details"), "reasoning_tokens"),
        service_tier=service_tier,
    )


def parse_arguments(raw: str) -> dict[str, Any]:
    """Tool-call arguments JSON → dict; invalid or non-object JSON is kept as ``{"_raw": raw}``."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_raw": raw}
    if not isinstance(value, dict):
        return {"_raw": raw}
    return value


# --------------------------------------------------------------------------- stream accumulation


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


class _Accumulator:
    """Folds streamed chunks into text, tool calls, usage snapshots and the finish state."""

    def __init__(self) -> None:
        self.text_parts: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.usage: Usage | None = None
        self.response_id: str | None = None
        self.finish_reason: str | None = None
        self.service_tier: str | None = None
        self.done = False

    @property
    def complete(self) -> bool:
        return self.done or self.finish_reason is not None

    def add_tool_call_delta(self, tc: dict[str, Any]) -> None:
        index = tc.get("index")
        tc_id = tc.get("id")
        if not isinstance(index, int):
            # some servers omit the index and send each call whole: a new id opens a new call
            known = {c.id for c in self.calls.values()}
            if isinstance(tc_id, str) and tc_id and tc_id not in known:
                index = len(self.calls)
            else:
                index = max(self.calls) if self.calls else 0
        call = self.calls.setdefault(index, _PartialCall())
        if isinstance(tc_id, str) and tc_id and not call.id:
            call.id = tc_id
        fn = tc.get("function")
        if isinstance(fn, dict):
            name = fn.get("name")
            if isinstance(name, str) and name and name != call.name:
                # OpenAI sends the name once; tolerate servers that repeat it or split it
                call.name = name if not call.name else call.name + name
            args = fn.get("arguments")
            if isinstance(args, str):
                call.arguments += args
            elif isinstance(args, dict):  # a few servers send an object instead of a string
                call.arguments += json.dumps(args)

    def tool_calls(self, request_id: str) -> list[ToolCallSpec]:
        return [
            ToolCallSpec(
                id=call.id or f"{request_id}-c{i}",
                name=call.name,
                arguments=parse_arguments(call.arguments),
            )
            for i, (_, call) in enumerate(sorted(self.calls.items()))
        ]


def _error_detail(data: Any) -> str:
    """The message of an OpenAI error body ``{"error": {"message"}}`` (or ``{"error": "..."}``)."""
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    return err if isinstance(err, str) else ""


def _error_from_payload(err: Any) -> ProviderError:
    message = err.get("message") if isinstance(err, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else None
    return ProviderError(f"provider stream error: {message or err!r}", status=status)


# --------------------------------------------------------------------------- provider


class OpenAICompatProvider:
    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        *,
        extra_headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        service_tier: str | None = None,
        max_output_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.service_tier = service_tier
        self.max_output_tokens = max_output_tokens
        self.base_url = _normalize_base_url(base_url)
        self.api_key = api_key or None
        self.extra_headers = dict(extra_headers or {})
        self.timeout = timeout or httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        self._transport = transport

    @classmethod
    def from_env(cls, model: str) -> OpenAICompatProvider:
        """Reads ``OPENAI_BASE_URL`` (default api.openai.com) and ``OPENAI_API_KEY``.

        No I/O: used by the recovery resource check. A missing key is only an error against the
        default (hosted) endpoint; a local server may run without one.
        """
        if not model.strip():
            raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_MODEL, "no model name after 'openai:'")
        return cls.for_spec(ModelSpec(provider="openai", model=model))

    @classmethod
    def for_spec(cls, spec: ModelSpec) -> OpenAICompatProvider:
        """The adapter for a spec (``OPENAI_BASE_URL`` when the spec has no ``base_url``)."""
        base_url, api_key = endpoint(spec, DEFAULT_BASE_URL, "OPENAI_BASE_URL")
        return cls(spec.model, base_url=base_url, api_key=api_key, service_tier=spec.service_tier,
                   max_output_tokens=spec.max_output_tokens)

    # ------------------------------------------------------------------ request building

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def build_body(self, request: ProviderRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = request.tools
        limit = _smallest(request.max_output_tokens, self.max_output_tokens)
        if limit is not None:
            body["max_tokens"] = limit
        if self.service_tier:
            body["service_tier"] = self.service_tier
        return body

    def build_headers(self, request: ProviderRequest) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Cache-Control": "no-store",
            "Idempotency-Key": request.request_id,
            "X-Request-Id": request.request_id,
            **self.extra_headers,
        }
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    # ------------------------------------------------------------------ completion

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
                kind = content_type(response)
                if kind == "application/json":
                    # a server that ignored ``stream: true`` and answered in one piece
                    await self._consume_json(response, acc, on_chunk, on_usage)
                elif kind != "text/event-stream":
                    raise not_event_stream(self.url, response)
                else:
                    await self._consume_stream(EventSource(response), acc, on_chunk, on_usage)
        except ProviderError:
            raise
        except (httpx.TransportError, httpx.StreamError) as exc:
            if not acc.complete:
                raise ProviderError(f"connection to {self.base_url} failed: {exc!r}", status=None) from exc
            # the answer was complete (finish_reason seen); only trailing usage/[DONE] was lost
        if not acc.complete:
            raise ProviderError("the provider stream ended before [DONE] or a finish reason", status=None)
        return ProviderResponse(
            text="".join(acc.text_parts),
            tool_calls=acc.tool_calls(request.request_id),
            usage=acc.usage,
            provider_response_id=acc.response_id,
            stop_reason=acc.finish_reason,
        )

    async def _handle_chunk(
        self,
        data: Any,
        acc: _Accumulator,
        on_chunk: ChunkCallback | None,
        on_usage: UsageCallback | None,
    ) -> None:
        if not isinstance(data, dict):
            return
        if data.get("error") is not None:
            raise _error_from_payload(data["error"])
        if acc.response_id is None and isinstance(data.get("id"), str):
            acc.response_id = data["id"]
        if isinstance(data.get("service_tier"), str):
            acc.service_tier = data["service_tier"]
        choices = data.get("choices") or []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta is None:
                delta = choice.get("message")  # non-streamed shape
            if isinstance(delta, dict):
                content = delta.get("content")
                if isinstance(content, str) and content:
                    acc.text_parts.append(content)
                    await notify(on_chunk, content)
                for tc in delta.get("tool_calls") or []:
                    if isinstance(tc, dict):
                        acc.add_tool_call_delta(tc)
            if choice.get("finish_reason"):
                acc.finish_reason = str(choice["finish_reason"])
        usage = parse_usage(data.get("usage"), acc.service_tier or self.service_tier)
        if usage is not None:
            acc.usage = usage  # cumulative watermark: replace, never add
            await notify(on_usage, usage)

    async def _consume_stream(
        self,
        source: EventSource,
        acc: _Accumulator,
        on_chunk: ChunkCallback | None,
        on_usage: UsageCallback | None,
    ) -> None:
        events = source.aiter_sse()
        async for sse in events:
            payload = sse.data.strip()
            if not payload:
                continue
            if payload == "[DONE]":
                acc.done = True
                await drain(events)
                break
            try:
                data = json.loads(payload)
            except ValueError as exc:
                raise ProviderError(f"malformed stream chunk: {payload[:200]!r}", status=None) from exc
            if sse.event == "error":
                raise _error_from_payload(data.get("error", data) if isinstance(data, dict) else data)
            await self._handle_chunk(data, acc, on_chunk, on_usage)

    async def _consume_json(
        self,
        response: httpx.Response,
        acc: _Accumulator,
        on_chunk: ChunkCallback | None,
        on_usage: UsageCallback | None,
    ) -> None:
        raw = await response.aread()
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ProviderError("malformed JSON response", status=None) from exc
        if isinstance(data, dict):
            for choice in data.get("choices") or []:
                if isinstance(choice, dict):
                    # whole tool calls carry their index implicitly by position
                    message = choice.get("message")
                    if isinstance(message, dict):
                        for i, tc in enumerate(message.get("tool_calls") or []):
                            if isinstance(tc, dict):
                                tc.setdefault("index", i)
        await self._handle_chunk(data, acc, on_chunk, on_usage)
        acc.done = True
