"""The OpenAPI 3.1 document of ``/api/goals`` (DESIGN §10: ``GET /openapi.json``).

Request bodies come from the same pydantic models the handlers validate with (their schemas state the
rules between fields too), query arguments from the constants the handlers check them with, so a request
the document allows is one the server accepts, or answers with a documented 4xx (404 for an unknown id,
409 for a state that refuses it, 413 for a text over the configured limits); answers are described as
JSON objects (errors precisely: ``{"error", "message"}``), ``GET /events`` as the stream it is. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from pydantic import BaseModel

from jupyter_goals.models import (
    ApprovalDecision,
    CreateGoal,
    CreateJob,
    CreateSession,
    GlobalAction,
    GoalAction,
    ModelSpec,
    NotebookSession,
    Phase,
    PostMessage,
    SessionAction,
    UpdateGoal,
    UpdateSession,
)
from jupyter_goals.server.service import CURSOR_PATTERN

REF = "#/components/schemas/{model}"
ERROR = {"$ref": "#/components/schemas/Error"}
INT64_MAX = 2**63 - 1  # the databases' integers are 64-bit: a larger query integer is a 400
MAX_PAGE = 5000  # a transcript or event page holds at most this many items, whatever ``limit`` asks

# what the handlers check, stated once here so that the document and the check cannot differ
SESSION_STATES = tuple(sorted({*(p.value for p in Phase), "idle"}))
APPROVAL_STATES = ("pending", "approved", "denied", "consumed", "invalidated")
PROVIDERS = get_args(ModelSpec.model_fields["provider"].annotation)  # the prefixes of providers/catalog.spec_of
# ``store/shared.new_id``: prefix, then hex (20 digits in the first version, 24 since ids are time-ordered)
ID_PREFIX = {"session_id": "ses", "goal_id": "goal", "approval_id": "apr", "record_id": "hist", "job_id": "job"}


# ``PUT /notebook-session``'s ``path`` as ``service.notebook_api_path`` reads it, once ``str.strip`` has taken
# the whitespace around it (every character ``isspace`` calls so, spelled out: ``\s`` differs between regex
# engines): not absolute, no ``..`` segment, and a folder (ending in ``/``) or a named segment. An absolute
# path inside the server root, or a ``..`` that stays inside it, is read too; the document leaves them out.
_WS = r"[\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
_END = rf"{_WS}*$"
NOTEBOOK_PATH_PATTERN = (rf"^{_WS}*(?=[^{_WS[1:-1]}/])(?!(?:[\s\S]*/)?\.\.(?:/|{_END}))"
                         rf"(?:(?=[\s\S]*/{_END})|(?=(?:[\s\S]*/)?(?!\.(?:/|{_END}))[^/]))[\s\S]*$")


def id_schema(name: str) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^{ID_PREFIX[name]}_[0-9a-f]{{20,24}}$"}


@dataclass(frozen=True)
class Query:
    name: str
    schema: dict[str, Any]
    description: str = ""
    required: bool = False
    location: str = "query"


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[BaseModel] | None = None
    query: tuple[Query, ...] = ()
    ok: tuple[int, ...] = (200,)
    errors: tuple[int, ...] = field(default=(400, 503))
    description: str = ""


_STR = {"type": "string"}
_SEQ = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
_LIMIT = Query("limit", {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
               f"how many items at most (a page holds {MAX_PAGE} at most, whatever is asked)")
# OpenAPI 3.1 cannot state a rule between two query arguments (3.2's ``querystring`` can): the two below
# are in the descriptions, and the server answers the documented 400 (an object parameter exploded into
# its properties could state them, but tools read those poorly: a generated client, schemathesis)
_AFTER = Query("after", _SEQ, "page forward: the items after this seq (the default: from the start); not with `before`")
_BEFORE = Query("before", {"anyOf": [_SEQ, {"const": "latest"}]},
                "page backward: the items just before this seq (`latest`: the newest); not with `after`")
_ONE_OF_IDS = "give exactly one of `session_id` and `goal_id`"
_CURSOR = Query("cursor", {"type": "string", "pattern": CURSOR_PATTERN}, "the `next_cursor` of the previous page")
_SESSION_STATE = Query("state", {"type": "array", "items": {"enum": list(SESSION_STATES)}},
                       "work phases (or `idle`): repeat the argument, or give a comma-separated list")
_EVENTS_DESCRIPTION = (
    "Without `format`: a Server-Sent Events stream that never ends (`text/event-stream`; `id:` = seq,"
    " `event:` = kind, `data:` = the event as JSON, a `: keep-alive` comment every 15 s of silence); a client"
    " reads it incrementally and reconnects with `Last-Event-ID`. With `format=json`: one page of events.")
OPERATIONS: tuple[Operation, ...] = (
    Operation("get", "/health", "Status, databases, workers, last recovery, host name and boot id", errors=(503,)),
    Operation("get", "/models", "Configured models with credentials and prices", errors=(503,)),
    Operation("get", "/recovery", "What the last recovery pass did with each work item", errors=(503,)),
    Operation("get", "/openapi.json", "This document", errors=()),
    Operation("get", "/sessions", "Sessions, newest activity first, keyset-paged",
              query=(Query("limit", {"type": "integer", "minimum": 1, "maximum": 500}), _CURSOR, _SESSION_STATE,
                     Query("q", _STR, "text in the title"))),
    Operation("post", "/sessions", "Create a session", body=CreateSession, ok=(201,)),
    Operation("get", "/sessions/{session_id}", "Session snapshot with a transcript page",
              query=(_AFTER, _BEFORE, _LIMIT), errors=(400, 404, 503)),
    Operation("patch", "/sessions/{session_id}", "Change the session's permission scope", body=UpdateSession,
              errors=(400, 404, 409, 503)),
    Operation("post", "/sessions/{session_id}/messages", "Send a message (202 once committed)", body=PostMessage,
              ok=(202,), errors=(400, 404, 409, 503)),
    Operation("post", "/sessions/{session_id}/actions", "Pause, resume, stop, retry, or cancel one running call",
              body=SessionAction, errors=(400, 404, 409, 503),
              description="409 when the session has no work, its work ended, or `expected_control_version` is stale"),
    Operation("post", "/actions", "Quit and stop all tasks", body=GlobalAction),
    Operation("get", "/approvals", "Approvals, optionally by state",
              query=(Query("state", {"enum": list(APPROVAL_STATES)}),)),
    Operation("post", "/approvals/{approval_id}", "Approve or deny a pending call", body=ApprovalDecision,
              errors=(400, 404, 409, 503)),
    Operation("get", "/events", "Server-Sent Events after a seq, or `format=json` pages",
              query=(Query("after", _SEQ, "the events after this seq (without it: after `Last-Event-ID`, else all)"),
                     Query("format", {"enum": ["json"]}, "`json`: one page instead of the stream"), _LIMIT,
                     Query("Last-Event-ID", _STR, "the stream's resumption point (used when `after` is left out;"
                           " a value that is not a seq means from the start)", location="header")),
              description=_EVENTS_DESCRIPTION),
    Operation("get", "/usage", "Known cost and tokens, unknown usage, estimate, active time",
              query=(Query("session_id", id_schema("session_id"), _ONE_OF_IDS),
                     Query("goal_id", id_schema("goal_id"), _ONE_OF_IDS)), errors=(400, 404, 503)),
    Operation("get", "/goals", "Goals, optionally of one session",
              query=(Query("session_id", id_schema("session_id")),), errors=(400, 404, 503)),
    Operation("post", "/goals", "Set a Goal", body=CreateGoal, ok=(201,), errors=(400, 404, 409, 503)),
    Operation("get", "/goals/{goal_id}", "One Goal", errors=(404, 503)),
    Operation("patch", "/goals/{goal_id}", "Revise a Goal (optimistic revision)", body=UpdateGoal,
              errors=(400, 404, 409, 503)),
    Operation("post", "/goals/{goal_id}/actions", "Pause, resume, verify or end a Goal", body=GoalAction,
              errors=(400, 404, 409, 503)),
    Operation("get", "/sessions/{session_id}/history", "Terminal Goal records of a session", errors=(404, 503)),
    Operation("get", "/history/{record_id}", "One terminal Goal record (read-only snapshot)", errors=(404, 503)),
    Operation("post", "/jobs", "Start a background Job (202 once committed)", body=CreateJob, ok=(202,),
              errors=(400, 404, 409, 503)),
    Operation("get", "/jobs/{job_id}", "One Job", errors=(404, 503)),
    Operation("put", "/notebook-session", "The session kept for a notebook path (201 when created, else 200)",
              body=NotebookSession, ok=(200, 201), errors=(400, 404, 503)),
)

# one event of the stream (OpenAPI before 3.2 has no ``itemSchema``: ``schema`` describes each event, the
# reading of schemathesis and of OpenAPI 3.2's own SSE example); ``data`` holds the event as JSON
SSE_EVENT = {
    "type": "object", "required": ["id", "event", "data"],
    "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}, "event": {"type": "string"},
                   "data": {"type": "string", "contentMediaType": "application/json",
                            "contentSchema": {"$ref": "#/components/schemas/Event"}}},
}
EVENT = {"type": "object", "required": ["seq", "kind", "payload"],
         "properties": {"seq": {"type": "integer"}, "kind": {"type": "string"}, "ts": {"type": "number"},
                        "session_id": {"type": ["string", "null"]}, "work_id": {"type": ["string", "null"]},
                        "payload": {"type": "object"}}}
EVENT_PAGE = {"type": "object", "required": ["events", "last_seq"],
              "properties": {"events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}},
                             "last_seq": {"type": "integer"}}}


def _parameters(op: Operation) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    for part in op.path.split("/"):
        if part.startswith("{"):
            name = part.strip("{}")
            params.append({"name": name, "in": "path", "required": True, "schema": id_schema(name)})
    for q in op.query:
        item: dict[str, Any] = {"name": q.name, "in": q.location, "required": q.required, "schema": q.schema}
        if q.schema.get("type") == "array":
            item.update(style="form", explode=True)
        if q.description:
            item["description"] = q.description
        params.append(item)
    return params


def _ok(op: Operation, status: int) -> dict[str, Any]:
    if op.path == "/events":
        return {"description": "The event stream, or with `format=json` one page of events", "content": {
            "text/event-stream": {"schema": SSE_EVENT},
            "application/json": {"schema": {"$ref": "#/components/schemas/EventPage"}}}}
    return {"description": "Created" if status == 201 else "Accepted" if status == 202 else "OK",
            "content": {"application/json": {"schema": {"type": "object"}}}}


def model_schema(names: Sequence[str]) -> dict[str, Any]:
    """A session's ``model`` as ``ModelCatalog.resolve`` reads it: a listed name, a ``provider:model``
    string (``providers/catalog.spec_of``), or empty / null for the server's default."""
    return {"anyOf": [{"enum": [*names, ""]}, {"type": "string", "pattern": f"^({'|'.join(PROVIDERS)}):[\\s\\S]+$"},
                      {"type": "null"}],
            "default": None, "description": "a name of GET /models, or provider:model; empty or null: the default"}


def document(base_url: str = "/api/goals", model_names: Sequence[str] = ()) -> dict[str, Any]:
    """The whole OpenAPI 3.1 document; ``base_url`` becomes the one server entry, ``model_names`` (the
    server's listed models) the names a session's ``model`` may be besides a ``provider:model`` string."""
    schemas: dict[str, Any] = {
        "Error": {"type": "object", "required": ["error", "message"], "additionalProperties": True,
                  "properties": {"error": {"type": "string"}, "message": {"type": "string"}}},
        "Event": EVENT, "EventPage": EVENT_PAGE,
    }
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        entry: dict[str, Any] = {
            "summary": op.summary,
            "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '').replace('.', '_')}",
            "parameters": _parameters(op),
            "responses": {str(status): _ok(op, status) for status in op.ok},
        }
        if op.description:
            entry["description"] = op.description
        if op.path == "/events":  # no standard keyword says "never ends" before OpenAPI 3.2: the description does, and this
            entry["x-stream"] = {"media_type": "text/event-stream", "ends": False, "keep_alive_s": 15}
        too_large = (413,) if op.body is not None else ()  # server/bodies.py: body or a text over its limit
        for status in sorted({401, 403, *op.errors, *too_large}):
            entry["responses"][str(status)] = {"description": "Error", "content": {"application/json": {"schema": ERROR}}}
        if op.body is not None:
            schema = op.body.model_json_schema(ref_template=REF)
            for name, sub in schema.pop("$defs", {}).items():
                schemas[name] = sub
            schemas[op.body.__name__] = schema
            # an empty body is read as {} (server/bodies.py): required only when {} is not a valid body
            entry["requestBody"] = {"required": bool(schema.get("required")), "content": {"application/json": {
                "schema": {"$ref": REF.format(model=op.body.__name__)}}}}
        paths.setdefault(op.path, {})[op.method] = entry
    for body in (CreateSession, NotebookSession):
        schemas[body.__name__]["properties"]["model"] = model_schema(model_names)
    schemas["NotebookSession"]["properties"]["path"].update(
        pattern=NOTEBOOK_PATH_PATTERN, description="a notebook's path relative to the server root, or a folder's"
        " ending in `/` (`./` the root); an absolute path inside the root is read too")
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
