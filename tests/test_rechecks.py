"""Continuation rechecks after a restart, end to end (issue 16 item 1): recovered work whose working
folder is gone, whose tool implementation changed, whose permissions were revoked, or whose server runs
with automatic recovery disabled waits (or stays paused) with its exact reason and the action that clears it; clearing it lets
the work go on, and the command runs exactly once (counted on disk). Real servers killed with -9."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.servers import attempt_count, db_rows, full_passes, running_shell, server_env, wait_for

pytestmark = pytest.mark.slow


def slow_rules(out: Path) -> list[dict[str, Any]]:
    return [
        {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "finished"}},
        {"when": {"purpose": "work", "last_user_contains": "slow"},
         "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": f"sleep 2; echo ran >> {out}"}}]}},
    ]


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def kill_while_running(env: dict[str, Any], server: Any) -> Path:
    """kill -9 the server while its shell command runs; the command's effect dir."""
    found: list[Path] = []

    def running() -> bool:
        rows = db_rows(env["state"], "SELECT effect_id FROM effects WHERE tool = 'shell' AND state = 'dispatched'")
        found[:] = [env["state"] / "effects" / r["effect_id"] for r in rows if (env["state"] / "effects" / r["effect_id"] / "proc.json").exists()]
        return bool(found)

    wait_for(running, timeout=30, what="the command running")
    server.kill()
    return found[0]


def test_a_deleted_working_folder_makes_recovered_work_wait_until_it_is_back(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with server_env(tmp_path, slow_rules(out)) as env:
        work_dir = env["root"] / "project"
        work_dir.mkdir()
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title="cwd", cwd=str(work_dir), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run something slow", client_request_id="r1")
        effect_dir = kill_while_running(env, server)
        shutil.rmtree(work_dir)
        wait_for(lambda: (effect_dir / "exit").exists(), timeout=30, what="the detached command finished")
        server.start()
        cl = server.client()
        snap = cl.session(sid)  # the first recovery pass has decided (the server answered 503 until then)
        assert (snap["work"]["phase"], snap["work"]["reason_code"]) == ("waiting", "resource_missing.cwd")
        assert "recreate it" in snap["work"]["reason"] and snap["actions"]["can_end"]
        attempts = len(db_rows(env["state"], "SELECT attempt_id FROM attempts"))
        work_dir.mkdir()  # the action that clears it; nothing else is needed
        snap = cl.wait(sid, timeout=30)
        assert snap["work"]["phase"] == "done"
        assert len(db_rows(env["state"], "SELECT attempt_id FROM attempts")) == attempts + 1
        assert lines(out) == 1  # the command ran once; its real result was reconnected, not re-run


def test_automatic_recovery_disabled_keeps_interrupted_work_paused_until_resume(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with server_env(tmp_path, slow_rules(out)) as env:
        server = env["make"](["--GoalsApp.auto_recover=False"]).start()
        cl = server.client()
        sid = str(cl.create_session(title="manual", cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run something slow", client_request_id="r1")
        effect_dir = kill_while_running(env, server)
        wait_for(lambda: (effect_dir / "exit").exists(), timeout=30, what="the detached command finished")
        server.start()
        cl = server.client()
        snap = cl.session(sid)
        assert (snap["work"]["phase"], snap["work"]["reason_code"]) == ("paused", "auto_recovery_disabled")
        assert snap["actions"]["can_resume"] and "Resume" in snap["work"]["reason"]
        attempts = len(db_rows(env["state"], "SELECT attempt_id FROM attempts"))
        assert cl.session(sid)["work"]["phase"] == "paused"
        cl.action(sid, "resume")
        snap = cl.wait(sid, timeout=30)
        assert snap["work"]["phase"] == "done"
        assert len(db_rows(env["state"], "SELECT attempt_id FROM attempts")) == attempts + 1
        assert lines(out) == 1


def test_a_changed_tool_implementation_waits_until_retry_then_runs_the_new_one_once(tmp_path: Path) -> None:
    """A trusted custom tool's source changes while its call waits for approval and the server is down:
    after the approval the work waits with ``tool_changed`` (Retry offered); Retry binds the planned call
    to the new implementation, which runs once."""
    tools = tmp_path / "tools"
    tools.mkdir()
    module = tools / "stamp_tools.py"
    source = '''
from pathlib import Path
from jupyter_goals.runtime.tools import ToolResult

async def stamp(ctx, args):
    with open(Path(ctx.cwd) / "stamp.txt", "a") as f:
        f.write("VERSION\\n")
    return ToolResult("stamped VERSION")
'''
    module.write_text(source.replace("VERSION", "v1"))
    rules = [
        {"when": {"purpose": "work", "last_tool_result_contains": "stamped"}, "respond": {"text": "stamped it"}},
        {"when": {"purpose": "work"}, "respond": {"tool_calls": [{"name": "stamp", "arguments": {}}]}},
    ]
    trusted = json.dumps({"stamp": {"impl": "stamp_tools:stamp", "capability": "unknown"}})
    with server_env(tmp_path, rules, base_env={"PYTHONPATH": str(tools)}) as env:
        server = env["make"]([f"--GoalsApp.trusted_tools={trusted}"]).start()
        cl = server.client()
        sid = str(cl.create_session(title="tool", cwd=str(env["root"]))["session"]["session_id"])
        cl.send(sid, "stamp it", client_request_id="r1")
        wait_for(lambda: cl.approvals("pending"), timeout=30, what="the approval for stamp")
        server.kill()
        module.write_text(source.replace("VERSION", "v2"))  # a new version of the tool is installed
        server.start()
        cl = server.client()
        approval = cl.approvals("pending")[0]
        cl.decide(approval["approval_id"], "approve")
        wait_for(lambda: cl.session(sid)["work"]["reason_code"] == "tool_changed", timeout=30, what="tool_changed")
        snap = cl.session(sid)
        assert snap["work"]["phase"] == "waiting" and snap["actions"]["can_retry"] and "Retry" in snap["work"]["reason"]
        assert not (env["root"] / "stamp.txt").exists()  # nothing ran under the old approval's implementation
        cl.action(sid, "retry")
        snap = cl.wait(sid, timeout=30)
        assert (env["root"] / "stamp.txt").read_text() == "v2\n"
        assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "stamped it"


def test_a_permission_revoked_while_a_job_runs_makes_the_recovered_job_wait_until_it_is_granted_again(
        tmp_path: Path) -> None:
    """A Job runs with the bypass permissions of the chat that started it; that chat is narrowed to ask
    while the Job's command runs, and the server is killed -9. After the restart the Coordinator rechecks
    current permissions: the Job holds more than its caller now allows, so it waits ``permission_revoked``
    with a sentence naming what was revoked and how to clear it, and nothing is admitted over two full
    passes. Granting bypass again lets it go on by itself: the command's real result is reconnected,
    never re-run."""
    out = tmp_path / "out.txt"
    with server_env(tmp_path, slow_rules(out)) as env:
        server = env["make"]().start()
        cl = server.client()
        caller = str(cl.create_session(title="caller", cwd=str(env["root"]),
                                       permissions={"mode": "bypass"})["session"]["session_id"])
        job = cl.create_job(caller, "run something slow", client_request_id="j1")
        running_shell(env["state"], job["session_id"])
        cl.set_permissions(caller, {"mode": "ask"})  # revoked while the Job's command runs
        server.kill()
        server.start()
        cl = server.client()
        snap = cl.session(job["session_id"])  # the first recovery pass has decided
        assert (snap["work"]["phase"], snap["work"]["reason_code"]) == ("waiting", "permission_revoked")
        reason = snap["work"]["reason"]
        assert "'caller'" in reason and "bypass mode" in reason and "Grant them again" in reason
        assert snap["actions"]["can_end"] and not snap["actions"]["can_resume"]
        attempts = attempt_count(env["state"])
        full_passes(server)  # it stays waiting: nothing widened or admitted by itself
        assert attempt_count(env["state"]) == attempts
        assert cl.job(job["job_id"])["work"]["reason_code"] == "permission_revoked"

        cl.set_permissions(caller, {"mode": "bypass"})  # the action that clears it; nothing else is needed
        done = cl.wait_job(job["job_id"], timeout=30)
        assert done["result"]["text"] == "finished"
        assert attempt_count(env["state"]) == attempts + 1
        assert lines(out) == 1  # the command ran once; its real result was reconnected, not re-run
