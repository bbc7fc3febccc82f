"""GoalWidget, ApprovalWidget and HistoryWidget rendered in a real kernel against a real server: each
shows the backend's state and actions, one action is driven through its button (a history entry's
Details shows its record and hides it again), and the view follows the event stream on a background
thread that ends when the widget closes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernels import Kernel, errors, kernel_env, scripted_server, text
from tests.servers import ServerProcess, wait_for, write_script

pytestmark = pytest.mark.slow  # a real jupyter server and a real kernel

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
RECORD_KEYS = ["anchor", "created_at", "goal_id", "read_only", "record_id", "session_id", "snapshot", "state"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with scripted_server(tmp_path_factory.mktemp("widgets"), [], {"text": "still working", "delay_s": 0.2}) as s:
        yield s


@pytest.fixture(scope="module")
def kernel(server: ServerProcess) -> Iterator[Kernel]:
    k = Kernel(kernel_env(server, None), server.root_dir)
    try:
        out = k.run("from jupyter_goals.clients.notebook.widgets import GoalWidget, ApprovalWidget, HistoryWidget\n"
                    "import json, time\n"
                    "def until(check, timeout=20):\n"
                    "    end = time.monotonic() + timeout\n"
                    "    while time.monotonic() < end and not check():\n"
                    "        time.sleep(0.05)\n"
                    "    return check()\n")
        assert not errors(out), errors(out)
        yield k
    finally:
        k.shutdown()


def value(kernel: Kernel, expr: str) -> object:
    out = kernel.run(f"print(json.dumps({expr}))")
    assert not errors(out), errors(out)
    return json.loads(text(out).strip().splitlines()[-1])


def test_goal_widget_pause_button_pauses_and_the_view_follows_events(kernel: Kernel, server: ServerProcess) -> None:
    client = server.client()
    sid = client.create_session(title="widgets")["session_id"]
    goal = client.create_goal(sid, "Keep the notes tidy")
    out = kernel.run(f"g = GoalWidget({goal['goal_id']!r})\ndisplay(g)")
    assert not errors(out), errors(out)
    assert any(WIDGET_VIEW in o.get("data", {}) for o in out)
    buttons = value(kernel, "{k: [b.description, b.disabled] for k, b in g.buttons.items()}")
    actions = client.goal(goal["goal_id"])["actions"]
    assert buttons == {a: [a.capitalize(), not actions[f"can_{a}"]] for a in ("pause", "resume", "verify", "end")}
    assert buttons["pause"] == ["Pause", False] and buttons["resume"] == ["Resume", True]  # enabled by the backend

    kernel.run("g.buttons['pause'].click()")
    assert client.goal(goal["goal_id"])["state"] == "paused"  # checked through REST
    assert value(kernel, "[g.goal['state'], g.buttons['resume'].disabled]") == ["paused", False]

    # a change made elsewhere reaches the widget through the event stream (its background thread)
    after = client.goal(goal["goal_id"])
    client.goal_action(goal["goal_id"], "resume", after["revision"])
    assert value(kernel, "until(lambda: g.goal['state'] == 'active')") is True
    assert value(kernel, "'Keep the notes tidy' in g.heading.value") is True

    # a stale action is refused by the server (409) and said so
    kernel.run("g._actions['pause'] = (lambda r=g.goal['revision'] - 1: g.client.goal_action(g.goal_id, 'pause', r))\n"
               "g.buttons['pause'].click()")
    assert "Conflict (409)" in str(value(kernel, "g.error.value"))

    assert value(kernel, "g.following") is True
    assert value(kernel, "[g.close(), g._thread.join(5), g.following][2]") is False  # the thread ends with the widget
    client.goal_action(goal["goal_id"], "end", client.goal(goal["goal_id"])["revision"])


def test_approval_widget_approve_button_approves(kernel: Kernel, server: ServerProcess, tmp_path: Path) -> None:
    client = server.client()
    model = write_script(tmp_path / "s.json", [
        {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "written"}},
    ], default={"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi > widget.txt"}}]})
    sid = client.create_session(title="approvals", model=model, cwd=str(tmp_path))["session_id"]
    client.send(sid, "write the file")
    wait_for(lambda: any(a["session_id"] == sid for a in client.approvals("pending")), what="a pending approval")
    [approval] = [a for a in client.approvals("pending") if a["session_id"] == sid]
    out = kernel.run(f"a = ApprovalWidget({approval['approval_id']!r})\ndisplay(a)")
    assert not errors(out), errors(out)
    assert value(kernel, "[a.approval['state'], a.buttons['approve'].disabled, a.buttons['deny'].description]") == [
        "pending", False, "Deny"]
    kernel.run("a.buttons['approve'].click()")
    state = [x for x in client.approvals(None) if x["approval_id"] == approval["approval_id"]][0]["state"]
    assert state in ("approved", "consumed")
    client.wait(sid)
    assert (tmp_path / "widget.txt").read_text() == "hi\n"
    assert value(kernel, "until(lambda: a.buttons['approve'].disabled)") is True  # no longer pending
    kernel.run("a.close()")


def test_history_widget_grows_when_a_goal_of_its_session_ends(kernel: Kernel, server: ServerProcess) -> None:
    client = server.client()
    sid = client.create_session(title="history")["session_id"]
    first = client.create_goal(sid, "First objective")
    client.goal_action(first["goal_id"], "end", first["revision"])
    out = kernel.run(f"h = HistoryWidget({sid!r})\ndisplay(h)")
    assert not errors(out), errors(out)
    assert value(kernel, "[r['snapshot']['objective'] for r in h.records]") == ["First objective"]
    assert value(kernel, "sorted(h.records[0])") == RECORD_KEYS  # a change of the record's schema shows here
    second = client.create_goal(sid, "Second objective")
    client.goal_action(second["goal_id"], "end", second["revision"])
    assert value(kernel, "until(lambda: len(h.records) == 2)") is True
    assert value(kernel, "'Second objective' in h.rows.children[1].summary.value") is True
    kernel.run("h.close()")


def test_history_widget_details_button_shows_the_record_and_hides_it_again(kernel: Kernel, server: ServerProcess) -> None:
    client = server.client()
    sid = client.create_session(title="history details")["session_id"]
    goal = client.create_goal(sid, "Sort the receipts", requirements=[{"text": "every receipt has a date"}])
    client.goal_action(goal["goal_id"], "end", goal["revision"])
    [record] = client.history(sid)
    out = kernel.run(f"h = HistoryWidget({sid!r})\ndisplay(h)\ne = h.entries[{record['record_id']!r}]")
    assert not errors(out), errors(out)
    assert value(kernel, "[e.details_button.description, bool(e.details_button.tooltip), e.opened, e.details.value]") == [
        "Details", True, False, ""]

    out = kernel.run("e.details_button.click()")
    assert not errors(out), errors(out)
    shown = str(value(kernel, "e.details.value"))
    assert value(kernel, "e.opened") is True
    for field in (record["record_id"], record["goal_id"], sid, f"Goal {record['state']} (read-only)", "Sort the receipts",
                  "every receipt has a date", f"transcript position {record['anchor']['seq']}"):
        assert field in shown, (field, shown)

    # an open Details stays open when the list is re-read (another Goal of the session ends)
    second = client.create_goal(sid, "File the invoices")
    client.goal_action(second["goal_id"], "end", second["revision"])
    assert value(kernel, "until(lambda: len(h.records) == 2)") is True
    assert value(kernel, "[e.opened, h.rows.children[0] is e]") == [True, True]

    out = kernel.run("e.details_button.click()")  # the second press hides it
    assert not errors(out), errors(out)
    assert value(kernel, "[e.opened, e.details.value]") == [False, ""]

    # a record the server does not have: its 404 is said in the entry, no traceback
    out = kernel.run("from jupyter_goals.clients.notebook.widgets import HistoryEntry\n"
                     "m = HistoryEntry({'record_id': 'hist_missing', 'state': 'achieved', 'snapshot': {}}, h.client)\n"
                     "m.details_button.click()")
    assert not errors(out), errors(out)
    missing = str(value(kernel, "m.details.value"))
    assert "Could not read record hist_missing (404" in missing and "not found" in missing, missing
    kernel.run("m.close()\nh.close()")


def test_chat_widget_shows_the_answer_when_it_arrives(kernel: Kernel, server: ServerProcess, tmp_path: Path) -> None:
    client = server.client()
    model = write_script(tmp_path / "slow.json", [], default={"text": "still working", "delay_s": 3})
    sid = client.create_session(title="chat widget", model=model)["session_id"]
    sent = client.send(sid, "hello widget")
    out = kernel.run(f"from jupyter_goals.clients.notebook.widgets import ChatWidget\n"
                     f"c = ChatWidget({sid!r}, {sent['work_id']!r})\ndisplay(c)")
    assert not errors(out), errors(out)
    assert value(kernel, "c.phase") != "done"  # the answer takes 3 s
    assert value(kernel, "until(lambda: c.phase == 'done')") is True  # followed through its event thread
    assert value(kernel, "'still working' in c.detail.value and 'hello widget' in c.detail.value") is True
    assert value(kernel, "[b.disabled for b in c.buttons.values()]") == [True, True, True]  # nothing to do now
    kernel.run("c.close()")
