"""One paid-request path (``jupyter_goals/paid.py``): a Goal's requirements request and a chat's work
request that the provider refuses are settled, attributed and held back the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_goals.goals import lifecycle
from jupyter_goals.identity import host_name
from jupyter_goals.models import Phase, ReasonCode
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Row, Tx
from tests.inproc import Rig

REFUSED = {"error": {"status": 500}}  # the provider answered with an error: nothing was consumed


def refused_request(rig: Rig, purpose: str) -> dict[str, Any]:
    rows = rig.rows("SELECT state, usage_known, partial, tokens, error FROM requests WHERE purpose = ?", (purpose,))
    assert len(rows) == 1, rows
    return dict(rows[0])


async def test_a_refused_goal_request_is_settled_like_a_refused_work_request(tmp_path: Path) -> None:
    rules = [{"when": {"purpose": "requirements"}, "respond": REFUSED},
             {"when": {"purpose": "work"}, "respond": REFUSED}]
    rig = Rig(tmp_path, rules)
    try:
        chat = rig.send(rig.session({"mode": "bypass"}), "hello")
        goal_sid = rig.session({"mode": "bypass"})

        def create(tx: Tx) -> Row:
            return lifecycle.create(tx, c.get_session(tx, goal_sid), "Write notes.md", None, {}, host=host_name(),
                                    auto_recover=True)

        goal_work = rig.tx(create)["work_id"]
        assert await rig.step() and await rig.step()
        work, requirements = refused_request(rig, "work"), refused_request(rig, "requirements")
        # an answered error consumed nothing: a receipt of zero, not a request whose usage is unknown
        assert work == requirements
        assert (work["state"], work["usage_known"], work["tokens"]) == ("failed", 1, 0)
        for wid in (chat, goal_work):
            row = rig.work(wid)
            assert (row["phase"], row["reason_code"]) == (Phase.WAITING, ReasonCode.PROVIDER_RETRYING)
            assert float(row["next_attempt_at"]) > 0
    finally:
        rig.close()
