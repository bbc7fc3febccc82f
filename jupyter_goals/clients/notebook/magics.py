"""``%goal`` / ``%%goal`` / ``%chat``: Goals and chat from a notebook (``%load_ext jupyter_goals``).

    %goal Write report.md and make the check pass     # a Goal in this notebook's session
    %%goal Write report.md and make the check pass    # requirements in the cell body, one per line
    report.md explains the results                    #   plain text: judged by the acceptance review
    file_exists: report.md
    file_digest: data.csv 3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b
    command: python check.py
    %goal status | pause | resume | verify | end | history
    %goal wait                                        # until the Goal stops working or asks for approval
    %chat What is in data.csv?                        # a message; its answer shows as a live card
    %chat --wait Summarise it                         #   ... and wait until the answer is there
    %goal_display widget | mime                       # how %goal shows Goals (default: mime)

A notebook's session is kept by the server, looked up by the notebook's path (``PUT /notebook-session``;
the kernel reads the path from the server's sessions, else ``JPY_SESSION_NAME``), so a restarted
kernel finds the same chat and Goal. A kernel that cannot know its notebook (``jupyter nbconvert
--execute``, papermill, nbclient) uses the notebook named by ``JUPYTER_GOALS_NOTEBOOK``, else the session
of its working directory, shared by every such kernel in that folder, run after run
(``GoalsClient.kernel_notebook_path``); a terminal IPython, or a kernel working outside the server
root, keeps a session of its own. Options before the objective: ``--session=<id>`` (bind this
notebook to that session), ``--new`` (a new session for this notebook), ``--bypass`` (a new session
whose tool calls need no approval), ``--model=<model>``.

Display: ``mime`` (default) shows id-only MIME outputs (``cards.py``) that the labextension renders
live, even after the kernel is gone; ``widget`` shows ipywidgets (``widgets.py``) for frontends
without the labextension. The default comes from ``JUPYTER_GOALS_DISPLAY``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import httpx
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.display import display

from jupyter_goals.clients.notebook import cards
from jupyter_goals.clients.rest import GoalsClient, GoalsError, ServerNotFound

ACTIONS = ("pause", "resume", "verify", "end")
DISPLAY_MODES = ("mime", "widget")
SETTLED = ("done", "waiting", "paused", "failed", "cancelled")  # %chat --wait stops at these phases
_OPTIONS = ("--session=", "--model=", "--new", "--bypass")


def parse_requirements(body: str) -> list[dict[str, Any]]:
    """One requirement per line: ``command: …``, ``file_exists: path``, ``file_digest: path sha256``,
    ``semantic: …`` or plain text (semantic). Blank lines and ``#`` comments are skipped."""
    reqs: list[dict[str, Any]] = []
    for number, raw in enumerate(body.splitlines(), 1):
        line = raw.strip()
        if line.startswith(("- ", "* ")):
            line = line[2:].strip()
        if not line or line.startswith("#"):
            continue
        kind, sep, rest = line.partition(":")
        kind, rest = kind.strip(), rest.strip()
        if not sep or kind not in ("command", "file_exists", "file_digest", "semantic"):
            reqs.append({"text": line, "kind": "semantic"})
        elif not rest:
            raise UsageError(f"requirement line {number}: {kind!r} needs a value")
        elif kind == "command":
            reqs.append({"text": f"`{rest}` succeeds", "kind": "command", "command": rest})
        elif kind == "file_exists":
            reqs.append({"text": f"{rest} exists", "kind": "file_exists", "path": rest})
        elif kind == "file_digest":
            parts = rest.split()
            if len(parts) != 2:
                raise UsageError(f"requirement line {number}: file_digest needs '<path> <sha256>'")
            reqs.append({"text": f"{parts[0]} has sha256 {parts[1][:12]}…", "kind": "file_digest",
                         "path": parts[0], "sha256": parts[1]})
        else:
            reqs.append({"text": rest, "kind": "semantic"})
    return reqs


def goal_request_id(session_id: str, objective: str, requirements: list[dict[str, Any]] | None,
                    last_ended_goal: str | None) -> str:
    """The ``client_request_id`` of a ``%goal`` / ``%%goal`` run: the session, the objective and the
    requirements, and the newest Goal of the session that had ended when the cell ran. Running the cell
    again after a dropped connection (or a restarted kernel) sends the same id, so the server answers the
    Goal the first run created instead of a 409 or a second Goal; once that Goal has ended, the same cell
    starts a new one (the newest ended Goal is then another); a different objective while a Goal runs is
    the server's 409."""
    key = json.dumps([session_id, objective, requirements or [], last_ended_goal], sort_keys=True)
    return "nb-goal-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def split_options(line: str) -> tuple[dict[str, str], str]:
    """Leading ``--name[=value]`` options, then the rest of the line verbatim (quotes and all)."""
    options: dict[str, str] = {}
    rest = line.strip()
    while rest.startswith("--"):
        token, _, tail = rest.partition(" ")
        if not token.startswith(_OPTIONS):
            raise UsageError(f"unknown option {token!r}; known: --session=<id>, --new, --bypass, --model=<model>")
        name, _, value = token[2:].partition("=")
        options[name] = value
        rest = tail.strip()
    return options, rest


@magics_class
class GoalMagics(Magics):
    """Caches the notebook's session and Goal ids; the server holds everything, so a new kernel
    finds them again through the notebook's path."""

    def __init__(self, shell: Any, client_factory: Callable[[], GoalsClient] = GoalsClient) -> None:
        super().__init__(shell)
        self._client_factory = client_factory
        self._client: GoalsClient | None = None
        self.session_id: str | None = None
        self.goal_id: str | None = None
        self.notebook_path: str | None = None
        self.display_mode = os.environ.get("JUPYTER_GOALS_DISPLAY", "mime").strip().lower() or "mime"
        if self.display_mode not in DISPLAY_MODES:
            self.display_mode = "mime"

    @property
    def client(self) -> GoalsClient:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    @line_cell_magic
    def goal(self, line: str, cell: str | None = None) -> None:
        """Start a Goal (``%goal <objective>``, requirements in a ``%%goal`` cell body) or act on the
        current one: ``%goal status | pause | resume | verify | end | history``."""
        self._guard(lambda: self._run(line, cell))

    @line_magic
    def chat(self, line: str) -> None:
        """``%chat [--wait] <text>``: send a message to this notebook's session; its answer is a live card."""
        self._guard(lambda: self._chat(line))

    @line_magic
    def goal_display(self, line: str) -> None:
        """``%goal_display mime|widget``: MIME cards (live in JupyterLab, durable) or ipywidgets."""
        mode = line.strip().lower()
        if mode not in DISPLAY_MODES:
            raise UsageError(f"usage: %goal_display mime|widget (now: {self.display_mode})")
        self.display_mode = mode
        print(f"Goals display: {mode}")

    def _guard(self, run: Callable[[], None]) -> None:
        try:
            run()
        except GoalsError as exc:
            raise UsageError(_explain(exc)) from None
        except ServerNotFound as exc:
            raise UsageError(str(exc)) from None
        except httpx.HTTPError as exc:
            url = str(self.client.http.base_url)
            raise UsageError(f"cannot reach the jupyter_goals server at {url}: {exc}") from None

    def _run(self, line: str, cell: str | None) -> None:
        options, rest = split_options(line)
        word = rest.split(maxsplit=1)[0] if rest else ""
        if cell is None and rest == word and word in (*ACTIONS, "status", "history", "wait"):
            if word == "status":
                self._status()
            elif word == "wait":
                self._wait()
            elif word == "history":
                self._history()
            else:
                self._act(word)
            return
        if not rest:
            raise UsageError("usage: %goal <objective>, or %goal status|pause|resume|verify|end|history|wait")
        requirements = parse_requirements(cell) if cell else None
        self._start(rest, requirements, options)

    # ------------------------------------------------------------------ the notebook's session
    def _session(self, options: dict[str, str] | None = None, title: str = "") -> str:
        """This notebook's session: bound on the server to this kernel's key (the notebook's path, else its
        folder); a terminal IPython, or a kernel outside the server root, gets one of its own."""
        options = options or {}
        if self.notebook_path is None:
            self.notebook_path = self.client.kernel_notebook_path() or ""
        if options.get("session"):
            self.session_id, self.goal_id = options["session"], None
            self._bound(self.session_id)
            return self.session_id
        create: dict[str, Any] = {}
        if "bypass" in options:
            create["permissions"] = {"mode": "bypass"}
        if options.get("model"):
            create["model"] = options["model"]
        if "new" in options or create:
            # the agent works where this kernel runs: the notebook's folder for a kernel of Jupyter's
            sid = self.client.create_session(title=title or "notebook", cwd=os.getcwd(), **create)["session_id"]
            self.session_id, self.goal_id = sid, None
            self._bound(sid)
            return sid
        if self.session_id is None:
            self.session_id = self._bound() or self.client.create_session(
                title=title or "IPython", cwd=os.getcwd())["session_id"]
        return self.session_id

    def _bound(self, session_id: str | None = None) -> str | None:
        """The session bound to this kernel's key (``session_id`` is bound there first); None when there is
        no key the server takes: none at all, or a working directory outside its root (then forgotten)."""
        if not self.notebook_path:
            return None
        try:
            return str(self.client.notebook_session(self.notebook_path, session_id=session_id)["session_id"])
        except GoalsError as exc:
            if exc.status != 400 or not self.notebook_path.endswith(("/", os.sep)):
                raise
            self.notebook_path = ""  # a folder outside the server root has no session: keep one of our own
            return None

    # ------------------------------------------------------------------ commands
    def _start(self, objective: str, requirements: list[dict[str, Any]] | None, options: dict[str, str]) -> None:
        session_id = self._session(options, f"%goal {objective[:60]}")
        ended = [g for g in self.client.goals(session_id) if g.get("ended_at") is not None]
        last = max(ended, key=lambda g: (g["ended_at"], g["goal_id"]))["goal_id"] if ended else None
        key = goal_request_id(session_id, objective, requirements, last)
        goal = self.client.create_goal(session_id, objective, requirements, client_request_id=key)
        self.goal_id = goal["goal_id"]
        self._show_goal(goal)

    def _chat(self, line: str) -> None:
        wait = False
        text = line.strip()
        if text.startswith("--wait"):
            wait, text = True, text[len("--wait"):].strip()
        if not text:
            raise UsageError("usage: %chat [--wait] <message>")
        session_id = self._session()
        sent = self.client.send(session_id, text)
        if self.display_mode == "widget":
            display(self._widgets().ChatWidget(session_id, sent["work_id"], self.client))
            if wait:
                self._wait_answer(session_id, sent["work_id"])
            return
        if not wait:
            display(cards.chat_bundle(session_id, sent["work_id"], sent["message_id"], text), raw=True)
            return
        snap = self._wait_answer(session_id, sent["work_id"])
        items = [i for i in snap["transcript"]["items"] if i.get("work_id") == sent["work_id"]]
        phase = (snap.get("work") or {}).get("phase") if (snap.get("work") or {}).get("work_id") == sent["work_id"] else "done"
        display(cards.chat_bundle(session_id, sent["work_id"], sent["message_id"], text, items, phase), raw=True)

    def _wait_answer(self, session_id: str, work_id: str, timeout: float = 120.0) -> dict[str, Any]:
        """The snapshot once the message's work item stops running (done, waiting for a person, ...);
        behind other work of the session it is not shown as current, so then: once it has answered."""
        deadline = time.monotonic() + timeout
        while True:
            snap = self.client.session(session_id, limit=5000)
            work = snap.get("work") or {}
            if work.get("work_id") == work_id:
                settled = work.get("phase") in SETTLED
            else:
                settled = any(i.get("work_id") == work_id and i["kind"] == "assistant" for i in snap["transcript"]["items"])
            if settled or time.monotonic() > deadline:
                return snap
            time.sleep(0.1)

    def _current(self) -> dict[str, Any]:
        """The Goal this kernel started, else the session's current one, else its newest."""
        if self.goal_id is not None:
            return self.client.goal(self.goal_id)
        session_id = self._session()
        goal = self.client.session(session_id).get("goal")
        if not goal:
            goals = self.client.goals(session_id)
            goal = goals[-1] if goals else None
        if goal:
            self.goal_id = goal["goal_id"]
            return self.client.goal(goal["goal_id"])
        raise UsageError("no Goal yet: start one with %goal <objective>")

    def _status(self) -> None:
        goal = self._current()
        self._show_goal(goal)
        for approval in self.client.approvals("pending"):
            if approval["session_id"] == goal["session_id"]:
                self._show_approval(approval)

    def _wait(self, timeout: float = 300.0) -> None:
        """Until the Goal is no longer active and working (achieved, blocked, paused, ...) or one of its
        session's calls waits for approval; then the cards, as ``%goal status``."""
        goal = self._current()
        deadline = time.monotonic() + timeout
        while goal["state"] == "active" and time.monotonic() < deadline:
            if any(a["session_id"] == goal["session_id"] for a in self.client.approvals("pending")):
                break
            time.sleep(0.2)
            goal = self.client.goal(goal["goal_id"])
        self._status()

    def _act(self, action: str) -> None:
        goal = self._current()
        allowed = goal["actions"]
        if not allowed.get(f"can_{action}"):
            why = goal.get("reason") or allowed.get("reason_code") or ""
            raise UsageError(f"cannot {action} this Goal now: it is {goal['state']} ({goal['phase']})"
                             + (f" - {why}" if why else ""))
        after = self.client.goal_action(goal["goal_id"], action, goal["revision"])
        reason = f" - {after['reason']}" if after.get("reason") else ""
        print(f"Goal {after['state']} ({after['phase']}){reason}")

    def _history(self) -> None:
        session_id = self._current()["session_id"] if self.goal_id else self._session()
        records = self.client.history(session_id)
        if self.display_mode == "widget":
            display(self._widgets().HistoryWidget(session_id, self.client))
            return
        if not records:
            print("No ended Goals in this session yet.")
        for record in records:
            display(cards.history_bundle(record), raw=True)

    # ------------------------------------------------------------------ display
    def _widgets(self) -> Any:
        from jupyter_goals.clients.notebook import widgets  # ipywidgets only when asked for

        return widgets

    def _show_goal(self, goal: dict[str, Any]) -> None:
        if self.display_mode == "widget":
            display(self._widgets().GoalWidget(goal["goal_id"], self.client))
        else:
            display(cards.goal_bundle(goal), raw=True)

    def _show_approval(self, approval: dict[str, Any]) -> None:
        if self.display_mode == "widget":
            display(self._widgets().ApprovalWidget(approval["approval_id"], self.client))
        else:
            display(cards.approval_bundle(approval), raw=True)


def _explain(exc: GoalsError) -> str:
    if exc.status == 409:
        return f"refused (409 conflict): {exc.message} - run %goal status to see the current state"
    if exc.status in (400, 413):  # bad input: refused before anything was saved (server/bodies.py)
        kind = "too large" if exc.status == 413 else "bad input"
        return f"refused ({exc.status} {kind}, {exc.error}): {exc.message}; nothing was saved"
    return f"the server answered {exc.status} {exc.error}: {exc.message}"


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(GoalMagics(ipython))

