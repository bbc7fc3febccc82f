"""Acceptance evidence stays current up to the commit of ``achieved`` (issue 16).

- a ``command`` requirement without a ``path`` is stale after any later write by the agent (a
  committed call that may write: a write tool, a shell command, an MCP or custom tool), unless the
  check is run again; state tools, reads and re-runs of requirement checks do not count;
- the evidence is read again in the transaction that commits ``achieved``: a requirement file that
  changed while the review ran makes the check stale, and the Goal is checked again;
- a permission change while acceptance runs voids it (spec: "Revision or permission changes
  invalidate old acceptance"); the Goal is verified again under the new scope.

Goal turns run in this process against a real control.db, the real Coordinator and the real turn
loop (``tests/inproc.py``); only the model is scripted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.goals import rules
from jupyter_goals.models import GoalPhase, GoalState
from jupyter_goals.store import control as c
from tests.inproc import Rig, acceptance, call, goal, new_goal

DONE = "done\n"
DONE_SHA = hashlib.sha256(DONE.encode()).hexdigest()

RULES: list[dict[str, Any]] = [
    # acceptance reviews that take a while: the test changes something while they run
    {"when": {"purpose": "acceptance", "goal_objective_contains": "Slow review"},
     "respond": {"delay_s": 0.6, "verdicts": [{"requirement_id": "r2", "verdict": "met", "evidence": "looks right"}]}},
    {"when": {"purpose": "acceptance", "goal_objective_contains": "Permission race"},
     "respond": {"delay_s": 0.6, "verdicts": [{"requirement_id": "r1", "verdict": "met", "evidence": "ok"}]}},
    # the second turn of "Stale check" (after acceptance found the check stale): run it again
    {"when": {"last_user_contains": "not yet met", "goal_objective_contains": "Stale check",
              "last_tool_result_contains": "candidate submitted"}, "respond": {"text": "Resubmitted."}},
    {"when": {"last_user_contains": "not yet met", "goal_objective_contains": "Stale check",
              "last_tool_result_contains": "exit status: 0"}, "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "not yet met", "goal_objective_contains": "Stale check"},
     "respond": call("shell", command="grep -q done out.txt")},
    # the first turn: write, check, then write something else, then submit
    {"when": {"last_user_contains": "Stale check", "last_tool_result_contains": "candidate submitted"},
     "respond": {"text": "Submitted."}},
    {"when": {"last_user_contains": "Stale check", "last_tool_result_contains": "notes.txt"},
     "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "Stale check", "last_tool_result_contains": "exit status: 0"},
     "respond": call("write_file", path="notes.txt", content="written after the check")},
    {"when": {"last_user_contains": "Stale check", "last_tool_result_contains": "out.txt"},
     "respond": call("shell", command="grep -q done out.txt")},
    {"when": {"last_user_contains": "Stale check"}, "respond": call("write_file", path="out.txt", content=DONE)},
    # "Slow review" and "Permission race": write the file, submit
    {"when": {"last_user_contains": "Slow review", "last_tool_result_contains": "candidate submitted"},
     "respond": {"text": "ok"}},
    {"when": {"last_user_contains": "Slow review", "last_tool_result_contains": "out.txt"},
     "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "Slow review"}, "respond": call("write_file", path="out.txt", content=DONE)},
    {"when": {"last_user_contains": "Permission race", "last_tool_result_contains": "candidate submitted"},
     "respond": {"text": "ok"}},
    {"when": {"last_user_contains": "Permission race"}, "respond": call("update_goal", candidate=True)},
]
BYPASS = {"mode": "bypass", "allow": []}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES)
    yield r
    r.close()


def verdicts(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["requirement_id"]: v for v in json.loads(row["verdicts"])}


async def while_acceptance_runs(rig: Rig, change: Any) -> None:
    """Run one step; once its acceptance request is in flight (the review waits 0.6 s), ``change()``."""
    reviews = len(rig.rows("SELECT * FROM requests WHERE purpose = 'acceptance'"))
    step = asyncio.create_task(rig.step())
    deadline = time.monotonic() + 10
    while len(rig.rows("SELECT * FROM requests WHERE purpose = 'acceptance'")) == reviews:
        assert time.monotonic() < deadline and not step.done(), "no acceptance request was made"
        await asyncio.sleep(0.02)
    change()
    await step


# --------------------------------------------------------------------------- 1. command without a path


def _effect(call_id: str, tool: str, capability: str, at: float, state: str = "committed", work_id: str = "w",
            result: str = "", **arguments: Any) -> dict[str, Any]:
    return {"work_id": work_id, "call_id": call_id, "tool": tool, "arguments": json.dumps(arguments),
            "capability": capability, "state": state, "result": result, "dispatched_at": at, "ended_at": at + 0.5}


def test_a_command_without_a_path_is_stale_after_any_later_write_but_not_after_reads_state_tools_or_checks() -> None:
    reqs = [{"id": "r1", "kind": "command", "command": "pytest", "path": None},
            {"id": "r2", "kind": "command", "command": "ruff check .", "path": None},
            {"id": "r3", "kind": "command", "command": "make lint", "path": "a.py"}]
    run = _effect("c1", "shell", "unknown", 10.0, result="exit status: 0\n", command="pytest")
    harmless = [_effect("c2", "read_file", "read_only", 11.0, path="a.py"),
                _effect("c3", "todo_write", "state_tool", 12.0, items=[]),
                _effect("c4", "shell", "unknown", 13.0, result="exit status: 0\n", command="ruff check . "),
                _effect("c5", "write_file", "idempotent", 14.0, state="denied", path="x"),
                _effect("c6", "make_lint", "unknown", 15.0, state="never_started")]

    def verdict(effects: list[dict[str, Any]], rid: str = "r1") -> str:
        facts = rules.evidence_facts("w", effects, reqs, {}, {})
        return str(rules.check_requirement(next(r for r in reqs if r["id"] == rid), facts)["verdict"])  # type: ignore[index]

    assert verdict([run, *harmless]) == "met"
    for later in (_effect("c7", "write_file", "idempotent", 20.0, path="notes.txt"),
                  _effect("c8", "shell", "unknown", 20.0, result="exit status: 0\n", command="touch x"),
                  _effect("c9", "mcp_tool", "unknown", 20.0, state="reconciled"),
                  _effect("c10", "shell", "unknown", 20.0, state="cancelled", command="sed -i s/a/b/ a.py"),
                  _effect("c11", "write_file", "idempotent", 20.0, work_id="subtask", path="y")):
        assert verdict([run, *harmless, later]) == "unknown", later
        assert verdict([run, later, {**run, "call_id": "c12", "dispatched_at": 30.0}]) == "met"  # the check ran again
    # a command with a path still reads only its path: another file's write leaves it current
    lint = _effect("c13", "shell", "unknown", 10.0, result="exit status: 0\n", command="make lint")
    assert verdict([lint, _effect("c14", "write_file", "idempotent", 20.0, path="notes.txt")], "r3") == "met"
    assert verdict([lint, _effect("c15", "write_file", "idempotent", 20.0, path="a.py")], "r3") == "unknown"


async def test_a_write_after_the_check_makes_the_goal_run_the_check_again_before_it_is_achieved(rig: Rig) -> None:
    _, gl = new_goal(rig, "Stale check: make out.txt say done", [
        {"text": "the check passes", "kind": "command", "command": "grep -q done out.txt"}], permissions=BYPASS)
    await rig.run_until_quiet()
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACHIEVED
    first, second = acceptance(rig, gl["goal_id"])
    r1 = verdicts(first)["r1"]
    assert first["outcome"] == "unknown" and r1["verdict"] == "unknown"
    assert [e["kind"] for e in r1["evidence"]] == ["receipt", "stale"]  # notes.txt was written after the run
    assert second["outcome"] == "met" and now["verified_result_version"] == 2
    greps = rig.rows("SELECT call_id FROM effects WHERE tool = 'shell' AND state = 'committed'")
    assert len(greps) == 2  # the check ran again after the later write
    assert verdicts(second)["r1"]["evidence"][0]["call_id"] == greps[-1]["call_id"]


# --------------------------------------------------------------------------- 2. checked again at the commit


async def test_a_requirement_file_changed_while_the_review_ran_is_checked_again_before_achieved(rig: Rig) -> None:
    sid, gl = new_goal(rig, "Slow review of out.txt", [
        {"text": "out.txt says done", "kind": "file_digest", "path": "out.txt", "sha256": DONE_SHA},
        {"text": "it reads well"}], permissions=BYPASS)
    out = rig.root / "out.txt"
    await while_acceptance_runs(rig, lambda: out.write_text("tampered\n"))
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACTIVE and now["phase"] == GoalPhase.VERIFYING  # not achieved
    [stale] = acceptance(rig, gl["goal_id"])
    assert stale["outcome"] == "unknown"
    assert {v["evidence"][-1]["kind"] for v in verdicts(stale).values()} == {"stale"}
    assert rig.work(gl["work_id"])["phase"] == "queued" and now["verified_result_version"] == 0

    out.write_text(DONE)  # the file is right again: the next check achieves it
    await rig.run_until_quiet()
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACHIEVED and now["verified_result_version"] == 2
    assert [r["outcome"] for r in acceptance(rig, gl["goal_id"])] == ["unknown", "met"]
    assert verdicts(acceptance(rig, gl["goal_id"])[-1])["r1"]["evidence"][0]["sha256"] == DONE_SHA


async def test_a_file_that_changes_under_every_check_sends_the_goal_back_to_work(rig: Rig) -> None:
    _, gl = new_goal(rig, "Slow review of out.txt", [
        {"text": "out.txt says done", "kind": "file_digest", "path": "out.txt", "sha256": DONE_SHA},
        {"text": "it reads well"}], permissions=BYPASS)
    out = rig.root / "out.txt"
    await while_acceptance_runs(rig, lambda: out.write_text(DONE))  # same content, new mtime: a new version
    assert goal(rig, gl["goal_id"])["phase"] == GoalPhase.VERIFYING
    await while_acceptance_runs(rig, lambda: out.write_text(DONE))
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACTIVE and now["phase"] == GoalPhase.WORKING  # no endless re-checking
    assert [r["outcome"] for r in acceptance(rig, gl["goal_id"])] == ["unknown", "unknown"]
    prompts = [i for i in rig.items(now["session_id"]) if i.kind == "goal_prompt"]
    assert "evidence changed while acceptance ran" in prompts[-1].content


# --------------------------------------------------------------------------- 3. permissions change


async def test_a_permission_change_while_acceptance_runs_voids_it_and_the_goal_is_verified_again(rig: Rig) -> None:
    sid, gl = new_goal(rig, "Permission race", [{"text": "good"}], permissions=BYPASS)
    before = rig.work(gl["work_id"])["control_version"]
    await while_acceptance_runs(rig, lambda: rig.tx(
        lambda tx: c.change_permissions(tx, sid, {"mode": "ask", "allow": []}, None)))
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACTIVE and now["phase"] == GoalPhase.VERIFYING
    assert now["verified_result_version"] == 0
    [void] = acceptance(rig, gl["goal_id"])
    assert void["outcome"] == "met"  # kept as a record, but it was decided under the old permissions
    work = rig.work(gl["work_id"])
    assert work["control_version"] == before + 1 and work["phase"] == "queued"
    assert rig.rows("SELECT end_reason FROM attempts ORDER BY admitted_at")[-1]["end_reason"] == "verification superseded"

    await rig.run_until_quiet()
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACHIEVED and now["verified_result_version"] == 2
    checks = rig.rows("SELECT control_version FROM attempts WHERE end_reason = 'achieved'")
    assert [r["control_version"] for r in checks] == [before + 1]  # verified again under the new scope


# --------------------------------------------------------------------------- the evidence query, both backends


def test_evidence_effects_reads_the_work_item_and_its_subtasks_at_any_depth(backend: Any) -> None:
    from jupyter_goals.store import goals as g

    db = backend.open("control", migrated="control")

    def seed(tx: Any) -> list[str]:
        session = c.create_session(tx, "t", "/tmp", "scripted:x", BYPASS)
        goal_work, child, grandchild, other = (
            c.create_work(tx, session, "goal" if i == 0 else "subtask", {"text": "x"}, auto_recover=True, host="h")["work_id"]
            for i in range(4))
        tx.execute("UPDATE work_items SET parent_work_id = ? WHERE work_id = ?", (goal_work, child))
        tx.execute("UPDATE work_items SET parent_work_id = ? WHERE work_id = ?", (child, grandchild))
        for seq, (wid, call_id) in enumerate([(grandchild, "k3"), (other, "k4"), (goal_work, "k1"), (child, "k2")]):
            tx.execute("INSERT INTO effects (effect_id, call_id, work_id, turn_id, session_id, tool, arguments, capability,"
                       " impl_identity, impl_digest, state, created_at, seq) VALUES (?, ?, ?, 't', ?, 'shell', '{}',"
                       " 'unknown', 'i', 'd', 'committed', 0, ?)", (f"e{seq}", call_id, wid, session["session_id"], seq))
        return [goal_work, child, grandchild]

    goal_work, child, grandchild = db.transact(seed)
    rows = db.transact(lambda tx: g.evidence_effects(tx, goal_work), write=False)
    assert [(r["call_id"], r["work_id"]) for r in rows] == [("k3", grandchild), ("k1", goal_work), ("k2", child)]
    assert {"capability", "state", "result", "dispatched_at", "ended_at", "arguments", "tool"} <= set(rows[0])
