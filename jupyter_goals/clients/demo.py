"""``jupyter goals demo``: watch a chat survive ``kill -9`` of its server, offline.

Starts a real ``jupyter server`` with the extension on a fresh state dir and the bundled scripted
demo model, asks for the "slow" command (``sleep 10; date >> slow-demo.log``), kills the server's
whole process group while the command runs (the detached command lives on, as after a crash), starts
the server again and, without any request from this client, the chat reconnects the command, commits
its real result and finishes. The log file gets exactly one line.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from jupyter_goals.clients.rest import GoalsClient
from jupyter_goals.server.app import demo_model
from jupyter_goals.testing.servers import ServerProcess


def _say(text: str) -> None:
    print(text, flush=True)


def _wait(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = cond()
        if found:
            return found
        time.sleep(0.2)
    raise TimeoutError(what)


def run_demo(directory: str | None = None) -> int:
    base = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="jupyter-goals-demo-"))
    workspace = base / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(base / "state", workspace, model=demo_model())
    out = workspace / "slow-demo.log"
    try:
        _say(f"1. Starting jupyter server with jupyter_goals (state in {base / 'state'}) ...")
        server.start()
        client = GoalsClient(server.url, server.token)
        sid = client.create_session(title="crash demo", cwd=str(workspace),
                                    permissions={"mode": "bypass"})["session"]["session_id"]
        client.send(sid, "run something slow", client_request_id="demo-1")
        _say("2. Asked the demo model to run `sleep 10; date >> slow-demo.log` ...")

        def dispatched() -> bool:
            items = client.session(sid)["transcript"]["items"]
            return any(i["kind"] == "tool_call" for i in items)

        _wait(dispatched, 60, "the command to start")
        time.sleep(1.0)
        server.kill()
        client.close()
        _say("3. kill -9 of the server and its workers while the command runs.")
        time.sleep(1.0)
        _say("4. Starting the server again; this client sends nothing more ...")
        server.start()
        client = GoalsClient(server.url, server.token)
        snap = client.wait(sid, timeout=90)
        client.close()
        _say(f"5. The chat finished by itself: phase {snap['work']['phase']}. Transcript:")
        for item in snap["transcript"]["items"]:
            text = str(item.get("content") or item.get("tool") or "").strip().replace("\n", " ")
            _say(f"   [{item['kind']}] {text[:100]}")
        lines = out.read_text().splitlines() if out.exists() else []
        _say(f"6. {out.name} has {len(lines)} line(s): the command ran exactly once, and was reconnected, not rerun.")
        return 0 if snap["work"]["phase"] == "done" and len(lines) == 1 else 1
    except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
        print(f"error: the demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        server.kill()
