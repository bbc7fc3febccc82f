"""Unknown outcomes a person can settle (issue 32 item 2): ``{"action": "settle", "effect_id", "outcome"}``.

- pure: a person's answer (a ``reconciliation`` item with ``meta.settled``) replaces the unknown placeholder
  in the model's context, deterministically, and the incremental history agrees with a full repair;
- in this process (``tests/inproc.py``: a real control.db, the real Coordinator, real detached shell
  processes): the answer is a durable reconciliation (who, when); the approval asked only because of the
  unknown outcome is withdrawn and the call checked again: in bypass it runs without an approval, in ask
  mode a fresh approval is asked that no longer names the unknown call; a late receipt lifts it the same way;
- REST on SQLite and PostgreSQL (real servers): "Check again" reads a shell command's exit file again on
  this host, 409 "no evidence" while there is none, then settles from it; 404 / 409 / 400 as documented;
- process level: kill -9 of the server while a command runs, the command killed too and a new boot id: the
  next write waits for an approval even in bypass; "did_not_run" lets it run without one, counted on disk.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.clients.rest import GoalsClient, GoalsError
from jupyter_goals.events import EffectSettledPayload, payload_of
from jupyter_goals.host.effect_files import group_members, kill_shell
from jupyter_goals.models import ItemKind, TranscriptItem
from jupyter_goals.recovery.repair import IncrementalHistory, placeholder_text, repair_history, settled_text
from jupyter_goals.store import control as c
from jupyter_goals.store.db import NotFound, VersionConflict
from tests.inproc import Rig
from tests.servers import ServerFactory, lines, running_shell, wait_for, write_script
from tests.storekit import Backend


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


# --------------------------------------------------------------------------- the model's context (pure)


def _items(reconciliation: TranscriptItem | None) -> list[TranscriptItem]:
    items = [
        TranscriptItem(item_id="u", seq=1, kind=ItemKind.USER, role="user", content="job"),
        TranscriptItem(item_id="a", seq=2, kind=ItemKind.ASSISTANT, role="assistant", response_id="r1"),
        TranscriptItem(item_id="c", seq=3, kind=ItemKind.TOOL_CALL, role="assistant", response_id="r1", call_id="call_1",
                       tool="shell", arguments={"command": "make deploy"}),
        TranscriptItem(item_id="p", seq=4, kind=ItemKind.TOOL_RESULT, role="tool", call_id="call_1", tool="shell",
                       content=placeholder_text("call_1", "shell"), state="unknown"),
        TranscriptItem(item_id="i", seq=5, kind=ItemKind.INTERRUPTION, role="system", content="Interrupted"),
        TranscriptItem(item_id="u2", seq=6, kind=ItemKind.USER, role="user", content="go on"),
    ]
    return [*items, reconciliation] if reconciliation is not None else items


def _answer(outcome: str, content: str = "") -> TranscriptItem:
    words = {"ran": "You said it ran.", "did_not_run": "You said it did not run."}
    return TranscriptItem(item_id="reconcile:call_1", seq=7, kind=ItemKind.RECONCILIATION, role="tool",
                          call_id="call_1", tool="shell", state="reconciled", content=content or words.get(outcome, ""),
                          meta={"settled": outcome, "by": "alice", "at": 1.0})


@pytest.mark.parametrize("outcome", ["ran", "did_not_run"])
def test_a_persons_answer_replaces_the_unknown_placeholder_in_the_models_context(outcome: str) -> None:
    before = repair_history(_items(None))
    assert before[2].unknown_outcome and before[2].content.startswith("[outcome unknown]")
    after = repair_history(_items(_answer(outcome)))
    tool = after[2]
    assert (tool.role, tool.tool_call_id, tool.unknown_outcome) == ("tool", "call_1", False)
    assert tool.content == settled_text("call_1", "shell", outcome)
    assert ("the user says it ran" if outcome == "ran" else "the user says it did not run") in tool.content
    assert "You said" not in tool.content  # the words for the person stay in the transcript
    assert [m.role for m in after] == [m.role for m in before]  # same shape: only the result's text changed
    assert repair_history(_items(_answer(outcome))) == after  # deterministic

    incremental = IncrementalHistory()
    incremental.update(_items(None))
    assert incremental.update([_answer(outcome)]) == after  # a later answer rebuilds what it changes


def test_evidence_read_again_is_sent_as_the_real_result() -> None:
    late = _answer("check", "[late result] Tool call call_1 did finish after its outcome was reported unknown;"
                            " its real result:\nexit status: 0")
    tool = repair_history(_items(late))[2]
    assert not tool.unknown_outcome and tool.content == late.content


# --------------------------------------------------------------------------- in this process

RULES: list[dict[str, Any]] = [
    {"when": {"last_user_contains": "job", "last_tool_result_contains": "wrote ",
              "any_text_contains": "the user says it did not run"}, "respond": {"text": "You told me it did not run."}},
    {"when": {"last_user_contains": "job", "last_tool_result_contains": "wrote ",
              "any_text_contains": "the user says it ran"}, "respond": {"text": "You told me it ran."}},
    {"when": {"last_user_contains": "job", "last_tool_result_contains": "wrote ", "any_text_contains": "[late result]"},
     "respond": {"text": "It finished after all."}},
    {"when": {"last_user_contains": "job", "tool_result_unknown": True},
     "respond": call("write_file", path="notes.md", content="after")},
    {"when": {"last_user_contains": "latejob"}, "respond": call("shell", command="sleep 1.5; echo done >> late.txt")},
    {"when": {"last_user_contains": "job"}, "respond": call("shell", command="sleep 30; echo done >> f.txt")},
]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES)
    yield r
    r.close()


async def unknown_shell(rig: Rig, sid: str) -> dict[str, Any]:
    """The worker dies while ``shell`` runs and the command's process group is killed too: its outcome is
    unknown; the next turn's write waits for the approval that follows it. → the shell effect row."""
    effect_dir = await rig.crash_after_spawn()
    await rig.kill_command(effect_dir)
    assert "new_turn" in (await rig.recover()).recovered.values()
    await rig.run_until_quiet()
    [eff] = rig.rows("SELECT effect_id, call_id, state FROM effects WHERE tool = 'shell'")
    assert eff["state"] == "unknown"
    return dict(eff)


def settle(rig: Rig, sid: str, effect_id: str, outcome: str, by: str = "alice") -> tuple[float, list[str]]:
    return rig.tx(lambda tx: c.settle_effect(tx, c.effect_to_settle(tx, sid, effect_id), outcome, by))  # type: ignore[no-any-return]


def last_text(rig: Rig, sid: str) -> str:
    return [i.content for i in rig.items(sid) if i.kind == "assistant"][-1]


async def test_did_not_run_withdraws_the_approval_and_the_write_runs_without_one_in_bypass(rig: Rig) -> None:
    sid = rig.session({"mode": "bypass"})
    work_id = rig.send(sid, "job: deploy")
    eff = await unknown_shell(rig, sid)
    [pending] = rig.approvals("pending")
    assert pending["tool"] == "write_file" and [u["call_id"] for u in pending["unknown_effects"]] == [eff["call_id"]]
    assert rig.work(work_id)["reason_code"] == "awaiting_approval"
    version = rig.work(work_id)["control_version"]

    before = time.time()
    at, withdrawn = settle(rig, sid, eff["call_id"], "did_not_run")  # a transcript item names the call id
    assert withdrawn == [pending["approval_id"]] and before <= at <= time.time()
    [row] = rig.rows("SELECT state, result, ended_at FROM effects WHERE tool = 'shell'")
    assert (row["state"], row["result"]) == ("reconciled", "You said it did not run.")
    [answer] = [i for i in rig.items(sid) if i.kind == "reconciliation"]
    assert (answer.item_id, answer.call_id, answer.content) == (f"reconcile:{eff['call_id']}", eff["call_id"],
                                                                "You said it did not run.")
    assert answer.meta == {"effect_id": eff["effect_id"], "settled": "did_not_run", "by": "alice", "at": at}
    withdrawn_row = {a["approval_id"]: a for a in rig.approvals()}[pending["approval_id"]]
    assert withdrawn_row["state"] == "invalidated" and "is known now" in withdrawn_row["reason"]
    work = rig.work(work_id)
    assert (work["phase"], work["control_version"]) == ("queued", version + 1)
    [event] = rig.rows("SELECT payload FROM events WHERE kind = 'effect.settled'")
    assert isinstance(payload_of("effect.settled", json.loads(event["payload"])), EffectSettledPayload)

    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done"
    assert (rig.root / "notes.md").read_text() == "after"  # ran, without an approval
    assert rig.approvals("pending") == [] and len(rig.approvals()) == 1
    assert lines(rig.root / "f.txt") == 0  # the unknown command was never run again
    assert last_text(rig, sid) == "You told me it did not run."  # the model read the answer, not the placeholder


async def test_in_ask_mode_the_call_asks_a_fresh_approval_that_no_longer_names_the_settled_call(rig: Rig) -> None:
    sid = rig.session({"mode": "ask", "allow": ["shell"]})  # the command runs; a write asks
    work_id = rig.send(sid, "job: deploy")
    eff = await unknown_shell(rig, sid)
    [first] = rig.approvals("pending")
    assert first["unknown_effects"]

    assert settle(rig, sid, eff["effect_id"], "ran")[1] == [first["approval_id"]]
    await rig.run_until_quiet()
    [fresh] = rig.approvals("pending")
    assert fresh["approval_id"] != first["approval_id"] and fresh["tool"] == "write_file"
    assert fresh["unknown_effects"] == [] and "ask mode" in fresh["reason"]  # re-evaluated: the chat's own rule
    assert not (rig.root / "notes.md").exists()
    rig.decide(fresh["approval_id"], "approve")
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done" and (rig.root / "notes.md").exists()
    assert last_text(rig, sid) == "You told me it ran."


async def test_settle_refuses_an_unknown_call_another_sessions_call_and_a_second_answer(rig: Rig) -> None:
    sid, other = rig.session({"mode": "bypass"}), rig.session({"mode": "bypass"})
    rig.send(sid, "job: deploy")
    eff = await unknown_shell(rig, sid)
    with pytest.raises(NotFound):
        settle(rig, sid, "eff_nothing", "ran")
    with pytest.raises(VersionConflict, match="another session"):
        settle(rig, other, eff["effect_id"], "ran")
    settle(rig, sid, eff["effect_id"], "ran", by="bob")
    with pytest.raises(VersionConflict, match="not unknown any more"):
        settle(rig, sid, eff["effect_id"], "did_not_run")
    assert [i.meta["by"] for i in rig.items(sid) if i.kind == "reconciliation"] == ["bob"]  # the first answer stands


async def test_a_late_receipt_withdraws_the_approval_asked_only_because_of_the_unknown_outcome(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_GOALS_BOOT_ID", "boot-1")
    sid = rig.session({"mode": "bypass"})
    work_id = rig.send(sid, "latejob: run it")
    effect_dir = await rig.crash_after_spawn()
    monkeypatch.setenv("JUPYTER_GOALS_BOOT_ID", "boot-2")  # the machine "restarted": the old process counts as dead
    await rig.recover()
    await rig.run_until_quiet()
    [pending] = rig.approvals("pending")
    deadline = time.monotonic() + 10
    while not (effect_dir / "exit").exists():  # the old process finishes after all: a late receipt
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert (await rig.recover()).reconciled
    assert {a["approval_id"]: a["state"] for a in rig.approvals()} == {pending["approval_id"]: "invalidated"}
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done" and (rig.root / "notes.md").exists()
    assert rig.approvals("pending") == []
    assert last_text(rig, sid) == "It finished after all."


# --------------------------------------------------------------------------- REST, both stores

GATED = "while [ ! -f go ]; do sleep 0.05; done; echo once >> once.txt"
REST_RULES: list[dict[str, Any]] = [
    {"when": {"last_user_contains": "job", "last_tool_result_contains": "wrote ", "any_text_contains": "[late result]"},
     "respond": {"text": "It finished after all."}},
    {"when": {"last_user_contains": "job", "tool_result_unknown": True},
     "respond": call("write_file", path="second.md", content="2")},
    {"when": {"last_user_contains": "job"}, "respond": call("shell", command=GATED)},
]


def _settle_raw(cl: GoalsClient, sid: str, body: dict[str, Any]) -> tuple[int, Any]:
    r = cl.http.post(f"/sessions/{sid}/actions", json=body)
    return r.status_code, r.json()


def _error(call_: Any) -> GoalsError:
    with pytest.raises(GoalsError) as caught:
        call_()
    return caught.value


@pytest.mark.slow
def test_rest_check_again_reads_the_exit_file_and_settles_from_it(tmp_path: Path, backend: Backend) -> None:
    """The whole server dies while a gated command runs (``tool.after_dispatch``, group scope) and comes
    back under a new boot id: the live command counts as dead, its outcome unknown. "Check again" finds no
    exit status (409), then, after the command ran to its end, settles from its exit file; the write that
    waited for an approval in bypass then runs without one."""
    factory = ServerFactory(tmp_path / "goals", REST_RULES)
    store = [f"--GoalsApp.control_db_url={backend.url('control')}"] if backend.kind == "postgresql" else []
    # no periodic full pass: the Coordinator's own late-receipt sweep would race "Check again"
    extra = [*store, "--GoalsApp.reconcile_interval_s=3600"]
    try:
        server = factory.make(store, env={"JUPYTER_GOALS_CRASH_SCOPE": "group"}).start(crash_at="tool.after_dispatch")
        cl = server.client()
        sid = cl.create_session(title="deploy", cwd=str(factory.root), permissions={"mode": "bypass"})["session_id"]
        other = cl.create_session(title="other", cwd=str(factory.root))["session_id"]
        cl.send(sid, "job: deploy", client_request_id="j-1")
        assert server.wait_exit(timeout=60) == -9  # the server died at the point, the command lives on

        server = factory.make(extra, env={"JUPYTER_GOALS_BOOT_ID": "after-the-restart"}).start()
        cl = server.client()
        wait_for(lambda: cl.approvals("pending"), 60, "the approval that follows the unknown outcome")
        [pending] = cl.approvals("pending")
        [unknown] = [i for i in cl.attention()["items"] if i["kind"] == "unknown_outcome"]
        effect_id = unknown["effect_id"]
        assert (unknown["action"], unknown["tool"], unknown["session_id"]) == ("settle", "shell", sid)
        assert [u["call_id"] for u in pending["unknown_effects"]] == [unknown["call_id"]]

        assert _error(lambda: cl.settle(sid, "eff_none", "ran")).status == 404
        assert _error(lambda: cl.settle("ses_none", effect_id, "ran")).status == 404
        assert "another session" in _error(lambda: cl.settle(other, effect_id, "ran")).message
        for body in ({"action": "settle", "effect_id": effect_id}, {"action": "pause", "outcome": "ran"},
                     {"action": "settle", "effect_id": effect_id, "outcome": "maybe"}, {"action": "settle", "outcome": "ran"}):
            assert _settle_raw(cl, sid, body)[0] == 400, body
        no_evidence = _error(lambda: cl.settle(sid, effect_id, "check"))
        assert no_evidence.status == 409 and "No evidence was found" in no_evidence.message

        (factory.root / "go").touch()
        wait_for(lambda: lines(factory.root / "once.txt") == 1, 30, "the command to finish")
        wait_for(lambda: (server.state_dir / "effects" / effect_id / "exit").exists(), 30, "its exit file")
        answer = cl.settle(sid, effect_id, "check")
        assert (answer["effect_id"], answer["state"], answer["outcome"]) == (effect_id, "reconciled", "check")
        assert answer["withdrawn"] == [pending["approval_id"]] and answer["settled_by"]
        assert _error(lambda: cl.settle(sid, effect_id, "did_not_run")).status == 409  # not unknown any more

        snap = cl.wait(sid, timeout=60)
        assert (factory.root / "second.md").read_text() == "2"  # the write ran without an approval
        assert cl.approvals("pending") == []
        items = snap["transcript"]["items"]
        [late] = [i for i in items if i["kind"] == "reconciliation"]
        assert "exit status: 0" in late["content"] and late["state"] == "reconciled"
        assert (late["meta"]["by"], late["meta"]["at"]) == (answer["settled_by"], answer["settled_at"])
        assert [i["content"] for i in items if i["kind"] == "assistant"][-1] == "It finished after all."
        [event] = [e for e in cl.events(0, 5000)["events"] if e["kind"] == "effect.settled"]
        payload = payload_of(event["kind"], event["payload"])
        assert isinstance(payload, EffectSettledPayload) and payload.outcome == "check"
        assert [i for i in cl.attention()["items"] if i["kind"] == "unknown_outcome"] == []
        assert lines(factory.root / "once.txt") == 1
    finally:
        factory.close()


# --------------------------------------------------------------------------- process level


@pytest.mark.slow
def test_kill_9_unknown_outcome_settled_as_did_not_run_lets_the_next_write_run_in_bypass(tmp_path: Path) -> None:
    slow = write_script(tmp_path / "slow.json", [
        {"when": {"last_tool_result_contains": "exit status", "any_text_contains": "the user says it did not run"},
         "respond": {"text": "You said the first command did not run."}},
        {"when": {"tool_result_unknown": True},
         "respond": call("shell", command="echo again >> out.txt")}],
        default=call("shell", command="sleep 30; echo once >> out.txt"))
    factory = ServerFactory(tmp_path / "a", [])
    server = factory.make().start()
    try:
        cl = server.client()
        sid = cl.create_session(title="reboot", cwd=str(factory.root), model=slow,
                                permissions={"mode": "bypass"})["session_id"]
        cl.send(sid, "run it", client_request_id="r-1")
        effect_dir = running_shell(server.state_dir, sid)

        server.kill()  # the machine "restarts": server and command killed -9, a new boot id
        assert kill_shell(effect_dir)
        wait_for(lambda: not group_members(effect_dir), 10, "the command's process group to end")
        server.env_extra["JUPYTER_GOALS_BOOT_ID"] = "after-the-restart"
        server.start()
        cl = server.client()
        wait_for(lambda: cl.approvals("pending"), 60, "the approval that follows the unknown outcome")
        [pending] = cl.approvals("pending")
        assert pending["arguments"] == {"command": "echo again >> out.txt"}  # bypass, and yet it asks
        [unknown] = [i for i in cl.attention()["items"] if i["kind"] == "unknown_outcome"]
        assert lines(factory.root / "out.txt") == 0

        refused = _error(lambda: cl.settle(sid, unknown["call_id"], "check"))
        assert refused.status == 409 and "No evidence was found" in refused.message  # killed: no exit status
        answer = cl.settle(sid, unknown["call_id"], "did_not_run")
        assert answer["withdrawn"] == [pending["approval_id"]] and answer["outcome"] == "did_not_run"

        snap = cl.wait(sid, timeout=60)
        assert (factory.root / "out.txt").read_text() == "again\n"  # ran once, without an approval; never "once"
        assert cl.approvals("pending") == []
        assert [a["state"] for a in cl.approvals(None)] == ["invalidated"]
        items = snap["transcript"]["items"]
        [said] = [i for i in items if i["kind"] == "reconciliation"]
        assert said["content"] == "You said it did not run." and said["meta"]["by"] == answer["settled_by"]
        assert [i["content"] for i in items if i["kind"] == "assistant"][-1] == "You said the first command did not run."
        assert [i for i in cl.attention()["items"] if i["kind"] == "unknown_outcome"] == []
    finally:
        factory.close()


def test_the_notebook_chat_card_offers_answers_only_for_calls_still_unknown_and_says_who_settled() -> None:
    from jupyter_goals.clients.notebook.widgets import settled_note, unknown_calls

    items: list[dict[str, Any]] = [
        {"kind": "tool_result", "call_id": "c1", "tool": "shell", "state": "unknown"},
        {"kind": "tool_result", "call_id": "c2", "tool": "edit_file", "state": "unknown"},
        {"kind": "tool_result", "call_id": "c3", "tool": "shell", "state": "committed"},
        {"kind": "reconciliation", "call_id": "c1", "tool": "shell", "state": "reconciled",
         "content": "You said it ran.", "meta": {"settled": "ran", "by": "alice", "at": 0.0}},
    ]
    assert [i["call_id"] for i in unknown_calls(items)] == ["c2"]
    assert settled_note(items[3]).startswith(" (settled by alice, ") and settled_note(items[0]) == ""
