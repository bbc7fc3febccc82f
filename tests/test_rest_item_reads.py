"""Reads of one item (issue 32 item 8): ``GET /approvals/{id}`` and a session's transcript filtered by work
item (``GET /sessions/{id}?work_id=W``), so a notebook's approval card and chat card read what they show
instead of every approval or 5,000 transcript items.

Real servers on both stores (``backend``: SQLite, and the control store and ledger in private PostgreSQL
schemas); only the model is scripted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.clients.rest import GoalsClient
from tests.servers import ROOT, stored_server_env
from tests.storekit import Backend

pytestmark = pytest.mark.slow

Json = dict[str, Any]
UNKNOWN_APPROVAL = "apr_" + "0" * 24
UNKNOWN_WORK = "wrk_" + "0" * 24


def call(name: str, **arguments: Any) -> Json:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


RULES: list[Json] = [
    {"when": {"last_tool_result_contains": "denied by the user"}, "respond": {"text": "Understood, not done."}},
    {"when": {"last_user_contains": "approve-me"}, "respond": call("shell", command="echo line >> approved.txt")},
    {"when": {"last_user_contains": "first", "last_tool_result_contains": "exit status: 0"},
     "respond": {"text": "First done."}},
    {"when": {"last_user_contains": "first"}, "respond": call("shell", command="echo one")},
    {"when": {"last_user_contains": "second"}, "respond": {"text": "Second done."}},
    {"when": {"last_user_contains": "other"}, "respond": {"text": "Other done."}},
]


@pytest.fixture
def env(tmp_path: Path, backend: Backend) -> Iterator[Json]:
    with stored_server_env(tmp_path, RULES, backend, base_env={"PYTHONPATH": str(ROOT)}) as e:
        yield e


def get(cl: GoalsClient, path: str, **params: Any) -> tuple[int, Json]:
    r = cl.http.get(path, params=params)
    return r.status_code, r.json()


def test_one_approval_reads_as_the_listing_shows_it_and_an_unknown_id_is_404(env: Json) -> None:
    server = env["make"]().start()
    cl = server.client()
    sid = cl.create_session(title="t", cwd=str(env["root"]))["session"]["session_id"]
    cl.send(sid, "approve-me: append a line")
    assert cl.wait(sid, phases=("waiting",), timeout=30)["work"]["reason_code"] == "awaiting_approval"
    [listed] = cl.approvals("pending")

    status, one = get(cl, f"/approvals/{listed['approval_id']}")
    assert status == 200 and one == listed and one["state"] == "pending"

    cl.deny(listed["approval_id"])
    status, one = get(cl, f"/approvals/{listed['approval_id']}")
    [now] = [a for a in cl.approvals(None) if a["approval_id"] == listed["approval_id"]]
    assert status == 200 and one == now and one["state"] == "denied" and one["decided_at"] is not None

    status, error = get(cl, f"/approvals/{UNKNOWN_APPROVAL}")
    assert status == 404 and error["error"] == "not_found"


def _pages_forward(cl: GoalsClient, sid: str, work_id: str, limit: int) -> list[Json]:
    items: list[Json] = []
    params: Json = {"work_id": work_id, "limit": limit}
    while True:
        status, snap = get(cl, f"/sessions/{sid}", **params)
        assert status == 200
        page = snap["transcript"]
        assert len(page["items"]) <= limit
        assert (page["prev_cursor"] is None) == (not items)  # older items of this work item exist after page 1 only
        items += page["items"]
        if page["next_cursor"] is None:
            return items
        params["after"] = page["next_cursor"]


def _pages_back(cl: GoalsClient, sid: str, work_id: str, limit: int) -> list[Json]:
    items: list[Json] = []
    params: Json = {"work_id": work_id, "limit": limit, "before": "latest"}
    while True:
        status, snap = get(cl, f"/sessions/{sid}", **params)
        assert status == 200
        page = snap["transcript"]
        assert (page["next_cursor"] is None) == (not items)  # newer items of this work item after the newest page only
        items = page["items"] + items
        if page["prev_cursor"] is None:
            return items
        params["before"] = page["prev_cursor"]


def test_a_transcript_filtered_by_work_item_pages_only_that_work_items_items(env: Json) -> None:
    server = env["make"]().start()
    cl = server.client()
    root = str(env["root"])
    sid = cl.create_session(title="t", cwd=root, permissions={"mode": "bypass"})["session"]["session_id"]
    other = cl.create_session(title="o", cwd=root)["session"]["session_id"]
    first = cl.send(sid, "first: run a command")["work_id"]
    cl.wait(sid, timeout=30)
    second = cl.send(sid, "second: answer")["work_id"]
    cl.wait(sid, timeout=30)
    elsewhere = cl.send(other, "other: answer")["work_id"]
    cl.wait(other, timeout=30)

    full = cl.session(sid, limit=5000)["transcript"]["items"]
    of_first = [i for i in full if i["work_id"] == first]
    of_second = [i for i in full if i["work_id"] == second]
    kinds = [i["kind"] for i in of_first]
    assert kinds[0] == "user" and kinds[-1] == "assistant" and {"tool_call", "tool_result"} <= set(kinds)
    assert len(of_first) >= 4 and [i["kind"] for i in of_second] == ["user", "assistant"]
    assert of_second[0]["seq"] > of_first[-1]["seq"]  # the second work item's items come after the first's

    for work_id, expected in ((first, of_first), (second, of_second)):
        status, snap = get(cl, f"/sessions/{sid}", work_id=work_id)
        assert status == 200 and snap["session"]["session_id"] == sid
        page = snap["transcript"]
        assert page["items"] == expected  # only that work item's items, as the whole transcript has them
        assert page["next_cursor"] is None and page["prev_cursor"] is None  # cursors count its items alone
        assert _pages_forward(cl, sid, work_id, limit=1) == expected
        assert _pages_back(cl, sid, work_id, limit=3) == expected
    status, snap = get(cl, f"/sessions/{sid}", work_id=second, after=of_second[0]["seq"])
    assert status == 200 and snap["transcript"]["items"] == of_second[1:]

    for wrong in (elsewhere, UNKNOWN_WORK):  # another session's work item, and none at all
        status, error = get(cl, f"/sessions/{sid}", work_id=wrong)
        assert status == 404 and error["error"] == "not_found", (wrong, error)
    status, error = get(cl, f"/sessions/{sid}", work_id="")
    assert status == 400 and error["error"] == "bad_request"
