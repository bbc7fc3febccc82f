"""The offline demo model does the whole job (issue 12, item 7) on a real ``jupyter server`` process
with its default model (the bundled demo script) and no API key: chat, a command, an approval, and a
Goal "write hello.txt saying hello" that is verified (a ``command`` requirement and an independent
read-only review) and achieved with one terminal history record, in ``bypass`` and in ``ask`` mode
(every approval given through REST)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.clients.rest import GoalsClient
from jupyter_goals.server.app import demo_model
from tests.servers import ServerProcess, db_rows, wait_for

pytestmark = pytest.mark.slow

OBJECTIVE = "write hello.txt saying hello"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("demo_goal")
    root = base / "root"
    root.mkdir()
    # the default model, unchanged: --GoalsApp.default_model is set to the very value it defaults to
    s = ServerProcess(base / "state", root, model=demo_model(), env={"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""})
    s.start()
    try:
        yield s
    finally:
        s.kill()


def new_session(server: ServerProcess, name: str, mode: str) -> tuple[GoalsClient, str, Path]:
    client = server.client()
    cwd = server.root_dir / name
    cwd.mkdir()
    created = client.create_session(title=name, cwd=str(cwd), permissions={"mode": mode})
    assert created["session"]["model"] == demo_model()  # no model given: the server's default, the demo
    return client, created["session_id"], cwd


def approve_until(client: GoalsClient, sid: str, done: Any, timeout: float = 90.0) -> list[dict[str, Any]]:
    """Approve each pending call of the session (as a person pressing Approve) until ``done()``."""
    approved: list[dict[str, Any]] = []

    def step() -> bool:
        for a in client.approvals("pending"):
            if a["session_id"] == sid:
                client.approve(a["approval_id"])
                approved.append(a)
        return bool(done())

    wait_for(step, timeout=timeout, what="approved work finishes")
    return approved


def assert_achieved_once(client: GoalsClient, sid: str, goal_id: str, cwd: Path) -> dict[str, Any]:
    goal = client.goal(goal_id)
    assert goal["state"] == "achieved", goal
    assert (cwd / "hello.txt").read_text() == "hello\n"
    reqs = {r["id"]: r for r in goal["requirements"]}
    assert reqs["r1"]["kind"] == "command" and reqs["r1"]["command"] == "grep -q hello hello.txt"
    assert reqs["r2"]["kind"] == "semantic"
    verdicts = {v["requirement_id"]: v for v in goal["acceptance"]["verdicts"]}
    assert goal["acceptance"]["outcome"] == "met"
    assert {k: v["verdict"] for k, v in verdicts.items()} == {"r1": "met", "r2": "met"}
    assert verdicts["r1"]["evidence"][0]["kind"] == "receipt"  # a real recorded run of the check
    [record] = client.history(sid)
    assert record["goal_id"] == goal_id and record["state"] == "achieved"
    return goal


def test_a_goal_is_verified_and_achieved_with_the_demo_model_in_bypass_mode(server: ServerProcess) -> None:
    client, sid, cwd = new_session(server, "bypass_goal", "bypass")
    goal = client.create_goal(sid, OBJECTIVE)
    client.wait_goal(goal["goal_id"], timeout=90)
    assert_achieved_once(client, sid, goal["goal_id"], cwd)
    purposes = {r["purpose"] for r in db_rows(server.state_dir, "SELECT purpose FROM requests WHERE session_id = ?", (sid,))}
    assert purposes == {"requirements", "work", "acceptance"}


def test_a_goal_in_ask_mode_waits_for_each_write_and_is_achieved_once_approved(server: ServerProcess) -> None:
    client, sid, cwd = new_session(server, "ask_goal", "ask")
    goal = client.create_goal(sid, OBJECTIVE)
    wait_for(lambda: any(a["session_id"] == sid for a in client.approvals("pending")), timeout=60, what="an approval")
    assert not (cwd / "hello.txt").exists()  # nothing is written before a person approves
    snap = client.session(sid)
    assert snap["work"]["reason_code"] == "awaiting_approval"
    approved = approve_until(client, sid, lambda: client.goal(goal["goal_id"])["state"] == "achieved")
    assert [a["tool"] for a in approved] == ["write_file", "shell"]
    assert approved[1]["arguments"] == {"command": "grep -q hello hello.txt"}
    assert_achieved_once(client, sid, goal["goal_id"], cwd)
    states = {r["state"] for r in db_rows(server.state_dir, "SELECT state FROM approvals WHERE session_id = ?", (sid,))}
    assert states == {"consumed"}  # each approval used exactly once


def test_chat_greets_lists_and_writes_after_an_approval(server: ServerProcess) -> None:
    client, sid, cwd = new_session(server, "ask_chat", "ask")
    client.send(sid, "hi", client_request_id="c1")
    snap = client.wait(sid, timeout=60)
    answer = [i for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1]["content"]
    assert answer.startswith("Hello! I am the offline demo model.") and '"write hello.txt"' in answer

    client.send(sid, "list", client_request_id="c2")  # ls -la is a shell call: ask mode asks first
    approve_until(client, sid, lambda: client.session(sid)["work"]["phase"] == "done")
    items = client.session(sid, before="latest", limit=50)["transcript"]["items"]
    assert [i["tool"] for i in items if i["kind"] == "tool_result"][-1] == "shell"
    assert items[-1]["content"] == "Those are the files in this session's folder."

    client.send(sid, "please write hello.txt", client_request_id="c3")
    wait_for(lambda: any(a["session_id"] == sid for a in client.approvals("pending")), timeout=60, what="an approval")
    [pending] = [a for a in client.approvals("pending") if a["session_id"] == sid]
    assert (pending["tool"], pending["arguments"]) == ("write_file", {"path": "hello.txt", "content": "hello\n"})
    assert not (cwd / "hello.txt").exists()
    approve_until(client, sid, lambda: client.session(sid)["work"]["phase"] == "done")
    assert (cwd / "hello.txt").read_text() == "hello\n"
    items = client.session(sid, before="latest", limit=5)["transcript"]["items"]
    assert items[-1]["content"] == "I wrote hello.txt; it says hello."
    assert [i["state"] for i in items if i["kind"] == "tool_result"] == ["committed"]


def test_the_python_client_lists_sessions_through_every_page_with_filters(server: ServerProcess) -> None:
    client = server.client()
    made = {client.create_session(title=f"client list {i}", cwd=str(server.root_dir))["session_id"] for i in range(3)}
    listed = client.sessions(q="CLIENT LIST")
    assert {s["session_id"] for s in listed} == made
    assert [s["activity_at"] for s in listed] == sorted((s["activity_at"] for s in listed), reverse=True)
    assert made <= {s["session_id"] for s in client.sessions(state="idle")}
    assert len(client.sessions()) == len({s["session_id"] for s in client.sessions()}) >= 3
