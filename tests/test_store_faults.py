"""Store transitions that fail: before commit, after commit with the acknowledgement lost, or on a lock
timeout (``tests/faultstore.py``), and what the product makes of it.

In-process, real parts: SQLite files with the real migrations, the real ``OutboxDispatcher`` and usage
ledger, the real ``Worker`` (its claim loop, heartbeat and attempt handling, with its database swapped
for a ``FaultyDatabase``), ``TurnRunner``, shell tool (a detached process appending to a file) and
``Coordinator``; the scripted model. Each test first checks that its fault fired, then asserts
durable outcomes: rows, ledger totals, and side effects counted on disk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.config import GoalsConfig
from jupyter_goals.identity import ProcessIdentity, boot_id, host_name
from jupyter_goals.models import EffectState, Usage
from jupyter_goals.recovery.coordinator import Coordinator, RecoveryReport
from jupyter_goals.runtime import worker as worker_module
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.runtime.worker import Worker
from jupyter_goals.store import control as c
from jupyter_goals.store import usage as u
from jupyter_goals.store.db import Database, Row, StorageUnavailable, Tx
from jupyter_goals.store.schema import migrate
from jupyter_goals.usage.ledger import OutboxDispatcher
from jupyter_goals.usage.prices import load_price_table
from tests.faultstore import KINDS, FaultKind, FaultPlan, FaultyDatabase, InjectedFault
from tests.inproc import exited_pid
from tests.storekit import new_chat


@pytest.fixture
def plan(monkeypatch: pytest.MonkeyPatch) -> FaultPlan:
    return FaultPlan(monkeypatch)


def faulty(tmp_path: Path, name: str, plan: FaultPlan, **kw: Any) -> FaultyDatabase:
    db = FaultyDatabase(f"sqlite:///{tmp_path / f'{name}.db'}", plan=plan, **kw)
    migrate(db, name)
    return db


# --------------------------------------------------------------------------- the wrapper itself


@pytest.mark.parametrize("kind", KINDS)
def test_each_fault_kind_leaves_the_database_as_it_says(tmp_path: Path, plan: FaultPlan, kind: FaultKind) -> None:
    db = faulty(tmp_path, "control", plan)
    session, work = db.transact(new_chat)
    plan.fail("sessions.set_retry_at", kind)

    expected: type[BaseException] = sqlite3.OperationalError if kind == "lock_timeout" else InjectedFault
    with pytest.raises(expected) as raised:
        db.transact(lambda tx: c.set_retry_at(tx, work["work_id"], 42.0))
    if kind == "lock_timeout":
        assert "database is locked" in str(raised.value)  # SQLite's own error, from a lock really held
    assert plan.fired == [("sessions.set_retry_at", kind)]
    durable = db.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False)["next_attempt_at"]
    assert durable == (42.0 if kind == "ack_lost" else work["next_attempt_at"])
    # once spent, the fault is gone and the same database commits normally
    db.transact(lambda tx: c.set_retry_at(tx, work["work_id"], 43.0))
    assert db.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False)["next_attempt_at"] == 43.0
    assert plan.reached["sessions.set_retry_at"] == 2
    db.close()


def test_only_transactions_that_reach_the_transition_fail(tmp_path: Path, plan: FaultPlan) -> None:
    db = faulty(tmp_path, "control", plan)
    other = Database(db.url)  # a plain Database on the same file never fails
    _, work = db.transact(new_chat)
    plan.fail("sessions.set_retry_at", "before_commit", when=lambda work_id, at: at == 7.0)
    db.transact(lambda tx: c.set_retry_at(tx, work["work_id"], 6.0))  # not matched by ``when``
    other.transact(lambda tx: c.set_retry_at(tx, work["work_id"], 7.0))  # not a FaultyDatabase
    db.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False)  # no transition reached
    assert plan.fired == []
    with pytest.raises(InjectedFault):
        db.transact(lambda tx: c.set_retry_at(tx, work["work_id"], 7.0))
    assert other.transact(lambda tx: c.get_work(tx, work["work_id"]), write=False)["next_attempt_at"] == 7.0
    db.close()
    other.close()


# --------------------------------------------------------------------------- outbox and usage ledger

MODEL = "openai:gpt-5-mini"  # priced in the bundled table: receipts get a cost
RECEIPTS = {"req_1": (100, 10), "req_2": (200, 20), "req_3": (300, 30)}


class Ledger:
    """control.db with three settled requests (their ``usage.request`` and ``usage.receipt`` operations
    in the outbox), usage.db, and the real dispatcher, both databases faulty under one plan."""

    def __init__(self, tmp_path: Path, plan: FaultPlan) -> None:
        self.control = faulty(tmp_path, "control", plan)
        self.usage = faulty(tmp_path, "usage", plan)
        self.prices = load_price_table(None)
        self.dispatcher = OutboxDispatcher(self.control, self.usage, self.prices)

        def settle(tx: Tx) -> str:
            session, work = new_chat(tx)
            for rid, (i, o) in RECEIPTS.items():
                c.record_request(tx, work, request_id=rid, attempt_id="att_1", turn_id="turn_1", purpose="work",
                                 model=MODEL)
                c.settle_request(tx, rid, {"input_tokens": i, "output_tokens": o},
                                 cost_usd=self.prices.quote(c.request_model(tx, rid) or "", Usage(input_tokens=i, output_tokens=o)))
            return str(session["session_id"])

        self.session_id = self.control.transact(settle)

    async def drain(self) -> None:
        """What ``_outbox_loop`` does, with each durable backoff brought forward (never skipped: a row
        that is not due is not dispatched)."""
        for _ in range(10):
            await self.dispatcher.dispatch_due()
            if self.control.transact(c.pending_outbox_count, write=False) == 0:
                return
            self.control.transact(lambda tx: tx.execute("UPDATE outbox SET next_attempt_at = 0 WHERE state = 'pending'"))
        raise AssertionError("the outbox did not drain")

    def outbox(self, op_key: str) -> dict[str, Any]:
        row = self.control.transact(lambda tx: tx.one("SELECT * FROM outbox WHERE op_key = ?", (op_key,)), write=False)
        assert row is not None
        return row

    def receipts(self) -> list[dict[str, Any]]:
        return self.usage.transact(lambda tx: tx.all("SELECT request_id, input_tokens, output_tokens, cost_usd"
                                                     " FROM receipts ORDER BY request_id"), write=False)

    def close(self) -> None:
        self.control.close()
        self.usage.close()


@pytest.fixture
def ledger(tmp_path: Path, plan: FaultPlan) -> Iterator[Ledger]:
    led = Ledger(tmp_path, plan)
    yield led
    led.close()


# (transition, the outbox operation it is part of, which call fails): always the last operation of the
# burst, so that no later success can hide a failure the dispatcher still reports
LEDGER_TRANSITIONS: list[tuple[str, str, Callable[..., bool]]] = [
    # the ledger's insert-if-absent of a receipt (usage.db): apply_receipt(tx, op_key, payload, prices)
    ("usage.apply_receipt", "receipt:req_3", lambda op_key, *_: op_key == "receipt:req_3"),
    # the request's attribution (usage.db): apply_request(tx, payload)
    ("usage.apply_request", "request:req_3", lambda payload: payload["request_id"] == "req_3"),
    # the operation marked done (control.db): outbox_done(tx, op_key, payload)
    ("requests.outbox_done", "receipt:req_3", lambda op_key, _: op_key == "receipt:req_3"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("transition", "op_key", "when"), LEDGER_TRANSITIONS, ids=[t[0] for t in LEDGER_TRANSITIONS])
async def test_a_failed_ledger_transition_is_retried_and_every_receipt_counted_exactly_once(
    ledger: Ledger, plan: FaultPlan, transition: str, op_key: str, when: Callable[..., bool], kind: FaultKind,
) -> None:
    plan.fail(transition, kind, when=when)
    t0 = time.time()
    await ledger.dispatcher.dispatch_due()
    assert plan.fired == [(transition, kind)]
    row = ledger.outbox(op_key)
    usage_side = transition.startswith("usage.")
    if kind == "ack_lost" and not usage_side:
        assert row["state"] == "done"  # the done mark is durable although its caller saw an error
    else:  # retried later with a durable backoff, not in a hot loop
        assert (row["state"], row["attempts"]) == ("pending", 1)
        assert row["next_attempt_at"] > t0 and row["last_error"]
    if transition == "usage.apply_receipt":  # the receipt is in the ledger exactly when the commit happened
        assert ("req_3" in {r["request_id"] for r in ledger.receipts()}) == (kind == "ack_lost")

    await ledger.drain()

    receipts = ledger.receipts()
    assert [(r["request_id"], r["input_tokens"], r["output_tokens"]) for r in receipts] == [
        (rid, i, o) for rid, (i, o) in RECEIPTS.items()]  # each receipt once, none lost
    totals = ledger.usage.transact(lambda tx: u.summary(tx, session_id=ledger.session_id), write=False)
    assert totals["known_tokens"] == {"input": 600, "output": 60, "cached": 0}
    assert totals["receipts"] == 3 and totals["in_flight_requests"] == 0 and totals["unknown_usage_requests"] == 0
    expected_cost = sum(ledger.prices.quote(MODEL, Usage(input_tokens=i, output_tokens=o)) or 0
                        for i, o in RECEIPTS.values())
    assert totals["known_cost_usd"] == pytest.approx(expected_cost) and expected_cost > 0
    states = ledger.usage.transact(lambda tx: tx.all("SELECT state FROM requests"), write=False)
    assert [s["state"] for s in states] == ["settled"] * 3
    assert ledger.control.transact(lambda tx: tx.all("SELECT op_key FROM outbox WHERE state != 'done'"),
                                   write=False) == []
    # every operation is applied: the dispatcher no longer reports the ledger as failing (the service
    # publishes this to the hard-budget checks, which otherwise hold paid work as budget_unverifiable)
    assert ledger.dispatcher.last_error is None


# --------------------------------------------------------------------------- the worker's fenced writes

COMMAND = "echo line >> count.txt && echo ran"  # the side effect, counted on disk: one line per execution
ANSWER_USAGE = {"input_tokens": 50, "output_tokens": 5}
WORKER_RULES = [
    {"when": {"last_user_contains": "say hello"}, "respond": {"text": "Hello.", "usage": ANSWER_USAGE}},
    {"when": {"last_tool_result_contains": "ran"}, "respond": {"text": "Done: the line was appended."}},
    {"when": {"tool_result_unknown": True}, "respond": {"text": "The outcome is unknown; I will not repeat it."}},
    {"when": {"last_user_contains": "append"},
     "respond": {"text": "Appending.", "tool_calls": [{"name": "shell", "arguments": {"command": COMMAND}}]}},
]


class WorkerRig:
    """A control.db; the Coordinator as the server runs it; and the real ``Worker`` in this process with a
    ``FaultyDatabase``, registered under the identity of a process that has exited, so that the
    Coordinator confirms its death as after a kill once it stops (the server's supervisor reaps a
    worker and recovers at once; here ``recover()`` runs only then, ``admit()`` while a worker lives).

    A worker's exit (``Worker._crash``: ``os._exit`` in the product) is played in-process as the database
    sees it: its connection closes and it writes nothing more; its detached commands live on. Then a new
    worker starts, as the supervisor restarts one."""

    def __init__(self, tmp_path: Path, plan: FaultPlan, monkeypatch: pytest.MonkeyPatch,
                 text: str = "append a line") -> None:
        self.plan = plan
        self.state, self.root = tmp_path / "state", tmp_path / "root"
        self.state.mkdir()
        self.root.mkdir()
        script = tmp_path / "script.json"
        script.write_text(json.dumps({"rules": WORKER_RULES}))
        self.model = f"scripted:{script}"
        self.url = f"sqlite:///{self.state / 'control.db'}"
        self.db = FaultyDatabase(self.url, plan=plan)  # the server's: the Coordinator's transitions can fail too
        migrate(self.db, "control")
        self.pass_failures = 0
        # the "server" configuration of the Coordinator and the workers
        self.config = GoalsConfig(state_dir=self.state, control_db_url=self.url, default_model=self.model,
                                  max_concurrent_turns=2, heartbeat_s=0.2, safety_tick_s=0.05, recovery_backoff_s=0.0,
                                  provider_retry_base_s=0.05)
        self.coordinator = Coordinator(self.db, self.config, registry=ToolRegistry())
        self.workers: list[Worker] = []
        self.exits = 0
        monkeypatch.setattr(worker_module, "ProcessIdentity", _ExitedProcess)
        monkeypatch.setattr(Worker, "_crash", staticmethod(self._exit))

        def send(tx: Tx) -> str:
            session = c.create_session(tx, "t", str(self.root), self.model, {"mode": "bypass"})
            msg, _ = c.accept_message(tx, session, text, "r1", "queue", auto_recover=True, host=host_name())
            return str(msg["work_id"])

        self.work_id = self.db.transact(send)

    def _exit(self) -> None:
        self.exits += 1
        worker = self.workers[-1]
        if not worker.db._closed:
            worker.db.close()

    def _start_worker(self) -> tuple[Worker, asyncio.Task[None]]:
        worker = Worker(f"wkr_{len(self.workers)}", self.config)
        worker.db = FaultyDatabase(self.url, plan=self.plan, inline=True)
        self.workers.append(worker)
        return worker, asyncio.create_task(worker.run())

    def work(self) -> Row:
        return self.db.transact(lambda tx: c.get_work(tx, self.work_id), write=False)

    def effects(self) -> list[Row]:
        return self.db.transact(lambda tx: tx.all("SELECT * FROM effects WHERE work_id = ? ORDER BY seq",
                                                  (self.work_id,)), write=False)

    def executions(self) -> int:
        count = self.root / "count.txt"
        return len(count.read_text().splitlines()) if count.exists() else 0

    async def run_until_done(self, within_s: float = 20.0) -> None:
        """Workers run the work item until it is done; a work item left running fails here."""
        deadline = time.monotonic() + within_s
        while True:
            exits = self.exits
            worker, task = self._start_worker()
            try:
                while self.exits == exits and not task.done():
                    if self.work()["phase"] == "done":
                        return
                    if time.monotonic() > deadline:
                        raise AssertionError(f"the work never finished: {self.work()} {self.effects()}")
                    await self._pass(self.coordinator.admit)  # the admission loop, woken by commits
                    await asyncio.sleep(0.05)
            finally:
                worker.stop()
                await asyncio.wait([task], timeout=10)
            assert task.done() and self.exits > exits, "a worker stopped without exiting"
            await self._pass(self.coordinator.recover)  # the supervisor reaped it: recovery at once

    async def _pass(self, run: Callable[[], Awaitable[RecoveryReport]]) -> None:
        """A Coordinator pass as the admission loop runs it: a failed pass is logged and run again."""
        for _ in range(5):
            try:
                await run()
                return
            except (StorageUnavailable, sqlite3.OperationalError):
                self.pass_failures += 1
        raise AssertionError("five Coordinator passes failed in a row")

    def close(self) -> None:
        self.db.close()
        for w in self.workers:
            w.db.close()


class _ExitedProcess(ProcessIdentity):
    @classmethod
    def current(cls) -> ProcessIdentity:
        return ProcessIdentity(host_name(), boot_id(), exited_pid(), 1)


@pytest.fixture
def worker_rig(tmp_path: Path, plan: FaultPlan, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerRig]:
    rig = WorkerRig(tmp_path, plan, monkeypatch)
    yield rig
    rig.close()


def _result_commit(eff: Row, state: EffectState, *_: Any, **__: Any) -> bool:
    """``TurnRunner._commit_result``'s transition: the call's effect settles with its result."""
    return eff["tool"] == "shell" and state == EffectState.COMMITTED


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_dispatch_commit_never_runs_the_call_twice(worker_rig: WorkerRig, plan: FaultPlan,
                                                                 kind: FaultKind) -> None:
    plan.fail("effects.mark_dispatched", kind)
    await worker_rig.run_until_done()
    assert plan.fired == [("effects.mark_dispatched", kind)]
    assert worker_rig.exits == 1  # the worker whose commit failed exited; recovery took its attempt
    [eff] = worker_rig.effects()
    if kind == "ack_lost":
        # ``dispatched`` is durable but the worker saw an error and started nothing: recovery cannot know
        # whether it ran, so the outcome is unknown and the call is never started again
        assert worker_rig.executions() == 0
        assert eff["state"] in ("unknown", "never_started")
    else:  # nothing was committed: the call is still planned, and a later attempt runs it once
        assert worker_rig.executions() == 1
        assert eff["state"] == "committed" and "ran" in eff["result"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_result_commit_recovers_the_real_result_and_never_reruns_the_call(
    worker_rig: WorkerRig, plan: FaultPlan, kind: FaultKind,
) -> None:
    plan.fail("effects.set_effect_state", kind, when=_result_commit)
    await worker_rig.run_until_done()
    assert plan.fired == [("effects.set_effect_state", kind)]
    assert worker_rig.exits == 1
    assert worker_rig.executions() == 1  # the command ran once, whatever happened to its result's commit
    [eff] = worker_rig.effects()
    assert eff["state"] == "committed" and "ran" in eff["result"]  # its real output, not an unknown outcome


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_receipt_commit_never_counts_an_answer_twice(tmp_path: Path, plan: FaultPlan,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   kind: FaultKind) -> None:
    """The worker commits the answer with its receipt (``requests.settle_request``); the outbox then
    carries the receipt to the ledger. Lost acknowledgement: the answer is kept and never asked again,
    its usage counted once. Not committed: the request is lost (its usage shown as unknown, never as
    zero) and the retry's answer is counted once."""
    rig = WorkerRig(tmp_path, plan, monkeypatch, text="say hello")
    usage_db = Database(f"sqlite:///{tmp_path / 'usage.db'}")
    migrate(usage_db, "usage")
    try:
        plan.fail("requests.settle_request", kind)
        await rig.run_until_done()
        assert plan.fired == [("requests.settle_request", kind)] and rig.exits == 1
        dispatcher = OutboxDispatcher(rig.db, usage_db)
        await dispatcher.dispatch_due()
        assert rig.db.transact(c.pending_outbox_count, write=False) == 0

        requests = rig.db.transact(lambda tx: tx.all("SELECT state FROM requests ORDER BY created_at"), write=False)
        totals = usage_db.transact(lambda tx: u.summary(tx, work_id=rig.work_id), write=False)
        receipts = usage_db.transact(lambda tx: tx.all("SELECT request_id FROM receipts"), write=False)
        assert totals["known_tokens"] == {"input": 50, "output": 5, "cached": 0} and len(receipts) == 1
        if kind == "ack_lost":  # the answer was durable: the model was asked once
            assert [r["state"] for r in requests] == ["received"]
            assert totals["unknown_usage_requests"] == 0
        else:  # asked again; the first request's usage is unknown, not zero and not a guess
            assert [r["state"] for r in requests] == ["lost", "received"]
            assert totals["unknown_usage_requests"] == 1 and "usage unknown for 1" in totals["display"]
        answers = rig.db.transact(lambda tx: tx.all("SELECT content FROM transcript WHERE kind = 'assistant'"),
                                  write=False)
        assert [a["content"] for a in answers] == ["Hello."]  # one answer in the conversation either way
    finally:
        usage_db.close()
        rig.close()


# the Coordinator's transitions while it recovers a dead worker's attempt
RECOVERY_TRANSITIONS = ["attempts.mark_worker_dead", "recovery.claim_recovery", "recovery.record_recovery_decision",
                        "attempts.admit"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("transition", RECOVERY_TRANSITIONS)
async def test_a_failed_recovery_transition_converges_on_the_next_pass(worker_rig: WorkerRig, plan: FaultPlan,
                                                                      transition: str, kind: FaultKind) -> None:
    """The worker exits after its command ran (its result commit fails); then the Coordinator's own
    commit fails. The next pass converges: one death charged, one recovery decision and one interruption
    per dead attempt, the real result recovered, the command run once."""
    plan.fail("effects.set_effect_state", "before_commit", when=_result_commit)
    plan.fail(transition, kind, when=(lambda work, **kw: kw["mode"] != "fresh") if transition == "attempts.admit" else None)
    await worker_rig.run_until_done()
    assert sorted(plan.fired) == sorted([("effects.set_effect_state", "before_commit"), (transition, kind)])
    assert worker_rig.exits == 1 and worker_rig.pass_failures == 1
    assert worker_rig.executions() == 1
    [eff] = worker_rig.effects()
    assert eff["state"] == "committed" and "ran" in eff["result"]

    def rows(sql: str) -> list[Row]:
        return worker_rig.db.transact(lambda tx: tx.all(sql), write=False)

    dead = rows("SELECT attempt_id FROM attempts WHERE state = 'dead'")
    assert len(dead) == 1
    assert [r["state"] for r in rows("SELECT state FROM recovery_decisions WHERE decision_key LIKE 'recover:%'")] \
        == ["applied"]
    assert len(rows("SELECT item_id FROM transcript WHERE kind = 'interruption'")) == 1
    assert len(rows("SELECT seq FROM events WHERE kind = 'recovery.charged'")) == 1
    assert len(rows("SELECT attempt_id FROM attempts WHERE state IN ('admitted', 'running')")) == 0


def test_a_transition_some_module_imports_by_name_is_refused(plan: FaultPlan) -> None:
    with pytest.raises(AssertionError, match=r"store\.\w+ imports emit by name"):
        plan.fail("shared.emit", "before_commit")  # e.g. store/goals.py calls its own copy of the name
