"""The in-process REST fixtures (pytest-jupyter), shared by the REST test modules.

A test module imports the fixtures it uses (``from tests.restkit import api, ...  # noqa: F401``): they
are not in ``conftest.py`` because pytest-jupyter's ``jp_asyncio_loop`` is autouse, and only these
in-process server tests may replace it (see ``jp_asyncio_loop`` below).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.serverapp import ServerApp
from jupyter_server.utils import url_path_join


@pytest.fixture
async def jp_asyncio_loop() -> AsyncIterator[asyncio.AbstractEventLoop]:
    """Run pytest-jupyter's server on pytest-asyncio's loop (asyncio_mode=auto runs these tests there).

    Overridden here, not in conftest.py: pytest-jupyter's fixture is autouse, and the synchronous
    browser and process-level tests must keep its plain loop."""
    yield asyncio.get_running_loop()

Json = dict[str, Any]


@pytest.fixture
def goals_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "goals_state"
    monkeypatch.setenv("JUPYTER_GOALS_STATE_DIR", str(state))
    monkeypatch.setenv("JUPYTER_GOALS_HOST_NAME", "rest-test-host")
    monkeypatch.setenv("JUPYTER_GOALS_BOOT_ID", "rest-test-boot")
    # the extension exports these for kernels; monkeypatch restores them after the test
    monkeypatch.delenv("JUPYTER_GOALS_SERVER_URL", raising=False)
    monkeypatch.delenv("JUPYTER_GOALS_TOKEN", raising=False)
    return state


@pytest.fixture
def jp_server_config(goals_state_dir: Path) -> Json:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_goals": True}, "reraise_server_extension_failures": True},
        "GoalsApp": {"workers": 0},
    }


async def start_goals(serverapp: ServerApp) -> None:
    """pytest-jupyter does not run extension start hooks (the real server does after its loop starts)."""
    await serverapp.extension_manager.start_all_extensions()


async def stop_goals(serverapp: ServerApp) -> None:
    await serverapp.extension_manager.stop_all_extensions()


class Api:
    def __init__(self, fetch: Any) -> None:
        self.fetch = fetch

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {}
        if method != "GET":
            kwargs["body"] = raw if raw is not None else json.dumps({} if body is None else body)
        r = await self.fetch("api", "goals", *path.split("/"), method=method, params=params, raise_error=False,
                             **kwargs)
        return r.code, json.loads(r.body) if r.body else None

    async def ok(self, method: str, path: str, body: Any = None, *, expect: int = 200, **kw: Any) -> Any:
        code, answer = await self.call(method, path, body, **kw)
        assert code == expect, (method, path, code, answer)
        return answer

    async def new_session(self, **body: Any) -> str:
        answer = await self.ok("POST", "sessions", body, expect=201)
        return str(answer["session_id"])

    async def send(self, session_id: str, text: str, client_request_id: str) -> Json:
        body = {"text": text, "client_request_id": client_request_id}
        return dict(await self.ok("POST", f"sessions/{session_id}/messages", body, expect=202))

    async def events(self, after: int = 0, limit: int = 500) -> Json:
        return dict(await self.ok("GET", "events", params={"after": after, "format": "json", "limit": limit}))


@pytest.fixture
async def api(jp_serverapp: ServerApp, jp_fetch: Any) -> Api:
    await start_goals(jp_serverapp)
    return Api(jp_fetch)


@pytest.fixture
def raw_url(jp_http_port: int, jp_base_url: str) -> Any:
    def url(path: str) -> str:
        return f"http://127.0.0.1:{jp_http_port}{url_path_join(jp_base_url, 'api/goals', path)}"

    return url


def assert_error(answer: Any, code: str | None = None) -> None:
    assert isinstance(answer, dict) and set(answer) == {"error", "message"}, answer
    assert answer["message"]
    if code is not None:
        assert answer["error"] == code, answer
