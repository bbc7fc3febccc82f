"""Recovery in chunks (issue 33 item 3): a pass over more interrupted attempts than one chunk
(``RECOVERY_CHUNK``) claims and decides each of them exactly once, and a second pass changes nothing.

In-process: the real Coordinator on a real SQLite file seeded as a kill -9 leaves it (``bench/recovery.py``:
dead workers of this host, half the items waiting on an approval, half mid-turn).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from bench.recovery import seed_interrupted
from jupyter_goals.config import GoalsConfig
from jupyter_goals.recovery.coordinator import RECOVERY_CHUNK, Coordinator
from jupyter_goals.runtime.tools import ToolRegistry
from jupyter_goals.store.db import Database
from jupyter_goals.store.schema import migrate
from jupyter_goals.testing import write_script


def counts(path: Path) -> tuple[int, ...]:
    conn = sqlite3.connect(path)
    try:
        return tuple(int(conn.execute(sql).fetchone()[0]) for sql in (
            "SELECT COUNT(*) FROM recovery_decisions WHERE decision_key LIKE 'recover:%'",
            "SELECT COUNT(*) FROM transcript WHERE kind = 'interruption'",
            "SELECT COUNT(*) FROM attempts WHERE state = 'admitted'",
            "SELECT COUNT(*) FROM events",
        ))
    finally:
        conn.close()


def test_a_pass_over_several_chunks_decides_each_interrupted_attempt_once(tmp_path: Path) -> None:
    state, root = tmp_path / "state", tmp_path / "root"
    state.mkdir()
    root.mkdir()
    model = write_script(tmp_path / "script.json", [], {"text": "x"})
    db = Database(f"sqlite:///{state / 'control.db'}")
    migrate(db, "control")
    n = 2 * (2 * RECOVERY_CHUNK + 50)  # half of them mid-turn: 2.25 chunks of interrupted attempts
    seed_interrupted(db, n, str(root), model)
    config = GoalsConfig(state_dir=state, default_model=model, max_concurrent_turns=16, workers=2)
    coordinator = Coordinator(db, config, registry=ToolRegistry())
    try:
        report = asyncio.run(coordinator.recover())
        assert len(report.recovered) == n // 2
        assert len(report.admitted) == 16
        claims, interruptions, admitted, events = counts(state / "control.db")
        assert (claims, interruptions, admitted) == (n // 2, n // 2, 16)
        decided = sqlite3.connect(state / "control.db").execute(
            "SELECT COUNT(*) FROM recovery_decisions WHERE decision_key LIKE 'recover:%' AND state = 'claimed'"
        ).fetchone()[0]
        assert decided == 0  # every claim was decided
        again = asyncio.run(coordinator.recover())
        assert again.recovered == {} and again.admitted == []
        assert counts(state / "control.db") == (claims, interruptions, admitted, events)  # nothing written
    finally:
        db.close()
