"""A detached shell command's files in ``state_dir/effects/<effect_id>/`` (``proc.json``: pid, start
time and boot id; ``stdout``, ``stderr``, ``exit``): its real result, whether the same process still runs,
and cancelling its process group. The turn loop, which starts these commands (``runtime/tools.py``), and
the Coordinator, which reconnects or cancels them after a crash, both read them here."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from jupyter_goals.identity import boot_id, process_start_time

MAX_OUTPUT = 20000


def clip(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT] + f"\n[… {len(text) - MAX_OUTPUT} more characters]"


def shell_result_text(effect_dir: Path) -> str | None:
    """The real result of a finished shell command, from its files; None while it has not exited."""
    exit_file = effect_dir / "exit"
    if not exit_file.exists():
        return None
    code = exit_file.read_text().strip()
    out = (effect_dir / "stdout").read_text(errors="replace") if (effect_dir / "stdout").exists() else ""
    err = (effect_dir / "stderr").read_text(errors="replace") if (effect_dir / "stderr").exists() else ""
    return clip(f"exit status: {code}\nstdout:\n{out}\nstderr:\n{err}")


#: appended to the real result of a command that ran on while the worker watching it died or stopped: the model
#: (and the person) learn what happened, and that the command was not started again
RECOVERED_NOTE = ("note: the worker running this command stopped while it ran (a crash or a restart); the command "
                  "was not started again: this is its one real result.")


def recovered_result_text(text: str) -> str:
    """The real result of a command reconnected (or read) after its worker stopped, with ``RECOVERED_NOTE``."""
    return f"{text}\n{RECOVERED_NOTE}"


def shell_process(effect_dir: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((effect_dir / "proc.json").read_text()))
    except (OSError, ValueError):
        return None


def shell_alive(effect_dir: Path) -> bool:
    """True when the same process (pid and start time, this boot) that was spawned still runs."""
    proc = shell_process(effect_dir)
    if proc is None or proc.get("boot_id", boot_id()) != boot_id():
        return False  # a process of an earlier boot is dead, whatever now runs under its pid
    return process_start_time(int(proc["pid"])) == proc.get("start_time")


async def wait_shell(effect_dir: Path, poll_s: float = 0.05) -> str | None:
    """Wait for a (possibly foreign) shell process; the real result, or None if it died without one."""
    while True:  # noqa: ASYNC110 - a foreign process has no event to await; poll its files
        text = shell_result_text(effect_dir)
        if text is not None:
            return text
        if not shell_alive(effect_dir):
            await asyncio.sleep(0.2)  # the exit file is renamed into place just before the process ends
            return shell_result_text(effect_dir)
        await asyncio.sleep(poll_s)


def kill_shell(effect_dir: Path) -> bool:
    proc = shell_process(effect_dir)
    if proc is None or not shell_alive(effect_dir):
        return False
    try:
        os.killpg(int(proc["pid"]), signal.SIGKILL)
    except OSError:
        return False
    return True


def group_members(effect_dir: Path) -> list[int]:
    """Live (non-zombie) processes of the shell's process group, this boot only. The group is found by
    the shell's identity: its pid (the group id) and start time. While any member lives the kernel keeps
    the group id from being reused; once the whole group is gone, a new process with that pid (another
    start time) is not ours and is never signalled."""
    proc = shell_process(effect_dir)
    if proc is None or proc.get("boot_id", boot_id()) != boot_id():
        return []
    pgid = int(proc["pid"])
    leader_started = process_start_time(pgid)
    if leader_started is not None and leader_started != proc.get("start_time"):
        return []  # the pid was reused by a process that is not the shell we started
    return live_in_group(pgid)


def live_in_group(pgid: int) -> list[int]:
    """The live (non-zombie) processes whose process group is ``pgid``, read from /proc (blocking)."""
    members: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


async def cancel_shell(effect_dir: Path, grace_s: float) -> str | None:
    """SIGTERM the shell's whole process group, SIGKILL what is left after ``grace_s``; the name of the
    last signal sent, or None when no process of the group was alive. Harmless to repeat."""
    from jupyter_goals.faults import crash_point

    proc = shell_process(effect_dir)
    if proc is None or not await asyncio.to_thread(group_members, effect_dir):
        return None
    crash_point("tool.before_cancel_kill")
    pgid = int(proc["pid"])
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except OSError:
            return sig.name
        deadline = loop.time() + grace_s
        # a process group's end has no awaitable: poll /proc (off the loop)
        while await asyncio.to_thread(group_members, effect_dir) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if not await asyncio.to_thread(group_members, effect_dir):
            return sig.name
    return signal.SIGKILL.name


def cancelled_result_text(effect_dir: Path, cause: str, signalled: str | None = None) -> str:
    """What the model and the person read for a cancelled call: who cancelled it, its real exit status
    (the command's, when it wrote one, else the signal that ended the shell) and the output so far."""
    def read(name: str) -> str:
        try:
            return (effect_dir / name).read_text(errors="replace")
        except OSError:
            return ""

    code = read("exit").strip()
    if not code:
        code = f"none (killed by {signalled})" if signalled else "none (the process had already ended)"
    who = "stopped the work" if cause == "stop" else "cancelled this call"
    return clip(f"cancelled: the person {who} while the command ran; it was terminated.\nexit status: {code}\n"
                 f"stdout (so far):\n{read('stdout')}\nstderr (so far):\n{read('stderr')}")
