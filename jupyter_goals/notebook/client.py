"""GoalsClient: the Python Workflow API over REST. Knows nothing of the server's code.

The server URL and token come from arguments, else from ``JUPYTER_GOALS_SERVER_URL`` /
``JUPYTER_GOALS_TOKEN`` (set by the extension for kernels it starts).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Awaitable, Callable
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


class GoalsClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        url = url or os.environ.get("JUPYTER_GOALS_SERVER_URL") or "http://127.0.0.1:8888/"
        token = token if token is not None else os.environ.get("JUPYTER_GOALS_TOKEN", "")
        headers = {"Authorization": f"token {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/") + "/api/goals", headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def health(self) -> dict[str, Any]:
        return dict(_check(self.http.get("/health")))

    def create_session(self, **body: Any) -> dict[str, Any]:
        return dict(_check(self.http.post("/sessions", json=body)))

    def sessions(self) -> list[dict[str, Any]]:
        return list(_check(self.http.get("/sessions"))["sessions"])

    def session(self, session_id: str) -> dict[str, Any]:
        return dict(_check(self.http.get(f"/sessions/{session_id}")))

    def send(self, session_id: str, text: str, client_request_id: str | None = None, delivery: str = "queue") -> dict[str, Any]:
        body = {"text": text, "client_request_id": client_request_id or uuid.uuid4().hex, "delivery": delivery}
        return dict(_check(self.http.post(f"/sessions/{session_id}/messages", json=body)))

    def action(self, session_id: str, action: str, expected_control_version: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"action": action}
        if expected_control_version is not None:
            body["expected_control_version"] = expected_control_version
        return dict(_check(self.http.post(f"/sessions/{session_id}/actions", json=body)))

    def set_permissions(self, session_id: str, permissions: dict[str, Any],
                        expected_control_version: int | None = None) -> dict[str, Any]:
        """Change a session's permissions (``{mode: ask|bypass, allow: [tool | {tool, path}]}``).
        Pending approvals of its unfinished work are invalidated and asked again if still needed."""
        body: dict[str, Any] = {"permissions": permissions}
        if expected_control_version is not None:
            body["expected_control_version"] = expected_control_version
        return dict(_check(self.http.patch(f"/sessions/{session_id}", json=body)))

    def approve(self, approval_id: str) -> dict[str, Any]:
        return self.decide(approval_id, "approve")

    def deny(self, approval_id: str) -> dict[str, Any]:
        return self.decide(approval_id, "deny")

    def stop_all(self) -> dict[str, Any]:
        return dict(_check(self.http.post("/actions", json={"action": "stop_all"})))

    def approvals(self, state: str | None = "pending") -> list[dict[str, Any]]:
        return list(_check(self.http.get("/approvals", params={"state": state} if state else {}))["approvals"])

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
                    budget: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start a Goal in a session. Requirements are ``{id?, text, kind: semantic | command | file_exists |
        file_digest, command?, path?, sha256?}``; without them the server extracts them from the objective."""
        body: dict[str, Any] = {"session_id": session_id, "objective": objective}
        if requirements is not None:
            body["requirements"] = requirements
        if budget is not None:
            body["budget"] = budget
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
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["work"]["phase"] in phases:
                return job
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} did not reach {phases}: {job.get('work')}")

    def wait_goal(self, goal_id: str, states: tuple[str, ...] = ("achieved",), timeout: float = 60.0) -> dict[str, Any]:
        """Poll the Goal until it reaches one of ``states``."""
        deadline = time.monotonic() + timeout
        goal: dict[str, Any] = {}
        while time.monotonic() < deadline:
            goal = self.goal(goal_id)
            if goal["state"] in states:
                return goal
            time.sleep(0.1)
        raise TimeoutError(f"goal {goal_id} did not reach {states}: {goal.get('state')} {goal.get('phase')}"
                           f" {goal.get('reason_code')}")

    def wait(self, session_id: str, phases: tuple[str, ...] = ("done",), timeout: float = 60.0) -> dict[str, Any]:
        """Poll the snapshot until the current work reaches one of ``phases``."""
        deadline = time.monotonic() + timeout
        snap: dict[str, Any] = {}
        while time.monotonic() < deadline:
            snap = self.session(session_id)
            if snap["work"] and snap["work"]["phase"] in phases:
                return snap
            time.sleep(0.1)
        raise TimeoutError(f"session {session_id} did not reach {phases}: {snap.get('work')}")



class AsyncGoalsClient:
    """The same API for ``async`` code (a kernel's running loop, an asyncio program): every
    ``GoalsClient`` method, awaited. Each call runs the blocking HTTP request on a worker thread,
    so the caller's event loop never blocks, waits (``wait``, ``wait_goal``, ``wait_job``) included.

        client = AsyncGoalsClient()
        session = await client.create_session(title="notes")
        await client.send(session["session_id"], "hello")
    """

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.sync = GoalsClient(url, token, timeout)

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
