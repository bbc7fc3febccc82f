"""``GoalsTui``: the Textual app. It opens the ``ServerLink`` (REST + the one event stream), then the
picker, the most recent session (``--continue``) or a named one (``--resume ID``). While the server cannot
be reached at start it says so and keeps trying; later losses are shown on each screen's status line
while the screen keeps what it shows."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from jupyter_goals.clients.tui.keys import GoalsCommands, HelpScreen
from jupyter_goals.clients.tui.link import UNREACHABLE, ServerLink
from jupyter_goals.clients.tui.panels import AttentionScreen
from jupyter_goals.clients.tui.picker import PickerScreen
from jupyter_goals.clients.tui.quit import QuitScreen
from jupyter_goals.clients.tui.session import SessionScreen

START_RETRY_S = 1.0


class Connecting(Screen[None]):
    def compose(self) -> ComposeResult:
        yield Static("Connecting to the jupyter_goals server…", id="connecting", markup=False)
        yield Footer()


class GoalsTui(App[None]):
    TITLE = "jupyter goals"
    BINDINGS = [
        Binding("f1", "help", "Help", tooltip="this list of keys"),
        Binding("f9,ctrl+l", "attention", "Attention", tooltip="everything across sessions waiting for you"),
        Binding("ctrl+o", "sessions", "Sessions", show=False, tooltip="the session picker"),
        Binding("ctrl+q", "quit", "Quit", tooltip="quit; the work goes on (asks if a message is unsent)"),
    ]
    COMMANDS = App.COMMANDS | {GoalsCommands}

    def __init__(self, link: ServerLink, *, resume: str | None = None, continue_last: bool = False) -> None:
        super().__init__()
        self.link = link
        self.resume, self.continue_last = resume, continue_last

    async def on_mount(self) -> None:
        await self.push_screen(Connecting())
        self.run_worker(self.start(), group="start")

    async def start(self) -> None:
        """Open the link, then the first screen; a server that cannot be reached is retried."""
        await self.link.open()
        while True:
            try:
                first = await self.first_session()
                break
            except Exception as exc:
                self.query_one("#connecting", Static).update(
                    f"{self.link.url}: {UNREACHABLE} ({type(exc).__name__}: {exc})")
                await asyncio.sleep(START_RETRY_S)
        if first is None:
            await self.switch_screen(PickerScreen(self.link))
        else:
            await self.switch_screen(SessionScreen(self.link, first))

    async def first_session(self) -> str | None:
        if self.resume:
            await self.link.get(f"/sessions/{self.resume}", {"before": "latest", "limit": 1})  # 404 → picker
            return self.resume
        if self.continue_last:
            page = await self.link.sessions_page(None, "", "", limit=1)
            if page["sessions"]:
                return str(page["sessions"][0]["session_id"])
        return None

    def open_session(self, session_id: str) -> None:
        """The session screen of ``session_id`` in place of whatever is open."""
        self.run_worker(self._open(session_id), group="open")

    async def _open(self, session_id: str) -> None:
        while len(self.screen_stack) > 2:
            await self.pop_screen()
        await self.switch_screen(SessionScreen(self.link, session_id))

    def action_sessions(self) -> None:
        self.run_worker(self._sessions(), group="open")

    async def _sessions(self) -> None:
        while len(self.screen_stack) > 2:
            await self.pop_screen()
        if not isinstance(self.screen, PickerScreen):
            await self.switch_screen(PickerScreen(self.link))

    async def action_attention(self) -> None:
        if not isinstance(self.screen, AttentionScreen):
            await self.push_screen(AttentionScreen(self.link))

    async def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            await self.push_screen(HelpScreen(list(self.BINDINGS)))

    async def action_quit(self) -> None:
        """Quit (ctrl+q, the palette); while typed messages are not sent, ask first: they would be lost."""
        unsent = self.link.unsent()
        if not unsent:
            self.exit()
        elif not isinstance(self.screen, QuitScreen):
            await self.push_screen(QuitScreen(unsent), self._quit_answered)

    def _quit_answered(self, quit_anyway: bool | None) -> None:
        if quit_anyway:
            self.exit()

    async def on_unmount(self) -> None:
        await self.link.close()

    def session_screen(self) -> SessionScreen | None:
        for screen in reversed(self.screen_stack):
            if isinstance(screen, SessionScreen):
                return screen
        return None

    def snapshot(self) -> dict[str, Any]:
        screen = self.session_screen()
        return screen.state.snap if screen else {}
