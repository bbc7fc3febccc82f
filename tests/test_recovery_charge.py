"""Which work a worker's death is charged to (the crash-loop counter behind ``recovery_attempts_exceeded``).

Two attempts run on one worker whose process has exited (its death is confirmed by identity, as after
a kill -9): real control.db, real Coordinator, real TurnRunner and shell tool, scripted model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.identity import boot_id, host_name
from jupyter_goals.store import control as c
from jupyter_goals.store.db import Row, Tx
from tests.inproc import Rig, exited_pid

RULES = [
    {"when": {"last_user_contains": "tool"},
     "respond": {"text": "Running.", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 1"}}]}},
    {"when": {"last_user_contains": "think"}, "respond": {"text": "Thought.", "delay_s": 30}},
]
BYPASS = {"mode": "bypass"}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES)
    yield r
    r.close()


def run_on_one_worker_then_kill(rig: Rig, texts: list[str]) -> dict[str, str]:
    """Admit one request per text, run them all on one worker until the tool call (if any) is in
    flight, then let the worker die there. Returns text -> work_id."""
    works = {text: rig.send(rig.session(BYPASS), text) for text in texts}

    async def run() -> None:
        await rig.recover()  # admits them

        def claim_all(tx: Tx) -> list[Row]:
            wid = c.new_id("wkr")
            gen = c.register_worker(tx, wid, host_name(), boot_id(), exited_pid(), 1, 60.0)
            return [a for a in (c.claim_attempt(tx, wid, gen) for _ in texts) if a is not None]

        attempts = rig.tx(claim_all)
        assert len(attempts) == len(texts)
        tasks = [asyncio.create_task(rig._runner(a).run()) for a in attempts]
        for _ in range(200):
            if rig.rows("SELECT 1 FROM effects WHERE state = 'dispatched'") or "tool" not in " ".join(texts):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        for t in tasks:  # the worker dies: nothing more of it runs
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await rig.recover()

    asyncio.run(run())
    return works


def counters(rig: Rig, works: dict[str, str]) -> dict[str, Any]:
    return {text: rig.work(wid)["recovery_attempts"] for text, wid in works.items()}


def test_death_is_charged_to_the_attempt_whose_tool_was_in_flight_not_to_its_neighbours(rig: Rig) -> None:
    works = run_on_one_worker_then_kill(rig, ["run the tool", "think hard"])
    assert counters(rig, works) == {"run the tool": 1, "think hard": 0}
    reasons = {r["work_id"]: r["end_reason"] for r in rig.rows("SELECT work_id, end_reason FROM attempts WHERE state = 'dead'")}
    assert "charged" in reasons[works["run the tool"]] and "charged" not in reasons[works["think hard"]]


def test_death_with_no_tool_in_flight_is_charged_to_every_attempt_it_ran(rig: Rig) -> None:
    works = run_on_one_worker_then_kill(rig, ["think hard", "think again"])
    assert counters(rig, works) == {"think hard": 1, "think again": 1}


def test_repeated_recovery_does_not_charge_a_death_twice(rig: Rig) -> None:
    works = run_on_one_worker_then_kill(rig, ["run the tool"])
    for _ in range(3):
        asyncio.run(rig.recover())
    assert counters(rig, works) == {"run the tool": 1}
