"""What every REST handler shares (DESIGN §10): ``GoalsHandler`` (the service, the validated body, query
arguments as the OpenAPI document states them, answers through their models) and ``api``, which maps
errors to ``{"error", "message"}`` in one place: 400 bad input, 403 from a tool process, 404, 409
conflict, 413 too large, 503 storage.
"""

from __future__ import annotations

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

from jupyter_goals.goals.rules import InvalidGoalChange
from jupyter_goals.server import answers as a
from jupyter_goals.server import guard
from jupyter_goals.server.bodies import BodyRefused, parse_body
from jupyter_goals.server.catalog import UnknownModel
from jupyter_goals.server.service import GoalsService
from jupyter_goals.server.startup import Degraded
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
            self.answer(a.Error(error=code, message=str(exc) or code), status)

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

    @property
    def person(self) -> str:
        """Who is asking (the Jupyter user's name), for the records that say who did what: the name people
        read ("alice"; "Anonymous Io" for a shared token), else the username (an id for a shared token)."""
        user = self.current_user
        return str(getattr(user, "name", None) or getattr(user, "username", None) or "a user")

    def answer(self, answer: a.Answer | a.SessionActionAnswer | a.GlobalActionAnswer, status: int = 200) -> None:
        """Finish with ``answer`` serialized by its model (the schema the OpenAPI document states)."""
        self.set_status(status)
        self.finish(answer.dump())

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
        self.finish(json.dumps(a.Error(error="http_error", message=message).dump()))


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
