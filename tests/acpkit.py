"""The ACP tests' shared harness (``tests/test_acp*.py``): the scripted model's rules, an ACP client that
records every update (``Recorder``), and the agent driven in process over a socket pair or as a real
subprocess (``spawn_agent_process``) by the SDK's own client side."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from acp import connect_to_agent, run_agent, spawn_agent_process
from acp.contrib.session_state import SessionAccumulator
from acp.schema import (
    AllowedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    SessionNotification,
    ToolCallUpdate,
)

from jupyter_goals.clients.acp.agent import GoalsAgent
from jupyter_goals.testing import ServerFactory, ServerProcess


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


RULES: list[dict[str, Any]] = [
    {"when": {"last_tool_result_contains": "denied by the user"}, "respond": {"text": "Understood, not done."}},
    {"when": {"last_user_contains": "append", "last_tool_result_contains": "exit status: 0"},
     "respond": {"text": "Appended one line."}},
    {"when": {"last_user_contains": "append"},
     "respond": {"text": "Appending.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo line >> out.txt"}}]}},
    {"when": {"last_user_contains": "long", "last_tool_result_contains": "exit status"}, "respond": {"text": "Long done."}},
    {"when": {"last_user_contains": "long"}, "respond": call("shell", command="sleep 60; echo line >> long.txt")},
    {"when": {"last_user_contains": "hello"}, "respond": {"text": "Hello from the scripted model."}},
    {"when": {"last_user_contains": "plan it", "last_tool_result_contains": "todo version"}, "respond": {"text": "Planned."}},
    {"when": {"last_user_contains": "plan it"},
     "respond": call("todo_write", items=[{"text": "read the data", "status": "in_progress", "required": False},
                                          {"text": "write the report", "status": "pending", "required": True}])},
    {"when": {"last_user_contains": "stream"},
     "respond": {"stream_chunks": ["Streaming ", "one ", "piece ", "at a time."], "chunk_delay_s": 0.25}},
]


class Recorder:
    """An ACP client: every ``session/update`` goes into a ``SessionAccumulator``; permission requests
    wait in a queue for the test to answer."""

    def __init__(self) -> None:
        self.acc = SessionAccumulator()
        self.notes: list[SessionNotification] = []
        self.asked: asyncio.Queue[tuple[ToolCallUpdate, list[PermissionOption], asyncio.Future[str]]] = asyncio.Queue()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        note = SessionNotification(session_id=session_id, update=update)
        self.notes.append(note)
        self.acc.apply(note)

    async def request_permission(self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption],
                                 **kwargs: Any) -> RequestPermissionResponse:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        await self.asked.put((tool_call, options, answer))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=await answer))

    def on_connect(self, conn: Any) -> None:
        pass

    def view(self) -> dict[str, Any]:
        """The conversation as a person sees it: messages joined per message id, tool calls' final state."""
        snap = self.acc.snapshot()

        def joined(chunks: Any) -> list[tuple[str | None, str]]:
            out: dict[str | None, str] = {}
            for c in chunks:
                out[c.message_id] = out.get(c.message_id, "") + c.content.text
            return list(out.items())

        calls = {k: (v.title, v.kind, v.status, v.raw_input, v.raw_output) for k, v in snap.tool_calls.items()}
        plan = [(e.content, e.priority, e.status) for e in snap.plan_entries]
        agent = [(i, t) for i, t in joined(snap.agent_messages) if not str(i).startswith("recovered:")]
        return {"user": joined(snap.user_messages), "agent": agent, "calls": calls, "plan": plan}

    def recovered(self) -> list[str]:
        """The recovered state told after a load (not part of the conversation itself)."""
        return [c.content.text.strip() for c in self.acc.snapshot().agent_messages
                if str(c.message_id).startswith("recovered:")]

    def said(self) -> str:
        """The last agent message's text (a command's answer)."""
        return client_text(self.acc.snapshot().agent_messages[-1])

    def usage(self) -> list[Any]:
        return [n.update for n in self.notes if n.update.session_update == "usage_update"]


def client_text(chunk: Any) -> str:
    return str(chunk.content.text)



@asynccontextmanager
async def in_process(server: ServerProcess, client: Recorder, agent: GoalsAgent | None = None) -> AsyncIterator[Any]:
    """The agent and the SDK's client side in this process, over a socket pair."""
    agent = agent or GoalsAgent(server.url, server.token)
    a, b = socket.socketpair()
    agent_reader, agent_writer = await asyncio.open_connection(sock=a)
    client_reader, client_writer = await asyncio.open_connection(sock=b)
    task = asyncio.create_task(run_agent(agent, agent_writer, agent_reader, observers=[agent.observe],
                                         use_unstable_protocol=True))
    conn = connect_to_agent(client, client_writer, client_reader, use_unstable_protocol=True)  # type: ignore[arg-type]
    try:
        yield conn
    finally:
        # the agent first, so it sends nothing more; then the client's receive loop reads to the end of the
        # socket before the client closes: the SDK's close shuts its message queue before it cancels that
        # loop, and a notification read in between raised "message queue already closed" (SDK 0.11, in CI)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await agent.close()
        agent_writer.close()
        receiving = getattr(getattr(conn, "_conn", None), "_recv_task", None)
        if receiving is not None:
            await asyncio.wait({receiving}, timeout=10)
        await conn.close()


@asynccontextmanager
async def subprocess_agent(server: ServerProcess, client: Recorder, log: Path) -> AsyncIterator[tuple[Any, Any]]:
    """``python -m jupyter_goals.acp`` as a real process (stderr to a file: stdout is JSON-RPC only)."""
    err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        async with spawn_agent_process(client, sys.executable, "-m", "jupyter_goals.acp", "--url", server.url,  # type: ignore[arg-type]
                                       "--token", server.token, "--log-level", "INFO",
                                       transport_kwargs={"stderr": err}) as (conn, proc):
            yield conn, proc
    finally:
        os.close(err)


def acp_servers(tmp_path: Path) -> Iterator[ServerFactory]:
    """The body of each ACP test module's ``servers`` fixture: servers on one state dir with ``RULES``."""
    factory = ServerFactory(tmp_path, RULES)
    try:
        yield factory
    finally:
        factory.close()
