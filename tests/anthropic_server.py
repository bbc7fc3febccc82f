"""A small scripted Anthropic-compatible Messages API server for tests (127.0.0.1 only).

It is :class:`tests.openai_server.OpenAITestServer` with Anthropic's wire format: the same
:class:`Plan` queue (FIFO, ``default_plan``, 400 "no plan queued"), the same recording of every
request, the same ``drop_after`` / ``hang_after`` / ``chunk_delay`` controls. Usage::

    with AnthropicTestServer(api_key="sk-ant-test") as server:
        server.plan(text_chunks=["Hel", "lo"], usage_chunks=[anthropic_usage(10, 1), anthropic_usage(10, 2)])
        provider = AnthropicProvider("claude-test", base_url=server.base_url, api_key="sk-ant-test")

``POST /v1/messages`` with ``stream: true`` answers this SSE event sequence (``event:`` + ``data:``;
each counted by ``drop_after``):

1. ``message_start`` (its ``message.usage`` = the first ``usage_chunks`` item, if any)
2. per text chunk: ``content_block_start`` (text) once, then one ``content_block_delta`` each, then
   ``content_block_stop``
3. per tool call: ``content_block_start`` (tool_use: id, name, empty input), ``input_json_delta``
   fragments of ``args_chunk_size`` characters, ``content_block_stop``
4. one ``message_delta`` per remaining ``usage_chunks`` item (cumulative; the last one carries
   ``stop_reason`` = ``finish_reason`` or ``tool_use`` / ``end_turn``); one without usage if none remain
5. ``message_stop`` (unless ``send_done=False``)

``raw_events`` replaces steps 1-4 (dicts are sent with their ``type`` as the event name). A
``responder`` (request body → Plan) answers when no plan is queued, e.g. by the conversation so far. With
``api_key`` set, a request whose ``x-api-key`` differs gets 401 ``authentication_error`` (recorded,
no plan taken). A ``status`` >= 400 plan answers ``{"type": "error", "error": {type, message}}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from tests.openai_server import OpenAITestServer, Plan, _Handler, _tool_call_dicts

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               529: "overloaded_error"}


def anthropic_usage(input_tokens: int, output_tokens: int, cache_read: int | None = None,
                    cache_write: int | None = None) -> dict[str, Any]:
    """An Anthropic ``usage`` object (cumulative). ``input_tokens`` excludes cache reads and writes."""
    usage: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if cache_read is not None:
        usage["cache_read_input_tokens"] = cache_read
    if cache_write is not None:
        usage["cache_creation_input_tokens"] = cache_write
    return usage


def build_events(plan: Plan, model: str, n: int) -> list[dict[str, Any]]:
    """The event payloads of a streamed plan (without the final ``message_stop``)."""
    if plan.raw_events is not None:
        return [e if isinstance(e, dict) else json.loads(e) for e in plan.raw_events]
    usages = list(plan.usage_chunks)
    message: dict[str, Any] = {"id": plan.response_id or f"msg_test_{n}", "type": "message", "role": "assistant",
                               "content": [], "model": model, "stop_reason": None, "stop_sequence": None}
    if usages:
        message["usage"] = usages.pop(0)
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    index = 0
    if plan.text_chunks:
        events.append({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
        events += [{"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}
                   for t in plan.text_chunks]
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    calls = _tool_call_dicts(plan, n)
    for _, call, call_id, args in calls:
        events.append({"type": "content_block_start", "index": index,
                       "content_block": {"type": "tool_use", "id": call_id.replace("call_", "toolu_"),
                                         "name": call.name, "input": {}}})
        size = max(1, plan.args_chunk_size)
        events += [{"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": args[i:i + size]}}
                   for i in range(0, len(args), size)]
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    stop = plan.finish_reason or ("tool_use" if calls else "end_turn")
    deltas = usages or [None]
    for i, usage in enumerate(deltas):
        last = i == len(deltas) - 1
        event: dict[str, Any] = {"type": "message_delta",
                                 "delta": {"stop_reason": stop if last else None, "stop_sequence": None}}
        if usage is not None:
            event["usage"] = usage
        events.append(event)
    return events


class _AnthropicHandler(_Handler):
    done_frame = b'event: message_stop\ndata: {"type": "message_stop"}\n\n'

    def frame(self, payload: str) -> bytes:
        kind = json.loads(payload).get("type", "message")
        return f"event: {kind}\ndata: {payload}\n\n".encode()

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        body = {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}
        self._send_json(status, body, headers)

    def do_GET(self) -> None:
        self._record(b"")
        self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = self._record(raw)
        if self.path.rstrip("/") != "/v1/messages":
            self._error(404, f"no route {self.path}")
            return
        owner = self.server.owner
        required = getattr(owner, "api_key", None)
        if required is not None and self.headers.get("x-api-key") != required:
            self._error(401, "invalid x-api-key")
            return
        plan, n = owner._next_plan()
        if plan is None and owner.responder is not None and isinstance(body, dict):
            plan = owner.responder(body)
        if plan is None:
            self._error(400, "anthropic test server: no plan queued")
            return
        if plan.status >= 400:
            self._error(plan.status, plan.error_message or f"scripted error {plan.status}", plan.headers)
            return
        model = str(body.get("model", "claude-test")) if isinstance(body, dict) else "claude-test"
        self._stream(plan, [json.dumps(e) for e in build_events(plan, model, n)])


class AnthropicTestServer(OpenAITestServer):
    """Scripted Anthropic-compatible server on 127.0.0.1:<free port>; ``base_url`` has no ``/v1``
    (as ``ANTHROPIC_BASE_URL``)."""

    handler_class = _AnthropicHandler

    def __init__(self, default_plan: Plan | None = None, api_key: str | None = None,
                 responder: Callable[[dict[str, Any]], Plan | None] | None = None) -> None:
        super().__init__(default_plan)
        self.api_key = api_key
        self.responder = responder

    def start(self) -> AnthropicTestServer:
        super().start()
        return self

    def __enter__(self) -> AnthropicTestServer:
        return self.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def completion_requests(self) -> list[Any]:
        return [r for r in self.requests if r.method == "POST" and r.path.rstrip("/") == "/v1/messages"]


def running_server(default_plan: Plan | None = None, api_key: str | None = None) -> Iterator[AnthropicTestServer]:
    """Generator body for a pytest fixture: ``yield from running_server()``."""
    server = AnthropicTestServer(default_plan, api_key).start()
    try:
        yield server
    finally:
        server.close()
