from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
async def jp_asyncio_loop() -> AsyncIterator[asyncio.AbstractEventLoop]:
    """Run pytest-jupyter's server on pytest-asyncio's loop (asyncio_mode=auto runs the tests there)."""
    yield asyncio.get_running_loop()
