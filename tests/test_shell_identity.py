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


DIES_BEFORE_RECORDING = """
import asyncio, os, signal, sys
from pathlib import Path
import jupyter_goals.runtime.tools as tools
from jupyter_goals.runtime.tools import ToolContext, shell
def die(pid):  # kill -9 of the worker after the spawn, before the process is recorded in proc.json
    print(pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
tools.process_start_time = die
ctx = ToolContext(cwd=sys.argv[1], effects_root=Path(sys.argv[2]).parent, effect_id=Path(sys.argv[2]).name)
asyncio.run(shell(ctx, {"command": "echo ran >> ran.log"}))
"""


def test_a_worker_killed_between_spawning_a_command_and_recording_it_never_runs_the_command(tmp_path: Path) -> None:
    """The dead worker's end of the shell's stdin closes: the shell must not take that for the release.
    A command that ran then would be one nothing could reconnect, stop or wait for, while its call is
    ``unknown`` (the Coordinator model found it: the shell ran the command on EOF)."""
    effect_dir = tmp_path / "eff"
    worker = subprocess.run([sys.executable, "-c", DIES_BEFORE_RECORDING, str(tmp_path), str(effect_dir)],
                            capture_output=True, text=True, timeout=60)
    assert worker.returncode == -9, worker.stderr
    shell_pid = int(worker.stdout)
    deadline = time.monotonic() + 10
    while _is_shell(shell_pid):  # until the shell is gone (init reaps it): it has done all it would do
        assert time.monotonic() < deadline, "the shell still runs"
        time.sleep(0.01)
    assert not (effect_dir / "proc.json").exists()
    assert not (tmp_path / "ran.log").exists(), "the command ran although its identity was never recorded"
    assert not (effect_dir / "exit").exists()


def _is_shell(pid: int) -> bool:
    """The process ``pid`` is still a live ``sh``: not ended (a zombie has ended, whether or not whoever
    adopted it has reaped it yet), nor the pid taken by another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return False
    return "(sh)" in stat and stat[stat.rindex(")") + 2] != "Z"
