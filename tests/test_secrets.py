"""Secrets never reach tools, transcripts or the model (issue 11).

Tool processes start from an allow-list of the worker's environment; credentials that reach a tool by
another way (a file, ``/proc``) are redacted before the result is committed or sent to a provider; and a
tool process holding the server's token still cannot decide approvals or change permissions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.secrecy import Redactor, is_secret_name, tool_environment
from tests.inproc import Rig
from tests.servers import db_rows, server_env, wait_for

TOKEN_NAME = "JUPYTER_GOALS_TOKEN"


# --------------------------------------------------------------------------- the policy, pure


def test_tool_environment_keeps_the_base_allow_list_and_drops_everything_else() -> None:
    source = {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C", "TERM": "xterm",
              "OPENAI_API_KEY": "sk-1234567890", "JUPYTER_GOALS_TOKEN": "t" * 32, "JPY_SESSION_NAME": "a.ipynb",
              "RANDOM_SETTING": "x", "PWD": "/elsewhere"}
    env = tool_environment(source, (), "/work/here")
    assert env == {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C", "TERM": "xterm",
                   "PWD": "/work/here"}


def test_a_secret_name_passes_only_when_named_exactly_never_through_a_glob() -> None:
    source = {"MY_SETTING": "1", "MY_API_KEY": "k" * 20, "MY_TOKEN": "t" * 20, "OTHER": "2"}
    assert set(tool_environment(source, ["MY_*"], "/")) == {"MY_SETTING", "PWD"}
    assert set(tool_environment(source, ["MY_*", "MY_TOKEN"], "/")) == {"MY_SETTING", "MY_TOKEN", "PWD"}
    for name in ("OPENAI_API_KEY", "JUPYTER_GOALS_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "JPY_SESSION_NAME",
                 "JUPYTER_GOALS_SERVER_URL", "SSH_AUTH_SOCK"):
        assert is_secret_name(name), name
    assert not is_secret_name("PATH") and not is_secret_name("LANG")


def test_redaction_replaces_every_credential_value_and_names_it() -> None:
    red = Redactor.from_environment({"OPENAI_API_KEY": "sk-abcdef123456", "PATH": "/usr/bin:/bin", "SHORT_KEY": "x"},
                                    extra={TOKEN_NAME: "0123456789abcdef"})
    out = red.redact("key sk-abcdef123456 token 0123456789abcdef twice 0123456789abcdef path /usr/bin:/bin x")
    assert out.text == ("key [redacted: OPENAI_API_KEY] token [redacted: JUPYTER_GOALS_TOKEN] twice "
                        "[redacted: JUPYTER_GOALS_TOKEN] path /usr/bin:/bin x")
    assert out.names == ("JUPYTER_GOALS_TOKEN", "OPENAI_API_KEY")
    assert red.redact("nothing here").names == ()


# --------------------------------------------------------------------------- in a real tool process


async def test_tool_env_allow_reaches_the_tool_and_a_secret_pattern_only_by_exact_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GoalsApp.tool_env_allow`` (server) and ``permissions.env_allow`` (session) add variables to a
    real shell process's environment; a secret-looking name needs its exact name."""
    monkeypatch.setenv("TEAM_SETTING", "visible-setting")
    monkeypatch.setenv("TEAM_API_KEY", "team-api-key-value")
    monkeypatch.setenv("SESSION_ONLY_VALUE", "per-session")
    monkeypatch.setenv("DEPLOY_TOKEN", "deploy-token-value")
    monkeypatch.setenv("UNLISTED", "unlisted-value")
    rules = [{"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "ok"}},
             {"when": {"purpose": "work"}, "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "env"}}]}}]
    rig = Rig(tmp_path, rules)
    rig.tool_env_allow = ["TEAM_*", "DEPLOY_TOKEN"]
    try:
        sid = rig.session({"mode": "bypass", "env_allow": ["SESSION_ONLY_VALUE"]})
        rig.send(sid, "go")
        await rig.run_until_quiet()
        result = next(i for i in rig.items(sid) if i.kind == "tool_result")
        env = dict(line.split("=", 1) for line in result.content.splitlines() if "=" in line)
        assert env["TEAM_SETTING"] == "visible-setting"  # a glob of the server's allow-list
        assert env["SESSION_ONLY_VALUE"] == "per-session"  # the session's own env_allow
        assert "TEAM_API_KEY" not in env  # matches TEAM_* but looks like a secret: never through a glob
        # named exactly by a person: it reaches the tool; its value is still redacted from the transcript
        assert env["DEPLOY_TOKEN"] == "[redacted: DEPLOY_TOKEN]" and "deploy-token-value" not in result.content
        assert "UNLISTED" not in env and env["PWD"] == str(rig.root)
    finally:
        rig.close()


def _secrets_absent(blob: str, secrets: dict[str, str]) -> list[str]:
    return [name for name, value in secrets.items() if value in blob]


@pytest.mark.slow
def test_env_and_proc_environ_in_a_chat_reveal_no_token_or_key_on_disk_in_the_transcript_or_to_the_model(
    tmp_path: Path,
) -> None:
    """A real server with a token and provider keys in its environment; a bypass chat on a local
    OpenAI-compatible server runs ``env`` and ``cat /proc/self/environ`` (nothing secret reaches the
    process: its output on disk is clean), then reads a file holding the token and the worker's own
    ``/proc/<ppid>/environ`` (secrets reached the output by another way: redacted before the transcript
    and before the next provider request, and the result item names what was hidden)."""
    from tests.openai_server import OpenAITestServer

    keys = {"OPENAI_API_KEY": "sk-test-openai-5f0c1d2e3a4b", "ANTHROPIC_API_KEY": "sk-ant-test-9e8d7c6b5a",
            "SERVICE_PASSWORD": "hunter2-but-longer"}
    with OpenAITestServer() as api, server_env(tmp_path, []) as env:
        api.plan_tool_call("shell", {"command": "env; echo ---; tr '\\0' '\\n' < /proc/self/environ"})
        api.plan_tool_call("shell", {"command": "cat leak.txt; echo ---; tr '\\0' '\\n' < /proc/$PPID/environ"})
        api.plan_text("All done.")
        server = env["make"](env={**keys, "OPENAI_BASE_URL": api.base_url}).start()
        secrets = {**keys, TOKEN_NAME: server.token}
        (env["root"] / "leak.txt").write_text(f"token={server.token}\nkey={keys['OPENAI_API_KEY']}\n")
        cl = server.client()
        sid = str(cl.create_session(title="env", cwd=str(env["root"]), model="openai:test-model",
                                    permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "show me the environment", client_request_id="r1")
        snap = cl.wait(sid, timeout=60)
        assert snap["work"]["phase"] == "done", snap["work"]

        effects = db_rows(env["state"], "SELECT effect_id, result FROM effects ORDER BY seq")
        assert len(effects) == 2
        first_stdout = (env["state"] / "effects" / effects[0]["effect_id"] / "stdout").read_text()
        assert "PATH=" in first_stdout and "JG_TOOL_EFFECT=" in first_stdout  # the real env was printed
        assert _secrets_absent(first_stdout, secrets) == []  # nothing secret reached the tool process
        second_stdout = (env["state"] / "effects" / effects[1]["effect_id"] / "stdout").read_text()
        assert server.token in second_stdout and keys["OPENAI_API_KEY"] in second_stdout  # reached by another way

        results = [i for i in snap["transcript"]["items"] if i["kind"] == "tool_result"]
        assert "[redacted: JUPYTER_GOALS_TOKEN]" in results[1]["content"]
        assert "[redacted: OPENAI_API_KEY]" in results[1]["content"]
        meta = db_rows(env["state"], "SELECT meta FROM transcript WHERE item_id = ?", (results[1]["item_id"],))
        assert {"JUPYTER_GOALS_TOKEN", "OPENAI_API_KEY"} <= set(json.loads(meta[0]["meta"])["redacted"])
        # nothing of control.db (transcript, effects, requests, events), in any page or WAL frame, holds one
        for f in sorted(env["state"].glob("control.db*")):
            assert _secrets_absent(f.read_bytes().decode("latin-1"), secrets) == [], f.name
        bodies = [json.dumps(r.body) for r in api.completion_requests]
        assert len(bodies) == 3
        for body in bodies:
            assert _secrets_absent(body, secrets) == []
        assert "[redacted: JUPYTER_GOALS_TOKEN]" in bodies[2]


@pytest.mark.slow
def test_a_tool_process_holding_the_token_cannot_approve_or_widen_permissions(tmp_path: Path) -> None:
    """The token leaked to a tool by a file: its requests to decide a pending approval (of another session
    and of its own kind), to widen permissions or to start work are refused with 403; the approval stays
    pending and a person can still decide it."""
    victim_rules: list[dict[str, Any]] = [
        {"when": {"purpose": "work", "last_user_contains": "attack", "last_tool_result_contains": "exit status"},
         "respond": {"text": "tried"}},
        {"when": {"purpose": "work", "last_user_contains": "attack"},
         "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": f"{sys.executable} attack.py"}}]}},
        {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "wrote"}},
        {"when": {"purpose": "work"},
         "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "echo pwned >> out.txt"}}]}},
    ]
    with server_env(tmp_path, victim_rules) as env:
        server = env["make"]().start()
        cl = server.client()
        victim = str(cl.create_session(title="victim", cwd=str(env["root"]))["session"]["session_id"])
        cl.send(victim, "write something", client_request_id="v1")
        wait_for(lambda: cl.approvals("pending"), timeout=30, what="a pending approval")
        approval = cl.approvals("pending")[0]
        (env["root"] / "token.txt").write_text(server.token)
        attack = f"""
import json, urllib.request, urllib.error
token = open("token.txt").read().strip()
base = {server.url!r} + "api/goals/"
def call(method, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method,
                                 headers={{"Authorization": "token " + token, "Content-Type": "application/json"}})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
for method, path, body in [
    ("POST", "approvals/{approval['approval_id']}", {{"decision": "approve"}}),
    ("PATCH", "sessions/{victim}", {{"permissions": {{"mode": "bypass"}}}}),
    ("POST", "sessions", {{"title": "escape", "permissions": {{"mode": "bypass"}}}}),
]:
    status, text = call(method, path, body)
    print("RESULT", method, path.split("/")[0], status, json.loads(text).get("error"))
"""
        (env["root"] / "attack.py").write_text(attack)
        attacker = str(cl.create_session(title="attacker", cwd=str(env["root"]),
                                         permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(attacker, "attack", client_request_id="a1")
        snap = cl.wait(attacker, timeout=60)
        result = next(i for i in snap["transcript"]["items"] if i["kind"] == "tool_result")["content"]
        assert "RESULT POST approvals 403 forbidden_from_tool" in result, result
        assert "RESULT PATCH sessions 403 forbidden_from_tool" in result, result
        assert "RESULT POST sessions 403 forbidden_from_tool" in result, result
        assert [a["approval_id"] for a in cl.approvals("pending")] == [approval["approval_id"]]
        assert cl.session(victim)["session"]["permissions"]["mode"] == "ask"
        assert [s["title"] for s in cl.sessions() if s["title"] == "escape"] == []
        assert not (env["root"] / "out.txt").exists()
        # the person, with the same token from outside any tool process, still decides it
        cl.decide(approval["approval_id"], "approve")
        wait_for(lambda: (env["root"] / "out.txt").exists(), timeout=30, what="the approved write")
        assert (env["root"] / "out.txt").read_text() == "pwned\n"
        assert cl.wait(victim, timeout=30)["work"]["phase"] == "done"
