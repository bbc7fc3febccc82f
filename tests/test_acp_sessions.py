"""The ACP agent's session methods beyond the first prompt: ``session/list`` over sessions made elsewhere and
its paging, ``session_info_update`` and the model option when a session changes on any surface,
``session/resume`` and ``session/close``, and the stop reasons a turn ends with.

Real ``jupyter server`` processes and the SDK's own client side (the harness of ``tests/acpkit.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError, text_block

from jupyter_goals.clients.acp.updates import (
    TranscriptItem,
    is_stop_marker,
    session_info,
    stopped_call,
    turn_stop_reason,
)
from jupyter_goals.testing import ServerFactory, wait_for
from jupyter_goals.testing.seed import seed_sessions
from jupyter_goals.testing.servers import write_script
from tests.acpkit import Recorder, acp_servers, in_process
from tests.servers import lines


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    yield from acp_servers(tmp_path)


def updates(client: Recorder, kind: str) -> list[Any]:
    return [n.update for n in client.notes if n.update.session_update == kind]


def test_stop_reasons_stop_markers_and_session_info_are_worded() -> None:
    assert [turn_stop_reason(r) for r in ("max_tokens", "length", "max_output_tokens", "MAX_TOKENS")] == ["max_tokens"] * 4
    assert [turn_stop_reason(r) for r in (None, "", "end_turn", "stop", "tool_use")] == ["end_turn"] * 5
    marker = TranscriptItem(item_id="stopped:w1", seq=9, kind="interruption", content="Stopped by you",
                            work_id="w1", meta={"reason_code": "user_stopped"})
    crash = TranscriptItem(item_id="interrupted:w1:1", seq=9, kind="interruption", content="Interrupted",
                           meta={"reason_code": "executor_died"})
    assert is_stop_marker(marker) and not is_stop_marker(crash)
    settled = stopped_call("r:0")
    assert (settled.tool_call_id, settled.status, settled.raw_output["state"]) == ("r:0", "failed", "cancelled")
    info = session_info({"session_id": "s", "title": "Renamed", "model": "scripted:x"})
    assert (info.session_update, info.title, info.field_meta) == ("session_info_update", "Renamed",
                                                                 {"jupyter_goals": {"model": "scripted:x"}})


@pytest.mark.slow
async def test_a_session_made_like_jupyterlab_is_listed_and_paging_walks_exactly_250(servers: ServerFactory) -> None:
    seeded = seed_sessions(servers.state, 249)  # through the real store, before the server starts on it
    server = servers.make().start()
    cl = server.client()
    (servers.root / "project").mkdir()
    default = cl.http.get("/models").json()["default_model"]
    # the body JupyterLab's New chat dialog posts: a folder relative to the server root, a mode, a model name
    lab = cl.create_session(title="From JupyterLab", cwd="project", model=default,
                            permissions={"mode": "ask", "allow": []})["session_id"]
    client = Recorder()
    async with in_process(server, client) as conn:
        await conn.initialize(protocol_version=1)
        listed = await conn.list_sessions(cwd=str(servers.root / "project"))
        assert [(s.session_id, s.title, s.cwd) for s in listed.sessions] == [
            (lab, "From JupyterLab", str(servers.root / "project"))]
        walked: list[str] = []
        pages = 0
        cursor: str | None = None
        while True:
            page = await conn.list_sessions(cursor=cursor)
            walked += [s.session_id for s in page.sessions]
            pages += 1
            if not (cursor := page.next_cursor):
                break
        assert walked[0] == lab  # newest activity first
        assert len(walked) == len(set(walked)) == 250 and set(walked) == {lab, *seeded}
        assert pages == 3


@pytest.mark.slow
async def test_title_and_model_changes_reach_the_client_and_the_model_option_changes_the_model(
        servers: ServerFactory) -> None:
    other = write_script(servers.root.parent / "other.json",
                         [{"when": {"last_user_contains": "hello"}, "respond": {"text": "Hello from the other model."}}])
    server = servers.make().start()
    cl = server.client()
    client = Recorder()
    async with in_process(server, client) as conn:
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(servers.root), mcp_servers=[])).session_id

        cl.update_session(sid, title="Renamed in JupyterLab")
        await asyncio.to_thread(wait_for, lambda: bool(updates(client, "session_info_update")), 10, "the new title")
        [info] = updates(client, "session_info_update")
        assert info.title == "Renamed in JupyterLab"

        changed = await conn.set_config_option(config_id="model", session_id=sid, value=other)
        [option] = changed.config_options
        assert option.current_value == other and cl.session(sid)["session"]["model"] == other
        answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("hello")]), 30)
        assert answer.stop_reason == "end_turn"
        assert client.view()["agent"][-1][1] == "Hello from the other model."  # the next turn used it
        with pytest.raises(RequestError):
            await conn.set_config_option(config_id="model", session_id=sid, value="no-such-model")
        assert cl.session(sid)["session"]["model"] == other

        cl.update_session(sid, model=servers.model)  # changed on another surface: the option follows
        await asyncio.to_thread(wait_for, lambda: bool(updates(client, "config_option_update")), 10, "the option")
        [update] = updates(client, "config_option_update")
        assert update.config_options[0].current_value == servers.model
        assert [u.title for u in updates(client, "session_info_update")][-1] == "Renamed in JupyterLab"


@pytest.mark.slow
async def test_usage_is_told_as_receipts_arrive_also_for_work_no_prompt_waits_on(servers: ServerFactory) -> None:
    """A message sent from another surface (REST, like a notebook or a Goal running on between prompts) runs
    a turn no ACP prompt waits on: its receipt reaching the ledger is told as a ``usage_update``."""
    server = servers.make().start()
    cl = server.client()
    client = Recorder()
    async with in_process(server, client) as conn:
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(servers.root), mcp_servers=[])).session_id
        assert not updates(client, "usage_update")
        cl.send(sid, "hello", client_request_id="from-rest")
        await asyncio.to_thread(cl.wait, sid)
        await asyncio.to_thread(wait_for, lambda: bool(updates(client, "usage_update")), 10, "a usage update")
        usage = updates(client, "usage_update")[-1]
        assert usage.field_meta["jupyter_goals"]["unknown_usage_requests"] == cl.usage(sid)["unknown_usage_requests"] == 1


@pytest.mark.slow
async def test_resume_asks_again_without_a_replay_and_close_leaves_the_work_running(servers: ServerFactory) -> None:
    server = servers.make().start()
    cl = server.client()
    first = Recorder()
    async with in_process(server, first) as conn:
        caps = (await conn.initialize(protocol_version=1)).agent_capabilities.session_capabilities
        assert caps.resume is not None and caps.close is not None
        sid = (await conn.new_session(cwd=str(servers.root), mcp_servers=[])).session_id
        prompt = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block("append a line")]))
        tool_call, _, _ = await asyncio.wait_for(first.asked.get(), 30)

        resumed = Recorder()
        async with in_process(server, resumed) as conn2:
            await conn2.initialize(protocol_version=1)
            answer = await conn2.resume_session(session_id=sid, cwd=str(servers.root))
            assert answer.modes.current_mode_id == "ask"
            again, _, _ = await asyncio.wait_for(resumed.asked.get(), 30)
            assert again.tool_call_id == tool_call.tool_call_id
            assert not updates(resumed, "user_message_chunk")  # no replay
            await conn2.close_session(session_id=sid)
            told = len(resumed.notes)
            [pending] = cl.approvals("pending")
            cl.approve(pending["approval_id"])  # the work goes on without the closed client
            assert (await asyncio.wait_for(prompt, 30)).stop_reason == "end_turn"
            await asyncio.to_thread(wait_for, lambda: first.view()["agent"][-1][1] == "Appended one line.", 10,
                                    "the answer in the client still following")
            assert len(resumed.notes) == told  # nothing reached the client that closed the session
    assert lines(servers.root / "out.txt") == 1


async def test_a_turn_whose_answer_hit_the_output_limit_answers_max_tokens(servers: ServerFactory) -> None:
    """The provider's stop reason is kept on the answer (``meta.stop_reason``); a turn that ended on an answer cut
    at the model's output limit answers the prompt ``max_tokens``, any other ``end_turn``."""
    cut = write_script(servers.root.parent / "cut.json", [
        {"when": {"last_user_contains": "long"}, "respond": {"text": "It goes on and on and", "stop_reason": "max_tokens"}},
        {"when": {"last_user_contains": "short"}, "respond": {"text": "Done.", "stop_reason": "end_turn"}}])
    server = servers.make(model_=cut).start()
    async with in_process(server, Recorder()) as conn:
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(servers.root), mcp_servers=[])).session_id
        answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("tell a long story")]), 30)
        assert answer.stop_reason == "max_tokens"
        answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("now a short one")]), 30)
        assert answer.stop_reason == "end_turn"
    items = server.client().session(sid)["transcript"]["items"]
    assert [i["meta"].get("stop_reason") for i in items if i["kind"] == "assistant"] == ["max_tokens", "end_turn"]


@pytest.mark.slow
async def test_a_call_still_running_replays_in_progress_and_the_snapshot_says_dispatched(
        servers: ServerFactory) -> None:
    """A session's snapshot gives each tool call's state now (the item is written ``planned``): a command
    still running reads ``dispatched``, so a client that loads the session meanwhile shows it in progress."""
    server = servers.make().start()
    cl = server.client()
    sid = cl.create_session(title="running", permissions={"mode": "bypass"})["session_id"]
    cl.send(sid, "a long one", client_request_id="long-1")

    def running_call() -> dict[str, Any] | None:
        items = cl.session(sid)["transcript"]["items"]
        return next((i for i in items if i["kind"] == "tool_call" and i["state"] == "dispatched"), None)

    await asyncio.to_thread(wait_for, lambda: running_call() is not None, 30, "the command running")
    call = running_call()
    assert call is not None and call["tool"] == "shell"
    loaded = Recorder()
    try:
        async with in_process(server, loaded) as conn:
            await conn.initialize(protocol_version=1)
            await conn.load_session(cwd=str(servers.root), session_id=sid, mcp_servers=[])
            assert loaded.view()["calls"][call["call_id"]][2] == "in_progress"
    finally:
        cl.action(sid, "stop")
    await asyncio.to_thread(cl.wait, sid, ("cancelled",), 30)
    stopped = next(i for i in cl.session(sid)["transcript"]["items"] if i["call_id"] == call["call_id"]
                   and i["kind"] == "tool_call")
    assert stopped["state"] == "cancelled"  # the call's state now, again
