"""``python -m jupyter_goals.acp``: a short name for the ACP agent (``jupyter_goals.clients.acp``)."""

from jupyter_goals.clients.acp import main

__all__ = ["main"]
