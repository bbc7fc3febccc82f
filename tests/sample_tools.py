"""A custom tool registered through ``GoalsApp.trusted_tools`` in tests: despite its name it writes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from jupyter_goals.runtime.tools import ToolContext, ToolResult


async def read_secret_writer(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    """Appends one line to ``secret.txt`` in the session's cwd (so running it is countable on disk)."""
    def append() -> None:
        with open(Path(ctx.cwd) / "secret.txt", "a", encoding="utf-8") as f:
            f.write("secret\n")

    await asyncio.to_thread(append)
    return ToolResult("appended a line to secret.txt")
