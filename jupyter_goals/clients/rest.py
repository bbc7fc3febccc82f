"""GoalsClient: the Python Workflow API over REST. Knows nothing of the server's code.

Finding the server (``find_server``), first match wins: the ``url``/``token`` arguments; the
``JUPYTER_GOALS_SERVER_URL`` / ``JUPYTER_GOALS_TOKEN`` variables (the extension sets them for kernels
its server starts); jupyter_server's runtime files (``jpserver-*.json``) of a running server, matched
to this kernel (its parent process ``JPY_PARENT_PID``, else the server whose root holds the notebook
``JPY_SESSION_NAME`` or the working directory, else the only one running); otherwise
``ServerNotFound`` naming everything tried. There is no default URL.

Which notebook (``GoalsClient.kernel_notebook_path``: the key of this kernel's session, kept by the
server), first match wins: the ``notebook`` argument; the kernel's path in the server's own sessions
(which follow renames); ``JPY_SESSION_NAME`` (Jupyter sets it for the kernels it starts); VS Code's
``__vsc_ipynb_file__``; ``JUPYTER_GOALS_NOTEBOOK``; else, in a kernel that cannot know its notebook
(``jupyter nbconvert --execute``, papermill, nbclient), its working directory with a trailing ``/``:
every such kernel working in one folder shares that folder's session, run after run. None outside a
kernel (a script, a terminal IPython).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx


class GoalsError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(f"{status} {error}: {message}")
        self.status, self.error, self.message = status, error, message


def _check(r: httpx.Response) -> Any:
    if r.status_code >= 400:
        try:
            body = r.json()
        except ValueError:
            body = {"error": "http_error", "message": r.text[:200]}
        raise GoalsError(r.status_code, body.get("error", "http_error"), body.get("message", ""))
    return r.json()


NO_NOTEBOOK = (
    "notebook_session() needs the notebook's path (relative to the server root, or absolute inside it) and got "
    "none: outside a Jupyter kernel (a script, a terminal) kernel_notebook_path() has no notebook to name. Pass "
    "the path, create the client as GoalsClient(notebook='folder/name.ipynb') or set JUPYTER_GOALS_NOTEBOOK to "
    "it, or use create_session() for a session of your own.")
OUTSIDE_ROOT = (
    "A kernel that cannot know its notebook (nbconvert --execute, papermill, nbclient) uses the session of its "
    "working directory, which must be inside the server root: run it in a folder under the root, or name the "
    "notebook with GoalsClient(notebook='folder/name.ipynb') or JUPYTER_GOALS_NOTEBOOK.")


class ServerNotFound(RuntimeError):
    """No jupyter_goals server could be found; the message names every place looked at."""


@dataclass(frozen=True)
class ServerAddress:
    url: str  # the Jupyter server's base URL, ending in "/"
    token: str
    found_by: str  # which rule of ``find_server`` chose it


def _running_servers() -> list[dict[str, Any]]:
    from jupyter_server.serverapp import list_running_servers  # heavy import: only when needed

    return [dict(info) for info in list_running_servers()]


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([os.path.abspath(root), os.path.abspath(path)]) == os.path.abspath(root)
    except ValueError:
        return False


def find_server(url: str | None = None, token: str | None = None) -> ServerAddress:
    """The server this process should talk to (the module docstring gives the order)."""
    env_token = os.environ.get("JUPYTER_GOALS_TOKEN", "")
    if url:
        return ServerAddress(_slash(url), token if token is not None else env_token, "argument")
    env_url = os.environ.get("JUPYTER_GOALS_SERVER_URL")
    if env_url:
        return ServerAddress(_slash(env_url), token if token is not None else env_token, "JUPYTER_GOALS_SERVER_URL")
    from jupyter_core.paths import jupyter_runtime_dir

    runtime_dir = jupyter_runtime_dir()
    try:
        servers = _running_servers()
    except Exception as exc:  # jupyter_server missing or unreadable runtime files: say so below
        servers, problem = [], f" (could not read them: {exc})"
    else:
        problem = ""
    parent = os.environ.get("JPY_PARENT_PID", "")
    notebook = os.environ.get("JPY_SESSION_NAME", "")
    rules: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
        ("JPY_PARENT_PID", lambda s: bool(parent) and str(s.get("pid")) == parent),
        ("the notebook's folder", lambda s: os.path.isabs(notebook) and _inside(notebook, str(s.get("root_dir", "")))),
        ("the working directory", lambda s: _inside(os.getcwd(), str(s.get("root_dir", "")))),
    ]
    for rule, matches in rules:
        hits = sorted((s for s in servers if matches(s)), key=lambda s: -len(str(s.get("root_dir", ""))))
        if hits:
            return _address(hits[0], f"runtime file ({rule})")
    if len(servers) == 1:
        return _address(servers[0], "runtime file (the only running server)")
    found = f"{len(servers)} running servers, none matching this kernel" if servers else "no running server"
    raise ServerNotFound(
        "cannot find the jupyter_goals server. Tried: the url/token arguments (none given); the "
        "JUPYTER_GOALS_SERVER_URL / JUPYTER_GOALS_TOKEN environment variables (not set); jupyter_server's "
        f"runtime files in {runtime_dir} ({found}{problem}; matched by JPY_PARENT_PID={parent or 'unset'}, "
        f"JPY_SESSION_NAME={notebook or 'unset'}, working directory {os.getcwd()}). Point it at a server with "
        "GoalsClient(url, token), or set JUPYTER_GOALS_SERVER_URL and JUPYTER_GOALS_TOKEN (the server's URL and "
        "token, as printed by `jupyter server list`).")


def _address(info: dict[str, Any], found_by: str) -> ServerAddress:
    return ServerAddress(_slash(str(info["url"])), str(info.get("token") or ""), found_by)


def _slash(url: str) -> str:
    return url.rstrip("/") + "/"


IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT"})  # repeating one changes nothing more


class StartingRetry(httpx.HTTPTransport):
    """Retries, for up to ``retry_s``, a request that no server processed: the connection was refused
    (the server is restarting) or the answer was 503 ``starting`` (schema check, recovery). Safe for
    every method, since nothing was done. A connection lost mid-request (the server died) is retried
    only for idempotent methods; any other answer or error is returned at once."""

    def __init__(self, retry_s: float) -> None:
        super().__init__()
        self.retry_s = retry_s

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = time.monotonic() + self.retry_s
        delay = 0.1
        while True:
            try:
                response = super().handle_request(request)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                lost = not isinstance(exc, httpx.ConnectError)
                if (lost and request.method not in IDEMPOTENT) or time.monotonic() + delay > deadline:
                    raise
            else:
                if response.status_code != 503 or time.monotonic() + delay > deadline:
                    return response
                response.read()
                try:
                    starting = response.json().get("error") == "starting"
                except ValueError:
                    starting = False
                if not starting:
                    return response
                response.close()
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class GoalsClient:
    """``retry_s``: how long a request waits for a server that is restarting or still starting."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0,
                 retry_s: float = 10.0, notebook: str | None = None) -> None:
        self.notebook = notebook  # the notebook this client speaks for, when its kernel cannot know it
        self.address = find_server(url, token)
        self.base_url = self.address.url
        headers = {"Authorization": f"token {self.address.token}"} if self.address.token else {}
        self.http = httpx.Client(base_url=self.base_url + "api/goals", headers=headers, timeout=timeout,
                                 transport=StartingRetry(retry_s))

    def close(self) -> None:
        self.http.close()

    def notebook_session(self, path: str | None, session_id: str | None = None, **create: Any) -> dict[str, Any]:
        """The durable session of the notebook at ``path`` (an API path, or the absolute path a kernel
        gets in ``JPY_SESSION_NAME``), created on first use with ``create`` (``title``, ``model``,
        ``permissions``); ``session_id`` rebinds the notebook to that session. A path ending in ``/``
        names a folder: the session of the kernels that work there without knowing their notebook
        (``kernel_notebook_path``). No path (None, blank) is refused here with what to do: ValueError.
        → ``{session_id, path, created_at, updated_at}``."""
        if path is None or not path.strip():
            raise ValueError(NO_NOTEBOOK)
        body: dict[str, Any] = {"path": path, **create}
        if session_id is not None:
            body["session_id"] = session_id
        try:
            return dict(_check(self.http.put("/notebook-session", json=body)))
        except GoalsError as exc:
            if exc.status != 400 or not path.endswith(("/", os.sep)):
                raise
            raise GoalsError(exc.status, exc.error, f"{exc.message}. {OUTSIDE_ROOT}") from None

    def kernel_notebook_path(self) -> str | None:
        """The key of this kernel's notebook session (the module docstring gives the order): the
        notebook's path when the kernel can know it or is told it, else its working directory ending
        in ``/``; None outside a kernel. Stable across kernel restarts and re-runs."""
        if self.notebook:
            return self.notebook
        connection_file = _connection_file()
        kernel_id = _kernel_id(connection_file)
        if kernel_id:
            try:
                r = self.http.get(self.base_url + "api/sessions")
                for session in r.json() if r.status_code == 200 else []:
                    if (session.get("kernel") or {}).get("id") == kernel_id and session.get("path"):
                        return str(session["path"])
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
        told = os.environ.get("JPY_SESSION_NAME") or _vscode_notebook() or os.environ.get("JUPYTER_GOALS_NOTEBOOK")
        if told:
            return told
        return os.path.join(os.getcwd(), "") if connection_file else None

    def health(self) -> dict[str, Any]:
        return dict(_check(self.http.get("/health")))

    def create_session(self, **body: Any) -> dict[str, Any]:
        return dict(_check(self.http.post("/sessions", json=body)))

    def sessions(self, state: str | None = None, q: str | None = None) -> list[dict[str, Any]]:
        """Every session, newest activity first (all ``GET /sessions`` pages; ``state`` / ``q`` filter)."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 500, **({"state": state} if state else {}), **({"q": q} if q else {})}
        while True:
            page = _check(self.http.get("/sessions", params=params))
            out += page["sessions"]
            if not page.get("next_cursor"):
                return out
            params["cursor"] = page["next_cursor"]

    def session(self, session_id: str, **page: Any) -> dict[str, Any]:
        """The session snapshot; ``page`` = query arguments such as ``after``/``limit``."""
        return dict(_check(self.http.get(f"/sessions/{session_id}", params=page)))

    def send(self, session_id: str, text: str, client_request_id: str | None = None, delivery: str = "queue") -> dict[str, Any]:
        body = {"text": text, "client_request_id": client_request_id or uuid.uuid4().hex, "delivery": delivery}
        return dict(_check(self.http.post(f"/sessions/{session_id}/messages", json=body)))

    def action(self, session_id: str, action: str, expected_control_version: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"action": action}
        if expected_control_version is not None:
            body["expected_control_version"] = expected_control_version
        return dict(_check(self.http.post(f"/sessions/{session_id}/actions", json=body)))

    def settle(self, session_id: str, effect_id: str, outcome: str) -> dict[str, Any]:
        """Say whether a call whose outcome is unknown ran: ``outcome`` ``ran`` / ``did_not_run``, or ``check``
        (read its evidence again: a shell command's exit file on the server's host; 409 ``GoalsError`` when
        there is none). ``effect_id``: its effect id or call id. A durable reconciliation (who, when); the
        approvals asked only because of it are withdrawn (``withdrawn``), so once no unknown outcome is left
        open the work's later writes follow the chat's permissions again. → ``{effect_id, call_id, tool,
        state: reconciled, outcome, settled_by, settled_at, withdrawn}``."""
        body = {"action": "settle", "effect_id": effect_id, "outcome": outcome}
        return dict(_check(self.http.post(f"/sessions/{session_id}/actions", json=body)))

    def set_permissions(self, session_id: str, permissions: dict[str, Any],
                        expected_control_version: int | None = None) -> dict[str, Any]:
        """Change a session's permissions (``{mode: ask|bypass, allow: [tool | {tool, path}]}``).
        Pending approvals of its unfinished work are invalidated and asked again if still needed."""
        body: dict[str, Any] = {"permissions": permissions}
        if expected_control_version is not None:
            body["expected_control_version"] = expected_control_version
        return dict(_check(self.http.patch(f"/sessions/{session_id}", json=body)))

    def update_session(self, session_id: str, *, title: str | None = None, model: str | None = None) -> dict[str, Any]:
        """Rename the session and/or change its model (a name of ``GET /models`` or ``provider:model``; ``""``:
        the server's default); ``None`` leaves it as it is. A new model applies from the session's next turn.
        Writes the event ``session.updated``. → the session ``{session_id, title, cwd, model, permissions,
        created_at, updated_at}``; an unknown model is a 400 naming it (``GoalsError``)."""
        body = {k: v for k, v in (("title", title), ("model", model)) if v is not None}
        if not body:  # nothing to change: the server refuses an empty PATCH, so only read it
            return dict(self.session(session_id, limit=1)["session"])
        return dict(_check(self.http.patch(f"/sessions/{session_id}", json=body))["session"])

    def approve(self, approval_id: str) -> dict[str, Any]:
        return self.decide(approval_id, "approve")

    def deny(self, approval_id: str) -> dict[str, Any]:
        return self.decide(approval_id, "deny")

    def stop_all(self) -> dict[str, Any]:
        return dict(_check(self.http.post("/actions", json={"action": "stop_all"})))

    def approvals(self, state: str | None = "pending") -> list[dict[str, Any]]:
        return list(_check(self.http.get("/approvals", params={"state": state} if state else {}))["approvals"])

    def attention(self) -> dict[str, Any]:
        """Everything across sessions that waits for a person (``GET /attention``): ``{items, count}``, each
        item with its ``kind``, ``action``, session, reason and the ids the action needs."""
        return dict(_check(self.http.get("/attention")))

    def decide(self, approval_id: str, decision: str) -> dict[str, Any]:
        return dict(_check(self.http.post(f"/approvals/{approval_id}", json={"decision": decision})))

    def events(self, after: int = 0, limit: int = 500) -> dict[str, Any]:
        return dict(_check(self.http.get("/events", params={"after": after, "format": "json", "limit": limit})))

    def usage(self, session_id: str | None = None, goal_id: str | None = None) -> dict[str, Any]:
        """Known cost and tokens, what is unknown, the estimate and active time (one of the two ids)."""
        params = {"session_id": session_id} if session_id else {"goal_id": goal_id}
        return dict(_check(self.http.get("/usage", params=params)))

    # ------------------------------------------------------------------ goals
    def create_goal(self, session_id: str, objective: str, requirements: list[dict[str, Any]] | None = None,
                    budget: dict[str, Any] | None = None, client_request_id: str | None = None) -> dict[str, Any]:
        """Start a Goal in a session. Requirements are ``{id?, text, kind: semantic | command | file_exists |
        file_digest, command?, path?, sha256?}``; without them the server extracts them from the objective.
        A ``client_request_id`` (up to 200 characters) makes it safe to send again: the same id in the same
        session answers the Goal it created instead of a 409, and creates nothing."""
        body: dict[str, Any] = {"session_id": session_id, "objective": objective}
        if requirements is not None:
            body["requirements"] = requirements
        if budget is not None:
            body["budget"] = budget
        if client_request_id is not None:
            body["client_request_id"] = client_request_id
        return dict(_check(self.http.post("/goals", json=body)))

    def goal(self, goal_id: str) -> dict[str, Any]:
        return dict(_check(self.http.get(f"/goals/{goal_id}")))

    def goals(self, session_id: str | None = None) -> list[dict[str, Any]]:
        return list(_check(self.http.get("/goals", params={"session_id": session_id} if session_id else {}))["goals"])

    def update_goal(self, goal_id: str, expected_revision: int, **changes: Any) -> dict[str, Any]:
        """``objective`` / ``requirements`` / ``budget`` / ``reason``; dropping a requirement needs a reason."""
        return dict(_check(self.http.patch(f"/goals/{goal_id}", json={"expected_revision": expected_revision, **changes})))

    def goal_action(self, goal_id: str, action: str, expected_revision: int) -> dict[str, Any]:
        """``pause`` / ``resume`` / ``verify`` / ``end``; 409 when the revision changed meanwhile."""
        body = {"action": action, "expected_revision": expected_revision}
        return dict(_check(self.http.post(f"/goals/{goal_id}/actions", json=body)))

    def history(self, session_id: str) -> list[dict[str, Any]]:
        """Terminal Goal records of a session (read-only snapshots with their transcript anchors)."""
        return list(_check(self.http.get(f"/sessions/{session_id}/history"))["records"])

    def history_record(self, record_id: str) -> dict[str, Any]:
        return dict(_check(self.http.get(f"/history/{record_id}")))

    # ------------------------------------------------------------------ jobs
    def create_job(self, session_id: str, input: str, goal_id: str | None = None,
                   client_request_id: str | None = None) -> dict[str, Any]:
        """Start a background Job under ``session_id``'s permissions and the shared quota; it is attributed
        to ``goal_id`` (else the session's active Goal). → ``{job_id, work_id, session_id}``; a repeated
        ``client_request_id`` returns the same Job."""
        body: dict[str, Any] = {"session_id": session_id, "input": input}
        if goal_id is not None:
            body["goal_id"] = goal_id
        if client_request_id is not None:
            body["client_request_id"] = client_request_id
        return dict(_check(self.http.post("/jobs", json=body)))

    def job(self, job_id: str) -> dict[str, Any]:
        """The Job's work state, phase, reason, actions, saved Goal identity and (once done) its result."""
        return dict(_check(self.http.get(f"/jobs/{job_id}")))

    def wait_job(self, job_id: str, phases: tuple[str, ...] = ("done",), timeout: float = 60.0) -> dict[str, Any]:
        """Poll the Job until its work reaches one of ``phases``."""
        return _poll(lambda: self.job(job_id), lambda job: job["work"]["phase"] in phases, timeout,
                     lambda job: f"job {job_id} did not reach {phases}: {job.get('work')}")

    def wait_goal(self, goal_id: str, states: tuple[str, ...] = ("achieved",), timeout: float = 60.0) -> dict[str, Any]:
        """Poll the Goal until it reaches one of ``states``."""
        return _poll(lambda: self.goal(goal_id), lambda goal: goal["state"] in states, timeout,
                     lambda goal: f"goal {goal_id} did not reach {states}: {goal.get('state')} {goal.get('phase')}"
                                  f" {goal.get('reason_code')}")

    def wait(self, session_id: str, phases: tuple[str, ...] = ("done",), timeout: float = 60.0) -> dict[str, Any]:
        """Poll the snapshot until the current work reaches one of ``phases``."""
        return _poll(lambda: self.session(session_id), lambda snap: bool(snap["work"]) and snap["work"]["phase"] in phases,
                     timeout, lambda snap: f"session {session_id} did not reach {phases}: {snap.get('work')}")


def _poll(read: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool], timeout: float,
          failure: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """Read every 0.1 s until ``done``. A server that is restarting (connection refused, 503) is waited
    for like any other state, so a wait spans a server crash and restart."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            last = read()
        except httpx.TransportError:
            pass
        except GoalsError as exc:
            if exc.status != 503:
                raise
        else:
            if done(last):
                return last
        time.sleep(0.1)
    raise TimeoutError(failure(last))


class AsyncGoalsClient:
    """The same API for ``async`` code (a kernel's running loop, an asyncio program): every
    ``GoalsClient`` method, awaited. Each call runs the blocking HTTP request on a worker thread,
    so the caller's event loop never blocks, waits (``wait``, ``wait_goal``, ``wait_job``) included.

        client = AsyncGoalsClient()
        session = await client.create_session(title="notes")
        await client.send(session["session_id"], "hello")
    """

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0,
                 retry_s: float = 10.0, notebook: str | None = None) -> None:
        self.sync = GoalsClient(url, token, timeout, retry_s, notebook)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncGoalsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.sync, name)
        if name.startswith("_") or not callable(method):
            raise AttributeError(name)

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call


def _connection_file() -> str | None:
    """This kernel's connection file; None outside an ipykernel (a script, a terminal IPython)."""
    try:
        from ipykernel.connect import get_connection_file

        return str(get_connection_file())
    except Exception:  # not running inside an ipykernel
        return None


def _kernel_id(connection_file: str | None) -> str | None:
    """A kernel's id, from its connection file name (``kernel-<id>.json``)."""
    name = os.path.basename(connection_file or "")
    if name.startswith("kernel-") and name.endswith(".json"):
        return name[len("kernel-"):-len(".json")]
    return None


def _vscode_notebook() -> str | None:
    """The notebook VS Code runs this kernel for (it sets ``__vsc_ipynb_file__``, not ``JPY_SESSION_NAME``)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    value = shell.user_ns.get("__vsc_ipynb_file__") if shell is not None else None
    return str(value) if value else None
