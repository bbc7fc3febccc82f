"""The session picker: every durable session (started anywhere: JupyterLab, notebooks, REST, ACP, here),
newest activity first, read in ``GET /sessions`` keyset pages as the cursor reaches the end; filter by
text (``q``: title or folder) and by state (``ctrl+t`` cycles them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from jupyter_goals.clients.tui.render import session_row

if TYPE_CHECKING:
    from jupyter_goals.clients.tui.link import ServerLink

PICKER_PAGE = 50
# the state filter's values: "" = every session; else phases of the shown work (or idle)
STATES = ("", "working,queued,recovering", "waiting", "paused", "failed,interrupted", "done", "cancelled", "idle")


class PickerScreen(Screen[None]):
    BINDINGS = [
        Binding("ctrl+t", "cycle_state", "State filter"),
        Binding("ctrl+n", "new_session", "New session"),
        Binding("down", "move(1)", "Down", show=False),
        Binding("up", "move(-1)", "Up", show=False),
        Binding("pagedown", "move(10)", "Page down", show=False),
        Binding("pageup", "move(-10)", "Page up", show=False),
    ]
    DEFAULT_CSS = """
    PickerScreen #filter { border: none; height: 1; padding: 0 1; }
    PickerScreen #picker-status { height: 1; background: $boost; }
    PickerScreen #sessions { height: 1fr; }
    """

    def __init__(self, link: ServerLink) -> None:
        super().__init__()
        self.link = link
        self.sessions: list[dict[str, Any]] = []
        self.cursor: str | None = None
        self.state_index = 0
        self.reading = False
        self.generation = 0  # a newer filter makes the answers of an older one void

    def compose(self) -> ComposeResult:
        yield Static("", id="picker-status", markup=False)
        yield Input(placeholder="Filter by title or folder (Enter opens the highlighted session)", id="filter")
        yield DataTable(id="sessions", cursor_type="row")
        yield Footer()

    async def on_mount(self) -> None:
        table = self.query_one("#sessions", DataTable)
        table.add_columns("title", "state", "folder", "active")
        self.query_one("#filter", Input).focus()
        self.link.connection_listeners.append(self._connection)
        await self.restart()

    def _on_prune(self) -> None:
        """Taken down: stop following and cancel the reads under way before the widgets are removed."""
        if self._connection in self.link.connection_listeners:
            self.link.connection_listeners.remove(self._connection)
        self.workers.cancel_node(self)

    async def _connection(self, up: bool) -> None:
        self.show_status()
        if up and not self.sessions:
            await self.restart()

    @property
    def state_filter(self) -> str:
        return STATES[self.state_index]

    def show_status(self) -> None:
        more = ", more below" if self.cursor else ""
        state = self.state_filter or "any"
        self.query_one("#picker-status", Static).update(
            f"Sessions: {len(self.sessions)} shown{more} | state: {state} (ctrl+t) | {self.link.connection}")

    async def restart(self) -> None:
        self.generation += 1
        self.sessions, self.cursor = [], None
        self.query_one("#sessions", DataTable).clear()
        await self.load_more(first=True)

    async def load_more(self, first: bool = False) -> None:
        """The next ``GET /sessions`` page of the current filter."""
        if not first and (self.reading or not self.cursor):
            return
        self.reading = True
        generation = self.generation
        try:
            q = self.query_one("#filter", Input).value.strip()
            page = await self.link.sessions_page(self.cursor, q, self.state_filter, PICKER_PAGE)
        except Exception as exc:
            self.app.notify(f"Sessions not read: {exc}", severity="warning", timeout=3)
            return
        finally:
            if generation == self.generation:
                self.reading = False
        if generation != self.generation:  # a newer filter asked meanwhile: its answer counts
            return
        table = self.query_one("#sessions", DataTable)
        for s in page["sessions"]:
            self.sessions.append(s)
            table.add_row(*session_row(s), key=str(s["session_id"]))
        self.cursor = page.get("next_cursor")
        self.show_status()

    @on(Input.Changed, "#filter")
    async def _filter(self) -> None:
        await self.restart()

    async def action_cycle_state(self) -> None:
        self.state_index = (self.state_index + 1) % len(STATES)
        await self.restart()

    async def action_move(self, rows: int) -> None:
        table = self.query_one("#sessions", DataTable)
        if not self.sessions:
            return
        row = max(0, min(len(self.sessions) - 1, table.cursor_row + rows))
        table.move_cursor(row=row)
        if row >= len(self.sessions) - 5:
            await self.load_more()

    @on(DataTable.RowHighlighted, "#sessions")
    async def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.cursor_row >= len(self.sessions) - 5:
            await self.load_more()

    @on(Input.Submitted, "#filter")
    def _submitted(self) -> None:
        self.open_highlighted()

    @on(DataTable.RowSelected, "#sessions")
    def _selected(self) -> None:
        self.open_highlighted()

    def open_highlighted(self) -> None:
        row = self.query_one("#sessions", DataTable).cursor_row
        if 0 <= row < len(self.sessions):
            self.app.open_session(str(self.sessions[row]["session_id"]))  # type: ignore[attr-defined]

    async def action_new_session(self) -> None:
        try:
            created = await self.link.send("POST", "/sessions", {"title": "terminal"})
        except Exception as exc:
            self.app.notify(f"Session not created: {exc}", severity="warning")
            return
        self.app.open_session(str(created["session_id"]))  # type: ignore[attr-defined]
