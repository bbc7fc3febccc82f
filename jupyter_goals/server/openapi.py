"""The OpenAPI 3.1 document of ``/api/goals`` (DESIGN §10: ``GET /openapi.json``).

Request bodies come from the same pydantic models the handlers validate with, so the document cannot
drift from what the server accepts; answers are described as JSON objects (errors precisely:
``{"error", "message"}``). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

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

REF = "#/components/schemas/{model}"
ERROR = {"$ref": "#/components/schemas/Error"}
_ID = {"type": "string", "pattern": "^[A-Za-z0-9_\\-]+$"}


@dataclass(frozen=True)
class Query:
    name: str
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[BaseModel] | None = None
    query: tuple[Query, ...] = ()
    ok: int = 200
    errors: tuple[int, ...] = field(default=(400, 503))


_INT = {"type": "integer"}
_STR = {"type": "string"}
OPERATIONS: tuple[Operation, ...] = (
    Operation("get", "/health", "Status, databases, workers, last recovery, host name and boot id", errors=(503,)),
    Operation("get", "/models", "Configured models with credentials and prices", errors=(503,)),
    Operation("get", "/recovery", "What the last recovery pass did with each work item", errors=(503,)),
    Operation("get", "/openapi.json", "This document", errors=()),
    Operation("get", "/sessions", "Sessions, newest activity first, keyset-paged",
              query=(Query("limit", {"type": "integer", "minimum": 1, "maximum": 500}), Query("cursor", _STR),
                     Query("state", _STR, "phase, repeatable or comma separated"), Query("q", _STR))),
    Operation("post", "/sessions", "Create a session", body=CreateSession, ok=201),
    Operation("get", "/sessions/{session_id}", "Session snapshot with a transcript page",
              query=(Query("after", _INT), Query("before", _STR, "a seq or `latest`"),
                     Query("limit", {"type": "integer", "minimum": 1})), errors=(400, 404, 503)),
    Operation("patch", "/sessions/{session_id}", "Change the session's permission scope", body=UpdateSession,
              errors=(400, 404, 409, 503)),
    Operation("post", "/sessions/{session_id}/messages", "Send a message (202 once committed)", body=PostMessage,
              ok=202, errors=(400, 404, 409, 503)),
    Operation("post", "/sessions/{session_id}/actions", "Pause, resume, stop, retry, or cancel one running call",
              body=SessionAction, errors=(400, 404, 409, 503)),
    Operation("post", "/actions", "Quit and stop all tasks", body=GlobalAction),
    Operation("get", "/approvals", "Approvals, optionally by state", query=(Query("state", _STR),)),
    Operation("post", "/approvals/{approval_id}", "Approve or deny a pending call", body=ApprovalDecision,
              errors=(400, 404, 409, 503)),
    Operation("get", "/events", "Server-Sent Events after a seq, or `format=json` pages",
              query=(Query("after", _INT), Query("format", {"type": "string", "enum": ["json"]}),
                     Query("limit", {"type": "integer", "minimum": 1}))),
    Operation("get", "/usage", "Known cost and tokens, unknown usage, estimate, active time",
              query=(Query("session_id", _STR), Query("goal_id", _STR)), errors=(400, 404, 503)),
    Operation("get", "/goals", "Goals, optionally of one session", query=(Query("session_id", _STR),),
              errors=(400, 404, 503)),
    Operation("post", "/goals", "Set a Goal", body=CreateGoal, ok=201, errors=(400, 404, 409, 503)),
    Operation("get", "/goals/{goal_id}", "One Goal", errors=(404, 503)),
    Operation("patch", "/goals/{goal_id}", "Revise a Goal (optimistic revision)", body=UpdateGoal,
              errors=(400, 404, 409, 503)),
    Operation("post", "/goals/{goal_id}/actions", "Pause, resume, verify or end a Goal", body=GoalAction,
              errors=(400, 404, 409, 503)),
    Operation("get", "/sessions/{session_id}/history", "Terminal Goal records of a session", errors=(404, 503)),
    Operation("get", "/history/{record_id}", "One terminal Goal record (read-only snapshot)", errors=(404, 503)),
    Operation("post", "/jobs", "Start a background Job (202 once committed)", body=CreateJob, ok=202,
              errors=(400, 404, 503)),
    Operation("get", "/jobs/{job_id}", "One Job", errors=(404, 503)),
    Operation("put", "/notebook-session", "The session kept for a notebook path (get or create)",
              body=NotebookSession, errors=(400, 503)),
)


def _parameters(op: Operation) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    for part in op.path.split("/"):
        if part.startswith("{"):
            params.append({"name": part.strip("{}"), "in": "path", "required": True, "schema": _ID})
    for q in op.query:
        item: dict[str, Any] = {"name": q.name, "in": "query", "required": False, "schema": q.schema}
        if q.description:
            item["description"] = q.description
        params.append(item)
    return params


def document(base_url: str = "/api/goals") -> dict[str, Any]:
    """The whole OpenAPI 3.1 document; ``base_url`` becomes the one server entry."""
    schemas: dict[str, Any] = {
        "Error": {"type": "object", "required": ["error", "message"], "additionalProperties": True,
                  "properties": {"error": {"type": "string"}, "message": {"type": "string"}}},
    }
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        entry: dict[str, Any] = {
            "summary": op.summary,
            "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '').replace('.', '_')}",
            "parameters": _parameters(op),
            "responses": {str(op.ok): {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}},
        }
        if op.path == "/events":
            entry["responses"][str(op.ok)]["content"]["text/event-stream"] = {"schema": {}}  # one JSON event per data line
        too_large = (413,) if op.body is not None else ()  # server/bodies.py: body or a text over its limit
        for status in sorted({401, 403, *op.errors, *too_large}):
            entry["responses"][str(status)] = {"description": "Error", "content": {"application/json": {"schema": ERROR}}}
        if op.body is not None:
            schema = op.body.model_json_schema(ref_template=REF)
            for name, sub in schema.pop("$defs", {}).items():
                schemas[name] = sub
            schemas[op.body.__name__] = schema
            entry["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": REF.format(model=op.body.__name__)}}}}
        paths.setdefault(op.path, {})[op.method] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": "jupyter_goals", "version": "1",
                 "description": "Durable AI-agent chats, Goals and Jobs for Jupyter (DESIGN §10)."},
        "servers": [{"url": base_url}],
        "components": {
            "schemas": schemas,
            "securitySchemes": {"token": {"type": "apiKey", "in": "header", "name": "Authorization",
                                          "description": "`token <jupyter server token>`"}},
        },
        "security": [{"token": []}],
        "paths": paths,
    }
