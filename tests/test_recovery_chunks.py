"""A recovery pass reads in chunks (issue 33: 1,000 interrupted items on PostgreSQL), on SQLite and PostgreSQL:
the recovery summary (``record_pass``) records, for more items than one of its statements reads
(``IN_LIST``), the rows the item-at-a-time reads gave; and the Coordinator's chunked claim and repair read
a work item afresh when an earlier attempt of it was handled in the same transaction (two dead attempts of
one item: the second death is charged on top of the first, each attempt decided once)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.config import GoalsConfig
from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.models import EffectState, RecoveryMode, reason_text, recovery_outcome
from jupyter_goals.recovery.coordinator import Coordinator
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.store import control as c
from jupyter_goals.store import recovery as rs
from jupyter_goals.store import recovery_passes as rp
from jupyter_goals.store.db import NotFound, Row, Tx
from jupyter_goals.testing import write_script
from tests.storekit import PERMS, Backend


def one_at_a_time(tx: Tx, work_id: str, since: float) -> dict[str, Any]:
    """The detail of one item as ``record_pass`` read it before it read in chunks: three reads per item."""
    work = c.get_work(tx, work_id)
    mode = tx.one("SELECT mode FROM recovery_decisions WHERE work_id = ? AND decision_key LIKE ? AND updated_at >= ?"
                  " AND mode IN ('resume_checkpoint', 'new_turn') ORDER BY updated_at DESC LIMIT 1",
                  (work_id, "recover:%", since))
    outcome = recovery_outcome(work["desired_state"], work["phase"])
    return {"outcome": outcome.value, "reason": work["reason"] or reason_text(work["reason_code"]), "kind": work["kind"],
            "session_id": work["session_id"], "desired_state": work["desired_state"],
            "mode": str(mode["mode"]) if mode else None,
            "unknown": tx.all("SELECT call_id, tool FROM effects WHERE work_id = ? AND state = 'unknown' ORDER BY seq",
                              (work_id,))}


def test_record_pass_over_more_items_than_one_statement_reads_records_each_as_one_at_a_time(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    n = rp.IN_LIST + 100
    since = time.time() - 1

    def seed(tx: Tx) -> list[str]:
        ids = []
        for i in range(n):
            s = c.create_session(tx, f"item {i}", "/", "scripted:x", PERMS)
            w = c.create_work(tx, s, "chat", {"text": "x"}, auto_recover=True, host="h")
            ids.append(str(w["work_id"]))
            if i % 3 == 0:  # an interrupted turn whose mode this pass decided (twice for some: the newest counts)
                for j, mode in enumerate([RecoveryMode.RESUME_CHECKPOINT, RecoveryMode.NEW_TURN][: 1 + i % 2]):
                    key = f"recover:att-{i}-{j}"
                    rs.claim_recovery(tx, key, w, "me", since)
                    rs.record_recovery_decision(tx, key, mode, {})
                    tx.execute("UPDATE recovery_decisions SET updated_at = ? WHERE decision_key = ?", (since + 1 + j, key))
            if i % 7 == 0:  # calls whose outcome is unknown, in order
                turn_id = c.new_turn(tx, w, False)
                for k in range(2):
                    call = f"call-{i}-{k}"
                    c.plan_call(tx, w, turn_id, call, "shell", {"command": "x"}, capability="shell",
                                impl_identity="x", impl_digest="d", seq=k + 1)
                    eff = tx.one("SELECT * FROM effects WHERE call_id = ?", (call,))
                    assert eff is not None
                    c.set_effect_state(tx, eff, EffectState.UNKNOWN)
            if i % 11 == 0:
                c.set_phase(tx, w, "waiting", "awaiting_approval")
        return ids

    ids = db.transact(seed)
    counts = db.transact(lambda tx: rp.record_pass(tx, "pass_1", ids, host="h", boot="b", since=since))
    assert sum(counts.values()) == n
    expected = db.transact(lambda tx: {w: one_at_a_time(tx, w, since) for w in ids}, write=False)
    rows = db.transact(lambda tx: tx.all("SELECT work_id, phase, reason_code, detail, control_version FROM"
                                         " recovery_decisions WHERE claimed_by = 'pass_1'"), write=False)
    assert len(rows) == n
    for r in rows:
        work = expected[r["work_id"]]
        assert json.loads(r["detail"]) == work, r["work_id"]
    assert sum(1 for d in expected.values() if d["mode"] == "new_turn") == len(range(1, n, 6))
    assert sum(1 for d in expected.values() if d["unknown"]) == len(range(0, n, 7))
    again = db.transact(lambda tx: rp.record_pass(tx, "pass_1", ids, host="h", boot="b", since=since))
    assert again == counts  # repeated: no duplicate rows
    assert db.transact(lambda tx: tx.scalar("SELECT COUNT(*) FROM recovery_decisions WHERE claimed_by = 'pass_1'")) == n
    with pytest.raises(NotFound):
        db.transact(lambda tx: rp.record_pass(tx, "pass_2", [*ids[:3], "wrk_missing"], host="h", boot="b"))


def test_two_dead_attempts_of_one_item_in_one_chunk_are_charged_and_decided_each_once(
        backend: Backend, tmp_path: Path) -> None:
    db = backend.open("control", migrated="control")
    model = write_script(tmp_path / "script.json", [], {"text": "x"})
    gone = 2 ** 22 + 12345  # a pid no process has here

    def seed(tx: Tx) -> tuple[str, list[str]]:
        s = c.create_session(tx, "twice", str(tmp_path), model, PERMS)
        w = c.create_work(tx, s, "chat", {"text": "x"}, auto_recover=True, host=host_name())
        attempts = []
        for j in range(2):  # admitted and claimed, its worker dies unconfirmed; then again
            wid = f"wkr_gone{j}"
            gen = c.register_worker(tx, wid, host_name(), boot_id(), gone, 1, 3600.0)
            turn = c.open_turn(tx, c.get_work(tx, w["work_id"]))
            c.admit(tx, c.get_work(tx, w["work_id"]), mode="fresh" if turn is None else "resume_checkpoint",
                    turn_id=turn["turn_id"] if turn else None)
            a = c.claim_attempt(tx, wid, gen)
            assert a is not None
            attempts.append(str(a["attempt_id"]))
            if j == 0:
                worker = tx.one("SELECT * FROM workers WHERE worker_id = ?", (wid,))
                assert worker is not None
                c.mark_worker_dead(tx, worker, "process gone")
        return str(w["work_id"]), attempts

    work_id, attempts = db.transact(seed)
    config = GoalsConfig(state_dir=tmp_path / "state", default_model=model, max_concurrent_turns=4, workers=1)
    coordinator = Coordinator(db, config, registry=ToolRegistry())
    report = asyncio.run(coordinator.recover())
    assert report.recovered and work_id in report.recovered

    def read(tx: Tx) -> tuple[Row, list[Row], int]:
        work = c.get_work(tx, work_id)
        claims = tx.all("SELECT decision_key, state, mode FROM recovery_decisions WHERE work_id = ?"
                        " AND decision_key LIKE ? ORDER BY decision_key", (work_id, "recover:%"))
        markers = int(tx.scalar("SELECT COUNT(*) FROM transcript WHERE kind = 'interruption' AND work_id = ?", (work_id,)))
        return work, claims, markers

    work, claims, markers = db.transact(read, write=False)
    assert sorted(r["decision_key"] for r in claims) == sorted(f"recover:{a}" for a in attempts)
    assert all(r["state"] in ("decided", "applied") for r in claims)
    assert markers == 2  # one interruption per dead attempt
    assert int(work["recovery_attempts"]) == 1  # only the confirmed death of this pass was charged
    again = asyncio.run(coordinator.recover())
    assert again.recovered == {}
    assert db.transact(read, write=False)[1:] == (claims, markers)  # nothing decided twice
