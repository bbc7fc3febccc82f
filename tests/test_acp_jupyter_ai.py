"""Jupyter AI's own ACP client drives the Goals agent (issue 29 item 9): with ``jupyter_goals[jupyter-ai]``
installed, the persona is found through its ``jupyter_ai.personas`` entry point, its real
``_init_agent_subprocess`` (ours over ``BaseAcpPersona``'s) starts the agent with the server's URL and token,
and ``jupyter-ai-acp-client``'s ``JaiAcpClient`` creates a session and runs prompts against a real
``jupyter server``: the answer is written into a real ``YChat``, the session and its messages are durable on
the server, and a write asked for in ``ask`` waits for a permission that JaiAcpClient's permission manager
answers once.

Runs where Jupyter AI is installed: ``scripts/test`` runs it in the second venv (``.venv-acp011``, the SDK
0.11.x that jupyter-ai-acp-client 0.3 pins) and leaves it out of the main run, which has SDK 0.12.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest

if importlib.util.find_spec("jupyter_ai_acp_client") is None:
    if os.environ.get("CI"):  # scripts/test runs this module only in .venv-acp011, where the extra is installed
        raise ImportError("jupyter-ai-acp-client is not installed: pip install 'jupyter_goals[jupyter-ai]'")
    pytest.skip("run by scripts/test in .venv-acp011 (pip install 'jupyter_goals[jupyter-ai]')",
                allow_module_level=True)

from jupyter_ai_acp_client.default_acp_client import JaiAcpClient  # noqa: E402
from jupyterlab_chat.ychat import YChat  # noqa: E402

from .servers import ServerFactory  # noqa: E402

pytestmark = pytest.mark.slow  # a real server and the agent as a subprocess

RULES: list[dict[str, Any]] = [
    {"when": {"last_user_contains": "hello"}, "respond": {"text": "Hello from a durable session."}},
    {"when": {"last_tool_result_contains": "wrote"}, "respond": {"text": "Written once."}},
    {"when": {"last_user_contains": "write"},
     "respond": {"tool_calls": [{"name": "write_file", "arguments": {"path": "jai.txt", "content": "x"}}]}},
]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path, RULES)
    try:
        yield factory
    finally:
        factory.close()


def persona_class() -> Any:
    [entry] = [ep for ep in importlib.metadata.entry_points(group="jupyter_ai.personas") if ep.name == "goals-acp"]
    return entry.load()


def chat_persona(root: Path) -> Any:
    """Jupyter AI's side of one chat: a real YChat; the persona's awareness and status calls are recorded."""
    persona = MagicMock()
    persona.id = "jupyter-ai-personas::jupyter_goals::GoalsAcpPersona"
    persona.log = logging.getLogger("test.persona")
    persona.chat = YChat()
    persona.get_chat_dir.return_value = str(root)
    return persona


def chat_text(persona: Any) -> str:
    return "\n".join(m.body for m in persona.chat.get_messages())


async def test_jupyter_ais_client_runs_prompts_through_the_goals_persona(servers: ServerFactory) -> None:
    from jupyter_ai_acp_client.base_acp_persona import BaseAcpPersona

    from jupyter_goals.clients.acp.persona import agent_command

    server = servers.make().start()
    cls = persona_class()
    assert issubclass(cls, BaseAcpPersona)

    # the persona's own subprocess start, with the server app Jupyter AI's extension would be under
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    ready.set_result(None)
    serverapp = SimpleNamespace(connection_url=server.url, identity_provider=SimpleNamespace(token=server.token), sock="")

    class Started(cls):  # type: ignore[misc, valid-type]
        """The persona as Jupyter AI's persona manager would hold it, without a chat (only its start runs)."""

        parent = SimpleNamespace(parent=SimpleNamespace(serverapp=serverapp))  # persona manager → Jupyter AI app
        log = logging.getLogger("test.persona")

        def __init__(self) -> None:  # BasePersona's needs a YChat and a persona manager
            self._before_subprocess_future = ready
            self._executable = agent_command()

    proc = await Started()._init_agent_subprocess()
    try:
        client = JaiAcpClient(agent_subprocess=proc, event_loop=loop)
        caps = await asyncio.wait_for(client.get_agent_capabilities(), 30)
        assert caps.load_session

        persona = chat_persona(servers.root)
        session = await asyncio.wait_for(client.create_session(persona), 30)
        rest = server.client()
        assert rest.session(session.session_id)["session"]["cwd"] == str(servers.root)

        answer = await asyncio.wait_for(client.prompt_and_reply(session.session_id, "hello there"), 60)
        assert answer.stop_reason == "end_turn"
        assert "Hello from a durable session." in chat_text(persona)
        kinds = [(i["kind"], i["content"]) for i in rest.session(session.session_id)["transcript"]["items"]]
        assert ("user", "hello there") in kinds and ("assistant", "Hello from a durable session.") in kinds

        # a write in ask: JaiAcpClient's permission manager holds the question; answering it runs the write once
        prompt = asyncio.ensure_future(client.prompt_and_reply(session.session_id, "write the file"))
        manager = client._permission_manager

        def pending() -> list[tuple[str, str]]:
            return [(sid, tcid) for (sid, tcid) in manager._pending if sid == session.session_id]

        for _ in range(600):  # the loop must run meanwhile: the prompt and the agent's question go through it
            if pending():
                break
            await asyncio.sleep(0.05)
        [(sid, tool_call_id)] = pending()
        [approval] = await asyncio.to_thread(rest.approvals)
        assert client.resolve_permission(sid, tool_call_id, "allow_once")  # what its REST route calls on a click
        done = await asyncio.wait_for(prompt, 60)
        assert done.stop_reason == "end_turn"
        assert (servers.root / "jai.txt").read_text() == "x"
        assert rest.approvals("consumed")[0]["approval_id"] == approval["approval_id"]
        assert "Written once." in chat_text(persona)
    finally:
        proc.kill()
        await proc.wait()
