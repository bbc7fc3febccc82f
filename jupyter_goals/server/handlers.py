"""REST handlers (DESIGN §10, contract): thin HTTP over GoalsService.

Every verb is ``@tornado.web.authenticated`` + ``@authorized`` (auth resource ``jupyter_goals``).
Errors map to ``{"error", "message"}`` in one place: 400 bad input, 404, 409 conflict, 503 storage.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from pydantic import BaseModel, ValidationError
from tornado.iostream import StreamClosedError

from jupyter_goals.goals.rules import InvalidGoalChange
from jupyter_goals.models import (
    ApprovalDecision,
    CreateGoal,
    CreateJob,
    CreateSession,
    GlobalAction,
    GoalAction,
    NotebookSession,
    PostMessage,
    SessionAction,
    UpdateGoal,
    UpdateSession,
)
from jupyter_goals.server import guard, openapi
from jupyter_goals.server.bodies import BodyRefused, parse_body
from jupyter_goals.server.catalog import UnknownModel
from jupyter_goals.server.service import LATEST, Degraded, GoalsService, decode_cursor, notebook_api_path
from jupyter_goals.store.db import FencedError, NotFound, StorageUnavailable, VersionConflict

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
AUTH_RESOURCE = "jupyter_goals"
INT64 = 2**63


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def error_status(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, (ApiError, BodyRefused)):
        return exc.status, exc.code
    if isinstance(exc, NotFound):
        return 404, "not_found"
    if isinstance(exc, InvalidGoalChange):
        return 400, "bad_request"
    if isinstance(exc, UnknownModel):
        return 400, "unknown_model"
    if isinstance(exc, (VersionConflict, FencedError)):
        return 409, "conflict"
    if isinstance(exc, Degraded):
        return 503, exc.code.value
    if isinstance(exc, StorageUnavailable):  # storage_full, storage_locked or storage_unavailable
        return 503, exc.code
    return 500, "internal_error"


def api(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Map domain errors to JSON answers; never a traceback page. A state change from inside one of
    our tool processes is refused (403 ``forbidden_from_tool``): an agent cannot approve its own calls,
    widen its permissions or start work as the person, even holding the server's token."""

    @functools.wraps(method)
    async def wrapper(self: GoalsHandler, *args: Any, **kwargs: Any) -> None:
        try:
            if self.request.method not in ("GET", "HEAD", "OPTIONS") and await self.from_tool_process():
                raise ApiError(403, "forbidden_from_tool",
                               "a tool process of an agent cannot change approvals, permissions or work; "
                               "a person must do this from JupyterLab, a notebook or the REST API")
            await method(self, *args, **kwargs)
        except tornado.web.HTTPError:
            raise
        except Exception as exc:
            status, code = error_status(exc)
            if status == 500:
                log.exception("jupyter_goals handler error")
            self.set_status(status)
            self.finish({"error": code, "message": str(exc) or code})

    return wrapper


class GoalsHandler(ExtensionHandlerMixin, APIHandler):  # type: ignore[misc]
    auth_resource = AUTH_RESOURCE

    @property
    def service(self) -> GoalsService:
        return self.settings["jupyter_goals_service"]  # type: ignore[no-any-return]

    @property
    def root_dir(self) -> str:
        """The server's root directory (what the file browser shows): an empty session folder means it."""
        return str(self.settings.get("server_root_dir") or ".")

    def body(self, model: type[M]) -> M:
        """The validated body, or a 4xx before anything is written (``server/bodies.py``: size, UTF-8,
        JSON, depth, surrogates, text length; then the model: types, unknown fields)."""
        config = self.service.config
        raw = parse_body(self.request.body or b"", max_bytes=config.max_request_bytes,
                         max_chars=config.max_message_chars)
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            msg = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
            raise ApiError(400, "bad_request", msg) from exc

    async def from_tool_process(self) -> bool:
        return await guard.handler_from_tool(self)

    def query_arg(self, name: str) -> str | None:
        """The one value of a query argument (``None`` when absent). Given twice, a 400: the document
        states one value, and taking the last one would accept a request it does not describe."""
        values = self.get_arguments(name)
        if len(values) > 1:
            raise ApiError(400, "bad_request", f"{name} is given {len(values)} times; give it once")
        return values[0] if values else None

    def int_arg(self, name: str, default: int, minimum: int = -INT64) -> int:
        """A query integer as the OpenAPI document states it (``minimum`` to 2**63 - 1), else 400."""
        raw = self.query_arg(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError as exc:
            raise ApiError(400, "bad_request", f"{name} must be an integer") from exc
        if not minimum <= value < INT64:  # the databases' integers are 64-bit
            raise ApiError(400, "bad_request", f"{name} must be an integer between {minimum} and {INT64 - 1}")
        return value

    def id_arg(self, name: str) -> str | None:
        """An id in the query: absent is ``None``; given, it names something (empty is a 400, not "all")."""
        value = self.query_arg(name)
        if value == "":
            raise ApiError(400, "bad_request", f"{name} must not be empty")
        return value

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        if status_code == 405:  # RFC 9110: a 405 names the methods the route has
            base = tornado.web.RequestHandler
            self.set_header("Allow", ", ".join(m for m in base.SUPPORTED_METHODS
                                               if getattr(type(self), m.lower()) is not getattr(base, m.lower())))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": "http_error", "message": message}))


class HealthHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.finish(await self.service.health())


SESSION_STATES = frozenset(openapi.SESSION_STATES)  # work phases and "idle", as the document lists them


class SessionsHandler(GoalsHandler):
    """``GET /sessions?limit=N&cursor=C&state=P&q=TEXT`` → ``{sessions, next_cursor}``: keyset pages,
    newest activity first; ``state`` repeatable or a comma list of phases (or ``idle``)."""

    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        limit = self.int_arg("limit", 100)
        if not 1 <= limit <= 500:
            raise ApiError(400, "bad_request", "limit must be between 1 and 500")
        cursor = self.query_arg("cursor")
        try:
            after = decode_cursor(cursor) if cursor is not None else None  # an empty one too is no cursor of ours
        except ValueError as exc:
            raise ApiError(400, "bad_request", str(exc)) from exc
        # an empty one (`state=`, `a,,b`) is unknown too: the document lists the phases, not ""
        states = sorted({s.strip() for raw in self.get_arguments("state") for s in raw.split(",")})
        unknown = [s for s in states if s not in SESSION_STATES]
        if unknown:
            raise ApiError(400, "bad_request", f"unknown state {unknown[0]!r}; use one of {', '.join(sorted(SESSION_STATES))}")
        text = self.query_arg("q") or None
        self.finish(await self.service.list_sessions(limit, after, states or None, text))

    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        body = self.body(CreateSession)
        snapshot = await self.service.create_session(body, self.root_dir)
        self.set_status(201)
        # contract (DESIGN §10): 201 {session_id, …}; the snapshot nests it under "session"
        self.finish({"session_id": snapshot["session"]["session_id"], **snapshot})


class SessionHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, session_id: str) -> None:
        """``?after=SEQ&limit=N`` pages forward; ``?before=SEQ|latest&limit=N`` pages back (newest first)."""
        after = self.int_arg("after", 0, minimum=0)
        limit = min(self.int_arg("limit", 500, minimum=1), openapi.MAX_PAGE)
        raw = self.query_arg("before")
        before: int | None = None
        if raw is not None:
            if self.query_arg("after") is not None:
                raise ApiError(400, "bad_request", "give after or before, not both")
            if raw == "latest":
                before = LATEST
            elif raw.isascii() and raw.isdigit() and int(raw) < INT64:
                before = int(raw)
            else:
                raise ApiError(400, "bad_request", "before must be a seq or 'latest'")
        self.finish(await self.service.snapshot(session_id, after, limit, before))

    @tornado.web.authenticated
    @authorized
    @api
    async def patch(self, session_id: str) -> None:
        body = self.body(UpdateSession)
        self.finish(await self.service.update_session(session_id, body))


class ModelsHandler(GoalsHandler):
    """``GET /models`` → ``{models: [{name, provider, model, credentials_present, priced, default,
    description, …}], default_model}``."""

    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.finish(await self.service.models())


class RecoveryHandler(GoalsHandler):
    """``GET /recovery`` → the last recovery pass after a server start: ``{recovered_at, host_name,
    boot_id, counts, items: [{work_id, session_id, session_title, kind, outcome, reason_code, reason,
    decided_at, actions}]}``."""

    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.finish(await self.service.recovery_summary())


class MessagesHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self, session_id: str) -> None:
        body = self.body(PostMessage)
        answer, _created = await self.service.post_message(session_id, body)
        self.set_status(202)
        self.finish(answer)


class SessionActionsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self, session_id: str) -> None:
        body = self.body(SessionAction)
        self.finish(await self.service.session_action(session_id, body.action, body.expected_control_version,
                                                      body.effect_id))


class GlobalActionsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        self.body(GlobalAction)
        self.finish(await self.service.stop_all())


class ApprovalsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        state = self.query_arg("state")
        if state is not None and state not in openapi.APPROVAL_STATES:
            raise ApiError(400, "bad_request", f"unknown approval state {state!r}")
        self.finish(await self.service.approvals(state))


class ApprovalHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self, approval_id: str) -> None:
        body = self.body(ApprovalDecision)
        self.finish(await self.service.decide_approval(approval_id, body.decision))


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
        self.finish(await self.service.usage_answer(session_id, goal_id))


SSE_POLL_S = 0.1  # how often an idle event stream looks for new events


class EventsHandler(GoalsHandler):
    """``GET /events?after=SEQ``: Server-Sent Events (``id:`` = seq, honours Last-Event-ID), or
    ``&format=json&limit=N`` → ``{events, last_seq}``."""

    client_gone = False

    def on_connection_close(self) -> None:
        # without this a closed stream keeps polling the database until the next keep-alive write
        self.client_gone = True
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
            self.finish(await self.service.events(after, limit))
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
        idle = 0.0
        while not self.client_gone:
            batch = await self.service.events(after, limit)
            try:
                for ev in batch["events"]:
                    after = ev["seq"]
                    data = json.dumps(ev)
                    self.write(f"id: {ev['seq']}\nevent: {ev['kind']}\ndata: {data}\n\n")
                if batch["events"] or idle >= 15:
                    if not batch["events"]:
                        self.write(": keep-alive\n\n")
                    idle = 0.0
                    await self.flush()
            except StreamClosedError:
                return
            if self.client_gone or self.request.connection is None or getattr(self.request.connection, "stream", None) is None:
                return
            if not batch["events"]:
                # one indexed read on the event tail's own reader connection: cheap enough to keep a
                # committed change on screen within DESIGN §12's 200 ms
                await asyncio.sleep(SSE_POLL_S)
                idle += SSE_POLL_S


class GoalsCollectionHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.finish(await self.service.list_goals(self.id_arg("session_id")))

    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        body = self.body(CreateGoal)
        answer = await self.service.create_goal(body)
        self.set_status(201)
        self.finish(answer)


class GoalHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, goal_id: str) -> None:
        self.finish(await self.service.get_goal(goal_id))

    @tornado.web.authenticated
    @authorized
    @api
    async def patch(self, goal_id: str) -> None:
        body = self.body(UpdateGoal)
        self.finish(await self.service.update_goal(goal_id, body))


class GoalActionsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self, goal_id: str) -> None:
        body = self.body(GoalAction)
        self.finish(await self.service.goal_action(goal_id, body))


class SessionHistoryHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, session_id: str) -> None:
        self.finish(await self.service.goal_history(session_id))


class HistoryRecordHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, record_id: str) -> None:
        self.finish(await self.service.history_record(record_id))


class JobsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        body = self.body(CreateJob)
        answer, _created = await self.service.create_job(body)
        self.set_status(202)
        self.finish(answer)


class JobHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, job_id: str) -> None:
        self.finish(await self.service.get_job(job_id))


class NotebookSessionHandler(GoalsHandler):
    """``PUT /notebook-session {path, session_id?, title?, model?, permissions?}`` → 201 (created) or
    200 ``{session_id, path, created_at, updated_at}``: the durable session of one notebook path."""

    @tornado.web.authenticated
    @authorized
    @api
    async def put(self) -> None:
        body = self.body(NotebookSession)
        root_dir = self.root_dir
        try:
            path = notebook_api_path(body.path, root_dir)
        except ValueError as exc:
            raise ApiError(400, "bad_request", str(exc)) from exc
        answer, created = await self.service.notebook_session(body, path, root_dir)
        self.set_status(201 if created else 200)
        self.finish(answer)


class UnknownRouteHandler(GoalsHandler):
    """Any other path under ``/api/goals`` (an id with characters no id has, a trailing slash): a JSON
    404 as the document says, not Jupyter's HTML page."""

    def _missing(self) -> None:
        raise ApiError(404, "not_found", f"no route {self.request.method} {self.request.path}")

    # one decorated function per verb: `authorized` remembers the action (read or write) of its first call
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self._missing()

    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        self._missing()

    @tornado.web.authenticated
    @authorized
    @api
    async def put(self) -> None:
        self._missing()

    @tornado.web.authenticated
    @authorized
    @api
    async def patch(self) -> None:
        self._missing()

    @tornado.web.authenticated
    @authorized
    @api
    async def delete(self) -> None:
        self._missing()


class OpenAPIHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        base = self.request.path.rsplit("/", 1)[0]
        self.finish(openapi.document(base, list(self.service.catalog.specs)))


def handlers(base: str) -> list[tuple[str, type[GoalsHandler]]]:
    p = base.rstrip("/") + "/api/goals"
    sid = r"(?P<session_id>[A-Za-z0-9_\-]+)"
    gid = r"(?P<goal_id>[A-Za-z0-9_\-]+)"
    return [
        (p + "/health", HealthHandler),
        (p + "/models", ModelsHandler),
        (p + "/recovery", RecoveryHandler),
        (p + "/sessions", SessionsHandler),
        (p + f"/sessions/{sid}", SessionHandler),
        (p + f"/sessions/{sid}/messages", MessagesHandler),
        (p + f"/sessions/{sid}/actions", SessionActionsHandler),
        (p + "/actions", GlobalActionsHandler),
        (p + "/approvals", ApprovalsHandler),
        (p + r"/approvals/(?P<approval_id>[A-Za-z0-9_\-]+)", ApprovalHandler),
        (p + "/events", EventsHandler),
        (p + "/usage", UsageHandler),
        (p + "/goals", GoalsCollectionHandler),
        (p + f"/goals/{gid}", GoalHandler),
        (p + f"/goals/{gid}/actions", GoalActionsHandler),
        (p + f"/sessions/{sid}/history", SessionHistoryHandler),
        (p + r"/history/(?P<record_id>[A-Za-z0-9_\-]+)", HistoryRecordHandler),
        (p + "/jobs", JobsHandler),
        (p + r"/jobs/(?P<job_id>[A-Za-z0-9_\-]+)", JobHandler),
        (p + "/notebook-session", NotebookSessionHandler),
        (p + "/openapi.json", OpenAPIHandler),
        (p + r"(?:/.*)?", UnknownRouteHandler),  # last: only what no route above matched
    ]
