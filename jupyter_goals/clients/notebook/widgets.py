"""ipywidgets views of a Goal, an approval, a session's ended Goals and a ``%chat`` answer, for
frontends without the labextension (VS Code, classic tools): the same state, reason, backend ``actions`` and buttons as the
MIME cards.

Each widget re-reads REST when the event stream (``GET /events?format=json``) names its Goal,
approval or session, on a daemon thread that stops when the widget closes and dies with the kernel.
Widget models live in the kernel, so these views end with it; the id-only MIME outputs (``cards.py``)
are the durable ones.
"""

from __future__ import annotations

import atexit
import datetime
import threading
import weakref
from collections.abc import Callable
from html import escape
from typing import Any

import ipywidgets as w

from jupyter_goals.clients.notebook import cards
from jupyter_goals.clients.rest import GoalsClient, GoalsError

GOAL_BUTTONS = (("pause", "Pause"), ("resume", "Resume"), ("verify", "Verify"), ("end", "End"))
POLL_S = 0.5

_live: weakref.WeakSet[LiveWidget] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:  # kernel shutdown: end every follower thread
    for widget in list(_live):
        widget.stop()


class LiveWidget(w.VBox):  # type: ignore[misc]
    """A view over REST, refreshed by events that concern it (events are only a wake-up)."""

    def __init__(self, client: GoalsClient | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client or GoalsClient()
        self.heading = w.HTML()
        self.detail = w.HTML()
        self.error = w.HTML()
        self.buttons: dict[str, w.Button] = {}
        self.bar = w.HBox()
        self.children: tuple[Any, ...] = (self.heading, self.detail, self.bar, self.error)
        self._actions: dict[str, Callable[[], Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        _live.add(self)

    # -------------------------------------------------------------- following events
    def follow(self) -> LiveWidget:
        """Start the daemon thread that re-reads this view on its events."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"jupyter-goals-{type(self).__name__}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.stop()
        super().close()

    @property
    def following(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        cursor: int | None = None
        failed = False
        while not self._stop.is_set():
            try:
                if cursor is None:
                    cursor = int(self.client.events(after=2**62, limit=1)["last_seq"])
                    self.refresh()
                page = self.client.events(after=cursor, limit=500)
                if failed or page["last_seq"] < cursor:  # reconnected, or a new store: re-read
                    cursor, failed = int(page["last_seq"]), False
                    self.refresh()
                elif page["events"]:
                    cursor = int(page["events"][-1]["seq"])
                    if any(self.concerns(e) for e in page["events"]):
                        self.refresh()
            except Exception as exc:  # the server is away: say so, keep the last view, retry
                failed = True
                self.error.value = f'<span style="color:#a00">State temporarily unavailable: {escape(str(exc))[:200]}</span>'
            self._stop.wait(POLL_S)

    # -------------------------------------------------------------- rendering
    def refresh(self) -> None:
        """Re-read and re-render; a failure is shown, never raised."""
        try:
            self.render()
            self.error.value = ""
        except Exception as exc:
            self.error.value = f'<span style="color:#a00">State temporarily unavailable: {escape(str(exc))[:200]}</span>'

    def render(self) -> None:
        raise NotImplementedError

    def concerns(self, event: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _set_buttons(self, specs: list[tuple[str, str, bool, Callable[[], Any]]], why: str = "") -> None:
        """(action, label, enabled, do) → buttons named by their action, enabled only by the backend."""
        for action, label, enabled, do in specs:
            button = self.buttons.get(action)
            if button is None:
                button = w.Button(description=label)
                button.on_click(lambda _b, a=action: self._click(a))
                self.buttons[action] = button
            button.disabled = not enabled
            button.tooltip = label if enabled else f"Not available now{': ' + why if why else ''}"
            self._actions[action] = do
        self.bar.children = tuple(self.buttons[a] for a, *_ in specs)

    def _click(self, action: str) -> None:
        """Send the action with the version it was shown under; a refusal (409 included) stays shown."""
        try:
            self._actions[action]()
        except GoalsError as exc:
            prefix = "Conflict (409)" if exc.status == 409 else f"Refused ({exc.status})"
            try:
                self.render()
            except Exception:  # the refusal is the news here
                pass
            self.error.value = f'<span style="color:#a00">{prefix}: {escape(exc.message)}</span>'
            return
        self.refresh()


def _phase(text: str) -> str:
    return f"<code>{escape(text)}</code>"


class GoalWidget(LiveWidget):
    """A Goal: objective, state, phase, reason, requirement verdicts, usage; Pause / Resume / Verify / End."""

    def __init__(self, goal_id: str, client: GoalsClient | None = None, follow: bool = True) -> None:
        super().__init__(client)
        self.goal_id = goal_id
        self.goal: dict[str, Any] = {}
        self.session_id: str | None = None
        self.refresh()
        if follow:
            self.follow()

    def render(self) -> None:
        goal = self.goal = self.client.goal(self.goal_id)
        self.session_id = goal["session_id"]
        self.heading.value = (f"<b>Goal</b> {_phase(goal['state'])} {_phase(goal['phase'])} "
                            f"{escape(goal['objective'])}")
        verdicts = {str(v.get("requirement_id")): str(v.get("verdict")) for v in goal.get("verdicts") or []}
        reqs = "".join(f"<li>{_phase(verdicts.get(r['id'], 'unknown'))} {escape(r['text'])}</li>"
                       for r in goal.get("requirements") or [])
        usage = (goal.get("usage") or {}).get("display") or ""
        reason = goal.get("reason") or ""
        self.detail.value = ((f"<div>{escape(reason)}</div>" if reason else "")
                             + (f"<ul>{reqs}</ul>" if reqs else "")
                             + (f'<div style="color:#666">{escape(usage)}</div>' if usage else ""))
        actions = goal.get("actions") or {}
        revision = goal["revision"]

        def send(action: str) -> Callable[[], Any]:
            return lambda: self.client.goal_action(self.goal_id, action, revision)

        self._set_buttons([(a, label, bool(actions.get(f"can_{a}")), send(a)) for a, label in GOAL_BUTTONS],
                          reason or str(actions.get("reason_code") or ""))

    def concerns(self, event: dict[str, Any]) -> bool:
        return bool((event.get("payload") or {}).get("goal_id") == self.goal_id
                    or (self.session_id and event.get("session_id") == self.session_id))


class ApprovalWidget(LiveWidget):
    """One approval: tool, arguments, state, reason; Approve / Deny while it is pending."""

    def __init__(self, approval_id: str, client: GoalsClient | None = None, follow: bool = True) -> None:
        super().__init__(client)
        self.approval_id = approval_id
        self.approval: dict[str, Any] = {}
        self.refresh()
        if follow:
            self.follow()

    def render(self) -> None:
        found = [a for a in self.client.approvals(None) if a["approval_id"] == self.approval_id]
        if not found:
            raise LookupError(f"approval {self.approval_id} not found on this server")
        a = self.approval = found[0]
        self.heading.value = f"<b>Approval</b> {_phase(a['state'])} <code>{escape(str(a['tool']))}</code>"
        self.detail.value = (f"<code>{escape(str(a.get('arguments'))[:300])}</code>"
                             f"<div>{escape(str(a.get('reason') or ''))}</div>")
        pending = a["state"] == "pending"
        self._set_buttons([("approve", "Approve", pending, lambda: self.client.approve(self.approval_id)),
                           ("deny", "Deny", pending, lambda: self.client.deny(self.approval_id))],
                          "" if pending else f"it is {a['state']}")

    def concerns(self, event: dict[str, Any]) -> bool:
        return str(event.get("kind", "")).startswith("approval.") and (
            (event.get("payload") or {}).get("approval_id") == self.approval_id
            or event.get("session_id") == self.approval.get("session_id"))


DETAILS_TOOLTIP = "Show this Goal record (read-only)"


def _failure(what: str, why: str) -> str:
    return f'<span style="color:#a00">{escape(what)}{": " + escape(why[:200]) if why else ""}</span>'


def record_details_html(record: dict[str, Any]) -> str:
    """A terminal Goal record in full, read-only: the Goal as it ended (objective, state, phase, reason,
    requirement verdicts, todo, usage) and where it ended (time, transcript position), with its ids."""
    anchor = record.get("anchor") or {}
    try:
        ended = datetime.datetime.fromtimestamp(float(record["created_at"])).strftime("%Y-%m-%d %H:%M:%S")
    except (KeyError, TypeError, ValueError):
        ended = "?"
    return (f"<div><b>Goal {escape(str(record['state']))} (read-only)</b></div>"
            + cards.goal_html(record["snapshot"])
            + f'<div style="color:#666">Ended {escape(ended)} &middot; transcript position '
              f"{escape(str(anchor.get('seq', '?')))}<br>record <code>{escape(str(record['record_id']))}</code>"
              f" &middot; Goal <code>{escape(str(record['goal_id']))}</code>"
              f" &middot; session <code>{escape(str(record['session_id']))}</code></div>")


class HistoryEntry(w.VBox):  # type: ignore[misc]
    """One ended Goal of a ``HistoryWidget``: state, objective and record id, and a Details button that
    shows the whole record (``GET /history/{record_id}``, what the card's Details dialog shows) under the
    entry; a second press hides it. A failed read is shown there as a message, never raised."""

    def __init__(self, record: dict[str, Any], client: GoalsClient) -> None:
        super().__init__()
        self.client = client
        self.record_id = str(record["record_id"])
        self.summary = w.HTML()
        self.details_button = w.Button(description="Details", tooltip=DETAILS_TOOLTIP)
        self.details_button.on_click(lambda _b: self.toggle())
        self.details = w.HTML(layout=w.Layout(display="none"))
        self.children = (w.HBox((self.summary, self.details_button)), self.details)
        self.show(record)

    def show(self, record: dict[str, Any]) -> None:
        self.summary.value = (f"{_phase(str(record['state']))} "
                              f"{escape(str((record.get('snapshot') or {}).get('objective', '')))}"
                              f' <span style="color:#666">record {escape(self.record_id)}</span>')

    @property
    def opened(self) -> bool:
        return self.details.layout.display != "none"

    def toggle(self) -> None:
        """Open: re-read the record from the server and show it; closed again on the next press."""
        if self.opened:
            self.details.value = ""
            self.details.layout.display = "none"
            self.details_button.tooltip = DETAILS_TOOLTIP
            return
        try:
            self.details.value = record_details_html(self.client.history_record(self.record_id))
        except GoalsError as exc:
            self.details.value = _failure(f"Could not read record {self.record_id} ({exc.status} {exc.error})",
                                          exc.message)
        except Exception as exc:  # no answer (the server is away) or an unreadable one: said, never a traceback
            self.details.value = _failure(f"Could not read record {self.record_id}", f"{type(exc).__name__}: {exc}")
        self.details.layout.display = ""
        self.details_button.tooltip = "Hide this Goal record"


class HistoryWidget(LiveWidget):
    """A session's ended Goals (terminal records, read-only), each with a Details button; grows when a
    Goal of the session ends. Entries are kept by record id, so an open Details survives a re-read."""

    def __init__(self, session_id: str, client: GoalsClient | None = None, follow: bool = True) -> None:
        super().__init__(client)
        self.session_id = session_id
        self.records: list[dict[str, Any]] = []
        self.entries: dict[str, HistoryEntry] = {}
        self.rows = w.VBox()
        self.children = (self.heading, self.detail, self.rows, self.bar, self.error)
        self.refresh()
        if follow:
            self.follow()

    def render(self) -> None:
        self.records = self.client.history(self.session_id)
        self.heading.value = f"<b>Ended Goals</b> ({len(self.records)})"
        self.detail.value = "" if self.records else "<div>No ended Goals in this session yet.</div>"
        for r in self.records:
            entry = self.entries.get(r["record_id"])
            if entry is None:
                self.entries[r["record_id"]] = HistoryEntry(r, self.client)
            else:
                entry.show(r)
        self.rows.children = tuple(self.entries[r["record_id"]] for r in self.records)

    def concerns(self, event: dict[str, Any]) -> bool:
        return event.get("session_id") == self.session_id and str(event.get("kind", "")).startswith("goal.")


CHAT_KINDS = ("user", "assistant", "tool_call", "tool_result", "interruption", "reconciliation", "notice")
#: a person's answers for a call whose outcome is unknown (``check``: a shell command's exit file read again)
SETTLE_BUTTONS = (("ran", "It ran"), ("did_not_run", "It did not run"), ("check", "Check again"))


def unknown_calls(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The result items of calls whose outcome is still unknown (no reconciliation after them)."""
    settled = {i.get("call_id") for i in items if i["kind"] == "reconciliation"}
    return [i for i in items if i["kind"] == "tool_result" and i.get("state") == "unknown"
            and i.get("call_id") and i["call_id"] not in settled]


def settled_note(item: dict[str, Any]) -> str:
    """Who settled a call's unknown outcome and when (a reconciliation's ``meta``), in words; '' otherwise."""
    meta = item.get("meta") or {}
    if item["kind"] != "reconciliation" or not meta.get("by"):
        return ""
    try:
        when = datetime.datetime.fromtimestamp(float(meta["at"])).strftime("%Y-%m-%d %H:%M:%S")
    except (KeyError, TypeError, ValueError):
        when = "?"
    return f" (settled by {meta['by']}, {when})"


class ChatWidget(LiveWidget):
    """One ``%chat`` message and its answer: the transcript items of its work item and, while it is the
    session's current work, its phase and reason; Pause / Resume / End as the backend allows."""

    def __init__(self, session_id: str, work_id: str, client: GoalsClient | None = None, follow: bool = True) -> None:
        super().__init__(client)
        self.session_id, self.work_id = session_id, work_id
        self.items: list[dict[str, Any]] = []
        self.phase = ""
        self.refresh()
        if follow:
            self.follow()

    def render(self) -> None:
        snap = self.client.session(self.session_id, after=0, limit=5000)
        self.items = [i for i in snap["transcript"]["items"] if i.get("work_id") == self.work_id and i["kind"] in CHAT_KINDS]
        work = snap.get("work") or {}
        current = work.get("work_id") == self.work_id
        self.phase = str(work.get("phase")) if current else ("done" if any(i["kind"] == "assistant" for i in self.items)
                                                             else "queued")
        self.heading.value = f"<b>Chat</b> {_phase(self.phase)}"
        rows = []
        for i in self.items:
            who = {"user": "You", "assistant": "Assistant"}.get(i["kind"], str(i.get("tool") or i["kind"]))
            rows.append(f"<div><b>{escape(who)}:</b> {escape(str(i.get('content') or '')[:2000])}"
                        f"{escape(settled_note(i))}</div>")
        reason = str(work.get("reason") or "") if current else ""
        self.detail.value = "".join(rows) + (f"<div>{escape(reason)}</div>" if reason else "")
        actions = (snap.get("actions") or {}) if current else {}
        version = work.get("control_version")

        def send(action: str) -> Callable[[], Any]:
            return lambda: self.client.action(self.session_id, action, version)

        def settle(call_id: str, outcome: str) -> Callable[[], Any]:
            return lambda: self.client.settle(self.session_id, call_id, outcome)

        unsettled = [(str(i["call_id"]), str(i.get("tool") or "")) for i in unknown_calls(self.items)]
        self._set_buttons([(a, label, bool(actions.get(flag)), send(a)) for a, label, flag in
                           (("pause", "Pause", "can_pause"), ("resume", "Resume", "can_resume"),
                            ("stop", "Stop", "can_stop"))]
                          + [(f"settle:{call_id}:{outcome}", label, True, settle(call_id, outcome))
                             for call_id, tool in unsettled for outcome, label in SETTLE_BUTTONS
                             if outcome != "check" or tool == "shell"], reason)
        for call_id, tool in unsettled:  # which call each answer is about
            for outcome, label in SETTLE_BUTTONS:
                if f"settle:{call_id}:{outcome}" in self.buttons:
                    self.buttons[f"settle:{call_id}:{outcome}"].tooltip = f"{label}: {tool} ({call_id}), outcome unknown"

    def concerns(self, event: dict[str, Any]) -> bool:
        return event.get("work_id") == self.work_id
