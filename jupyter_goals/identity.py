"""Host and process identity (DESIGN §3).

``host_name`` is the machine (env ``JUPYTER_GOALS_HOST_NAME``); ``boot_id`` its incarnation
(env ``JUPYTER_GOALS_BOOT_ID``). A process is identified by ``(pid, start time)`` so a later
process can tell whether the *same* process still lives, not merely one reusing its pid.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


def host_name() -> str:
    return os.environ.get("JUPYTER_GOALS_HOST_NAME") or socket.gethostname()


def boot_id() -> str:
    override = os.environ.get("JUPYTER_GOALS_BOOT_ID")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "unknown-boot"


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/pid/stat); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            data = f.read()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    rest = data[data.rfind(")") + 2 :].split()
    try:
        if rest[0] == "Z":  # a zombie has exited; only its exit status is left
            return None
        return int(rest[19])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ProcessIdentity:
    host_name: str
    boot_id: str
    pid: int
    start_time: int | None

    @classmethod
    def current(cls) -> ProcessIdentity:
        pid = os.getpid()
        return cls(host_name(), boot_id(), pid, process_start_time(pid))

    def is_alive_here(self) -> bool | None:
        """True/False when this host can tell; None when the process is on another host."""
        if self.host_name != host_name():
            return None
        if self.boot_id != boot_id():
            return False  # same host, new boot: every process of the old boot is dead
        return self.start_time is not None and process_start_time(self.pid) == self.start_time
