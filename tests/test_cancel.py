"""Stop means stop (issue 15): Stop, End, stop_all, a Goal's end and a parent's stop cancel a running
command at once — its whole process group is signalled, the call is committed ``cancelled`` with its
real exit status and output — and the cancellation survives crashes between the stop's commit and the
kill. ``cancel_tool`` cancels one call and the turn goes on. Real servers, real processes, kill -9."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.host.effect_files import group_members
from tests.servers import (
    ServerProcess,
    attempt_count,
    db_rows,
    full_passes,
    lines,
    running_shell,
    server_env,
    usage_rows,
    wait_for,
)

pytestmark = pytest.mark.slow

SLOW = "sleep 60; echo done >> out.txt"
# ignores SIGTERM (a subshell's ignored signal stays ignored in ``sleep``): only the SIGKILL after the grace ends it
STUBBORN = "trap '' TERM; echo started; sleep 60; echo after-the-sleep"
FINISHES = "sleep 3; echo line >> out.txt"  # what Pause lets finish
METERED_USAGE = {"input_tokens": 11, "output_tokens": 5}
RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work", "last_tool_result_contains": "cancelled this call"},
     "respond": {"text": "You cancelled the command, so I will not run it again."}},
    {"when": {"purpose": "work", "last_user_contains": "delegate", "last_tool_result_contains": "started subtask"},
     "respond": {"text": "Waiting for the subtask."}},
    {"when": {"purpose": "work", "last_user_contains": "delegate"},
     "respond": {"tool_calls": [{"name": "spawn_subtask", "arguments": {"task": "run the slow sleep"}}]}},
    {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "finished"}},
    {"when": {"purpose": "work", "last_user_contains": "stubborn"},
     "respond": {"text": "Running it.", "tool_calls": [{"name": "shell", "arguments": {"command": STUBBORN}}]}},
    {"when": {"purpose": "work", "last_user_contains": "append after a while"},
     "respond": {"text": "Appending.", "tool_calls": [{"name": "shell", "arguments": {"command": FINISHES}}]}},
    {"when": {"purpose": "work", "last_user_contains": "metered"},
     "respond": {"text": "Running it.", "usage": METERED_USAGE,
                 "tool_calls": [{"name": "shell", "arguments": {"command": SLOW}}]}},
    {"when": {"purpose": "work", "any_text_contains": "slow"},
     "respond": {"text": "Running it.", "tool_calls": [{"name": "shell", "arguments": {"command": SLOW}}]}},
]


def gone_within(effect_dir: Path, seconds: float) -> float:
    """Seconds until the process group has no live member; fails past ``seconds``."""
    start = time.monotonic()
    wait_for(lambda: not group_members(effect_dir), timeout=seconds, what=f"process group gone within {seconds}s")
    return time.monotonic() - start


def said_stopped(items: list[dict[str, Any]]) -> bool:
    """The transcript says in words that the person stopped the turn (an interruption item)."""
    return any(i["kind"] == "interruption" and i["content"].startswith("Stopped by")
               and i.get("meta", {}).get("reason_code") == "user_stopped" for i in items)


def effect(state: Path, effect_dir: Path) -> dict[str, Any]:
    return db_rows(state, "SELECT * FROM effects WHERE effect_id = ?", (effect_dir.name,))[0]


def assert_nothing_reruns_after_restart(server: ServerProcess, env: dict[str, Any], sid: str) -> None:
    """A restart finds the work stopped: no new attempt, no new call, no line in out.txt. ``start()``
    returns once the server serves with its workers up, which is after its first recovery pass decided
    every unfinished item (the server answers 503 ``starting`` until then)."""
    attempts = len(db_rows(env["state"], "SELECT attempt_id FROM attempts"))
    calls = len(db_rows(env["state"], "SELECT effect_id FROM effects"))
    server.stop()
    server.start()
    cl = server.client()
    snap = cl.session(sid)
    assert snap["work"]["phase"] == "cancelled", snap["work"]
    assert len(db_rows(env["state"], "SELECT attempt_id FROM attempts")) == attempts
    assert len(db_rows(env["state"], "SELECT effect_id FROM effects")) == calls
    assert not (env["root"] / "out.txt").exists()


@pytest.mark.parametrize("how", ["stop", "stop_all", "goal_end", "parent_stop"])
def test_stop_kills_the_running_command_within_two_seconds_and_a_restart_changes_nothing(
    tmp_path: Path, how: str
) -> None:
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title=how, cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        goal_id = ""
        if how == "goal_end":
            goal = cl.create_goal(sid, "run the slow command", requirements=[{"text": "it ran", "kind": "semantic"}])
            goal_id = goal["goal_id"]
        elif how == "parent_stop":
            cl.send(sid, "delegate it", client_request_id="p1")
        else:
            cl.send(sid, "run something slow", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        stopped_at = time.monotonic()
        if how == "stop" or how == "parent_stop":
            cl.action(sid, "stop")
        elif how == "stop_all":
            cl.stop_all()
        else:
            cl.goal_action(goal_id, "end", cl.goal(goal_id)["revision"])
        wait_for(lambda: not group_members(effect_dir), timeout=2.0 - (time.monotonic() - stopped_at) + 0.001,
                 what="the process group gone within 2 s of the stop")
        wait_for(lambda: effect(env["state"], effect_dir)["state"] == "cancelled", timeout=10, what="cancelled effect")
        eff = effect(env["state"], effect_dir)
        assert "exit status:" in eff["result"] and "the person stopped the work" in eff["result"]
        if how == "parent_stop":  # the child's session holds the call; the parent's stop reached it
            child = db_rows(env["state"], "SELECT session_id FROM work_items WHERE work_id = ?", (eff["work_id"],))[0]
            assert child["session_id"] != sid
            wait_for(lambda: cl.session(child["session_id"])["work"]["phase"] == "cancelled", timeout=10,
                     what="the subtask cancelled")
        snap = cl.wait(sid, phases=("cancelled",), timeout=10)
        if how != "parent_stop":
            items = snap["transcript"]["items"]
            result = next(i for i in items if i["kind"] == "tool_result")
            assert result["state"] == "cancelled"
            assert said_stopped(items)
            # in the order it happened: the cancelled result, then the words that the turn ended there
            marker = next(i for i in items if i["kind"] == "interruption" and i["content"].startswith("Stopped by"))
            assert result["seq"] < marker["seq"] and "terminated" in marker["content"], items
        assert not (env["root"] / "out.txt").exists()
        assert_nothing_reruns_after_restart(server, env, sid)


@pytest.mark.parametrize("point,whole_server", [
    ("control.after_stop_commit", True),   # the server dies right after committing the stop
    ("tool.before_cancel_kill", False),    # the worker dies just before signalling; the server lives
    ("tool.before_cancel_kill", True),     # ... and then the whole server is killed too
])
def test_a_stop_survives_a_crash_before_the_kill(tmp_path: Path, point: str, whole_server: bool) -> None:
    """After the restart (or the worker's), the Coordinator finds the process by its identity, kills
    it and commits it ``cancelled``; the line never appears and nothing re-runs. Where the whole server
    dies, it dies at the point itself (``JUPYTER_GOALS_CRASH_SCOPE=group``): killing it from here once the
    point fired would race the survivors (the server recovers a dead worker's work at once, a worker sees
    a committed stop within 50 ms), and the command might be gone before the restart had to find it."""
    with server_env(tmp_path, RULES) as env:
        scope = {"JUPYTER_GOALS_CRASH_SCOPE": "group"} if whole_server else {}
        server = env["make"]().start(crash_at=point, env=scope)
        cl = server.client()
        sid = str(cl.create_session(title="crash", cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run something slow", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        fired = env["state"] / "faults" / f"{point}.fired"
        try:
            cl.action(sid, "stop")
        except Exception:  # noqa: BLE001 - the server may die before it answers (control.after_stop_commit)
            assert point == "control.after_stop_commit"
        wait_for(fired.exists, timeout=10, what=f"{point} fired")
        if whole_server:
            assert server.wait_exit(timeout=30) == -9  # the server and its workers died at the point
            assert group_members(effect_dir), "the detached command outlives the server until it is cancelled"
            server.start()
            cl = server.client()
        gone_within(effect_dir, 30)
        wait_for(lambda: effect(env["state"], effect_dir)["state"] == "cancelled", timeout=30, what="cancelled effect")
        assert cl.wait(sid, phases=("cancelled",), timeout=30)["work"]["reason_code"] == "user_stopped"
        assert not (env["root"] / "out.txt").exists()
        assert_nothing_reruns_after_restart(server, env, sid)


def test_cancel_tool_ends_one_call_and_the_turn_continues_with_that_result(tmp_path: Path) -> None:
    """``cancel_tool`` on a running call: killed, committed ``cancelled``; the work is not stopped, and the
    next model request carries the cancelled result (the scripted rule on it answers)."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = str(cl.create_session(title="one", cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run something slow", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        answer = cl.http.post(f"/sessions/{sid}/actions", json={"action": "cancel_tool", "effect_id": effect_dir.name})
        assert answer.status_code == 200, answer.text
        gone_within(effect_dir, 2.0)
        snap = cl.wait(sid, phases=("done",), timeout=30)
        assistant = [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"]
        assert assistant[-1] == "You cancelled the command, so I will not run it again."
        assert effect(env["state"], effect_dir)["state"] == "cancelled"
        assert not (env["root"] / "out.txt").exists()
        # a second cancel, a cancel without effect_id, an unknown call: 409, 400, 404
        again = cl.http.post(f"/sessions/{sid}/actions", json={"action": "cancel_tool", "effect_id": effect_dir.name})
        assert again.status_code == 409 and again.json()["error"] == "conflict"
        missing = cl.http.post(f"/sessions/{sid}/actions", json={"action": "cancel_tool"})
        assert missing.status_code == 400
        unknown = cl.http.post(f"/sessions/{sid}/actions", json={"action": "cancel_tool", "effect_id": "eff_nope"})
        assert unknown.status_code == 404
        # usage kept as it was: each of the two model requests counted once
        assert len(db_rows(env["state"], "SELECT request_id FROM requests")) == 2


def new_chat(cl: Any, env: dict[str, Any], title: str, **create: Any) -> str:
    snap = cl.create_session(title=title, cwd=str(env["root"]), permissions={"mode": "bypass"}, **create)
    return str(snap["session"]["session_id"])


def test_stop_while_the_model_answer_streams_closes_the_request_and_settles_it_lost(tmp_path: Path) -> None:
    """A real OpenAI-compatible server streams part of an answer and holds the stream open. Stop: the
    worker closes the connection (the server sees it within 2 s), the paid request is settled ``lost``
    (usage unknown, never zero) in control.db and, through the outbox, in usage.db; the work is cancelled
    and the model is not asked again."""
    from jupyter_goals.usage.paid import STOPPED_ERROR
    from tests.openai_server import OpenAITestServer

    with OpenAITestServer() as api, server_env(tmp_path, RULES) as env:
        # role chunk + three text chunks 0.15 s apart (the worker writes a draft), then the stream stays open
        api.plan(text_chunks=["Thinking", " it", " over"], chunk_delay=0.15, hold_open_after=4)
        server = env["make"](env={"OPENAI_BASE_URL": api.base_url}).start()
        cl = server.client()
        sid = new_chat(cl, env, "stream", model="openai:test-model")
        cl.send(sid, "think it over", client_request_id="r1")
        wait_for(lambda: api.held_streams == 1, timeout=30, what="the answer streaming, its stream held open")
        wait_for(lambda: any(e["kind"] == "assistant.draft" and e["payload"]["text"].startswith("Thinking")
                             for e in cl.events(0, 5000)["events"]), timeout=10, what="the streamed text reached the worker")
        [sent] = db_rows(env["state"], "SELECT request_id, state FROM requests")
        assert sent["state"] == "sent"
        stopped_at = time.time()
        cl.action(sid, "stop")
        wait_for(lambda: bool(api.client_closes), timeout=2.0, what="the provider connection closed within 2 s")
        assert api.client_closes[0] - stopped_at < 2.0 and api.held_streams == 0
        snap = cl.wait(sid, phases=("cancelled",), timeout=10)
        assert snap["work"]["reason_code"] == "user_stopped"
        items = snap["transcript"]["items"]
        # the streamed text is kept as a partial answer marked stopped (issue 32 item 5), never as the answer
        answers = [i for i in items if i["kind"] == "assistant"]
        assert [(i["item_id"].split(":")[0], i["meta"].get("interrupted")) for i in answers] == [("partial", "stopped")]
        assert answers[0]["content"].startswith("Thinking")
        assert said_stopped(items)
        [req] = db_rows(env["state"], "SELECT request_id, state, usage_known, error FROM requests")
        assert (req["request_id"], req["state"], req["usage_known"], req["error"]) == (
            sent["request_id"], "lost", 0, STOPPED_ERROR)
        wait_for(lambda: cl.usage(session_id=sid)["ledger_writes_pending"] == 0, timeout=10, what="the outbox to drain")
        assert usage_rows(env["state"], "SELECT request_id, state FROM requests") == [
            {"request_id": sent["request_id"], "state": "lost"}]
        assert usage_rows(env["state"], "SELECT receipt_key FROM receipts") == []
        usage = cl.usage(session_id=sid)
        assert (usage["unknown_usage_requests"], usage["in_flight_requests"], usage["receipts"]) == (1, 0, 0)
        assert "usage unknown for 1 additional request" in usage["display"]
        assert len(api.completion_requests) == 1  # the stopped request is not sent again


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    """``trap '' TERM``: SIGTERM leaves the command running, SIGKILL ends its group once
    ``GoalsApp.cancel_grace_s`` has passed (1 s here, not the default 5). The cancelled result records
    the signal and the output so far; the line after the sleep is never written."""
    grace = 1.0
    with server_env(tmp_path, RULES) as env:
        server = env["make"]([f"--GoalsApp.cancel_grace_s={grace}"]).start()
        cl = server.client()
        sid = new_chat(cl, env, "stubborn")
        cl.send(sid, "run the stubborn command", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        stdout = effect_dir / "stdout"
        wait_for(lambda: stdout.exists() and stdout.read_text() == "started\n", timeout=10, what="output before the sleep")
        stopped_at = time.monotonic()
        cl.action(sid, "stop")
        wait_for(lambda: not group_members(effect_dir), timeout=grace + 2.0, what="the group killed after the grace")
        took = time.monotonic() - stopped_at
        assert took >= grace, f"the group ended {took:.2f} s after the stop: SIGKILL did not wait for the grace"
        wait_for(lambda: effect(env["state"], effect_dir)["state"] == "cancelled", timeout=10, what="cancelled effect")
        eff = effect(env["state"], effect_dir)
        assert "exit status: none (killed by SIGKILL)" in eff["result"]
        assert "stdout (so far):\nstarted\n" in eff["result"] and "after-the-sleep" not in eff["result"]
        snap = cl.wait(sid, phases=("cancelled",), timeout=10)
        [result] = [i for i in snap["transcript"]["items"] if i["kind"] == "tool_result"]
        assert result["state"] == "cancelled" and "killed by SIGKILL" in result["content"]
        # no process of the group is left to write the line: its output file ends with what came before
        assert not (effect_dir / "exit").exists()
        assert stdout.read_text() == "started\n"


def test_pause_lets_the_running_command_finish_and_starts_nothing_new(tmp_path: Path) -> None:
    """Pause while ``sleep 3; echo line >> out.txt`` runs: the command is not signalled, its line is
    written once and its call committed with exit status 0; the work ends paused (not cancelled) and
    nothing new starts (no model request, no call, no attempt over several Coordinator passes)."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = new_chat(cl, env, "pause")
        cl.send(sid, "append after a while", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        answer = cl.action(sid, "pause")
        assert answer["desired_state"] == "paused"
        assert group_members(effect_dir), "the command was still running when Pause was pressed"
        wait_for(lambda: effect(env["state"], effect_dir)["state"] == "committed", timeout=30, what="the call committed")
        eff = effect(env["state"], effect_dir)
        assert eff["result"].startswith("exit status: 0")
        assert lines(env["out"]) == 1
        wait_for(lambda: not db_rows(env["state"], "SELECT attempt_id FROM attempts WHERE state IN ('admitted', 'running')"),
                 timeout=10, what="the attempt ended")
        requests, attempts = db_rows(env["state"], "SELECT request_id FROM requests"), attempt_count(env["state"])
        assert len(requests) == 1
        full_passes(server)
        snap = cl.session(sid)
        assert (snap["work"]["desired_state"], snap["work"]["phase"], snap["work"]["reason_code"]) == (
            "paused", "paused", "user_paused")
        assert snap["actions"]["can_resume"] is True
        assert db_rows(env["state"], "SELECT request_id FROM requests") == requests
        assert attempt_count(env["state"]) == attempts
        assert [r["state"] for r in db_rows(env["state"], "SELECT state FROM effects")] == ["committed"]
        items = snap["transcript"]["items"]
        assert [i["state"] for i in items if i["kind"] == "tool_result"] == ["committed"]
        assert not [i for i in items if i["kind"] == "interruption"]
        assert lines(env["out"]) == 1


def test_a_cancelled_calls_usage_receipts_and_active_time_survive_a_kill_9_unchanged(tmp_path: Path) -> None:
    """Stop cancels a running call whose model request reported usage; after the ledger settles, the
    server is killed with SIGKILL and started again: usage totals, the receipts rows and the active time
    read the same (nothing counted twice, nothing re-run)."""
    with server_env(tmp_path, RULES) as env:
        server = env["make"]().start()
        cl = server.client()
        sid = new_chat(cl, env, "metered")
        cl.send(sid, "metered: run it", client_request_id="r1")
        effect_dir = running_shell(env["state"])
        cl.action(sid, "stop")
        gone_within(effect_dir, 2.0)
        wait_for(lambda: effect(env["state"], effect_dir)["state"] == "cancelled", timeout=10, what="cancelled effect")
        cl.wait(sid, phases=("cancelled",), timeout=10)

        def settled() -> bool:
            usage = cl.usage(session_id=sid)
            return usage["ledger_writes_pending"] == 0 and not usage["running"]

        wait_for(settled, timeout=10, what="the ledger written and the attempt ended")
        before = cl.usage(session_id=sid)
        receipts = usage_rows(env["state"], "SELECT * FROM receipts ORDER BY receipt_key")
        ledger = usage_rows(env["state"], "SELECT * FROM requests ORDER BY request_id")
        control = db_rows(env["state"], "SELECT request_id, state, tokens FROM requests")
        attempts = attempt_count(env["state"])
        assert len(receipts) == 1 and (receipts[0]["input_tokens"], receipts[0]["output_tokens"]) == (11, 5)
        assert before["receipts"] == 1 and before["known_tokens"] == {"input": 11, "output": 5, "cached": 0}
        assert before["unknown_usage_requests"] == 0 and before["active_seconds"] > 0

        server.kill()
        server.start()
        cl = server.client()
        full_passes(server)  # recovery and the outbox have run on the restarted server
        after = cl.usage(session_id=sid)
        assert after == before
        assert usage_rows(env["state"], "SELECT * FROM receipts ORDER BY receipt_key") == receipts
        assert usage_rows(env["state"], "SELECT * FROM requests ORDER BY request_id") == ledger
        assert db_rows(env["state"], "SELECT request_id, state, tokens FROM requests") == control
        assert attempt_count(env["state"]) == attempts
        assert effect(env["state"], effect_dir)["state"] == "cancelled"
        assert cl.session(sid)["work"]["phase"] == "cancelled"
        assert not (env["root"] / "out.txt").exists()
