"""``GET /api/goals/openapi.json`` (DESIGN §10) describes every route, generated from the pydantic
models the handlers validate with; schemathesis fuzzes every route of a real server with it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_goals.server.handlers import handlers
from jupyter_goals.server.openapi import document
from tests.servers import server_env


def _route_paths() -> dict[str, type]:
    out = {}
    for pattern, cls in handlers(""):
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


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_every_error_is_the_documented_json(tmp_path: Path) -> None:
    """Every operation, generated and mutated inputs (bad types, unknown fields, missing fields, odd
    strings): never a 5xx, and every answer matches its documented schema (errors: {"error","message"})."""
    with server_env(tmp_path, [], base_env=None) as env:
        server = env["make"]().start()
        served = server.client().http.get("/openapi.json")
        assert served.status_code == 200 and served.json()["servers"] == [{"url": "/api/goals"}]
        cmd = [str(Path(sys.executable).parent / "schemathesis"), "run", f"{server.url}api/goals/openapi.json",
               "--url", f"{server.url}api/goals", "-H", f"Authorization: token {server.token}",
               "-c", "not_a_server_error,response_schema_conformance", "-n", "10", "--generation-deterministic",
               "--phases", "examples,coverage,fuzzing", "--request-timeout", "30"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:] + server.log()[-3000:]
