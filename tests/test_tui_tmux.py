"""The terminal UI in a real terminal: ``jupyter goals tui`` in an 80x24 tmux pane (``NO_COLOR``), a session
with a pending approval, the server killed -9 and started again under it; without restarting the TUI the
pane shows the recovered state and the approval, ``y`` approves, and the command runs once (counted on
disk)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("textual")

from jupyter_goals.testing import ServerFactory, full_passes, wait_for  # noqa: E402

RULES = [
    {"when": {"last_user_contains": "append", "last_tool_result_contains": "exit status: 0"},
     "respond": {"text": "Appended one line."}},
    {"when": {"last_user_contains": "append"},
     "respond": {"text": "Appending.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo line >> out.txt"}}]}},
]

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _tmux() -> None:
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):  # scripts/test installs it: its absence in CI fails, never skips
            pytest.fail("CI is set and tmux is not installed")
        pytest.skip("tmux is not installed")


class Pane:
    """One tmux server of its own (``-L``: no other tmux on the machine is touched) with one 80x24 pane."""

    def __init__(self, command: str, log: Path) -> None:
        self.socket = f"jg-tui-{uuid.uuid4().hex[:8]}"
        self.log = log
        self.tmux("new-session", "-d", "-s", "tui", "-x", "80", "-y", "24", command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True,
                              timeout=30).stdout

    def text(self) -> str:
        screen = self.tmux("capture-pane", "-p", "-t", "tui")
        self.log.write_text(screen)
        return screen

    def wait(self, *words: str, timeout: float = 60.0) -> str:
        """The pane once it shows every one of ``words`` (a frame may be captured half painted)."""
        try:
            wait_for(lambda: all(w in self.text() for w in words), timeout=timeout, what=" and ".join(words))
        except TimeoutError:
            raise AssertionError(f"the pane never showed {words!r}; it shows:\n{self.text()}") from None
        return self.text()

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "tui", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path, RULES)
    try:
        yield factory
    finally:
        factory.close()


def test_tui_in_tmux_survives_a_server_kill_and_approves_once(servers: ServerFactory, tmp_path: Path) -> None:
    server = servers.make().start()
    client = server.client()
    sid = client.create_session(title="tmux chat")["session_id"]
    client.send(sid, "append", client_request_id="tmux-1")
    wait_for(lambda: bool(client.approvals()), what="a pending approval")
    out = servers.root / "out.txt"
    command = (f"env NO_COLOR=1 {sys.executable} -m jupyter_goals.clients.tui --url {server.url} "
               f"--token {server.token} --resume {sid}")
    pane = Pane(command, tmp_path / "pane.txt")
    try:
        pane.wait("APPROVAL NEEDED", "Tool: shell", "echo line >> out.txt", "| connected")

        server.kill()
        pane.wait("server unreachable, retrying", "APPROVAL NEEDED", "> you: append")  # the screen is kept

        server.start(same_port=True)
        wait_for(lambda: bool(client.approvals()), what="the approval pending after the restart")
        # the recovered state and the approval, asked again
        pane.wait("| connected", "waiting: A tool call is waiting for your approval", "APPROVAL NEEDED", "Tool: shell")
        assert not out.exists()

        pane.keys("y")
        try:
            wait_for(lambda: not client.approvals(), timeout=10, what="the approval answered by y")
        except TimeoutError:  # the modal was drawn anew after the restart less than half a second before
            assert "Key ignored" in pane.text()
            pane.keys("y")
            wait_for(lambda: not client.approvals(), timeout=10, what="the approval answered by y")
        pane.wait("Appended one line.", "done")
        assert "APPROVAL NEEDED" not in pane.text()
        full_passes(server)  # the Coordinator looked again after the command ran: nothing ran twice
        assert out.read_text().splitlines() == ["line"]
    finally:
        print(pane.text())  # shown by pytest when the test fails: the pane as a person saw it
        pane.close()
