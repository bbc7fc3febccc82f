"""Approvals, permission scope and the unknown-effect restriction (DESIGN §6, §10; issue 3).

Turns run in this process against a real control.db, the real Coordinator and real detached shell
processes (``tests/inproc.py``); only the model is scripted. The process-level versions with kill -9
are in ``test_crash_approvals.py``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.store.db import VersionConflict
from tests.inproc import Rig

SAMPLE_TOOL = {"impl": "tests.sample_tools:read_secret_writer", "description": "Reads a secret (it says)."}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


RULES: list[dict[str, Any]] = [
    {"when": {"last_tool_result_contains": "denied by the user"}, "respond": {"text": "Not done, as you wish."}},
    {"when": {"last_user_contains": "latejob", "last_tool_result_contains": "wrote ", "any_text_contains": "[late result]"},
     "respond": {"text": "The earlier command did finish."}},
    {"when": {"last_user_contains": "longjob", "last_tool_result_contains": "appended a line"}, "respond": {"text": "All done."}},
    {"when": {"last_user_contains": "longjob", "last_tool_result_contains": "wrote "}, "respond": call("read_secret_writer")},
    {"when": {"last_tool_result_contains": "wrote "}, "respond": {"text": "Written."}},
    {"when": {"last_tool_result_contains": "appended a line"}, "respond": {"text": "Secret read."}},
    {"when": {"last_user_contains": "longjob", "last_tool_result_contains": "probe-content"},
     "respond": call("write_file", path="notes.md", content="after the crash")},
    {"when": {"last_user_contains": "longjob", "tool_result_unknown": True}, "respond": call("read_file", path="probe.txt")},
    {"when": {"last_user_contains": "longjob"}, "respond": call("shell", command="sleep 30; echo done >> f.txt")},
    {"when": {"last_user_contains": "latejob", "tool_result_unknown": True},
     "respond": call("write_file", path="late-notes.md", content="x")},
    {"when": {"last_user_contains": "latejob"}, "respond": call("shell", command="sleep 1.5; echo done >> late.txt")},
    {"when": {"last_user_contains": "write-inside"}, "respond": call("write_file", path="notes/a.md", content="a")},
    {"when": {"last_user_contains": "write-deep"}, "respond": call("write_file", path="notes/sub/b.md", content="b")},
    {"when": {"last_user_contains": "write-outside"}, "respond": call("write_file", path="../escape.md", content="e")},
    {"when": {"last_user_contains": "write-link"}, "respond": call("write_file", path="notes/link.md", content="l")},
    {"when": {"last_user_contains": "use-secret-tool"}, "respond": call("read_secret_writer")},
]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES, trusted_tools={"read_secret_writer": {**SAMPLE_TOOL, "capability": "unknown"}})
    yield r
    r.close()


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def last_text(rig: Rig, sid: str) -> str:
    return [i.content for i in rig.items(sid) if i.kind == "assistant"][-1]


async def crash_with_unknown_shell(rig: Rig, sid: str) -> None:
    """The worker dies while ``shell`` runs and the tool's process group is killed too: unknown."""
    effect_dir = await rig.crash_after_spawn()
    await rig.kill_command(effect_dir)
    report = await rig.recover()
    assert "new_turn" in report.recovered.values()


# --------------------------------------------------------------------------- permission scope


async def test_path_rule_allows_a_write_only_inside_its_glob(rig: Rig) -> None:
    (rig.root / "notes").mkdir()
    os.symlink(rig.root.parent / "secret.md", rig.root / "notes" / "link.md")
    sid = rig.session({"mode": "ask", "allow": [{"tool": "write_file", "path": "notes/*.md"}]})
    rig.send(sid, "write-inside please")
    await rig.run_until_quiet()
    assert (rig.root / "notes" / "a.md").read_text() == "a"
    assert rig.approvals() == []
    for text, target in (("write-deep", rig.root / "notes" / "sub" / "b.md"), ("write-outside", rig.root.parent / "escape.md"),
                         ("write-link", rig.root.parent / "secret.md")):
        work_id = rig.send(sid, f"{text} please")
        await rig.run_until_quiet()
        assert rig.work(work_id)["reason_code"] == "awaiting_approval", text
        assert not target.exists(), text
        [pending] = rig.approvals("pending")
        rig.decide(pending["approval_id"], "deny")
        await rig.run_until_quiet()
        assert rig.work(work_id)["phase"] == "done"
        assert not target.exists(), text


async def test_tool_name_in_allow_still_runs_without_approval(rig: Rig) -> None:
    sid = rig.session({"mode": "ask", "allow": ["write_file"]})
    rig.send(sid, "write-deep please")
    await rig.run_until_quiet()
    assert (rig.root / "notes" / "sub" / "b.md").exists()
    assert rig.approvals() == []


async def test_custom_tool_named_read_is_not_treated_as_read_only(rig: Rig) -> None:
    sid = rig.session({"mode": "ask"})
    work_id = rig.send(sid, "use-secret-tool")
    await rig.run_until_quiet()
    assert rig.work(work_id)["reason_code"] == "awaiting_approval"
    [pending] = rig.approvals("pending")
    assert (pending["tool"], pending["capability"]) == ("read_secret_writer", "unknown")
    assert lines(rig.root / "secret.txt") == 0


async def test_approval_is_consumed_once_and_a_second_decision_conflicts(rig: Rig) -> None:
    sid = rig.session({"mode": "ask"})
    work_id = rig.send(sid, "write-inside please")
    await rig.run_until_quiet()
    [pending] = rig.approvals("pending")
    assert pending["state"] == "pending" and pending["unknown_effects"] == []
    rig.decide(pending["approval_id"], "approve")
    with pytest.raises(VersionConflict):
        rig.decide(pending["approval_id"], "approve")
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done"
    [used] = rig.approvals()
    assert used["state"] == "consumed" and used["consumed_by_attempt"]
    assert (rig.root / "notes" / "a.md").read_text() == "a"


# --------------------------------------------------------------------------- unknown effects


async def test_unknown_effect_restricts_the_next_turn_whatever_the_mode_and_allow_rules(rig: Rig) -> None:
    (rig.root / "probe.txt").write_text("probe-content")
    sid = rig.session({"mode": "bypass", "allow": ["write_file", "read_secret_writer", "shell"]})
    work_id = rig.send(sid, "longjob: run it")
    await crash_with_unknown_shell(rig, sid)
    [shell_effect] = rig.rows("SELECT call_id, state FROM effects WHERE tool = 'shell'")
    assert shell_effect["state"] == "unknown"

    await rig.run_until_quiet()  # read_file runs without approval; write_file waits
    read = rig.rows("SELECT state FROM effects WHERE tool = 'read_file'")
    assert [r["state"] for r in read] == ["committed"]
    assert rig.work(work_id)["reason_code"] == "awaiting_approval"
    assert not (rig.root / "notes.md").exists()
    [pending] = rig.approvals("pending")
    assert pending["tool"] == "write_file"
    assert pending["unknown_effects"] == [{"call_id": shell_effect["call_id"], "tool": "shell",
                                           "arguments": {"command": "sleep 30; echo done >> f.txt"}}]
    assert shell_effect["call_id"] in pending["reason"]
    rig.decide(pending["approval_id"], "approve")

    await rig.run_until_quiet()  # the write runs once; the custom tool still needs its own approval
    assert (rig.root / "notes.md").read_text() == "after the crash"
    [pending] = rig.approvals("pending")
    assert pending["tool"] == "read_secret_writer" and pending["unknown_effects"]
    rig.decide(pending["approval_id"], "deny")
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done"
    assert lines(rig.root / "secret.txt") == 0
    assert lines(rig.root / "f.txt") == 0  # the unknown write was never repeated
    assert rig.rows("SELECT state FROM effects WHERE tool = 'shell'")[0]["state"] == "unknown"  # not erased


async def test_configured_read_only_claim_does_not_run_freely_after_unknown_effects(tmp_path: Path) -> None:
    first = {"when": {"last_user_contains": "longjob", "tool_result_unknown": True}, "respond": call("read_secret_writer")}
    rig = Rig(tmp_path, [first, *RULES], trusted_tools={"read_secret_writer": {**SAMPLE_TOOL, "capability": "read_only"}})
    try:
        sid = rig.session({"mode": "bypass"})
        rig.send(sid, "use-secret-tool")  # configured by identity as read_only: runs in an ordinary turn
        await rig.run_until_quiet()
        assert lines(rig.root / "secret.txt") == 1
        work_id = rig.send(sid, "longjob: run it")
        await crash_with_unknown_shell(rig, sid)
        await rig.run_until_quiet()
        assert rig.work(work_id)["reason_code"] == "awaiting_approval"
        [pending] = rig.approvals("pending")
        assert pending["tool"] == "read_secret_writer"
        assert lines(rig.root / "secret.txt") == 1
    finally:
        rig.close()


async def test_unreadable_unknown_effect_records_reject_the_call(rig: Rig) -> None:
    (rig.root / "probe.txt").write_text("probe-content")
    sid = rig.session({"mode": "bypass"})
    work_id = rig.send(sid, "longjob: run it")
    await crash_with_unknown_shell(rig, sid)
    rig.tx(lambda tx: tx.execute("UPDATE effects SET arguments = '{broken' WHERE state = 'unknown'"))
    await rig.run_until_quiet()
    work = rig.work(work_id)
    assert (work["phase"], work["reason_code"]) == ("failed", "recovery_state_unreadable")
    assert not (rig.root / "notes.md").exists()
    assert [r["state"] for r in rig.rows("SELECT state FROM effects WHERE tool = 'write_file'")] == ["planned"]
    assert rig.rows("SELECT 1 FROM events WHERE kind = 'effect.rejected'")


async def test_late_receipt_is_reconciled_and_a_changed_unknown_set_needs_a_fresh_approval(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GOALS_BOOT_ID", "boot-1")
    sid = rig.session({"mode": "ask", "allow": ["shell"]})
    work_id = rig.send(sid, "latejob: run it")
    effect_dir = await rig.crash_after_spawn()
    monkeypatch.setenv("JUPYTER_GOALS_BOOT_ID", "boot-2")  # the machine "restarted": old processes count as dead
    await rig.recover()
    [shell_effect] = rig.rows("SELECT call_id, state FROM effects WHERE tool = 'shell'")
    assert shell_effect["state"] == "unknown"
    await rig.run_until_quiet()
    [first] = rig.approvals("pending")
    assert [u["call_id"] for u in first["unknown_effects"]] == [shell_effect["call_id"]]
    rig.decide(first["approval_id"], "approve")
    before = [i.model_dump() for i in rig.items(sid)]

    deadline = time.monotonic() + 10
    while not (effect_dir / "exit").exists():  # the old process finishes after all: a late receipt
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    report = await rig.recover()
    assert report.reconciled == [shell_effect["call_id"]]
    assert (await rig.recover()).reconciled == []  # at most once
    items = rig.items(sid)
    assert [i.model_dump() for i in items[: len(before)]] == before  # the old turn's history is unchanged
    [late] = [i for i in items if i.kind == "reconciliation"]
    assert late.call_id == shell_effect["call_id"] and "exit status: 0" in late.content
    assert rig.rows("SELECT state FROM effects WHERE tool = 'shell'")[0]["state"] == "reconciled"

    await rig.run_until_quiet()  # the set changed ({shell} → {}): the old approval no longer fits
    assert not (rig.root / "late-notes.md").exists()
    states = {a["approval_id"]: a for a in rig.approvals()}
    assert states[first["approval_id"]]["state"] == "invalidated"
    [fresh] = rig.approvals("pending")
    assert fresh["approval_id"] != first["approval_id"] and fresh["unknown_effects"] == []
    rig.decide(fresh["approval_id"], "approve")
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done"
    assert (rig.root / "late-notes.md").exists()
    assert lines(rig.root / "late.txt") == 1
    assert last_text(rig, sid) == "The earlier command did finish."  # the real result replaced the placeholder


# --------------------------------------------------------------------------- invalidation


@pytest.mark.parametrize("control", ["pause", "stop", "permissions"])
async def test_pause_stop_and_permission_change_invalidate_a_pending_approval(rig: Rig, control: str) -> None:
    from jupyter_goals.store import control as c

    sid = rig.session({"mode": "ask"})
    work_id = rig.send(sid, "write-inside please")
    await rig.run_until_quiet()
    [pending] = rig.approvals("pending")
    if control == "permissions":
        rig.tx(lambda tx: c.change_permissions(tx, sid, {"mode": "ask", "allow": ["shell"]}, None))
    else:
        rig.tx(lambda tx: c.apply_control(tx, c.get_work(tx, work_id), control, None))
    [voided] = rig.approvals()
    assert voided["state"] == "invalidated" and voided["reason"].startswith("Withdrawn because")
    [event] = rig.rows("SELECT payload FROM events WHERE kind = 'approval.invalidated'")
    assert pending["approval_id"] in event["payload"]
    with pytest.raises(VersionConflict):
        rig.decide(pending["approval_id"], "approve")
    await rig.run_until_quiet()
    assert not (rig.root / "notes" / "a.md").exists()
    if control == "permissions":  # the work goes on under the new scope and asks again
        [again] = rig.approvals("pending")
        assert again["approval_id"] != pending["approval_id"] and again["call_id"] == pending["call_id"]
