"""Fair admission (DESIGN §8 step 5): round-robin across sessions under the shared quota.

The real Coordinator admits from a real control.db; turns run in this process through the real
TurnRunner with the scripted model (tests/inproc.py). Admission order is read back from the database
(``attempts.admitted_at``), the way an operator would check it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inproc import Rig

RULES = [{"when": {"last_user_contains": "hello"}, "respond": {"text": "Hi.", "usage": {"input_tokens": 1, "output_tokens": 1}}}]
BYPASS = {"mode": "bypass"}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES)
    r.coordinator.config = r.coordinator.config.replace(max_concurrent_turns=1)
    yield r
    r.close()


def admitted_sessions(rig: Rig) -> list[str]:
    return [r["session_id"] for r in rig.rows("SELECT session_id FROM attempts ORDER BY admitted_at, attempt_id")]


def run_one_at_a_time(rig: Rig, limit: int = 50) -> None:
    """Admit and run until nothing is left, checking the quota and single ownership at each admission."""

    async def run() -> None:
        for _ in range(limit):
            await rig.recover()
            live = rig.rows("SELECT work_id, session_id FROM attempts WHERE state IN ('admitted', 'running')")
            assert len(live) <= 1, live  # max_concurrent_turns = 1
            attempt = rig._claim()
            if attempt is None:
                return
            await rig._runner(attempt).run()
        raise AssertionError("work did not settle")

    asyncio.run(run())


def test_queued_work_of_three_sessions_is_admitted_round_robin(rig: Rig) -> None:
    a, b, c = (rig.session(BYPASS) for _ in range(3))
    for sid in (a, b, c):  # all of a's requests first: FIFO by creation would run a, a, a, b, b, b, ...
        for i in range(3):
            rig.send(sid, f"hello {i}")
    run_one_at_a_time(rig)
    assert admitted_sessions(rig) == [a, b, c, a, b, c, a, b, c]
    assert [r["phase"] for r in rig.rows("SELECT phase FROM work_items")] == ["done"] * 9


def test_a_new_session_goes_before_sessions_admitted_recently(rig: Rig) -> None:
    a, b = rig.session(BYPASS), rig.session(BYPASS)
    for sid in (a, b):
        for i in range(3):
            rig.send(sid, f"hello {i}")

    async def two_steps() -> None:
        for _ in range(2):
            assert await rig.step()

    asyncio.run(two_steps())
    late = rig.session(BYPASS)  # arrives after a and b were each admitted once
    rig.send(late, "hello late")
    run_one_at_a_time(rig)
    assert admitted_sessions(rig) == [a, b, late, a, b, a, b]


def test_each_session_runs_one_request_at_a_time_in_its_own_order(rig: Rig) -> None:
    rig.coordinator.config = rig.coordinator.config.replace(max_concurrent_turns=4)
    a, b = rig.session(BYPASS), rig.session(BYPASS)
    works = {sid: [rig.send(sid, f"hello {i}") for i in range(3)] for sid in (a, b)}

    async def run() -> None:
        for _ in range(20):
            await rig.recover()
            per_session = rig.rows(
                "SELECT session_id, COUNT(*) AS n FROM attempts WHERE state IN ('admitted', 'running') GROUP BY session_id"
            )
            assert all(r["n"] == 1 for r in per_session), per_session
            attempt = rig._claim()
            if attempt is None:
                return
            await rig._runner(attempt).run()

    asyncio.run(run())
    for sid, ids in works.items():
        order = [r["work_id"] for r in rig.rows(
            "SELECT work_id FROM attempts WHERE session_id = ? ORDER BY admitted_at", (sid,))]
        assert order == ids
