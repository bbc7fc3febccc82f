"""A detached shell command's process group is found by its identity (pid, start time, boot id), so a
cancel after a restart never signals a process that merely reuses the pid (issue 15)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_goals.host.effect_files import cancel_shell, group_members
from jupyter_goals.identity import boot_id, process_start_time


@pytest.fixture
def leader() -> Iterator[subprocess.Popen[bytes]]:
    """A live process leading its own group, as a detached shell command does."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def write_proc(effect_dir: Path, pid: int, start_time: int | None) -> Path:
    effect_dir.mkdir()
    (effect_dir / "proc.json").write_text(json.dumps({"pid": pid, "start_time": start_time, "boot_id": boot_id()}))
    return effect_dir


async def test_the_group_of_the_recorded_shell_is_found_and_cancelled(
    tmp_path: Path, leader: subprocess.Popen[bytes]
) -> None:
    effect_dir = write_proc(tmp_path / "e1", leader.pid, process_start_time(leader.pid))
    assert group_members(effect_dir) == [leader.pid]
    assert await cancel_shell(effect_dir, 2.0) == "SIGTERM"
    assert leader.wait(timeout=5) == -15


async def test_a_process_that_reuses_the_pid_with_another_start_time_is_never_signalled(
    tmp_path: Path, leader: subprocess.Popen[bytes]
) -> None:
    started = process_start_time(leader.pid)
    assert started is not None
    effect_dir = write_proc(tmp_path / "e2", leader.pid, started - 1)  # the recorded shell started earlier
    assert group_members(effect_dir) == []
    assert await cancel_shell(effect_dir, 0.1) is None
    assert leader.poll() is None and process_start_time(leader.pid) == started  # still running, untouched
    os.kill(leader.pid, 0)
