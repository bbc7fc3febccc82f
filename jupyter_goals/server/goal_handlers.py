"""REST handlers of Goals (set, read, revise, act on), their terminal records, and Jobs. Thin HTTP over
``GoalsService``: every verb is ``@tornado.web.authenticated`` + ``@authorized``.
"""

from __future__ import annotations

import tornado.web
from jupyter_server.auth.decorator import authorized

from jupyter_goals.models import CreateGoal, CreateJob, GoalAction, UpdateGoal
from jupyter_goals.server.base_handler import GoalsHandler, api


class GoalsCollectionHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self) -> None:
        self.answer(await self.service.queries.list_goals(self.id_arg("session_id")))

    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        body = self.body(CreateGoal)
        self.answer(await self.service.commands.create_goal(body), 201)


class GoalHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, goal_id: str) -> None:
        self.answer(await self.service.queries.get_goal(goal_id))

    @tornado.web.authenticated
    @authorized
    @api
    async def patch(self, goal_id: str) -> None:
        body = self.body(UpdateGoal)
        self.answer(await self.service.commands.update_goal(goal_id, body))


class GoalActionsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self, goal_id: str) -> None:
        body = self.body(GoalAction)
        self.answer(await self.service.commands.goal_action(goal_id, body))


class SessionHistoryHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, session_id: str) -> None:
        self.answer(await self.service.queries.goal_history(session_id))


class HistoryRecordHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, record_id: str) -> None:
        self.answer(await self.service.queries.history_record(record_id))


class JobsHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def post(self) -> None:
        body = self.body(CreateJob)
        answer, _created = await self.service.commands.create_job(body)
        self.answer(answer, 202)


class JobHandler(GoalsHandler):
    @tornado.web.authenticated
    @authorized
    @api
    async def get(self, job_id: str) -> None:
        self.answer(await self.service.queries.get_job(job_id))
