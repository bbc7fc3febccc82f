"""Every key, in one place a person can read (the help screen, F1), built from the screens' own
bindings so it cannot drift from them; and the command palette's commands (ctrl+p), each action said
with whether the server allows it now and, if not, why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from jupyter_goals.clients.tui.approval import ApprovalScreen
from jupyter_goals.clients.tui.panels import AttentionScreen, GoalScreen, RecordScreen
from jupyter_goals.clients.tui.permissions import ModelScreen, PermissionsScreen
from jupyter_goals.clients.tui.picker import PickerScreen
from jupyter_goals.clients.tui.quit import QuitScreen
from jupyter_goals.clients.tui.render import GOAL_ACTIONS, SESSION_ACTIONS, not_allowed
from jupyter_goals.clients.tui.session import SessionScreen

# what each screen is, for the help screen's headings
SCREENS: tuple[tuple[str, Any], ...] = (
    ("Session", SessionScreen),
    ("Approval (modal)", ApprovalScreen),
    ("Session picker", PickerScreen),
    ("Goal panel", GoalScreen),
    ("Ended Goal (read-only)", RecordScreen),
    ("Attention list", AttentionScreen),
    ("Permissions and model", PermissionsScreen),
    ("Model picker", ModelScreen),
    ("Quit while messages are not sent (modal)", QuitScreen),
)
COMPOSER_KEYS = (("enter", "send the message; /goal <objective> starts a Goal"),
                 ("ctrl+a ctrl+e", "message box: start, end"),
                 ("ctrl+u ctrl+k ctrl+w", "message box: delete before, after, word"))


def key_rows(bindings: list[BindingType]) -> list[tuple[str, str]]:
    rows = []
    for b in bindings:
        if isinstance(b, Binding):
            rows.append((b.key.replace(",", " / "), b.tooltip or b.description or b.action))
        elif isinstance(b, tuple) and len(b) >= 2:
            rows.append((str(b[0]), str(b[2] if len(b) > 2 else b[1])))
    return rows


def help_text(app_bindings: list[BindingType]) -> str:
    lines = ["Keys (every screen reads the same without colour; F1 shows this screen)", "",
             "Everywhere:"]
    lines += [f"  {k:<22} {d}" for k, d in key_rows(app_bindings)]
    lines.append(f"  {'ctrl+p':<22} command palette: every action, and why one is off")
    for title, screen in SCREENS:
        lines += ["", f"{title}:"]
        if screen is SessionScreen:
            lines += [f"  {k:<22} {d}" for k, d in COMPOSER_KEYS]
        if screen is PickerScreen:
            lines += [f"  {'typing':<22} filter by title or folder",
                      f"  {'enter':<22} open the highlighted session"]
        lines += [f"  {k:<22} {d}" for k, d in key_rows(list(screen.BINDINGS))]
    lines += ["", "An approval's y / n / a count only when pressed at least half a second after the question",
              "appeared: keys typed for the message box never answer it."]
    return "\n".join(lines)


class HelpScreen(Screen[None]):
    BINDINGS = [Binding("escape,q,f1", "app.pop_screen", "Back")]

    def __init__(self, app_bindings: list[BindingType]) -> None:
        super().__init__()
        self.app_bindings = app_bindings

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_text(self.app_bindings), markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#help").focus()  # up / down / page keys scroll it


class GoalsCommands(Provider):
    """The command palette: the session's actions (with the server's reason when one is off) and the
    screens."""

    def commands(self) -> list[tuple[str, str, Callable[[], Any]]]:
        app: Any = self.app
        screen = self.screen  # the screen the palette was opened from
        out: list[tuple[str, str, Callable[[], Any]]] = [
            ("Sessions", "pick a session", app.action_sessions),
            ("Attention list", "everything waiting for you", app.action_attention),
            ("Help", "every key", app.action_help),
        ]
        if isinstance(screen, SessionScreen):
            snap = screen.state.snap
            actions, work, goal = snap.get("actions") or {}, snap.get("work"), snap.get("goal")
            for action, key, label, flag in SESSION_ACTIONS:
                why = "" if actions.get(flag) else f" (off: {not_allowed(actions, work)})"
                out.append((label, f"{key.upper()}{why}", screen.later(screen.action_session_action, action)))
            for action, key, label, flag in GOAL_ACTIONS:
                ok = bool(goal and (goal.get("actions") or {}).get(flag))
                why = "" if ok else f" (off: {(goal or {}).get('reason') or 'no current Goal'})"
                out.append((f"{label} Goal", f"{key.upper()}{why}", screen.later(screen.action_goal_action, action)))
            out.append(("Goal panel", "F8", screen.later(screen.action_goal_panel)))
            out.append(("Queue / steer", "ctrl+t", screen.action_toggle_delivery))
            out.append(("Permissions", "F10: mode, allow rules, model", screen.later(screen.action_permissions)))
            out.append(("Model", "choose the session's model", screen.later(screen.action_models)))
        return out

    async def discover(self) -> Hits:
        for name, help_, run in self.commands():
            yield DiscoveryHit(name, run, help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_, run in self.commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), run, help=help_)
