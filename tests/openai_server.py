"""A small scripted OpenAI-compatible Chat Completions server for tests (127.0.0.1 only).

Usage::

    with OpenAITestServer() as server:            # or server = OpenAITestServer().start(); server.close()
        server.plan(text_chunks=["Hel", "lo"], usage_chunks=[openai_usage(10, 2)])
        server.plan(status=503)
        provider = OpenAICompatProvider("test-model", base_url=server.base_url)
        ...
        server.requests[0].body["messages"], server.requests[0].headers["idempotency-key"]

Each POST /v1/chat/completions takes the next queued plan (FIFO); with the queue empty it uses
``default_plan`` if set, else answers 400 "no plan queued" (non-retryable, so a missing plan fails
fast). Every request is recorded in ``server.requests`` (headers with lower-case keys, parsed JSON
body), including failed ones. ``GET /v1/models`` lists ``test-model``.

A streamed answer is this SSE event sequence (each ``data:`` line is one event, counted by
``drop_after`` / ``hang_after``):

1. a role chunk (``delta: {"role": "assistant", "content": ""}``)
2. one chunk per ``text_chunks`` item
3. per tool call: a head delta (index, id, type, name, ``arguments: ""``), then argument fragments
   of ``args_chunk_size`` characters (fragments of parallel calls are interleaved if
   ``interleave_tool_calls``)
4. a finish chunk (``finish_reason`` = ``"tool_calls"`` when there are tool calls, else ``"stop"``)
5. one ``{"choices": [], "usage": ...}`` chunk per ``usage_chunks`` item (cumulative snapshots)
6. ``data: [DONE]`` (unless ``send_done=False``)

``raw_events`` replaces steps 1-5 with the given payloads (dicts are JSON-encoded, strings sent as is).

``hold_open_after``: after that many events the stream stays open, sending nothing, until the client
closes its connection (``server.held_streams`` counts the streams held now; ``server.client_closes``
has the wall-clock time of each close the server saw) or ``close()``.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from jupyter_goals.models import Usage

DropMode = Literal["reset", "eof"]


def openai_usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """An OpenAI ``usage`` object (cumulative snapshot)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


@dataclass
class ToolCallPlan:
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)  # a str is sent verbatim (e.g. bad JSON)
    id: str | None = None


@dataclass
class Plan:
    """What the server does for one request. See the module docstring for the event sequence."""

    text_chunks: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallPlan] = field(default_factory=list)
    usage_chunks: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    error_message: str | None = None
    finish_reason: str | None = None
    send_done: bool = True
    drop_after: int | None = None  # close the connection after this many events
    drop_mode: DropMode = "reset"  # reset: abort mid-chunked-body; eof: end the body cleanly, no [DONE]
    hang_after: int | None = None  # stop sending after this many events until release() / close()
    hold_open_after: int | None = None  # stop sending after this many events until the client closes the connection
    hold_after_done: bool = False  # after [DONE] (message_stop), send nothing more until the client closes
    chunk_delay: float = 0.0  # seconds between events
    args_chunk_size: int = 5
    interleave_tool_calls: bool = False
    raw_events: list[dict[str, Any] | str] | None = None
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers
    response_id: str | None = None


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case keys
    body: Any  # parsed JSON (None if the body was not JSON)
    raw_body: bytes
    received_at: float = field(default_factory=time.time)  # wall clock, comparable with durable retry times


def _tool_call_dicts(plan: Plan, n: int) -> list[tuple[int, ToolCallPlan, str, str]]:
    out = []
    for i, call in enumerate(plan.tool_calls):
        args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        out.append((i, call, call.id or f"call_{n}_{i}", args))
    return out


def build_events(plan: Plan, model: str, n: int, include_usage: bool) -> list[str]:
    """The ``data:`` payloads for a streamed plan (without the final [DONE])."""
    rid = plan.response_id or f"chatcmpl-test-{n}"
    created = int(time.time())

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> str:
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        body["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        if include_usage:
            body["usage"] = None
        body.update(extra)
        return json.dumps(body)

    if plan.raw_events is not None:
        return [e if isinstance(e, str) else json.dumps(e) for e in plan.raw_events]

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": text}) for text in plan.text_chunks]
    calls = _tool_call_dicts(plan, n)
    per_call: list[list[str]] = []
    for index, call, call_id, args in calls:
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        seq = [chunk({"tool_calls": [head]})]
        size = max(1, plan.args_chunk_size)
        for start in range(0, len(args), size):
            frag = {"index": index, "function": {"arguments": args[start : start + size]}}
            seq.append(chunk({"tool_calls": [frag]}))
        per_call.append(seq)
    if plan.interleave_tool_calls:
        for k in range(max((len(s) for s in per_call), default=0)):
            events += [s[k] for s in per_call if k < len(s)]
    else:
        for seq in per_call:
            events += seq
    finish = plan.finish_reason or ("tool_calls" if calls else "stop")
    events.append(chunk({}, finish))
    events += [chunk(None, usage=u) for u in plan.usage_chunks]
    return events


def build_json_response(plan: Plan, model: str, n: int) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` for requests with ``stream: false``."""
    calls = _tool_call_dicts(plan, n)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(plan.text_chunks) or None}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": c.name, "arguments": args}}
            for _, c, cid, args in calls
        ]
    body: dict[str, Any] = {
        "id": plan.response_id or f"chatcmpl-test-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": plan.finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
    }
    if plan.usage_chunks:
        body["usage"] = plan.usage_chunks[-1]
    return body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    done_frame = b"data: [DONE]\n\n"  # sent after the events when ``send_done``

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.owner.lock:
            self.server.owner.connections += 1  # TCP connections accepted

    # ------------------------------------------------------------------ helpers

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def frame(self, payload: str) -> bytes:
        """One SSE frame for an event payload (the Anthropic server also names the event)."""
        return f"data: {payload}\n\n".encode()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _record(self, raw: bytes) -> Any:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        rec = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            raw_body=raw,
        )
        with self.server.owner.lock:
            self.server.owner._requests.append(rec)
        return body

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:
        self._record(b"")
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": "test-model", "object": "model"}]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = self._record(raw)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        owner = self.server.owner
        plan, n = owner._next_plan()
        if plan is None:
            self._send_json(400, {"error": {"message": "openai test server: no plan queued", "type": "test"}})
            return
        if plan.status >= 400:
            message = plan.error_message or f"scripted error {plan.status}"
            error = {"error": {"message": message, "type": "test_error", "code": None}}
            self._send_json(plan.status, error, plan.headers)
            return
        model = str(body.get("model", "test-model")) if isinstance(body, dict) else "test-model"
        stream = isinstance(body, dict) and bool(body.get("stream"))
        if not stream:
            self._send_json(200, build_json_response(plan, model, n), plan.headers)
            return
        opts = body.get("stream_options") if isinstance(body, dict) else None
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        events = build_events(plan, model, n, include_usage)
        self._stream(plan, events)

    def _stream(self, plan: Plan, events: list[str]) -> None:
        owner = self.server.owner
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        # ``keep_alive``: a stream that ends normally leaves the connection open for the next request
        keep = (owner.keep_alive and plan.drop_after is None and plan.hold_open_after is None and plan.hang_after is None
                and not plan.hold_after_done)
        if not keep:
            self.send_header("Connection", "close")
        for k, v in plan.headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.close_connection = not keep
        try:
            for i, payload in enumerate(events):
                if plan.drop_after is not None and i >= plan.drop_after:
                    self._drop(plan.drop_mode)
                    return
                if plan.hold_open_after is not None and i >= plan.hold_open_after:
                    self._hold_until_client_closes()
                    return
                if plan.hang_after is not None and i >= plan.hang_after:
                    owner._release.wait()
                    if owner._closing:
                        self._drop("reset")
                        return
                if plan.chunk_delay and i:
                    time.sleep(plan.chunk_delay)
                self._write_chunk(self.frame(payload))
            if plan.drop_after is not None and plan.drop_after <= len(events):
                self._drop(plan.drop_mode)
                return
            if plan.send_done and self.done_frame:
                self._write_chunk(self.done_frame)
            if plan.hold_after_done:
                self._hold_until_client_closes()
                return
            self._write_chunk(b"")  # terminating zero-length chunk
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away

    def _hold_until_client_closes(self) -> None:
        """Keep the stream open, sending nothing, until the client closes its end (recorded) or close()."""
        owner = self.server.owner
        with owner.lock:
            owner._held += 1
        try:
            while not owner._closing:
                readable, _, _ = select.select([self.connection], [], [], 0.05)
                if not readable:
                    continue
                try:
                    data = self.connection.recv(4096)
                except OSError:  # reset by the client
                    data = b""
                if not data:  # end of file: the client closed the connection
                    with owner.lock:
                        owner._client_closes.append(time.time())
                    return
            self._drop("reset")
        finally:
            with owner.lock:
                owner._held -= 1

    def _drop(self, mode: DropMode) -> None:
        try:
            if mode == "eof":
                self._write_chunk(b"")  # the body ends cleanly, just without [DONE] / finish
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: OpenAITestServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # dropped / reset connections are the point of some plans; keep test output quiet
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class OpenAITestServer:
    """Scripted OpenAI-compatible server on 127.0.0.1:<free port>, served from a background thread."""

    handler_class: type[BaseHTTPRequestHandler] = _Handler

    def __init__(self, default_plan: Plan | None = None) -> None:
        self.lock = threading.Lock()
        self.default_plan = default_plan
        self._plans: deque[Plan] = deque()
        self._requests: list[RecordedRequest] = []
        self._count = 0
        self._release = threading.Event()
        self._closing = False
        self._held = 0  # streams held open by ``hold_open_after`` right now
        self._client_closes: list[float] = []  # when the client closed a held stream (wall clock)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.keep_alive = False  # True: a stream that ends normally keeps its connection (HTTP/1.1 keep-alive)
        self.connections = 0  # TCP connections accepted so far

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> OpenAITestServer:
        httpd = _Server(("127.0.0.1", 0), self.handler_class)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(0.02,), name="openai-test-server", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing = True
        self._release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAITestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ addresses

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """Use as ``OPENAI_BASE_URL`` (ends in ``/v1``, no trailing slash)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------ scripting

    def plan(
        self,
        text_chunks: list[str] | None = None,
        tool_calls: list[dict[str, Any] | ToolCallPlan] | None = None,
        usage_chunks: list[dict[str, Any]] | None = None,
        status: int = 200,
        drop_after: int | None = None,
        **options: Any,
    ) -> Plan:
        """Queue the answer for the next request. ``tool_calls`` items: ``{"name", "arguments", "id"?}``
        (``arguments`` dict or raw string). Further ``options`` are :class:`Plan` fields
        (``error_message``, ``finish_reason``, ``send_done``, ``drop_mode``, ``hang_after``,
        ``chunk_delay``, ``args_chunk_size``, ``interleave_tool_calls``, ``raw_events``, ``headers``,
        ``response_id``)."""
        calls = [c if isinstance(c, ToolCallPlan) else ToolCallPlan(**c) for c in tool_calls or []]
        p = Plan(
            text_chunks=list(text_chunks or []),
            tool_calls=calls,
            usage_chunks=list(usage_chunks or []),
            status=status,
            drop_after=drop_after,
            **options,
        )
        return self.push(p)

    def push(self, plan: Plan) -> Plan:
        with self.lock:
            self._plans.append(plan)
        return plan

    def plan_text(self, text: str, usage: dict[str, Any] | None = None) -> Plan:
        """Shorthand: one text chunk, optional single usage snapshot."""
        return self.plan(text_chunks=[text], usage_chunks=[usage] if usage else [])

    def plan_tool_call(
        self, name: str, arguments: dict[str, Any], usage: dict[str, Any] | None = None
    ) -> Plan:
        """Shorthand: one tool call, optional single usage snapshot."""
        return self.plan(
            tool_calls=[{"name": name, "arguments": arguments}], usage_chunks=[usage] if usage else []
        )

    def plan_error(self, status: int, message: str | None = None) -> Plan:
        return self.plan(status=status, error_message=message)

    def release(self) -> None:
        """Let streams held by ``hang_after`` continue."""
        self._release.set()

    def _next_plan(self) -> tuple[Plan | None, int]:
        with self.lock:
            self._count += 1
            plan = self._plans.popleft() if self._plans else self.default_plan
            return plan, self._count

    # ------------------------------------------------------------------ inspection

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far (a copy), oldest first."""
        with self.lock:
            return list(self._requests)

    @property
    def completion_requests(self) -> list[RecordedRequest]:
        return [
            r for r in self.requests if r.method == "POST" and r.path.rstrip("/") == "/v1/chat/completions"
        ]

    @property
    def held_streams(self) -> int:
        """Streams held open by ``hold_open_after`` right now (the client has not closed them)."""
        with self.lock:
            return self._held

    @property
    def client_closes(self) -> list[float]:
        """The wall-clock time of each close of a held stream by its client, oldest first."""
        with self.lock:
            return list(self._client_closes)

    @property
    def pending_plans(self) -> int:
        with self.lock:
            return len(self._plans)


def running_server(default_plan: Plan | None = None) -> Iterator[OpenAITestServer]:
    """Generator body for a pytest fixture: ``yield from running_server()``."""
    server = OpenAITestServer(default_plan).start()
    try:
        yield server
    finally:
        server.close()


class Recorder:
    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.usages: list[Usage] = []

    async def on_chunk(self, text: str) -> None:
        self.chunks.append(text)

    def on_usage(self, usage: Usage) -> None:  # sync callbacks are accepted too
        self.usages.append(usage)
