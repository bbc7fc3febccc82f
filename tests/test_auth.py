"""Auth on every route (issue 16 item 4), through a real in-process Jupyter server (pytest-jupyter) with
``allow_unauthenticated_access=False``: a custom authorizer is obeyed per action (read / write) on the
``jupyter_goals`` resource, a denied request writes nothing, and jupyter_server's XSRF rule holds for
cookie-authenticated writes (a token header needs none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from jupyter_server.auth.authorizer import Authorizer

from tests import restkit
from tests.restkit import Api
from tests.servers import db_rows

# the in-process server's fixtures (tests/restkit.py)
api, goals_state_dir, jp_asyncio_loop, raw_url = restkit.api, restkit.goals_state_dir, restkit.jp_asyncio_loop, restkit.raw_url


class GoalsPolicy(Authorizer):
    """Everything but ``jupyter_goals`` is allowed; for it, ``mode`` says what: all, read or none."""

    mode: ClassVar[str] = "all"
    asked: ClassVar[list[tuple[str, str]]] = []

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        if resource != "jupyter_goals":
            return True
        GoalsPolicy.asked.append((action, resource))
        return GoalsPolicy.mode == "all" or (GoalsPolicy.mode == "read" and action == "read")


@pytest.fixture
def jp_server_config(goals_state_dir: Path) -> dict[str, Any]:
    GoalsPolicy.mode, GoalsPolicy.asked[:] = "all", []
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_goals": True}, "reraise_server_extension_failures": True,
                      "authorizer_class": GoalsPolicy, "allow_unauthenticated_access": False},
        "GoalsApp": {"workers": 0},
    }


def operations() -> list[tuple[str, str]]:
    from jupyter_goals.server.openapi import document

    return [(method.upper(), path.replace("{", "").replace("}", "_x").lstrip("/"))
            for path, methods in document()["paths"].items() for method in methods]


async def test_a_custom_authorizer_is_asked_for_every_route_and_a_denial_is_403_and_writes_nothing(
    api: Api, goals_state_dir: Path
) -> None:
    """Every operation of the OpenAPI document, with a valid token: the authorizer is asked (``read``
    for GET, ``write`` otherwise, on ``jupyter_goals``), its denial is a 403, and nothing is written."""
    sid = await api.new_session(title="before")
    GoalsPolicy.mode = "none"
    for method, path in operations():
        GoalsPolicy.asked.clear()
        code, _ = await api.call(method, path.replace("session_id_x", sid), None if method == "GET" else {})
        assert code == 403, (method, path, code)
        action = "read" if method == "GET" else "write"
        assert GoalsPolicy.asked[:1] == [(action, "jupyter_goals")], (method, path, GoalsPolicy.asked)
    assert [r["title"] for r in db_rows(goals_state_dir, "SELECT title FROM sessions")] == ["before"]
    assert not db_rows(goals_state_dir, "SELECT 1 FROM messages")


async def test_a_read_only_authorizer_lets_reads_through_and_refuses_every_write(api: Api) -> None:
    sid = await api.new_session(title="mine")
    GoalsPolicy.mode = "read"
    code, answer = await api.call("GET", f"sessions/{sid}")
    assert code == 200 and answer["session"]["title"] == "mine"
    for method, path, body in (("POST", "sessions", {"title": "x"}),
                               ("POST", f"sessions/{sid}/messages", {"text": "hi", "client_request_id": "r"}),
                               ("PATCH", f"sessions/{sid}", {"title": "renamed"}),
                               ("POST", "actions", {"action": "stop_all"})):
        code, _ = await api.call(method, path, body)
        assert code == 403, (method, path, code)
    GoalsPolicy.mode = "all"
    assert (await api.ok("GET", f"sessions/{sid}"))["session"]["title"] == "mine"


async def test_a_cookie_authenticated_write_needs_the_xsrf_token_and_a_token_header_does_not(
    api: Api, raw_url: Any, jp_serverapp: Any, goals_state_dir: Path
) -> None:
    """jupyter_server's rule: a request authenticated by its login cookie (a browser) must carry the
    XSRF token for a write; a request with the token header (a script) needs none."""
    token = jp_serverapp.identity_provider.token
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(raw_url("health"), headers={"Authorization": f"token {token}"})
        assert r.status_code == 200 and any("username" in c or "-user" in c or "jupyter" in c.lower()
                                            for c in r.cookies), r.cookies  # the login cookie
        cookies = dict(r.cookies)
        bare = await client.post(raw_url("sessions"), json={"title": "no xsrf"}, cookies=cookies)
        assert bare.status_code == 403, bare.text
        with_xsrf = await client.post(raw_url("sessions"), json={"title": "with xsrf"},
                                      cookies={**cookies, "_xsrf": "same-value"}, headers={"X-XSRFToken": "same-value"})
        assert with_xsrf.status_code == 201, with_xsrf.text
        scripted = await client.post(raw_url("sessions"), json={"title": "token"},
                                     headers={"Authorization": f"token {token}"})
        assert scripted.status_code == 201, scripted.text
    titles = sorted(r["title"] for r in db_rows(goals_state_dir, "SELECT title FROM sessions"))
    assert titles == ["token", "with xsrf"]
