"""Interrupted answers keep their text, and input comes first (issue 32 items 5 and 6): real ``jupyter
server`` processes, real SIGKILLs, a scripted model that streams slowly.

The answer streams 40 chunks a quarter second apart; its text so far is durable as ``assistant.draft``
events. A kill -9 (of the whole server, or of its worker alone) or a Stop in the middle leaves the partial
answer in the transcript once, marked ``meta.interrupted`` and followed by the interruption marker, and the
next model request carries it: the scripted model answers "Continued after the cut." only to a request
that contains the cut text. A message steered to a parent waiting on a 60-second subtask is read at once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import db_rows, full_passes, new_session, server_env, wait_for

pytestmark = pytest.mark.slow

CHUNKS = [f"alpha-{i} " for i in range(40)]
FULL = "".join(CHUNKS)
CUT_TEXT = "alpha-0 alpha-1 alpha-2"  # in the partial answer: the kill or stop waits for a draft past it
CONTINUED = "Continued after the cut."
NOTED = "Noted XYZZY while the subtask runs."

RULES: list[dict[str, Any]] = [
    # a request whose history holds the cut answer (only a repaired history can: no prompt contains it)
    {"when": {"any_text_contains": CUT_TEXT}, "respond": {"text": CONTINUED}},
    {"when": {"last_user_contains": "stream please"}, "respond": {"stream_chunks": CHUNKS, "chunk_delay_s": 0.25}},
    # input first: the parent delegates a 60-second count and waits; a steered message is answered at once
    {"when": {"last_user_contains": "XYZZY"}, "respond": {"text": NOTED}},
    {"when": {"last_user_contains": "count slowly"}, "respond": {"text": "counted", "delay_s": 60}},
    {"when": {"last_user_contains": "delegate a long count"},
     "respond": {"text": "Delegating.", "tool_calls": [{"name": "spawn_subtask", "arguments": {"task": "count slowly"}}]}},
]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with server_env(tmp_path, RULES) as e:
        yield e


def newest_draft(state: Path, work_id: str) -> str:
    """The text of the newest durable ``assistant.draft`` of a work item ("" before the first)."""
    rows = db_rows(state, "SELECT payload FROM events WHERE kind = 'assistant.draft' AND work_id = ?"
                          " ORDER BY seq DESC LIMIT 1", (work_id,))
    return str(json.loads(rows[0]["payload"])["text"]) if rows else ""


def wait_streaming(state: Path, work_id: str) -> str:
    """Wait until the durable draft holds ``CUT_TEXT`` and more, while the answer still streams."""
    wait_for(lambda: newest_draft(state, work_id).startswith(CUT_TEXT + " alpha-3"), timeout=30,
             what="the streamed answer to be durable past its fourth chunk")
    draft = newest_draft(state, work_id)
    assert draft != FULL, "the answer finished before the interruption"
    return draft


def items(server: Any, sid: str) -> list[dict[str, Any]]:
    return list(server.client().session(sid, after=0, limit=1000)["transcript"]["items"])


def assert_partial_then_marker(found: list[dict[str, Any]], interrupted: str, at_least: str) -> dict[str, Any]:
    """Exactly one partial answer, marked ``interrupted``, holding at least ``at_least`` of the stream and no
    more than it, followed by an interruption marker of its turn."""
    partial = [i for i in found if i["kind"] == "assistant" and i["meta"].get("interrupted")]
    assert len(partial) == 1, partial
    [cut] = partial
    assert cut["meta"]["interrupted"] == interrupted
    assert cut["content"].startswith(at_least) and FULL.startswith(cut["content"]) and cut["content"] != FULL
    assert "reasoning_signature" not in cut["meta"]
    after = [i for i in found if i["seq"] > cut["seq"] and i["kind"] == "interruption" and i["turn_id"] == cut["turn_id"]]
    assert after, f"no interruption marker after the partial answer: {found}"
    return cut


@pytest.mark.parametrize("victim", ["server", "worker"])
def test_kill_9_mid_stream_keeps_the_partial_answer_once_and_the_next_request_reads_it(
    env: dict[str, Any], victim: str
) -> None:
    server = env["make"]().start()
    sid = new_session(server, env["root"])
    work_id = server.client().send(sid, "stream please", client_request_id="r1")["work_id"]
    draft = wait_streaming(env["state"], work_id)
    if victim == "server":
        server.kill()  # the server and its workers
        server = env["make"]().start()
    else:
        [worker] = server.workers()
        os.kill(worker["pid"], signal.SIGKILL)  # the worker alone; the server recovers its attempt
    snap = server.client().wait(sid, timeout=60)
    assert snap["work"]["phase"] == "done"
    found = items(server, sid)
    cut = assert_partial_then_marker(found, "restart", draft)
    marker = next(i for i in found if i["seq"] > cut["seq"] and i["kind"] == "interruption")
    assert marker["meta"]["mode"] == "resume_checkpoint"
    # the resumed turn asked the model again with the cut text in its history, and finished with that answer
    answers = [i["content"] for i in found if i["kind"] == "assistant" and not i["meta"].get("interrupted")]
    assert answers == [CONTINUED]
    full_passes(server)  # a repeated recovery writes it again never
    assert len([i for i in items(server, sid) if i["meta"].get("interrupted")]) == 1
    assert db_rows(env["state"], "SELECT COUNT(*) AS n FROM transcript WHERE item_id LIKE 'partial:%'")[0]["n"] == 1


def test_stop_mid_stream_keeps_the_partial_answer_and_the_next_message_reads_it(env: dict[str, Any]) -> None:
    server = env["make"]().start()
    sid = new_session(server, env["root"])
    cl = server.client()
    work_id = cl.send(sid, "stream please", client_request_id="r1")["work_id"]
    draft = wait_streaming(env["state"], work_id)
    cl.action(sid, "stop")
    snap = cl.wait(sid, phases=("cancelled",), timeout=30)
    assert snap["work"]["work_id"] == work_id
    found = items(server, sid)
    cut = assert_partial_then_marker(found, "stopped", draft)  # what the worker received, at least the draft
    marker = next(i for i in found if i["seq"] > cut["seq"] and i["kind"] == "interruption")
    assert marker["content"].startswith("Stopped by you")
    # the next message's request carries the cut answer (partial text plus the interruption marker)
    cl.send(sid, "what did you say before?", client_request_id="r2")
    wait_for(lambda: CONTINUED in [i["content"] for i in items(server, sid) if i["kind"] == "assistant"], timeout=30,
             what="the next answer")
    full_passes(server)
    assert len([i for i in items(server, sid) if i["meta"].get("interrupted")]) == 1


def test_a_message_steered_while_the_parent_waits_on_a_60_second_subtask_is_read_at_once(env: dict[str, Any]) -> None:
    """Input first: in the parent's transcript within 2 s, answered by the parent's model while the child
    still runs; a queued message stays queued behind the waiting work, as when work runs."""
    server = env["make"]().start()
    sid = new_session(server, env["root"])
    cl = server.client()
    parent = cl.send(sid, "please delegate a long count", client_request_id="r1")["work_id"]

    def waiting() -> bool:
        [row] = db_rows(env["state"], "SELECT phase, reason_code FROM work_items WHERE work_id = ?", (parent,))
        return (row["phase"], row["reason_code"]) == ("waiting", "awaiting_subtask")

    wait_for(waiting, timeout=30, what="the parent to wait on its subtask")
    [child] = db_rows(env["state"], "SELECT work_id FROM work_items WHERE parent_work_id = ?", (parent,))
    wait_for(lambda: bool(db_rows(env["state"], "SELECT request_id FROM requests WHERE work_id = ? AND state = 'sent'",
                                  (child["work_id"],))), timeout=30, what="the child's 60-second request")

    sent = time.monotonic()
    accepted = cl.send(sid, "XYZZY: also count the blank lines", client_request_id="r2", delivery="steer")
    assert (accepted["work_id"], accepted["delivery"]) == (parent, "steer")
    wait_for(lambda: any(i["kind"] == "user" and "XYZZY" in i["content"] for i in items(server, sid)), timeout=10,
             what="the steered message in the parent's transcript")
    took = time.monotonic() - sent
    print(f"steered message in the parent's transcript {took:.2f} s after it was sent")
    assert took < 2.0, took
    wait_for(lambda: NOTED in [i["content"] for i in items(server, sid) if i["kind"] == "assistant"], timeout=20,
             what="the parent's model to answer it")
    [child_now] = db_rows(env["state"], "SELECT phase FROM work_items WHERE work_id = ?", (child["work_id"],))
    assert child_now["phase"] not in ("done", "cancelled", "failed")  # read before the subtask ended
    wait_for(waiting, timeout=20, what="the parent to wait on its subtask again")
    answers = [i["content"] for i in items(server, sid) if i["kind"] == "assistant"]
    assert answers == ["Delegating.", NOTED]  # no idle turn while waiting, no delivery yet

    # a queued message waits for the parent's work to end: its own work item is not started
    queued = cl.send(sid, "then count the words", client_request_id="r3")
    assert queued["delivery"] == "queue" and queued["work_id"] != parent
    full_passes(server)
    assert db_rows(env["state"], "SELECT COUNT(*) AS n FROM attempts WHERE work_id = ?", (queued["work_id"],))[0]["n"] == 0
    assert not any("count the words" in i["content"] for i in items(server, sid))
    cl.action(sid, "stop")  # the parent's stop reaches the child: nothing waits a minute at teardown
