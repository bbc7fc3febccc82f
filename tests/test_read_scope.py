"""Built-in reads stay in the chat's folders in ``ask`` mode (issue 27 item 6; permissions.py rule 2).

A ``read_file`` / ``grep`` / ``glob`` / ``list_dir`` whose resolved path leaves the chat's folder (and
the folders added to the session), through ``..`` or a symlink, waits for an approval that names the
resolved path; places that hold credentials ask even inside the folder or with the tool allowed by
name; ``bypass`` keeps its meaning. Pure rules first, then the walks, then turns run in this process
(``tests/inproc.py``). The real-server version is ``test_read_scope_server.py``.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_goals.models import Capability, GoalState, Permissions
from jupyter_goals.recovery.facts import scope_lost
from jupyter_goals.runtime.permissions import CallFacts, check_call, glob_base, read_fence, secret_places
from jupyter_goals.runtime.tools import BUILTINS, ToolContext, ToolRegistry, path_reader
from jupyter_goals.store import control as c
from tests.inproc import Rig, acceptance, goal, new_goal

UNKNOWN = [{"call_id": "req_1:0", "tool": "shell", "arguments": {"command": "rm -rf build"}}]
ASK: dict[str, Any] = {"mode": "ask"}


def read(tool: str = "read_file", **arguments: Any) -> CallFacts:
    """A call of the built-in read ``tool``, recognised by its implementation identity."""
    return CallFacts(tool=tool, arguments=arguments, capability=Capability.READ_ONLY, trusted_probe=True, reader=tool)


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """``chat/`` (the chat's folder) with a file, a symlink to a file outside and one to a folder outside."""
    chat, outside = tmp_path / "chat", tmp_path / "outside"
    (chat / "sub").mkdir(parents=True)
    outside.mkdir()
    (chat / "notes.txt").write_text("inside")
    (outside / "secret-notes.txt").write_text("outside")
    os.symlink(outside / "secret-notes.txt", chat / "link.txt")
    os.symlink(outside, chat / "linkdir")
    return {"chat": chat, "outside": outside, "tmp": tmp_path}


# --------------------------------------------------------------------------- the pure rule


def test_a_read_inside_the_folder_runs_at_once(tree: dict[str, Path]) -> None:
    cwd = str(tree["chat"])
    for call in (read(path="notes.txt"), read(path="sub/../notes.txt"), read(path=f"{cwd}/notes.txt"), read(),
                 read("list_dir"), read("list_dir", path="sub"), read("grep", pattern="x"), read("glob", pattern="**/*.txt")):
        assert check_call(call, ASK, cwd, []).run, call


def test_a_read_outside_the_folder_asks_and_names_the_resolved_path(tree: dict[str, Path]) -> None:
    cwd, outside = str(tree["chat"]), str(tree["outside"].resolve())
    for call, named in ((read(path=f"{outside}/secret-notes.txt"), f"{outside}/secret-notes.txt"),
                        (read(path="../outside/secret-notes.txt"), f"{outside}/secret-notes.txt"),
                        (read(path="sub/../../outside/x"), f"{outside}/x"),
                        (read("list_dir", path=".."), str(tree["tmp"].resolve())),
                        (read("grep", pattern="x", path=outside), outside),
                        (read("glob", pattern=f"{outside}/*.txt"), outside),
                        (read("glob", pattern="../outside/**/*"), outside)):
        verdict = check_call(call, ASK, cwd, [])
        assert not verdict.run and not verdict.restricted, call
        assert f"would read {named}, outside this chat's folder {tree['chat'].resolve()}" in verdict.reason, verdict.reason


def test_a_symlink_inside_the_folder_that_leaves_it_counts_as_outside(tree: dict[str, Path]) -> None:
    cwd, outside = str(tree["chat"]), tree["outside"].resolve()
    for call, named in ((read(path="link.txt"), outside / "secret-notes.txt"),
                        (read(path="linkdir/secret-notes.txt"), outside / "secret-notes.txt"),
                        (read("list_dir", path="linkdir"), outside), (read("grep", pattern="o", path="linkdir"), outside),
                        (read("glob", pattern="linkdir/*"), outside)):
        verdict = check_call(call, ASK, cwd, [])
        assert not verdict.run and f"would read {named}," in verdict.reason, (call, verdict.reason)


def test_folders_added_to_the_session_open_reads_there(tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = str(tree["chat"])
    call = read(path=str(tree["outside"] / "secret-notes.txt"))
    for folders in (["../outside"], [str(tree["outside"])], ["~/outside"]):
        monkeypatch.setenv("HOME", str(tree["tmp"]))
        assert check_call(call, {"mode": "ask", "folders": folders}, cwd, []).run, folders
    verdict = check_call(read(path="/"), {"mode": "ask", "folders": ["../outside"]}, cwd, [])
    assert not verdict.run and f"or the folders added to it ({tree['outside'].resolve()})" in verdict.reason


def test_places_that_hold_credentials_ask_even_inside_the_folder_or_with_the_tool_allowed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "project").mkdir()
    secret = secret_places(tmp_path / "state", home=str(home))
    allowed = {"mode": "ask", "allow": ["read_file", "grep", "list_dir"]}
    cwd = str(home)  # a chat opened in the home directory: ~/.ssh is inside its folder
    for call, place in ((read(path=".ssh/id_rsa"), f"{home.resolve()}/.ssh"),
                        (read("grep", pattern="KEY", path=".ssh"), f"{home.resolve()}/.ssh"),
                        (read("list_dir", path=".ssh"), f"{home.resolve()}/.ssh"),
                        (read(path=str(tmp_path / "state" / "control.db")), str((tmp_path / "state").resolve())),
                        (read(path="project/.env"), "a .env file"), (read(path="project/.env.local"), "a .env file"),
                        (read("grep", pattern="x", path="project/.env"), "a .env file")):
        for permissions in (ASK, allowed):
            verdict = check_call(call, permissions, cwd, [], secret)
            assert not verdict.run, (call, permissions)
            assert f"in {place}, which holds credentials" in verdict.reason, verdict.reason
    os.symlink(home / "project" / ".env", home / "project" / "settings.txt")
    assert not check_call(read(path="project/settings.txt"), allowed, cwd, [], secret).run  # resolves to a .env
    # a bare tool name opens reads outside the folder, not the places holding credentials
    outside = read(path=str(tmp_path / "elsewhere.txt"))
    assert check_call(outside, {"mode": "ask", "allow": ["read_file"]}, str(home / "project"), [], secret).run
    assert not check_call(outside, {"mode": "ask", "allow": ["grep"]}, str(home / "project"), [], secret).run
    # listing names is not reading a .env file: a virtualenv called .env can be listed
    assert check_call(read("list_dir", path="project/.env"), ASK, cwd, [], secret).run


def test_an_explicit_path_rule_is_the_persons_choice_for_that_path(tmp_path: Path) -> None:
    home = tmp_path / "home"
    secret = secret_places(tmp_path / "state", home=str(home))
    cwd = str(tmp_path / "chat")
    ssh = read(path=str(home / ".ssh" / "config"))
    assert check_call(ssh, {"mode": "ask", "allow": [{"tool": "read_file", "path": str(home / ".ssh" / "*")}]}, cwd, [], secret).run
    assert not check_call(ssh, {"mode": "ask", "allow": [{"tool": "grep", "path": str(home / ".ssh" / "*")}]}, cwd, [], secret).run
    env = read(path=".env")
    assert check_call(env, {"mode": "ask", "allow": [{"tool": "read_file", "path": ".env"}]}, cwd, [], secret).run
    assert check_call(read("glob", pattern="../data/*.csv"), {"mode": "ask", "allow": [{"tool": "glob", "path": "../data"}]},
                      cwd, [], secret).run


def test_bypass_keeps_its_meaning(tmp_path: Path) -> None:
    secret = secret_places(tmp_path / "state", home=str(tmp_path))
    for call in (read(path="/etc/hostname"), read(path=str(tmp_path / ".ssh" / "id_rsa")), read(path=".env")):
        assert check_call(call, {"mode": "bypass"}, str(tmp_path / "chat"), [], secret).run
        assert check_call(call, {"mode": "bypass"}, str(tmp_path / "chat"), UNKNOWN, secret).run


def test_in_a_restricted_turn_a_read_outside_asks_one_approval_for_both_reasons(tmp_path: Path) -> None:
    cwd = str(tmp_path / "chat")
    assert check_call(read(path="notes.txt"), ASK, cwd, UNKNOWN).run  # built-in reads in the folder still run
    verdict = check_call(read(path="/etc/hostname"), ASK, cwd, UNKNOWN)
    assert not verdict.run
    assert "would read /etc/hostname, outside this chat's folder" in verdict.reason
    assert "req_1:0" in verdict.reason  # the approval asked is bound to the unknown-effect set too
    # the restriction itself is unchanged: no allow rule waives it for other calls
    write = CallFacts(tool="write_file", arguments={"path": "a"}, capability=Capability.IDEMPOTENT, trusted_probe=False)
    assert check_call(write, {"mode": "ask", "allow": ["write_file"]}, cwd, UNKNOWN).restricted


def test_only_the_builtin_read_functions_are_recognised_by_identity() -> None:
    for spec in BUILTINS:
        expected = spec.name if spec.name in ("read_file", "grep", "glob", "list_dir") else None
        assert path_reader(spec.identity, spec.digest) == expected, spec.name
    builtin = ToolRegistry().get("read_file")
    assert builtin is not None and path_reader(builtin.identity, "0" * 16) is None  # a changed implementation
    # a call of another name running the built-in read function is checked like read_file
    renamed = CallFacts(tool="peek", arguments={"path": "/etc/hostname"}, capability=Capability.READ_ONLY, trusted_probe=True,
                        reader=path_reader(builtin.identity, builtin.digest))
    assert not check_call(renamed, ASK, "/srv/chat", []).run


@pytest.mark.parametrize(("pattern", "base"), [
    ("*", "."), ("**/*.py", "."), ("src/*.py", "src"), ("/etc/*", "/etc"), ("/*", "/"), ("../x/[ab]", "../x"),
    ("notes.txt", "notes.txt"), ("", "."),
])
def test_a_glob_lists_from_its_components_before_the_first_wildcard(pattern: str, base: str) -> None:
    assert glob_base(pattern) == base


def test_secret_places_come_from_home_jupyter_paths_and_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "cfg"))
    places = secret_places(tmp_path / "state", home=str(tmp_path / "h"))
    for expected in ("rt", "data", "cfg", "state", "h/.ssh", "h/.aws", "h/.config/gcloud"):
        assert str((tmp_path / expected).resolve()) in places, expected


SAFE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
CHAT = os.path.join(os.path.realpath(tempfile.gettempdir()), f"jg-scope-{uuid.uuid4().hex}", "a", "b", "chat")  # never created


@settings(max_examples=200, deadline=None)
@given(st.lists(SAFE, min_size=0, max_size=6), st.sampled_from(["read_file", "list_dir", "grep", "glob"]))
def test_any_path_under_the_folder_without_symlinks_runs(parts: list[str], tool: str) -> None:
    name = "pattern" if tool == "glob" else "path"
    for given_path in ("/".join(parts), os.path.join(CHAT, *parts)):
        assert check_call(read(tool, **{name: given_path}), ASK, CHAT, UNKNOWN).run, given_path


@settings(max_examples=200, deadline=None)
@given(st.lists(SAFE, min_size=0, max_size=3), st.integers(min_value=0, max_value=3), st.lists(SAFE, min_size=1, max_size=3),
       st.sampled_from(["read_file", "list_dir", "grep", "glob"]))
def test_any_dotdot_escape_asks_and_names_where_it_leads(down: list[str], extra: int, then: list[str], tool: str) -> None:
    ups = len(down) + 1 + extra  # one more '..' than the way down: out of the folder
    given_path = "/".join([*down, *[".."] * ups, *then])
    verdict = check_call(read(tool, **{"pattern" if tool == "glob" else "path": given_path}), ASK, CHAT, [])
    assert not verdict.run
    assert f"would read {os.path.normpath(os.path.join(CHAT, given_path))}, outside" in verdict.reason


# --------------------------------------------------------------------------- walks


async def run_tool(name: str, cwd: Path, args: dict[str, Any], permissions: dict[str, Any], secret: tuple[str, ...] = ()) -> str:
    spec = ToolRegistry().get(name)
    assert spec is not None
    facts = read(name, **args)
    ctx = ToolContext(cwd=str(cwd), effects_root=cwd / "effects", effect_id="e", fence=read_fence(facts, permissions, str(cwd), secret))
    return (await spec.impl(ctx, args)).content


async def test_a_walk_inside_the_folder_never_follows_a_symlink_out_nor_opens_a_env_file(tree: dict[str, Path]) -> None:
    chat = tree["chat"]
    (chat / ".env").write_text("TOKEN=outside-the-walk")
    (chat / "sub" / "keep.txt").write_text("outside? no, inside")
    found = await run_tool("grep", chat, {"pattern": "outside"}, ASK)
    assert "inside" in found and "keep.txt" in found
    assert "secret-notes" not in found and "link.txt:" not in found and "TOKEN" not in found
    assert "[2 files skipped" in found
    names = await run_tool("glob", chat, {"pattern": "**/*.txt"}, ASK)
    assert "sub/keep.txt" in names and "linkdir/secret-notes.txt" not in names and "[1 matches skipped" in names
    back_out = await run_tool("glob", chat, {"pattern": "*/../../outside/*"}, ASK)  # lists from '.', then leaves
    assert "secret-notes" not in back_out and "matches skipped" in back_out
    # bypass keeps its meaning: the same walks see everything
    assert "TOKEN" in await run_tool("grep", chat, {"pattern": "outside"}, {"mode": "bypass"})
    assert "linkdir/secret-notes.txt" in await run_tool("glob", chat, {"pattern": "**/*.txt"}, {"mode": "bypass"})


async def test_a_walk_of_an_approved_root_reads_it_but_not_the_credentials_under_it(tmp_path: Path) -> None:
    home, chat = tmp_path / "home", tmp_path / "home" / "chat"
    (home / ".ssh").mkdir(parents=True)
    chat.mkdir()
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    (home / "todo.txt").write_text("KEY points")
    secret = secret_places(tmp_path / "state", home=str(home))
    found = await run_tool("grep", chat, {"pattern": "KEY", "path": str(home)}, ASK, secret)  # the root was approved
    assert "todo.txt" in found and "PRIVATE" not in found
    # the approved root is itself where credentials are kept: its own files are read
    assert "PRIVATE" in await run_tool("grep", chat, {"pattern": "KEY", "path": str(home / ".ssh")}, ASK, secret)


# --------------------------------------------------------------------------- the model of the permissions


def test_folders_are_validated_kept_and_a_removed_folder_counts_as_revoked() -> None:
    perms = Permissions.model_validate({"mode": "ask", "folders": ["../data", "/srv/shared", "~/notes"]})
    assert perms.model_dump()["folders"] == ["../data", "/srv/shared", "~/notes"]
    for bad in ([""], ["a\x00b"], "data", [1], ["x"] * 65):
        with pytest.raises(ValueError):
            Permissions.model_validate({"folders": bad})
    assert scope_lost({"mode": "ask", "folders": ["../data"]}, {"mode": "ask"}) == ["reads in the folder ../data"]
    assert scope_lost({"mode": "ask"}, {"mode": "ask", "folders": ["../data"]}) == []


# --------------------------------------------------------------------------- turns


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def rules(tmp_path: Path) -> list[dict[str, Any]]:
    outside = tmp_path / "outside"
    return [
        {"when": {"purpose": "acceptance", "goal_objective_contains": "Peek", "last_tool_result_contains": "OUTSIDE-CONTENT"},
         "respond": {"verdicts": [{"requirement_id": "r1", "verdict": "met", "evidence": "read it"}]}},
        {"when": {"purpose": "acceptance", "goal_objective_contains": "Peek", "last_tool_result_contains": "not read"},
         "respond": {"verdicts": [{"requirement_id": "r1", "verdict": "unmet", "evidence": "the read was refused"}]}},
        {"when": {"purpose": "acceptance", "goal_objective_contains": "Peek"},
         "respond": call("read_file", path=str(outside / "notes.txt"))},
        {"when": {"last_user_contains": "Peek", "last_tool_result_contains": "candidate submitted"}, "respond": {"text": "ok"}},
        {"when": {"last_user_contains": "Peek"}, "respond": call("update_goal", candidate=True)},
        {"when": {"last_user_contains": "longread", "tool_result_unknown": True},
         "respond": call("read_file", path=str(outside / "notes.txt"))},
        {"when": {"last_tool_result_contains": ""}, "respond": {"text": "Done."}},  # any result after the request
        {"when": {"last_user_contains": "longread"}, "respond": call("shell", command="sleep 30; echo x >> f.txt")},
        {"when": {"last_user_contains": "read-outside"}, "respond": call("read_file", path=str(outside / "notes.txt"))},
        {"when": {"last_user_contains": "read-dotdot"}, "respond": call("read_file", path="sub/../../outside/notes.txt")},
        {"when": {"last_user_contains": "read-inside"}, "respond": call("read_file", path="inside.txt")},
        {"when": {"last_user_contains": "read-link"}, "respond": call("read_file", path="link.txt")},
        {"when": {"last_user_contains": "read-env"}, "respond": call("read_file", path=".env")},
        {"when": {"last_user_contains": "grep-all"}, "respond": call("grep", pattern="CONTENT")},
    ]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, rules(tmp_path))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "notes.txt").write_text("OUTSIDE-CONTENT")
    (r.root / "sub").mkdir()
    (r.root / "inside.txt").write_text("INSIDE-CONTENT")
    (r.root / ".env").write_text("API_KEY=ENV-CONTENT")
    os.symlink(tmp_path / "outside" / "notes.txt", r.root / "link.txt")
    yield r
    r.close()


def transcript(rig: Rig, sid: str) -> str:
    return "\n".join(str(i.content) for i in rig.items(sid))


async def test_ask_mode_read_outside_waits_for_an_approval_naming_the_path_inside_runs_at_once(rig: Rig) -> None:
    target = str((rig.root.parent / "outside" / "notes.txt").resolve())
    sid = rig.session({"mode": "ask"})
    rig.send(sid, "read-inside")
    await rig.run_until_quiet()
    assert "INSIDE-CONTENT" in transcript(rig, sid) and rig.approvals() == []
    for text in ("read-outside", "read-dotdot", "read-link"):
        work_id = rig.send(sid, text)
        await rig.run_until_quiet()
        assert rig.work(work_id)["reason_code"] == "awaiting_approval", text
        [pending] = rig.approvals("pending")
        assert pending["tool"] == "read_file" and f"would read {target}, outside this chat's folder" in pending["reason"]
        assert "OUTSIDE-CONTENT" not in transcript(rig, sid)
        rig.decide(pending["approval_id"], "deny")
        await rig.run_until_quiet()
        assert rig.work(work_id)["phase"] == "done" and "OUTSIDE-CONTENT" not in transcript(rig, sid)
    work_id = rig.send(sid, "read-outside")
    await rig.run_until_quiet()
    [pending] = rig.approvals("pending")
    rig.decide(pending["approval_id"], "approve")
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done" and "OUTSIDE-CONTENT" in transcript(rig, sid)


async def test_a_env_file_asks_even_inside_the_folder_with_read_file_allowed_and_a_grep_skips_it(rig: Rig) -> None:
    sid = rig.session({"mode": "ask", "allow": ["read_file", "grep"]})
    work_id = rig.send(sid, "read-env")
    await rig.run_until_quiet()
    [pending] = rig.approvals("pending")
    assert f"would read {(rig.root / '.env').resolve()}, in a .env file, which holds credentials" in pending["reason"]
    rig.decide(pending["approval_id"], "deny")
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done"
    rig.send(sid, "grep-all")
    await rig.run_until_quiet()
    text = transcript(rig, sid)
    assert "INSIDE-CONTENT" in text and "ENV-CONTENT" not in text and "OUTSIDE-CONTENT" not in text
    assert len(rig.approvals()) == 1  # the grep of the folder itself ran at once


async def test_adding_the_folder_to_the_session_lets_the_waiting_read_run(rig: Rig) -> None:
    sid = rig.session({"mode": "ask"})
    work_id = rig.send(sid, "read-outside")
    await rig.run_until_quiet()
    [pending] = rig.approvals("pending")
    rig.tx(lambda tx: c.change_permissions(tx, sid, {"mode": "ask", "allow": [], "folders": ["../outside"]}, None))
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done" and "OUTSIDE-CONTENT" in transcript(rig, sid)
    assert [a["state"] for a in rig.approvals()] == ["invalidated"]
    assert pending["approval_id"] == rig.approvals()[0]["approval_id"]


async def test_after_unknown_effects_a_read_outside_needs_one_approval_bound_to_the_unknown_set(rig: Rig) -> None:
    sid = rig.session({"mode": "ask", "allow": ["shell"]})
    work_id = rig.send(sid, "longread")
    effect_dir = await rig.crash_after_spawn()
    await rig.kill_command(effect_dir)
    await rig.recover()
    [shell] = rig.rows("SELECT call_id, state FROM effects WHERE tool = 'shell'")
    assert shell["state"] == "unknown"
    await rig.run_until_quiet()
    assert rig.work(work_id)["reason_code"] == "awaiting_approval"
    [pending] = rig.approvals("pending")
    assert pending["tool"] == "read_file" and [u["call_id"] for u in pending["unknown_effects"]] == [shell["call_id"]]
    target = str((rig.root.parent / "outside" / "notes.txt").resolve())
    assert f"would read {target}, outside" in pending["reason"] and shell["call_id"] in pending["reason"]
    assert "OUTSIDE-CONTENT" not in transcript(rig, sid)
    rig.decide(pending["approval_id"], "approve")
    await rig.run_until_quiet()
    assert rig.work(work_id)["phase"] == "done" and "OUTSIDE-CONTENT" in transcript(rig, sid)
    assert not (rig.root / "f.txt").exists()  # the unknown write was never repeated


async def test_the_acceptance_review_cannot_read_outside_the_folder_in_ask_mode(tmp_path: Path) -> None:
    outcomes = {}
    for mode in ("ask", "bypass"):
        base = tmp_path / mode
        base.mkdir()
        rig = Rig(base, rules(base))
        try:
            (base / "outside").mkdir()
            (base / "outside" / "notes.txt").write_text("OUTSIDE-CONTENT")
            _, gl = new_goal(rig, "Peek at the notes", [{"id": "r1", "text": "the notes were read"}], {"mode": mode})
            for _ in range(20):
                if acceptance(rig, gl["goal_id"]) or not await rig.step():
                    break
            [result] = acceptance(rig, gl["goal_id"])[:1]
            outcomes[mode] = (json.loads(result["verdicts"])[0]["verdict"], goal(rig, gl["goal_id"])["state"])
        finally:
            rig.close()
    assert outcomes == {"ask": ("unmet", GoalState.ACTIVE), "bypass": ("met", GoalState.ACHIEVED)}
