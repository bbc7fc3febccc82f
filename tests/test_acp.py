"""The ACP agent (issue 29) driven by the SDK's own client side against real ``jupyter server`` processes:
in process over a socket pair, and as a real subprocess (``spawn_agent_process``) killed -9 with the server.

Runs against whichever ``agent-client-protocol`` is installed: scripts/test runs them with 0.12.x, then
with 0.11.x in a venv of their own (``.venv-acp011``). The SDK is a test dependency: nothing skips without it.
The harness (``Recorder``, ``in_process``, ``subprocess_agent``, the scripted rules) is ``tests/acpkit.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from acp import text_block
from acp.schema import EmbeddedResourceContentBlock, ResourceContentBlock, TextResourceContents

from jupyter_goals.clients.acp.agent import GoalsAgent, client_request_id
from jupyter_goals.clients.acp.commands import commands_update, parse, recovered_state, usage_update
from jupyter_goals.clients.acp.updates import TranscriptItem, item_updates, prompt_text
from jupyter_goals.host.effect_files import group_members
from jupyter_goals.testing import ServerFactory, full_passes, wait_for
from tests.acpkit import Recorder, acp_servers, in_process, subprocess_agent
from tests.servers import lines, running_shell


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    yield from acp_servers(tmp_path)


def test_transcript_items_become_acp_updates_with_durable_ids() -> None:
    user = TranscriptItem(item_id="input:w1", seq=1, kind="user", content="hi")
    tool = TranscriptItem(item_id="call:r:0", seq=2, kind="tool_call", call_id="r:0", tool="shell",
                          arguments={"command": "ls"})
    done = TranscriptItem(item_id="result:r:0", seq=3, kind="tool_result", call_id="r:0", tool="shell",
                          content="exit status: 0", state="committed")
    stopped = TranscriptItem(item_id="result:r:1", seq=4, kind="tool_result", call_id="r:1", content="cancelled", state="cancelled")
    [u] = item_updates(user)
    assert (u.session_update, u.message_id) == ("user_message_chunk", "input:w1")
    [start] = item_updates(tool)
    assert (start.tool_call_id, start.title, start.kind, start.status) == ("r:0", "shell: ls", "execute", "pending")
    assert [x.status for x in item_updates(done) + item_updates(stopped)] == ["completed", "failed"]  # type: ignore[union-attr]
    assert item_updates(TranscriptItem(item_id="g", seq=5, kind="goal_prompt", content="continue")) == []
    assert client_request_id("c", 7, "s") == client_request_id("c", 7, "s") != client_request_id("c", 8, "s")
    blocks = [text_block("look"), ResourceContentBlock(type="resource_link", name="a.py", uri="file:///a.py"),
              EmbeddedResourceContentBlock(type="resource", resource=TextResourceContents(uri="file:///b.txt", text="B"))]
    assert prompt_text(blocks) == "look\n\n[a.py](file:///a.py)\n\nfile:///b.txt:\n```\nB\n```"


@pytest.mark.slow
async def test_initialize_new_session_prompt_modes_and_list(servers: ServerFactory) -> None:
    server = servers.make().start()
    rest_made = server.client().create_session(title="made over REST", cwd=str(servers.root))["session"]["session_id"]
    client = Recorder()
    async with in_process(server, client) as conn:
        init = await conn.initialize(protocol_version=1)
        caps = init.agent_capabilities
        assert init.protocol_version == 1 and caps.load_session and init.auth_methods == []
        assert caps.prompt_capabilities.embedded_context and caps.session_capabilities.list is not None
        new = await conn.new_session(cwd=str(servers.root), mcp_servers=[])
        assert new.modes.current_mode_id == "ask" and {m.id for m in new.modes.available_modes} == {"ask", "bypass"}
        [model] = new.config_options
        assert (model.id, model.category, model.current_value) == ("model", "model", servers.model)
        assert servers.model in {o.value for o in model.options}

        answer = await asyncio.wait_for(conn.prompt(session_id=new.session_id, prompt=[text_block("hello")]), 30)
        assert answer.stop_reason == "end_turn"
        view = client.view()
        assert [text for _, text in view["user"]] == ["hello"]
        assert [text for _, text in view["agent"]] == ["Hello from the scripted model."]
        assert len(server.client().session(new.session_id)["transcript"]["items"]) == 2  # one message, one answer

        await conn.set_session_mode(session_id=new.session_id, mode_id="bypass")
        assert server.client().session(new.session_id)["session"]["permissions"]["mode"] == "bypass"
        assert client.acc.snapshot().current_mode_id == "bypass"

        listed = await conn.list_sessions(cwd=str(servers.root))
        assert [s.session_id for s in listed.sessions] == [new.session_id, rest_made]  # newest activity first
        assert (await conn.list_sessions(cwd=str(servers.root / "elsewhere"))).sessions == []

        answer = await asyncio.wait_for(conn.prompt(session_id=new.session_id, prompt=[text_block("stream it")]), 30)
        assert answer.stop_reason == "end_turn"
        streamed = [n.update for n in client.notes if n.update.session_update == "agent_message_chunk"][1:]
        assert len(streamed) > 1 and "".join(u.content.text for u in streamed) == "Streaming one piece at a time."

        answer = await asyncio.wait_for(conn.prompt(session_id=new.session_id, prompt=[text_block("plan it")]), 30)
        assert client.view()["plan"] == [("read the data", "medium", "in_progress"), ("write the report", "high", "pending")]

    replayed = Recorder()  # a new agent (another connection) loads what the first one showed live
    async with in_process(server, replayed) as conn:
        await conn.initialize(protocol_version=1)
        loaded = await conn.load_session(cwd=str(servers.root), session_id=new.session_id, mcp_servers=[])
        assert loaded.modes.current_mode_id == "bypass"
        live = client.view()
        assert replayed.view() == live  # messages, answers and tool calls with their final state


@pytest.mark.slow
async def test_a_prompt_whose_answer_was_lost_is_sent_again_and_makes_one_message(servers: ServerFactory) -> None:
    server = servers.make().start()
    agent = GoalsAgent(server.url, server.token)
    real_post = agent.post
    lost: list[str] = []

    async def post_losing_the_first_answer(path: str, body: dict[str, Any], method: str = "POST") -> Any:
        answer = await real_post(path, body, method)
        if path.endswith("/messages") and not lost:
            lost.append(body["client_request_id"])
            raise httpx.ReadError("the connection dropped after the server committed the message")
        return answer

    agent.post = post_losing_the_first_answer  # type: ignore[method-assign]
    client = Recorder()
    async with in_process(server, client, agent) as conn:
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(servers.root), mcp_servers=[])
        answer = await asyncio.wait_for(conn.prompt(session_id=new.session_id, prompt=[text_block("hello")]), 30)
        assert answer.stop_reason == "end_turn" and lost
    items = server.client().session(new.session_id)["transcript"]["items"]
    assert [i["kind"] for i in items] == ["user", "assistant"]  # one message, answered once
    assert [t for _, t in client.view()["user"]] == ["hello"]


@pytest.mark.slow
async def test_cancel_is_stop_within_two_seconds_and_kills_the_command(servers: ServerFactory) -> None:
    server = servers.make().start()
    client = Recorder()
    async with in_process(server, client) as conn:
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(servers.root), mcp_servers=[])
        await conn.set_session_mode(session_id=new.session_id, mode_id="bypass")
        prompt = asyncio.create_task(conn.prompt(session_id=new.session_id, prompt=[text_block("long")]))
        effect_dir = await asyncio.to_thread(running_shell, servers.state, new.session_id)
        await asyncio.to_thread(wait_for, lambda: any(c.status == "in_progress" for c in client.acc.snapshot().tool_calls.values()),
                                10, "the tool call in progress")
        started = time.monotonic()
        await conn.cancel(session_id=new.session_id)
        answer = await asyncio.wait_for(prompt, 5)
        assert answer.stop_reason == "cancelled"
        assert time.monotonic() - started < 2.0
        await asyncio.to_thread(wait_for, lambda: not group_members(effect_dir), 10, "the command's process group gone")
        snap = server.client().session(new.session_id)
        assert (snap["work"]["phase"], snap["work"]["desired_state"]) == ("cancelled", "cancelled")
        [status] = [c.status for c in client.acc.snapshot().tool_calls.values()]
        assert status == "failed"
        await asyncio.to_thread(wait_for, lambda: "Stopped" in client.view()["agent"][-1][1], 5, "the Stop marker")
        before = client.view()
        second = asyncio.create_task(conn.prompt(session_id=new.session_id, prompt=[text_block("long again")]))
        await asyncio.to_thread(wait_for, lambda: len(client.acc.snapshot().tool_calls) == 2, 10, "the second call")

        other = Recorder()  # another client loads the session while the command runs, and cancels it there
        async with in_process(server, other) as conn2:
            await conn2.initialize(protocol_version=1)
            await conn2.load_session(cwd=str(servers.root), session_id=new.session_id, mcp_servers=[])
            assert {k: v for k, v in other.view()["calls"].items() if k in before["calls"]} == before["calls"]
            assert other.view()["agent"][: len(before["agent"])] == before["agent"]  # the Stop marker replayed
            effect_dir = await asyncio.to_thread(running_shell, servers.state, new.session_id)
            started = time.monotonic()
            await conn2.cancel(session_id=new.session_id)
            assert (await asyncio.wait_for(second, 5)).stop_reason == "cancelled"  # the first client's prompt
            assert time.monotonic() - started < 2.0
            await asyncio.to_thread(wait_for, lambda: not group_members(effect_dir), 10, "the process group gone")
    server.kill()
    server = servers.make().start()
    await asyncio.to_thread(full_passes, server, 2)
    snap = server.client().session(new.session_id)
    assert (snap["work"]["phase"], snap["work"]["desired_state"]) == ("cancelled", "cancelled")  # stays stopped
    assert lines(servers.root / "long.txt") == 0


@pytest.mark.slow
async def test_allow_always_adds_a_session_rule_and_an_answer_elsewhere_withdraws_the_question(
        servers: ServerFactory) -> None:
    server = servers.make().start()
    cl = server.client()
    client = Recorder()
    async with in_process(server, client) as conn:
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(servers.root), mcp_servers=[])
        first = asyncio.create_task(conn.prompt(session_id=new.session_id, prompt=[text_block("append one")]))
        call_1, _, answer = await asyncio.wait_for(client.asked.get(), 30)
        [pending] = cl.approvals("pending")
        cl.approve(pending["approval_id"])  # answered over REST: the ACP question is withdrawn
        assert (await asyncio.wait_for(first, 30)).stop_reason == "end_turn"
        withdrawn = [n.update for n in client.notes if n.update.session_update == "tool_call_update"
                     and n.update.field_meta and "jupyter_goals" in n.update.field_meta]
        assert [u.field_meta["jupyter_goals"]["decision"] for u in withdrawn] == ["approved"]
        answer.set_result("reject_once")  # too late: changes nothing
        assert lines(servers.root / "out.txt") == 1

        second = asyncio.create_task(conn.prompt(session_id=new.session_id, prompt=[text_block("append two")]))
        call_2, _, answer = await asyncio.wait_for(client.asked.get(), 30)
        assert call_2.tool_call_id != call_1.tool_call_id
        answer.set_result("allow_always")
        assert (await asyncio.wait_for(second, 30)).stop_reason == "end_turn"
        assert "shell" in cl.session(new.session_id)["session"]["permissions"]["allow"]  # listed, revocable over REST
        third = await asyncio.wait_for(conn.prompt(session_id=new.session_id, prompt=[text_block("append three")]), 30)
        assert third.stop_reason == "end_turn" and client.asked.empty()  # not asked again
    assert lines(servers.root / "out.txt") == 3


@pytest.mark.slow
async def test_pending_permission_survives_kill_of_server_and_agent_and_runs_once(servers: ServerFactory,
                                                                                   tmp_path: Path) -> None:
    server = servers.make().start()
    live = Recorder()
    async with subprocess_agent(server, live, tmp_path / "agent1.log") as (conn, proc):
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(servers.root), mcp_servers=[])
        session_id = new.session_id
        prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[text_block("append a line")]))
        tool_call, options, _ = await asyncio.wait_for(live.asked.get(), 30)
        assert {o.kind for o in options} >= {"allow_once", "reject_once"}
        before_kill = live.view()
        assert before_kill["user"][0][1] == "append a line" and [t for _, t in before_kill["agent"]] == ["Appending."]
        assert before_kill["calls"][tool_call.tool_call_id][2] == "pending"
        server.kill()
        proc.kill()  # SIGKILL
        await proc.wait()
        prompt.cancel()
        await asyncio.gather(prompt, return_exceptions=True)
    assert lines(servers.root / "out.txt") == 0

    server = servers.make().start()
    loaded = Recorder()
    async with subprocess_agent(server, loaded, tmp_path / "agent2.log") as (conn, _proc):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(servers.root), session_id=session_id, mcp_servers=[])
        assert loaded.view() == before_kill  # the replay rebuilds the live conversation, tool call included
        again, _, answer = await asyncio.wait_for(loaded.asked.get(), 30)
        assert again.tool_call_id == tool_call.tool_call_id
        answer.set_result("allow_once")
        await asyncio.to_thread(server.client().wait, session_id, ("done",), 30)
        await asyncio.to_thread(wait_for, lambda: loaded.view()["calls"][again.tool_call_id][2] == "completed",
                                10, "the approved call completed in the client")
        # the answer after the call streams after the call's completion: wait for it, do not race it
        await asyncio.to_thread(wait_for, lambda: [t for _, t in loaded.view()["agent"]][-1:] == ["Appended one line."],
                                10, "the answer after the call in the client")
    assert lines(servers.root / "out.txt") == 1


def test_commands_are_parsed_and_recovered_state_and_usage_are_worded() -> None:
    assert parse("/goal Write it\nfile_exists: a.txt") == ("goal", "Write it", "file_exists: a.txt")
    assert parse("/pause") == ("pause", "", "") and parse("/unknown x") is None and parse("hello /goal") is None
    assert [c.name for c in commands_update().available_commands] == ["goal", "pause", "resume", "stop", "verify"]
    work = {"work_id": "w", "phase": "paused", "desired_state": "paused", "reason": "Paused by you."}
    assert recovered_state({"work": work}) == "Recovered state: paused - Paused by you."
    waiting = {"work": {**work, "phase": "waiting", "reason": ""}, "approvals": [{"state": "pending"}]}
    assert recovered_state(waiting) == "Recovered state: waiting for your approval."
    assert recovered_state({"work": {**work, "phase": "done"}}) is None
    known = {"known_tokens": {"input": 10, "output": 5, "cached": 0}, "known_cost_usd": 0.5,
             "unknown_usage_requests": 0, "display": "$0.50"}
    update = usage_update(known, 1000)
    assert (update.used, update.size, update.cost.amount, update.cost.currency) == (15, 1000, 0.5, "USD")
    unknown = usage_update({**known, "known_cost_usd": None}, None)
    assert unknown.cost is None and unknown.field_meta["jupyter_goals"]["cost"] == "unknown"
    partly = usage_update({**known, "unknown_usage_requests": 1}, None)
    assert partly.cost is None and partly.field_meta["jupyter_goals"]["cost"] == "unknown"  # never a partial sum
    assert usage_update({**known, "known_tokens": None}, None) is None


@pytest.mark.slow
async def test_commands_start_a_goal_control_the_work_and_a_load_tells_the_recovered_state(
        servers: ServerFactory) -> None:
    server = servers.make().start()
    cl = server.client()
    client = Recorder()
    async with in_process(server, client) as conn:
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(servers.root), mcp_servers=[])
        sid = new.session_id
        await asyncio.to_thread(wait_for, lambda: bool(client.notes) and len(client.acc.snapshot().available_commands) == 5,
                                10, "the commands")
        assert [c.name for c in client.acc.snapshot().available_commands] == ["goal", "pause", "resume", "stop", "verify"]

        async def command(text: str) -> tuple[str, str]:
            answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block(text)]), 30)
            return answer.stop_reason, client.said()

        assert await command("/goal status") == ("end_turn", "No Goal in this session yet: start one with /goal <objective>.")
        reason, text = await command("/pause")
        assert reason == "refusal" and text.startswith("Cannot pause now")

        answer = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("hello")]), 30)
        assert answer.stop_reason == "end_turn"
        await asyncio.to_thread(wait_for, lambda: bool(client.usage()), 10, "the usage after the turn")
        usage = client.usage()[-1]  # from GET /usage once the ledger has the turn's receipt
        meta = usage.field_meta["jupyter_goals"]
        ledger = cl.usage(sid)
        assert ledger["unknown_usage_requests"] == meta["unknown_usage_requests"] == 1  # the scripted model reports none
        assert usage.cost is None and meta["cost"] == "unknown"  # never a 0 for an unknown cost
        assert usage.used == meta["known_tokens"]["input"] + meta["known_tokens"]["output"] == 0

        reason, text = await command("/goal Do the long task\nfile_exists: long.txt\nthe task is done")
        assert reason == "end_turn" and text.startswith("Goal started: Do the long task")
        [goal] = cl.goals(sid)
        assert [(r["kind"], r["text"]) for r in goal["requirements"]] == [("file_exists", "long.txt exists"),
                                                                        ("semantic", "the task is done")]
        reason, text = await command("/goal status")
        assert reason == "end_turn" and "Goal: Do the long task" in text and "State: active" in text
        assert "- long.txt exists: not checked yet" in text and "- the task is done: not checked yet" in text

        await asyncio.wait_for(client.asked.get(), 30)  # the Goal's shell command waits for approval
        other = Recorder()
        async with in_process(server, other) as conn2:
            await conn2.initialize(protocol_version=1)
            await conn2.load_session(cwd=str(servers.root), session_id=sid, mcp_servers=[])
            assert other.recovered() == ["_Recovered state: waiting for your approval - A tool call is waiting for your approval._"]
            assert len(other.acc.snapshot().available_commands) == 5

        reason, text = await command("/pause")
        assert (reason, text) == ("end_turn", "Pause committed: the work is paused.")
        assert cl.session(sid)["work"]["desired_state"] == "paused"
        reason, text = await command("/pause")
        assert reason == "refusal" and text.startswith("Cannot pause now: the work is paused")
        other = Recorder()
        async with in_process(server, other) as conn2:
            await conn2.initialize(protocol_version=1)
            await conn2.load_session(cwd=str(servers.root), session_id=sid, mcp_servers=[])
            [told] = other.recovered()
            assert told.startswith("_Recovered state: paused")
        reason, text = await command("/verify")
        assert (reason, text) == ("refusal", "Cannot verify this Goal now: it is paused (working) - You paused this work.")
        reason, text = await command("/resume")
        assert reason == "end_turn" and text.startswith("Resume committed")
        reason, text = await command("/stop")
        assert reason == "end_turn" and text.startswith("Stop committed")
        await asyncio.to_thread(cl.wait, sid, ("cancelled",), 30)
        reason, text = await command("/stop")
        assert reason == "refusal"
        other = Recorder()
        async with in_process(server, other) as conn2:
            await conn2.initialize(protocol_version=1)
            await conn2.load_session(cwd=str(servers.root), session_id=sid, mcp_servers=[])
            [told] = other.recovered()
            assert told.startswith("_Recovered state: stopped")
        assert not any(n.update.session_update == "user_message_chunk" and "/goal" in n.update.content.text
                       for n in client.notes)  # a command is not a chat message
