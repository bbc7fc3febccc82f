"""Interruption points (DESIGN §5, contract).

``JUPYTER_GOALS_CRASH_AT=<point>`` or ``<point>#<n>`` makes whichever process reaches the point
(the n-th time) call ``os._exit(86)``. A point fires once per state dir: the marker file
``<state_dir>/faults/<point>.fired`` is created first, and a point whose file exists never fires again.

An extension of the contract for tests that need the whole server to die at the point, not only the
process that reached it: with ``JUPYTER_GOALS_CRASH_SCOPE=group`` the process SIGKILLs its whole process
group instead (the Jupyter server and its workers together, as a kill -9 of the server's group would;
tool commands run in groups of their own and outlive it). Without it, the survivor of a one-process
crash may act before a test can kill the rest, and which one wins is a race.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

POINTS = frozenset(
    {
        "input.before_accept",
        "input.after_accept",
        "provider.before_request",
        "provider.after_response",
        "provider.after_commit",
        "tool.before_dispatch",
        "tool.after_dispatch",
        "tool.before_result_commit",
        "tool.after_result_commit",
        "child.before_delivery",
        "child.after_delivery",
        "goal.todo_complete_before_acceptance",
        "goal.after_completion_commit",
        "usage.before_persist",
        "usage.after_persist",
        "recovery.after_claim",
        "recovery.after_decision",
        "shutdown.after_admission_stop",
        "control.after_stop_commit",
        "tool.before_cancel_kill",
    }
)

CRASH_EXIT_CODE = 86
_hits: dict[str, int] = {}
_state_dir: Path | None = None


def configure(state_dir: str | os.PathLike[str]) -> None:
    global _state_dir
    _state_dir = Path(state_dir)


_UNSET = ("unset", 0)
_cached: tuple[str, int] | None = _UNSET


def _target() -> tuple[str, int] | None:
    # read once per process (the variable is set when a process starts): crash_point() sits on the
    # per-step hot path; reset() re-reads it
    global _cached
    if _cached is _UNSET:
        spec = os.environ.get("JUPYTER_GOALS_CRASH_AT", "")
        point, _, nth = spec.partition("#")
        _cached = (point, int(nth) if nth else 1) if spec else None
    return _cached


def reset() -> None:
    """Forget the parsed variable and the hit counts (for a process that changes its environment)."""
    global _cached
    _cached = _UNSET
    _hits.clear()


def crash_point(point: str) -> None:
    """Exit the process at once when ``point`` is the configured interruption point."""
    assert point in POINTS, point
    target = _target()
    if target is None or target[0] != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] != target[1]:
        return
    base = _state_dir or Path(os.environ.get("JUPYTER_GOALS_STATE_DIR", "."))
    marker = base / "faults" / f"{point}.fired"
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()}\n".encode())
    os.fsync(fd)
    os.close(fd)
    if os.environ.get("JUPYTER_GOALS_CRASH_SCOPE") == "group":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(CRASH_EXIT_CODE)
