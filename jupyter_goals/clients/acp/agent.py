"""The ACP agent: a thin client of a running jupyter_goals server (REST and the event stream only).

Everything durable lives in the server; this process keeps caches (one ``SessionFeed`` per session the
ACP client opened) and can die at any moment. A feed replays a session's transcript and then follows
the event stream from the seq the replay read, turning each record into ``session/update``s with the
same code (``updates.item_updates``); pending approvals become ``session/request_permission`` with the
call id as ``toolCallId``, asked again by whichever agent process loads the session next.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from acp import PROTOCOL_VERSION, Agent, Client, RequestError
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AgentCapabilities,
    AudioContentBlock,
    AuthenticateResponse,
    CloseSessionResponse,
    ConfigOptionUpdate,
    CurrentModeUpdate,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionConfigOptionBoolean,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionInfo,
    SessionListCapabilities,
    SessionMode,
    SessionModeState,
    SessionResumeCapabilities,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    TextContentBlock,
)

from jupyter_goals.clients.acp import commands
from jupyter_goals.clients.acp.feed import SessionFeed, client_request_id
from jupyter_goals.clients.acp.updates import agent_text, prompt_text
from jupyter_goals.clients.rest import AsyncGoalsClient, GoalsError, _check

log = logging.getLogger("jupyter_goals.acp")

MODES = (("ask", "Ask", "Writes, commands and unknown tools wait for your approval."),
         ("bypass", "Bypass", "Tools run without asking (approvals after unknown outcomes still apply)."))

PromptBlock = TextContentBlock | ImageContentBlock | AudioContentBlock | ResourceContentBlock | EmbeddedResourceContentBlock
ConfigOption = SessionConfigOptionSelect | SessionConfigOptionBoolean


class GoalsAgent(Agent):
    """ACP v1 over a jupyter_goals server: sessions, prompts, approvals, load and cancel."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self.url, self.token = url, token
        self.connection_id = uuid.uuid4().hex
        self._conn: Client | None = None
        self._rest: AsyncGoalsClient | None = None
        self._stream: httpx.AsyncClient | None = None
        self.feeds: dict[str, SessionFeed] = {}
        self.prompt_ids: dict[str, list[Any]] = {}  # session id → JSON-RPC ids of prompts not yet handled
        self.cancels: dict[str, asyncio.Event] = {}
        self.windows: dict[str, int | None] = {}  # session id → its model's context window (usage_update)
        self.later: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ plumbing
    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    def conn(self) -> Client:
        assert self._conn is not None, "not connected"
        return self._conn

    def observe(self, event: StreamEvent) -> None:
        """Stream observer: remembers the JSON-RPC id of each incoming prompt (the SDK hands the handler
        only its parameters), from which the message's ``client_request_id`` is derived."""
        message = event.message
        if event.direction == StreamDirection.INCOMING and message.get("method") == "session/prompt":
            session_id = str((message.get("params") or {}).get("sessionId"))
            self.prompt_ids.setdefault(session_id, []).append(message.get("id"))

    async def server(self) -> AsyncGoalsClient:
        """The REST client, found as ``GoalsClient()`` finds its server (on a thread: it reads files)."""
        if self._rest is None:
            try:
                self._rest = await asyncio.to_thread(AsyncGoalsClient, self.url, self.token)
            except RuntimeError as exc:  # ServerNotFound, naming everything tried
                raise RequestError.internal_error({"message": str(exc)}) from exc
        return self._rest

    async def stream(self) -> httpx.AsyncClient:
        """The event stream's own async client (a stream never holds one of the REST client's threads)."""
        if self._stream is None:
            sync = (await self.server()).sync
            self._stream = httpx.AsyncClient(base_url=sync.base_url + "api/goals", headers=dict(sync.http.headers),
                                             timeout=httpx.Timeout(10.0, read=60.0))
        return self._stream

    async def get(self, path: str, params: dict[str, Any] | None) -> Any:
        http = (await self.server()).sync.http
        return await asyncio.to_thread(lambda: _check(http.get(path, params=params)))

    async def post(self, path: str, body: dict[str, Any], method: str = "POST") -> Any:
        """One write (the REST client retries it only while no server answered: refused, 503 starting)."""
        http = (await self.server()).sync.http
        return await asyncio.to_thread(lambda: _check(http.request(method, path, json=body)))

    async def feed(self, session_id: str) -> SessionFeed:
        """The session's feed; one following from now on when this connection has none (a prompt to a
        session it neither created nor loaded)."""
        feed = self.feeds.get(session_id)
        if feed is None:
            feed = self.feeds[session_id] = SessionFeed(self, session_id)
            try:
                await feed.follow(after_latest=True)
            except BaseException:
                await self.drop_feed(feed)
                raise
        return feed

    async def renew_feed(self, session_id: str) -> SessionFeed:
        """A fresh feed for a session loaded or resumed again, installed before the old one closes, so a
        prompt waiting on the old one moves to it (``SessionFeed.wait_ended`` → None)."""
        old = self.feeds.get(session_id)
        feed = self.feeds[session_id] = SessionFeed(self, session_id)
        if old is not None:
            await old.close()
        return feed

    async def drop_feed(self, feed: SessionFeed) -> None:
        if self.feeds.get(feed.session_id) is feed:
            del self.feeds[feed.session_id]
        await feed.close()

    async def close(self) -> None:
        for task in list(self.later):
            task.cancel()
        for feed in list(self.feeds.values()):
            await feed.close()
        if self._stream is not None:
            await self._stream.aclose()
        if self._rest is not None:
            await self._rest.close()

    # ------------------------------------------------------------------ session state as ACP shapes
    async def _shapes(self, session: dict[str, Any]) -> tuple[SessionModeState, list[SessionConfigOptionSelect]]:
        mode = str((session.get("permissions") or {}).get("mode", "ask"))
        modes = SessionModeState(current_mode_id=mode, available_modes=[
            SessionMode(id=m, name=name, description=text) for m, name, text in MODES])
        listed = await self.get("/models", None)
        current = str(session.get("model") or listed.get("default_model") or "")
        options = [SessionConfigSelectOption(
            value=m["name"], name=m["name"],
            description=(m.get("description") or m.get("model") or "") if m.get("credentials_present", True)
            else f"no credentials: set the key of {m['name']} in the server's environment")
            for m in listed.get("models") or []]
        if current and current not in {o.value for o in options}:
            options.append(SessionConfigSelectOption(value=current, name=current))
        model = SessionConfigOptionSelect(id="model", name="Model", category="model", type="select",
                                          current_value=current, options=options)
        return modes, [model]

    async def allow_always(self, session_id: str, tool: str) -> None:
        """``allow_always``: a durable allow rule of this session (listed and revocable over REST)."""
        snap = await self.get(f"/sessions/{session_id}", {"before": "latest", "limit": 1})
        permissions = dict(snap["session"].get("permissions") or {})
        allow = list(permissions.get("allow") or [])
        if tool not in allow:
            permissions["allow"] = [*allow, tool]
            await self.post(f"/sessions/{session_id}", {"permissions": permissions}, method="PATCH")

    # ------------------------------------------------------------------ ACP methods
    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **kwargs: Any) -> InitializeResponse:
        try:
            await self.server()  # find the server now, so a missing one is logged at once
        except RequestError as exc:
            log.warning("no jupyter_goals server found: %s", exc.data)
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=True),
                # resume and close are routed by the SDK with use_unstable_protocol (``acp.run``)
                session_capabilities=SessionCapabilities(list=SessionListCapabilities(),
                                                         resume=SessionResumeCapabilities(),
                                                         close=SessionCloseCapabilities()),
            ),
            auth_methods=[],
            agent_info=Implementation(name="jupyter-goals", title="Jupyter Goals", version=_version()),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> AuthenticateResponse | None:
        return AuthenticateResponse()

    async def new_session(self, cwd: str, additional_directories: list[str] | None = None,
                          mcp_servers: list[Any] | None = None, **kwargs: Any) -> NewSessionResponse:
        created = await self.post("/sessions", {"title": "ACP chat", "cwd": cwd})
        session = created["session"]
        feed = self.feeds[session["session_id"]] = SessionFeed(self, session["session_id"])
        feed.event_seq = int(created.get("event_seq") or 0)
        feed.model = session.get("model")
        feed.ready.set()
        feed.start()
        modes, options = await self._shapes(session)
        # the commands go out once the client knows the session (the SDK writes this answer first)
        self.in_background(feed.send(commands.commands_update()))
        return NewSessionResponse(session_id=session["session_id"], modes=modes, config_options=list[ConfigOption](options))

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None,
                           additional_directories: list[str] | None = None, **kwargs: Any) -> LoadSessionResponse | None:
        feed = await self.renew_feed(session_id)
        try:
            await feed.replay()
            feed.start()
        except BaseException as exc:
            await self.drop_feed(feed)
            if isinstance(exc, GoalsError) and exc.status == 404:
                raise RequestError.resource_not_found(session_id) from exc
            raise
        snap = await self.get(f"/sessions/{feed.session_id}", {"before": "latest", "limit": 1})
        modes, options = await self._shapes(snap["session"])
        state = commands.recovered_state(snap)
        if state:
            await feed.send(agent_text(f"recovered:{snap['work']['work_id']}:{snap['event_seq']}", f"\n\n_{state}_\n\n"))
        await feed.send(commands.commands_update())
        # live updates and re-asked approvals go out once this answer is on its way (the SDK writes it
        # before the loop runs another task)
        asyncio.get_running_loop().call_soon(feed.ready.set)
        return LoadSessionResponse(modes=modes, config_options=list[ConfigOption](options))

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any) -> ListSessionsResponse:
        params: dict[str, Any] = {"limit": 100}
        if cursor:
            params["cursor"] = cursor
        if cwd:
            params["q"] = cwd
        page = await self.get("/sessions", params)
        sessions = [SessionInfo(session_id=s["session_id"], cwd=s["cwd"], title=s.get("title") or None,
                                updated_at=_iso(s.get("activity_at") or s.get("updated_at")))
                    for s in page["sessions"] if not cwd or s.get("cwd") == cwd]
        return ListSessionsResponse(sessions=sessions, next_cursor=page.get("next_cursor"))

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> SetSessionModeResponse | None:
        if mode_id not in {m for m, _, _ in MODES}:
            raise RequestError.invalid_params({"modeId": mode_id, "modes": [m for m, _, _ in MODES]})
        snap = await self.get(f"/sessions/{session_id}", {"before": "latest", "limit": 1})
        permissions = {**(snap["session"].get("permissions") or {}), "mode": mode_id}
        await self.post(f"/sessions/{session_id}", {"permissions": permissions}, method="PATCH")
        if session_id in self.feeds:
            await self.feeds[session_id].send(CurrentModeUpdate(session_update="current_mode_update",
                                                                current_mode_id=mode_id))
        return SetSessionModeResponse()

    async def set_config_option(self, config_id: str, session_id: str, value: str | bool,
                                **kwargs: Any) -> SetSessionConfigOptionResponse | None:
        """``model``: ``update_session`` (``PATCH /sessions/{id}``); the new model applies from the
        session's next turn, and every other surface hears of it (``session.updated``)."""
        if config_id != "model" or not isinstance(value, str):
            raise RequestError.invalid_params({"configId": config_id, "message": "the only option is model"})
        feed = self.feeds.get(session_id)
        told = feed.model if feed is not None else None
        if feed is not None:  # before the PATCH: its session.updated event may reach the feed before the answer
            feed.model = value  # does, and this answer tells the client; the event need not tell it again
        try:
            session = await (await self.server()).update_session(session_id, model=value)
        except GoalsError as exc:
            if feed is not None:
                feed.model = told
            if exc.status == 404:
                raise RequestError.resource_not_found(session_id) from exc
            if exc.status == 400:  # an unknown model, named by the server
                raise RequestError.invalid_params({"configId": config_id, "value": value, "message": exc.message}) from exc
            raise
        if feed is not None:
            feed.model = session.get("model")
        _, options = await self._shapes(session)
        return SetSessionConfigOptionResponse(config_options=list[ConfigOption](options))

    async def model_options(self, session_id: str) -> ConfigOptionUpdate | None:
        """The model option as it is now (after a change on another surface), for ``config_option_update``."""
        try:
            snap = await self.get(f"/sessions/{session_id}", {"before": "latest", "limit": 1})
            _, options = await self._shapes(snap["session"])
        except (GoalsError, httpx.HTTPError) as exc:
            log.info("model of %s not read: %s", session_id, exc)
            return None
        return ConfigOptionUpdate(session_update="config_option_update", config_options=list[ConfigOption](options))

    async def prompt(self, session_id: str, prompt: list[PromptBlock], **kwargs: Any) -> PromptResponse:
        ids = self.prompt_ids.get(session_id) or []
        rpc_id = ids.pop(0) if ids else uuid.uuid4().hex
        meta = kwargs.get("field_meta") or {}
        key = str(meta.get("clientRequestId") or client_request_id(self.connection_id, rpc_id, session_id))
        try:
            feed = await self.feed(session_id)
        except GoalsError as exc:
            if exc.status == 404:
                raise RequestError.resource_not_found(session_id) from exc
            raise
        text = prompt_text(list(prompt))
        command = commands.parse(text)
        if command is not None:  # /goal, /pause, ...: answered here, the work they start streams as usual
            reply = await commands.run(self, session_id, *command, request_key=key)
            await feed.send(agent_text(f"command:{key}", reply.text))
            return PromptResponse(stop_reason=reply.stop_reason)
        cancelled = self.cancels[session_id] = asyncio.Event()
        answer = await _retry_lost(lambda: self.post(f"/sessions/{session_id}/messages",
                                                     {"text": text, "client_request_id": key}))
        reason = None
        while reason is None:  # a session/load or resume meanwhile replaces the feed: wait on the new one
            waiter = asyncio.create_task(feed.wait_ended(str(answer["work_id"]), cancelled))
            try:
                reason = await waiter
            finally:
                waiter.cancel()
            if reason is None:
                feed = self.feeds.get(session_id) or await self.feed(session_id)
        self.in_background(self.tell_usage(feed))
        return PromptResponse(stop_reason=reason)  # type: ignore[arg-type]

    def in_background(self, work: Awaitable[None]) -> None:
        """After the current answer is written (the SDK writes it before the loop runs another task)."""

        async def run() -> None:
            await work

        task = asyncio.create_task(run())
        self.later.add(task)
        task.add_done_callback(self.later.discard)

    async def tell_usage(self, feed: SessionFeed, settle_s: float = 5.0) -> None:
        """``usage_update`` from the ledger: after a prompt's turn once its receipts are written (at most
        ``settle_s`` later: a cost still unsettled then is told as unknown), and at once (``settle_s`` 0) when
        a receipt reaches the ledger while work runs; nothing when unreadable."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settle_s
        try:
            if feed.session_id not in self.windows:
                snap = await self.get(f"/sessions/{feed.session_id}", {"before": "latest", "limit": 1})
                models = (await self.get("/models", None)).get("models") or []
                self.windows[feed.session_id] = next((m.get("context_window") for m in models
                                                      if m["name"] == snap["session"].get("model")), None)
            usage = await self.get("/usage", {"session_id": feed.session_id})
            while not commands.usage_settled(usage) and loop.time() < deadline:
                await asyncio.sleep(0.1)
                usage = await self.get("/usage", {"session_id": feed.session_id})
            update = commands.usage_update(usage, self.windows[feed.session_id])
        except (GoalsError, httpx.HTTPError) as exc:
            log.info("usage of %s not read: %s", feed.session_id, exc)
            return
        if update is not None:
            await feed.send(update)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        """``session/cancel`` is Stop: the work's stop intent is durable, its running command is killed."""
        try:
            await self.post(f"/sessions/{session_id}/actions", {"action": "stop"})
        except GoalsError as exc:
            if exc.status not in (404, 409):  # nothing left to stop
                raise
        event = self.cancels.get(session_id)
        if event is not None:
            event.set()
        feed = self.feeds.get(session_id)
        if feed is not None:
            async with feed.changed:
                feed.changed.notify_all()

    async def fork_session(self, session_id: str, cwd: str, additional_directories: list[str] | None = None,
                           mcp_servers: list[Any] | None = None, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("session/fork")

    async def resume_session(self, session_id: str, cwd: str, additional_directories: list[str] | None = None,
                             mcp_servers: list[Any] | None = None, **kwargs: Any) -> ResumeSessionResponse:
        """``session/load`` without the replay: follow from now on; pending approvals are asked again
        (same ``toolCallId``) once this answer is on its way."""
        feed = await self.renew_feed(session_id)
        try:
            snap = await feed.follow(after_latest=True, ready=False)
        except BaseException as exc:
            await self.drop_feed(feed)
            if isinstance(exc, GoalsError) and exc.status == 404:
                raise RequestError.resource_not_found(session_id) from exc
            raise
        modes, options = await self._shapes(snap["session"])
        self.in_background(feed.send(commands.commands_update()))
        asyncio.get_running_loop().call_soon(feed.ready.set)
        return ResumeSessionResponse(modes=modes, config_options=list[ConfigOption](options))

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        """Stop following the session here (its questions end in this client); the work goes on."""
        feed = self.feeds.pop(session_id, None)
        if feed is not None:
            await feed.close()
        return CloseSessionResponse()

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


async def _retry_lost(send: Callable[[], Awaitable[Any]], within_s: float = 30.0) -> Any:
    """A keyed write sent again after a lost connection: the key makes a repeat change nothing."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    delay = 0.2
    while True:
        try:
            return await send()
        except (httpx.TransportError, GoalsError) as exc:
            retryable = isinstance(exc, httpx.TransportError) or exc.status in (502, 503, 504)
            if not retryable or loop.time() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


def _iso(ts: Any) -> str | None:
    return datetime.fromtimestamp(float(ts), UTC).isoformat() if ts else None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jupyter_goals")
    except PackageNotFoundError:
        return "0"
