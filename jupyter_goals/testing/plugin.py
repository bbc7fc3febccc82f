"""pytest fixtures that start real jupyter_goals servers: ``pytest_plugins = ["jupyter_goals.testing.plugin"]``.

- ``goals_servers``: a ``ServerFactory`` under the test's ``tmp_path`` (offline demo model unless a test
  gives ``rules`` or ``model`` through ``goals_servers.make(model_=…)``); every server it made is killed
  (kill -9 of its process group) when the test ends;
- ``goals_server``: one started server with the offline demo model, ready (health answers and a worker runs).

    def test_a_chat_answers(goals_server):
        client = goals_server.client()
        sid = client.create_session(title="t")["session_id"]
        client.send(sid, "hello", client_request_id="1")
        assert client.wait(sid, timeout=60)["work"]["phase"] == "done"
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_goals.testing.servers import ServerFactory, ServerProcess


def _demo_model() -> str:
    from jupyter_goals.server.app import demo_model

    return demo_model()


@pytest.fixture
def goals_servers(tmp_path: Path) -> Iterator[ServerFactory]:
    """Real servers on one state dir under ``tmp_path`` (``.root``: their root folder, ``.state``)."""
    factory = ServerFactory(tmp_path / "goals", model=_demo_model())
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def goals_server(goals_servers: ServerFactory) -> ServerProcess:
    """One started, ready server with the offline demo model."""
    return goals_servers.make().start()
