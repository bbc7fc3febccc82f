"""REST handlers of sessions: the list, a snapshot and its transcript pages, the permission scope,
messages, controls, and the session kept for a notebook path. Thin HTTP over ``GoalsService``: every
verb is ``@tornado.web.authenticated`` + ``@authorized`` (auth resource ``jupyter_goals``).
"""

from __future__ import annotations

import tornado.web
from jupyter_server.auth.decorator import authorized

from jupyter_goals.models import CreateSession, NotebookSession, PostMessage, SessionAction, UpdateSession
from jupyter_goals.server import openapi
from jupyter_goals.server.base_handler import INT64, ApiError, GoalsHandler, api
from jupyter_goals.server.params import LATEST, decode_cursor, notebook_api_path

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
        self.answer(await self.service.queries.list_sessions(limit, after, states or None, text))

    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        body = self.body(CreateSession)
        self.answer(await self.service.commands.create_session(body, self.root_dir, by=self.person), 201)


class SessionHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, session_id: str) -> None:
        """``?after=SEQ&limit=N`` pages forward; ``?before=SEQ|latest&limit=N`` pages back (newest first);
        ``&work_id=W``: that work item's items only (a notebook's chat card), 404 when W is not of this session."""
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
        work_id = self.id_arg("work_id")
        self.answer(await self.service.queries.snapshot(session_id, after, limit, before, work_id))

    @tornado.web.authenticated
    @authorized
    @api
    async def patch(self, session_id: str) -> None:
        body = self.body(UpdateSession)
        self.answer(await self.service.commands.update_session(session_id, body, by=self.person))


class MessagesHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self, session_id: str) -> None:
        body = self.body(PostMessage)
        answer, _created = await self.service.commands.post_message(session_id, body)
        self.answer(answer, 202)


class SessionActionsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self, session_id: str) -> None:
        body = self.body(SessionAction)
        self.answer(await self.service.commands.session_action(session_id, body, by=self.person))


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
        answer, created = await self.service.commands.notebook_session(body, path, root_dir, by=self.person)
        self.answer(answer, 201 if created else 200)
