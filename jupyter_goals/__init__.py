"""jupyter_goals: durable AI-agent chats, Goals and Jobs for Jupyter."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from jupyter_goals.server.app import GoalsApp

    return [{"module": "jupyter_goals", "app": GoalsApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-goals"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_goals``: the ``%goal`` / ``%%goal`` magics."""
    from jupyter_goals.clients.notebook.magics import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> Any:
    if name in ("GoalsClient", "AsyncGoalsClient", "GoalsError"):
        from jupyter_goals.clients import rest as client

        return getattr(client, name)
    raise AttributeError(name)
