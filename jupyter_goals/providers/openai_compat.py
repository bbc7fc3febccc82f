"""Provider for any OpenAI-compatible Chat Completions endpoint (``openai:<model>``), streaming.

One ``complete()`` call is one HTTP request: no retries here, the caller does durable retries
(``ProviderError.retryable``). The request id travels as ``Idempotency-Key`` and ``X-Request-Id``.

Usage arrives as cumulative snapshots (``stream_options.include_usage``); a server may send
several. Each snapshot is reported through ``on_usage`` as a watermark (never summed) and the
last one becomes ``ProviderResponse.usage``; no snapshot at all means unknown usage (``None``).
``Usage.input_tokens`` is the server's ``prompt_tokens`` (which includes cached tokens);
``Usage.cached_tokens`` is ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource

from jupyter_goals.models import (
    ProviderMessage,
    ProviderRequest,
    ProviderResponse,
    ReasonCode,
    ToolCallSpec,
    Usage,
)
from jupyter_goals.providers.base import ChunkCallback, ProviderError, ProviderUnavailable, UsageCallback

DEFAULT_BASE_URL = "https://api.openai.com/v1"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0
_ERROR_BODY_LIMIT = 2000


async def _call(cb: Any, arg: Any) -> None:
    if cb is None:
        return
    result = cb(arg)
    if inspect.isawaitable(result):
        await result


def _normalize_base_url(url: str) -> str:
    return url.strip().rstrip("/")


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


def parse_usage(raw: Any) -> Usage | None:
    """OpenAI ``usage`` object → Usage, or None when absent/malformed."""
    if not isinstance(raw, dict):
        return None
    prompt = raw.get("prompt_tokens")
    completion = raw.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        cached_tokens=cached if isinstance(cached, int) else 0,
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
    ) -> None:
        self.model = model
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
        base_url = _normalize_base_url(os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL)
        api_key = os.environ.get("OPENAI_API_KEY") or None
        if api_key is None and base_url == DEFAULT_BASE_URL:
            raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_CREDENTIALS, "OPENAI_API_KEY is not set")
        return cls(model, base_url=base_url, api_key=api_key)

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
        if request.max_output_tokens is not None:
            body["max_tokens"] = request.max_output_tokens
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
            async with httpx.AsyncClient(timeout=self.timeout, transport=self._transport) as client:
                async with client.stream(
                    "POST", self.url, json=self.build_body(request), headers=self.build_headers(request)
                ) as response:
                    if response.status_code >= 400:
                        raise await self._http_error(response)
                    content_type = response.headers.get("content-type", "").partition(";")[0].strip()
                    if content_type == "application/json":
                        # a server that ignored ``stream: true`` and answered in one piece
                        await self._consume_json(response, acc, on_chunk, on_usage)
                    elif content_type != "text/event-stream":
                        # e.g. an HTML page: the base URL does not point at an OpenAI-compatible API
                        raise ProviderError(
                            f"{self.url} answered with content type {content_type!r}, not an event stream",
                            status=response.status_code,
                            retryable=False,
                        )
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
        )

    async def _http_error(self, response: httpx.Response) -> ProviderError:
        status = response.status_code
        detail = ""
        try:
            raw = (await response.aread()).decode("utf-8", "replace")
        except (httpx.TransportError, httpx.StreamError):
            raw = ""
        try:
            data = json.loads(raw)
            err = data.get("error") if isinstance(data, dict) else None
            if isinstance(err, dict) and err.get("message"):
                detail = str(err["message"])
            elif isinstance(err, str):
                detail = err
        except ValueError:
            pass
        detail = (detail or raw.strip())[:_ERROR_BODY_LIMIT]
        return ProviderError(f"provider HTTP {status}: {detail}".rstrip(": "), status=status)

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
                    await _call(on_chunk, content)
                for tc in delta.get("tool_calls") or []:
                    if isinstance(tc, dict):
                        acc.add_tool_call_delta(tc)
            if choice.get("finish_reason"):
                acc.finish_reason = str(choice["finish_reason"])
        usage = parse_usage(data.get("usage"))
        if usage is not None:
            acc.usage = usage  # cumulative watermark: replace, never add
            await _call(on_usage, usage)

    async def _consume_stream(
        self,
        source: EventSource,
        acc: _Accumulator,
        on_chunk: ChunkCallback | None,
        on_usage: UsageCallback | None,
    ) -> None:
        async for sse in source.aiter_sse():
            payload = sse.data.strip()
            if not payload:
                continue
            if payload == "[DONE]":
                acc.done = True
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
