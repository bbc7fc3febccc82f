"""One ACP session's feed: replay of the durable transcript, then the event stream from the seq the replay
read, through the same code (``updates.item_updates``); pending approvals asked as
``session/request_permission`` with the call id as ``toolCallId``. Kept by ``agent.GoalsAgent``, which
it reaches through ``FeedHost`` (the connection, REST and the event stream)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable
from typing import Any, Protocol

import httpx
from acp import Client, RequestError
from acp.schema import (
    AgentPlanUpdate,
    AllowedOutcome,
    AvailableCommandsUpdate,
    ConfigOptionUpdate,
    CurrentModeUpdate,
    PermissionOption,
    SessionInfoUpdate,
    ToolCallProgress,
    ToolCallUpdate,
)

from jupyter_goals.clients.acp.updates import (
    TranscriptItem,
    Update,
    agent_text,
    answer_rest,
    draft_delta,
    effect_progress,
    is_stop_marker,
    item_updates,
    plan_update,
    session_info,
    stopped_call,
    tool_kind,
    tool_title,
    turn_stop_reason,
)
from jupyter_goals.clients.events import follow_events
from jupyter_goals.clients.rest import GoalsError

log = logging.getLogger("jupyter_goals.acp")

PAGE = 5000  # transcript items per snapshot page
# phases that end a prompt's work item; any other phase (waiting for an approval, recovering) keeps it open
ENDED = {"done": "end_turn", "cancelled": "cancelled", "failed": "end_turn", "paused": "end_turn"}
CANCEL_WAIT_S = 1.0  # after a Stop is committed, how long a prompt waits for the work's final records


class FeedHost(Protocol):
    """What a feed needs of its agent."""

    def conn(self) -> Client: ...

    async def get(self, path: str, params: dict[str, Any] | None) -> Any: ...

    async def post(self, path: str, body: dict[str, Any], method: str = "POST") -> Any: ...

    async def stream(self) -> httpx.AsyncClient: ...

    async def allow_always(self, session_id: str, tool: str) -> None: ...

    async def model_options(self, session_id: str) -> ConfigOptionUpdate | None: ...

    async def tell_usage(self, feed: SessionFeed, settle_s: float = 5.0) -> None: ...

    def in_background(self, work: Awaitable[None]) -> None: ...


def withdrawn(call_id: str, kind: str, payload: dict[str, Any]) -> ToolCallProgress:
    """A permission question that no longer counts, said in the call's ``_meta`` (so a replayed conversation
    and a live one stay the same): ``approval.decided`` with the decision, or ``approval.invalidated``."""
    about = {"withdrawn": kind, "decision": payload.get("decision"), "reason": payload.get("reason")}
    return ToolCallProgress(session_update="tool_call_update", tool_call_id=call_id,
                            field_meta={"jupyter_goals": {k: v for k, v in about.items() if v is not None}})


def client_request_id(connection_id: str, rpc_id: Any, session_id: str) -> str:
    """The message's idempotency key for one ACP prompt request: every POST this agent makes for the
    request (retries after a lost connection or a restarting server) carries it, so the server commits
    one message."""
    return "acp-" + hashlib.sha256(f"{connection_id}|{rpc_id}|{session_id}".encode()).hexdigest()[:32]


class SessionFeed:
    """One session's conversation as ACP updates: replay, then the live tail from the recorded seq.

    ``transcript_seq`` is the last transcript item sent and ``event_seq`` the last event read: a catch-up
    reads items after ``transcript_seq`` only, so nothing is sent twice and nothing is skipped."""

    def __init__(self, agent: FeedHost, session_id: str) -> None:
        self.agent = agent
        self.session_id = session_id
        self.transcript_seq = 0
        self.event_seq = 0
        self.settled: set[str] = set()  # call ids whose result was sent: no live status moves them back
        self.started: set[str] = set()  # call ids whose tool_call was sent
        self.answered: set[str] = set()  # assistant item ids sent (drafts for them are late)
        self.streamed: dict[str, str] = {}  # assistant item id → draft text sent so far
        self.phases: dict[str, str] = {}  # work id → last phase seen
        self.open_calls: dict[str, list[str]] = {}  # work id → its calls sent without a result yet
        self.answer_stops: dict[str, Any] = {}  # work id → the provider's stop reason of its last answer
        self.model: str | None = None  # the session's model as last told (a change → config_option_update)
        self.closed = False  # replaced by a new feed (session/load, resume) or closed: waiters move on
        self.asking: dict[str, asyncio.Task[None]] = {}  # approval id → its permission request
        self.changed = asyncio.Condition()
        self.tail: asyncio.Task[None] | None = None
        self.usage_reading = False  # a usage_update being read: a receipt meanwhile reads once more after it
        self.usage_again = False
        # set once the client knows the session (after session/load has answered): live updates and
        # permission requests wait for it, the replay does not
        self.ready = asyncio.Event()

    async def send(self, update: Update | CurrentModeUpdate | AgentPlanUpdate | AvailableCommandsUpdate
                   | SessionInfoUpdate | ConfigOptionUpdate) -> None:
        await self.agent.conn().session_update(session_id=self.session_id, update=update)

    async def apply_item(self, item: TranscriptItem) -> None:
        """The one path for replayed and live items."""
        if item.seq <= self.transcript_seq:
            return
        self.transcript_seq = item.seq
        if item.kind == "assistant":
            if item.work_id:
                self.answer_stops[item.work_id] = (item.meta or {}).get("stop_reason")
            self.answered.add(item.item_id)
            streamed = self.streamed.pop(item.item_id, "")
            rest = answer_rest(streamed, item.content)
            if rest:
                await self.send(agent_text(item.item_id, rest))
            return
        if item.kind == "tool_call" and item.call_id:
            self.started.add(item.call_id)
            if item.work_id:
                self.open_calls.setdefault(item.work_id, []).append(item.call_id)
        if item.kind in ("tool_result", "reconciliation") and item.call_id:
            self.settled.add(item.call_id)
        for update in item_updates(item):
            await self.send(update)
        if is_stop_marker(item) and item.work_id:
            await self.settle_stopped(item.work_id)

    async def settle_stopped(self, work_id: str) -> None:
        """A stopped work item's calls still open (waiting for an approval, or running) end ``failed``:
        after the Stop marker, or when the work is seen cancelled; the same on replay and live."""
        for call_id in self.open_calls.pop(work_id, []):
            if call_id not in self.settled:
                self.settled.add(call_id)
                await self.send(stopped_call(call_id))

    async def replay(self) -> dict[str, Any]:
        """Every transcript item as updates, in order; returns the last page (its ``event_seq`` is where
        the tail starts: the page and the seq were read in one transaction)."""
        page = await self.agent.get(f"/sessions/{self.session_id}", {"after": self.transcript_seq, "limit": PAGE})
        while True:
            for raw in page["transcript"]["items"]:
                await self.apply_item(TranscriptItem.model_validate(raw))
            if not page["transcript"].get("next_cursor"):
                break
            page = await self.agent.get(f"/sessions/{self.session_id}", {"after": self.transcript_seq, "limit": PAGE})
        self.event_seq = max(self.event_seq, int(page["event_seq"]))
        if page.get("todo"):
            await self.send(plan_update(page["todo"]))
        if page.get("work"):
            if page["work"]["phase"] == "cancelled":
                await self.settle_stopped(page["work"]["work_id"])
            async with self.changed:  # a prompt moved here from a replaced feed may wait for this phase
                self.phases[page["work"]["work_id"]] = page["work"]["phase"]
                self.changed.notify_all()
        self.model = page["session"].get("model")
        for approval in page.get("approvals") or []:
            if approval.get("state") == "pending":
                self.ask(approval)
        return page

    async def follow(self, after_latest: bool, ready: bool = True) -> dict[str, Any]:
        """Start following without a replay: from the newest item and the current event seq (``ready``
        False: live updates and questions wait until the caller sets ``self.ready``)."""
        page = await self.agent.get(f"/sessions/{self.session_id}", {"before": "latest", "limit": 1})
        items = page["transcript"]["items"]
        self.transcript_seq = items[-1]["seq"] if items and after_latest else 0
        self.event_seq = int(page["event_seq"])
        self.model = page["session"].get("model")
        if page.get("work"):  # a prompt that moves here may wait for a work item that has already ended
            self.phases[page["work"]["work_id"]] = page["work"]["phase"]
        if ready:
            self.ready.set()
        for approval in page.get("approvals") or []:
            if approval.get("state") == "pending":
                self.ask(approval)
        self.start()
        return page

    def start(self) -> None:
        if self.tail is None or self.tail.done():
            self.tail = asyncio.create_task(self._tail(), name=f"acp-tail-{self.session_id}")

    async def _tail(self) -> None:
        await self.ready.wait()
        await follow_events(self.agent.stream, lambda: self.event_seq, self.on_event, name=self.session_id)

    async def on_event(self, event: dict[str, Any]) -> None:
        seq = int(event["seq"])
        if seq <= self.event_seq:
            return
        if event.get("session_id") == self.session_id:
            await self._apply_event(event["kind"], event.get("payload") or {}, event.get("work_id"))
        self.event_seq = seq

    async def _apply_event(self, kind: str, payload: dict[str, Any], work_id: str | None) -> None:
        if kind == "transcript.item" and int(payload.get("seq", 0)) > self.transcript_seq:
            await self.catch_up()
        elif kind == "assistant.draft":
            item_id = f"resp:{payload.get('request_id')}"
            if item_id not in self.answered:
                sent = self.streamed.get(item_id, "")
                delta = draft_delta(sent, str(payload.get("text", "")))
                if delta:
                    self.streamed[item_id] = sent + delta
                    await self.send(agent_text(item_id, delta))
        elif kind == "effect.state":
            call_id = str(payload.get("call_id"))
            progress = effect_progress(call_id, str(payload.get("state")))
            if progress is not None and call_id in self.started and call_id not in self.settled:
                await self.send(progress)
        elif kind == "approval.requested":
            pending = await self.agent.get("/approvals", {"state": "pending"})
            approval = next((a for a in pending["approvals"] if a["approval_id"] == payload["approval_id"]), None)
            if approval is not None:  # else already answered elsewhere
                self.ask(approval)
        elif kind in ("approval.decided", "approval.invalidated"):
            task = self.asking.pop(str(payload.get("approval_id")), None)
            if task is not None and not task.done():
                # answered on another surface (JupyterLab, REST, a notebook) or withdrawn: this question
                # is void. The SDK cannot withdraw a request, so the client is told in the call's _meta;
                # an answer it still gives is ignored (and the server would refuse it: 409)
                task.cancel()
                await self.send(withdrawn(str(payload.get("call_id")), kind, payload))
        elif kind == "todo.updated":
            await self.send(plan_update(list(payload.get("items") or [])))
        elif kind == "work.phase" and work_id:
            if payload.get("phase") == "cancelled":
                await self.settle_stopped(work_id)
            async with self.changed:
                self.phases[work_id] = str(payload.get("phase"))
                self.changed.notify_all()
        elif kind == "usage.updated":  # a receipt reached the ledger, also of work no prompt waits on (a Goal)
            self.agent.in_background(self.usage_changed())
        elif kind == "session.updated":
            await self.send(session_info(payload))
            if payload.get("model") != self.model:
                self.model = payload.get("model")
                options = await self.agent.model_options(self.session_id)
                if options is not None:
                    await self.send(options)

    async def usage_changed(self) -> None:
        """``usage_update`` with the ledger's totals as receipts arrive, while the work runs (one read at a
        time; receipts arriving during a read cause one more)."""
        if self.usage_reading:
            self.usage_again = True
            return
        self.usage_reading = True
        try:
            while True:
                self.usage_again = False
                await self.agent.tell_usage(self, settle_s=0.0)
                if not self.usage_again or self.closed:
                    return
        finally:
            self.usage_reading = False

    async def catch_up(self) -> None:
        while True:
            page = await self.agent.get(f"/sessions/{self.session_id}", {"after": self.transcript_seq, "limit": PAGE})
            for raw in page["transcript"]["items"]:
                await self.apply_item(TranscriptItem.model_validate(raw))
            if not page["transcript"].get("next_cursor"):
                return

    async def wait_ended(self, work_id: str, cancelled: asyncio.Event) -> str | None:
        """The stop reason once the work item ends (or ``cancelled`` soon after a Stop); None when this
        feed was closed first (the session loaded again: the caller waits on the new feed)."""
        async with self.changed:
            while self.phases.get(work_id) not in ENDED and not cancelled.is_set() and not self.closed:
                await self.changed.wait()
        if self.closed and not cancelled.is_set() and self.phases.get(work_id) not in ENDED:
            return None
        if cancelled.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CANCEL_WAIT_S), self.changed:
                    while self.phases.get(work_id) not in ENDED:
                        await self.changed.wait()
            return "cancelled"
        if self.phases[work_id] == "done":  # max_tokens when the last answer hit the model's output limit
            return turn_stop_reason(self.answer_stops.get(work_id))
        return ENDED[self.phases[work_id]]

    def ask(self, approval: dict[str, Any]) -> None:
        approval_id = str(approval["approval_id"])
        if approval_id not in self.asking:
            self.asking[approval_id] = asyncio.create_task(self._ask(approval), name=f"acp-ask-{approval_id}")

    async def _ask(self, approval: dict[str, Any]) -> None:
        call_id = str(approval.get("call_id"))
        tool, arguments = approval.get("tool"), approval.get("arguments") or {}
        options = [PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
                   PermissionOption(option_id="allow_always", name=f"Always allow {tool} in this session",
                                    kind="allow_always"),
                   PermissionOption(option_id="reject_once", name="Reject", kind="reject_once")]
        call = ToolCallUpdate(tool_call_id=call_id, title=tool_title(tool, arguments), kind=tool_kind(tool),
                              status="pending", raw_input=arguments)
        await self.ready.wait()
        try:
            answer = await self.agent.conn().request_permission(session_id=self.session_id, tool_call=call,
                                                                options=options)
        except (RequestError, ConnectionError) as exc:  # the client refused it or is gone: still pending
            log.info("permission request for %s not answered: %s", call_id, exc)
            return
        if not isinstance(answer.outcome, AllowedOutcome):
            return  # the client withdrew the question (a cancel): the approval stays pending in the server
        try:
            if answer.outcome.option_id == "allow_always":
                await self.agent.allow_always(self.session_id, str(tool))
            decision = "deny" if answer.outcome.option_id == "reject_once" else "approve"
            await self.agent.post(f"/approvals/{approval['approval_id']}", {"decision": decision})
        except GoalsError as exc:
            if exc.status != 409:  # 409: answered elsewhere (JupyterLab, REST) or withdrawn: that answer counts
                raise
            await self.send(withdrawn(call_id, "approval.refused", {"reason": exc.message}))

    async def close(self) -> None:
        async with self.changed:
            self.closed = True
            self.changed.notify_all()
        tasks = [t for t in [self.tail, *self.asking.values()] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


