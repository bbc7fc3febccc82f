"""REST contract (DESIGN §10) through a real in-process Jupyter server (pytest-jupyter).

``workers = 0``: nothing executes turns, so these tests see only what the API commits and answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from jupyter_server.serverapp import ServerApp

from jupyter_goals.server.answers import EventPage
from jupyter_goals.store.db import Database
from jupyter_goals.store.schema import migrate
from tests import restkit
from tests.restkit import Api, Json, assert_error, start_goals, stop_goals

# the REST fixtures (tests/restkit.py): their event loop, isolated state dir, server config, the started
# server's client and raw URLs
jp_asyncio_loop = restkit.jp_asyncio_loop
goals_state_dir = restkit.goals_state_dir
jp_server_config = restkit.jp_server_config
api = restkit.api
raw_url = restkit.raw_url


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- health and sessions


async def test_health_reports_status_databases_workers_recovery_and_identity(api: Api) -> None:
    health = await api.ok("GET", "health")
    assert {"status", "databases", "workers", "recovery", "host_name", "boot_id"} <= set(health)
    assert health["status"] == "ok"
    assert health["databases"]["control"]["ok"] is True
    assert health["databases"]["usage"]["ok"] is True
    assert health["workers"] == []  # workers = 0
    assert (health["host_name"], health["boot_id"]) == ("rest-test-host", "rest-test-boot")
    assert "admitted" in health["recovery"]  # the start-up recovery ran and reported


async def test_created_session_is_listed_and_has_a_snapshot(api: Api, goals_state_dir: Path) -> None:
    created = await api.ok("POST", "sessions", {"title": "Analysis", "cwd": str(goals_state_dir),
                                                 "permissions": {"mode": "bypass"}}, expect=201)
    sid = created["session_id"]
    assert created["session"]["session_id"] == sid
    assert created["session"]["title"] == "Analysis"
    assert created["session"]["permissions"] == {"mode": "bypass", "allow": [], "folders": [], "env_allow": []}

    listed = await api.ok("GET", "sessions")
    assert [s["session_id"] for s in listed["sessions"]] == [sid]

    snap = await api.ok("GET", f"sessions/{sid}")
    assert {"session", "work", "goal", "todo", "approvals", "transcript", "usage", "actions", "event_seq"} <= set(snap)
    assert snap["session"]["cwd"] == str(goals_state_dir)
    assert snap["work"] is None
    assert set(snap["transcript"]) >= {"items", "next_cursor"}
    assert snap["event_seq"] >= 1
    assert {"can_pause", "can_resume", "can_stop", "can_end", "can_retry", "can_verify", "reason_code"} <= set(snap["actions"])


def test_a_sessions_stop_is_offered_as_can_stop_and_can_end_stays_its_older_equal() -> None:
    """One name per action: a session's ``stop`` is ``can_stop`` (the button "Stop"); ``can_end`` is kept
    equal to it for older clients. Computed on the server for every phase."""
    from jupyter_goals.server.queries import actions_for

    for phase in ("queued", "working", "waiting", "recovering", "failed", "paused", "interrupted", "done", "cancelled"):
        for desired in ("run", "paused", "cancelled", "done"):
            actions = actions_for({"phase": phase, "desired_state": desired, "reason_code": ""})
            assert actions.can_stop == actions.can_end == (phase not in ("done", "cancelled")), (phase, desired)


async def test_a_session_without_a_folder_runs_in_the_server_root_and_a_relative_one_below_it(
    api: Api, jp_serverapp: ServerApp, tmp_path: Path
) -> None:
    """An empty folder means the server's root directory (what JupyterLab's file browser shows), never
    the directory the server process was started from; a relative folder (the file browser's path) is
    resolved below the root; an absolute one is kept."""
    root = Path(os.path.abspath(jp_serverapp.root_dir))  # noqa: ASYNC240 - path arithmetic
    assert str(root) != os.getcwd()  # the two differ here, as in `bash scripts/run`
    for body, expected in (({}, root), ({"cwd": ""}, root), ({"cwd": "  "}, root),
                           ({"cwd": "data/raw"}, root / "data" / "raw"), ({"cwd": "data/../notes"}, root / "notes"),
                           ({"cwd": str(tmp_path)}, tmp_path)):
        created = await api.ok("POST", "sessions", {"title": "folder", **body}, expect=201)
        assert created["session"]["cwd"] == str(expected), body


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("sessions", "{not json"),
        ("sessions", "[1, 2]"),
        ("sessions", json.dumps({"title": "x", "colour": "red"})),
        ("sessions", json.dumps({"title": 5})),
        ("sessions", json.dumps({"permissions": {"mode": "yolo"}})),
        ("sessions/{sid}/messages", json.dumps({"client_request_id": "r1"})),
        ("sessions/{sid}/messages", json.dumps({"text": "", "client_request_id": "r1"})),
        ("sessions/{sid}/messages", json.dumps({"text": ["a"], "client_request_id": "r1"})),
        ("sessions/{sid}/messages", json.dumps({"text": "hi"})),
        ("sessions/{sid}/messages", json.dumps({"text": "hi", "client_request_id": "r1", "delivery": "now"})),
        ("sessions/{sid}/messages", json.dumps({"text": "hi", "client_request_id": "r1", "priority": 1})),
        ("sessions/{sid}/actions", json.dumps({"action": "explode"})),
        ("sessions/{sid}/actions", json.dumps({"action": "pause", "expected_control_version": [1]})),
        ("actions", json.dumps({"action": "pause"})),
        ("approvals/apr_x", json.dumps({"decision": "maybe"})),
    ],
)
async def test_bad_input_is_answered_400_with_error_and_message(api: Api, path: str, raw: str) -> None:
    sid = await api.new_session()
    before = await api.events()
    code, answer = await api.call("POST", path.format(sid=sid), raw=raw)
    assert code == 400, answer
    assert_error(answer)
    assert (await api.events())["last_seq"] == before["last_seq"]  # nothing was committed


async def test_bad_query_arguments_are_400(api: Api) -> None:
    code, answer = await api.call("GET", "events", params={"after": "soon", "format": "json"})
    assert code == 400
    assert_error(answer, "bad_request")
    code, answer = await api.call("GET", "approvals", params={"state": "whatever"})
    assert code == 400
    assert_error(answer, "bad_request")


async def test_usage_answers_the_contract_fields_and_refuses_bad_queries(api: Api) -> None:
    sid = await api.new_session(title="usage")
    answer = await api.ok("GET", "usage", params={"session_id": sid})
    assert {"known_cost_usd", "known_tokens", "unknown_usage_requests", "estimated_cost_usd", "display",
            "active_seconds", "unknown_intervals"} <= set(answer)
    assert answer["known_cost_usd"] == 0 and answer["unknown_usage_requests"] == 0
    assert answer["display"] == "Known $0.00"
    snap = await api.ok("GET", f"sessions/{sid}")
    assert snap["usage"]["display"] == "Known $0.00" and "active_seconds" in snap["usage"]
    for params in ({}, {"session_id": sid, "goal_id": "gol_x"}):
        status, err = await api.call("GET", "usage", params=params)
        assert status == 400, params
        assert_error(err, "bad_request")
    for params in ({"session_id": "ses_missing"}, {"goal_id": "gol_missing"}):
        status, err = await api.call("GET", "usage", params=params)
        assert status == 404, params


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "sessions/ses_missing", None),
        ("POST", "sessions/ses_missing/messages", {"text": "hi", "client_request_id": "r1"}),
        ("POST", "sessions/ses_missing/actions", {"action": "pause"}),
        ("POST", "approvals/apr_missing", {"decision": "approve"}),
    ],
)
async def test_unknown_session_or_approval_is_404(api: Api, method: str, path: str, body: Any) -> None:
    code, answer = await api.call(method, path, body)
    assert code == 404, answer
    assert_error(answer, "not_found")


# --------------------------------------------------------------------------- messages and controls


async def test_posted_message_is_accepted_and_a_repeated_client_request_id_gives_the_same_answer(api: Api) -> None:
    sid = await api.new_session()
    first = await api.send(sid, "Summarise data.csv", "req-42")
    assert first["message_id"] and first["work_id"]
    again = await api.send(sid, "a retried request with other text", "req-42")
    assert (again["message_id"], again["work_id"]) == (first["message_id"], first["work_id"])

    snap = await api.ok("GET", f"sessions/{sid}")
    assert snap["work"]["work_id"] == first["work_id"]
    assert snap["work"]["desired_state"] == "run"
    kinds = [e["kind"] for e in (await api.events())["events"] if e["session_id"] == sid]
    assert kinds.count("work.created") == 1
    assert kinds.count("message.accepted") == 1

    other = await api.send(sid, "a second request", "req-43")
    assert other["work_id"] != first["work_id"]


async def test_session_actions_bump_the_control_version_and_refuse_a_stale_one(api: Api) -> None:
    sid = await api.new_session()
    await api.send(sid, "work on it", "req-1")
    snap = await api.ok("GET", f"sessions/{sid}")
    v = snap["work"]["control_version"]

    paused = await api.ok("POST", f"sessions/{sid}/actions", {"action": "pause", "expected_control_version": v})
    assert (paused["desired_state"], paused["control_version"]) == ("paused", v + 1)
    snap = await api.ok("GET", f"sessions/{sid}")
    assert (snap["work"]["phase"], snap["work"]["reason_code"]) == ("paused", "user_paused")
    assert snap["actions"]["can_resume"] is True and snap["actions"]["can_pause"] is False

    code, answer = await api.call("POST", f"sessions/{sid}/actions", {"action": "resume", "expected_control_version": v})
    assert code == 409
    assert_error(answer, "conflict")
    assert (await api.ok("GET", f"sessions/{sid}"))["work"]["desired_state"] == "paused"  # unchanged

    resumed = await api.ok("POST", f"sessions/{sid}/actions", {"action": "resume", "expected_control_version": v + 1})
    assert (resumed["desired_state"], resumed["control_version"]) == ("run", v + 2)

    code, answer = await api.call("POST", f"sessions/{sid}/actions", {"action": "stop", "expected_control_version": v})
    assert code == 409
    assert_error(answer, "conflict")
    stopped = await api.ok("POST", f"sessions/{sid}/actions", {"action": "stop", "expected_control_version": v + 2})
    assert stopped["desired_state"] == "cancelled"

    code, answer = await api.call("POST", f"sessions/{sid}/actions", {"action": "resume"})
    assert code == 409  # ended work cannot be resumed
    assert_error(answer, "conflict")


async def test_stop_all_persists_stop_intent_for_every_unfinished_item(api: Api) -> None:
    running = await api.send(await api.new_session(), "task one", "req-1")
    paused_sid = await api.new_session()
    paused = await api.send(paused_sid, "task two", "req-1")
    await api.ok("POST", f"sessions/{paused_sid}/actions", {"action": "pause"})
    idle_sid = await api.new_session()  # no work: nothing to stop

    answer = await api.ok("POST", "actions", {"action": "stop_all"})
    assert set(answer) == {"stopped"}
    assert sorted(answer["stopped"]) == sorted([running["work_id"], paused["work_id"]])

    sessions = (await api.ok("GET", "sessions"))["sessions"]
    by_work = {s["work"]["work_id"]: s["work"] for s in sessions if s["work"]}
    assert {by_work[w]["desired_state"] for w in answer["stopped"]} == {"cancelled"}
    assert next(s for s in sessions if s["session_id"] == idle_sid)["work"] is None
    assert (await api.ok("POST", "actions", {"action": "stop_all"})) == {"stopped": []}


# --------------------------------------------------------------------------- events


async def test_event_polling_gives_monotonic_seqs_and_honours_after_and_limit(api: Api) -> None:
    sid = await api.new_session()
    for i in range(3):
        await api.send(sid, f"message {i}", f"req-{i}")
    everything = await api.events(0, 500)
    seqs = [e["seq"] for e in everything["events"]]
    assert len(seqs) >= 7
    assert seqs == sorted(set(seqs))
    assert everything["last_seq"] == seqs[-1]

    paged: list[int] = []
    after = 0
    while True:
        page = await api.events(after, 3)
        assert len(page["events"]) <= 3
        if not page["events"]:
            break
        assert all(e["seq"] > after for e in page["events"])
        paged += [e["seq"] for e in page["events"]]
        after = page["events"][-1]["seq"]
    assert paged[: len(seqs)] == seqs

    middle = seqs[3]
    tail = await api.events(middle, 500)
    assert [e["seq"] for e in tail["events"]][: len(seqs) - 4] == seqs[4:]


async def read_sse(url: str, headers: dict[str, str], frames: int) -> list[Json]:
    """Read the first ``frames`` events of an event stream, then close it."""
    parsed: list[Json] = []

    async def read() -> None:
        async with httpx.AsyncClient(headers=headers, timeout=10) as client:
            async with client.stream("GET", url) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                buffer = ""
                async for chunk in resp.aiter_text():
                    buffer += chunk
                    while "\n\n" in buffer and len(parsed) < frames:
                        frame, buffer = buffer.split("\n\n", 1)
                        fields = dict(line.split(": ", 1) for line in frame.splitlines() if not line.startswith(":"))
                        if fields:
                            parsed.append(fields)
                    if len(parsed) >= frames:
                        return

    await asyncio.wait_for(read(), 15)
    return parsed


async def test_event_stream_sends_id_lines_and_honours_last_event_id(
    api: Api, raw_url: Any, jp_auth_header: dict[str, str]
) -> None:
    sid = await api.new_session()
    await api.send(sid, "hello", "req-1")
    resume_from = (await api.events())["events"][1]["seq"]

    frames = await read_sse(raw_url("events"), {**jp_auth_header, "Last-Event-ID": str(resume_from)}, 2)
    ids = [int(f["id"]) for f in frames]
    expected = [e["seq"] for e in (await api.events(resume_from, 2))["events"]]
    assert ids == expected and ids[0] > resume_from
    for f in frames:
        data = json.loads(f["data"])
        assert data["seq"] == int(f["id"]) and f["event"] == data["kind"]

    frames = await read_sse(raw_url(f"events?after={resume_from}"), jp_auth_header, 1)
    assert int(frames[0]["id"]) == expected[0]


async def test_event_stream_stops_reading_the_database_once_the_client_is_gone(
    api: Api, raw_url: Any, jp_auth_header: dict[str, str], jp_serverapp: ServerApp
) -> None:
    await api.new_session()
    queries = jp_serverapp.web_app.settings["jupyter_goals_service"].queries
    reads: list[int] = []
    original = queries.events

    async def counted(after: int, limit: int) -> EventPage:
        reads.append(after)
        return await original(after, limit)

    queries.events = counted
    await read_sse(raw_url("events"), jp_auth_header, 1)
    # the stream's loop has ended (health counts open streams): it reads nothing more
    for _ in range(500):  # up to 10 s
        if not (await api.ok("GET", "health"))["event_streams"]:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the event stream still runs after its client left")
    settled = len(reads)
    await api.new_session()  # a new event it would have read
    assert (await api.events())["events"]  # one JSON read, through the same counted function
    assert len(reads) == settled + 1


# --------------------------------------------------------------------------- auth


def _every_operation() -> list[tuple[str, str]]:
    from jupyter_goals.server.openapi import document

    return [(method.upper(), path.replace("{", "").replace("}", "_x").lstrip("/"))
            for path, methods in document()["paths"].items() for method in methods]


@pytest.mark.parametrize(("method", "path"), _every_operation())
async def test_every_route_refuses_a_request_without_a_valid_token(
    api: Api, raw_url: Any, method: str, path: str
) -> None:
    """Every operation of the OpenAPI document (so every route added later too): no token or a wrong
    one is 401/403 before anything runs, never data."""
    async with httpx.AsyncClient(timeout=10) as client:
        for headers in ({}, {"Authorization": "token not-the-token"}):
            r = await client.request(method, raw_url(path), content=None if method == "GET" else "{}", headers=headers)
            assert r.status_code in (401, 403), (method, path, r.status_code, r.text[:200])


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "health", None),
        ("GET", "sessions", None),
        ("POST", "sessions", "{}"),
        ("GET", "events?format=json", None),
        ("POST", "actions", json.dumps({"action": "stop_all"})),
    ],
)
async def test_requests_without_a_token_are_rejected(
    api: Api, raw_url: Any, method: str, path: str, body: str | None
) -> None:
    sid = await api.new_session()
    await api.send(sid, "keep running", "req-1")
    async with httpx.AsyncClient(timeout=10) as client:
        for headers in ({}, {"Authorization": "token not-the-token"}):
            r = await client.request(method, raw_url(path), content=body, headers=headers)
            assert r.status_code in (401, 403), (path, r.status_code, r.text)
    sessions = (await api.ok("GET", "sessions"))["sessions"]
    assert [s["session_id"] for s in sessions] == [sid]
    assert sessions[0]["work"]["desired_state"] == "run"


# --------------------------------------------------------------------------- degraded storage


def seed_garbage_control_db(state_dir: Path) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    control = state_dir / "control.db"
    control.write_bytes(b"this is not a database, keep it as it is\n" * 200)
    return control


def seed_newer_schema(state_dir: Path) -> Path:
    """A control.db written by a newer release (schema v99)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    control = state_dir / "control.db"
    db = Database(f"sqlite:///{control}")
    try:
        migrate(db, "control")
        db.transact(lambda tx: tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'from a newer release', 0)"))
    finally:
        db.close()
    return control


def backups_of(db_file: Path) -> list[Path]:
    return list(db_file.parent.glob(f"{db_file.name}*.bak"))


async def assert_degraded(api: Api, code: str) -> None:
    for method, path, body in (
        ("GET", "sessions", None),
        ("POST", "sessions", {"title": "x"}),
        ("GET", "sessions/ses_any", None),
        ("GET", "events", None),
        ("POST", "actions", {"action": "stop_all"}),
    ):
        status, answer = await api.call(method, path, body, params={"format": "json"} if path == "events" else None)
        assert status == 503, (method, path, status, answer)
        assert_error(answer, code)
    health = await api.ok("GET", "health")
    assert health["status"] == "degraded"
    assert health["reason_code"] == code
    assert health["databases"]["control"]["ok"] is False
    assert health["databases"]["control"]["error"]["code"] == code


async def test_unreadable_control_db_degrades_the_server_and_is_left_untouched(
    jp_serverapp: ServerApp, jp_fetch: Any, goals_state_dir: Path
) -> None:
    control = seed_garbage_control_db(goals_state_dir)
    before = sha256(control)

    await start_goals(jp_serverapp)
    await assert_degraded(Api(jp_fetch), "storage_unavailable")
    await stop_goals(jp_serverapp)

    assert sha256(control) == before
    assert not backups_of(control)


async def test_a_control_db_readable_again_heals_the_server_without_a_restart(
    jp_serverapp: ServerApp, jp_fetch: Any, goals_state_dir: Path
) -> None:
    control = seed_garbage_control_db(goals_state_dir)
    before = sha256(control)
    await start_goals(jp_serverapp)
    api = Api(jp_fetch)
    await assert_degraded(api, "storage_unavailable")

    broken = control.rename(control.with_name("control.db.broken"))  # the person moves the damaged file aside
    health: dict[str, Any] = {}
    for _ in range(100):
        health = await api.ok("GET", "health")
        if health["status"] == "ok":
            break
        await asyncio.sleep(0.1)
    assert health["status"] == "ok", health
    status, created = await api.call("POST", "sessions", {"title": "after the repair"})
    assert status == 201, created
    await stop_goals(jp_serverapp)
    assert sha256(broken) == before


async def test_schema_newer_than_the_code_degrades_with_migration_failed(
    jp_serverapp: ServerApp, jp_fetch: Any, goals_state_dir: Path
) -> None:
    control = seed_newer_schema(goals_state_dir)
    before = sha256(control)

    await start_goals(jp_serverapp)
    await assert_degraded(Api(jp_fetch), "migration_failed")
    await stop_goals(jp_serverapp)

    assert sha256(control) == before
    assert not backups_of(control)
