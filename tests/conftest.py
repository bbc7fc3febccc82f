import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import launch_chromium
from tests.storekit import Backend, postgres_unreachable

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "postgresql" and (reason := postgres_unreachable()):
        if os.environ.get("CI"):  # CI starts PostgreSQL (.ci/run): its absence there fails, never skips
            pytest.fail(f"CI is set and {reason}")
        pytest.skip(reason)
    b = Backend(request.param, tmp_path)
    try:
        yield b
    finally:
        b.cleanup()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per browser-test module (``tests/browser.py``)."""
    with launch_chromium() as b:
        yield b

