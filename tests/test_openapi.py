"""``GET /api/goals/openapi.json`` (DESIGN §10) describes every route, generated from the pydantic
models the handlers validate with; schemathesis fuzzes every route of a real server with it.

Issue 27: a request the document allows is one the server accepts (or answers with a documented 4xx),
one it refuses is a 400, and ``GET /events`` is described as the never-ending stream it is.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from jupyter_goals.server.handlers import UnknownRouteHandler, handlers
from jupyter_goals.server.openapi import document
from tests import restkit
from tests.restkit import Api, assert_error
from tests.servers import server_env

# the in-process REST fixtures (tests/restkit.py)
jp_asyncio_loop = restkit.jp_asyncio_loop
goals_state_dir = restkit.goals_state_dir
jp_server_config = restkit.jp_server_config
api = restkit.api
raw_url = restkit.raw_url


def _route_paths() -> dict[str, type]:
    out = {}
    for pattern, cls in handlers(""):
        if cls is UnknownRouteHandler:  # the JSON 404 of every path no route matches
            continue
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern).removeprefix("/api/goals")
        out[path] = cls
    return out


def test_the_document_lists_every_route_with_the_methods_its_handler_implements() -> None:
    doc = document()
    routes = _route_paths()
    assert set(doc["paths"]) == set(routes)
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            assert method in routes[path].__dict__, f"{method.upper()} {path} is documented but not handled"
            assert op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
        handled = {m for m in ("get", "post", "put", "patch", "delete") if m in routes[path].__dict__}
        assert handled == set(methods), f"{path}: handled {handled}, documented {set(methods)}"
    body = doc["paths"]["/sessions/{session_id}/messages"]["post"]["requestBody"]
    schema = doc["components"]["schemas"]["PostMessage"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/PostMessage")
    assert schema["additionalProperties"] is False and "client_request_id" in schema["required"]


def _allows(doc: dict[str, Any], schema: dict[str, Any], value: Any) -> bool:
    return bool(Draft202012Validator({**schema, "components": doc["components"]}).is_valid(value))


def _query_allowed(doc: dict[str, Any], method: str, path: str, params: dict[str, Any]) -> bool:
    """Whether the document's query parameters allow ``params`` (strings, a list for a repeated one),
    read as a server reads a query: an integer parameter's text as the integer."""
    declared = {p["name"]: p for p in doc["paths"][path][method]["parameters"] if p["in"] == "query"}
    for name, p in declared.items():
        raw = params.get(name)
        if raw is None:
            if p["required"]:
                return False
            continue
        values = raw if isinstance(raw, list) else [raw]
        if p["schema"].get("type") != "array" and len(values) != 1:
            return False
        read = [int(v) if re.fullmatch(r"-?[0-9]+", v) else v for v in values]
        if not any(_allows(doc, p["schema"], v) for v in ((values, read) if p["schema"].get("type") == "array"
                                                         else (values[0], read[0]))):
            return False
    return True


async def test_a_query_the_document_allows_is_answered_and_one_it_refuses_is_a_400(api: Api) -> None:
    """Issue 27 item 2: the document was looser than the validation (`GET /approvals?state=x`,
    `GET /sessions/{id}?before=soon` were allowed and refused) and the server took what it did not
    describe (a negative `limit`, a repeated argument, an empty `state` or `session_id`)."""
    doc = await api.ok("GET", "openapi.json")
    sid = await api.new_session(title="first")
    await api.new_session(title="second")
    cursor = (await api.ok("GET", "sessions", params={"limit": 1}))["next_cursor"]
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("/approvals", {"state": "pending"}, 200), ("/approvals", {"state": "whatever"}, 400),
        ("/sessions/{session_id}", {"before": "latest", "limit": "3"}, 200),
        ("/sessions/{session_id}", {"after": "0", "limit": "100000"}, 200),  # a page holds 5000 at most
        ("/sessions/{session_id}", {"before": "soon"}, 400), ("/sessions/{session_id}", {"limit": "-5"}, 400),
        ("/sessions/{session_id}", {"limit": "0"}, 400), ("/sessions/{session_id}", {"after": "-1"}, 400),
        ("/sessions/{session_id}", {"limit": ["1", "2"]}, 400),
        ("/sessions", {"state": ["idle", "queued"]}, 200), ("/sessions", {"state": ""}, 400),
        ("/sessions", {"cursor": cursor, "limit": "1"}, 200), ("/sessions", {"cursor": "not-a-cursor"}, 400),
        ("/sessions", {"cursor": ""}, 400),
        ("/events", {"format": "json", "limit": "1"}, 200), ("/events", {"format": "json", "limit": "0"}, 400),
        ("/events", {"format": "xml"}, 400),  # was the stream
        ("/usage", {"session_id": sid}, 200), ("/usage", {"session_id": ""}, 400),
        ("/goals", {"session_id": sid}, 200), ("/goals", {"session_id": ""}, 400),
    ]
    for path, params, status in cases:
        pairs = [(k, v) for k, raw in params.items() for v in (raw if isinstance(raw, list) else [raw])]
        r = await api.fetch("api", "goals", *path.replace("{session_id}", sid).strip("/").split("/"),
                            params=pairs, raise_error=False, request_timeout=10)
        answer = json.loads(r.body)
        assert r.code == status, (path, params, r.code, answer)
        if status == 400:
            assert_error(answer, "bad_request")
        allowed = _query_allowed(doc, "get", path, params)
        assert allowed == (status != 400), (path, params, "the document", "allows" if allowed else "refuses")


async def test_a_body_the_document_allows_is_answered_and_one_it_refuses_is_a_400(api: Api) -> None:
    """The rules between fields (`cancel_tool` needs a non-empty `effect_id`, a `command` requirement a
    command), a session's `model` (a listed name or provider:model) and a notebook `path` are in the
    served document; a session without work refuses an action with 409 (it was 404: the session exists)."""
    doc = await api.ok("GET", "openapi.json")
    busy, idle, goal_a, goal_b = [await api.new_session(title=t) for t in ("busy", "idle", "goal a", "goal b")]
    await api.send(busy, "work on it", "r1")
    cases: list[tuple[str, str, str, dict[str, Any], int]] = [
        ("post", "/sessions/{session_id}/actions", busy, {"action": "cancel_tool", "effect_id": ""}, 400),
        ("post", "/sessions/{session_id}/actions", busy, {"action": "pause", "effect_id": "eff_0"}, 400),
        ("post", "/sessions/{session_id}/actions", busy, {"action": "cancel_tool", "effect_id": "eff_0"}, 404),
        ("post", "/sessions/{session_id}/actions", busy, {"action": "settle", "effect_id": "eff_0", "outcome": "ran"}, 404),
        ("post", "/sessions/{session_id}/actions", busy, {"action": "settle", "effect_id": "eff_0"}, 400),
        ("post", "/sessions/{session_id}/actions", busy, {"action": "pause", "outcome": "did_not_run"}, 400),
        ("post", "/sessions/{session_id}/actions", busy, {"action": "settle", "effect_id": "eff_0", "outcome": "x"}, 400),
        ("post", "/sessions/{session_id}/actions", idle, {"action": "pause"}, 409),
        ("post", "/goals", "", {"session_id": goal_a, "objective": "o",
                                "requirements": [{"text": "t", "kind": "command"}]}, 400),
        ("post", "/goals", "", {"session_id": goal_a, "objective": "o",
                                "requirements": [{"text": "t", "kind": "file_digest", "path": "a"}]}, 400),
        ("post", "/goals", "", {"session_id": goal_b, "objective": "o",
                                "requirements": [{"text": "t", "kind": "command", "command": "true"}]}, 201),
        ("post", "/goals", "", {"session_id": goal_b, "objective": "o", "client_request_id": ""}, 400),
        ("patch", "/sessions/{session_id}", idle, {"model": "no-such-model"}, 400),
        ("patch", "/sessions/{session_id}", idle, {"title": ""}, 400),
        ("patch", "/sessions/{session_id}", idle, {"title": "renamed", "model": ""}, 200),  # the default model
        ("post", "/sessions", "", {"model": "no-such-model"}, 400),
        ("post", "/sessions", "", {"model": "openai:gpt-4o-mini"}, 201),
        ("post", "/sessions", "", {"model": ""}, 201),  # the default
        ("put", "/notebook-session", "", {"path": "\t"}, 400), ("put", "/notebook-session", "", {"path": "../x.ipynb"}, 400),
        ("put", "/notebook-session", "", {"path": "work/a.ipynb"}, 201),
    ]
    for method, path, sid, body, status in cases:
        code, answer = await api.call(method.upper(), path.replace("{session_id}", sid).strip("/"), body)
        assert code == status, (path, body, code, answer)
        if status >= 400:
            assert_error(answer)
        ref = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
        allowed = _allows(doc, ref, body)
        assert allowed == (status != 400), (path, body, "the document", "allows" if allowed else "refuses")


async def test_a_path_no_route_has_is_a_json_404_and_a_method_it_lacks_a_405_naming_those_it_has(api: Api) -> None:
    """Jupyter's own 404 is an HTML page (an id with a character no id has reached it); RFC 9110 wants
    a 405 to carry ``Allow``."""
    for method, path in (("GET", "sessions/not.an.id"), ("POST", "approvals/.exe"), ("GET", "sessions/ses_0/nothing")):
        code, answer = await api.call(method, path, {} if method != "GET" else None)
        assert code == 404, (method, path, code, answer)
        assert_error(answer, "not_found")
    r = await api.fetch("api", "goals", "sessions", method="DELETE", raise_error=False)
    assert r.code == 405 and r.headers["Allow"] == "GET, POST, OPTIONS", (r.code, dict(r.headers))
    assert_error(json.loads(r.body))


async def test_the_event_stream_is_documented_as_one_and_its_headers_come_before_any_event(
    api: Api, raw_url: Any, jp_auth_header: dict[str, str]
) -> None:
    """A generated client or a fuzzer learns from the document that `GET /events` answers a
    `text/event-stream` that never ends (one event per `schema`, OpenAPI 3.1's reading), and from the
    server at once that it got one: the status and headers come before the first event (they waited
    for an event or the 15 s keep-alive, so a client waited on a stream with nothing new until its timeout)."""
    doc = await api.ok("GET", "openapi.json")
    op = doc["paths"]["/events"]["get"]
    content = op["responses"]["200"]["content"]
    assert op["x-stream"]["ends"] is False and "never ends" in op["description"]
    event = content["text/event-stream"]["schema"]
    assert event["properties"]["data"]["contentMediaType"] == "application/json"
    assert _allows(doc, event, {"id": "7", "event": "session.created", "data": "{}"})
    assert _allows(doc, content["application/json"]["schema"], await api.events())
    started = time.monotonic()
    async with httpx.AsyncClient(headers=jp_auth_header, timeout=5) as client:
        async with client.stream("GET", raw_url(f"events?after={2**62}")) as resp:  # nothing after it, ever
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            assert time.monotonic() - started < 5
            with pytest.raises(asyncio.TimeoutError):  # and it stays open: a stream, not a page
                await asyncio.wait_for(resp.aiter_bytes().__anext__(), 0.5)


def _answer_schema(doc: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any]:
    return doc["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]  # type: ignore[no-any-return]


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def test_every_answer_has_a_schema_from_its_response_model_and_every_event_kind_its_payload() -> None:
    """Issue 28 item 4: each route's success answers name a component (the response model the route
    builds its answer with), its errors ``Error``; every ``$ref`` resolves; ``Event`` is the union of one
    schema per kind, each with its payload model."""
    from jupyter_goals.events import PAYLOADS, EventKind
    from jupyter_goals.server.openapi import OPERATIONS

    doc = document()
    schemas = doc["components"]["schemas"]
    for op in OPERATIONS:
        responses = doc["paths"][op.path][op.method]["responses"]
        for status, response in responses.items():
            for media, content in response["content"].items():
                if media == "text/event-stream":
                    continue
                ref = content["schema"]["$ref"]
                name = ref.removeprefix("#/components/schemas/")
                assert name in schemas, (op.path, status)
                expected = op.answer.__name__ if status.startswith("2") else "Error"
                assert name == expected, (op.method, op.path, status, name)
                if status.startswith("2"):
                    assert schemas[name] != {"type": "object"}, (op.path, "is described as an object only")
    assert {r.removeprefix("#/components/schemas/") for r in _refs(doc)} <= set(schemas)
    assert schemas["EventKind"]["enum"] == [k.value for k in EventKind]
    mapping = schemas["Event"]["discriminator"]["mapping"]
    assert set(mapping) == {k.value for k in EventKind}
    for kind, ref in mapping.items():
        one = schemas[ref.removeprefix("#/components/schemas/")]
        assert one["properties"]["kind"] == {"const": kind}
        assert one["properties"]["payload"]["$ref"].endswith("/" + PAYLOADS[EventKind(kind)].__name__)
    # keys an answer leaves out when they have nothing to say are not required, and never null
    assert "config_error" not in schemas["ModelList"]["required"]
    assert schemas["ModelList"]["properties"]["config_error"]["type"] == "string"
    assert "default" not in schemas["ModelList"]["properties"]["config_error"]
    assert "budget_status" not in schemas["Goal"]["required"] and "usage" in schemas["Goal"]["required"]


@pytest.fixture
def flows(tmp_path: Path, goals_state_dir: Path) -> dict[str, Any]:
    root = tmp_path / "root"
    root.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [
        {"when": {"last_tool_result_contains": "wrote "}, "respond": {"text": "Written.",
                                                                    "usage": {"input_tokens": 5, "output_tokens": 1}}},
        {"when": {"last_user_contains": "write"}, "respond": {"tool_calls": [
            {"name": "write_file", "arguments": {"path": "notes/a.md", "content": "a"}}]}},
    ], "default": {"text": "(no rule)"}}))
    return {"root": root, "model": f"scripted:{script}", "state": goals_state_dir}


async def test_a_representative_answer_of_every_route_matches_its_schema(api: Api, flows: dict[str, Any]) -> None:
    """Every route answers as the served document states (success answers and errors), through a chat
    whose write waits for an approval, a Goal with a hard budget that ends in a terminal record, a Job,
    a notebook's session and stop all; and every event these wrote matches its kind's schema."""
    from jupyter_goals.store.db import Database
    from tests.inproc import run_next_attempt

    doc = await api.ok("GET", "openapi.json")
    checked: set[tuple[str, str]] = set()

    async def check(method: str, path: str, concrete: str, status: int, body: Any = None,
                    params: dict[str, Any] | None = None) -> Any:
        code, answer = await api.call(method.upper(), concrete, body, params=params)
        assert code == status, (method, concrete, code, answer)
        schema = _answer_schema(doc, method, path, status)
        errors = list(Draft202012Validator({**schema, "components": doc["components"]}).iter_errors(answer))
        assert not errors, (method, path, status, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]])
        if status < 300:
            checked.add((method, path))
        return answer

    async def run_turn() -> None:
        db = Database(f"sqlite:///{flows['state'] / 'control.db'}", inline=True)
        try:
            await run_next_attempt(db, flows["state"], flows["model"], str(flows["root"]))
        finally:
            db.close()

    await check("get", "/health", "health", 200)
    await check("get", "/models", "models", 200)
    await check("get", "/recovery", "recovery", 200)
    await check("get", "/openapi.json", "openapi.json", 200)
    chat = await check("post", "/sessions", "sessions", 201,
                       {"title": "chat", "cwd": str(flows["root"]), "model": flows["model"]})
    sid = chat["session_id"]
    await check("patch", "/sessions/{session_id}", f"sessions/{sid}", 200,
                {"permissions": {"mode": "ask", "allow": [{"tool": "read_file", "path": "*.md"}], "folders": ["/tmp"]}})
    await check("patch", "/sessions/{session_id}", f"sessions/{sid}", 200, {"title": "renamed chat"})
    await check("post", "/sessions/{session_id}/messages", f"sessions/{sid}/messages", 202,
                {"text": "write a note", "client_request_id": "r1"})
    await run_turn()
    pending = await check("get", "/approvals", "approvals", 200, params={"state": "pending"})
    waiting = await check("get", "/attention", "attention", 200)
    assert [i["kind"] for i in waiting["items"]] == ["approval"] and waiting["count"] == 1
    snapshot = await check("get", "/sessions/{session_id}", f"sessions/{sid}", 200)
    assert snapshot["approvals"] and snapshot["transcript"]["items"] and snapshot["work"]
    approval_id = pending["approvals"][0]["approval_id"]
    await check("post", "/approvals/{approval_id}", f"approvals/{approval_id}", 200, {"decision": "approve"})
    await check("post", "/approvals/{approval_id}", f"approvals/{approval_id}", 409, {"decision": "deny"})
    await check("get", "/approvals/{approval_id}", f"approvals/{approval_id}", 200)
    await check("get", "/sessions/{session_id}", f"sessions/{sid}", 200,
                params={"work_id": snapshot["work"]["work_id"], "limit": 2})
    await run_turn()
    await check("get", "/sessions/{session_id}", f"sessions/{sid}", 200, params={"before": "latest", "limit": 2})
    await check("post", "/sessions/{session_id}/messages", f"sessions/{sid}/messages", 202,
                {"text": "and another", "client_request_id": "r2", "delivery": "steer"})
    await check("post", "/sessions/{session_id}/actions", f"sessions/{sid}/actions", 200, {"action": "pause"})
    await check("post", "/sessions/{session_id}/actions", f"sessions/{sid}/actions", 404,
                {"action": "cancel_tool", "effect_id": "eff_0"})
    await check("get", "/sessions", "sessions", 200, params={"limit": 1})
    await check("get", "/usage", "usage", 200, params={"session_id": sid})

    other = (await check("post", "/sessions", "sessions", 201, {"permissions": {"mode": "bypass"}}))["session_id"]
    goal = await check("post", "/goals", "goals", 201, {
        "session_id": other, "objective": "Write out.txt", "budget": {"max_cost_usd": 1, "max_tokens": 1000},
        "requirements": [{"text": "exists", "kind": "file_exists", "path": "out.txt"}]})
    assert goal["budget_status"] and goal["budget"] == {"max_cost_usd": 1, "max_tokens": 1000}
    gid = goal["goal_id"]
    alone = await check("get", "/goals/{goal_id}", f"goals/{gid}", 200)
    # the session's snapshot carries its current Goal with the same usage: a view needs no second read
    shown = (await check("get", "/sessions/{session_id}", f"sessions/{other}", 200))["goal"]
    assert shown["goal_id"] == gid and shown["usage"] is not None
    assert {k: shown["usage"][k] for k in ("known_tokens", "unknown_usage_requests")} == \
        {k: alone["usage"][k] for k in ("known_tokens", "unknown_usage_requests")}
    await check("get", "/goals", "goals", 200, params={"session_id": other})
    goal = await check("patch", "/goals/{goal_id}", f"goals/{gid}", 200,
                       {"expected_revision": 1, "objective": "Write out.txt, then stop"})
    await check("post", "/goals/{goal_id}/actions", f"goals/{gid}/actions", 409, {"action": "pause", "expected_revision": 1})
    await check("post", "/goals/{goal_id}/actions", f"goals/{gid}/actions", 200, {"action": "end", "expected_revision": 2})
    records = await check("get", "/sessions/{session_id}/history", f"sessions/{other}/history", 200)
    await check("get", "/history/{record_id}", f"history/{records['records'][0]['record_id']}", 200)
    await check("get", "/usage", "usage", 200, params={"goal_id": gid})

    job = await check("post", "/jobs", "jobs", 202, {"session_id": other, "input": "summarise", "client_request_id": "j1"})
    await check("get", "/jobs/{job_id}", f"jobs/{job['job_id']}", 200)
    await check("put", "/notebook-session", "notebook-session", 201, {"path": "work/a.ipynb"})
    await check("put", "/notebook-session", "notebook-session", 200, {"path": "work/a.ipynb"})
    await check("put", "/notebook-session", "notebook-session", 200, {"path": "work/b.ipynb", "session_id": sid})
    await check("get", "/sessions/{session_id}", "sessions/ses_" + "0" * 24, 404)
    await check("post", "/sessions", "sessions", 400, {"nope": 1})
    await check("post", "/actions", "actions", 200, {"action": "stop_all"})

    page = await check("get", "/events", "events", 200, params={"format": "json", "limit": 5000})
    kinds = {e["kind"] for e in page["events"]}
    assert {"approval.requested", "approval.decided", "effect.state", "goal.history", "job.created",
            "notebook.bound", "session.permissions", "work.control"} <= kinds, kinds
    documented = {(m, path) for path, methods in doc["paths"].items() for m in methods}
    assert checked == documented, documented - checked


# the run's settings beside its command line: a stream read for 2 s (then cut short, as schemathesis
# does with a stream that never ends), and no "created resource not found" for `POST
# /sessions/{id}/actions`, whose 404 names the unknown call of the body, not the session just created
FUZZ_CONFIG = """
[[operations]]
include-path = "/events"
include-method = "GET"
request-timeout = 2

[[operations]]
include-path = "/sessions/{session_id}/actions"
include-method = "POST"
checks.ensure_resource_availability.enabled = false
"""


def _schemathesis(server: Any, tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """schemathesis 4 against the served document, with tests/schemathesis_hooks.py and FUZZ_CONFIG;
    its files (report, hypothesis database) stay in ``tmp_path``."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(FUZZ_CONFIG)
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config), "run",
           f"{server.url}api/goals/openapi.json", "--url", f"{server.url}api/goals",
           "-H", f"Authorization: token {server.token}", "--request-timeout", "30", "--workers", "1",
           "--no-color", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_every_error_is_the_documented_json(tmp_path: Path) -> None:
    """Every operation, generated and mutated inputs (bad types, unknown fields, missing fields, odd
    strings, boundaries, undeclared methods): never a 5xx, every answer as documented (errors:
    {"error","message"}), every schema-valid request accepted and every schema-violating one refused.
    Every check but one: without credentials Jupyter answers 403, where the check wants 401 (both are
    documented; the answer is jupyter_server's, for every route it serves)."""
    with server_env(tmp_path, [], base_env=None) as env:
        server = env["make"]().start()
        served = server.client().http.get("/openapi.json")
        assert served.status_code == 200 and served.json()["servers"] == [{"url": "/api/goals"}]
        result = _schemathesis(server, tmp_path, "--exclude-checks", "missing_required_header", "-n", "10",
                               "--generation-deterministic", "--phases", "examples,coverage,fuzzing", timeout=900)
        assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:] + server.log()[-3000:]


FUZZ_SECONDS = 100  # the stateful run's budget (CI time): it stops there, wherever it got


@pytest.mark.slow
def test_a_stateful_fuzzing_run_finds_no_server_error_and_no_schema_mismatch(tmp_path: Path) -> None:
    """Issue 27: schemathesis chains the operations (a created session's id into its messages,
    actions, Goals, Jobs, usage…) with generated and mutated inputs, every check on: no 5xx, every
    status and answer documented, every schema-valid request accepted (2xx, or 404 / 409 for an
    unknown id or a state that refuses it), every schema-violating one refused. A fixed seed, and a time
    budget rather than a count: a correct server passes however far a slow machine gets."""
    with server_env(tmp_path, [], base_env=None) as env:
        server = env["make"]().start()
        result = _schemathesis(server, tmp_path, "--phases", "stateful", "--max-time", str(FUZZ_SECONDS),
                               "--seed", "27", "--generation-database", "none", timeout=FUZZ_SECONDS + 100)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-10000:] + server.log()[-3000:]
        assert "Stateful" in out and "No issues found" in out, out[-3000:]
