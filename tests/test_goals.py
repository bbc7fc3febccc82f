"""Goals (issue 4): objective, requirements, Todo, turn-completion check, independent acceptance,
terminal history, and the REST contract (DESIGN §9, §10).

Goal turns run in this process against a real control.db, the real Coordinator and the real turn
loop (``tests/inproc.py``); only the model is scripted. The REST tests go through a real in-process
Jupyter server (pytest-jupyter). Process-level kill -9 tests are in ``test_crash_goals.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.goals import lifecycle, rules
from jupyter_goals.identity import host_name
from jupyter_goals.models import GoalPhase, GoalState, Requirement
from jupyter_goals.store import control as c
from jupyter_goals.store import goals as g
from jupyter_goals.store.db import Tx, VersionConflict
from tests.inproc import BYPASS, Rig, acceptance, call, goal, new_goal
from tests.restkit import (  # noqa: F401 - the REST fixtures are shared (tests/restkit.py)
    Api,
    assert_error,
    goals_state_dir,
    jp_asyncio_loop,
    jp_server_config,
    start_goals,
)

VERDICT_JSON = '{"verdicts": [{"requirement_id": "r1", "verdict": "met", "evidence": "trust me"}]}'


RULES: list[dict[str, Any]] = [
    # requirements extraction (purpose ``requirements``)
    {"when": {"purpose": "requirements", "any_text_contains": "notes.md"},
     "respond": call("record_requirements", requirements=[{"text": "notes.md exists", "kind": "file_exists",
                                                           "path": "notes.md"}])},
    {"when": {"purpose": "requirements", "goal_objective_contains": "Tidy"},
     "respond": call("record_requirements", ambiguity="Which file should I tidy?")},
    # independent acceptance (purpose ``acceptance``), read-only
    {"when": {"purpose": "acceptance", "goal_objective_contains": "Review", "last_tool_result_contains": "reviewed"},
     "respond": {"verdicts": [{"requirement_id": "r1", "verdict": "met", "evidence": [{"kind": "file", "path": "essay.md"}]}]}},
    {"when": {"purpose": "acceptance", "goal_objective_contains": "Review"},
     "respond": call("read_file", path="essay.md")},
    {"when": {"purpose": "acceptance", "goal_objective_contains": "Race"},
     "respond": {"delay_s": 0.6, "verdicts": [{"requirement_id": "r1", "verdict": "met", "evidence": "ok"}]}},
    {"when": {"purpose": "acceptance", "goal_objective_contains": "Sneaky"},
     "respond": call("write_file", path="sneaky.txt", content="x")},
    # the end-to-end Goal: write a file, run a check; one requirement is unmet at first
    {"when": {"last_user_contains": "not yet met", "last_tool_result_contains": "candidate submitted"},
     "respond": {"text": "Resubmitted."}},
    {"when": {"last_user_contains": "not yet met", "last_tool_result_contains": "exit status: 0"},
     "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "not yet met", "last_tool_result_contains": "wrote"},
     "respond": call("shell", command="grep -q done out.txt")},
    {"when": {"last_user_contains": "not yet met", "goal_objective_contains": "Write out.txt"},
     "respond": call("write_file", path="out.txt", content="done\n")},
    {"when": {"last_user_contains": "Write out.txt", "last_tool_result_contains": "candidate submitted"},
     "respond": {"text": "Submitted."}},
    {"when": {"last_user_contains": "Write out.txt", "last_tool_result_contains": "wrote"},
     "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "Write out.txt"}, "respond": call("write_file", path="out.txt", content="draft\n")},
    # Todo: planned, then emptied; all required items done triggers acceptance
    {"when": {"last_user_contains": "Plan notes", "last_tool_result_contains": "wrote"}, "respond": {"text": "Noted."}},
    {"when": {"last_user_contains": "Plan notes", "last_tool_result_contains": "0 items"},
     "respond": call("write_file", path="notes.md", content="n")},
    {"when": {"last_user_contains": "Plan notes", "last_tool_result_contains": "2 items"},
     "respond": call("todo_write", items=[])},
    {"when": {"last_user_contains": "Plan notes"},
     "respond": call("todo_write", items=[{"text": "write notes", "status": "pending"}, {"text": "check", "status": "pending"}])},
    {"when": {"last_user_contains": "Finish todo", "last_tool_result_contains": "0 open"}, "respond": {"text": "All done."}},
    {"when": {"last_user_contains": "Finish todo", "last_tool_result_contains": "wrote"},
     "respond": call("todo_write", items=[{"text": "write essay", "status": "completed"}])},
    {"when": {"last_user_contains": "Finish todo"}, "respond": call("write_file", path="essay.md", content="reviewed essay")},
    {"when": {"last_user_contains": "Review", "last_tool_result_contains": "candidate submitted"}, "respond": {"text": "ok"}},
    {"when": {"last_user_contains": "Review", "last_tool_result_contains": "wrote"}, "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "Review"}, "respond": call("write_file", path="essay.md", content="reviewed essay")},
    {"when": {"last_user_contains": "Race", "last_tool_result_contains": "candidate submitted"}, "respond": {"text": "ok"}},
    {"when": {"last_user_contains": "Race"}, "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "Sneaky", "last_tool_result_contains": "candidate submitted"}, "respond": {"text": "ok"}},
    {"when": {"last_user_contains": "Sneaky"}, "respond": call("update_goal", candidate=True)},
    # a reply whose text is JSON shaped like a verdict: an ordinary reply
    {"when": {"goal_objective_contains": "Verdict-shaped"}, "respond": {"text": VERDICT_JSON}},
    {"when": {"goal_objective_contains": "Progress", "last_tool_result_contains": "wrote"}, "respond": {"text": "step"}},
    {"when": {"goal_objective_contains": "Progress"}, "respond": call("write_file", path="p.txt", content="x")},
    {"when": {"goal_objective_contains": "Idle"}, "respond": {"text": "Working on it."}},
]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES)
    yield r
    r.close()


async def run_until(rig: Rig, cond: Any, limit: int = 30) -> None:
    for _ in range(limit):
        if cond():
            return
        if not await rig.step():
            break
    assert cond(), "condition not reached"


# --------------------------------------------------------------------------- end to end


async def test_goal_continues_after_an_unmet_acceptance_then_achieves_with_one_terminal_record(rig: Rig) -> None:
    sid, gl = new_goal(rig, "Write out.txt so that it says done", [
        {"text": "out.txt exists", "kind": "file_exists", "path": "out.txt"},
        {"text": "the check passes", "kind": "command", "command": "grep -q done out.txt", "path": "out.txt"},
    ])
    await rig.run_until_quiet()
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACHIEVED
    results = acceptance(rig, gl["goal_id"])
    # the first candidate: the file exists but no check ran → unknown; the second: both met
    assert [r["outcome"] for r in results] == ["unknown", "met"]
    first = {v["requirement_id"]: v["verdict"] for v in json.loads(results[0]["verdicts"])}
    assert first == {"r1": "met", "r2": "unknown"}
    assert now["verified_result_version"] == 2 and now["revision"] == 1
    assert rig.work(gl["work_id"])["phase"] == "done"
    records = rig.db.transact(lambda tx: g.history(tx, sid), write=False)
    assert len(records) == 1
    rec = records[0]
    assert rec["snapshot"]["state"] == "achieved" and rec["snapshot"]["acceptance"]["result_version"] == 2
    items = rig.items(sid)
    anchor = next(i for i in items if i.item_id == rec["anchor"]["item_id"])
    assert anchor.kind == "goal_record" and anchor.seq == rec["anchor"]["seq"] == items[-1].seq
    # verifier output never becomes assistant prose; no evidence ids are appended to chat
    assert not any("verdict" in i.content or "evidence" in i.content for i in items if i.kind == "assistant")
    prompts = [i for i in items if i.kind == "goal_prompt"]
    assert prompts and all(i.role == "user" for i in prompts)


async def test_goal_requests_carry_goal_attribution_and_purposes(rig: Rig) -> None:
    _, gl = new_goal(rig, "Review the essay", [{"text": "the essay is reviewed"}])
    await rig.run_until_quiet()
    assert goal(rig, gl["goal_id"])["state"] == GoalState.ACHIEVED
    rows = rig.rows("SELECT purpose, goal_id, goal_revision FROM requests ORDER BY created_at")
    assert {r["purpose"] for r in rows} == {"work", "acceptance"}
    assert all(r["goal_id"] == gl["goal_id"] and r["goal_revision"] == 1 for r in rows)
    # the review read essay.md with a read-only tool: no effect record, nothing in the transcript
    assert not rig.rows("SELECT * FROM effects WHERE tool = 'read_file'")


async def test_acceptance_review_cannot_write(rig: Rig) -> None:
    _, gl = new_goal(rig, "Sneaky goal", [{"text": "anything"}])
    await run_until(rig, lambda: len(acceptance(rig, gl["goal_id"])) >= 1)
    assert not (rig.root / "sneaky.txt").exists()
    assert goal(rig, gl["goal_id"])["state"] == GoalState.ACTIVE
    assert json.loads(acceptance(rig, gl["goal_id"])[0]["verdicts"])[0]["verdict"] == "unknown"


# --------------------------------------------------------------------------- requirements and Todo


async def test_requirements_are_extracted_at_creation_and_the_original_objective_kept(rig: Rig) -> None:
    _, gl = new_goal(rig, "Keep notes in notes.md")
    assert gl["requirements_state"] == "pending"
    await run_until(rig, lambda: goal(rig, gl["goal_id"])["requirements_state"] == "extracted")
    now = goal(rig, gl["goal_id"])
    assert now["requirements"] == [{"id": "r1", "text": "notes.md exists", "kind": "file_exists", "command": None,
                                    "path": "notes.md", "sha256": None}]
    assert now["original_objective"] == "Keep notes in notes.md"
    assert rig.rows("SELECT purpose FROM requests WHERE purpose = 'requirements'")


async def test_scope_ambiguity_waits_for_the_person_without_model_turns(rig: Rig) -> None:
    sid, gl = new_goal(rig, "Tidy up")
    await rig.step()
    now = goal(rig, gl["goal_id"])
    assert now["requirements_state"] == "clarifying" and now["reason_code"] == "awaiting_clarification"
    n_requests = len(rig.rows("SELECT request_id FROM requests"))
    assert not await rig.step()  # waiting: nothing admitted, no idle model call
    assert rig.work(gl["work_id"])["reason_code"] == "awaiting_clarification"
    assert len(rig.rows("SELECT request_id FROM requests")) == n_requests
    question = [i for i in rig.items(sid) if i.meta.get("goal_clarification")]
    assert question and question[0].content == "Which file should I tidy?"

    def answer(tx: Tx) -> str:
        delivery = lifecycle.message_delivery(tx, sid, "queue")
        msg, _ = c.accept_message(tx, c.get_session(tx, sid), "Tidy notes.md please", "answer-1", delivery,
                                  auto_recover=True, host=host_name())
        return str(msg["work_id"])

    assert rig.tx(answer) == gl["work_id"]  # the answer joins the Goal's work, no new chat item
    await run_until(rig, lambda: goal(rig, gl["goal_id"])["requirements_state"] == "extracted")
    assert goal(rig, gl["goal_id"])["requirements"][0]["path"] == "notes.md"


async def test_removing_todo_items_never_removes_a_requirement(rig: Rig) -> None:
    sid, gl = new_goal(rig, "Plan notes", [{"text": "notes.md exists", "kind": "file_exists", "path": "notes.md"},
                                          {"text": "notes are good"}])
    await run_until(rig, lambda: bool(rig.rows("SELECT * FROM effects WHERE tool = 'write_file'")))
    todo = rig.db.transact(lambda tx: g.get_todo(tx, sid), write=False)
    assert todo[0] == [] and todo[1] == 2  # written, then emptied
    assert [r["id"] for r in goal(rig, gl["goal_id"])["requirements"]] == ["r1", "r2"]
    effects = rig.rows("SELECT tool, state FROM effects WHERE tool = 'todo_write'")
    assert [e["state"] for e in effects] == ["committed", "committed"]  # committed with their record


async def test_all_required_todo_items_done_enters_verifying(rig: Rig) -> None:
    _, gl = new_goal(rig, "Finish todo then Review", [{"text": "essay reviewed"}])
    await run_until(rig, lambda: len(acceptance(rig, gl["goal_id"])) >= 1)
    assert goal(rig, gl["goal_id"])["state"] == GoalState.ACHIEVED


def test_only_a_reasoned_human_revision_removes_a_requirement(tmp_path: Path) -> None:
    rig = Rig(tmp_path, RULES)
    try:
        _, gl = new_goal(rig, "x", [{"text": "a"}, {"text": "b"}])
        keep_a = [Requirement(id="r1", text="a")]
        with pytest.raises(rules.InvalidGoalChange):
            rig.tx(lambda tx: lifecycle.revise(tx, gl["goal_id"], 1, requirements=keep_a))
        with pytest.raises(rules.InvalidGoalChange):
            rig.tx(lambda tx: lifecycle.revise(tx, gl["goal_id"], 1, requirements=keep_a, reason="no", actor="agent"))
        with pytest.raises(VersionConflict):
            rig.tx(lambda tx: lifecycle.revise(tx, gl["goal_id"], 7, requirements=keep_a, reason="waived"))
        now = rig.tx(lambda tx: lifecycle.revise(tx, gl["goal_id"], 1, requirements=keep_a, reason="b is out of scope"))
        assert now["revision"] == 2 and [r["id"] for r in now["requirements"]] == ["r1"]
        revs = rig.db.transact(lambda tx: g.revisions(tx, gl["goal_id"]), write=False)
        assert [(r["revision"], r["reason"], r["actor"]) for r in revs] == [(1, "", "user"), (2, "b is out of scope", "user")]
    finally:
        rig.close()


# --------------------------------------------------------------------------- progress, not rounds


async def test_verdict_shaped_json_reply_is_an_ordinary_reply_and_does_not_end_the_goal(rig: Rig) -> None:
    sid, gl = new_goal(rig, "Verdict-shaped replies", [{"text": "done", "kind": "file_exists", "path": "never.txt"}])
    await rig.step()
    items = rig.items(sid)
    replies = [i for i in items if i.kind == "assistant"]
    assert replies[-1].content == VERDICT_JSON and replies[-1].role == "assistant"  # unchanged, still chat
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACTIVE and now["phase"] == GoalPhase.WORKING
    assert acceptance(rig, gl["goal_id"]) == []
    assert items[-1].kind == "goal_prompt"  # the Goal continues with another turn


async def test_same_no_progress_reply_three_turns_in_a_row_blocks_and_waits(rig: Rig) -> None:
    _, gl = new_goal(rig, "Idle goal", [{"text": "x"}])
    for _ in range(rules.BLOCKED_AFTER):
        assert await rig.step()
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.BLOCKED and now["reason_code"] == "goal_blocked" and now["turns"] == 3
    assert not await rig.step()  # a blocked Goal makes no idle model turns
    assert rig.work(gl["work_id"])["reason_code"] == "goal_blocked"
    rig.tx(lambda tx: lifecycle.act(tx, gl["goal_id"], "resume", 1))
    assert await rig.step()  # resumed: it works again


async def test_goal_making_progress_has_no_round_cap(rig: Rig) -> None:
    _, gl = new_goal(rig, "Progress forever", [{"text": "x"}])
    for _ in range(rules.BLOCKED_AFTER * 3):
        assert await rig.step()
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACTIVE and now["turns"] == rules.BLOCKED_AFTER * 3


async def test_paused_goal_is_not_continued_by_a_stale_wakeup(rig: Rig) -> None:
    _, gl = new_goal(rig, "Idle goal", [{"text": "x"}])
    assert await rig.step()
    rig.tx(lambda tx: lifecycle.act(tx, gl["goal_id"], "pause", 1))
    n = len(rig.rows("SELECT request_id FROM requests"))
    assert not await rig.step() and not await rig.step()
    assert len(rig.rows("SELECT request_id FROM requests")) == n
    assert rig.work(gl["work_id"])["phase"] == "paused" and goal(rig, gl["goal_id"])["state"] == "paused"
    rig.tx(lambda tx: lifecycle.act(tx, gl["goal_id"], "resume", 1))
    assert await rig.step()


# --------------------------------------------------------------------------- optimistic concurrency


async def test_a_revision_racing_verification_cannot_commit_achieved(rig: Rig) -> None:
    _, gl = new_goal(rig, "Race the verifier", [{"text": "good"}])
    verifying = asyncio.create_task(rig.step())  # the turn submits a candidate, then acceptance runs
    deadline = time.monotonic() + 5
    while not rig.rows("SELECT * FROM requests WHERE purpose = 'acceptance'"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    rig.tx(lambda tx: lifecycle.revise(tx, gl["goal_id"], 1, objective="Race the verifier, edited"))
    await verifying
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACTIVE and now["revision"] == 2 and now["verified_result_version"] == 0
    [result] = acceptance(rig, gl["goal_id"])
    assert result["outcome"] == "met" and result["revision"] == 1  # kept, but it was for the old revision
    await rig.run_until_quiet()
    now = goal(rig, gl["goal_id"])
    assert now["state"] == GoalState.ACHIEVED and now["verified_result_version"] == 2
    assert acceptance(rig, gl["goal_id"])[-1]["revision"] == 2


async def test_a_goal_revision_invalidates_pending_approvals_and_old_continuations(rig: Rig) -> None:
    _, gl = new_goal(rig, "Write out.txt in ask mode", [{"text": "x"}], permissions={"mode": "ask", "allow": []})
    await rig.step()
    assert [a["tool"] for a in rig.approvals("pending")] == ["write_file"]
    before = rig.work(gl["work_id"])["control_version"]
    rig.tx(lambda tx: lifecycle.revise(tx, gl["goal_id"], 1, objective="Write out.txt in ask mode, revised"))
    assert rig.approvals("pending") == []
    [voided] = rig.approvals("invalidated")
    assert "Goal was edited" in voided["reason"]
    work = rig.work(gl["work_id"])
    assert work["control_version"] == before + 1 and work["objective_revision"] == 2


def test_the_verdicts_that_count_are_those_of_the_acceptance_of_the_current_revision_only() -> None:
    """The Goal answer's ``verdicts`` (computed here, rendered by every client): one per requirement in
    order; an acceptance of an older revision no longer counts; a requirement it did not judge is unchecked."""
    reqs = [{"id": "r1", "text": "a"}, {"id": "r2", "text": "b"}, {"id": "r3", "text": "c"}]
    checked = {"revision": 2, "verdicts": [{"requirement_id": "r2", "verdict": "met", "evidence": [{"kind": "x"}]},
                                           {"requirement_id": "r1", "verdict": "unmet", "evidence": []}]}
    assert rules.current_verdicts(reqs, 2, checked) == [
        {"requirement_id": "r1", "verdict": "unmet", "evidence": [], "checked": True},
        {"requirement_id": "r2", "verdict": "met", "evidence": [{"kind": "x"}], "checked": True},
        {"requirement_id": "r3", "verdict": "unknown", "evidence": [], "checked": False},
    ]
    for stale in (3, 1):  # the Goal was revised since (or the acceptance is newer than the answer read)
        assert [v["checked"] for v in rules.current_verdicts(reqs, stale, checked)] == [False, False, False]
    assert [v["verdict"] for v in rules.current_verdicts(reqs, 2, None)] == ["unknown"] * 3


async def test_a_goal_answer_and_its_terminal_record_carry_the_verdicts_that_count(rig: Rig) -> None:
    """After a revision the answer's verdicts are unchecked again (the old acceptance is kept, but no longer
    counts); the record of an ended Goal keeps those that counted when it ended, also for a record saved
    before answers carried them."""
    sid, gl = new_goal(rig, "Race the verifier", [{"text": "good"}])
    await rig.run_until_quiet()
    achieved = rig.tx(lambda tx: lifecycle.view(tx, g.get_goal(tx, gl["goal_id"])))
    assert [(v["verdict"], v["checked"]) for v in achieved["verdicts"]] == [("met", True)]
    [record] = rig.db.transact(lambda tx: g.history(tx, sid), write=False)
    assert [(v["verdict"], v["checked"]) for v in lifecycle.history_view(record)["snapshot"]["verdicts"]] == [("met", True)]
    legacy = {**record, "snapshot": {k: v for k, v in record["snapshot"].items() if k != "verdicts"}}
    assert lifecycle.history_view(legacy)["snapshot"]["verdicts"] == achieved["verdicts"]

    _, other = new_goal(rig, "Judged, then revised", [{"id": "r1", "text": "good"}])  # not run: judged by hand
    met = [{"requirement_id": "r1", "verdict": "met", "evidence": []}]
    rig.tx(lambda tx: g.insert_acceptance(tx, g.get_goal(tx, other["goal_id"]), 1, "met", met, []))
    view = rig.tx(lambda tx: lifecycle.view(tx, g.get_goal(tx, other["goal_id"])))
    assert [(v["verdict"], v["checked"]) for v in view["verdicts"]] == [("met", True)]
    rig.tx(lambda tx: lifecycle.revise(tx, other["goal_id"], 1, objective="Judged, then revised: edited"))
    view = rig.tx(lambda tx: lifecycle.view(tx, g.get_goal(tx, other["goal_id"])))
    assert view["revision"] == 2 and view["acceptance"]["revision"] == 1  # kept, no longer counts
    assert [(v["verdict"], v["checked"]) for v in view["verdicts"]] == [("unknown", False)]


def test_may_achieve_needs_current_revision_and_newest_result() -> None:
    ok = {"state": "active", "phase": "verifying", "revision": 3, "checked_revision": 3, "result_version": 5,
          "newest_result_version": 5, "result": rules.Verdict.MET}
    assert rules.may_achieve(**ok)
    for change in ({"checked_revision": 2}, {"newest_result_version": 6}, {"result": rules.Verdict.UNKNOWN},
                   {"state": "paused"}, {"phase": "working"}):
        assert not rules.may_achieve(**{**ok, **change})


def test_command_requirement_needs_exit_zero_after_the_last_write() -> None:
    req = {"id": "r1", "text": "t", "kind": "command", "command": "pytest", "path": "a.py"}
    run = rules.CommandRun("c1", "pytest", 0, started_at=10.0)
    assert rules.check_requirement(req, rules.EvidenceFacts(runs=(run,), last_write={"a.py": 5.0}))["verdict"] == "met"  # type: ignore[index]
    stale = rules.EvidenceFacts(runs=(run,), last_write={"a.py": 11.0})
    assert rules.check_requirement(req, stale)["verdict"] == "unknown"  # type: ignore[index]
    failed = rules.EvidenceFacts(runs=(rules.CommandRun("c2", "pytest", 1, 12.0),), last_write={"a.py": 11.0})
    assert rules.check_requirement(req, failed)["verdict"] == "unmet"  # type: ignore[index]
    assert rules.check_requirement(req, rules.EvidenceFacts())["verdict"] == "unknown"  # type: ignore[index]


def test_review_cannot_override_deterministic_verdicts_and_missing_ones_are_unknown() -> None:
    reqs = [{"id": "r1", "kind": "file_exists"}, {"id": "r2", "kind": "semantic"}, {"id": "r3", "kind": "semantic"}]
    det = [{"requirement_id": "r1", "verdict": "unmet", "evidence": []}]
    review = [{"requirement_id": "r1", "verdict": "met"}, {"requirement_id": "r2", "verdict": "met", "evidence": "x"}]
    merged = rules.merge_verdicts(reqs, det, review)
    assert [v["verdict"] for v in merged] == ["unmet", "met", "unknown"]
    assert rules.outcome(merged) == rules.Verdict.UNMET


def test_legacy_paused_recoverable_goal_reads_as_paused_with_explanation(tmp_path: Path) -> None:
    rig = Rig(tmp_path, RULES)
    try:
        _, gl = new_goal(rig, "old", [{"text": "a"}])
        rig.tx(lambda tx: tx.execute("UPDATE goals SET state = 'paused_recoverable' WHERE goal_id = ?", (gl["goal_id"],)))
        now = goal(rig, gl["goal_id"])
        assert now["state"] == "paused" and now["reason_code"] == "legacy_paused_unknown" and now["reason"]
    finally:
        rig.close()


# --------------------------------------------------------------------------- REST contract


@pytest.fixture
async def rest(jp_serverapp: Any, jp_fetch: Any) -> Api:
    await start_goals(jp_serverapp)
    return Api(jp_fetch)


async def make_session(rest: Api) -> str:
    return await rest.new_session(permissions=BYPASS)


async def test_goal_rest_create_get_list_and_errors(rest: Api) -> None:
    sid = await make_session(rest)
    body = {"session_id": sid, "objective": "Write out.txt",
            "requirements": [{"text": "exists", "kind": "file_exists", "path": "out.txt"}], "budget": {"max_cost_usd": 2}}
    created = await rest.ok("POST", "goals", body, expect=201)
    assert created["state"] == "active" and created["phase"] == "working" and created["revision"] == 1
    assert created["requirements"][0]["id"] == "r1" and created["budget"] == {"max_cost_usd": 2}
    assert set(created) >= {"goal_id", "session_id", "objective", "requirements", "state", "phase", "revision",
                            "budget", "usage", "actions", "acceptance"}
    assert created["actions"] == {"can_pause": True, "can_resume": False, "can_stop": False, "can_end": True,
                                  "can_retry": False, "can_verify": True, "can_takeover": False,
                                  "reason_code": ""}  # a Goal ends, never stops
    gid = created["goal_id"]
    assert (await rest.ok("GET", f"goals/{gid}"))["goal_id"] == gid
    listed = await rest.ok("GET", "goals", params={"session_id": sid})
    assert [x["goal_id"] for x in listed["goals"]] == [gid]
    snap = await rest.ok("GET", f"sessions/{sid}")
    assert snap["goal"]["goal_id"] == gid and snap["todo"] == [] and snap["work"]["kind"] == "goal"
    # errors: unknown field, bad JSON, bad requirement, unknown ids, a second Goal while one runs
    code, answer = await rest.call("POST", "goals", {**body, "surprise": 1})
    assert code == 400
    assert_error(answer, "bad_request")
    code, answer = await rest.call("POST", "goals", raw="{nope")
    assert code == 400
    assert_error(answer, "bad_json")
    code, answer = await rest.call("POST", "goals", {"session_id": sid, "objective": "x",
                                                    "requirements": [{"text": "t", "kind": "command"}]})
    assert code == 400
    assert_error(answer, "bad_request")
    code, answer = await rest.call("GET", "goals/goal_missing")
    assert code == 404
    assert_error(answer, "not_found")
    code, answer = await rest.call("POST", "goals", {"session_id": "ses_missing", "objective": "x"})
    assert code == 404
    code, answer = await rest.call("POST", "goals", {"session_id": sid, "objective": "another"})
    assert code == 409
    assert_error(answer, "conflict")


async def test_goal_rest_patch_and_actions_use_expected_revision(rest: Api) -> None:
    sid = await make_session(rest)
    gl = await rest.ok("POST", "goals", {"session_id": sid, "objective": "o",
                                        "requirements": [{"text": "a"}, {"text": "b"}]}, expect=201)
    gid = gl["goal_id"]
    code, answer = await rest.call("PATCH", f"goals/{gid}", {"expected_revision": 9, "objective": "p"})
    assert code == 409
    assert_error(answer, "conflict")
    code, answer = await rest.call("PATCH", f"goals/{gid}", {"expected_revision": 1, "requirements": [{"id": "r1", "text": "a"}]})
    assert code == 400  # dropping r2 is a waiver: it needs a reason
    assert_error(answer, "bad_request")
    code, _ = await rest.call("PATCH", f"goals/{gid}", {"expected_revision": 1, "color": "red"})
    assert code == 400
    patched = await rest.ok("PATCH", f"goals/{gid}", {"expected_revision": 1, "requirements": [{"id": "r1", "text": "a"}],
                                                     "reason": "b is not needed"})
    assert patched["revision"] == 2 and [r["id"] for r in patched["requirements"]] == ["r1"]
    assert patched["original_objective"] == "o"
    code, answer = await rest.call("POST", f"goals/{gid}/actions", {"action": "pause", "expected_revision": 1})
    assert code == 409
    paused = await rest.ok("POST", f"goals/{gid}/actions", {"action": "pause", "expected_revision": 2})
    assert paused["state"] == "paused" and paused["actions"]["can_resume"] and not paused["actions"]["can_pause"]
    snap = await rest.ok("GET", f"sessions/{sid}")
    assert snap["work"]["desired_state"] == "paused"
    code, _ = await rest.call("POST", f"goals/{gid}/actions", {"action": "fly", "expected_revision": 2})
    assert code == 400
    resumed = await rest.ok("POST", f"goals/{gid}/actions", {"action": "resume", "expected_revision": 2})
    assert resumed["state"] == "active"
    verifying = await rest.ok("POST", f"goals/{gid}/actions", {"action": "verify", "expected_revision": 2})
    assert verifying["phase"] == "verifying" and not verifying["actions"]["can_verify"]


async def test_ended_goals_leave_one_read_only_history_record_each(rest: Api) -> None:
    sid = await make_session(rest)
    first = await rest.ok("POST", "goals", {"session_id": sid, "objective": "first", "requirements": [{"text": "a"}]},
                         expect=201)
    ended = await rest.ok("POST", f"goals/{first['goal_id']}/actions", {"action": "end", "expected_revision": 1})
    assert ended["state"] == "cancelled" and ended["actions"]["can_end"] is False
    code, _ = await rest.call("POST", f"goals/{first['goal_id']}/actions", {"action": "end", "expected_revision": 1})
    assert code == 409
    second = await rest.ok("POST", "goals", {"session_id": sid, "objective": "second", "requirements": [{"text": "b"}]},
                          expect=201)
    await rest.ok("POST", f"sessions/{sid}/actions", {"action": "stop"})  # a session stop ends its Goal too
    assert (await rest.ok("GET", f"goals/{second['goal_id']}"))["state"] == "cancelled"
    records = (await rest.ok("GET", f"sessions/{sid}/history"))["records"]
    assert [r["goal_id"] for r in records] == [first["goal_id"], second["goal_id"]]
    assert [r["snapshot"]["objective"] for r in records] == ["first", "second"]  # the later one replaced nothing
    assert records[0]["anchor"]["seq"] < records[1]["anchor"]["seq"] and all(r["read_only"] for r in records)
    one = await rest.ok("GET", f"history/{records[0]['record_id']}")
    assert one == records[0]
    code, answer = await rest.call("GET", "history/hist_missing")
    assert code == 404
    snap = await rest.ok("GET", f"sessions/{sid}")
    assert snap["goal"] is None  # the composer shows the current Goal only
    kinds = [i["kind"] for i in snap["transcript"]["items"]]
    assert kinds.count("goal_record") == 2
    events = await rest.events()
    assert {"goal.created", "goal.updated", "goal.history"} <= {e["kind"] for e in events["events"]}
