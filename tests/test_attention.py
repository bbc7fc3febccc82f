"""``GET /attention``: everything across sessions that waits for a person, each with its action, rebuilt from
durable rows (the same after kill -9 and a restart); an item leaves once the person acted.

A real ``jupyter server`` with scripted models: an ``ask`` chat waiting on an approval, a Goal stopped at
its budget, a chat whose provider refused the key, and a chat whose command was running when the machine
"restarted" (server and command killed -9, new boot id): its call's outcome is unknown and the model's
next write waits for the one-time approval that follows an unknown outcome.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.host.effect_files import group_members, kill_shell

from .servers import ServerFactory, running_shell, wait_for, write_script

pytestmark = pytest.mark.slow  # real servers, a kill -9 and a restart


def by_kind(answer: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for item in answer["items"]:
        kinds.setdefault(item["kind"], []).append(item)
    return kinds


def test_attention_lists_what_waits_for_a_person_with_its_action_and_survives_a_restart(tmp_path: Path) -> None:
    factory = ServerFactory(tmp_path / "a", [])
    write = write_script(tmp_path / "write.json", [
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "written"}}],
        default={"tool_calls": [{"name": "write_file", "arguments": {"path": "w.txt", "content": "x"}}]})
    usage = {"input_tokens": 100, "output_tokens": 10}
    spend = write_script(tmp_path / "spend.json", [
        {"when": {"last_tool_result_contains": "wrote"}, "respond": {"text": "step", "usage": usage}}],
        default={"text": "", "usage": usage,
                 "tool_calls": [{"name": "write_file", "arguments": {"path": "p.txt", "content": "x"}}]})
    refused = write_script(tmp_path / "refused.json", [], default={"error": {"status": 401, "message": "bad key"}})
    slow = write_script(tmp_path / "slow.json", [
        {"when": {"tool_result_unknown": True},
         "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "echo again >> out.txt"}}]}},
        {"when": {"last_tool_result_contains": "exit status"}, "respond": {"text": "done"}}],
        default={"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 30; echo once >> out.txt"}}]})
    server = factory.make().start()
    try:
        client = server.client()
        assert client.attention() == {"items": [], "count": 0}

        ask = client.create_session(title="ask chat", model=write)["session_id"]
        client.send(ask, "write it", client_request_id="a-1")
        budget = client.create_session(title="budget chat", model=spend, permissions={"mode": "bypass"})["session_id"]
        goal = client.create_goal(budget, "Spend tokens", [
            {"id": "r1", "text": "never.txt exists", "kind": "file_exists", "path": "never.txt"}],
            budget={"max_tokens": 250})
        failing = client.create_session(title="refused chat", model=refused)["session_id"]
        client.send(failing, "hello", client_request_id="f-1")
        reboot = client.create_session(title="reboot chat", model=slow, permissions={"mode": "bypass"})["session_id"]
        client.send(reboot, "run it", client_request_id="r-1")
        effect_dir = running_shell(server.state_dir, reboot)

        def attention() -> dict[str, Any]:
            answer: dict[str, Any] = client.attention()
            return answer

        wait_for(lambda: {"approval", "budget", "failed"} <= set(by_kind(attention())), 60, "three items")
        kinds = by_kind(attention())
        [approval] = kinds["approval"]
        assert (approval["session_id"], approval["title"], approval["tool"], approval["action"]) == (
            ask, "ask chat", "write_file", "decide")
        assert approval["arguments"] == {"path": "w.txt", "content": "x"} and approval["approval_id"]
        [stopped] = kinds["budget"]
        assert (stopped["session_id"], stopped["goal_id"], stopped["action"], stopped["reason_code"]) == (
            budget, goal["goal_id"], "edit_goal", "budget_exhausted")
        assert "token budget" in stopped["reason"]
        [failed] = kinds["failed"]
        assert (failed["session_id"], failed["title"], failed["action"]) == (failing, "refused chat", "retry")
        assert "reboot chat" not in {i["title"] for i in attention()["items"]}  # running: nothing to do yet

        # the machine "restarts" while the command runs: server and command killed -9, a new boot id
        server.kill()
        assert kill_shell(effect_dir)
        wait_for(lambda: not group_members(effect_dir), 10, "the command's process group to end")
        server.env_extra["JUPYTER_GOALS_BOOT_ID"] = "after-the-restart"
        server.start()
        client = server.client()
        wait_for(lambda: len(by_kind(attention()).get("approval", [])) == 2, 60, "the approval after the unknown")
        kinds = by_kind(attention())
        assert {k: len(v) for k, v in kinds.items()} == {"approval": 2, "budget": 1, "failed": 1,
                                                        "unknown_outcome": 1}
        [unknown] = kinds["unknown_outcome"]
        assert (unknown["session_id"], unknown["tool"], unknown["action"]) == (reboot, "shell", "settle")
        assert unknown["arguments"]["command"].startswith("sleep 30")
        after = next(a for a in kinds["approval"] if a["session_id"] == reboot)
        assert after["arguments"] == {"command": "echo again >> out.txt"}
        assert [i["key"] for i in kinds["approval"] if i["session_id"] == ask] == [approval["key"]]  # same item

        # acting removes an item: approve the ask chat's write
        client.decide(approval["approval_id"], "approve")
        wait_for(lambda: all(i["session_id"] != ask for i in attention()["items"]), 30, "the approval to leave")
        wait_for(lambda: (factory.root / "w.txt").exists(), 30, "the approved write")
        assert (factory.root / "w.txt").read_text() == "x"
        assert attention()["count"] == len(attention()["items"]) == 4
    finally:
        factory.close()
