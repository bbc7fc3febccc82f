"""``jupyter goals demo`` (DESIGN §12 CLI): the offline crash demonstration really kills and recovers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_kills_the_server_mid_command_and_the_chat_finishes_with_the_command_run_once(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "jupyter_goals.clients.cli", "demo", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "kill -9 of the server" in run.stdout and "phase done" in run.stdout
    assert "[interruption]" in run.stdout  # the transcript shows the crash
    # the answer after the crash says what happened (not "kill the server next time")
    assert "kept running while its worker stopped" in run.stdout and "next time" not in run.stdout, run.stdout
    assert len((tmp_path / "workspace" / "slow-demo.log").read_text().splitlines()) == 1
