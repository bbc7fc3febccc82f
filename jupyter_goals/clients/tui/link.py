"""The terminal UI's one link to the server: REST through ``AsyncGoalsClient`` and the event stream through
``clients.events.follow_events``, with the connection state the status line shows. No Textual here.

``SessionState`` is a client-side copy of one session as the server last answered it (snapshot head +
the transcript pages loaded), refreshed whenever an event names the session and after every reconnect;
``Outbox`` holds the messages typed but not yet acknowledged (each with its ``client_request_id``,
resent with the same id until the server answers, so a message typed while the server is down is
committed once when it is back)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from jupyter_goals.clients.events import follow_events
from jupyter_goals.clients.rest import AsyncGoalsClient, GoalsError, _check

log = logging.getLogger("jupyter_goals.tui")

PAGE = 200  # transcript items per page
RETRYABLE = frozenset({502, 503, 504})
CONNECTED = "connected"
UNREACHABLE = "server unreachable, retrying"
CONNECTING = "connecting…"

Listener = Callable[[dict[str, Any]], Awaitable[None]]
ConnectionListener = Callable[[bool], Awaitable[None]]


class ServerLink:
    """REST calls (each on a thread) and one event stream for the whole app, from the log's last seq."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self.url, self.token = url, token
        self.rest: AsyncGoalsClient | None = None
        self._stream: httpx.AsyncClient | None = None
        self.event_seq = 0
        self.connected = False
        self.lost = False  # a connection failed since the last success (before any: "connecting…")
        self.listeners: list[Listener] = []
        self.connection_listeners: list[ConnectionListener] = []
        self.tail: asyncio.Task[None] | None = None
        self.outboxes: dict[str, Outbox] = {}  # kept while the app runs: leaving a screen sends on

    def outbox(self, session_id: str) -> Outbox:
        """The messages of one session not yet acknowledged (one per session for the app's life)."""
        if session_id not in self.outboxes:
            self.outboxes[session_id] = Outbox(self, session_id)
        return self.outboxes[session_id]

    def unsent(self) -> int:
        """How many typed messages the server has not acknowledged (lost if the TUI quits now)."""
        return sum(len(outbox.unsent()) for outbox in self.outboxes.values())

    async def open(self) -> None:
        """Find the server (``find_server``: arguments, environment, runtime files) and start following."""
        self.rest = await asyncio.to_thread(AsyncGoalsClient, self.url, self.token, 30.0, 2.0)
        self.tail = asyncio.create_task(self._follow(), name="tui-events")

    async def _follow(self) -> None:
        """From the log's last seq when the TUI started (screens read the state itself), then on."""
        while True:
            try:
                self.event_seq = int((await self.get("/events", {"after": 0, "format": "json", "limit": 1}))["last_seq"])
                break
            except (httpx.HTTPError, GoalsError) as exc:
                await self._on_connection(False, str(exc))
                await asyncio.sleep(1.0)
        await follow_events(self.stream, lambda: self.event_seq, self._on_event, name="tui",
                            on_connection=self._on_connection)

    @property
    def connection(self) -> str:
        return CONNECTED if self.connected else UNREACHABLE if self.lost else CONNECTING

    async def stream(self) -> httpx.AsyncClient:
        if self._stream is None:
            assert self.rest is not None
            sync = self.rest.sync
            self._stream = httpx.AsyncClient(base_url=sync.base_url + "api/goals", headers=dict(sync.http.headers),
                                             timeout=httpx.Timeout(5.0, read=60.0))
        return self._stream

    async def _on_event(self, event: dict[str, Any]) -> None:
        seq = int(event["seq"])
        if seq <= self.event_seq:
            return
        self.event_seq = seq
        for listener in list(self.listeners):
            try:
                await listener(event)
            except Exception:  # one view's failure never stops the feed of the others
                log.exception("event listener failed")

    async def _on_connection(self, up: bool, why: str) -> None:
        if up == self.connected and self.lost != up:
            return
        self.connected, self.lost = up, not up
        for listener in list(self.connection_listeners):
            try:
                await listener(up)
            except Exception:
                log.exception("connection listener failed")

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        assert self.rest is not None
        http = self.rest.sync.http
        return await asyncio.to_thread(lambda: _check(http.get(path, params=params)))

    async def send(self, method: str, path: str, body: dict[str, Any]) -> Any:
        assert self.rest is not None
        http = self.rest.sync.http
        return await asyncio.to_thread(lambda: _check(http.request(method, path, json=body)))

    async def sessions_page(self, cursor: str | None, q: str, state: str, limit: int = 50) -> dict[str, Any]:
        """One ``GET /sessions`` page (newest activity first, keyset ``cursor``)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        if q:
            params["q"] = q
        if state:
            params["state"] = state
        return dict(await self.get("/sessions", params))

    async def close(self) -> None:
        for outbox in self.outboxes.values():
            await outbox.close()
        if self.tail is not None:
            self.tail.cancel()
            await asyncio.gather(self.tail, return_exceptions=True)
        if self._stream is not None:
            await self._stream.aclose()
        if self.rest is not None:
            await self.rest.close()


@dataclass
class SessionState:
    """One session as the server answered it: the snapshot's head and the transcript items loaded (by
    seq; older pages added as the person scrolls up), the live effect states of calls without a result
    yet and the streamed drafts of answers not committed yet."""

    session_id: str
    snap: dict[str, Any] = field(default_factory=dict)
    items: dict[int, dict[str, Any]] = field(default_factory=dict)
    prev_cursor: int | None = None  # older items exist before this seq
    last_seq: int = 0  # the newest transcript seq loaded
    effects: dict[str, str] = field(default_factory=dict)  # call id → last live effect state
    drafts: dict[str, str] = field(default_factory=dict)  # assistant item id → streamed text

    def take_page(self, page: dict[str, Any], older: bool = False) -> list[dict[str, Any]]:
        """Keep a snapshot answer (its head replaces the old one, its items join the loaded ones); the
        items new to this state, in seq order."""
        if not older:
            self.snap = {k: v for k, v in page.items() if k != "transcript"}
        transcript = page.get("transcript") or {}
        if older or not self.items:
            self.prev_cursor = transcript.get("prev_cursor")
        new = [i for i in transcript.get("items") or [] if int(i["seq"]) not in self.items]
        for item in new:
            self.items[int(item["seq"])] = item
            self.drafts.pop(str(item.get("item_id")), None)
            self.last_seq = max(self.last_seq, int(item["seq"]))
        return sorted(new, key=lambda i: int(i["seq"]))

    def item_ids(self) -> set[str]:
        return {str(i.get("item_id")) for i in self.items.values()}

    def results(self) -> set[str]:
        """Call ids whose result (or reconciliation) is in the loaded transcript."""
        return {str(i.get("call_id")) for i in self.items.values() if i.get("kind") in ("tool_result", "reconciliation")}


@dataclass
class OutMessage:
    text: str
    delivery: str
    client_request_id: str = field(default_factory=lambda: "tui-" + uuid.uuid4().hex)
    state: str = "sending…"  # sending… | queued | not sent: <why>
    answer: dict[str, Any] | None = None

    def user_item_ids(self) -> set[str]:
        """The transcript item ids that mean the message is in the conversation."""
        if not self.answer:
            return set()
        return {f"input:{self.answer.get('work_id')}", f"steer:{self.answer.get('message_id')}"}


class Outbox:
    """Messages typed and not yet seen in the transcript. ``deliver`` posts one until the server answers:
    a network error or 502/503/504 is retried with the same ``client_request_id`` (0.5 s doubling to 10 s),
    so the server commits it once; any other refusal is shown as ``not sent``."""

    def __init__(self, link: ServerLink, session_id: str) -> None:
        self.link, self.session_id = link, session_id
        self.changed: Callable[[], None] = lambda: None  # the open session screen's redraw
        self.messages: list[OutMessage] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.woken = asyncio.Event()

    def nudge(self) -> None:
        """The server is back: retry now rather than at the end of the backoff."""
        self.woken.set()

    def add(self, text: str, delivery: str) -> OutMessage:
        message = OutMessage(text, delivery)
        self.messages.append(message)
        task = asyncio.create_task(self.deliver(message), name=f"tui-send-{message.client_request_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self.changed()
        return message

    async def deliver(self, message: OutMessage) -> None:
        body = {"text": message.text, "client_request_id": message.client_request_id, "delivery": message.delivery}
        delay = 0.5
        while True:
            try:
                message.answer = dict(await self.link.send("POST", f"/sessions/{self.session_id}/messages", body))
            except httpx.TransportError:
                pass
            except GoalsError as exc:
                if exc.status not in RETRYABLE:
                    message.state = f"not sent: {exc.message or exc.error}"
                    self.changed()
                    return
            else:
                message.state = "queued" if message.answer.get("delivery") != "steer" else "steering"
                self.changed()
                return
            self.woken.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.woken.wait(), delay)
            delay = min(delay * 2, 10.0)

    def unsent(self) -> list[OutMessage]:
        """The messages the server has not acknowledged: still being sent, or refused."""
        return [m for m in self.messages if m.answer is None]

    def settle(self, item_ids: set[str]) -> None:
        """Drop the messages the transcript now holds."""
        before = len(self.messages)
        self.messages = [m for m in self.messages if not (m.user_item_ids() & item_ids)]
        if len(self.messages) != before:
            self.changed()

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
