"""The Jupyter AI "Goals" persona (jupyter_goals/clients/acp/persona.py, issue 29 item 9).

The project's test environment has no Jupyter AI, so the persona's behaviour inside Jupyter AI is
checked with stand-ins of the two modules it imports (``jupyter_ai_persona_manager`` and
``jupyter_ai_acp_client.base_acp_persona``); the real import in this environment is asserted as it is.
What was checked by hand against jupyter-ai 3.2.0 / jupyter-ai-acp-client 0.3.3 is in docs/acp.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULE = "jupyter_goals.clients.acp.persona"


@pytest.fixture(autouse=True)
def fresh_module() -> Iterator[None]:
    """Every test imports the persona module afresh (its import is what Jupyter AI's loader sees)."""
    sys.modules.pop(MODULE, None)
    yield
    sys.modules.pop(MODULE, None)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class Unmet(RuntimeError):
    """Stands in for jupyter_ai_persona_manager.PersonaRequirementsUnmet."""


class Defaults:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def _persona_manager() -> ModuleType:
    mod = ModuleType("jupyter_ai_persona_manager")
    mod.PersonaRequirementsUnmet = Unmet  # type: ignore[attr-defined]
    mod.PersonaDefaults = Defaults  # type: ignore[attr-defined]
    return mod


class FakeBaseAcpPersona:
    """What the persona uses of jupyter-ai-acp-client 0.3.3's BaseAcpPersona: ``executable`` in
    ``__init__`` (the argv it spawns) and ``_init_agent_subprocess(env=...)`` (opencode's way to pass an
    environment)."""

    def __init__(self, *args: Any, executable: list[str], parent: Any = None, **kwargs: Any) -> None:
        self._executable = executable
        self.parent = parent
        self.log = SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None)
        self.spawned_env: dict[str, str] | None = None

    async def _init_agent_subprocess(self, env: dict[str, str] | None = None) -> str:
        self.spawned_env = env
        return "process"


@pytest.fixture
def with_acp_client(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setitem(sys.modules, "jupyter_ai_persona_manager", _persona_manager())
    package = ModuleType("jupyter_ai_acp_client")
    package.__path__ = []  # type: ignore[attr-defined]
    base = ModuleType("jupyter_ai_acp_client.base_acp_persona")
    base.BaseAcpPersona = FakeBaseAcpPersona  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jupyter_ai_acp_client", package)
    monkeypatch.setitem(sys.modules, "jupyter_ai_acp_client.base_acp_persona", base)
    return importlib.import_module(MODULE)


def test_entry_point_declared_and_points_at_the_class() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"]["jupyter_ai.personas"]
    assert eps == {"goals-acp": "jupyter_goals.clients.acp.persona:GoalsAcpPersona"}
    module, _, cls = eps["goals-acp"].partition(":")
    source = (ROOT / Path(*module.split("."))).with_suffix(".py").read_text()
    assert f"\nclass {cls}(BaseAcpPersona)" in source
    extra = project["optional-dependencies"]["jupyter-ai"]
    assert {d.split(">")[0].split("=")[0] for d in extra} == {"jupyter-ai", "jupyter-ai-acp-client",
                                                              "agent-client-protocol"}


def test_import_in_this_environment() -> None:
    """Whatever this venv holds, the import behaves as Jupyter AI's loader needs (the project's test venv
    has neither package: ImportError, and the rest of jupyter_goals imports fine)."""
    if _installed("jupyter_ai_acp_client"):
        assert importlib.import_module(MODULE).GoalsAcpPersona
    elif _installed("jupyter_ai_persona_manager"):
        from jupyter_ai_persona_manager import PersonaRequirementsUnmet  # type: ignore[import-not-found]
        with pytest.raises(PersonaRequirementsUnmet, match="jupyter-ai-acp-client"):
            importlib.import_module(MODULE)
    else:
        with pytest.raises(ImportError, match="needs Jupyter AI") as caught:
            importlib.import_module(MODULE)
        assert caught.value.__cause__ is not None
    import jupyter_goals.acp  # noqa: F401  (the agent itself does not depend on Jupyter AI)
    import jupyter_goals.clients.acp  # noqa: F401


def test_without_acp_client_raises_persona_requirements_unmet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jupyter AI present, jupyter-ai-acp-client absent: its loader's ``except PersonaRequirementsUnmet``
    skips the persona with a warning, no error in the chat."""
    monkeypatch.setitem(sys.modules, "jupyter_ai_persona_manager", _persona_manager())
    monkeypatch.setitem(sys.modules, "jupyter_ai_acp_client", None)  # import of it fails
    monkeypatch.setitem(sys.modules, "jupyter_ai_acp_client.base_acp_persona", None)
    with pytest.raises(Unmet, match=r"pip install 'jupyter_goals\[jupyter-ai\]'"):
        importlib.import_module(MODULE)


def test_without_jupyter_ai_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jupyter_ai_persona_manager", None)
    with pytest.raises(ImportError, match="needs Jupyter AI"):
        importlib.import_module(MODULE)


def _serverapp(url: str = "http://127.0.0.1:8899/lab-base/", token: str = "s3cret", sock: str = "") -> Any:
    return SimpleNamespace(connection_url=url, identity_provider=SimpleNamespace(token=token), sock=sock)


async def test_persona_starts_the_agent_with_the_servers_url_and_token(
        with_acp_client: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUPYTER_GOALS_SERVER_URL", raising=False)
    monkeypatch.delenv("JUPYTER_GOALS_TOKEN", raising=False)
    monkeypatch.setenv("SOME_USER_VAR", "kept")
    # persona -> PersonaManager -> Jupyter AI's extension app (which has .serverapp)
    manager = SimpleNamespace(parent=SimpleNamespace(serverapp=_serverapp()))
    persona = with_acp_client.GoalsAcpPersona(parent=manager, chat=object())
    assert persona._executable == [sys.executable, "-m", "jupyter_goals.acp"]
    assert not any("s3cret" in arg for arg in persona._executable)  # the token never goes on argv
    assert await persona._init_agent_subprocess() == "process"
    env = persona.spawned_env
    assert env is not None
    assert env["JUPYTER_GOALS_SERVER_URL"] == "http://127.0.0.1:8899/lab-base/"
    assert env["JUPYTER_GOALS_TOKEN"] == "s3cret"
    assert env["SOME_USER_VAR"] == "kept"


def test_defaults_name_the_persona_goals(with_acp_client: ModuleType) -> None:
    defaults = with_acp_client.GoalsAcpPersona(parent=None, chat=object()).defaults
    assert defaults.name == "Goals"
    assert Path(defaults.avatar_path).is_file()


async def test_no_server_app_or_unix_socket_falls_back_to_the_environment(
        with_acp_client: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_GOALS_SERVER_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("JUPYTER_GOALS_TOKEN", "from-env")
    persona = with_acp_client.GoalsAcpPersona(parent=SimpleNamespace(parent=None), chat=object())
    await persona._init_agent_subprocess()
    assert persona.spawned_env["JUPYTER_GOALS_SERVER_URL"] == "http://127.0.0.1:9/"
    assert persona.spawned_env["JUPYTER_GOALS_TOKEN"] == "from-env"
    assert with_acp_client.server_address(_serverapp(sock="/tmp/j.sock")) == ("http://127.0.0.1:9/", "from-env")


def test_server_address_without_anything(with_acp_client: ModuleType) -> None:
    assert with_acp_client.server_address(None, {}) == (None, None)
    # no URL: the agent is left to find a server itself (nothing set)
    assert "JUPYTER_GOALS_SERVER_URL" not in with_acp_client.agent_env(None, None, {"PATH": "/bin"})
    # a server without a token: an empty token, not one inherited from elsewhere
    assert with_acp_client.server_address(_serverapp(token=""), {"JUPYTER_GOALS_TOKEN": "x"})[1] == ""
