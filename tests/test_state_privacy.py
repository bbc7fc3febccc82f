"""The state dir is private and no log holds a secret (issue 16 item 4), on a real server.

A fresh state dir; a chat whose model is an OpenAI-compatible server reached with a key from the
environment, which runs a shell command; REST requests with the token in a header and in a URL. Then
the modes on disk and every log are read: the server's (its workers write to the same stream) at DEBUG.
"""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import httpx
import pytest

from tests.openai_server import OpenAITestServer, ToolCallPlan, openai_usage
from tests.servers import server_env

pytestmark = pytest.mark.slow


def test_a_fresh_state_dir_is_private_and_no_log_holds_the_token_or_a_provider_key(tmp_path: Path) -> None:
    key = f"sk-test-{uuid.uuid4().hex}"
    with OpenAITestServer() as api, server_env(tmp_path, []) as env:
        api.plan(tool_calls=[ToolCallPlan("shell", {"command": "echo ran >> out.txt"})], usage_chunks=[openai_usage(5, 2)])
        api.plan(text_chunks=["Done."], usage_chunks=[openai_usage(7, 1)])
        state = env["state"]
        assert not state.exists()  # the server creates it
        server = env["make"](["--ServerApp.log_level=DEBUG"],
                             env={"OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": key}).start()
        cl = server.client()
        sid = str(cl.create_session(title="private", cwd=str(env["root"]), model="openai:test-model",
                                    permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run it", client_request_id="r1")
        snap = cl.wait(sid, timeout=60)
        assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "Done."
        assert (env["root"] / "out.txt").read_text() == "ran\n"  # the tool call ran
        assert {r.headers.get("authorization") for r in api.completion_requests} == {f"Bearer {key}"}  # the key was used
        cl.events(0, 100)
        cl.usage(session_id=sid)
        cl.approvals()
        for path, status in ((f"api/goals/sessions/{sid}", 200), ("api/goals/sessions/nope", 404), ("api/goals/health", 200)):
            assert httpx.get(f"{server.url}{path}?token={server.token}", timeout=10).status_code == status
        assert httpx.get(f"{server.url}api/goals/sessions", headers={"Authorization": "token wrong"},
                         timeout=10).status_code in (401, 403)

        mode = stat.S_IMODE(state.stat().st_mode)
        assert mode == 0o700, oct(mode)
        top = [f for f in state.iterdir() if f.is_file()]
        assert {"control.db", "usage.db", "server_config.json"} <= {f.name for f in top}
        loose = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in top if f.stat().st_mode & 0o077}
        assert loose == {}
        server.stop()  # a graceful exit: everything the server and its workers log is flushed

    logs = sorted(tmp_path.rglob("*.log"))
    assert server.log_path in logs
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    assert "GET /api/goals/sessions" in text  # DEBUG logging saw the requests
    assert server.token not in text
    assert key not in text
