"""Secrets never reach tools, transcripts or the model (issue 11).

Tool processes start from an allow-list of the worker's environment; credentials that reach a tool by
another way (a file, ``/proc``) are redacted before the result is committed or sent to a provider; and a
tool process holding the server's token still cannot decide approvals or change permissions.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from traitlets import TraitError
from traitlets.config import Config

from jupyter_goals.host.secrecy import Redactor, is_secret_name, tool_environment
from jupyter_goals.server.app import GoalsApp
from jupyter_goals.store import control as c
from tests.inproc import Rig
from tests.servers import ServerProcess, db_rows, server_env, wait_for

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


def test_tool_env_allow_refuses_an_entry_that_cannot_be_a_variable_name_or_glob() -> None:
    """A whole list given as one command-line value (traitlets keeps it as one string) or an entry with
    quotes, commas, whitespace or ``=`` is a TraitError naming the entry; names and globs pass."""
    good = ["MY_SETTING", "PROJ_*", "X[AB]_?", "DEPLOY_TOKEN", "lower_case"]
    assert GoalsApp(tool_env_allow=good).tool_env_allow == good
    for bad in ['["MY_SETTING", "PROJ_*"]', "", "MY SETTING", "A=1", "'PROJ_*'", "A,B", "TAB\tX"]:
        with pytest.raises(TraitError, match=re.escape(repr(bad)) + ".*not an environment variable name or glob"):
            GoalsApp(tool_env_allow=["OK", bad])
    # as configuration reaches it (a config file; jupyter server's command line, which keeps the
    # README's old one-value list form as one string: test_a_mistyped_tool_env_allow_… shows it)
    cfg = Config()
    cfg.GoalsApp.tool_env_allow = ["OK", '["MY_SETTING", "PROJ_*"]']
    with pytest.raises(TraitError, match=re.escape(repr('["MY_SETTING", "PROJ_*"]'))):
        GoalsApp(config=cfg)
    app = GoalsApp()
    app.parse_command_line(["--GoalsApp.tool_env_allow=MY_SETTING", "--GoalsApp.tool_env_allow=PROJ_*"])
    assert app.tool_env_allow == ["MY_SETTING", "PROJ_*"]


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


async def test_a_provider_error_that_echoes_the_key_is_stored_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider that refuses a request and echoes the key it was given: the error text is stored (the
    request's error, the work's reason) with ``[redacted: NAME]`` in place of the key."""
    key = "sk-echoed-key-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    rules = [{"when": {"purpose": "work"}, "respond": {"error": {"status": 401, "message": f"invalid api key {key}"}}}]
    rig = Rig(tmp_path, rules)
    try:
        wid = rig.send(rig.session({"mode": "bypass"}), "hello")
        assert await rig.step()
        (request,) = rig.rows("SELECT error FROM requests WHERE purpose = 'work'")
        assert "invalid api key [redacted: OPENAI_API_KEY]" in request["error"]
        assert "[redacted: OPENAI_API_KEY]" in str(rig.work(wid)["reason"])
        with sqlite3.connect(rig.state / "control.db") as raw:  # every row of every table, as stored
            tables = [t for (t,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            stored = repr([raw.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables])
        assert "invalid api key" in stored and key not in stored
    finally:
        rig.close()


def _shell_rules(command: str) -> list[dict[str, Any]]:
    return [{"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "ok"}},
            {"when": {"purpose": "work"}, "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}}]


async def test_a_cancelled_result_notes_the_redaction_on_its_item(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command stopped while its worker is gone is cancelled by the Coordinator: its result (the output
    so far) is redacted and, like a committed result, says which credentials were hidden."""
    monkeypatch.setenv("DEPLOY_TOKEN", "deploy-token-value")
    rig = Rig(tmp_path, _shell_rules("echo $DEPLOY_TOKEN; sleep 60"))
    rig.tool_env_allow = ["DEPLOY_TOKEN"]
    try:
        sid = rig.session({"mode": "bypass"})
        wid = rig.send(sid, "go")
        effect_dir = await rig.crash_after_spawn()
        deadline = time.monotonic() + 10
        while "deploy-token-value" not in "".join(p.read_text() for p in effect_dir.glob("*out*")):
            assert time.monotonic() < deadline, "the command printed nothing"
            await asyncio.sleep(0.05)
        rig.tx(lambda tx: c.apply_control(tx, c.get_work(tx, wid), "stop", None))
        await rig.recover()
        await asyncio.gather(*rig.coordinator._cancelling.values())
        [result] = [i for i in rig.items(sid) if i.kind == "tool_result"]
        assert result.state == "cancelled"
        assert "[redacted: DEPLOY_TOKEN]" in result.content and "deploy-token-value" not in result.content
        assert result.meta["redacted"] == ["DEPLOY_TOKEN"]
    finally:
        rig.close()


async def test_a_reconciled_late_receipt_notes_the_redaction_on_its_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command of an earlier boot whose receipt turns up late: the reconciliation item is redacted and
    names what it hid."""
    monkeypatch.setenv("DEPLOY_TOKEN", "deploy-token-value")
    monkeypatch.setenv("JUPYTER_GOALS_BOOT_ID", "boot-1")
    rig = Rig(tmp_path, _shell_rules("sleep 1; echo $DEPLOY_TOKEN"))
    rig.tool_env_allow = ["DEPLOY_TOKEN"]
    try:
        sid = rig.session({"mode": "bypass"})
        rig.send(sid, "go")
        effect_dir = await rig.crash_after_spawn()
        monkeypatch.setenv("JUPYTER_GOALS_BOOT_ID", "boot-2")  # the machine "restarted": the outcome is unknown
        await rig.recover()
        assert rig.rows("SELECT state FROM effects WHERE tool = 'shell'")[0]["state"] == "unknown"
        deadline = time.monotonic() + 10
        while not (effect_dir / "exit").exists():  # the old process finishes after all: a late receipt
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert (await rig.recover()).reconciled
        [late] = [i for i in rig.items(sid) if i.kind == "reconciliation"]
        assert "[redacted: DEPLOY_TOKEN]" in late.content and "deploy-token-value" not in late.content
        assert late.meta["redacted"] == ["DEPLOY_TOKEN"] and late.meta["late_receipt"] is True
    finally:
        rig.close()


async def test_a_result_that_finished_while_its_worker_was_dead_is_redacted_and_says_it_was_not_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that exits while its worker is dead: recovery commits its real result, redacted like
    every result (it was not) and noting that the command ran on and was not started again."""
    monkeypatch.setenv("DEPLOY_TOKEN", "deploy-token-value")
    rig = Rig(tmp_path, _shell_rules("echo $DEPLOY_TOKEN"))
    rig.tool_env_allow = ["DEPLOY_TOKEN"]
    try:
        sid = rig.session({"mode": "bypass"})
        rig.send(sid, "go")
        effect_dir = await rig.crash_after_spawn()
        deadline = time.monotonic() + 10
        while not (effect_dir / "exit").exists():  # the command finishes while nothing watches it
            assert time.monotonic() < deadline, "the command did not finish"
            await asyncio.sleep(0.05)
        await rig.recover()
        [result] = [i for i in rig.items(sid) if i.kind == "tool_result"]
        assert result.state == "committed" and "exit status: 0" in result.content
        assert "[redacted: DEPLOY_TOKEN]" in result.content and "deploy-token-value" not in result.content
        assert result.meta["redacted"] == ["DEPLOY_TOKEN"]
        assert "was not started again" in result.content
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


@pytest.mark.slow
def test_a_mistyped_tool_env_allow_stops_the_extension_and_the_log_names_the_entry(tmp_path: Path) -> None:
    """The README's old form, a whole list as one ``jupyter server`` flag, reaches GoalsApp as one string:
    the log names the entry and the extension does not run (traitlets rolls back every GoalsApp setting,
    so running would mean running on defaults: another state dir, model, worker count)."""
    with server_env(tmp_path, []) as env:
        server: ServerProcess = env["make"](extra=['--GoalsApp.tool_env_allow=["MY_SETTING", "PROJ_*"]',
                                                  "--GoalsApp.workers=2"]).start(wait=False)
        server.ready = "status"  # Jupyter answers; the extension must not
        server.wait_ready()
        headers = {"Authorization": f"token {server.token}"}
        assert httpx.get(f"{server.url}api/goals/health", headers=headers, timeout=5).status_code == 404
        log = server.log()
        assert "jupyter_goals is not started, its configuration is invalid" in log, log
        assert """'["MY_SETTING", "PROJ_*"]' is not an environment variable name or glob""" in log, log
        assert "--GoalsApp.tool_env_allow=MY_SETTING --GoalsApp.tool_env_allow='PROJ_*'" in log


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(var.split("=", 1) for var in raw.split("\0") if "=" in var)


@pytest.mark.slow
def test_tool_env_allow_flags_of_a_real_server_reach_a_real_shell_and_no_worker_holds_the_token(
    tmp_path: Path,
) -> None:
    """``jupyter server --GoalsApp.tool_env_allow=TEAM_* --GoalsApp.tool_env_allow=DEPLOY_TOKEN`` (the
    README's form): the chat's shell tool prints ``env``; the glob's variable and the exactly named
    secret-looking one reach it, a secret-looking name matching the glob, provider keys and the token do
    not; the worker processes keep provider keys but never hold the token in their environment."""
    rules = [{"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "ok"}},
             {"when": {"purpose": "work"}, "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "env"}}]}}]
    server_env_vars = {"TEAM_SETTING": "visible-setting", "TEAM_API_KEY": "team-api-key-value-1",
                       "DEPLOY_TOKEN": "deploy-token-value-2", "OPENAI_API_KEY": "sk-test-openai-5f0c1d2e3a4b",
                       "ANTHROPIC_API_KEY": "sk-ant-test-9e8d7c6b5a", "UNLISTED_SETTING": "unlisted-value"}
    with server_env(tmp_path, rules) as env:
        server = env["make"](extra=["--GoalsApp.tool_env_allow=TEAM_*", "--GoalsApp.tool_env_allow=DEPLOY_TOKEN"],
                             env=server_env_vars).start()
        cl = server.client()
        sid = str(cl.create_session(title="env", cwd=str(env["root"]), permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "show me the environment", client_request_id="e1")
        snap = cl.wait(sid, timeout=60)
        assert snap["work"]["phase"] == "done", snap["work"]

        effects = db_rows(env["state"], "SELECT effect_id FROM effects ORDER BY seq")
        assert len(effects) == 1
        stdout = (env["state"] / "effects" / effects[0]["effect_id"] / "stdout").read_text()
        seen = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
        assert "JG_TOOL_EFFECT" in seen and seen["PWD"] == str(env["root"])  # the real tool's env was printed
        assert seen["TEAM_SETTING"] == "visible-setting"  # through the glob flag
        assert seen["DEPLOY_TOKEN"] == "deploy-token-value-2"  # secret-looking, named exactly by the flag
        for name in ("TEAM_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "UNLISTED_SETTING", TOKEN_NAME,
                     "JUPYTER_GOALS_SERVER_URL"):
            assert name not in seen, name
        for value in (server.token, server_env_vars["OPENAI_API_KEY"], server_env_vars["ANTHROPIC_API_KEY"],
                      server_env_vars["TEAM_API_KEY"]):
            assert value not in stdout
        result = next(i for i in snap["transcript"]["items"] if i["kind"] == "tool_result")["content"]
        assert "TEAM_SETTING=visible-setting" in result
        assert "DEPLOY_TOKEN=[redacted: DEPLOY_TOKEN]" in result and "deploy-token-value-2" not in result

        workers = server.workers()
        assert workers
        for w in workers:
            worker_env = _environ(int(w["pid"]))
            assert "jupyter_goals.runtime.worker" in Path(f"/proc/{w['pid']}/cmdline").read_bytes().decode()
            assert worker_env["OPENAI_API_KEY"] == server_env_vars["OPENAI_API_KEY"]  # read at request time
            assert TOKEN_NAME not in worker_env and "JUPYTER_TOKEN" not in worker_env
            assert server.token not in Path(f"/proc/{w['pid']}/environ").read_bytes().decode(errors="replace")
            assert server.token not in Path(f"/proc/{w['pid']}/cmdline").read_bytes().decode(errors="replace")


def _ws_upgrade(port: int, path: str, token: str) -> int:
    """The status of a websocket handshake (101: connected)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path, headers={
            "Authorization": f"token {token}", "Connection": "Upgrade", "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()})
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.slow
def test_a_tool_process_holding_the_token_cannot_start_or_drive_a_jupyter_terminal_or_kernel(tmp_path: Path) -> None:
    """The token leaked to a tool by a file (as a runtime file would leak it). From inside a shell tool call
    of a bypass session, Jupyter's own process-starting routes are refused with 403: a new terminal,
    kernel or notebook session, a kernel restart, and the websockets of a terminal and a kernel the
    person opened (a command run there is a child of the server, no descendant of the tool, and could
    approve the tool's own calls). Reading stays allowed; the same requests from outside any tool
    process succeed."""
    rules = [{"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "tried"}},
             {"when": {"purpose": "work"},
              "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": f"{sys.executable} attack.py"}}]}}]
    with server_env(tmp_path, rules) as env:
        server = env["make"]().start()
        headers = {"Authorization": f"token {server.token}"}
        http_ = httpx.Client(base_url=server.url, headers=headers, timeout=60)
        try:
            # the person, from outside any tool process: a terminal and a kernel open, both websockets connect
            r = http_.post("api/terminals", json={})
            assert r.status_code == 200, r.text
            terminal = r.json()["name"]
            r = http_.post("api/kernels", json={"name": "python3"})
            assert r.status_code == 201, r.text
            kernel = r.json()["id"]
            assert _ws_upgrade(server.port, f"/terminals/websocket/{terminal}", server.token) == 101
            assert _ws_upgrade(server.port, f"/api/kernels/{kernel}/channels", server.token) == 101

            (env["root"] / "token.txt").write_text(server.token)
            attack = f"""
import base64, http.client, json, os
token = open("token.txt").read().strip()
def call(method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", {server.port}, timeout=20)
    headers = {{"Authorization": "token " + token, "Content-Type": "application/json"}}
    if path.endswith("/channels") or path.startswith("/terminals/websocket/"):
        headers.update({{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()}})
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status
for label, method, path, body in [
    ("new-terminal", "POST", "/api/terminals", {{}}),
    ("new-kernel", "POST", "/api/kernels", {{"name": "python3"}}),
    ("new-session", "POST", "/api/sessions", {{"path": "x.ipynb", "type": "notebook", "kernel": {{"name": "python3"}}}}),
    ("restart-kernel", "POST", "/api/kernels/{kernel}/restart", {{}}),
    ("terminal-websocket", "GET", "/terminals/websocket/{terminal}", None),
    ("kernel-websocket", "GET", "/api/kernels/{kernel}/channels", None),
    ("list-kernels", "GET", "/api/kernels", None),
]:
    print("RESULT", label, call(method, path, body))
"""
            (env["root"] / "attack.py").write_text(attack)
            cl = server.client()
            sid = str(cl.create_session(title="attacker", cwd=str(env["root"]),
                                        permissions={"mode": "bypass"})["session"]["session_id"])
            cl.send(sid, "attack", client_request_id="a1")
            snap = cl.wait(sid, timeout=90)
            result = next(i for i in snap["transcript"]["items"] if i["kind"] == "tool_result")["content"]
            for label in ("new-terminal", "new-kernel", "new-session", "restart-kernel", "terminal-websocket",
                          "kernel-websocket"):
                assert f"RESULT {label} 403" in result, result
            assert "RESULT list-kernels 200" in result, result
            # nothing was started: still the person's one terminal and one kernel, no notebook session
            assert [t["name"] for t in http_.get("api/terminals").json()] == [terminal]
            assert [k["id"] for k in http_.get("api/kernels").json()] == [kernel]
            assert http_.get("api/sessions").json() == []
            # the same requests from outside any tool process still succeed
            assert _ws_upgrade(server.port, f"/api/kernels/{kernel}/channels", server.token) == 101
            assert http_.post(f"api/kernels/{kernel}/restart", json={}).status_code == 200
            r = http_.post("api/sessions", json={"path": "x.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
            assert r.status_code == 201, r.text
            r = http_.post("api/terminals", json={})
            assert r.status_code == 200, r.text
        finally:
            for s in http_.get("api/sessions").json():
                http_.delete(f"api/sessions/{s['id']}")
            for k in http_.get("api/kernels").json():
                http_.delete(f"api/kernels/{k['id']}")
            for t in http_.get("api/terminals").json():
                http_.delete(f"api/terminals/{t['name']}")
            http_.close()
