"""Background Jobs, subtasks and durable waits (issue 6 items 1-3).

Store rules run on SQLite and PostgreSQL (``backend``); turns run in this process against the real
Coordinator and turn loop (``tests/inproc.py``); the REST contract goes through a real in-process
Jupyter server. Kill -9 tests are in ``test_crash_jobs.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.config import GoalsConfig
from jupyter_goals.goals import lifecycle
from jupyter_goals.identity import host_name
from jupyter_goals.models import DesiredState, ItemKind, Phase, ReasonCode, Requirement
from jupyter_goals.recovery.coordinator import Coordinator
from jupyter_goals.recovery.decide import Action, RecoveryFacts, decide
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.store import control as c
from jupyter_goals.store import waits
from jupyter_goals.store.db import Database, Row, Tx
from tests.inproc import Rig
from tests.restkit import (  # noqa: F401 - the REST fixtures are shared (tests/restkit.py)
    Api,
    assert_error,
    goals_state_dir,
    jp_asyncio_loop,
    jp_server_config,
    start_goals,
)
from tests.storekit import Backend

BYPASS = {"mode": "bypass", "allow": []}
DELEGATE = {"text": "Delegating.", "tool_calls": [{"name": "spawn_subtask", "arguments": {"task": "compute the answer"}}]}
RULES: list[dict[str, Any]] = [
    {"when": {"last_user_contains": "child says 42"}, "respond": {"text": "Parent got 42."}},
    {"when": {"last_user_contains": "compute slowly"}, "respond": {"text": "child says 42", "delay_s": 1.0}},
    {"when": {"last_user_contains": "compute"}, "respond": {"text": "child says 42"}},
    # an idle model turn while the subtask runs would answer this: it must never appear
    {"when": {"last_user_contains": "delegate", "last_tool_result_contains": "started subtask"},
     "respond": {"text": "IDLE TURN WHILE WAITING"}},
    {"when": {"last_user_contains": "delegate slowly"},
     "respond": {"text": "Delegating.", "tool_calls": [{"name": "spawn_subtask", "arguments": {"task": "compute slowly"}}]}},
    {"when": {"last_user_contains": "delegate"}, "respond": DELEGATE},
    {"when": {"last_user_contains": "report"}, "respond": {"text": "job result: all fine",
                                                           "usage": {"input_tokens": 5, "output_tokens": 3}}},
]


# --------------------------------------------------------------------------- store rules (both backends)


def _script(tmp_path: Path) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": RULES, "default": {"text": "(no rule)"}}))
    return f"scripted:{path}"


class Store:
    """A migrated control store with a parent chat waiting on one subtask, and the real Coordinator."""

    def __init__(self, backend: Backend, tmp_path: Path) -> None:
        self.model = _script(tmp_path)
        self.db: Database = backend.open("control", migrated="control")
        self.coordinator = Coordinator(self.db, GoalsConfig(state_dir=tmp_path, default_model=self.model,
                                                            recovery_backoff_s=0.0), registry=ToolRegistry())

        def setup(tx: Tx) -> tuple[Row, Row, Row]:
            session = c.create_session(tx, "parent", str(tmp_path), self.model, BYPASS)
            msg, _ = c.accept_message(tx, session, "delegate", "r1", "queue", auto_recover=True, host=host_name())
            parent = c.get_work(tx, msg["work_id"])
            child, wait = waits.spawn_child(tx, parent, "compute", host=host_name())
            return parent, child, wait

        self.parent, self.child, self.wait = self.db.transact(setup)

    def tx(self, fn: Any) -> Any:
        return self.db.transact(fn)

    def attempts(self, work_id: str) -> int:
        return int(self.tx(lambda tx: tx.scalar("SELECT COUNT(*) AS n FROM attempts WHERE work_id = ?", (work_id,))))

    def work(self, work_id: str) -> Row:
        return self.tx(lambda tx: c.get_work(tx, work_id))  # type: ignore[no-any-return]

    def wait_row(self) -> Row:
        return self.tx(lambda tx: tx.one("SELECT * FROM waits WHERE wait_id = ?", (self.wait["wait_id"],)))  # type: ignore[no-any-return]

    def notify(self, outcome: str = "completed", text: str = "child says 42") -> list[dict[str, Any]]:
        return self.tx(lambda tx: waits.notify_handle(tx, self.child["work_id"], outcome, text))  # type: ignore[no-any-return]

    def control(self, work_id: str, action: str) -> None:
        self.tx(lambda tx: c.apply_control(tx, c.get_work(tx, work_id), action, None))

    def events(self, kind: str) -> list[Row]:
        return self.tx(lambda tx: [e for e in c.events_after(tx, 0, 100000) if e["kind"] == kind])  # type: ignore[no-any-return]


@pytest.fixture
def store(backend: Backend, tmp_path: Path) -> Store:
    return Store(backend, tmp_path)


async def test_a_wait_saves_work_revision_version_handle_and_a_unique_consumption_key(store: Store) -> None:
    wait = store.wait_row()
    assert (wait["work_id"], wait["kind"], wait["handle"], wait["state"]) == (
        store.parent["work_id"], "subtask", store.child["work_id"], "waiting")
    assert (wait["control_version"], wait["goal_revision"]) == (store.parent["control_version"], 0)
    assert wait["consumption_key"] == waits.consumption_key(store.parent["work_id"], "subtask", store.child["work_id"])
    with pytest.raises(Exception):  # noqa: B017 - the store's IntegrityError, per backend
        store.tx(lambda tx: waits.open_wait(tx, c.get_work(tx, store.parent["work_id"]), "subtask", store.child["work_id"]))
    # waiting: the Coordinator never admits the parent (no idle model turns) but does admit the child
    await store.coordinator.admit()
    assert store.attempts(store.parent["work_id"]) == 0 and store.attempts(store.child["work_id"]) == 1
    parent = store.work(store.parent["work_id"])
    assert (parent["phase"], parent["reason_code"]) == ("waiting", "awaiting_subtask")


async def test_delivering_the_same_completion_notification_three_times_admits_once(store: Store) -> None:
    await store.coordinator.admit()
    notes = [store.notify() for _ in range(3)]
    assert [len(n) for n in notes] == [1, 0, 0] and notes[0][0]["woke"] is True
    assert store.work(store.parent["work_id"])["phase"] == "queued"
    for _ in range(3):
        await store.coordinator.admit()
    assert store.attempts(store.parent["work_id"]) == 1
    assert len(store.events("wait.notified")) == 1
    wait = store.wait_row()
    assert (wait["state"], wait["outcome"], wait["result"]) == ("ready", "completed", "child says 42")
    # delivered once, whatever is repeated
    delivered = [store.tx(lambda tx: waits.deliver(tx, c.get_work(tx, store.parent["work_id"]), None)) for _ in range(3)]
    assert delivered == [1, 0, 0]
    items = store.tx(lambda tx: c.transcript(tx, store.parent["session_id"]))
    assert [i.kind for i in items].count("subtask_result") == 1
    assert store.wait_row()["state"] == "consumed"


async def test_a_result_arriving_while_the_parent_is_paused_is_saved_and_continues_once_after_resume(store: Store) -> None:
    await store.coordinator.admit()
    store.control(store.parent["work_id"], "pause")
    assert store.work(store.child["work_id"])["desired_state"] == "paused"  # pausing the parent pauses its child
    [note] = store.notify()
    assert (note["woke"], note["refused"]) == (False, "intent_not_run")
    assert store.wait_row()["state"] == "ready" and store.wait_row()["result"] == "child says 42"  # saved
    for _ in range(3):
        await store.coordinator.recover()
    assert store.attempts(store.parent["work_id"]) == 0
    assert store.work(store.parent["work_id"])["phase"] == "paused"
    store.control(store.parent["work_id"], "resume")
    assert store.work(store.child["work_id"])["desired_state"] == "run"  # resuming it resumes the child
    for _ in range(3):
        await store.coordinator.admit()
    assert store.attempts(store.parent["work_id"]) == 1
    assert store.wait_row()["state"] == "ready"  # the old wakeup was refused; the result was never discarded


async def test_a_goal_revision_refuses_the_old_wakeup_and_keeps_the_result_for_the_new_revision(
        backend: Backend, tmp_path: Path) -> None:
    model = _script(tmp_path)
    db = backend.open("control", migrated="control")
    coordinator = Coordinator(db, GoalsConfig(state_dir=tmp_path, default_model=model), registry=ToolRegistry())

    def setup(tx: Tx) -> tuple[Row, Row]:
        session = c.create_session(tx, "goal", str(tmp_path), model, BYPASS)
        goal = lifecycle.create(tx, session, "Do it", None, {}, host=host_name(), auto_recover=True)
        _child, wait = waits.spawn_child(tx, c.get_work(tx, goal["work_id"]), "compute", host=host_name())
        return goal, wait

    goal, wait = db.transact(setup)
    assert wait["goal_revision"] == 1
    db.transact(lambda tx: lifecycle.revise(tx, goal["goal_id"], 1, objective="Do it better"))
    [note] = db.transact(lambda tx: waits.notify_handle(tx, wait["handle"], "completed", "child says 42"))
    assert (note["woke"], note["refused"]) == (False, "stale_version")
    row = db.transact(lambda tx: tx.one("SELECT state, result FROM waits WHERE wait_id = ?", (wait["wait_id"],)))
    assert row == {"state": "ready", "result": "child says 42"}  # kept for the current revision
    for _ in range(3):
        await coordinator.admit()
    attempts = db.transact(lambda tx: tx.all("SELECT control_version FROM attempts WHERE work_id = ?", (goal["work_id"],)))
    work = db.transact(lambda tx: c.get_work(tx, goal["work_id"]))
    assert attempts == [{"control_version": work["control_version"]}]  # one admission, under the new version only


def _unknown_effect(tx: Tx, work: Row, call_id: str) -> None:
    seq = c.append_item(tx, work["session_id"], ItemKind.TOOL_CALL, "assistant", "", item_id=f"call:{call_id}",
                        work_id=work["work_id"], turn_id="t0", call_id=call_id, tool="shell", arguments={})
    tx.execute(
        "INSERT INTO effects (effect_id, call_id, work_id, turn_id, session_id, tool, arguments, capability,"
        " impl_identity, impl_digest, state, created_at, seq) VALUES (?, ?, ?, 't0', ?, 'shell', '{}', 'write', '', '',"
        " 'unknown', ?, ?)",
        (c.new_id("eff"), call_id, work["work_id"], work["session_id"], time.time(), seq),
    )


async def test_the_unknown_effect_set_covers_invoked_subtasks_and_jobs_but_not_their_sessions_other_work(
        store: Store) -> None:
    def run(tx: Tx) -> list[str]:
        parent = c.get_work(tx, store.parent["work_id"])
        job, _ = waits.create_job(tx, parent["session_id"], "report", None, "j1", host=host_name(), auto_recover=True)
        tx.execute("UPDATE jobs SET caller_work_id = ? WHERE job_id = ?", (parent["work_id"], job["job_id"]))
        _unknown_effect(tx, parent, "own")
        _unknown_effect(tx, c.get_work(tx, store.child["work_id"]), "in_subtask")
        _unknown_effect(tx, c.get_work(tx, job["work_id"]), "in_job")
        # later, unrelated work in the subtask's session: not part of the parent's provenance
        other, _ = c.accept_message(tx, c.get_session(tx, store.child["session_id"]), "hi", "r9", "queue",
                                    auto_recover=True, host=host_name())
        _unknown_effect(tx, c.get_work(tx, other["work_id"]), "unrelated")
        return [u["call_id"] for u in c.unknown_effects(tx, parent["work_id"])]

    assert store.tx(run) == ["own", "in_subtask", "in_job"]


async def test_stopping_the_parent_stops_its_subtask(store: Store) -> None:
    store.control(store.parent["work_id"], "stop")
    child = store.work(store.child["work_id"])
    assert (child["desired_state"], child["phase"]) == ("cancelled", "cancelled")


async def test_a_permission_change_of_the_parent_reaches_its_subtask(store: Store) -> None:
    narrower = {"mode": "ask", "allow": []}
    store.tx(lambda tx: c.change_permissions(tx, store.parent["session_id"], narrower, None))
    child = store.work(store.child["work_id"])
    assert json.loads(child["permission_scope"]) == narrower
    assert store.tx(lambda tx: c.get_session(tx, child["session_id"]))["permissions"] == narrower
    assert child["control_version"] == store.child["control_version"] + 1  # its older admissions are refused


async def test_stop_all_stops_each_subtask_once(store: Store) -> None:
    stopped = store.tx(c.stop_all)
    assert set(stopped) == {store.parent["work_id"], store.child["work_id"]}
    controls = [e for e in store.events("work.control") if e["work_id"] == store.child["work_id"]]
    assert [e["payload"]["action"] for e in controls] == ["stop"]


async def test_reconcile_finds_a_missed_notification_once_and_backs_off_while_the_child_runs(store: Store) -> None:
    now = time.time()
    assert store.tx(lambda tx: waits.reconcile_waits(tx, now)) == []  # child still running: checked, not notified
    first = store.wait_row()
    assert first["checks"] == 1 and first["next_check_at"] == pytest.approx(now + waits.reconcile_backoff(1))
    assert store.tx(lambda tx: waits.reconcile_waits(tx, now + 0.1)) == []
    assert store.wait_row()["checks"] == 1  # not due yet: backoff
    later = now + waits.reconcile_backoff(1) + 0.01
    assert store.tx(lambda tx: waits.reconcile_waits(tx, later)) == []
    assert store.wait_row()["checks"] == 2 and store.wait_row()["next_check_at"] == pytest.approx(later + waits.reconcile_backoff(2))

    def child_done_without_notification(tx: Tx) -> None:
        child = c.get_work(tx, store.child["work_id"])
        tx.execute("INSERT INTO work_results (work_id, outcome, result, created_at) VALUES (?, 'completed', ?, ?)",
                   (child["work_id"], "child says 42", time.time()))
        tx.execute("UPDATE work_items SET desired_state = 'done' WHERE work_id = ?", (child["work_id"],))
        c.set_phase(tx, child, Phase.DONE, ReasonCode.COMPLETED)

    store.tx(child_done_without_notification)
    due = later + 60
    [note] = store.tx(lambda tx: waits.reconcile_waits(tx, due))
    assert note["woke"] is True and store.wait_row()["result"] == "child says 42"
    assert store.tx(lambda tx: waits.reconcile_waits(tx, due + 60)) == []  # found once


async def test_a_failing_status_query_keeps_waiting_and_a_timeout_does_not_stop_the_subtask(store: Store) -> None:
    def query_times_out(tx: Tx, wait: Row) -> tuple[str, str] | None:
        raise TimeoutError("status query timed out")

    now = time.time()
    assert store.tx(lambda tx: waits.reconcile_waits(tx, now, probe=query_times_out)) == []
    wait = store.wait_row()
    assert wait["state"] == "waiting" and "timed out" in wait["last_error"]
    assert store.work(store.child["work_id"])["desired_state"] == "run"

    def with_deadline(tx: Tx) -> Row:
        parent = c.get_work(tx, store.parent["work_id"])
        other = c.create_work(tx, c.get_session(tx, store.child["session_id"]), "subtask", {"text": "x"},
                              auto_recover=True, host=host_name())
        return waits.open_wait(tx, parent, "subtask", other["work_id"], timeout_s=5)

    timed = store.tx(with_deadline)
    notes = store.tx(lambda tx: waits.reconcile_waits(tx, now + 6))
    assert [n["wait_id"] for n in notes] == [timed["wait_id"]]
    row = store.tx(lambda tx: tx.one("SELECT * FROM waits WHERE wait_id = ?", (timed["wait_id"],)))
    assert row["outcome"] == "timeout" and "may still be running" in row["result"]
    assert store.work(timed["handle"])["desired_state"] == "run"  # the subtask itself goes on


def test_a_notification_wakes_only_current_runnable_work_with_no_other_execution() -> None:
    ok = waits.WakeFacts("run", 3, 3, 2, 2, 0, 0)
    assert waits.may_wake(ok) == (True, "")
    cases = {
        "intent_not_run": [waits.WakeFacts("paused", 3, 3, 2, 2, 0, 0), waits.WakeFacts("cancelled", 3, 3, 2, 2, 0, 0)],
        "stale_version": [waits.WakeFacts("run", 4, 3, 2, 2, 0, 0), waits.WakeFacts("run", 3, 3, 3, 2, 0, 0)],
        "execution_exists": [waits.WakeFacts("run", 3, 3, 2, 2, 1, 0)],
        "other_waits_open": [waits.WakeFacts("run", 3, 3, 2, 2, 0, 1)],
    }
    for why, facts in cases.items():
        for f in facts:
            assert waits.may_wake(f) == (False, why)
    # an open wait holds the work without model turns; the user's pause still comes first
    waiting = RecoveryFacts(desired_state=DesiredState.RUN, dependency_wait=ReasonCode.AWAITING_SUBTASK)
    assert (decide(waiting).action, decide(waiting).reason_code) == (Action.WAIT, ReasonCode.AWAITING_SUBTASK)
    paused = RecoveryFacts(desired_state=DesiredState.PAUSED, reason_code="user_paused",
                           dependency_wait=ReasonCode.AWAITING_SUBTASK)
    assert decide(paused).action == Action.PAUSE


# --------------------------------------------------------------------------- turns in this process


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES)
    try:
        yield r
    finally:
        r.close()


def kinds(rig: Rig, sid: str) -> list[str]:
    return [i.kind for i in rig.items(sid)]


def child_of(rig: Rig, work_id: str) -> Row:
    [child] = rig.rows("SELECT * FROM work_items WHERE parent_work_id = ?", (work_id,))
    return child


async def test_subtask_result_is_delivered_once_and_the_parent_continues_to_done(rig: Rig) -> None:
    sid = rig.session(BYPASS)
    wid = rig.send(sid, "please delegate")
    await rig.step()  # the parent spawns and then waits, with no model turn
    parent = rig.work(wid)
    assert (parent["phase"], parent["reason_code"]) == ("waiting", "awaiting_subtask")
    await rig.run_until_quiet()
    child = child_of(rig, wid)
    assert rig.work(wid)["phase"] == "done" and child["phase"] == "done" and child["kind"] == "subtask"
    items = rig.items(sid)
    delivered = [i for i in items if i.kind == "subtask_result"]
    assert len(delivered) == 1 and "child says 42" in delivered[0].content
    replies = [i.content for i in items if i.kind == "assistant"]
    assert replies == ["Delegating.", "Parent got 42."]  # no idle turn while waiting
    assert len(rig.rows("SELECT * FROM requests WHERE work_id = ?", (wid,))) == 2
    assert rig.rows("SELECT result FROM work_results WHERE work_id = ?", (child["work_id"],)) == [{"result": "child says 42"}]
    # the child's conversation is its own; it inherited the parent's permission scope
    assert json.loads(child["permission_scope"]) == BYPASS and child["session_id"] != sid


async def test_spawning_a_subtask_needs_approval_in_ask_mode_unless_allowed(rig: Rig) -> None:
    sid = rig.session({"mode": "ask", "allow": []})
    wid = rig.send(sid, "delegate")
    await rig.step()
    [pending] = rig.approvals("pending")
    assert pending["tool"] == "spawn_subtask"
    assert rig.rows("SELECT * FROM work_items WHERE parent_work_id = ?", (wid,)) == []  # no work created yet
    rig.decide(pending["approval_id"], "approve")
    await rig.run_until_quiet()
    assert rig.work(wid)["phase"] == "done" and kinds(rig, sid).count("subtask_result") == 1
    assert rig.approvals("consumed")[0]["approval_id"] == pending["approval_id"]

    allowed = rig.session({"mode": "ask", "allow": ["spawn_subtask"]})
    wid2 = rig.send(allowed, "delegate")
    await rig.run_until_quiet()
    assert rig.work(wid2)["phase"] == "done" and rig.approvals("pending") == []


async def test_pause_of_the_parent_while_the_child_runs_saves_the_result_and_resume_continues_once(rig: Rig) -> None:
    sid = rig.session(BYPASS)
    wid = rig.send(sid, "delegate slowly")
    await rig.step()
    await rig.recover()
    attempt = rig._claim()
    assert attempt is not None and attempt["work_id"] != wid  # the child runs
    child_id = attempt["work_id"]
    task = asyncio.create_task(rig._runner(attempt).run())
    await asyncio.sleep(0.3)  # the child's model call is under way
    rig.tx(lambda tx: c.apply_control(tx, c.get_work(tx, wid), "pause", None))
    await task
    child = rig.work(child_id)
    assert child["desired_state"] == "paused" and child["phase"] == "paused"
    assert [i.content for i in rig.items(child["session_id"]) if i.kind == "assistant"] == ["child says 42"]  # saved
    parent_attempts = len(rig.rows("SELECT * FROM attempts WHERE work_id = ?", (wid,)))
    assert not await rig.step()  # nothing is admitted while paused
    assert len(rig.rows("SELECT * FROM attempts WHERE work_id = ?", (wid,))) == parent_attempts
    rig.tx(lambda tx: c.apply_control(tx, c.get_work(tx, wid), "resume", None))
    await rig.run_until_quiet()
    assert rig.work(wid)["phase"] == "done" and rig.work(child_id)["phase"] == "done"
    assert len(rig.rows("SELECT * FROM requests WHERE work_id = ?", (child_id,))) == 1  # the saved answer, not a new call
    assert kinds(rig, sid).count("subtask_result") == 1
    assert [i.content for i in rig.items(sid) if i.kind == "assistant"] == ["Delegating.", "Parent got 42."]


async def test_a_subtask_cannot_start_subtasks_and_the_count_is_capped(rig: Rig) -> None:
    sid = rig.session(BYPASS)
    wid = rig.send(sid, "delegate")
    await rig.step()
    child = child_of(rig, wid)

    def spawn(tx: Tx, work_id: str) -> Any:
        return waits.spawn_child(tx, c.get_work(tx, work_id), "again", host=host_name())

    with pytest.raises(waits.SpawnRefused):
        rig.tx(lambda tx: spawn(tx, child["work_id"]))
    for _ in range(waits.MAX_SUBTASKS - 1):
        rig.tx(lambda tx: spawn(tx, wid))
    with pytest.raises(waits.SpawnRefused):
        rig.tx(lambda tx: spawn(tx, wid))


async def test_a_job_runs_to_done_with_its_result_and_the_goal_identity_saved_at_admission(rig: Rig) -> None:
    caller = rig.session(BYPASS)
    goal = rig.tx(lambda tx: lifecycle.create(tx, c.get_session(tx, caller), "Keep things fine",
                                              [], {}, host=host_name(), auto_recover=True))
    job, created = rig.tx(lambda tx: waits.create_job(tx, caller, "report status", None, "j1", host=host_name(),
                                                      auto_recover=True))
    assert created and (job["goal_id"], job["goal_revision"]) == (goal["goal_id"], 1)
    # the Goal is revised and the caller's permissions widened after admission: the Job keeps what it had
    rig.tx(lambda tx: lifecycle.revise(tx, goal["goal_id"], 1, objective="Keep things finer"))
    rig.tx(lambda tx: c.change_permissions(tx, caller, {"mode": "bypass", "allow": ["shell"]}, None))
    rig.tx(lambda tx: lifecycle.act(tx, goal["goal_id"], "pause", 2))  # the Goal's own work stays out of the way
    await rig.run_until_quiet()
    view = rig.tx(lambda tx: waits.job_view(tx, waits.get_job(tx, job["job_id"])))
    assert view["work"]["phase"] == "done"
    assert view["result"]["text"] == "job result: all fine" and view["result"]["outcome"] == "completed"
    requests = rig.rows("SELECT goal_id, goal_revision FROM requests WHERE work_id = ?", (job["work_id"],))
    assert requests == [{"goal_id": goal["goal_id"], "goal_revision": 1}]
    assert json.loads(rig.work(job["work_id"])["permission_scope"]) == BYPASS
    assert rig.work(job["work_id"])["parent_work_id"] is None  # the caller is provenance, never a canonical parent
    again, created = rig.tx(lambda tx: waits.create_job(tx, caller, "report status", None, "j1", host=host_name(),
                                                        auto_recover=True))
    assert not created and again["job_id"] == job["job_id"]


async def test_a_goal_delegates_to_a_subtask_that_inherits_its_attribution_and_is_then_achieved(tmp_path: Path) -> None:
    def call(name: str, **arguments: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    rules = [
        {"when": {"last_user_contains": "flag written", "last_tool_result_contains": "candidate submitted"},
         "respond": {"text": "Done."}},
        {"when": {"last_user_contains": "flag written"}, "respond": call("update_goal", candidate=True)},
        {"when": {"last_user_contains": "write the flag", "last_tool_result_contains": "wrote"},
         "respond": {"text": "flag written"}},
        {"when": {"last_user_contains": "write the flag"}, "respond": call("write_file", path="flag.txt", content="up")},
        {"when": {"last_user_contains": "Delegate the flag"}, "respond": call("spawn_subtask", task="write the flag")},
    ]
    rig = Rig(tmp_path, rules)
    try:
        sid = rig.session(BYPASS)
        goal = rig.tx(lambda tx: lifecycle.create(
            tx, c.get_session(tx, sid), "Delegate the flag",
            [Requirement(text="flag.txt exists", kind="file_exists", path="flag.txt")], {}, host=host_name(),
            auto_recover=True))
        await rig.run_until_quiet(40)
        assert rig.rows("SELECT state FROM goals WHERE goal_id = ?", (goal["goal_id"],)) == [{"state": "achieved"}]
        child = child_of(rig, goal["work_id"])
        assert (child["goal_id"], child["goal_revision"]) == (goal["goal_id"], 1)
        assert rig.rows("SELECT DISTINCT goal_id, goal_revision FROM requests WHERE work_id = ?", (child["work_id"],)) \
            == [{"goal_id": goal["goal_id"], "goal_revision": 1}]
        assert kinds(rig, sid).count("subtask_result") == 1
    finally:
        rig.close()


async def test_a_goal_is_not_accepted_while_a_subtask_it_started_is_unfinished(tmp_path: Path) -> None:
    rig = Rig(tmp_path, [])
    try:
        (rig.root / "flag.txt").write_text("up")
        sid = rig.session(BYPASS)

        def setup(tx: Tx) -> Row:
            goal = lifecycle.create(tx, c.get_session(tx, sid), "Flag up",
                                    [Requirement(text="flag.txt exists", kind="file_exists", path="flag.txt")], {},
                                    host=host_name(), auto_recover=True)
            child, _ = waits.spawn_child(tx, c.get_work(tx, goal["work_id"]), "still busy", host=host_name())
            tx.execute("UPDATE waits SET state = 'consumed' WHERE work_id = ?", (goal["work_id"],))  # e.g. timed out
            c.apply_control(tx, child, "pause", None)  # unfinished, and not going to finish by itself
            return lifecycle.act(tx, goal["goal_id"], "verify", goal["revision"])

        goal = rig.tx(setup)
        await rig.step()
        assert rig.rows("SELECT state FROM goals WHERE goal_id = ?", (goal["goal_id"],)) == [{"state": "active"}]
        prompts = [i.content for i in rig.items(sid) if i.kind == "goal_prompt"]
        assert any("Subtasks are still running" in p for p in prompts)
        assert rig.rows("SELECT 1 FROM acceptance_results WHERE goal_id = ?", (goal["goal_id"],)) == []
    finally:
        rig.close()


# --------------------------------------------------------------------------- REST contract


@pytest.fixture
async def rest(jp_serverapp: Any, jp_fetch: Any) -> Api:
    await start_goals(jp_serverapp)
    return Api(jp_fetch)


async def test_jobs_rest_contract(rest: Api) -> None:
    sid = await rest.new_session(permissions={"mode": "ask", "allow": ["write_file"]})
    answer = await rest.ok("POST", "jobs", {"session_id": sid, "input": "report status"}, expect=202)
    assert set(answer) >= {"job_id", "work_id"}
    job = await rest.ok("GET", f"jobs/{answer['job_id']}")
    assert (job["job_id"], job["work_id"], job["caller_session_id"]) == (answer["job_id"], answer["work_id"], sid)
    assert job["work"]["phase"] == "queued" and job["work"]["kind"] == "job" and job["result"] is None
    assert job["goal_id"] is None and job["input"] == "report status"
    assert job["actions"]["can_pause"] and job["actions"]["can_end"]
    snap = await rest.ok("GET", f"sessions/{job['session_id']}")
    assert snap["session"]["permissions"] == {"mode": "ask", "allow": ["write_file"], "folders": [], "env_allow": []}  # the caller's, no broader
    # Goal identity: explicit, or the caller session's active Goal
    goal = await rest.ok("POST", "goals", {"session_id": sid, "objective": "Keep it tidy",
                                           "requirements": [{"text": "tidy"}]}, expect=201)
    implicit = await rest.ok("POST", "jobs", {"session_id": sid, "input": "tidy up"}, expect=202)
    assert (await rest.ok("GET", f"jobs/{implicit['job_id']}"))["goal_id"] == goal["goal_id"]
    other = await rest.new_session()
    explicit = await rest.ok("POST", "jobs", {"session_id": other, "input": "x", "goal_id": goal["goal_id"]}, expect=202)
    got = await rest.ok("GET", f"jobs/{explicit['job_id']}")
    assert (got["goal_id"], got["goal_revision"]) == (goal["goal_id"], 1)
    # idempotent on client_request_id
    body = {"session_id": sid, "input": "once", "client_request_id": "c-1"}
    first = await rest.ok("POST", "jobs", body, expect=202)
    assert await rest.ok("POST", "jobs", body, expect=202) == first
    # errors
    for bad, code in ((dict(body, surprise=1), "bad_request"), ({"session_id": sid}, "bad_request"),
                      ({"session_id": sid, "input": ""}, "bad_request")):
        status, err = await rest.call("POST", "jobs", bad)
        assert status == 400
        assert_error(err, code)
    status, err = await rest.call("POST", "jobs", raw="{nope")
    assert status == 400
    assert_error(err, "bad_json")
    for bad in ({"session_id": "ses_missing", "input": "x"}, {"session_id": sid, "input": "x", "goal_id": "goal_missing"}):
        status, err = await rest.call("POST", "jobs", bad)
        assert status == 404
        assert_error(err, "not_found")
    status, err = await rest.call("GET", "jobs/job_missing")
    assert status == 404
    assert_error(err, "not_found")
