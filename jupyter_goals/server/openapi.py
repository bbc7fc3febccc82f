"""The OpenAPI 3.1 document of ``/api/goals`` (DESIGN §10: ``GET /openapi.json``).

Request bodies come from the same pydantic models the handlers validate with (their schemas state the
rules between fields too), query arguments from the constants the handlers check them with, so a request
the document allows is one the server accepts, or answers with a documented 4xx (404 for an unknown id,
409 for a state that refuses it, 413 for a text over the configured limits). Every answer's schema comes
from the response model its route builds it with (``server/answers.py``: a ``$ref`` to a component), errors
included (``Error``); ``GET /events`` is described as the stream it is, and each event kind's payload as a
component (``jupyter_goals/events.py``; ``Event`` is their union on ``kind``). Pure: no I/O.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from jupyter_goals.events import PAYLOADS, Event, EventKind
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
from jupyter_goals.server import answers as a
from jupyter_goals.server.attention import Attention
from jupyter_goals.server.health import Health
from jupyter_goals.server.params import CURSOR_PATTERN

REF = "#/components/schemas/{model}"


class OpenAPIDocument(a.Answer):
    """This OpenAPI 3.1 document."""

    openapi: str
    info: dict[str, Any]
    servers: list[dict[str, Any]]
    components: dict[str, Any]
    security: list[dict[str, Any]]
    paths: dict[str, Any]
ERROR = {"$ref": "#/components/schemas/Error"}
INT64_MAX = 2**63 - 1  # the databases' integers are 64-bit: a larger query integer is a 400
MAX_PAGE = 5000  # a transcript or event page holds at most this many items, whatever ``limit`` asks

# what the handlers check, stated once here so that the document and the check cannot differ
SESSION_STATES = tuple(sorted({*(p.value for p in Phase), "idle"}))
APPROVAL_STATES = ("pending", "approved", "denied", "consumed", "invalidated")
PROVIDERS = get_args(ModelSpec.model_fields["provider"].annotation)  # the prefixes of providers/catalog.spec_of
# ``store/shared.new_id``: prefix, then hex (20 digits in the first version, 24 since ids are time-ordered)
ID_PREFIX = {"session_id": "ses", "goal_id": "goal", "approval_id": "apr", "record_id": "hist", "job_id": "job",
             "work_id": "wrk"}


# ``PUT /notebook-session``'s ``path`` as ``params.notebook_api_path`` reads it, once ``str.strip`` has taken
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
    answer: type[BaseModel]  # the model of every success answer (server/answers.py)
    body: type[BaseModel] | None = None
    query: tuple[Query, ...] = ()
    ok: tuple[int, ...] = (200,)
    errors: tuple[int, ...] = field(default=(400, 503))
    description: str = ""


def _accepts_empty(body: type[BaseModel]) -> bool:
    """Whether ``{}`` is a valid body (no required field and no rule such as "at least one change")."""
    try:
        body.model_validate({})
    except ValidationError:
        return False
    return True


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
    Operation("get", "/health", "Status, databases, workers, last recovery, host name and boot id", Health,
              errors=(503,)),
    Operation("get", "/models", "Configured models with credentials and prices", a.ModelList, errors=(503,)),
    Operation("get", "/recovery", "What the last recovery pass did with each work item", a.RecoverySummary,
              query=(Query("session_id", id_schema("session_id"), "only this session's items"),),
              errors=(400, 404, 503)),
    Operation("get", "/openapi.json", "This document", OpenAPIDocument, errors=()),
    Operation("get", "/sessions", "Sessions, newest activity first, keyset-paged", a.SessionList,
              query=(Query("limit", {"type": "integer", "minimum": 1, "maximum": 500}), _CURSOR, _SESSION_STATE,
                     Query("q", _STR, "text in the title"))),
    Operation("post", "/sessions", "Create a session", a.SessionCreated, body=CreateSession, ok=(201,)),
    Operation("get", "/sessions/{session_id}", "Session snapshot with a transcript page", a.Snapshot,
              query=(_AFTER, _BEFORE, _LIMIT, Query("work_id", id_schema("work_id"), "only this work item's"
                     " transcript items (the page and its cursors over them alone); 404 when it is not of this"
                     " session")), errors=(400, 404, 503)),
    Operation("patch", "/sessions/{session_id}", "Rename a session, change its model or its permission scope",
              a.Snapshot, body=UpdateSession, errors=(400, 404, 409, 503),
              description="A field left out stays as it is; the answer is the session's snapshot. A new `model` applies"
                          " from the session's next turn. Each change writes its event (`session.updated`,"
                          " `session.permissions`); 409 when `expected_control_version` is stale."),
    Operation("post", "/sessions/{session_id}/messages", "Send a message (202 once committed)", a.MessageAccepted,
              body=PostMessage, ok=(202,), errors=(400, 404, 409, 503)),
    Operation("post", "/sessions/{session_id}/actions",
              "Pause, resume, stop, retry, cancel one running call, take over from a lost host, or settle an"
              " unknown outcome",
              a.SessionActionAnswer, body=SessionAction, errors=(400, 404, 409, 503),
              description="409 when the session has no work, its work ended, or `expected_control_version` is stale;"
                          " `takeover`: 409 when its host is reachable or its folder does not exist here;"
                          " `settle`: 404 for an unknown call, 409 when it is another session's, its outcome is not"
                          " unknown any more, or (`check`) no evidence was found"),
    Operation("post", "/actions", "Quit and stop all tasks, or take over a lost host's work", a.GlobalActionAnswer,
              body=GlobalAction, errors=(400, 409, 503),
              description="`takeover`: 409 when the host is reachable or a session's folder does not exist here"
                          " (nothing is moved)"),
    Operation("get", "/attention", "Everything across sessions that waits for a person, each with its action",
              Attention),
    Operation("get", "/approvals", "Approvals, optionally by state", a.ApprovalList,
              query=(Query("state", {"enum": list(APPROVAL_STATES)}),)),
    Operation("get", "/approvals/{approval_id}", "One approval, as `GET /approvals` lists it", a.Approval,
              errors=(404, 503)),
    Operation("post", "/approvals/{approval_id}", "Approve or deny a pending call", a.ApprovalDecided,
              body=ApprovalDecision, errors=(400, 404, 409, 503)),
    Operation("get", "/events", "Server-Sent Events after a seq, or `format=json` pages", a.EventPage,
              query=(Query("after", _SEQ, "the events after this seq (without it: after `Last-Event-ID`, else all)"),
                     Query("format", {"enum": ["json"]}, "`json`: one page instead of the stream"), _LIMIT,
                     Query("Last-Event-ID", _STR, "the stream's resumption point (used when `after` is left out;"
                           " a value that is not a seq means from the start)", location="header")),
              description=_EVENTS_DESCRIPTION),
    Operation("get", "/usage", "Known cost and tokens, unknown usage, estimate, active time", a.UsageSummary,
              query=(Query("session_id", id_schema("session_id"), _ONE_OF_IDS),
                     Query("goal_id", id_schema("goal_id"), _ONE_OF_IDS)), errors=(400, 404, 503)),
    Operation("get", "/goals", "Goals, optionally of one session", a.GoalList,
              query=(Query("session_id", id_schema("session_id")),), errors=(400, 404, 503)),
    Operation("post", "/goals", "Set a Goal", a.Goal, body=CreateGoal, ok=(201,), errors=(400, 404, 409, 503)),
    Operation("get", "/goals/{goal_id}", "One Goal", a.Goal, errors=(404, 503)),
    Operation("patch", "/goals/{goal_id}", "Revise a Goal (optimistic revision)", a.Goal, body=UpdateGoal,
              errors=(400, 404, 409, 503)),
    Operation("post", "/goals/{goal_id}/actions", "Pause, resume, verify or end a Goal", a.Goal, body=GoalAction,
              errors=(400, 404, 409, 503)),
    Operation("get", "/sessions/{session_id}/history", "Terminal Goal records of a session", a.HistoryList,
              errors=(404, 503)),
    Operation("get", "/history/{record_id}", "One terminal Goal record (read-only snapshot)", a.HistoryRecord,
              errors=(404, 503)),
    Operation("post", "/jobs", "Start a background Job (202 once committed)", a.JobAccepted, body=CreateJob, ok=(202,),
              errors=(400, 404, 409, 503)),
    Operation("get", "/jobs/{job_id}", "One Job", a.Job, errors=(404, 503)),
    Operation("put", "/notebook-session", "The session kept for a notebook path (201 when created, else 200)",
              a.NotebookBinding, body=NotebookSession, ok=(200, 201), errors=(400, 404, 503)),
)

# one event of the stream (OpenAPI before 3.2 has no ``itemSchema``: ``schema`` describes each event, the
# reading of schemathesis and of OpenAPI 3.2's own SSE example); ``data`` holds the event as JSON
SSE_EVENT = {
    "type": "object", "required": ["id", "event", "data"],
    "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}, "event": {"$ref": REF.format(model="EventKind")},
                   "data": {"type": "string", "contentMediaType": "application/json",
                            "contentSchema": {"$ref": REF.format(model="Event")}}},
}


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
    answer = {"$ref": REF.format(model=op.answer.__name__)}
    if op.path == "/events":
        return {"description": "The event stream, or with `format=json` one page of events", "content": {
            "text/event-stream": {"schema": SSE_EVENT}, "application/json": {"schema": answer}}}
    return {"description": "Created" if status == 201 else "Accepted" if status == 202 else "OK",
            "content": {"application/json": {"schema": answer}}}


def model_schema(names: Sequence[str]) -> dict[str, Any]:
    """A session's ``model`` as ``ModelCatalog.resolve`` reads it: a listed name, a ``provider:model``
    string (``providers/catalog.spec_of``), or empty / null for the server's default."""
    return {"anyOf": [{"enum": [*names, ""]}, {"type": "string", "pattern": f"^({'|'.join(PROVIDERS)}):[\\s\\S]+$"},
                      {"type": "null"}],
            "default": None, "description": "a name of GET /models, or provider:model; empty or null: the default"}


def _event_name(kind: EventKind) -> str:
    """``effect.cancel_requested`` → ``EffectCancelRequested``."""
    return "".join(part.capitalize() for part in re.split(r"[._]", kind.value))


def event_schemas(schemas: dict[str, Any]) -> None:
    """``EventKind``, one ``<Kind>Event`` per kind (the ``Event`` model with ``kind`` fixed and its
    payload model), and ``Event`` replaced by their union on ``kind``: the events a page or the stream
    carries. ``schemas`` already holds the payload models' components."""
    base = schemas["Event"]
    schemas["EventKind"] = {"title": "EventKind", "type": "string", "enum": [k.value for k in EventKind],
                            "description": "The kind of an event; `Event` states each kind's payload."}
    mapping: dict[str, str] = {}
    for kind, payload in PAYLOADS.items():
        name = _event_name(kind) + "Event"
        one = copy.deepcopy(base)
        one["title"] = name
        one["description"] = f"`{kind.value}`: {schemas[payload.__name__].get('description', '')}".strip()
        one["properties"]["kind"] = {"const": kind.value}
        one["properties"]["payload"] = {"$ref": REF.format(model=payload.__name__)}
        schemas[name] = one
        mapping[kind.value] = REF.format(model=name)
    schemas["Event"] = {"title": "Event", "description": base.get("description", ""),
                        "oneOf": [{"$ref": ref} for ref in mapping.values()],
                        "discriminator": {"propertyName": "kind", "mapping": mapping}}


def goal_snapshot_schema(goal: dict[str, Any]) -> dict[str, Any]:
    """A terminal record's ``snapshot``: the Goal as it ended, each key as the Goal answer has it now,
    none required (a record saved by an older version lacks the keys added since)."""
    snapshot = {k: v for k, v in copy.deepcopy(goal).items() if k not in ("required", "additionalProperties")}
    snapshot.update(title="GoalSnapshot", description="The Goal as it was when it ended (a Goal answer as saved).")
    return snapshot


def components(model_names: Sequence[str] = ()) -> dict[str, Any]:
    """Every schema the document names: request bodies (as the handlers validate them), answers (as the
    routes serialize them), each event kind's payload, and what they refer to."""
    schemas = copy.deepcopy(_model_schemas())
    for body in (CreateSession, NotebookSession):
        schemas[body.__name__]["properties"]["model"] = model_schema(model_names)
    schemas[UpdateSession.__name__]["properties"]["model"] = {
        **model_schema(model_names), "description": "a name of GET /models, or provider:model (from the session's"
        " next turn); empty: the server's default; null or left out: unchanged"}
    return schemas


@functools.cache
def _model_schemas() -> dict[str, Any]:
    """The schemas generated from the models (once: it takes about 0.1 s)."""
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = []
    for op in OPERATIONS:
        if op.body is not None:
            wanted.append((op.body, "validation"))
        wanted.append((op.answer, "serialization"))
    wanted += [(a.Error, "serialization"), (Event, "serialization")]
    wanted += [(payload, "serialization") for payload in PAYLOADS.values()]
    _, found = models_json_schema(list(dict.fromkeys(wanted)), ref_template=REF)
    schemas: dict[str, Any] = found["$defs"]
    event_schemas(schemas)
    schemas["GoalSnapshot"] = goal_snapshot_schema(schemas["Goal"])
    schemas["NotebookSession"]["properties"]["path"].update(
        pattern=NOTEBOOK_PATH_PATTERN, description="a notebook's path relative to the server root, or a folder's"
        " ending in `/` (`./` the root); an absolute path inside the root is read too")
    return dict(sorted(schemas.items()))


def document(base_url: str = "/api/goals", model_names: Sequence[str] = ()) -> dict[str, Any]:
    """The whole OpenAPI 3.1 document; ``base_url`` becomes the one server entry, ``model_names`` (the
    server's listed models) the names a session's ``model`` may be besides a ``provider:model`` string."""
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
            # an empty body is read as {} (server/bodies.py): required only when {} is not a valid body
            entry["requestBody"] = {"required": not _accepts_empty(op.body), "content": {
                "application/json": {"schema": {"$ref": REF.format(model=op.body.__name__)}}}}
        paths.setdefault(op.path, {})[op.method] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": "jupyter_goals", "version": "1",
                 "description": "Durable AI-agent chats, Goals and Jobs for Jupyter (DESIGN §10)."},
        "servers": [{"url": base_url}],
        "components": {
            "schemas": components(model_names),
            "securitySchemes": {"token": {"type": "apiKey", "in": "header", "name": "Authorization",
                                          "description": "`token <jupyter server token>`"}},
        },
        "security": [{"token": []}],
        "paths": paths,
    }


if __name__ == "__main__":  # the front end's snapshot: python -m jupyter_goals.server.openapi > labextension/openapi.json
    import json
    import sys

    sys.stdout.write(json.dumps(document(), indent=2) + "\n")
