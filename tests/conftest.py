import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import launch_chromium
from tests.storekit import Backend, require, require_postgres

pytest_plugins = ["pytest_jupyter.jupyter_server", "jupyter_goals.testing.plugin", "pytester"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def _checkout_status() -> str | None:
    """``git status`` of the checkout (tracked changes and untracked files, ignored ones left out), or
    None outside a git checkout."""
    try:
        run = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout if run.returncode == 0 else None


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller (or the only process) looks once
        session.config.stash[_STATUS_KEY] = _checkout_status()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests write only under temporary directories: a run that changed the checkout fails in CI (and
    says so locally, where a person may be editing while the tests run)."""
    if hasattr(session.config, "workerinput"):
        return
    before, after = session.config.stash.get(_STATUS_KEY, None), _checkout_status()
    if before is None or after is None or before == after:
        return
    changed = sorted(set(after.splitlines()) ^ set(before.splitlines()))
    message = "the test run changed the checkout (tests must write only under temporary directories):\n  " + "\n  ".join(changed)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.line("")
        reporter.write_line(("FAILED: " if os.environ.get("CI") else "warning: ") + message, red=True)
    if os.environ.get("CI"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_STATUS_KEY = pytest.StashKey[str | None]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every PostgreSQL variant carries the ``postgres`` marker, including a ``backend`` parametrized by
    the test itself (``parametrize("backend", ["postgresql"], indirect=True)`` drops the fixture's marks)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "postgresql":
            item.add_marker(pytest.mark.postgres)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``postgres`` test with PostgreSQL unreachable: fails in CI with the reason (CI starts PostgreSQL,
    .ci/run), is skipped with the reason elsewhere; never a silent skip, never a connection traceback."""
    if item.get_closest_marker("postgres") is not None:
        require_postgres()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "postgresql":
        require_postgres()  # CI starts PostgreSQL (.ci/run): its absence there fails, never skips
    b = Backend(request.param, tmp_path)
    try:
        yield b
    finally:
        b.cleanup()


@pytest.fixture
def hosts_store(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The control store and the ledger several hosts share (``tests/hostkit.py``): private schemas of the real
    PostgreSQL database (CI fails without it, elsewhere the tests skip)."""
    require_postgres()
    backend = Backend("postgresql", tmp_path)
    try:
        yield backend.url("control"), backend.url("usage")
    finally:
        backend.cleanup()


@pytest.fixture
def pg_cluster() -> Iterator[Any]:
    """A private PostgreSQL cluster of the test's own (``tests/pgcluster.py``), started; the test may stop
    and start it. Destroyed at the end. Without PostgreSQL's server binaries: fails in CI, else skips."""
    from tests import pgcluster

    require(pgcluster.unavailable())
    cluster = pgcluster.PrivateCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per browser-test module (``tests/browser.py``)."""
    with launch_chromium() as b:
        yield b

