"""``PATCH /sessions/{id}`` with ``{title?, model?}`` (issue 29: ACP's ``session_info_update`` and model
option): the snapshot, the session list and ``GoalsClient.update_session`` show the change, the event
``session.updated`` carries ``{session_id, title, model}``, a new model answers from the session's next
turn while a running turn keeps the model it began with, and bad input is refused (400 naming an unknown
model, 404 for an unknown session) with nothing changed. Real ``jupyter server`` processes on SQLite and
PostgreSQL, two scripted models that sign their answers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.clients.rest import AsyncGoalsClient, GoalsClient, GoalsError
from jupyter_goals.events import SessionUpdatedPayload, payload_of
from tests.servers import ServerFactory, ServerProcess, wait_for, write_script
from tests.storekit import Backend

slow = pytest.mark.slow  # real jupyter server processes


def _rules(name: str) -> list[dict[str, Any]]:
    """A model that signs what it says with ``name``; "slow" runs a command that waits for the file ``go``."""
    return [
        {"when": {"purpose": "work", "last_user_contains": "slow", "last_tool_result_contains": "exit status"},
         "respond": {"text": f"{name} finished the slow step"}},
        {"when": {"purpose": "work", "last_user_contains": "slow"},
         "respond": {"text": "Waiting for go.", "tool_calls": [
             {"name": "shell", "arguments": {"command": "while [ ! -f go ]; do sleep 0.05; done"}}]}},
        {"when": {"purpose": "work"}, "respond": {"text": f"{name} says hello"}},
    ]


@pytest.fixture
def env(tmp_path: Path, backend: Backend) -> Iterator[dict[str, Any]]:
    model_a = write_script(tmp_path / "a.json", _rules("A"))
    model_b = write_script(tmp_path / "b.json", _rules("B"))
    factory = ServerFactory(tmp_path / "goals", model=model_a)
    extra = [f"--GoalsApp.control_db_url={backend.url('control')}"] if backend.kind == "postgresql" else []
    try:
        server = factory.make(extra=extra).start()
        yield {"server": server, "root": factory.root, "a": model_a, "b": model_b}
    finally:
        factory.close()


def _last_answer(cl: GoalsClient, sid: str) -> str:
    items = cl.session(sid, before="latest", limit=50)["transcript"]["items"]
    return [i for i in items if i["kind"] == "assistant"][-1]["content"]


def _updates(cl: GoalsClient, sid: str) -> list[dict[str, Any]]:
    return [e for e in cl.events(0, 5000)["events"] if e["kind"] == "session.updated" and e["session_id"] == sid]


@slow
def test_a_rename_shows_everywhere_and_is_one_event(env: dict[str, Any]) -> None:
    server: ServerProcess = env["server"]
    cl = server.client()
    sid = cl.create_session(title="Untitled", cwd=str(env["root"]))["session_id"]
    before = cl.session(sid)["session"]

    session = cl.update_session(sid, title="Quarterly numbers")
    assert session["session_id"] == sid and session["title"] == "Quarterly numbers"
    assert session["model"] == before["model"] and session["updated_at"] >= before["updated_at"]
    assert cl.session(sid)["session"]["title"] == "Quarterly numbers"
    assert [s["title"] for s in cl.sessions() if s["session_id"] == sid] == ["Quarterly numbers"]
    [event] = _updates(cl, sid)
    payload = payload_of(event["kind"], event["payload"])
    assert isinstance(payload, SessionUpdatedPayload)
    assert event["payload"] == {"session_id": sid, "title": "Quarterly numbers", "model": env["a"]}

    # the same title again changes nothing and tells nothing; the async client has the method too
    assert cl.update_session(sid, title="Quarterly numbers")["title"] == "Quarterly numbers"
    assert cl.update_session(sid) == cl.session(sid)["session"]  # nothing asked, nothing changed
    assert len(_updates(cl, sid)) == 1

    async def rename() -> dict[str, Any]:
        async with AsyncGoalsClient(server.url, server.token) as client:
            return await client.update_session(sid, title="Q3 numbers")

    assert asyncio.run(rename())["title"] == "Q3 numbers"
    assert [e["payload"]["title"] for e in _updates(cl, sid)] == ["Quarterly numbers", "Q3 numbers"]


@slow
def test_a_new_model_answers_from_the_next_turn_and_a_running_turn_keeps_its_own(env: dict[str, Any]) -> None:
    cl = env["server"].client()
    sid = cl.create_session(title="models", cwd=str(env["root"]), permissions={"mode": "bypass"})["session_id"]
    cl.send(sid, "hello")
    assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
    assert _last_answer(cl, sid) == "A says hello"

    # a turn running a command (its first model request went to A) when the model changes
    cl.send(sid, "slow")
    wait_for(lambda: any(i["kind"] == "tool_call" for i in cl.session(sid, before="latest", limit=20)["transcript"]["items"]),
             timeout=60, what="the slow turn's command")
    session = cl.update_session(sid, model=env["b"])
    assert session["model"] == env["b"] and cl.session(sid)["session"]["model"] == env["b"]
    assert _updates(cl, sid)[-1]["payload"] == {"session_id": sid, "title": "models", "model": env["b"]}
    (env["root"] / "go").touch()
    assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
    assert _last_answer(cl, sid) == "A finished the slow step"  # the running turn kept A

    cl.send(sid, "hello")  # the next turn: B
    assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
    assert _last_answer(cl, sid) == "B says hello"

    # "" is the server's default model (A here), as POST /sessions reads it
    assert cl.update_session(sid, model="")["model"] == env["a"]


@slow
def test_bad_updates_are_refused_and_change_nothing(env: dict[str, Any]) -> None:
    cl = env["server"].client()
    sid = cl.create_session(title="kept", cwd=str(env["root"]))["session_id"]
    before = cl.session(sid)["session"]
    for body, status, words in (
        ({"titel": "x"}, 400, "titel"),
        ({"title": ""}, 400, "title"),
        ({"title": 5}, 400, "title"),
        ({"model": 5}, 400, "model"),
        ({"model": "no-such-model"}, 400, "no-such-model"),
        ({"title": "renamed", "model": "no-such-model"}, 400, "no-such-model"),  # all or nothing
    ):
        r = cl.http.patch(f"/sessions/{sid}", json=body)
        assert r.status_code == status, (body, r.text)
        assert words in r.json()["message"], (body, r.text)
    with pytest.raises(GoalsError) as unknown:
        cl.update_session(sid, model="no-such-model")
    assert unknown.value.status == 400 and unknown.value.error == "unknown_model"
    with pytest.raises(GoalsError) as missing:
        cl.update_session("ses_" + "0" * 24, title="nobody")
    assert missing.value.status == 404
    assert cl.session(sid)["session"] == before
    assert _updates(cl, sid) == []
