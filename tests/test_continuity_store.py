"""What a chat's continuity banner reads (issue 32 item 4), on SQLite and PostgreSQL: a recovery pass
records, for each work item it found, the recovery mode decided for its interrupted turn in this pass
(never one decided before the pass began) and the calls whose outcome is unknown after it. Over REST
(in-process server): ``GET /recovery?session_id=`` answers one session's items, 404 for an unknown one."""

from __future__ import annotations

import time
from typing import Any

from jupyter_goals.models import EffectState, RecoveryMode
from jupyter_goals.store import control as c
from jupyter_goals.store import recovery as rs
from jupyter_goals.store import recovery_passes as rp
from jupyter_goals.store.db import Tx
from tests.restkit import Api, api, goals_state_dir, jp_asyncio_loop, jp_server_config  # noqa: F401
from tests.storekit import PERMS, Backend


def test_a_pass_records_the_mode_decided_in_it_and_the_unknown_calls(backend: Backend) -> None:
    db = backend.open("control", migrated="control")

    def seed(tx: Tx) -> dict[str, Any]:
        made = {}
        for name in ("repaired", "resumed", "earlier"):
            s = c.create_session(tx, name, "/", "scripted:x", PERMS)
            made[name] = c.create_work(tx, s, "chat", {"text": "slow"}, auto_recover=True, host="h")
        work = made["repaired"]
        turn_id = c.new_turn(tx, work, False)
        c.plan_call(tx, work, turn_id, "call-1", "shell", {"command": "sleep 10"}, capability="shell",
                    impl_identity="x", impl_digest="d", seq=1)
        eff = tx.one("SELECT * FROM effects WHERE call_id = 'call-1'")
        assert eff is not None
        c.mark_dispatched(tx, eff, "att-1")
        c.set_effect_state(tx, tx.one("SELECT * FROM effects WHERE call_id = 'call-1'"), EffectState.UNKNOWN)
        return made

    made = db.transact(seed)
    before = time.time() - 60

    def decide(tx: Tx, name: str, mode: RecoveryMode, at: float) -> None:
        key = f"recover:att-{name}"
        rs.claim_recovery(tx, key, made[name], "me", at)
        rs.record_recovery_decision(tx, key, mode, {})
        tx.execute("UPDATE recovery_decisions SET updated_at = ? WHERE decision_key = ?", (at, key))

    db.transact(lambda tx: decide(tx, "earlier", RecoveryMode.RESUME_CHECKPOINT, before))  # a pass before this one
    since = time.time() - 1
    db.transact(lambda tx: decide(tx, "repaired", RecoveryMode.NEW_TURN, time.time()))
    db.transact(lambda tx: decide(tx, "resumed", RecoveryMode.RESUME_CHECKPOINT, time.time()))
    ids = [str(made[n]["work_id"]) for n in ("repaired", "resumed", "earlier")]
    db.transact(lambda tx: rp.record_pass(tx, "pass_1", ids, host="h", boot="b", since=since))
    _, rows = db.transact(rp.last_pass)
    found = {r["title"]: (r["detail"]["mode"], r["detail"]["unknown"]) for r in rows}
    assert found == {
        "repaired": ("new_turn", [{"call_id": "call-1", "tool": "shell"}]),
        "resumed": ("resume_checkpoint", []),
        "earlier": (None, []),
    }


async def test_the_recovery_summary_of_one_session_and_404_for_an_unknown_one(api: Api) -> None:  # noqa: F811
    sid = await api.new_session()
    summary = await api.ok("GET", "recovery", params={"session_id": sid})
    assert summary["items"] == [] and summary["recovered_at"] is None  # nothing recovered since this start
    status, answer = await api.call("GET", "recovery", params={"session_id": "ses_00000000000000000000"})
    assert status == 404 and answer["error"] == "not_found", answer
