"""The Goal panel (the current Goal, its history entries opened read-only) and the attention list
(everything across sessions that waits for a person). Both re-read REST on every event that concerns
them and after a reconnect; neither keeps state of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from jupyter_goals.clients.rest import GoalsError
from jupyter_goals.clients.tui.render import attention_rows, goal_text, history_line

if TYPE_CHECKING:
    from jupyter_goals.clients.tui.link import ServerLink

GOAL_EVENTS = ("goal.", "todo.", "work.phase", "usage.updated", "approval.")


class Following(Screen[None]):
    """A screen that re-reads when ``wants(event)`` and when the server is back."""

    def __init__(self, link: ServerLink) -> None:
        super().__init__()
        self.link = link
        self.busy = False
        self.dirty = False

    async def on_mount(self) -> None:
        self.link.listeners.append(self._event)
        self.link.connection_listeners.append(self._connection)
        await self.reread()

    def _on_prune(self) -> None:
        """Taken down: stop following and cancel the reads under way before the widgets are removed."""
        if self._event in self.link.listeners:
            self.link.listeners.remove(self._event)
        if self._connection in self.link.connection_listeners:
            self.link.connection_listeners.remove(self._connection)
        self.workers.cancel_node(self)

    def wants(self, event: dict[str, Any]) -> bool:
        return True

    async def _event(self, event: dict[str, Any]) -> None:
        if self.wants(event):
            self.run_worker(self.reread(), group="reread")

    async def _connection(self, up: bool) -> None:
        if up:
            self.run_worker(self.reread(), group="reread")

    async def reread(self) -> None:
        if self.busy:
            self.dirty = True
            return
        self.busy = True
        try:
            while True:
                self.dirty = False
                try:
                    await self.read()
                except Exception as exc:  # keep what is shown; the next reconnect reads again
                    self.app.notify(f"Not refreshed: {exc}", severity="warning", timeout=3)
                    return
                if not self.dirty:
                    return
        finally:
            self.busy = False

    async def read(self) -> None:
        raise NotImplementedError


class GoalScreen(Following):
    """The current Goal: objective, state, phase, requirements with verdicts, Todo; ended Goals below
    (Enter opens one read-only)."""

    BINDINGS = [
        Binding("v,f6", "goal_action('verify')", "Verify"),
        Binding("e,f7", "goal_action('end')", "End"),
        Binding("p", "goal_action('pause')", "Pause Goal"),
        Binding("r", "goal_action('resume')", "Resume Goal"),
        Binding("escape,q", "app.pop_screen", "Back"),
    ]
    DEFAULT_CSS = """
    GoalScreen #goal { height: auto; max-height: 60%; }
    GoalScreen #history { height: 1fr; }
    """

    def __init__(self, link: ServerLink, session_id: str) -> None:
        super().__init__(link)
        self.session_id = session_id
        self.goal: dict[str, Any] | None = None
        self.records: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="goal"):
            yield Static("loading…", id="goal-text", markup=False)
        yield Static("Ended Goals (Enter opens one, read-only):", markup=False)
        yield DataTable(id="history", cursor_type="row")
        yield Footer()

    def wants(self, event: dict[str, Any]) -> bool:
        return event.get("session_id") == self.session_id and str(event.get("kind")).startswith(GOAL_EVENTS)

    async def read(self) -> None:
        goals = (await self.link.get("/goals", {"session_id": self.session_id}))["goals"]
        current = [g for g in goals if g.get("ended_at") is None]
        self.goal = current[0] if current else None
        self.query_one("#goal-text", Static).update(goal_text(self.goal))
        self.records = (await self.link.get(f"/sessions/{self.session_id}/history"))["records"]
        table = self.query_one("#history", DataTable)
        table.clear(columns=True)
        table.add_column("ended Goal")
        for r in self.records:
            table.add_row(history_line(r))
        if not self.records:
            table.add_row("(none)")

    async def action_goal_action(self, action: str) -> None:
        if self.goal is None:
            self.app.notify("No current Goal.", severity="warning")
            return
        flag = {"verify": "can_verify", "end": "can_end", "pause": "can_pause", "resume": "can_resume"}[action]
        if not (self.goal.get("actions") or {}).get(flag):
            self.app.notify(f"{action.capitalize()} is not available now: {self.goal.get('reason') or self.goal.get('state')}",
                            severity="warning", timeout=6)
            return
        try:
            await self.link.send("POST", f"/goals/{self.goal['goal_id']}/actions",
                                 {"action": action, "expected_revision": self.goal["revision"]})
        except GoalsError as exc:
            self.app.notify(f"{'Conflict (409)' if exc.status == 409 else exc.status}: {exc.message}", severity="warning")
        await self.reread()

    @on(DataTable.RowSelected, "#history")
    async def _open(self, event: DataTable.RowSelected) -> None:
        if event.cursor_row < len(self.records):
            record = await self.link.get(f"/history/{self.records[event.cursor_row]['record_id']}")
            await self.app.push_screen(RecordScreen(record))


class RecordScreen(Screen[None]):
    """An ended Goal, read-only: its own snapshot, as it was when it ended."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "Back")]

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__()
        self.record = record

    def compose(self) -> ComposeResult:
        snap = dict(self.record.get("snapshot") or {})
        head = f"Read-only record of an ended Goal ({self.record.get('state')}), anchored at transcript seq " \
               f"{(self.record.get('anchor') or {}).get('seq')}.\n"
        with VerticalScroll():
            yield Static(head + goal_text(snap), markup=False)
        yield Footer()


class AttentionScreen(Following):
    """Approvals, questions, failures, budget stops, blocked Goals and waits across every session; Enter
    opens the session, where the action is."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "Back"), Binding("ctrl+r", "reread", "Re-read")]

    def __init__(self, link: ServerLink) -> None:
        super().__init__(link)
        self.rows: list[tuple[str, str, str]] = []

    def compose(self) -> ComposeResult:
        yield Static("Waiting for you (Enter opens the session):", markup=False)
        yield DataTable(id="attention", cursor_type="row")
        yield Footer()

    def wants(self, event: dict[str, Any]) -> bool:
        return str(event.get("kind")).startswith(("approval.", "work.phase", "work.control", "goal.", "effect.state"))

    async def read(self) -> None:
        # the server's list (GET /attention), the one JupyterLab's inbox shows: rebuilt from the store
        self.rows = attention_rows((await self.link.get("/attention"))["items"])
        table = self.query_one("#attention", DataTable)
        table.clear(columns=True)
        table.add_columns("waiting for you", "action")
        for _, what, action in self.rows:
            table.add_row(what[:52], action)
        if not self.rows:
            table.add_row("Nothing waits for you.", "")
        table.focus()

    async def action_reread(self) -> None:
        await self.reread()

    @on(DataTable.RowSelected, "#attention")
    def _open(self, event: DataTable.RowSelected) -> None:
        if event.cursor_row < len(self.rows):
            self.app.open_session(self.rows[event.cursor_row][0])  # type: ignore[attr-defined]
