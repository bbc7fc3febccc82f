"""The event log's kinds and payloads (``jupyter_goals/events.py``, issue 28 item 4): every kind the
package emits is an ``EventKind`` with a payload model (read from the source with ``ast``, so a kind
added later without one fails here), and the events that representative flows write match those
models. The REST answers' events are checked against the served document in ``test_openapi.py``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.events import PAYLOADS, EventKind, payload_of
from jupyter_goals.store import control as c
from tests.inproc import BYPASS, Rig, call, new_goal

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_goals"


def emitted_kinds(package: Path = PACKAGE) -> tuple[set[str], list[str]]:
    """The kinds passed to ``emit(tx, kind, …)`` anywhere in ``package`` (as ``emit``, ``shared.emit``,
    ``c.emit``…), and every call whose kind is not a string literal (which this check could not read)."""
    kinds: set[str] = set()
    unreadable: list[str] = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name != "emit" or len(node.args) < 2:
                continue
            kind = node.args[1]
            if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
                kinds.add(kind.value)
            elif isinstance(kind, ast.Attribute) and isinstance(kind.value, ast.Name) and kind.value.id == "EventKind":
                kinds.add(EventKind[kind.attr].value)
            else:
                unreadable.append(f"{path.relative_to(package)}:{node.lineno}")
    return kinds, unreadable


def test_every_kind_emitted_in_the_package_is_an_event_kind_and_every_event_kind_is_emitted() -> None:
    kinds, unreadable = emitted_kinds()
    assert unreadable == [], "emit() with a kind that is not a literal (or EventKind.X): name it"
    assert kinds - {k.value for k in EventKind} == set(), "add these kinds to jupyter_goals/events.py"
    assert {k.value for k in EventKind} - kinds == set(), "these EventKinds are emitted nowhere"


def test_the_kind_check_finds_an_unlisted_kind_and_a_kind_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "def f(tx, shared, kind):\n"
        "    shared.emit(tx, 'session.created', {})\n"
        "    emit(tx, 'thing.happened', {'x': 1})\n"
        "    shared.emit(tx, kind, {})\n"
        "    shared.emit(tx, EventKind.WORK_PHASE, {})\n"
    )
    kinds, unreadable = emitted_kinds(tmp_path)
    assert kinds == {"session.created", "thing.happened", "work.phase"}
    assert unreadable == ["mod.py:4"]


def test_every_event_kind_has_a_payload_model_named_after_it() -> None:
    assert set(PAYLOADS) == set(EventKind)
    for kind, model in PAYLOADS.items():
        assert model.__name__ == "".join(p.capitalize() for p in re.split(r"[._]", kind.value)) + "Payload"
        assert model.__doc__, f"{model.__name__} says what {kind.value} means"
    with pytest.raises(ValueError):
        payload_of("no.such_kind", {})


RULES: list[dict[str, Any]] = [
    # a Goal: write a file, submit it, acceptance checks it (file_exists)
    {"when": {"last_user_contains": "Write out.txt", "last_tool_result_contains": "candidate submitted"},
     "respond": {"text": "Submitted.", "usage": {"input_tokens": 10, "output_tokens": 2}}},
    {"when": {"last_user_contains": "Write out.txt", "last_tool_result_contains": "0 open"},
     "respond": call("update_goal", candidate=True)},
    {"when": {"last_user_contains": "Write out.txt", "last_tool_result_contains": "wrote"},
     "respond": call("todo_write", items=[{"text": "write out.txt", "status": "completed"}])},
    {"when": {"last_user_contains": "Write out.txt"}, "respond": call("write_file", path="out.txt", content="done\n")},
    # a chat that delegates to a subtask, then one whose write needs an approval
    {"when": {"last_user_contains": "delegate", "last_tool_result_contains": "subtask"}, "respond": {"text": "Waiting."}},
    {"when": {"last_user_contains": "delegate"}, "respond": call("spawn_subtask", "Delegating.", task="say hello")},
    {"when": {"last_user_contains": "say hello"}, "respond": {"text": "hello"}},
    {"when": {"last_user_contains": "note", "last_tool_result_contains": "wrote"}, "respond": {"text": "Written."}},
    {"when": {"last_user_contains": "note"}, "respond": call("write_file", path="note.md", content="n")},
]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, RULES)
    yield r
    r.close()


async def test_the_events_of_representative_flows_match_their_payload_models(rig: Rig) -> None:
    """A Goal achieved (its plan, acceptance and terminal record), a subtask delivered to its parent,
    an approval withdrawn by a pause, asked again after the resume and given, a permission change:
    every event these write is valid for its kind's payload model."""
    new_goal(rig, "Write out.txt so that it says done", [{"text": "out.txt exists", "kind": "file_exists",
                                                         "path": "out.txt"}])
    await rig.run_until_quiet()
    parent = rig.session(BYPASS)
    rig.send(parent, "delegate the greeting")
    await rig.run_until_quiet()
    asking = rig.session({"mode": "ask"})
    work_id = rig.send(asking, "write a note")
    await rig.run_until_quiet()
    rig.tx(lambda tx: c.apply_control(tx, c.get_work(tx, work_id), "pause", None))  # withdraws the approval
    rig.tx(lambda tx: c.apply_control(tx, c.get_work(tx, work_id), "resume", None))
    await rig.run_until_quiet()
    [approval] = rig.approvals("pending")
    rig.decide(approval["approval_id"], "approve")
    await rig.run_until_quiet()
    rig.tx(lambda tx: c.change_permissions(tx, asking, {"mode": "bypass", "allow": ["read_file"]}, None))

    events = rig.db.transact(lambda tx: c.events_after(tx, 0, 10_000), write=False)
    for event in events:
        payload_of(event["kind"], event["payload"])  # raises on a kind or payload that does not match
    seen = {e["kind"] for e in events}
    expected = {"session.created", "session.permissions", "message.accepted", "work.created", "work.phase",
                "work.control", "attempt.admitted", "turn.started", "turn.ended", "transcript.item", "effect.state",
                "approval.requested", "approval.decided", "approval.invalidated", "goal.created", "goal.updated", "goal.acceptance",
                "goal.history", "todo.updated", "wait.opened", "wait.notified", "worker.registered"}
    assert expected <= seen, expected - seen


async def test_a_phase_event_says_whether_the_work_now_waits_for_a_person_as_the_attention_list_does(rig: Rig) -> None:
    """``work.phase`` carries ``needs_person``: false for the phases of a turn that runs and ends, true when the
    work stops on a reason only a person lifts (here revoked permissions), exactly when ``GET /attention``
    lists it, so the JupyterLab inbox reads the list only when something may have started to wait."""
    from jupyter_goals.store import attention

    session = rig.session(BYPASS)
    work_id = rig.send(session, "hello")
    await rig.run_until_quiet()
    rig.tx(lambda tx: c.set_phase(tx, c.get_work(tx, work_id), "waiting", "permission_revoked"))
    events = rig.db.transact(lambda tx: c.events_after(tx, 0, 10_000), write=False)
    phases = [payload_of(e["kind"], e["payload"]) for e in events if e["kind"] == "work.phase" and e["work_id"] == work_id]
    assert [(p.phase, p.needs_person) for p in phases][-1] == ("waiting", True)
    assert [p.needs_person for p in phases[:-1]] == [False] * (len(phases) - 1) and len(phases) >= 3
    listed = rig.db.transact(attention.waiting_work, write=False)
    assert [w["work_id"] for w in listed] == [work_id]
