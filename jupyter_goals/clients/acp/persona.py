"""The "Goals" persona of Jupyter AI: Jupyter AI's ACP client drives ``python -m jupyter_goals.acp``.

Jupyter AI 3 loads personas from the ``jupyter_ai.personas`` entry point group (pyproject.toml names
``GoalsAcpPersona`` here). ``jupyter-ai-acp-client``'s ``BaseAcpPersona`` starts the executable it is
given as one subprocess per persona class, speaks ACP over its stdio, and makes one ACP session per
chat (``session/load`` of the recorded one when the chat is opened again, since we advertise
``loadSession``). This persona names our agent with the server's own Python and hands it the server's
URL and token in the environment (``JUPYTER_GOALS_SERVER_URL`` / ``JUPYTER_GOALS_TOKEN``, which
``GoalsClient`` reads), never on the command line where ``ps`` would show the token.

Import behaviour, which Jupyter AI's loader relies on (``PersonaManager._init_ep_persona_classes``):

- ``jupyter-ai-acp-client`` missing: ``PersonaRequirementsUnmet`` (from ``jupyter_ai_persona_manager``),
  so Jupyter AI logs one warning and skips the persona, with no error in the chat;
- ``jupyter_ai_persona_manager`` missing too (no Jupyter AI at all): ``ImportError``. Nothing but the
  entry point imports this module, and nothing loads that entry point without Jupyter AI.

Install both with ``pip install "jupyter_goals[jupyter-ai]"``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    from jupyter_ai_persona_manager import PersonaRequirementsUnmet
except ImportError as exc:  # no Jupyter AI at all: only its loader imports this module
    raise ImportError(
        "the Goals persona needs Jupyter AI: pip install 'jupyter_goals[jupyter-ai]'") from exc

try:
    from jupyter_ai_acp_client.base_acp_persona import BaseAcpPersona
    from jupyter_ai_persona_manager import PersonaDefaults
except ImportError as exc:
    raise PersonaRequirementsUnmet(
        "The Goals persona needs `jupyter-ai-acp-client` (and `agent-client-protocol`): "
        "pip install 'jupyter_goals[jupyter-ai]', then restart the server.") from exc

URL_ENV = "JUPYTER_GOALS_SERVER_URL"
TOKEN_ENV = "JUPYTER_GOALS_TOKEN"
AVATAR = Path(__file__).with_name("goals.svg")


def agent_command(python: str | None = None) -> list[str]:
    """The agent's command line: this environment's Python, so the agent runs with the server's packages."""
    return [python or sys.executable, "-m", "jupyter_goals.acp"]


def server_address(serverapp: Any, environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(url, token) of the Jupyter server this persona runs in.

    The server's ``connection_url`` and its identity provider's token; without a server app (or for a
    server on a Unix socket, which the REST client does not speak) the variables the jupyter_goals
    extension sets in the server's environment when it starts, else ``None`` (the agent then finds a
    server as ``GoalsClient()`` does)."""
    env = os.environ if environ is None else environ
    url: str | None = None
    token: str | None = None
    if serverapp is not None and not getattr(serverapp, "sock", ""):
        url = getattr(serverapp, "connection_url", None) or None
        token = getattr(getattr(serverapp, "identity_provider", None), "token", None)
        if token is None:
            token = getattr(serverapp, "token", None)
    return url or env.get(URL_ENV) or None, token if token is not None else env.get(TOKEN_ENV)


def agent_env(url: str | None, token: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The agent's environment: the server's (so PATH, proxies and the like hold) with its address."""
    env = dict(os.environ if environ is None else environ)
    if url:
        env[URL_ENV] = url
        env[TOKEN_ENV] = token or ""
    return env


def find_serverapp(persona: Any) -> Any:
    """The ``ServerApp`` above a persona: persona → ``PersonaManager`` → Jupyter AI's extension app."""
    node = persona
    for _ in range(4):
        node = getattr(node, "parent", None)
        if node is None:
            return None
        serverapp = getattr(node, "serverapp", None)
        if serverapp is not None:
            return serverapp
    return None


class GoalsAcpPersona(BaseAcpPersona):  # type: ignore[misc]
    """Jupyter AI persona "Goals": each chat is a durable jupyter_goals session on this server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, executable=agent_command(), **kwargs)

    @property
    def defaults(self) -> Any:
        return PersonaDefaults(
            name="Goals",
            description=("Durable agent sessions of jupyter_goals: work goes on after a restart, "
                         "approvals are asked again, Stop stops."),
            avatar_path=str(AVATAR),
            system_prompt="unused",  # the server's session holds the model and its instructions
        )

    async def _init_agent_subprocess(self, env: dict[str, str] | None = None) -> Any:
        url, token = server_address(find_serverapp(self))
        if url is None:
            self.log.warning("Goals persona: no server URL found; the agent looks for a running server itself.")
        return await super()._init_agent_subprocess(env=agent_env(url, token, env))
