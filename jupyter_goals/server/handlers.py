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
    PostMessage,
    SessionAction,
    UpdateGoal,
    UpdateSession,
)
from jupyter_goals.server.service import Degraded, GoalsService
from jupyter_goals.store.db import FencedError, NotFound, StorageUnavailable, VersionConflict

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
AUTH_RESOURCE = "jupyter_goals"


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def error_status(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, ApiError):
        return exc.status, exc.code
    if isinstance(exc, NotFound):
        return 404, "not_found"
    if isinstance(exc, InvalidGoalChange):
        return 400, "bad_request"
    if isinstance(exc, (VersionConflict, FencedError)):
        return 409, "conflict"
    if isinstance(exc, Degraded):
        return 503, exc.code.value
    if isinstance(exc, StorageUnavailable):
        return 503, "storage_unavailable"
    return 500, "internal_error"


def api(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Map domain errors to JSON answers; never a traceback page."""

    @functools.wraps(method)
    async def wrapper(self: GoalsHandler, *args: Any, **kwargs: Any) -> None:
        try:
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

    def body(self, model: type[M]) -> M:
        try:
            raw = json.loads(self.request.body or b"{}")
        except ValueError as exc:
            raise ApiError(400, "bad_json", f"request body is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ApiError(400, "bad_request", "request body must be a JSON object")
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            msg = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
            raise ApiError(400, "bad_request", msg) from exc

    def int_arg(self, name: str, default: int) -> int:
        raw = self.get_argument(name, None)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError as exc:
            raise ApiError(400, "bad_request", f"{name} must be an integer") from exc

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": "http_error", "message": message}))


class HealthHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.finish(await self.service.health())


class SessionsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.finish(await self.service.list_sessions())

    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        body = self.body(CreateSession)
        snapshot = await self.service.create_session(body)
        self.set_status(201)
        # contract (DESIGN §10): 201 {session_id, …}; the snapshot nests it under "session"
        self.finish({"session_id": snapshot["session"]["session_id"], **snapshot})


class SessionHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, session_id: str) -> None:
        after = self.int_arg("after", 0)
        limit = max(1, min(self.int_arg("limit", 500), 5000))
        self.finish(await self.service.snapshot(session_id, after, limit))

    @tornado.web.authenticated
    @authorized
    @api
    async def patch(self, session_id: str) -> None:
        body = self.body(UpdateSession)
        self.finish(await self.service.update_session(session_id, body))


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
        self.finish(await self.service.session_action(session_id, body.action, body.expected_control_version))


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
        state = self.get_argument("state", None)
        if state not in (None, "pending", "approved", "denied", "consumed", "invalidated"):
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
        session_id = self.get_argument("session_id", None)
        goal_id = self.get_argument("goal_id", None)
        if bool(session_id) == bool(goal_id):
            raise ApiError(400, "bad_request", "give exactly one of session_id or goal_id")
        self.finish(await self.service.usage_answer(session_id, goal_id))


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
        after = self.int_arg("after", -1)
        if after < 0:
            header = self.request.headers.get("Last-Event-ID")
            after = int(header) if header and header.isdigit() else 0
        limit = max(1, min(self.int_arg("limit", 500), 5000))
        if self.get_argument("format", "") == "json":
            self.finish(await self.service.events(after, limit))
            return
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
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
                await asyncio.sleep(0.25)
                idle += 0.25


class GoalsCollectionHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.finish(await self.service.list_goals(self.get_argument("session_id", None)))

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


def handlers(base: str) -> list[tuple[str, type[GoalsHandler]]]:
    p = base.rstrip("/") + "/api/goals"
    sid = r"(?P<session_id>[A-Za-z0-9_\-]+)"
    gid = r"(?P<goal_id>[A-Za-z0-9_\-]+)"
    return [
        (p + "/health", HealthHandler),
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
    ]
