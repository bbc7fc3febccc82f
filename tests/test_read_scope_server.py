"""Built-in reads outside the chat's folder wait for an approval that names the path (issue 27 item 6),
with a real ``jupyter server`` and its workers; only the model is scripted (DESIGN §11). The pure rule
and in-process turns are in ``test_read_scope.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.clients.rest import GoalsClient
from tests.servers import server_env, write_script

pytestmark = pytest.mark.slow


def read_file(path: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "read_file", "arguments": {"path": path}}]}


def rules(outside: Path) -> list[dict[str, Any]]:
    return [
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "Read."}},  # any result after the request
        {"when": {"last_user_contains": "read-inside"}, "respond": read_file("inside.txt")},
        {"when": {"last_user_contains": "read-outside"}, "respond": read_file(str(outside / "notes.txt"))},
        {"when": {"last_user_contains": "read-link"}, "respond": read_file("link.txt")},
    ]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("OUTSIDE-CONTENT")
    with server_env(tmp_path, rules(outside)) as e:
        (e["root"] / "inside.txt").write_text("INSIDE-CONTENT")
        (e["root"] / "link.txt").symlink_to(outside / "notes.txt")
        yield {**e, "outside": outside, "tmp": tmp_path}


def transcript(cl: GoalsClient, sid: str) -> str:
    return "\n".join(str(i["content"]) for i in cl.session(sid)["transcript"]["items"])


def waits_for_approval(cl: GoalsClient, sid: str) -> dict[str, Any]:
    assert cl.wait(sid, phases=("waiting",), timeout=30)["work"]["reason_code"] == "awaiting_approval"
    [pending] = [a for a in cl.approvals("pending") if a["session_id"] == sid]
    return pending


def test_ask_mode_reads_inside_at_once_and_outside_or_through_a_symlink_after_an_approval_naming_the_path(
    env: dict[str, Any],
) -> None:
    root, target = env["root"], str((env["outside"] / "notes.txt").resolve())
    server = env["make"]().start()
    cl = server.client()
    sid = str(cl.create_session(title="ask", cwd=str(root), permissions={"mode": "ask"})["session"]["session_id"])

    cl.send(sid, "read-inside")
    cl.wait(sid, timeout=30)
    assert "INSIDE-CONTENT" in transcript(cl, sid) and cl.approvals(None) == []  # ran at once

    cl.send(sid, "read-outside")
    pending = waits_for_approval(cl, sid)
    assert pending["tool"] == "read_file" and pending["arguments"] == {"path": target}
    assert f"would read {target}, outside this chat's folder {root.resolve()}" in pending["reason"]
    assert "OUTSIDE-CONTENT" not in transcript(cl, sid)
    cl.approve(pending["approval_id"])
    cl.wait(sid, timeout=30)
    assert "OUTSIDE-CONTENT" in transcript(cl, sid)

    cl.send(sid, "read-link")  # link.txt lies in the folder; the file it resolves to does not
    pending = waits_for_approval(cl, sid)
    assert pending["arguments"] == {"path": "link.txt"} and f"would read {target}, outside" in pending["reason"]
    cl.deny(pending["approval_id"])
    snap = cl.wait(sid, timeout=30)
    results = [i for i in snap["transcript"]["items"] if i["kind"] == "tool_result"]
    assert results[-1]["content"] == "[denied by the user: not executed]"

    # the folder added to the session (PATCH, shown in the session answer) opens reads there
    snap = cl.set_permissions(sid, {"mode": "ask", "folders": ["../outside"]})
    assert snap["session"]["permissions"]["folders"] == ["../outside"]
    before = len(cl.approvals(None))
    cl.send(sid, "read-link")
    cl.wait(sid, timeout=30)
    assert len(cl.approvals(None)) == before
    assert [i for i in cl.session(sid)["transcript"]["items"] if i["kind"] == "tool_result"][-1]["content"] == "OUTSIDE-CONTENT"


def test_the_servers_own_runtime_file_asks_even_with_read_file_allowed(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    [runtime_file] = (env["state"].parent / "jupyter_runtime").glob("jpserver-*.json")
    model = write_script(env["tmp"] / "peek.json", [
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "Read."}},
        {"when": {"last_user_contains": "peek"}, "respond": read_file(str(runtime_file))},
        {"when": {"last_user_contains": "read-outside"}, "respond": read_file(str(env["outside"] / "notes.txt"))},
    ])
    cl = server.client()
    sid = str(cl.create_session(title="allowed", cwd=str(env["root"]), model=model,
                                permissions={"mode": "ask", "allow": ["read_file"]})["session"]["session_id"])
    cl.send(sid, "read-outside")  # allowed by name: outside the folder runs
    cl.wait(sid, timeout=30)
    assert "OUTSIDE-CONTENT" in transcript(cl, sid) and cl.approvals(None) == []
    cl.send(sid, "peek")
    pending = waits_for_approval(cl, sid)
    resolved = str(runtime_file.resolve())
    assert f"would read {resolved}, in {resolved.rsplit('/', 1)[0]}, which holds credentials" in pending["reason"]
    assert '"port"' not in transcript(cl, sid)
    cl.deny(pending["approval_id"])
    cl.wait(sid, timeout=30)
    assert '"port"' not in transcript(cl, sid)
