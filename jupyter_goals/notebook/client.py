"""GoalsClient: the Python Workflow API over REST. Knows nothing of the server's code.

The server URL and token come from arguments, else from ``JUPYTER_GOALS_SERVER_URL`` /
``JUPYTER_GOALS_TOKEN`` (set by the extension for kernels it starts).
"""

from __future__ import annotations

import os
import time
import uuid
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

    def stop_all(self) -> dict[str, Any]:
        return dict(_check(self.http.post("/actions", json={"action": "stop_all"})))

    def approvals(self, state: str | None = "pending") -> list[dict[str, Any]]:
        return list(_check(self.http.get("/approvals", params={"state": state} if state else {}))["approvals"])

    def decide(self, approval_id: str, decision: str) -> dict[str, Any]:
        return dict(_check(self.http.post(f"/approvals/{approval_id}", json={"decision": decision})))

    def events(self, after: int = 0, limit: int = 500) -> dict[str, Any]:
        return dict(_check(self.http.get("/events", params={"after": after, "format": "json", "limit": limit})))

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

