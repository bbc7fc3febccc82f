"""``POST /goals`` with a ``client_request_id`` (issue 29 item 5; DESIGN §10: "a repeated client_request_id
returns the same Goal"): a retried create answers the Goal the first one made, creates nothing, and keeps
doing so after a kill -9 and restart (the id is a column of control.db with a unique index per session, on
SQLite and PostgreSQL); without an id, or with another one, a second Goal while one is active is the 409
it always was. The ids are checked as a message's are. The notebook magic and the ACP ``/goal`` command
send ids that make their own retries safe. Real ``jupyter server`` processes, a scripted model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from jupyter_goals.clients.acp import commands
from jupyter_goals.clients.notebook.magics import goal_request_id
from jupyter_goals.clients.rest import GoalsClient, GoalsError
from tests.servers import ServerFactory, ServerProcess, wait_for
from tests.storekit import Backend

slow = pytest.mark.slow  # real jupyter server processes

# every work request asks to run a command: in an `ask` session the Goal then waits for an approval, active
# and quiet (no model turn runs until a person answers), so the test decides when it ends
RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work"},
     "respond": {"text": "Checking.", "tool_calls": [{"name": "shell", "arguments": {"command": "true"}}]}},
]
REQUIREMENTS = [{"text": "the notes are tidy", "kind": "semantic"}]


def _server(tmp_path: Path, backend: Backend) -> ServerProcess:
    factory = ServerFactory(tmp_path / "goals", RULES)
    extra = [f"--GoalsApp.control_db_url={backend.url('control')}"] if backend.kind == "postgresql" else []
    return factory.make(extra=extra)


@pytest.fixture
def server(tmp_path: Path, backend: Backend) -> Iterator[ServerProcess]:
    s = _server(tmp_path, backend)
    try:
        yield s.start()
    finally:
        s.kill()


def _post_goal(cl: GoalsClient, body: dict[str, Any]) -> httpx.Response:
    return cl.http.post("/goals", json=body)


def _goal_events(cl: GoalsClient, session_id: str) -> list[dict[str, Any]]:
    events = cl.events(0, 5000)["events"]
    return [e for e in events if e["kind"] == "goal.created" and e["session_id"] == session_id]


def _same_goal(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("goal_id", "session_id", "work_id", "objective", "original_objective", "requirements", "created_at"):
        assert a[key] == b[key], key


@slow
def test_a_retried_create_answers_the_same_goal_and_creates_nothing_across_a_restart(
        server: ServerProcess, tmp_path: Path) -> None:
    cl = server.client()
    sid = cl.create_session(title="retry", cwd=str(tmp_path))["session_id"]
    body = {"session_id": sid, "objective": "Tidy the notes", "requirements": REQUIREMENTS, "client_request_id": "g-1"}
    first = _post_goal(cl, body)
    assert first.status_code == 201, first.text
    goal = first.json()
    again = _post_goal(cl, body)
    assert again.status_code == 201, again.text
    _same_goal(again.json(), goal)
    # the client's parameter sends the same id: the same Goal again
    _same_goal(cl.create_goal(sid, "Tidy the notes", REQUIREMENTS, client_request_id="g-1"), goal)
    assert [g["goal_id"] for g in cl.goals(sid)] == [goal["goal_id"]]
    assert len(_goal_events(cl, sid)) == 1

    # a second Goal while this one is active: 409 without an id and with another one, as before
    for other in ({}, {"client_request_id": "g-2"}):
        r = _post_goal(cl, {"session_id": sid, "objective": "Something else", **other})
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "conflict" and "already has a Goal" in r.json()["message"]
    wait_for(lambda: bool(cl.approvals("pending")), timeout=60, what="the Goal's call waiting for approval")

    # kill -9 and start again: the id is durable
    server.kill()
    server.start()
    cl = server.client()
    _same_goal(cl.create_goal(sid, "Tidy the notes", REQUIREMENTS, client_request_id="g-1"), goal)
    assert [g["goal_id"] for g in cl.goals(sid)] == [goal["goal_id"]]
    assert len(_goal_events(cl, sid)) == 1

    # the same id in another session is another request: a Goal there
    other_sid = cl.create_session(title="other", cwd=str(tmp_path))["session_id"]
    there = cl.create_goal(other_sid, "Tidy the notes", REQUIREMENTS, client_request_id="g-1")
    assert there["goal_id"] != goal["goal_id"] and there["session_id"] == other_sid

    # once the Goal ended, its id still answers it (a late retry never starts a second Goal) ...
    ended = cl.goal_action(goal["goal_id"], "end", cl.goal(goal["goal_id"])["revision"])
    assert ended["state"] == "cancelled"
    late = cl.create_goal(sid, "Tidy the notes", REQUIREMENTS, client_request_id="g-1")
    assert late["goal_id"] == goal["goal_id"] and late["state"] == "cancelled"
    # ... and a new id starts a new one
    new = cl.create_goal(sid, "Tidy the notes", REQUIREMENTS, client_request_id="g-3")
    assert new["goal_id"] != goal["goal_id"] and new["state"] == "active"
    assert len(cl.goals(sid)) == 2 and len(_goal_events(cl, sid)) == 2


@slow
def test_client_request_ids_are_checked_as_a_messages_are(server: ServerProcess, tmp_path: Path) -> None:
    cl = server.client()
    sid = cl.create_session(title="ids", cwd=str(tmp_path))["session_id"]
    base = {"session_id": sid, "objective": "Tidy the notes", "requirements": REQUIREMENTS}
    for bad in ("", "x" * 201, 7, ["g"], {"id": "g"}, True):
        r = _post_goal(cl, {**base, "client_request_id": bad})
        assert r.status_code == 400, (bad, r.text)
        assert "client_request_id" in r.json()["message"], r.text
        # a message refuses the same ids
        m = cl.http.post(f"/sessions/{sid}/messages", json={"text": "hi", "client_request_id": bad})
        assert m.status_code == 400, (bad, m.text)
    assert cl.goals(sid) == []  # nothing was created by a refused request
    longest = cl.create_goal(sid, "Tidy the notes", REQUIREMENTS, client_request_id="x" * 200)
    assert cl.create_goal(sid, "Tidy the notes", REQUIREMENTS, client_request_id="x" * 200)["goal_id"] == longest["goal_id"]
    # null is no id at all: the active Goal refuses it (409), never answers it
    r = _post_goal(cl, {**base, "client_request_id": None})
    assert r.status_code == 409, r.text


# --------------------------------------------------------------------------- the clients' ids


def test_the_magics_id_is_stable_for_a_cell_and_changes_once_a_goal_ended() -> None:
    same = goal_request_id("ses_1", "Tidy", REQUIREMENTS, None)
    assert same == goal_request_id("ses_1", "Tidy", [dict(r) for r in REQUIREMENTS], None)
    assert 1 <= len(same) <= 200
    assert len({same, goal_request_id("ses_2", "Tidy", REQUIREMENTS, None),
                goal_request_id("ses_1", "Tidy up", REQUIREMENTS, None),
                goal_request_id("ses_1", "Tidy", None, None),
                goal_request_id("ses_1", "Tidy", REQUIREMENTS, "goal_1")}) == 5


def test_the_acp_goal_id_is_derived_from_the_prompt_request() -> None:
    assert commands.goal_request_id("acp-abc") == commands.goal_request_id("acp-abc")
    assert commands.goal_request_id("acp-abc") != commands.goal_request_id("acp-abd")
    assert len(commands.goal_request_id("k" * 5000)) <= 200


@slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_goal_cell_run_again_answers_its_goal_and_starts_a_new_one_once_it_ended(
        server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``%%goal`` run twice (as after a dropped connection) shows one Goal, no 409; a different objective
    is refused while it runs; after ``%goal end`` the same cell starts a new Goal."""
    monkeypatch.setenv("JUPYTER_GOALS_SERVER_URL", server.url)
    monkeypatch.setenv("JUPYTER_GOALS_TOKEN", server.token)
    monkeypatch.setenv("JUPYTER_GOALS_NOTEBOOK", "retry.ipynb")
    ip = InteractiveShell.instance()
    ip.run_line_magic("reload_ext", "jupyter_goals")
    cell = "%%goal Tidy the notes\nthe notes are tidy\n"

    def run(source: str) -> Any:
        with capture_output():
            return ip.run_cell(source)

    assert run(cell).error_in_exec is None
    assert run(cell).error_in_exec is None
    cl = server.client()
    [sid] = {g["session_id"] for g in cl.goals()}
    goals = cl.goals(sid)
    assert len(goals) == 1 and goals[0]["objective"] == "Tidy the notes"
    refused = run("%goal Something else")
    assert refused.error_in_exec is not None and "409" in str(refused.error_in_exec)
    assert run("%goal end").error_in_exec is None
    assert run(cell).error_in_exec is None
    after = cl.goals(sid)
    assert len(after) == 2 and after[0]["state"] == "cancelled" and after[1]["state"] == "active"
    assert run(cell).error_in_exec is None  # and that one is answered again, not a third
    assert len(cl.goals(sid)) == 2


class RestHost:
    """The two calls ``commands.run`` makes, over the real REST API (what the ACP agent does)."""

    def __init__(self, cl: GoalsClient) -> None:
        self.cl = cl

    async def get(self, path: str, params: dict[str, Any] | None) -> Any:
        return await asyncio.to_thread(lambda: _ok(self.cl.http.get(path, params=params)))

    async def post(self, path: str, body: dict[str, Any], method: str = "POST") -> Any:
        return await asyncio.to_thread(lambda: _ok(self.cl.http.request(method, path, json=body)))


def _ok(r: httpx.Response) -> Any:
    if r.status_code >= 400:
        raise GoalsError(r.status_code, r.json().get("error", ""), r.json().get("message", ""))
    return r.json()


@slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_acp_goal_command_sent_again_for_one_request_starts_one_goal(server: ServerProcess, tmp_path: Path) -> None:
    cl = server.client()
    sid = cl.create_session(title="acp", cwd=str(tmp_path))["session_id"]
    host = RestHost(cl)

    async def goal(key: str) -> commands.Reply:
        return await commands.run(host, sid, "goal", "Tidy the notes", "the notes are tidy\n", request_key=key)

    first = asyncio.run(goal("acp-request-1"))
    again = asyncio.run(goal("acp-request-1"))
    assert first.stop_reason == again.stop_reason == "end_turn" and first.text == again.text
    assert len(cl.goals(sid)) == 1
    other = asyncio.run(goal("acp-request-2"))  # another prompt while the Goal runs: the server's 409
    assert other.stop_reason == "refusal" and "already has a Goal" in other.text
    assert len(cl.goals(sid)) == 1
