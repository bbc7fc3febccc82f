"""Who added each "always allow" rule of a chat, when and how (issue 32 item 1), on SQLite and PostgreSQL:
the store records a rule a permission change adds, forgets one it drops, and a rule saved before the
records were kept (control schema v11) reads unknown after the upgrade. Over REST (in-process server): the
snapshot lists each rule with its provenance, and approving a call with ``always`` adds its tool as a rule
recorded as added through the approval, in the same answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.store import control as c
from jupyter_goals.store import schema
from jupyter_goals.store.db import Database, Tx
from tests.inproc import run_next_attempt
from tests.restkit import Api, api, goals_state_dir, jp_asyncio_loop, jp_server_config  # noqa: F401
from tests.storekit import Backend

ASK = {"mode": "ask", "allow": ["shell"], "folders": [], "env_allow": []}


def test_a_permission_change_records_the_rules_it_adds_and_forgets_those_it_drops(backend: Backend) -> None:
    db = backend.open("control", migrated="control")
    sid = db.transact(lambda tx: c.create_session(tx, "t", "/tmp", "scripted:x", ASK))["session_id"]

    def rules(tx: Tx) -> list[dict[str, object]]:
        return c.allow_rules(tx, sid, c.get_session(tx, sid)["permissions"]["allow"])

    # created through the store without a person: the rule is there, who and when are unknown
    assert db.transact(rules) == [{"rule": "shell", "added_by": None, "added_at": None, "via": None}]
    path_rule = {"tool": "write_file", "path": "notes/*.md"}
    db.transact(lambda tx: c.change_permissions(tx, sid, {**ASK, "allow": ["shell", path_rule]}, None, "alice"))
    shell, path = db.transact(rules)
    assert shell == {"rule": "shell", "added_by": None, "added_at": None, "via": None}  # kept: still unknown
    assert path["rule"] == path_rule and path["added_by"] == "alice" and path["via"] == "permissions"
    assert isinstance(path["added_at"], float)

    # revoked, then added again by someone else through an approval: the new record, not the old one
    db.transact(lambda tx: c.change_permissions(tx, sid, {**ASK, "allow": ["shell"]}, None, "alice"))
    assert [r["rule"] for r in db.transact(rules)] == ["shell"]
    assert db.transact(lambda tx: tx.all("SELECT rule_key FROM allow_rules WHERE session_id = ?", (sid,))) == []
    db.transact(lambda tx: c.change_permissions(tx, sid, {**ASK, "allow": ["shell", path_rule]}, None, "bob",
                                                "approval"))
    assert db.transact(rules)[1]["added_by"] == "bob" and db.transact(rules)[1]["via"] == "approval"


def test_rules_saved_before_the_upgrade_read_unknown(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    before = [m for m in schema.CONTROL_MIGRATIONS if m[0] < 12]
    monkeypatch.setitem(schema.MIGRATIONS, "control", before)
    db = backend.open("control", migrated="control")
    sid = db.transact(lambda tx: c.create_session(tx, "old", "/tmp", "scripted:x", ASK))["session_id"]
    backend.close_all()
    monkeypatch.undo()

    db = backend.open("control", migrated="control")  # v12 adds the records table, empty
    assert db.transact(lambda tx: c.allow_rules(tx, sid, ["shell"])) == [
        {"rule": "shell", "added_by": None, "added_at": None, "via": None}]


async def test_the_snapshot_lists_each_rule_with_who_added_it_and_always_allow_records_the_approval(
        api: Api, tmp_path: Path, goals_state_dir: Path) -> None:  # noqa: F811
    root = tmp_path / "root"
    root.mkdir()
    script = tmp_path / "write.json"
    script.write_text(json.dumps({"rules": [], "default": {"tool_calls": [
        {"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}]}}))
    model = f"scripted:{script}"
    sid = await api.new_session(cwd=str(root), model=model, permissions={"mode": "ask", "allow": ["grep"]})
    snap = await api.ok("GET", f"sessions/{sid}", params={"before": "latest", "limit": 1})
    [created] = snap["allow_rules"]
    assert created["rule"] == "grep" and created["via"] == "created" and created["added_by"]
    person = created["added_by"]  # the Jupyter user of the request ("Anonymous …": a token names no one)

    patched = await api.ok("PATCH", f"sessions/{sid}", {"permissions": {"mode": "ask", "allow": ["grep", "shell"]}})
    assert [(r["rule"], r["added_by"], r["via"]) for r in patched["allow_rules"]] == [
        ("grep", person, "created"), ("shell", patched["allow_rules"][1]["added_by"], "permissions")]
    assert patched["allow_rules"][1]["added_by"].startswith("Anonymous")
    assert patched["allow_rules"][1]["added_at"] >= created["added_at"]

    # a write waits for approval; approved "always", its tool becomes a rule recorded with the decision
    await api.send(sid, "write", "w-1")
    db = Database(f"sqlite:///{goals_state_dir / 'control.db'}", inline=True)
    try:
        await run_next_attempt(db, goals_state_dir, model, str(root))
    finally:
        db.close()
    [approval] = (await api.ok("GET", "approvals", params={"state": "pending"}))["approvals"]
    status, answer = await api.call("POST", f"approvals/{approval['approval_id']}", {"decision": "deny", "always": True})
    assert status == 400, answer  # always only with approve
    decided = await api.ok("POST", f"approvals/{approval['approval_id']}", {"decision": "approve", "always": True})
    assert decided["state"] == "approved"
    snap = await api.ok("GET", f"sessions/{sid}", params={"before": "latest", "limit": 1})
    assert snap["session"]["permissions"]["allow"] == ["grep", "shell", "write_file"]
    rule: dict[str, Any] = snap["allow_rules"][2]
    assert (rule["rule"], rule["via"]) == ("write_file", "approval") and rule["added_by"].startswith("Anonymous")

    # a Job started from the chat runs under a copy of its rules: each keeps who added it and when
    job = await api.ok("POST", "jobs", {"session_id": sid, "input": "summarise", "client_request_id": "j-1"}, expect=202)
    job_snap = await api.ok("GET", f"sessions/{job['session_id']}", params={"before": "latest", "limit": 1})
    assert [(r["rule"], r["added_by"], r["added_at"], r["via"]) for r in job_snap["allow_rules"]] == [
        (r["rule"], r["added_by"], r["added_at"], "inherited") for r in snap["allow_rules"]]
    # a notebook's session records its rules as added by the person whose kernel asked for it (a token
    # request's person is a new "Anonymous …" each time)
    bound = await api.ok("PUT", "notebook-session", {"path": "n.ipynb", "permissions": {"mode": "ask", "allow": ["grep"]}},
                         expect=201)
    nb_snap = await api.ok("GET", f"sessions/{bound['session_id']}", params={"before": "latest", "limit": 1})
    [nb_rule] = nb_snap["allow_rules"]
    assert (nb_rule["rule"], nb_rule["via"]) == ("grep", "created") and nb_rule["added_by"].startswith("Anonymous")
