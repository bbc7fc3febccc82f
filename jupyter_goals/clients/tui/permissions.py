"""The session's permissions and model (``F10`` / ``ctrl+s`` on a session, or the command palette): the
mode (``m`` switches ask / bypass), the allow rules (``d`` revokes the highlighted one, so its tool asks
again), and the model picker (``c``: ``GET /models``, a model without credentials says so). Every change
is one ``PATCH /sessions/{id}`` (``{permissions, expected_control_version}`` or ``{model}``); a 409 (the
work's control version moved: someone acted first) says so and shows the state read again."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from jupyter_goals.clients.rest import GoalsError
from jupyter_goals.clients.tui.panels import Following
from jupyter_goals.clients.tui.render import model_about, model_name, model_row, permissions_text, rule_row

if TYPE_CHECKING:
    from jupyter_goals.clients.tui.link import ServerLink

SESSION_EVENTS = ("session.", "work.control")


async def patch_session(screen: Screen[Any], link: ServerLink, session_id: str, body: dict[str, Any],
                        done: str) -> tuple[dict[str, Any] | None, str]:
    """``PATCH /sessions/{id}`` → (the snapshot answered, ``done``), or (None, why nothing changed); either
    is also said in a notification."""
    try:
        snap = dict(await link.send("PATCH", f"/sessions/{session_id}", body))
    except GoalsError as exc:
        prefix = "Conflict (409)" if exc.status == 409 else f"Refused ({exc.status} {exc.error})"
        why = f"{prefix}: {exc.message}"
    except Exception as exc:
        why = f"Not sent: server unreachable ({type(exc).__name__})"
    else:
        screen.app.notify(done)
        return snap, done
    screen.app.notify(why, severity="warning", timeout=6)
    return None, why


class PermissionsScreen(Following):
    """One session's permission scope and model, as the server last answered."""

    BINDINGS = [
        Binding("m", "switch_mode", "Mode", tooltip="switch the permission mode: ask / bypass"),
        Binding("d,delete", "revoke", "Revoke rule", tooltip="revoke the highlighted allow rule (asks again)"),
        Binding("c", "models", "Model", tooltip="choose the session's model (from its next turn)"),
        Binding("ctrl+r", "reread", "Re-read", show=False, tooltip="read the permissions again"),
        Binding("escape,q", "app.pop_screen", "Back"),
    ]
    DEFAULT_CSS = """
    PermissionsScreen #perm-head { height: auto; }
    PermissionsScreen #rules { height: 1fr; }
    PermissionsScreen #perm-note { height: auto; background: $boost; }
    """

    def __init__(self, link: ServerLink, session_id: str) -> None:
        super().__init__(link)
        self.session_id = session_id
        self.session: dict[str, Any] = {}
        self.work: dict[str, Any] | None = None

    def compose(self) -> ComposeResult:
        yield Static("loading…", id="perm-head", markup=False)
        yield DataTable(id="rules", cursor_type="row")
        yield Static("", id="perm-note", markup=False)
        yield Footer()

    def wants(self, event: dict[str, Any]) -> bool:
        return event.get("session_id") == self.session_id and str(event.get("kind")).startswith(SESSION_EVENTS)

    async def read(self) -> None:
        self.show(await self.link.get(f"/sessions/{self.session_id}", {"before": "latest", "limit": 1}))

    def show(self, snap: dict[str, Any]) -> None:
        self.session, self.work = dict(snap.get("session") or {}), snap.get("work")
        self.query_one("#perm-head", Static).update(permissions_text(self.session))
        table = self.query_one("#rules", DataTable)
        row = table.cursor_row
        table.clear(columns=True)
        table.add_columns("rule", "runs without asking")
        for rule in self.rules:
            table.add_row(*rule_row(rule))
        if not self.rules:
            table.add_row("(none)", "every call that is not a built-in read asks")
        table.move_cursor(row=min(row, max(0, len(self.rules) - 1)))
        table.focus()

    @property
    def permissions(self) -> dict[str, Any]:
        return dict(self.session.get("permissions") or {"mode": "ask"})

    @property
    def rules(self) -> list[Any]:
        return list(self.permissions.get("allow") or [])

    def note(self, text: str) -> None:
        self.query_one("#perm-note", Static).update(text)

    async def change(self, permissions: dict[str, Any], done: str) -> None:
        """Send the new scope, checked against the control version shown; a 409 re-reads and says so."""
        body: dict[str, Any] = {"permissions": permissions}
        if self.work:
            body["expected_control_version"] = self.work.get("control_version")
        snap, said = await patch_session(self, self.link, self.session_id, body, done)
        if snap is None:  # show what is true now: someone else's change, or what was there
            try:  # read here, not through reread(): a reread under way would return at once, before its answer
                await self.read()
            except Exception as exc:
                self.note(f"{said}\nNot read again: {exc}")
                return
            mode = self.permissions.get("mode", "ask")
            self.note(f"{said}\nNothing changed by you. Now: mode {mode}, {len(self.rules)} allow rule(s).")
            return
        self.note(said)
        self.show(snap)

    async def action_switch_mode(self) -> None:
        permissions = self.permissions
        mode = "bypass" if permissions.get("mode", "ask") == "ask" else "ask"
        await self.change({**permissions, "mode": mode}, f"Mode: {mode}.")

    async def action_revoke(self) -> None:
        rules = self.rules
        row = self.query_one("#rules", DataTable).cursor_row
        if not 0 <= row < len(rules):
            self.note("No allow rule to revoke.")
            return
        tool, _ = rule_row(rules[row])
        await self.change({**self.permissions, "allow": rules[:row] + rules[row + 1:]},
                          f"Revoked: {tool} asks again from its next call.")

    async def action_models(self) -> None:
        await self.app.push_screen(ModelScreen(self.link, self.session_id, str(self.session.get("model") or "")))

    async def action_reread(self) -> None:
        await self.reread()


class ModelScreen(Screen[None]):
    """The models of ``GET /models``; Enter makes the highlighted one the session's model."""

    BINDINGS = [
        Binding("enter", "choose", "Use this model", tooltip="use the highlighted model (from the next turn)"),
        Binding("escape,q", "app.pop_screen", "Back"),
    ]
    DEFAULT_CSS = """
    ModelScreen #models { height: 1fr; }
    ModelScreen #model-about { height: auto; background: $boost; }
    """

    def __init__(self, link: ServerLink, session_id: str, current: str) -> None:
        super().__init__()
        self.link, self.session_id, self.current = link, session_id, current
        self.models: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        yield Static(f"Models of the server (in use: {model_name(self.current)}); Enter chooses:", markup=False)
        yield DataTable(id="models", cursor_type="row")
        yield Static("", id="model-about", markup=False)
        yield Footer()

    async def on_mount(self) -> None:
        table = self.query_one("#models", DataTable)
        table.add_columns("model", "")
        try:
            self.models = list((await self.link.get("/models"))["models"])
        except Exception as exc:
            self.app.notify(f"Models not read: {exc}", severity="warning")
            return
        for info in self.models:
            table.add_row(*model_row(info, self.current))
        table.focus()

    @on(DataTable.RowHighlighted, "#models")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if 0 <= event.cursor_row < len(self.models):
            self.query_one("#model-about", Static).update(model_about(self.models[event.cursor_row]))

    @on(DataTable.RowSelected, "#models")
    async def _selected(self) -> None:
        await self.action_choose()

    async def action_choose(self) -> None:
        row = self.query_one("#models", DataTable).cursor_row
        if not 0 <= row < len(self.models):
            return
        info = self.models[row]
        name = str(info["name"])
        lacking = "" if info.get("credentials_present") else " It has no credentials on the server: its requests wait until a key is set."
        snap, said = await patch_session(self, self.link, self.session_id, {"model": name},
                                         f"Model: {model_name(name)} from the next turn.{lacking}")
        if snap is None:
            self.query_one("#model-about", Static).update(said)
        else:
            self.app.pop_screen()
