"""What the terminal UI's tests share (tests/test_tui*.py): the app on a real server at 80x24, the words a
person reads on the top screen, a wait on a condition, and text snapshots of the whole screen.

A snapshot is the screen as the terminal draws it (the same render as ``App.export_screenshot``, as plain
text: what a person reads, the same without colour), with what differs between runs and machines
masked (times, durations, ids, ports, temporary paths), compared with ``tests/snapshots/tui/<name>.txt``.
``JG_UPDATE_SNAPSHOTS=1`` rewrites them (then read the diff before committing it)."""

from __future__ import annotations

import difflib
import io
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from jupyter_goals.clients.tui.app import GoalsTui
from jupyter_goals.clients.tui.link import ServerLink
from jupyter_goals.testing import ServerProcess

SIZE = (80, 24)
SNAPSHOTS = Path(__file__).parent / "snapshots" / "tui"
UPDATE_ENV = "JG_UPDATE_SNAPSHOTS"

# what differs between two runs of the same scripted story: masked, each by a placeholder of its own
MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d"), "YYYY-MM-DD hh:mm"),
    (re.compile(r"\b\d\d-\d\d \d\d:\d\d\b"), "MM-DD hh:mm"),
    (re.compile(r"\bactive \d+[hm]\d\d[ms]?s?"), "active <time>"),
    (re.compile(r"\b\d+(\.\d+)? ?(ms|s)\b"), "<dur>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<id>"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"/tmp/\S*"), "<tmp>"),
)


def tui(server: ServerProcess, **kw: Any) -> GoalsTui:
    return GoalsTui(ServerLink(server.url, server.token), **kw)


def shown(app: App[Any]) -> str:
    """The words on the top screen (every Static and table cell), as a person reads them."""
    parts = [str(w.content) for w in app.screen.query(Static)]
    for table in app.screen.query(DataTable):
        parts += [" ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]
    return "\n".join(parts)


async def until(pilot: Pilot[Any], cond: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.05)
    stack = [type(s).__name__ for s in pilot.app.screen_stack]
    raise TimeoutError(f"{what}; screens {stack}; the screen shows:\n{shown(pilot.app)}")


def screen_text(app: App[Any]) -> str:
    """The whole terminal as drawn now (every cell, the screens below a modal too), one line per row,
    trailing blanks cut."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None,
                      record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return "\n".join(line.rstrip() for line in console.export_text(styles=False).splitlines()) + "\n"


def normalized(text: str) -> str:
    for pattern, placeholder in MASKS:
        text = pattern.sub(placeholder, text)
    return text


async def settled_screen(pilot: Pilot[Any], within: float = 10.0) -> str:
    """The normalized screen once it stops changing (two draws 0.3 s apart alike), notifications gone."""
    app = pilot.app
    deadline = time.monotonic() + within
    last = None
    while True:
        app.clear_notifications()
        await pilot.pause(0.3)
        text = normalized(screen_text(app))
        if text == last or time.monotonic() > deadline:
            return text
        last = text


class Snapshots:
    """Compares screens with the stored files, every one of a test before failing (all diffs at once)."""

    def __init__(self) -> None:
        self.update = os.environ.get(UPDATE_ENV) == "1"
        self.failures: list[str] = []

    async def check(self, pilot: Pilot[Any], name: str) -> str:
        text = await settled_screen(pilot)
        path = SNAPSHOTS / f"{name}.txt"
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif not path.exists():
            self.failures.append(f"{path} is missing ({UPDATE_ENV}=1 writes it); the screen:\n{text}")
        elif (want := path.read_text()) != text:
            diff = difflib.unified_diff(want.splitlines(), text.splitlines(), f"{name} (stored)", f"{name} (now)",
                                        lineterm="")
            self.failures.append("\n".join(diff))
        return text

    def verify(self) -> None:
        assert not self.failures, "snapshots differ:\n\n" + "\n\n".join(self.failures)
