"""The ACP agent's acceptance after a crash of one side only, and a Stop given after a ``session/load``:
the pending permission request is asked again with the same ``toolCallId`` and ``allow_once`` runs the
write exactly once (lines counted on disk); a Stop settles the question as cancelled for good.

Real ``jupyter server`` processes, the agent as a real subprocess (``spawn_agent_process``) or in process,
the SDK's own client side; the model is the scripted one of ``tests/acpkit.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from acp import text_block

from jupyter_goals.testing import ServerFactory, full_passes, wait_for
from tests.acpkit import Recorder, acp_servers, in_process, subprocess_agent
from tests.servers import lines


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    yield from acp_servers(tmp_path)


def status(client: Recorder, call_id: str) -> str | None:
    view = client.view()["calls"].get(call_id)
    return view[2] if view else None


@pytest.mark.slow
async def test_pending_permission_survives_kill_of_the_agent_alone_and_runs_once(servers: ServerFactory,
                                                                                 tmp_path: Path) -> None:
    server = servers.make().start()
    cl = server.client()
    live = Recorder()
    async with subprocess_agent(server, live, tmp_path / "agent1.log") as (conn, proc):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(servers.root), mcp_servers=[])).session_id
        prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[text_block("append a line")]))
        tool_call, _, _ = await asyncio.wait_for(live.asked.get(), 30)
        before_kill = live.view()
        proc.kill()  # SIGKILL of the agent only: the server and its work go on
        await proc.wait()
        prompt.cancel()
        await asyncio.gather(prompt, return_exceptions=True)
    [pending] = cl.approvals("pending")
    assert pending["call_id"] == tool_call.tool_call_id and lines(servers.root / "out.txt") == 0

    loaded = Recorder()
    async with subprocess_agent(server, loaded, tmp_path / "agent2.log") as (conn, _proc):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(servers.root), session_id=session_id, mcp_servers=[])
        assert loaded.view() == before_kill
        again, _, answer = await asyncio.wait_for(loaded.asked.get(), 30)
        assert again.tool_call_id == tool_call.tool_call_id
        answer.set_result("allow_once")
        await asyncio.to_thread(cl.wait, session_id, ("done",), 30)
        await asyncio.to_thread(wait_for, lambda: status(loaded, again.tool_call_id) == "completed", 10,
                                "the approved call completed in the client")
    assert lines(servers.root / "out.txt") == 1
    assert [a["state"] for a in cl.approvals(None)] == ["consumed"]  # approved once, used once


@pytest.mark.slow
async def test_pending_permission_survives_kill_of_the_server_alone_and_runs_once(servers: ServerFactory,
                                                                                  tmp_path: Path) -> None:
    server = servers.make().start()
    client = Recorder()
    async with subprocess_agent(server, client, tmp_path / "agent.log") as (conn, proc):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(servers.root), mcp_servers=[])).session_id
        prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[text_block("append a line")]))
        tool_call, _, stale = await asyncio.wait_for(client.asked.get(), 30)
        before_kill = client.view()
        server.kill()  # SIGKILL of the server and its workers; the agent process lives on
        assert lines(servers.root / "out.txt") == 0
        await asyncio.to_thread(server.start, same_port=True)  # where the agent points

        await conn.load_session(cwd=str(servers.root), session_id=session_id, mcp_servers=[])
        again, _, answer = await asyncio.wait_for(client.asked.get(), 30)
        assert again.tool_call_id == tool_call.tool_call_id
        assert client.view()["calls"][again.tool_call_id] == before_kill["calls"][again.tool_call_id]
        answer.set_result("allow_once")
        # the prompt sent before the crash is answered once its work is done (it moved to the loaded feed)
        assert (await asyncio.wait_for(prompt, 30)).stop_reason == "end_turn"
        await asyncio.to_thread(wait_for, lambda: status(client, again.tool_call_id) == "completed", 10,
                                "the approved call completed in the client")
        stale.set_result("allow_once")  # the question asked before the crash: void, changes nothing
        assert proc.returncode is None
    cl = server.client()
    await asyncio.to_thread(full_passes, server, 2)
    assert lines(servers.root / "out.txt") == 1
    assert [a["state"] for a in cl.approvals(None)] == ["consumed"]  # approved once, used once
    assert [i["kind"] for i in cl.session(session_id)["transcript"]["items"]].count("user") == 1


@pytest.mark.slow
async def test_cancel_after_a_load_settles_the_pending_permission_as_cancelled(servers: ServerFactory) -> None:
    server = servers.make().start()
    cl = server.client()
    first = Recorder()
    async with in_process(server, first) as conn:
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(servers.root), mcp_servers=[])).session_id
        prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[text_block("append a line")]))
        tool_call, _, _ = await asyncio.wait_for(first.asked.get(), 30)
        prompt.cancel()  # the editor goes away with its question open
        await asyncio.gather(prompt, return_exceptions=True)

    loaded = Recorder()
    async with in_process(server, loaded) as conn:
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(servers.root), session_id=session_id, mcp_servers=[])
        again, _, answer = await asyncio.wait_for(loaded.asked.get(), 30)
        assert again.tool_call_id == tool_call.tool_call_id and status(loaded, again.tool_call_id) == "pending"
        started = time.monotonic()
        await conn.cancel(session_id=session_id)
        await asyncio.to_thread(wait_for, lambda: status(loaded, again.tool_call_id) == "failed", 10,
                                "the asked call settled")
        assert time.monotonic() - started < 2.0

        def withdrawn() -> list[str]:
            return [n.update.field_meta["jupyter_goals"]["withdrawn"] for n in loaded.notes
                    if n.update.session_update == "tool_call_update" and n.update.field_meta
                    and "withdrawn" in n.update.field_meta.get("jupyter_goals", {})]

        # the question is withdrawn too (its approval.invalidated event may come after the Stop's settle)
        await asyncio.to_thread(wait_for, lambda: withdrawn() == ["approval.invalidated"], 10, "the withdrawal")
        answer.set_result("allow_once")  # an answer after the Stop changes nothing
        await asyncio.to_thread(cl.wait, session_id, ("cancelled",), 30)
        seen = loaded.view()

    replayed = Recorder()  # the stopped call is replayed failed, never pending
    async with in_process(server, replayed) as conn:
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(servers.root), session_id=session_id, mcp_servers=[])
        assert replayed.view() == seen and status(replayed, tool_call.tool_call_id) == "failed"
        [told] = replayed.recovered()
        assert told.startswith("_Recovered state: stopped")
        assert replayed.asked.empty()

    server.kill()
    server = servers.make().start()
    await asyncio.to_thread(full_passes, server, 2)
    snap = server.client().session(session_id)
    assert (snap["work"]["phase"], snap["work"]["desired_state"]) == ("cancelled", "cancelled")
    assert [a["state"] for a in server.client().approvals(None)] == ["invalidated"]
    assert lines(servers.root / "out.txt") == 0
