"""REST contract of approvals and permissions (DESIGN §10; issue 3), through pytest-jupyter's server.

The server runs with ``workers = 0``; its Coordinator admits turns and a worker living in this test
process (``tests/inproc.py``) runs them against the same control.db. Only the model is scripted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.inproc import run_next_attempt
from tests.restkit import (  # noqa: F401 - fixtures
    Api,
    api,
    assert_error,
    goals_state_dir,
    jp_asyncio_loop,
    jp_server_config,
)

APPROVAL_FIELDS = {"approval_id", "session_id", "work_id", "call_id", "tool", "arguments", "capability", "reason", "state",
                   "unknown_effects", "created_at"}


@pytest.fixture
def chat(tmp_path: Path, goals_state_dir: Path) -> dict[str, Any]:  # noqa: F811
    root = tmp_path / "root"
    root.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [
        {"when": {"last_tool_result_contains": "wrote "}, "respond": {"text": "Written."}},
        {"when": {"last_user_contains": "write"}, "respond": {"tool_calls": [
            {"name": "write_file", "arguments": {"path": "notes/a.md", "content": "a"}}]}},
    ], "default": {"text": "(no rule)"}}))
    return {"root": root, "model": f"scripted:{script}", "state": goals_state_dir}


async def pending_approval(api: Api, chat: dict[str, Any], permissions: dict[str, Any]) -> tuple[str, dict[str, Any]]:  # noqa: F811
    from jupyter_goals.store.db import Database

    sid = await api.new_session(cwd=str(chat["root"]), model=chat["model"], permissions=permissions)
    await api.send(sid, "write a note", "r1")
    db = Database(f"sqlite:///{chat['state'] / 'control.db'}", inline=True)
    try:
        await run_next_attempt(db, chat["state"], chat["model"], str(chat["root"]))
    finally:
        db.close()
    answer = await api.ok("GET", "approvals", params={"state": "pending"})
    [approval] = answer["approvals"]
    return sid, approval


def kinds(events: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in events["events"] if e["kind"] == kind]


async def test_pending_approval_lists_call_capability_reason_and_unknown_set(api: Api, chat: dict[str, Any]) -> None:  # noqa: F811
    sid, approval = await pending_approval(api, chat, {"mode": "ask"})
    assert APPROVAL_FIELDS <= set(approval)
    assert (approval["session_id"], approval["tool"], approval["capability"], approval["state"]) == (
        sid, "write_file", "idempotent", "pending")
    assert approval["arguments"] == {"path": "notes/a.md", "content": "a"}
    assert approval["unknown_effects"] == [] and "approval" in approval["reason"]
    snap = await api.ok("GET", f"sessions/{sid}")
    assert snap["work"]["reason_code"] == "awaiting_approval"
    assert [a["approval_id"] for a in snap["approvals"]] == [approval["approval_id"]]
    requested = kinds(await api.events(), "approval.requested")
    assert [p["approval_id"] for p in requested] == [approval["approval_id"]]

    decided = await api.ok("POST", f"approvals/{approval['approval_id']}", {"decision": "deny"})
    assert decided["state"] == "denied"
    code, answer = await api.call("POST", f"approvals/{approval['approval_id']}", {"decision": "approve"})
    assert code == 409
    assert_error(answer, "conflict")
    assert [p["decision"] for p in kinds(await api.events(), "approval.decided")] == ["denied"]
    assert (await api.ok("GET", "approvals", params={"state": "pending"}))["approvals"] == []


@pytest.mark.parametrize("control", ["pause", "stop", "permissions"])
async def test_control_or_permission_change_invalidates_a_pending_approval_visibly(
    api: Api, chat: dict[str, Any], control: str  # noqa: F811
) -> None:
    sid, approval = await pending_approval(api, chat, {"mode": "ask"})
    if control == "permissions":
        snap = await api.ok("PATCH", f"sessions/{sid}", {"permissions": {"mode": "ask", "allow": [
            "shell", {"tool": "write_file", "path": "notes/*.md"}]}})
        assert snap["session"]["permissions"]["allow"][1] == {"tool": "write_file", "path": "notes/*.md"}
        assert snap["approvals"] == []
    else:
        await api.ok("POST", f"sessions/{sid}/actions", {"action": control})
    [voided] = (await api.ok("GET", "approvals", params={"state": "invalidated"}))["approvals"]
    assert voided["approval_id"] == approval["approval_id"] and voided["reason"].startswith("Withdrawn because")
    [event] = kinds(await api.events(), "approval.invalidated")
    expected = {"pause": "user_paused", "stop": "user_stopped", "permissions": "permission_revoked"}[control]
    assert (event["approval_id"], event["reason_code"]) == (approval["approval_id"], expected)
    code, answer = await api.call("POST", f"approvals/{approval['approval_id']}", {"decision": "approve"})
    assert code == 409
    assert_error(answer, "conflict")


async def test_permission_change_answers_400_404_and_409(api: Api, chat: dict[str, Any]) -> None:  # noqa: F811
    sid = await api.new_session(cwd=str(chat["root"]))
    for body in ({"permissions": {"mode": "ask"}, "colour": "red"}, {"permissions": {"mode": "yolo"}},
                 {"permissions": {"allow": [{"tool": "write_file"}]}}, {"permissions": {"allow": [{"tool": "x", "path": "a",
                                                                                                  "glob": "b"}]}}, {}):
        code, answer = await api.call("PATCH", f"sessions/{sid}", body)
        assert code == 400, body
        assert_error(answer, "bad_request")
    code, answer = await api.call("PATCH", "sessions/ses_missing", {"permissions": {"mode": "ask"}})
    assert code == 404
    assert_error(answer, "not_found")
    await api.send(sid, "hello", "r1")
    code, answer = await api.call("PATCH", f"sessions/{sid}", {"permissions": {"mode": "bypass"},
                                                                 "expected_control_version": 99})
    assert code == 409
    assert_error(answer, "conflict")
    work = (await api.ok("GET", f"sessions/{sid}"))["work"]
    snap = await api.ok("PATCH", f"sessions/{sid}", {"permissions": {"mode": "bypass"},
                                                     "expected_control_version": work["control_version"]})
    assert snap["session"]["permissions"] == {"mode": "bypass", "allow": [], "folders": [], "env_allow": []}
    assert snap["work"]["control_version"] == work["control_version"] + 1
