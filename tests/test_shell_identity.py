"""A shell command that kills its worker at once still leaves a reconnectable process identity.

The worker here is a real child process running the real ``shell`` tool; the command is
``kill -9 $PPID`` (the worker). ``proc.json`` must be on disk before the command can run, so recovery
can tell a live process from a dead one and read its real result instead of declaring it unknown.
The worker is made slow to record the process (as on a loaded machine) so that a command that did
not wait for its identity would kill the worker first.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

WORKER = """
import asyncio, sys, time
from pathlib import Path
import jupyter_goals.runtime.tools as tools
from jupyter_goals.runtime.tools import ToolContext, shell
# a loaded machine: the worker is slow to record the process it just spawned
start_time = tools.process_start_time
tools.process_start_time = lambda pid: (time.sleep(0.3), start_time(pid))[1]
ctx = ToolContext(cwd=sys.argv[1], effects_root=Path(sys.argv[2]).parent, effect_id=Path(sys.argv[2]).name)
asyncio.run(shell(ctx, {"command": "kill -9 $PPID; echo after"}))
"""


def test_command_that_kills_its_worker_at_once_leaves_its_identity_and_real_result(tmp_path: Path) -> None:
    for i in range(3):
        effect_dir = tmp_path / f"eff{i}"
        worker = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), str(effect_dir)], timeout=60)
        assert worker.returncode == -9  # the command killed its worker
        assert (effect_dir / "proc.json").exists(), f"run {i}: the worker died before recording the process"
        deadline = time.monotonic() + 10
        while not (effect_dir / "exit").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert (effect_dir / "stdout").read_text() == "after\n"
