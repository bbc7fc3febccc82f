"""``%load_ext jupyter_goals``, ``%goal`` / ``%%goal`` / ``%chat`` / ``%goal_display`` in a real IPython shell and
in real kernels bound to their notebook, against a real server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import CapturedIO, capture_output
from jupyter_client.blocking import BlockingKernelClient

from jupyter_goals.clients.notebook import cards
from jupyter_goals.clients.notebook.magics import parse_requirements
from tests.kernels import Kernel, bundles, errors, kernel_env, scripted_server, text
from tests.servers import ServerProcess, db_rows, write_script

slow = pytest.mark.slow  # a real jupyter server process


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with scripted_server(tmp_path_factory.mktemp("magics"), [
        {"when": {"purpose": "work", "last_user_contains": "hello"}, "respond": {"text": "Hi from the script."}},
    ], default={"text": "still working", "delay_s": 0.2}) as s:
        yield s


@pytest.fixture
def shell(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    monkeypatch.setenv("JUPYTER_GOALS_SERVER_URL", server.url)  # what the extension sets for its kernels
    monkeypatch.setenv("JUPYTER_GOALS_TOKEN", server.token)
    ip = InteractiveShell.instance()
    ip.run_line_magic("reload_ext", "jupyter_goals")  # a fresh GoalMagics (no remembered session) per test
    yield ip


def run(ip: InteractiveShell, source: str) -> tuple[CapturedIO, Any]:
    with capture_output() as cap:
        result = ip.run_cell(source)
    return cap, result


def cap_bundles(cap: CapturedIO, mime: str) -> list[dict[str, Any]]:
    return [o.data for o in cap.outputs if mime in o.data]


@slow
def test_goal_cell_magic_creates_a_goal_with_requirements_and_displays_an_id_only_bundle(
        shell: InteractiveShell, server: ServerProcess) -> None:
    cap, result = run(shell, "%%goal --bypass Write report.md and make the check pass\n"
                             "file_exists: report.md\n"
                             "command: python check.py\n"
                             "# a comment\n"
                             "\n"
                             "the report explains the results\n")
    assert result.error_in_exec is None, result.error_in_exec
    [bundle] = cap_bundles(cap, cards.GOAL_MIME)
    ids = bundle[cards.GOAL_MIME]
    assert set(ids) == {"goal_id", "session_id"}  # ids only: the renderer reads the rest itself
    assert "Write report.md" in bundle["text/html"] and "snapshot" in bundle["text/html"]

    client = server.client()
    goal = client.goal(ids["goal_id"])
    assert goal["objective"] == "Write report.md and make the check pass"
    assert [(r["kind"], r.get("path"), r.get("command")) for r in goal["requirements"]] == [
        ("file_exists", "report.md", None), ("command", None, "python check.py"), ("semantic", None, None)]
    assert client.session(ids["session_id"])["session"]["permissions"]["mode"] == "bypass"
    client.goal_action(goal["goal_id"], "end", goal["revision"])


@slow
def test_goal_line_magics_pause_resume_status_end_and_history(shell: InteractiveShell, server: ServerProcess) -> None:
    client = server.client()
    cap, result = run(shell, "%goal --new Keep the notes tidy")
    assert result.error_in_exec is None, result.error_in_exec
    ids = cap_bundles(cap, cards.GOAL_MIME)[0][cards.GOAL_MIME]
    goal_id, session_id = ids["goal_id"], ids["session_id"]

    cap, result = run(shell, "%goal pause")
    assert result.error_in_exec is None, result.error_in_exec
    assert "Goal paused" in cap.stdout
    assert client.goal(goal_id)["state"] == "paused"

    # not allowed now (the backend's actions say so): a clear error, nothing sent
    cap, result = run(shell, "%goal pause")
    assert isinstance(result.error_in_exec, UsageError)
    assert "cannot pause" in str(result.error_in_exec)

    cap, result = run(shell, "%goal resume")
    assert result.error_in_exec is None, result.error_in_exec
    assert client.goal(goal_id)["state"] == "active"

    cap, result = run(shell, "%goal status")
    assert result.error_in_exec is None, result.error_in_exec
    assert [b[cards.GOAL_MIME]["goal_id"] for b in cap_bundles(cap, cards.GOAL_MIME)] == [goal_id]

    # a second Goal while this one runs: the server's 409 is shown, not swallowed
    cap, result = run(shell, "%goal Another objective")
    assert isinstance(result.error_in_exec, UsageError)
    assert "409" in str(result.error_in_exec)

    cap, result = run(shell, "%goal history")
    assert "No ended Goals" in cap.stdout

    cap, result = run(shell, "%goal end")
    assert result.error_in_exec is None, result.error_in_exec
    assert client.goal(goal_id)["state"] == "cancelled"

    cap, result = run(shell, "%goal history")
    assert result.error_in_exec is None, result.error_in_exec
    [record] = cap_bundles(cap, cards.HISTORY_MIME)
    assert record[cards.HISTORY_MIME] == {"record_id": client.history(session_id)[0]["record_id"],
                                          "session_id": session_id}
    assert "Keep the notes tidy" in record["text/html"]

    # the remembered session gets the next Goal
    cap, result = run(shell, "%goal Next objective")
    assert result.error_in_exec is None, result.error_in_exec
    nxt = cap_bundles(cap, cards.GOAL_MIME)[0][cards.GOAL_MIME]
    assert nxt["session_id"] == session_id and nxt["goal_id"] != goal_id
    client.goal_action(nxt["goal_id"], "end", client.goal(nxt["goal_id"])["revision"])


@slow
def test_status_shows_pending_approvals_of_the_goal_session(shell: InteractiveShell, server: ServerProcess,
                                                            tmp_path: Path) -> None:
    client = server.client()
    sid = client.create_session(title="approvals", model=write_script(tmp_path / "s.json", [], default={
        "tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}]}))["session_id"]
    cap, result = run(shell, f"%goal --session={sid} Write a.txt")
    assert result.error_in_exec is None, result.error_in_exec
    for _ in range(100):
        if client.approvals("pending"):
            break
        time.sleep(0.1)
    [approval] = [a for a in client.approvals("pending") if a["session_id"] == sid]
    cap, result = run(shell, "%goal status")
    assert result.error_in_exec is None, result.error_in_exec
    [card] = cap_bundles(cap, cards.APPROVAL_MIME)
    assert card[cards.APPROVAL_MIME] == {"approval_id": approval["approval_id"], "session_id": sid}
    run(shell, "%goal end")


def test_requirement_lines() -> None:
    assert parse_requirements("- file_digest: data.csv abc123\n* semantic: tidy: yes\nplain words") == [
        {"text": "data.csv has sha256 abc123…", "kind": "file_digest", "path": "data.csv", "sha256": "abc123"},
        {"text": "tidy: yes", "kind": "semantic"},
        {"text": "plain words", "kind": "semantic"},
    ]
    assert parse_requirements("note: this is text") == [{"text": "note: this is text", "kind": "semantic"}]
    with pytest.raises(UsageError):
        parse_requirements("file_digest: only-a-path")
    with pytest.raises(UsageError):
        parse_requirements("command:")


# ---------------------------------------------------------------------- in a real kernel, bound to its notebook


@pytest.fixture
def notebook_kernel(server: ServerProcess) -> Iterator[Kernel]:
    notebook = server.root_dir / "analysis.ipynb"
    k = Kernel(kernel_env(server, notebook), server.root_dir)
    try:
        yield k
    finally:
        k.shutdown()


@slow
def test_goal_status_after_a_kernel_restart_shows_the_goal_created_before(
        notebook_kernel: Kernel, server: ServerProcess) -> None:
    out = notebook_kernel.run("%load_ext jupyter_goals\n%goal Keep the analysis tidy")
    assert not errors(out), errors(out)
    [before] = [b[cards.GOAL_MIME] for b in bundles(out, cards.GOAL_MIME)]
    notebook_kernel.restart()  # the kernel forgets everything it held
    out = notebook_kernel.run("%load_ext jupyter_goals\n%goal status")
    assert not errors(out), errors(out)
    assert [b[cards.GOAL_MIME] for b in bundles(out, cards.GOAL_MIME)] == [before]
    rows = db_rows(server.state_dir, "SELECT path, session_id FROM notebook_sessions")
    assert {"path": "analysis.ipynb", "session_id": before["session_id"]} in rows
    out = notebook_kernel.run("%goal end")
    assert "Goal cancelled" in text(out)


@slow
def test_chat_magic_posts_to_the_notebooks_session_and_shows_an_id_only_card(
        notebook_kernel: Kernel, server: ServerProcess) -> None:
    session_id = server.client().notebook_session("analysis.ipynb")["session_id"]
    out = notebook_kernel.run("%load_ext jupyter_goals\n%chat --wait hello there")
    assert not errors(out), errors(out)
    [bundle] = bundles(out, cards.CHAT_MIME)
    assert set(bundle) == {cards.CHAT_MIME, "text/html", "text/plain"}  # ids plus the fallback snapshot only
    ids = bundle[cards.CHAT_MIME]
    assert set(ids) == {"session_id", "work_id", "message_id"} and ids["session_id"] == session_id
    assert "Hi from the script." in bundle["text/html"] and "hello there" in bundle["text/html"]
    items = server.client().session(session_id)["transcript"]["items"]
    assert [i["content"] for i in items if i["work_id"] == ids["work_id"] and i["kind"] == "assistant"] == [
        "Hi from the script."]

    out = notebook_kernel.run("%chat hello again")  # without --wait: the card at once, the answer live
    [bundle] = bundles(out, cards.CHAT_MIME)
    assert "waiting for the answer" in bundle["text/html"] and bundle[cards.CHAT_MIME]["session_id"] == session_id


@slow
def test_goal_display_widget_shows_ipywidgets_instead_of_mime_cards(notebook_kernel: Kernel) -> None:
    out = notebook_kernel.run("%load_ext jupyter_goals\n%goal_display widget\n%goal Count the rows")
    assert not errors(out), errors(out)
    assert not bundles(out, cards.GOAL_MIME)
    assert bundles(out, "application/vnd.jupyter.widget-view+json")
    out = notebook_kernel.run("%chat --wait hello widgets")
    assert not errors(out) and not bundles(out, cards.CHAT_MIME)
    assert bundles(out, "application/vnd.jupyter.widget-view+json")
    out = notebook_kernel.run("%goal_display mime\n%goal status\n%goal end")
    assert bundles(out, cards.GOAL_MIME)
    out = notebook_kernel.run("%goal_display sideways")
    assert "UsageError: usage: %goal_display mime|widget" in text(out)  # IPython prints usage errors


class JupyterKernel(Kernel):
    """A kernel the server started for a notebook (``POST /api/sessions``), driven through its
    connection file, restarted through the server's REST API, as JupyterLab does."""

    def __init__(self, server: ServerProcess, path: str) -> None:  # noqa: D107 - no KernelManager of ours
        self.server = server
        self.http = httpx.Client(base_url=server.url, headers={"Authorization": f"token {server.token}"}, timeout=60)
        r = self.http.post("api/sessions", json={"path": path, "name": path, "type": "notebook",
                                                 "kernel": {"name": "python3"}})
        assert r.status_code == 201, r.text
        self.session = r.json()
        self.kernel_id = self.session["kernel"]["id"]
        self._connect()

    def _connect(self) -> None:
        runtime = self.server.state_dir.parent / "jupyter_runtime"
        self.kc = BlockingKernelClient(connection_file=str(runtime / f"kernel-{self.kernel_id}.json"))
        self.kc.load_connection_file()
        self.kc.start_channels(hb=False)  # a heartbeat not seen yet would count as a dead kernel
        self.kc.wait_for_ready(timeout=60)

    def rename(self, new_path: str) -> None:
        """JupyterLab's rename: the file through the contents API, then the session's path."""
        old = self.session["path"]
        assert self.http.patch(f"api/contents/{old}", json={"path": new_path}).status_code == 200
        r = self.http.patch(f"api/sessions/{self.session['id']}", json={"path": new_path, "name": new_path})
        assert r.status_code == 200, r.text

    def restart(self) -> None:
        self.kc.stop_channels()
        assert self.http.post(f"api/kernels/{self.kernel_id}/restart").status_code == 200
        self._connect()

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.http.delete(f"api/sessions/{self.session['id']}")
        self.http.close()


@slow
def test_a_kernel_started_by_jupyter_keeps_its_goal_after_a_rename_and_a_restart(server: ServerProcess) -> None:
    (server.root_dir / "draft.ipynb").write_text(json.dumps(
        {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    kernel = JupyterKernel(server, "draft.ipynb")
    try:
        out = kernel.run("%load_ext jupyter_goals\n%goal Keep the draft tidy")
        assert not errors(out), errors(out)
        [before] = [b[cards.GOAL_MIME] for b in bundles(out, cards.GOAL_MIME)]
        kernel.rename("final.ipynb")
        # the restarted kernel still has JPY_SESSION_NAME=<root>/draft.ipynb; the server's sessions say final.ipynb
        kernel.restart()
        out = kernel.run("%load_ext jupyter_goals\n%goal status")
        assert not errors(out), errors(out)
        assert [b[cards.GOAL_MIME] for b in bundles(out, cards.GOAL_MIME)] == [before]
        rows = db_rows(server.state_dir, "SELECT path FROM notebook_sessions WHERE session_id = ?",
                       (before["session_id"],))
        assert rows == [{"path": "final.ipynb"}]
        kernel.run("%goal end")
    finally:
        kernel.shutdown()
