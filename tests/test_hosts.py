"""Several hosts on one PostgreSQL store (issue 30): two real ``jupyter server`` processes with their own
host names and state dirs share one control store and one ledger. Each host runs only its own work; a
host killed with kill -9 leaves its work waiting (``owner_host_unreachable``, never judged by the other
host) until a person takes it over; takeover fences the old host's attempts and turns its running
calls into unknown outcomes; the old host, restarted, claims nothing it lost and reports the late
receipts of the calls it had running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyter_goals.host.effect_files import group_members
from tests.hostkit import Hosts, one_step_rules
from tests.servers import ServerProcess, full_passes, wait_for

pytestmark = pytest.mark.postgres

CHATS = 20
STEPS = 3
SLOW_S = 60  # the command chat 00 is running when host A dies


def _rules() -> list[dict[str, Any]]:
    """Chat NN runs STEPS shell steps, each appending one line ``chat-NN:sK`` to ``out.txt``; chat 00's
    second step is a 60-second command. A turn after an unknown outcome answers without any call (the
    restricted turn never runs the command again by itself)."""
    rules: list[dict[str, Any]] = []

    def step(tag: str, k: int, slow: bool) -> dict[str, Any]:
        pause = SLOW_S if slow else 0.2
        command = f"sleep {pause}; echo {tag}s{k} >> out.txt; echo did-{tag}s{k}"
        return {"text": f"{tag} step {k}.", "usage": {"input_tokens": 5, "output_tokens": 2},
                "tool_calls": [{"name": "shell", "arguments": {"command": command}}]}

    for i in range(CHATS):
        tag = f"chat-{i:02d}:"
        rules.append({"when": {"last_user_contains": tag, "tool_result_unknown": True},
                      "respond": {"text": f"{tag} an outcome is unknown; I will not run it again.",
                                  "usage": {"input_tokens": 3, "output_tokens": 1}}})
        rules.append({"when": {"last_user_contains": tag, "last_tool_result_contains": f"did-{tag}s{STEPS}"},
                      "respond": {"text": f"{tag} done.", "usage": {"input_tokens": 4, "output_tokens": 2}}})
        for k in range(STEPS, 1, -1):
            rules.append({"when": {"last_user_contains": tag, "last_tool_result_contains": f"did-{tag}s{k - 1}"},
                          "respond": step(tag, k, (i, k) == (0, 2))})
        rules.append({"when": {"last_user_contains": tag}, "respond": step(tag, 1, False)})
    rules.append({"when": {"last_user_contains": "keep:", "tool_result_unknown": True}, "respond": {"text": "keep: ?"}})
    rules.append({"when": {"last_user_contains": "keep:", "last_tool_result_contains": "did-keep"},
                  "respond": {"text": "keep: done."}})
    rules.append({"when": {"last_user_contains": "keep:"},
                  "respond": {"text": "keep: step.", "tool_calls": [
                      {"name": "shell", "arguments": {"command": "echo keep:s1 >> out.txt; echo did-keep"}}]}})
    return rules


class Sampler(threading.Thread):
    """Samples ``read`` every 100 ms until stopped; records each sample that differs from ``expected``."""

    def __init__(self, read: Callable[[], Any], expected: Any) -> None:
        super().__init__(daemon=True)
        self.read, self.expected = read, expected
        self.samples = 0
        self.differences: list[Any] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            found = self.read()
            self.samples += 1
            if found != self.expected:
                self.differences.append(found)
            self.done.wait(0.1)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}api/goals/{path}", json=body, timeout=30,
                      headers={"Authorization": f"token {server.token}"})


def goals_cli(state: Path, host: str, control_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``jupyter goals <args>`` on ``host`` as a person runs it there."""
    jupyter = str(Path(sys.executable).parent / "jupyter")
    env = {**os.environ, "JUPYTER_GOALS_HOST_NAME": host}
    return subprocess.run([jupyter, "goals", "--state-dir", str(state), "--control-db-url", control_url, *args],
                          capture_output=True, text=True, timeout=120, env=env)


def a_work_rows(hosts: Hosts, sessions: list[str]) -> list[tuple[Any, ...]]:
    """The durable state of A's work that only A may change: work items, attempts and calls."""
    marks = ",".join("?" * len(sessions))
    work = hosts.rows(f"SELECT work_id, host_name, phase, reason_code, control_version, commit_point FROM work_items"
                      f" WHERE session_id IN ({marks}) ORDER BY work_id", tuple(sessions))
    attempts = hosts.rows(f"SELECT attempt_id, state, worker_id FROM attempts WHERE session_id IN ({marks})"
                          " ORDER BY attempt_id", tuple(sessions))
    calls = hosts.rows(f"SELECT effect_id, state FROM effects WHERE session_id IN ({marks}) ORDER BY effect_id",
                       tuple(sessions))
    return [tuple(r.values()) for r in work + attempts + calls]


@pytest.mark.slow
def test_a_lost_host_waits_for_a_person_and_its_work_completes_on_the_host_that_takes_it_over(
        tmp_path: Path, hosts_store: tuple[str, str]) -> None:
    hosts = Hosts(tmp_path, hosts_store, _rules())
    try:
        a, b = hosts.a.start(), hosts.b.start()
        ca, cb = a.client(), b.client()
        sessions = []
        for i in range(CHATS):
            sid = str(ca.create_session(title=f"chat {i}", cwd=str(hosts.root),
                                        permissions={"mode": "bypass"})["session"]["session_id"])
            ca.send(sid, f"chat-{i:02d}: append your lines", client_request_id=f"c{i}")
            sessions.append(sid)
        keep = str(ca.create_session(title="keep", cwd=str(hosts.root),
                                     permissions={"mode": "bypass"})["session"]["session_id"])
        ca.send(keep, "keep: append one line", client_request_id="k0")

        def slow_running() -> Path | None:
            for r in hosts.rows("SELECT effect_id FROM effects WHERE session_id = ? AND state = 'dispatched'"
                                " AND tool = 'shell'", (sessions[0],)):
                d = a.state_dir / "effects" / r["effect_id"]
                if group_members(d):
                    return d
            return None

        wait_for(lambda: slow_running() is not None, timeout=120, what="chat 00's 60-second command on host A")
        slow_dir = slow_running()
        assert slow_dir is not None
        a.kill()  # kill -9 of A's server and workers; detached commands live on, as on a host cut off the network
        everyone = [*sessions, keep]
        frozen = a_work_rows(hosts, everyone)
        assert hosts.rows("SELECT work_id FROM work_items WHERE host_name = 'host-a' AND phase NOT IN ('done', 'cancelled')")

        # B never claims, runs or judges A's work: sampled every 100 ms from the kill until B shows the
        # sessions waiting for the unreachable host A and has run two more full passes
        sampler = Sampler(lambda: a_work_rows(hosts, everyone), frozen)
        sampler.start()
        try:
            wait_for(lambda: cb.session(sessions[0])["work"]["reason_code"] == "owner_host_unreachable", timeout=60,
                     what="B's snapshot: owner_host_unreachable")
            full_passes(b, 2)
        finally:
            sampler.stop()
        assert sampler.samples >= 10 and sampler.differences == [], sampler.differences[:1]
        work = cb.session(sessions[0])["work"]
        assert work["owner_host"] == "host-a" and work["phase"] == "waiting", work
        assert work["reason"].startswith("Running on host-a (unreachable since "), work
        assert cb.session(sessions[0])["actions"]["can_takeover"] is True
        status = goals_cli(b.state_dir, "host-b", hosts.control_url, "status")
        assert "[host-a] Running on host-a (unreachable since" in status.stdout, status.stdout + status.stderr
        assert not hosts.rows("SELECT a.attempt_id FROM attempts a JOIN workers w ON w.worker_id = a.worker_id"
                              " WHERE w.host_name = 'host-b'")

        # takeover on B, session by session (the keep chat stays A's); each answers the work it took
        taken: list[str] = []
        for sid in sessions:
            r = post(b, f"sessions/{sid}/actions", {"action": "takeover"})
            if r.status_code == 409:  # its work had ended on A before the kill: nothing to take
                assert cb.session(sid)["work"]["phase"] == "done", r.text
                continue
            assert r.status_code == 200, r.text
            taken += r.json()["taken"]
        assert len(taken) >= CHATS // 2, taken  # most chats were queued or running when A died
        slow_call = hosts.rows("SELECT call_id, state FROM effects WHERE effect_id = ?", (slow_dir.name,))[0]
        assert slow_call["state"] == "unknown"
        records = hosts.rows("SELECT work_id, claimed_by, detail FROM recovery_decisions WHERE mode = 'takeover'")
        assert sorted(r["work_id"] for r in records) == sorted(taken)
        assert all("on host-b" in r["claimed_by"] for r in records)
        assert hosts.rows("SELECT COUNT(*) AS n FROM events WHERE kind = 'work.taken_over'")[0]["n"] == len(taken)

        for sid in sessions:
            assert cb.wait(sid, timeout=180)["work"]["phase"] == "done"
        out = (hosts.root / "out.txt").read_text().splitlines()
        chat_lines = [ln for ln in out if ln.startswith("chat-")]
        assert len(chat_lines) == len(set(chat_lines)), f"a line written twice: {sorted(chat_lines)}"
        # the 60-second command was not run again: at most its one original process writes its line
        assert "chat-00:s3" not in chat_lines
        transcript = cb.session(sessions[0], after=0, limit=500)["transcript"]["items"]
        assert any("will not run it again" in str(i["content"]) for i in transcript)
        assert not hosts.rows("SELECT a.attempt_id FROM attempts a JOIN workers w ON w.worker_id = a.worker_id"
                              " JOIN work_items i ON i.work_id = a.work_id"
                              " WHERE w.host_name = 'host-b' AND i.session_id = ?", (keep,))

        # A comes back: it claims nothing it lost, its own work continues, its late exit files are receipts
        before = {r["attempt_id"] for r in hosts.rows("SELECT attempt_id FROM attempts")}
        a.start()
        assert a.client().wait(keep, timeout=60)["work"]["phase"] == "done"  # A's own work continued on A
        wait_for(lambda: hosts.rows("SELECT state FROM effects WHERE effect_id = ?", (slow_dir.name,))[0]["state"]
                 == "reconciled", timeout=SLOW_S + 60, what="the 60-second command's late receipt, reported by A")
        full_passes(a, 2)
        new = hosts.rows("SELECT a.attempt_id, a.worker_id, w.host_name, i.session_id FROM attempts a"
                         " JOIN work_items i ON i.work_id = a.work_id LEFT JOIN workers w ON w.worker_id = a.worker_id")
        for r in new:
            if r["attempt_id"] not in before and r["host_name"] == "host-a":
                assert r["session_id"] == keep, f"host A claimed work it lost: {r}"
        receipts = hosts.rows("SELECT COUNT(*) AS n FROM transcript WHERE item_id = ?",
                              (f"reconcile:{slow_call['call_id']}",))
        assert receipts[0]["n"] == 1
        assert (hosts.root / "out.txt").read_text().splitlines().count("chat-00:s2") == 1
    finally:
        hosts.close()


@pytest.mark.slow
def test_takeover_is_refused_while_the_host_lives_or_a_folder_is_missing_and_the_cli_moves_all_of_a_host(
        tmp_path: Path, hosts_store: tuple[str, str]) -> None:
    hosts = Hosts(tmp_path, hosts_store, one_step_rules())
    try:
        a, b = hosts.a.start(), hosts.b.start()
        ca, cb = a.client(), b.client()
        folders = [hosts.root / f"f{i}" for i in range(2)]
        for f in folders:
            f.mkdir()
        sids = []
        for i, f in enumerate(folders):
            sid = str(ca.create_session(title=f"s{i}", cwd=str(f), permissions={"mode": "bypass"})["session"]["session_id"])
            ca.send(sid, "work", client_request_id=f"w{i}")
            sids.append(sid)
        wait_for(lambda: len(hosts.rows("SELECT effect_id FROM effects WHERE state = 'dispatched'")) == 2,
                 timeout=60, what="both commands running on A")
        # A lives: no takeover, and B offers none
        r = post(b, "actions", {"action": "takeover", "host": "host-a"})
        assert r.status_code == 409 and "reachable" in r.json()["message"], r.text
        assert cb.session(sids[0])["actions"]["can_takeover"] is False
        assert cb.session(sids[0])["work"]["owner_host"] == "host-a"
        assert post(b, "actions", {"action": "takeover"}).status_code == 400

        a.kill()
        wait_for(lambda: cb.session(sids[0])["work"]["reason_code"] == "owner_host_unreachable", timeout=30,
                 what="B shows A unreachable")
        gone = folders[1].rename(hosts.root / "elsewhere")
        r = post(b, "actions", {"action": "takeover", "host": "host-a"})
        assert r.status_code == 409 and str(folders[1]) in r.json()["message"], r.text
        assert {x["host_name"] for x in hosts.rows("SELECT host_name FROM work_items")} == {"host-a"}
        assert not hosts.rows("SELECT * FROM recovery_decisions WHERE mode = 'takeover'")

        gone.rename(folders[1])
        cli = goals_cli(b.state_dir, "host-b", hosts.control_url, "takeover", "--from", "host-a")
        assert cli.returncode == 0 and "Took over 2 work item(s) from host-a" in cli.stdout, cli.stdout + cli.stderr
        assert {x["host_name"] for x in hosts.rows("SELECT host_name FROM work_items")} == {"host-b"}
        assert {x["state"] for x in hosts.rows("SELECT state FROM workers WHERE host_name = 'host-a'")} == {"dead"}
        for sid in sids:
            done = cb.wait(sid, timeout=60)
            assert done["work"]["phase"] == "done" and "owner_host" not in done["work"]
            assert done["actions"]["can_takeover"] is False
        assert not any(f.joinpath("once.txt").exists() and f.joinpath("once.txt").read_text().count("once") > 1
                       for f in folders)
        again = goals_cli(b.state_dir, "host-b", hosts.control_url, "takeover", "--from", "host-a")
        assert again.returncode == 0 and "Nothing to take over" in again.stdout, again.stdout + again.stderr
    finally:
        hosts.close()


@pytest.mark.slow
def test_allow_cross_host_takeover_takes_a_lost_hosts_work_by_itself(tmp_path: Path, hosts_store: tuple[str, str]) -> None:
    hosts = Hosts(tmp_path, hosts_store, one_step_rules(), extra=["--GoalsApp.allow_cross_host_takeover=True"])
    try:
        a, b = hosts.a.start(), hosts.b.start()
        ca, cb = a.client(), b.client()
        sid = str(ca.create_session(title="auto", cwd=str(hosts.root), permissions={"mode": "bypass"})["session"]["session_id"])
        ca.send(sid, "work", client_request_id=uuid.uuid4().hex)
        wait_for(lambda: bool(hosts.rows("SELECT effect_id FROM effects WHERE state = 'dispatched'")), timeout=60,
                 what="the command running on A")
        a.kill()
        done = cb.wait(sid, timeout=60)
        assert done["work"]["phase"] == "done"
        [record] = hosts.rows("SELECT claimed_by, detail FROM recovery_decisions WHERE mode = 'takeover'")
        assert record["claimed_by"] == "allow_cross_host_takeover"
        assert hosts.rows("SELECT state FROM effects WHERE tool = 'shell'")[0]["state"] in ("unknown", "reconciled")
    finally:
        hosts.close()


@pytest.mark.slow
def test_a_stop_pressed_on_one_host_ends_the_command_running_on_another_within_two_seconds(
        tmp_path: Path, hosts_store: tuple[str, str]) -> None:
    """The Stop is committed on B; A's worker, which owns the call, sees it through the store and kills
    the command's process group; B never signals anything (it has no such process)."""
    hosts = Hosts(tmp_path, hosts_store, one_step_rules())
    try:
        a, b = hosts.a.start(), hosts.b.start()
        sid = str(a.client().create_session(title="stop", cwd=str(hosts.root),
                                            permissions={"mode": "bypass"})["session"]["session_id"])
        a.client().send(sid, "work", client_request_id="w")

        def running() -> Path | None:
            for r in hosts.rows("SELECT effect_id FROM effects WHERE state = 'dispatched' AND tool = 'shell'"):
                d = a.state_dir / "effects" / r["effect_id"]
                if group_members(d):
                    return d
            return None

        wait_for(lambda: running() is not None, timeout=60, what="the command running on A")
        effect_dir = running()
        assert effect_dir is not None
        assert b.client().session(sid)["work"]["owner_host"] == "host-a"
        stopped_at = time.monotonic()
        assert post(b, f"sessions/{sid}/actions", {"action": "stop"}).status_code == 200
        wait_for(lambda: not group_members(effect_dir), timeout=2, what="A's command gone within 2 s of the Stop on B")
        assert time.monotonic() - stopped_at < 2.0
        done = b.client().wait(sid, phases=("cancelled",), timeout=30)
        assert done["work"]["phase"] == "cancelled"
        [call] = hosts.rows("SELECT state FROM effects WHERE effect_id = ?", (effect_dir.name,))
        assert call["state"] == "cancelled"
        assert not (hosts.root / "once.txt").exists()
    finally:
        hosts.close()


CHAIN = 30  # shell steps of the chat paused on host B, each a 0.3-second command appending one line
#: no admission pass or claim check of their own within 30 s: only a wake-up can make them act sooner
SLOW_TICKS = ["--GoalsApp.safety_tick_s=30", "--GoalsApp.reconcile_interval_s=30"]


def _control_rules() -> list[dict[str, Any]]:
    """``chain:``: CHAIN shell steps, step K appending ``chain:sK`` to chain.txt and printing ``did-sK.``;
    ``approve:``: one command appending a line to approved.txt (its session in ``ask`` mode asks first)."""
    def step(k: int) -> dict[str, Any]:
        return {"text": f"step {k}.", "tool_calls": [{"name": "shell", "arguments": {
            "command": f"sleep 0.3; echo chain:s{k} >> chain.txt; echo did-s{k}."}}]}

    rules: list[dict[str, Any]] = [{"when": {"last_user_contains": "chain:", "last_tool_result_contains": f"did-s{CHAIN}."},
                                    "respond": {"text": "chain done."}}]
    rules += [{"when": {"last_user_contains": "chain:", "last_tool_result_contains": f"did-s{k - 1}."}, "respond": step(k)}
              for k in range(CHAIN, 1, -1)]
    return [*rules, {"when": {"last_user_contains": "chain:"}, "respond": step(1)},
            {"when": {"last_user_contains": "approve:", "last_tool_result_contains": "exit status"}, "respond": {"text": "ran."}},
            {"when": {"last_user_contains": "approve:"}, "respond": {"text": "asking.", "tool_calls": [
                {"name": "shell", "arguments": {"command": "echo once >> approved.txt"}}]}}]


def _hosts_of_attempts(hosts: Hosts, sid: str) -> set[str]:
    """The hosts whose workers ran the session's attempts."""
    return {r["host_name"] for r in hosts.rows("SELECT w.host_name FROM attempts a JOIN workers w ON w.worker_id ="
                                               " a.worker_id WHERE a.session_id = ?", (sid,))}


@pytest.mark.slow
def test_a_pause_given_on_one_host_stops_the_steps_on_the_host_running_them_within_a_second_and_resume_continues_there(
        tmp_path: Path, hosts_store: tuple[str, str], record_property: Callable[[str, object], None]) -> None:
    """Host A's worker reads the Pause committed on B at its next step boundary (its fenced read of the
    work item): the attempt ends ``control`` within 1 s of the Pause's commit (the ``work.control`` event's
    time) and no call is dispatched after it; Resume on B is admitted and run by host A, never by B."""
    hosts = Hosts(tmp_path, hosts_store, _control_rules())
    try:
        a, b = hosts.a.start(), hosts.b.start()
        sid = str(a.client().create_session(title="chain", cwd=str(hosts.root),
                                            permissions={"mode": "bypass"})["session"]["session_id"])
        a.client().send(sid, "chain: append your lines", client_request_id="c")
        committed = "SELECT COUNT(*) AS n FROM effects WHERE session_id = ? AND state = 'committed'"
        wait_for(lambda: hosts.rows(committed, (sid,))[0]["n"] >= 3, timeout=60, what="three steps done on A")
        live = "SELECT 1 FROM attempts WHERE session_id = ? AND state IN ('admitted', 'running')"
        assert hosts.rows(live, (sid,)), "the chain ended before the Pause"
        assert post(b, f"sessions/{sid}/actions", {"action": "pause"}).status_code == 200
        answered = time.time()
        [paused] = hosts.rows("SELECT ts FROM events WHERE session_id = ? AND kind = 'work.control'", (sid,))
        wait_for(lambda: not hosts.rows(live, (sid,)), timeout=5, what="A's attempt to end after the Pause on B")
        [ended] = hosts.rows("SELECT ended_at, end_reason FROM attempts WHERE session_id = ?", (sid,))
        stopped_s, answer_s = ended["ended_at"] - paused["ts"], ended["ended_at"] - answered
        record_property("pause_commit_to_attempt_end_s", stopped_s)
        record_property("pause_answer_to_attempt_end_s", answer_s)
        assert ended["end_reason"] == "control" and stopped_s < 1.0, (ended, stopped_s, answer_s)
        full_passes(a, 2)  # no step afterwards: nothing dispatched, nothing admitted, no line added
        full_passes(b, 2)
        assert not hosts.rows("SELECT 1 FROM effects WHERE session_id = ? AND dispatched_at > ?", (sid, paused["ts"]))
        assert not hosts.rows("SELECT 1 FROM effects WHERE session_id = ? AND state = 'dispatched'", (sid,))
        done_steps = hosts.rows(committed, (sid,))[0]["n"]
        assert len(hosts.rows("SELECT 1 FROM attempts WHERE session_id = ?", (sid,))) == 1
        assert len((hosts.root / "chain.txt").read_text().splitlines()) == done_steps < CHAIN
        assert b.client().session(sid)["work"]["phase"] == "paused"

        assert post(b, f"sessions/{sid}/actions", {"action": "resume"}).status_code == 200
        assert b.client().wait(sid, timeout=120)["work"]["phase"] == "done"
        assert (hosts.root / "chain.txt").read_text().splitlines() == [f"chain:s{k}" for k in range(1, CHAIN + 1)]
        assert _hosts_of_attempts(hosts, sid) == {"host-a"}  # resumed on A, never run on B
        assert [r["host_name"] for r in hosts.rows("SELECT host_name FROM work_items WHERE session_id = ?", (sid,))] \
            == ["host-a"]
    finally:
        hosts.close()


@pytest.mark.slow
def test_an_approval_decided_on_one_host_runs_the_call_once_on_the_host_that_owns_it_within_a_second(
        tmp_path: Path, hosts_store: tuple[str, str], record_property: Callable[[str, object], None]) -> None:
    """The decision committed on B wakes A (``NOTIFY`` on the admission channel; A's own passes and claim
    checks are 30 s apart): A admits the work and its worker dispatches the approved call within 1 s of the
    decision's commit (``decided_at``), once."""
    hosts = Hosts(tmp_path, hosts_store, _control_rules(), extra=SLOW_TICKS)
    try:
        a, b = hosts.a.start(), hosts.b.start()
        sid = str(a.client().create_session(title="ask", cwd=str(hosts.root))["session"]["session_id"])
        a.client().send(sid, "approve: append once", client_request_id="p")
        wait_for(lambda: bool(b.client().approvals("pending")), timeout=60, what="A's approval, seen on B")
        [approval] = b.client().approvals("pending")
        wait_for(lambda: not hosts.rows("SELECT 1 FROM attempts WHERE session_id = ? AND state IN ('admitted', 'running')",
                                        (sid,)), timeout=10, what="A's attempt to end awaiting the approval")
        assert not (hosts.root / "approved.txt").exists()
        r = post(b, f"approvals/{approval['approval_id']}", {"decision": "approve"})
        answered = time.time()
        assert r.status_code == 200, r.text
        call = "SELECT e.dispatched_at, p.decided_at FROM effects e JOIN approvals p ON p.call_id = e.call_id" \
               " WHERE p.approval_id = ?"
        wait_for(lambda: hosts.rows(call, (approval["approval_id"],))[0]["dispatched_at"] is not None, timeout=5,
                 what="A's worker to run the approved call")
        [ran] = hosts.rows(call, (approval["approval_id"],))
        latency_s, answer_s = ran["dispatched_at"] - ran["decided_at"], ran["dispatched_at"] - answered
        record_property("decision_commit_to_dispatch_s", latency_s)
        record_property("decision_answer_to_dispatch_s", answer_s)
        assert latency_s < 1.0, (latency_s, answer_s)
        assert b.client().wait(sid, timeout=30)["work"]["phase"] == "done"
        [used] = hosts.rows("SELECT w.host_name FROM approvals p JOIN attempts a ON a.attempt_id = p.consumed_by_attempt"
                            " JOIN workers w ON w.worker_id = a.worker_id WHERE p.approval_id = ?", (approval["approval_id"],))
        assert used["host_name"] == "host-a" and _hosts_of_attempts(hosts, sid) == {"host-a"}
        assert [r["state"] for r in hosts.rows("SELECT state FROM effects WHERE session_id = ?", (sid,))] == ["committed"]
        assert (hosts.root / "approved.txt").read_text().splitlines() == ["once"]
    finally:
        hosts.close()
