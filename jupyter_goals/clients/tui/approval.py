"""The approval modal: the tool, its arguments and the scope of each answer; ``y`` approves, ``n`` denies,
``a`` approves and always allows the tool in this session. A key pressed less than ``GUARD_S`` after the
modal was painted is ignored (said on screen), so typing that was meant for the message box never answers
a question that appeared under it. The decision is the server's: ``POST /approvals/{id}`` (409 = answered
elsewhere or withdrawn, shown and closed)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from jupyter_goals.clients.rest import GoalsError
from jupyter_goals.clients.tui.render import approval_text

if TYPE_CHECKING:
    from jupyter_goals.clients.tui.link import ServerLink

GUARD_S = 0.5


class ApprovalScreen(ModalScreen[str]):
    """One pending approval; dismissed with ``approved`` / ``denied`` / ``always`` / ``gone``."""

    BINDINGS = [
        Binding("y", "decide('approve')", "Approve this call"),
        Binding("n", "decide('deny')", "Deny it"),
        Binding("a", "decide('always')", "Approve, always allow this tool in this session"),
        Binding("escape", "later", "Answer later (it stays pending)"),
    ]
    DEFAULT_CSS = """
    ApprovalScreen { align: center middle; }
    ApprovalScreen > Vertical { width: 76; max-width: 100%; height: auto; max-height: 22; border: heavy $warning;
                                padding: 0 1; background: $surface; }
    ApprovalScreen #approval-body { height: auto; max-height: 14; }
    ApprovalScreen #approval-note { height: auto; }
    """

    def __init__(self, link: ServerLink, approval: dict[str, Any]) -> None:
        super().__init__()
        self.link = link
        self.approval = approval
        self.approval_id = str(approval["approval_id"])
        self.shown_at = float("inf")  # set once painted
        self.busy = False
        self.answered = False

    def close(self, outcome: str) -> None:
        """Dismiss once (an answer and a refresh that saw it answered may both ask)."""
        if not self.answered and self.app.screen is self:
            self.answered = True
            self.dismiss(outcome)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("APPROVAL NEEDED", id="approval-title")
            with VerticalScroll(id="approval-body"):
                yield Static(approval_text(self.approval), markup=False)
            yield Static("y approve | n deny | a always allow in this session | Esc later", id="approval-keys")
            yield Static("", id="approval-note", markup=False)

    def on_mount(self) -> None:
        self.call_after_refresh(self._painted)

    def _painted(self) -> None:
        self.shown_at = time.monotonic()

    def note(self, text: str) -> None:
        self.query_one("#approval-note", Static).update(text)

    async def action_decide(self, decision: str) -> None:
        if time.monotonic() - self.shown_at < GUARD_S:
            self.note("Key ignored: this question appeared less than half a second ago. Press it again.")
            return
        if self.busy:
            return
        self.busy = True
        self.note("Sending your answer…")
        try:
            if decision == "always":
                await self.allow_always()
            await self.link.send("POST", f"/approvals/{self.approval_id}",
                                 {"decision": "deny" if decision == "deny" else "approve"})
        except GoalsError as exc:
            if exc.status == 409 and decision == "always":  # the new rule withdrew it and covers the call
                self.close("always")
                return
            if exc.status == 409:  # answered elsewhere or withdrawn (a permission change asks again if needed)
                self.close("gone")
                self.app.notify(f"Approval no longer pending: {exc.message}", timeout=4)
                return
            self.busy = False
            self.note(f"Not sent ({exc.status} {exc.error}): {exc.message}")
            return
        except Exception as exc:  # the server is unreachable: the approval stays pending there
            self.busy = False
            self.note(f"Not sent (server unreachable: {type(exc).__name__}); press the key again.")
            return
        self.close({"approve": "approved", "deny": "denied", "always": "always"}[decision])

    async def allow_always(self) -> None:
        """A durable allow rule of this session (listed and revocable with the session's permissions)."""
        sid = str(self.approval["session_id"])
        snap = await self.link.get(f"/sessions/{sid}", {"before": "latest", "limit": 1})
        permissions = dict(snap["session"].get("permissions") or {})
        allow = list(permissions.get("allow") or [])
        tool = str(self.approval.get("tool"))
        if tool not in allow:
            permissions["allow"] = [*allow, tool]
            await self.link.send("PATCH", f"/sessions/{sid}", {"permissions": permissions})

    def action_later(self) -> None:
        self.close("later")
