"""REST handlers (DESIGN §10, contract): thin HTTP over GoalsService, and the route table (``handlers``).

Here: the server's own routes (health, models, recovery, stop all, the OpenAPI document), approvals,
usage and the event feed; sessions are in ``session_handlers.py``, Goals and Jobs in ``goal_handlers.py``,
what every handler shares (errors → JSON in one place) in ``base_handler.py``. Every verb is
``@tornado.web.authenticated`` + ``@authorized`` (auth resource ``jupyter_goals``) and answers through
its model (``server/answers.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import tornado.web
from jupyter_server.auth.decorator import authorized
from tornado.iostream import StreamClosedError

from jupyter_goals.models import ApprovalDecision, GlobalAction
from jupyter_goals.server import answers as a
from jupyter_goals.server import attention, openapi
from jupyter_goals.server import goal_handlers as goals
from jupyter_goals.server import session_handlers as sessions
from jupyter_goals.server.base_handler import INT64, ApiError, GoalsHandler, UnknownRouteHandler, api
from jupyter_goals.server.event_hub import EventHub, sse_frame

__all__ = ["handlers", "GoalsHandler", "UnknownRouteHandler"]


class HealthHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.answer(await self.service.health())


class ModelsHandler(GoalsHandler):
    """``GET /models`` → ``{models: [{name, provider, model, credentials_present, priced, default,
    description, …}], default_model}``."""

    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.answer(await self.service.queries.models())


class RecoveryHandler(GoalsHandler):
    """``GET /recovery`` → the last recovery pass after a server start: ``{recovered_at, host_name,
    boot_id, counts, items: [{work_id, session_id, session_title, kind, outcome, reason_code, reason,
    decided_at, actions, control_version, mode, unknown_outcomes}]}``; ``?session_id=``: that session's items only."""

    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.answer(await self.service.queries.recovery_summary(self.id_arg("session_id")))


class GlobalActionsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        body = self.body(GlobalAction)
        if body.action == "takeover":
            self.answer(a.GlobalActionAnswer(await self.service.commands.take_over(body.host or "", self.person)))
            return
        self.answer(a.GlobalActionAnswer(await self.service.commands.stop_all()))


class OpenAPIHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        base = self.request.path.rsplit("/", 1)[0]
        self.answer(openapi.OpenAPIDocument.model_validate(openapi.document(base, list(self.service.catalog.specs))))


class ApprovalsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        state = self.query_arg("state")
        if state is not None and state not in openapi.APPROVAL_STATES:
            raise ApiError(400, "bad_request", f"unknown approval state {state!r}")
        self.answer(await self.service.queries.approvals(state))


class ApprovalHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, approval_id: str) -> None:
        """``GET /approvals/{id}``: one approval as ``GET /approvals`` lists it (a notebook's approval card)."""
        self.answer(await self.service.queries.approval(approval_id))

    @tornado.web.authenticated
    @authorized
    @api
    async def post(self, approval_id: str) -> None:
        body = self.body(ApprovalDecision)
        self.answer(await self.service.commands.decide_approval(approval_id, body.decision, body.always,
                                                                by=self.person))


class UsageHandler(GoalsHandler):
    """``GET /usage?session_id=|goal_id=``: known cost and tokens, unknowns, estimate, active time."""

    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        session_id = self.id_arg("session_id")
        goal_id = self.id_arg("goal_id")
        if (session_id is None) == (goal_id is None):
            raise ApiError(400, "bad_request", "give exactly one of session_id or goal_id")
        self.answer(await self.service.queries.usage_answer(session_id, goal_id))


KEEP_ALIVE_S = 15.0  # an idle event stream writes a comment this often (proxies keep it open)


class EventsHandler(GoalsHandler):
    """``GET /events?after=SEQ``: Server-Sent Events (``id:`` = seq, honours Last-Event-ID), or
    ``&format=json&limit=N`` → ``{events, last_seq}``. A stream follows the service's ``EventHub``: no
    poll interval, one read of the log per commit for every open stream (``server/event_hub.py``)."""

    client_gone = False
    _nudge: asyncio.Event | None = None

    def on_connection_close(self) -> None:
        # without this a closed stream would wait for the next event or keep-alive to notice
        self.client_gone = True
        if self._nudge is not None:
            self._nudge.set()
        super().on_connection_close()

    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        after = self.int_arg("after", -1, minimum=0)
        if after < 0:
            header = self.request.headers.get("Last-Event-ID")
            after = int(header) if header and header.isascii() and header.isdigit() and int(header) < INT64 else 0
        limit = min(self.int_arg("limit", 500, minimum=1), openapi.MAX_PAGE)
        form = self.query_arg("format")
        if form not in (None, "json"):
            raise ApiError(400, "bad_request", "format must be json (or left out for the event stream)")
        if form == "json":
            self.answer(await self.service.queries.events(after, limit))
            return
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        self.service.event_streams += 1
        try:
            await self._stream(after, limit)
        finally:
            self.service.event_streams -= 1

    async def _stream(self, after: int, limit: int) -> None:
        try:
            # the status and headers at once, before any event: a client (or a fuzzer) learns now that
            # this answer is a stream, instead of waiting for an event or the first keep-alive
            await self.flush()
        except StreamClosedError:
            return
        hub = self.service.event_hub
        self._nudge = nudge = hub.join()
        try:
            await self._follow(hub, nudge, after, limit)
        finally:
            hub.leave(nudge)

    async def _follow(self, hub: EventHub, nudge: asyncio.Event, after: int, limit: int) -> None:
        idle_since = time.monotonic()
        while not self.client_gone and not hub.closed:
            nudge.clear()  # before looking: a nudge from now on is seen by the wait below
            frames = hub.frames_after(after, limit)
            if frames is None:  # behind the hub's window: a page of its own from the log
                batch = await self.service.queries.events(after, limit)
                frames = [(ev.seq, sse_frame(ev)) for ev in batch.events]
            try:
                if frames:
                    self.write("".join(text for _, text in frames))
                    after = frames[-1][0]
                    idle_since = time.monotonic()
                    await self.flush()
                elif time.monotonic() - idle_since >= KEEP_ALIVE_S:
                    self.write(": keep-alive\n\n")
                    idle_since = time.monotonic()
                    await self.flush()
            except StreamClosedError:
                return
            if self.client_gone or self.request.connection is None or getattr(self.request.connection, "stream", None) is None:
                return
            if frames:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, KEEP_ALIVE_S - (time.monotonic() - idle_since))):
                    await nudge.wait()


def handlers(base: str) -> list[tuple[str, type[GoalsHandler]]]:
    p = base.rstrip("/") + "/api/goals"
    sid = r"(?P<session_id>[A-Za-z0-9_\-]+)"
    gid = r"(?P<goal_id>[A-Za-z0-9_\-]+)"
    return [
        (p + "/health", HealthHandler),
        (p + "/models", ModelsHandler),
        (p + "/recovery", RecoveryHandler),
        (p + "/sessions", sessions.SessionsHandler),
        (p + f"/sessions/{sid}", sessions.SessionHandler),
        (p + f"/sessions/{sid}/messages", sessions.MessagesHandler),
        (p + f"/sessions/{sid}/actions", sessions.SessionActionsHandler),
        (p + "/actions", GlobalActionsHandler),
        (p + "/approvals", ApprovalsHandler),
        (p + "/attention", attention.AttentionHandler),
        (p + r"/approvals/(?P<approval_id>[A-Za-z0-9_\-]+)", ApprovalHandler),
        (p + "/events", EventsHandler),
        (p + "/usage", UsageHandler),
        (p + "/goals", goals.GoalsCollectionHandler),
        (p + f"/goals/{gid}", goals.GoalHandler),
        (p + f"/goals/{gid}/actions", goals.GoalActionsHandler),
        (p + f"/sessions/{sid}/history", goals.SessionHistoryHandler),
        (p + r"/history/(?P<record_id>[A-Za-z0-9_\-]+)", goals.HistoryRecordHandler),
        (p + "/jobs", goals.JobsHandler),
        (p + r"/jobs/(?P<job_id>[A-Za-z0-9_\-]+)", goals.JobHandler),
        (p + "/notebook-session", sessions.NotebookSessionHandler),
        (p + "/openapi.json", OpenAPIHandler),
        (p + r"(?:/.*)?", UnknownRouteHandler),  # last: only what no route above matched
    ]
