"""``cancel_tool`` on a running call that cannot be cancelled (issue 15): only a detached shell command
has a process group to signal, so a running call of any other tool answers 409 ``{"error", "message"}``
and nothing is recorded; the call ends by itself and the turn goes on.

Through pytest-jupyter's server (``workers = 0``): its Coordinator admits the turn and a worker living in
this test process (``tests/inproc.py``) runs it against the same control.db. The running call is a real
``read_file`` of a named pipe: it blocks until this test writes to the pipe. Only the model is scripted.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.store.db import Database, Row
from tests.inproc import run_next_attempt
from tests.restkit import (  # noqa: F401 - fixtures
    Api,
    api,
    assert_error,
    goals_state_dir,
    jp_asyncio_loop,
    jp_server_config,
)


@pytest.fixture
def chat(tmp_path: Path, goals_state_dir: Path) -> dict[str, Any]:  # noqa: F811
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "pipe")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [
        {"when": {"last_tool_result_contains": "text from the pipe"}, "respond": {"text": "Read it."}},
        {"when": {"last_user_contains": "read the pipe"}, "respond": {"tool_calls": [
            {"name": "read_file", "arguments": {"path": "pipe"}}]}},
    ], "default": {"text": "(no rule)"}}))
    return {"root": root, "model": f"scripted:{script}", "state": goals_state_dir}


async def release(pipe: Path, turn: asyncio.Task[Any], within_s: float = 10.0) -> None:
    """Write a line to the pipe once its reader (the running ``read_file``) has opened it."""
    deadline = time.monotonic() + within_s
    while not turn.done() and time.monotonic() < deadline:
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader has opened it yet
                raise
            await asyncio.sleep(0.02)
            continue
        try:
            os.write(fd, b"text from the pipe\n")
        finally:
            os.close(fd)
        return


@asynccontextmanager
async def pipe_read_running(api: Api, chat: dict[str, Any]) -> AsyncIterator[tuple[str, Database, Row]]:  # noqa: F811
    """A chat whose turn (run by a worker in this process) is inside a dispatched ``read_file`` of the pipe:
    yields the session id, control.db and the call's effect row; on the way out the pipe is written and
    the turn awaited."""
    sid = await api.new_session(cwd=str(chat["root"]), model=chat["model"], permissions={"mode": "bypass"})
    await api.send(sid, "read the pipe", "r1")
    db = Database(f"sqlite:///{chat['state'] / 'control.db'}", inline=True)
    turn = asyncio.create_task(run_next_attempt(db, chat["state"], chat["model"], str(chat["root"])))
    try:
        def dispatched() -> Row | None:
            return db.transact(lambda tx: tx.one("SELECT * FROM effects WHERE state = 'dispatched'"), write=False)

        deadline = time.monotonic() + 10
        while (eff := dispatched()) is None:
            assert time.monotonic() < deadline and not turn.done(), "the read_file call was never dispatched"
            await asyncio.sleep(0.02)
        yield sid, db, eff
    finally:
        await release(chat["root"] / "pipe", turn)
        try:
            await asyncio.wait_for(turn, timeout=10)
        finally:
            db.close()


async def test_cancel_tool_on_a_running_call_that_is_not_a_shell_command_answers_409(
    api: Api, chat: dict[str, Any]  # noqa: F811
) -> None:
    async with pipe_read_running(api, chat) as (sid, db, eff):
        assert eff["tool"] == "read_file"
        for target in (eff["effect_id"], eff["call_id"]):  # a transcript item names the call by its call id
            code, answer = await api.call("POST", f"sessions/{sid}/actions",
                                          {"action": "cancel_tool", "effect_id": target})
            assert code == 409, answer
            assert_error(answer, "conflict")
            assert "cannot be cancelled" in answer["message"] and "read_file" in answer["message"]
        # nothing was recorded: no cancel request on the call, no event, the work runs on
        row = db.transact(lambda tx: tx.one("SELECT state, cancel_requested_at FROM effects WHERE effect_id = ?",
                                            (eff["effect_id"],)), write=False)
        assert row is not None and (row["state"], row["cancel_requested_at"]) == ("dispatched", None)
        events = (await api.events())["events"]
        assert not [e for e in events if e["kind"] == "effect.cancel_requested"]
        snap = await api.ok("GET", f"sessions/{sid}")
        assert snap["work"]["desired_state"] == "run"
    # the call ended by itself with its real result, and the turn went on with it
    snap = await api.ok("GET", f"sessions/{sid}")
    assert snap["work"]["phase"] == "done"
    [result] = [i for i in snap["transcript"]["items"] if i["kind"] == "tool_result"]
    assert (result["state"], result["content"]) == ("committed", "text from the pipe\n")
    assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "Read it."


async def test_work_being_stopped_cannot_be_paused_resumed_or_retried_back_to_run(
    api: Api, chat: dict[str, Any]  # noqa: F811
) -> None:
    """A Stop committed while a call that cannot be cancelled still runs leaves the work stopping (intent
    ``cancelled``, phase not yet ended). A Pause, Resume or Retry sent then (a stale page, a script) is a 409
    and changes nothing: otherwise Pause then Resume would turn stopped work back to ``run`` (found by the
    Coordinator model). The call ends by itself, its result is kept, and no further model turn runs."""
    async with pipe_read_running(api, chat) as (sid, _db, _eff):
        await api.ok("POST", f"sessions/{sid}/actions", {"action": "stop"})
        stopping = await api.ok("GET", f"sessions/{sid}")
        assert stopping["work"]["desired_state"] == "cancelled" and stopping["work"]["phase"] == "working"
        assert (stopping["actions"]["can_pause"], stopping["actions"]["can_resume"]) == (False, False)
        for action in ("pause", "resume", "retry", "pause"):
            code, answer = await api.call("POST", f"sessions/{sid}/actions", {"action": action})
            assert code == 409, (action, answer)
            assert_error(answer, "conflict")
            assert "being stopped" in answer["message"]
        again = await api.ok("GET", f"sessions/{sid}")
        assert again["work"]["desired_state"] == "cancelled"
        assert again["work"]["control_version"] == stopping["work"]["control_version"]
    snap = await api.ok("GET", f"sessions/{sid}")
    assert (snap["work"]["phase"], snap["work"]["reason_code"]) == ("cancelled", "user_stopped")
    [result] = [i for i in snap["transcript"]["items"] if i["kind"] == "tool_result"]
    assert (result["state"], result["content"]) == ("committed", "text from the pipe\n")
    assert not [i for i in snap["transcript"]["items"] if i["kind"] == "assistant" and i["content"] == "Read it."]
