"""Bad input (issue 16): oversized bodies, invalid UTF-8, deep JSON, non-object JSON, unpaired
surrogates, non-finite numbers, huge texts and out-of-range transcript cursors each get a clear 4xx
``{"error", "message"}`` (``server/bodies.py``), and a refused request writes nothing: control.db
has the same sessions, messages, work items, transcript items, Goals, Jobs and events afterwards.

The fast tests run a real in-process Jupyter server (pytest-jupyter, as ``test_rest.py``) with the
default limits; the slow one starts a real ``jupyter server`` with smaller limits set on its command
line, and checks what the notebook client and ``%goal`` show.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from jupyter_goals.clients.rest import GoalsError
from jupyter_goals.config import GoalsConfig
from jupyter_goals.server.bodies import MAX_JSON_DEPTH, BodyRefused, parse_body
from tests.restkit import (  # noqa: F401 - the REST fixtures are shared (tests/restkit.py)
    Api,
    assert_error,
    goals_state_dir,
    jp_asyncio_loop,
    jp_server_config,
    start_goals,
)
from tests.servers import db_rows, server_env, wait_for

TABLES = ("sessions", "messages", "work_items", "transcript", "goals", "goal_revisions", "jobs", "approvals",
          "attempts", "events")
DEFAULTS = GoalsConfig(state_dir=Path("."), control_db_url="", usage_db_url="", default_model="")


def counts(state: Path) -> dict[str, int]:
    """Rows of every table a request could write, read from control.db as an operator would."""
    return {t: db_rows(state, f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in TABLES}


def deep(levels: int) -> bytes:
    return b'{"title": ' + b"[" * levels + b"]" * levels + b"}"


def bad_bodies(sid: str, max_bytes: int, max_chars: int) -> list[tuple[str, str, bytes, int, str]]:
    """(name, route, body, status, error code) for one server's limits."""
    text = "x" * (max_chars + 1)
    msg = f"sessions/{sid}/messages"
    return [
        ("oversized body", msg, json.dumps({"text": "a", "client_request_id": "big", "pad": " " * max_bytes}).encode(),
         413, "request_too_large"),
        ("oversized session body", "sessions", b'{"title": "' + b"t" * max_bytes + b'"}', 413, "request_too_large"),
        ("invalid UTF-8", msg, b'{"text": "caf\xe9", "client_request_id": "u1"}', 400, "bad_json"),
        ("UTF-16", "sessions", '{"title": "x"}'.encode("utf-16"), 400, "bad_json"),
        ("not JSON", msg, b'{"text": ', 400, "bad_json"),
        ("deep JSON", "sessions", deep(MAX_JSON_DEPTH + 2), 400, "bad_json"),
        ("JSON deep enough to exhaust the parser", "sessions", deep(min(200_000, (max_bytes - 20) // 2)), 400, "bad_json"),
        ("array", msg, b'[{"text": "a", "client_request_id": "a1"}]', 400, "bad_request"),
        ("string", "goals", b'"set a goal"', 400, "bad_request"),
        ("null", "jobs", b"null", 400, "bad_request"),
        ("unpaired surrogate in a title", "sessions", b'{"title": "\\udfff"}', 400, "bad_json"),
        ("unpaired surrogate in a message", msg, b'{"text": "a\\ud800", "client_request_id": "s1"}', 400, "bad_json"),
        ("NaN", "goals", json.dumps({"session_id": sid, "objective": "o", "budget": {"max_cost_usd": float("nan")}}).encode(),
         400, "bad_json"),
        ("a number beyond a float", "goals", b'{"session_id": "' + sid.encode() + b'", "objective": "o",'
         b' "budget": {"max_cost_usd": 1e400}}', 400, "bad_json"),
        ("huge message text", msg, json.dumps({"text": text, "client_request_id": "h1"}).encode(), 413, "text_too_large"),
        ("huge steer", msg, json.dumps({"text": text, "client_request_id": "h2", "delivery": "steer"}).encode(),
         413, "text_too_large"),
        ("huge Job input", "jobs", json.dumps({"session_id": sid, "input": text}).encode(), 413, "text_too_large"),
        ("huge Goal objective", "goals", json.dumps({"session_id": sid, "objective": text}).encode(), 413, "text_too_large"),
        ("huge requirement", "goals", json.dumps({"session_id": sid, "objective": "o",
                                                  "requirements": [{"text": text}]}).encode(), 413, "text_too_large"),
        ("huge title", "sessions", json.dumps({"title": text}).encode(), 413, "text_too_large"),
    ]


BAD_QUERIES = [  # transcript and event cursors beyond the databases' 64-bit integers, non-ASCII digits
    ("sessions/{sid}", {"after": str(2**70)}), ("sessions/{sid}", {"before": str(2**70)}),
    ("sessions/{sid}", {"before": "²"}), ("sessions/{sid}", {"limit": str(-(2**64))}),
    ("events", {"after": str(2**64), "format": "json"}),
]


# --------------------------------------------------------------------------- the parser alone


def test_parse_body_checks_size_before_decoding_and_names_the_field_that_is_too_long() -> None:
    with pytest.raises(BodyRefused) as too_big:
        parse_body(b"\xff" * 11, max_bytes=10, max_chars=5)  # not UTF-8 either: the size is checked first
    assert (too_big.value.status, too_big.value.code) == (413, "request_too_large")
    with pytest.raises(BodyRefused) as long_text:
        parse_body(json.dumps({"reqs": [{"text": "ok"}, {"text": "x" * 6}]}).encode(), max_bytes=100, max_chars=5)
    assert long_text.value.status == 413 and str(long_text.value).startswith("reqs.1.text is 6 characters")
    assert parse_body(b"", max_bytes=10, max_chars=5) == {}
    assert parse_body('{"t": "é\\ud83d\\ude00"}'.encode(), max_bytes=100, max_chars=5) == {"t": "é😀"}  # a pair is fine
    nested = b'{"a": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert parse_body(nested, max_bytes=1000, max_chars=5)  # the deepest body allowed
    with pytest.raises(BodyRefused):
        parse_body(b'{"a": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}", max_bytes=1000, max_chars=5)


# --------------------------------------------------------------------------- in-process server, default limits


@pytest.fixture
async def rest(jp_serverapp: Any, jp_fetch: Any) -> Api:
    await start_goals(jp_serverapp)
    return Api(jp_fetch)


async def test_every_kind_of_bad_body_is_a_clear_4xx_and_writes_nothing(
        rest: Api, jp_fetch: Any, tmp_path: Path) -> None:
    state = tmp_path / "goals_state"  # the goals_state_dir fixture's directory
    api = rest
    sid = (await api.ok("POST", "sessions", {"title": "target"}, expect=201))["session_id"]
    before = counts(state)
    for name, route, body, status, code in bad_bodies(sid, DEFAULTS.max_request_bytes, DEFAULTS.max_message_chars):
        r = await jp_fetch("api", "goals", *route.split("/"), method="PUT" if route == "notebook-session" else "POST",
                           body=body, raise_error=False)
        answer = json.loads(r.body)
        assert r.code == status, (name, r.code, answer)
        assert_error(answer, code)
        assert len(answer["message"]) < 300, (name, answer)  # fits the UI's error line
    for route, params in BAD_QUERIES:
        code, answer = await api.call("GET", route.format(sid=sid), params=params)
        assert code == 400, (route, params, code, answer)
        assert_error(answer, "bad_request")
    assert counts(state) == before
    # the limits are inclusive: a text of exactly max_message_chars is accepted
    await api.send(sid, "y" * DEFAULTS.max_message_chars, "at-the-limit")
    after = counts(state)
    assert after["messages"] == before["messages"] + 1 and after["work_items"] == before["work_items"] + 1


async def test_the_limits_are_in_the_openapi_document_and_the_error_names_the_setting(rest: Api) -> None:
    api = rest
    doc = await api.ok("GET", "openapi.json")
    assert "413" in doc["paths"]["/sessions/{session_id}/messages"]["post"]["responses"]
    assert "413" not in doc["paths"]["/sessions"]["get"]["responses"]
    code, answer = await api.call("POST", "sessions", raw=json.dumps({"title": "t" * (DEFAULTS.max_message_chars + 1)}))
    assert code == 413 and "GoalsApp.max_message_chars" in answer["message"] and answer["message"].startswith("title is")


async def test_cancel_tool_with_an_empty_effect_id_is_a_400_naming_the_field_and_changes_nothing(rest: Api) -> None:
    """Issue 27 item 1: an empty ``effect_id`` fell through to the pause/resume/stop path, which has no
    ``cancel_tool``: a 500 ``internal_error`` saying ``'cancel_tool'``."""
    api = rest
    sid = await api.new_session(title="unfinished")
    await api.send(sid, "work on it", "r1")  # unfinished work: the path the empty id fell into
    work = (await api.ok("GET", f"sessions/{sid}"))["work"]
    for body in ({"action": "cancel_tool", "effect_id": ""}, {"action": "cancel_tool"},
                 {"action": "cancel_tool", "effect_id": None}):
        code, answer = await api.call("POST", f"sessions/{sid}/actions", body)
        assert code == 400, (body, code, answer)
        assert_error(answer, "bad_request")
        assert "effect_id" in answer["message"], answer
    after = (await api.ok("GET", f"sessions/{sid}"))["work"]
    assert (after["work_id"], after["desired_state"], after["control_version"]) == (
        work["work_id"], "run", work["control_version"])
    kinds = {e["kind"] for e in (await api.events())["events"] if e["session_id"] == sid}
    assert not {k for k in kinds if k.startswith(("work.control", "effect.cancel"))}, kinds


# --------------------------------------------------------------------------- a real jupyter server, limits set


@pytest.mark.slow
def test_configured_limits_hold_on_a_real_server_and_the_client_and_magics_say_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    max_bytes, max_chars = 4096, 200
    with server_env(tmp_path, []) as env:
        server = env["make"]([f"--GoalsApp.max_request_bytes={max_bytes}",
                              f"--GoalsApp.max_message_chars={max_chars}"]).start()
        cl = server.client()
        sid = str(cl.create_session(title="limits")["session_id"])
        # the worker's registration commits an event of its own: counted before, not during, the barrage
        wait_for(lambda: db_rows(env["state"], "SELECT 1 FROM workers WHERE state = 'live'"), what="the worker registered")
        saved = json.loads((env["state"] / "server_config.json").read_text())
        assert (saved["max_request_bytes"], saved["max_message_chars"]) == (max_bytes, max_chars)
        before = counts(env["state"])
        for name, route, body, status, code in bad_bodies(sid, max_bytes, max_chars):
            r = cl.http.post(f"/{route}", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == status, (name, r.status_code, r.text[:300])
            assert set(r.json()) == {"error", "message"} and r.json()["error"] == code, (name, r.text[:300])
        for route, params in BAD_QUERIES:
            r = cl.http.get(f"/{route.format(sid=sid)}", params=params)
            assert r.status_code == 400 and r.json()["error"] == "bad_request", (route, params, r.text)

        # the notebook client raises the server's answer; %goal shows it as a sentence, nothing saved
        with pytest.raises(GoalsError) as refused:
            cl.send(sid, "z" * (max_chars + 1))
        assert (refused.value.status, refused.value.error) == (413, "text_too_large")
        assert refused.value.message == f"text is {max_chars + 1:,} characters; the limit is {max_chars:,} (GoalsApp.max_message_chars)"
        monkeypatch.setenv("JUPYTER_GOALS_SERVER_URL", server.url)
        monkeypatch.setenv("JUPYTER_GOALS_TOKEN", server.token)
        ip = InteractiveShell.instance()
        ip.run_line_magic("reload_ext", "jupyter_goals")
        assert counts(env["state"]) == before
        goals_before = before["goals"]
        with capture_output(), pytest.raises(UsageError) as shown:
            ip.run_line_magic("goal", "--bypass " + "o" * (max_chars + 1))
        assert str(shown.value) == (f"refused (413 too large, text_too_large): objective is {max_chars + 1:,} characters;"
                                    f" the limit is {max_chars:,} (GoalsApp.max_message_chars); nothing was saved")
        after = counts(env["state"])
        # %goal may first make the notebook's session (an accepted request); nothing of the refused Goal exists
        assert after["goals"] == goals_before and after["sessions"] - before["sessions"] in (0, 1)
        skip = ("sessions", "events")
        assert {k: v for k, v in after.items() if k not in skip} == {k: v for k, v in before.items() if k not in skip}
        # the server is fine afterwards: a message at the limit is accepted and answered
        cl.send(sid, "w" * max_chars)
        assert cl.wait(sid, timeout=60)["work"]["phase"] == "done"
