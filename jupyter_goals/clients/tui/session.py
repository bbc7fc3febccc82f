"""The session screen: status line, transcript, streamed answer, actions line, composer.

It holds nothing the server does not say: every event that names the session (and every reconnect)
re-reads ``GET /sessions/{id}?after=<last seq>`` (the snapshot's head and the new transcript items in one
answer); older pages are read with ``?before=<prev_cursor>`` when the transcript is scrolled to the top
(or ``ctrl+b``). Pause / Resume / Stop / Retry (``POST /sessions/{id}/actions``) and Verify / End (``POST
/goals/{id}/actions``) are offered by the server's ``actions``; a refused one says the server's reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from jupyter_goals.clients.rest import GoalsError
from jupyter_goals.clients.tui.approval import ApprovalScreen
from jupyter_goals.clients.tui.link import PAGE, SessionState
from jupyter_goals.clients.tui.render import (
    GOAL_ACTIONS,
    OPEN_STATES,
    SESSION_ACTIONS,
    actions_line,
    item_lines,
    not_allowed,
    status_line,
)

if TYPE_CHECKING:
    from jupyter_goals.clients.tui.link import ServerLink

# events that change what this screen shows (everything else about the session is re-read too, cheaply)
DRAFT, EFFECT = "assistant.draft", "effect.state"


class Transcript(VerticalScroll):
    """The transcript; says when it was scrolled to its top (time to read the older page)."""

    class AtTop(Message):
        pass

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value <= 0 < old_value:
            self.post_message(self.AtTop())


class SessionScreen(Screen[None]):
    BINDINGS = [
        Binding("f2", "session_action('pause')", "Pause", tooltip="Pause: the running step ends, nothing new starts"),
        Binding("f3", "session_action('resume')", "Resume", tooltip="Resume paused work"),
        Binding("f4", "session_action('stop')", "Stop", tooltip="Stop now: the running tool and request are cancelled"),
        Binding("f5", "session_action('retry')", "Retry", tooltip="Retry failed or interrupted work"),
        Binding("f6", "goal_action('verify')", "Verify", tooltip="Verify the Goal now"),
        Binding("f7", "goal_action('end')", "End Goal", tooltip="End the Goal"),
        Binding("f8,ctrl+g", "goal_panel", "Goal", tooltip="the Goal panel: requirements, Todo, ended Goals"),
        Binding("f10,ctrl+s", "permissions", "Permissions", tooltip="permissions (mode, allow rules) and model"),
        Binding("ctrl+t", "toggle_delivery", "Queue/steer",
                tooltip="while a turn runs: queue after it, or steer it"),
        Binding("ctrl+b", "older", "Older page", show=False, tooltip="read the older transcript page"),
        Binding("ctrl+y", "expand", "Expand results", show=False, tooltip="expand or cut long tool results"),
        Binding("ctrl+r", "reload", "Re-read", show=False, tooltip="read the session again"),
        Binding("escape,ctrl+o", "sessions", "Sessions", tooltip="back to the session picker"),
    ]
    DEFAULT_CSS = """
    SessionScreen #status { height: 3; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }
    SessionScreen #transcript { height: 1fr; }
    SessionScreen .item { margin: 0 0 0 0; }
    SessionScreen #actions { height: auto; max-height: 2; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }
    SessionScreen #composer { border: none; height: 1; padding: 0 1; }
    """

    def __init__(self, link: ServerLink, session_id: str) -> None:
        super().__init__()
        self.link = link
        self.state = SessionState(session_id)
        self.outbox = link.outbox(session_id)
        self.delivery = "queue"
        self.expanded = False
        self.reading = False
        self.dirty = False
        self.older_loading = False
        self.asking: ApprovalScreen | None = None
        self.declined: set[str] = set()  # approvals put off with Esc: asked again on the next start

    @property
    def session_id(self) -> str:
        return self.state.session_id

    def compose(self) -> ComposeResult:
        yield Static("loading…", id="status", markup=False)
        with Transcript(id="transcript"):
            yield Static("", id="draft", classes="item", markup=False)
            yield Static("", id="outbox", classes="item", markup=False)
        yield Static("", id="actions", markup=False)
        yield Input(placeholder="Message (Enter sends; /goal <objective> starts a Goal; F1 help)", id="composer")
        yield Footer()

    async def on_mount(self) -> None:
        self.outbox.changed = self.show_outbox
        self.show_outbox()
        self.link.listeners.append(self.on_goals_event)
        self.link.connection_listeners.append(self.on_connection)
        self.query_one("#composer", Input).focus()
        await self.reload(first=True)

    def _on_prune(self) -> None:
        """Taken down (popped, or the app quits): stop following before the widgets are removed, and cancel
        the reads under way, so that an answer arriving meanwhile updates nothing that is gone."""
        for registry, fn in ((self.link.listeners, self.on_goals_event),
                             (self.link.connection_listeners, self.on_connection)):
            if fn in registry:
                registry.remove(fn)  # type: ignore[arg-type]
        self.outbox.changed = lambda: None
        self.workers.cancel_node(self)

    # ------------------------------------------------------------------ reading the server
    async def on_connection(self, up: bool) -> None:
        self.show_status()
        if up:  # back: catch up (the stream resumes from the last event seq) and resend what waits
            self.outbox.nudge()
            self.run_worker(self.reload(), group="reload")

    async def on_goals_event(self, event: dict[str, Any]) -> None:
        if event.get("session_id") != self.session_id:
            return
        kind, payload = str(event.get("kind")), event.get("payload") or {}
        if kind == DRAFT:
            item_id = f"resp:{payload.get('request_id')}"
            if item_id not in self.state.item_ids():
                self.state.drafts[item_id] = str(payload.get("text", ""))
                self.show_draft()
            return
        if kind == EFFECT and payload.get("state") in OPEN_STATES:
            self.state.effects[str(payload.get("call_id"))] = str(payload.get("state"))
        self.run_worker(self.reload(), group="reload")

    async def reload(self, first: bool = False) -> None:
        """Re-read the snapshot and the items after the last one loaded (coalesced: one read at a time,
        one more if something happened meanwhile)."""
        if self.reading:
            self.dirty = True
            return
        self.reading = True
        try:
            while True:
                self.dirty = False
                try:
                    await self._read(first)
                except Exception as exc:  # unreachable or refused: keep what is on screen
                    if first and isinstance(exc, GoalsError) and exc.status == 404:
                        self.app.notify(f"No such session: {self.session_id}", severity="error")
                    self.show_status()
                    return
                first = False
                if not self.dirty:
                    return
        finally:
            self.reading = False

    async def _read(self, first: bool) -> None:
        path = f"/sessions/{self.session_id}"
        if first or not self.state.items:
            page = await self.link.get(path, {"before": "latest", "limit": PAGE})
        else:
            page = await self.link.get(path, {"after": self.state.last_seq, "limit": PAGE})
        new = self.state.take_page(page)
        while (page.get("transcript") or {}).get("next_cursor") and not first:
            page = await self.link.get(path, {"after": self.state.last_seq, "limit": PAGE})
            new += self.state.take_page(page)
        self.show_status()
        await self.append_items(new)
        self.outbox.settle(self.state.item_ids())
        self.show_draft()
        self.ask_pending()

    async def append_items(self, items: list[dict[str, Any]], older: bool = False) -> None:
        transcript = self.query_one(Transcript)
        at_end = transcript.scroll_y >= transcript.max_scroll_y - 1
        settled = self.state.results()
        for call_id in settled:
            self.state.effects.pop(call_id, None)
        widgets = [w for w in (self.item_widget(i) for i in items) if w is not None]
        if not widgets:
            self.refresh_calls()
            return
        if older:
            await transcript.mount_all(widgets, before=0)
        else:
            await transcript.mount_all(widgets, before=self.query_one("#draft"))
        self.refresh_calls()
        if older:
            height = sum(int(w.outer_size.height) for w in widgets)
            self.call_after_refresh(lambda: transcript.scroll_to(y=height, animate=False))
        elif at_end:
            self.call_after_refresh(lambda: transcript.scroll_end(animate=False))

    def item_widget(self, item: dict[str, Any]) -> Static | None:
        text = item_lines(item, self.state.effects.get(str(item.get("call_id"))), self.expanded)
        if not text:
            return None
        classes = f"item kind-{item.get('kind')}"
        widget = Static(text, classes=classes, markup=False)
        widget.item = item  # type: ignore[attr-defined]
        return widget

    def refresh_calls(self) -> None:
        """Tool-call badges: the live effect state until the result item is in."""
        settled = self.state.results()
        for widget in self.query(".kind-tool_call"):
            item = widget.item  # type: ignore[attr-defined]
            call_id = str(item.get("call_id"))
            state = "see result below" if call_id in settled else self.state.effects.get(call_id)
            if isinstance(widget, Static):
                widget.update(item_lines(item, state))

    @on(Transcript.AtTop)
    async def _at_top(self) -> None:
        await self.action_older()

    async def action_older(self) -> None:
        """The page before the oldest item loaded."""
        if self.older_loading or not self.state.prev_cursor:
            return
        self.older_loading = True
        try:
            page = await self.link.get(f"/sessions/{self.session_id}", {"before": self.state.prev_cursor, "limit": PAGE})
            await self.append_items(self.state.take_page(page, older=True), older=True)
        except Exception as exc:
            self.app.notify(f"Older page not read: {exc}", severity="warning")
        finally:
            self.older_loading = False

    async def action_reload(self) -> None:
        await self.reload()

    async def action_expand(self) -> None:
        self.expanded = not self.expanded
        for widget in self.query(".kind-tool_result, .kind-reconciliation"):
            if isinstance(widget, Static):
                widget.update(item_lines(widget.item, None, self.expanded))  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ showing it
    def show_status(self) -> None:
        snap = self.state.snap
        if not snap:
            self.query_one("#status", Static).update(f"session {self.session_id} | {self.link.connection}")
            return
        mode = f"send: {self.delivery}"
        self.query_one("#status", Static).update(status_line(snap, self.link.connection, mode))
        self.query_one("#actions", Static).update(actions_line(snap.get("actions") or {}, snap.get("work"),
                                                               snap.get("goal")))

    def show_draft(self) -> None:
        text = "\n".join(f"assistant (streaming): {t}" for t in self.state.drafts.values() if t)
        self.query_one("#draft", Static).update(text)

    def show_outbox(self) -> None:
        lines = [f"> you ({m.state}): {m.text}" for m in self.outbox.messages]
        self.query_one("#outbox", Static).update("\n".join(lines))
        transcript = self.query_one(Transcript)
        self.call_after_refresh(lambda: transcript.scroll_end(animate=False))

    # ------------------------------------------------------------------ approvals
    def ask_pending(self) -> None:
        """Show the oldest pending approval of this session; close a modal whose approval was answered
        elsewhere or withdrawn."""
        pending = [a for a in self.state.snap.get("approvals") or [] if a.get("state") == "pending"]
        ids = {str(a["approval_id"]) for a in pending}
        if self.asking is not None:
            if self.asking.approval_id not in ids and self.app.screen is self.asking and not self.asking.answered:
                self.asking.close("gone")
            return
        waiting = [a for a in pending if str(a["approval_id"]) not in self.declined]
        if not waiting or self.app.screen is not self:  # not over another screen (is_current counts the one below)
            return
        self.asking = ApprovalScreen(self.link, waiting[0])
        self.app.push_screen(self.asking, self._answered)

    def _answered(self, outcome: str | None) -> None:
        if self.asking is not None and outcome == "later":
            self.declined.add(self.asking.approval_id)
        self.asking = None
        self.run_worker(self.reload(), group="reload")

    def on_screen_resume(self) -> None:
        if self.state.snap:
            self.ask_pending()

    # ------------------------------------------------------------------ acting
    @on(Input.Submitted, "#composer")
    async def _submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        event.input.value = ""
        if text.startswith("/goal"):
            objective = text.removeprefix("/goal").strip()
            if not objective:
                await self.action_goal_panel()
                return
            await self.create_goal(objective)
            return
        self.outbox.add(text, self.delivery)

    async def create_goal(self, objective: str) -> None:
        body = {"session_id": self.session_id, "objective": objective, "client_request_id": "tui-" + uuid.uuid4().hex}
        try:
            await self.link.send("POST", "/goals", body)
        except GoalsError as exc:
            self.app.notify(f"Goal not started ({exc.status}): {exc.message}", severity="warning", timeout=6)
            return
        except Exception as exc:
            self.app.notify(f"Goal not started: server unreachable ({type(exc).__name__})", severity="warning")
            return
        self.app.notify(f"Goal started: {objective}")
        await self.reload()

    def action_toggle_delivery(self) -> None:
        self.delivery = "steer" if self.delivery == "queue" else "queue"
        self.show_status()
        self.app.notify(f"While a turn runs, messages now {'steer it at its next step' if self.delivery == 'steer' else 'wait for it to end (queue)'}.")

    async def action_session_action(self, action: str) -> None:
        snap = self.state.snap
        actions, work = snap.get("actions") or {}, snap.get("work")
        label, flag = next((lbl, f) for a, _, lbl, f in SESSION_ACTIONS if a == action)
        if not actions.get(flag):
            self.app.notify(f"{label} is not available now: {not_allowed(actions, work)}", severity="warning", timeout=6)
            return
        body: dict[str, Any] = {"action": action}
        if work:
            body["expected_control_version"] = work.get("control_version")
        await self._post(label, f"/sessions/{self.session_id}/actions", body)

    async def action_goal_action(self, action: str) -> None:
        goal = self.state.snap.get("goal")
        label, flag = next((lbl, f) for a, _, lbl, f in GOAL_ACTIONS if a == action)
        if not goal:
            self.app.notify(f"{label}: this session has no current Goal (start one with /goal <objective>).",
                            severity="warning")
            return
        actions = goal.get("actions") or {}
        if not actions.get(flag):
            why = goal.get("reason") or not_allowed(actions, None)
            self.app.notify(f"{label} is not available now: {why}", severity="warning", timeout=6)
            return
        await self._post(label, f"/goals/{goal['goal_id']}/actions", {"action": action, "expected_revision": goal["revision"]})

    async def _post(self, label: str, path: str, body: dict[str, Any]) -> None:
        try:
            await self.link.send("POST", path, body)
        except GoalsError as exc:
            prefix = "Conflict (409)" if exc.status == 409 else f"{label} refused ({exc.status})"
            self.app.notify(f"{prefix}: {exc.message}", severity="warning", timeout=6)
        except Exception as exc:
            self.app.notify(f"{label} not sent: server unreachable ({type(exc).__name__})", severity="warning")
        else:
            self.app.notify(f"{label}: done")
        await self.reload()

    async def action_goal_panel(self) -> None:
        from jupyter_goals.clients.tui.panels import GoalScreen

        await self.app.push_screen(GoalScreen(self.link, self.session_id))

    async def action_permissions(self) -> None:
        from jupyter_goals.clients.tui.permissions import PermissionsScreen

        await self.app.push_screen(PermissionsScreen(self.link, self.session_id))

    async def action_models(self) -> None:
        from jupyter_goals.clients.tui.permissions import ModelScreen

        model = str((self.state.snap.get("session") or {}).get("model") or "")
        await self.app.push_screen(ModelScreen(self.link, self.session_id, model))

    def later(self, action: Callable[..., Awaitable[None]], *args: Any) -> Callable[[], None]:
        """A palette command: run the action as a worker of this screen."""
        def run() -> None:
            self.run_worker(action(*args), group="palette")

        return run

    def action_sessions(self) -> None:
        self.app.action_sessions()  # type: ignore[attr-defined]
