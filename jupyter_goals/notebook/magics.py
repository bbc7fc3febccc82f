"""``%goal`` / ``%%goal``: start and steer Goals from a notebook (``%load_ext jupyter_goals``).

    %goal Write report.md and make the check pass     # a Goal in this notebook's session
    %%goal Write report.md and make the check pass    # requirements in the cell body, one per line
    report.md explains the results                    #   plain text: judged by the acceptance review
    file_exists: report.md
    file_digest: data.csv 3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b
    command: python check.py
    %goal status | pause | resume | verify | end | history

Options before the objective: ``--session=<id>`` (use that session), ``--new`` (a new session),
``--bypass`` (a new session whose tool calls need no approval), ``--model=<model>``.

Everything goes through ``GoalsClient`` (REST); the outputs are MIME bundles carrying only ids
(``cards.py``), so they stay live after the kernel is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from jupyter_goals.notebook import cards
from jupyter_goals.notebook.client import GoalsClient, GoalsError

ACTIONS = ("pause", "resume", "verify", "end")
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
    """Remembers the session and Goal of this kernel; the server holds everything else."""

    def __init__(self, shell: Any, client_factory: Callable[[], GoalsClient] = GoalsClient) -> None:
        super().__init__(shell)
        self._client_factory = client_factory
        self._client: GoalsClient | None = None
        self.session_id: str | None = None
        self.goal_id: str | None = None

    @property
    def client(self) -> GoalsClient:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    @line_cell_magic
    def goal(self, line: str, cell: str | None = None) -> None:
        """Start a Goal (``%goal <objective>``, requirements in a ``%%goal`` cell body) or act on the
        current one: ``%goal status | pause | resume | verify | end | history``."""
        try:
            self._run(line, cell)
        except GoalsError as exc:
            raise UsageError(_explain(exc)) from None
        except httpx.HTTPError as exc:
            url = str(self.client.http.base_url)
            raise UsageError(f"cannot reach the jupyter_goals server at {url}: {exc}") from None

    def _run(self, line: str, cell: str | None) -> None:
        options, rest = split_options(line)
        word = rest.split(maxsplit=1)[0] if rest else ""
        if cell is None and rest == word and word in (*ACTIONS, "status", "history"):
            if word == "status":
                self._status()
            elif word == "history":
                self._history()
            else:
                self._act(word)
            return
        if not rest:
            raise UsageError("usage: %goal <objective>, or %goal status|pause|resume|verify|end|history")
        requirements = parse_requirements(cell) if cell else None
        self._start(rest, requirements, options)

    # ------------------------------------------------------------------ commands
    def _start(self, objective: str, requirements: list[dict[str, Any]] | None, options: dict[str, str]) -> None:
        if "session" in options:
            self.session_id = options["session"] or None
        if self.session_id is None or "new" in options or "bypass" in options:
            body: dict[str, Any] = {"title": f"%goal {objective[:60]}"}
            if "bypass" in options:
                body["permissions"] = {"mode": "bypass"}
            if options.get("model"):
                body["model"] = options["model"]
            self.session_id = self.client.create_session(**body)["session_id"]
        goal = self.client.create_goal(self.session_id, objective, requirements)
        self.goal_id = goal["goal_id"]
        display(cards.goal_bundle(goal), raw=True)

    def _current(self) -> dict[str, Any]:
        """The Goal this kernel started, else the session's current one."""
        if self.goal_id is not None:
            return self.client.goal(self.goal_id)
        if self.session_id is not None:
            goal = self.client.session(self.session_id).get("goal")
            if goal:
                self.goal_id = goal["goal_id"]
                return self.client.goal(goal["goal_id"])
        raise UsageError("no Goal yet: start one with %goal <objective>")

    def _status(self) -> None:
        goal = self._current()
        display(cards.goal_bundle(goal), raw=True)
        for approval in self.client.approvals("pending"):
            if approval["session_id"] == goal["session_id"]:
                display(cards.approval_bundle(approval), raw=True)

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
        session_id = self.session_id
        if session_id is None:
            session_id = self._current()["session_id"]
        records = self.client.history(session_id)
        if not records:
            print("No ended Goals in this session yet.")
        for record in records:
            display(cards.history_bundle(record), raw=True)


def _explain(exc: GoalsError) -> str:
    if exc.status == 409:
        return f"refused (409 conflict): {exc.message} - run %goal status to see the current state"
    return f"the server answered {exc.status} {exc.error}: {exc.message}"


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(GoalMagics(ipython))

