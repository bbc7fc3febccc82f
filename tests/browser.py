"""Drive a real ``jupyter lab`` process from headless Chromium.

Reusable by any browser test:

    with run_jupyter_lab(tmp_path) as server, launch_chromium() as browser:
        lab = LabPage.open(browser, server)
        lab.open_goals_sidebar()
        lab.wait_for_text('[data-testid="goals-health-status"]', "ok")

The browser is Debian's ``/usr/bin/chromium`` (``.ci/install-chromium.sh``) driven by
Playwright through ``executable_path``: Playwright's own browser download is not needed.
Set ``JUPYTER_GOALS_CHROMIUM`` to use another binary.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from jupyter_goals.testing.servers import ServerProcess
from tests.servers import write_script

if TYPE_CHECKING:  # playwright is imported lazily so that a missing browser can skip cleanly
    from playwright.sync_api import Browser, ConsoleMessage, Locator, Page

REPO_ROOT = Path(__file__).resolve().parent.parent
LABEXTENSION_NAME = "jupyter-goals"
SIDEBAR_ID = "jupyter-goals-sidebar"
OPEN_COMMAND = "jupyter-goals:open"

CHROMIUM = os.environ.get("JUPYTER_GOALS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} not found: run .ci/install-chromium.sh (Debian's chromium package)"
    return None


def installed_labextension() -> Path | None:
    """The prebuilt extension as `pip install .` lays it out in this environment."""
    path = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / LABEXTENSION_NAME
    return path if (path / "package.json").is_file() else None


def repo_labextension() -> Path | None:
    """The extension built in the working tree by `jlpm build:prod` (not yet installed)."""
    path = REPO_ROOT / "jupyter_goals" / "labextension"
    return path if (path / "package.json").is_file() else None


def _build_id(path: Path) -> str:
    """The hashed remoteEntry file name: equal ids mean the same build."""
    data = json.loads((path / "package.json").read_text())
    return str(data.get("jupyterlab", {}).get("_build", {}).get("load", ""))


class LabServer(ServerProcess):
    """A running ``jupyter lab`` subprocess on 127.0.0.1: ``jupyter_goals.testing``'s ``ServerProcess``
    (kill -9 of its process group, restart on the same port) with the product's own settings (no fast
    test defaults), the default demo model, and the helpers the browser tests use."""

    def __init__(self, tmp: Path, labextension: Path, args: list[str], env: dict[str, str]) -> None:
        super().__init__(tmp / "state", tmp / "root", model=None, extra=args, env=env, app="jupyterlab", fast=False,
                         ready="status", log_path=tmp / "jupyter-lab.log")
        self.labextension = labextension

    @property
    def env(self) -> dict[str, str]:
        """The environment added at each (re)start: a test may change it before ``restart``."""
        return self.env_extra

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    @property
    def lab_url(self) -> str:
        return f"{self.base_url}/lab?token={self.token}"

    def log_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:]

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        """Call the server's REST API with token auth; returns (status, parsed JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.base_url}/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    def kill(self) -> None:
        """``kill -9`` of the server process alone, as ``pkill -9 -f jupyter-lab`` in the README's tour: its
        workers are orphaned (and end when they find it gone); detached tool processes live on."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None
        self._log.close()

    def restart(self, ready_timeout: float = 90) -> None:
        """Start the same server again: same port, token, root, state and config dirs."""
        assert self.proc is None, "restart() needs the old process gone: kill() or stop() first"
        self.start(same_port=True, timeout=ready_timeout)

    def stop(self, timeout: float = 15) -> int:
        """A graceful exit (SIGTERM); kill -9 of the group if it does not end in ``timeout``."""
        if self.proc is None:
            return 0
        try:
            return super().stop(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9


@contextmanager
def run_jupyter_lab(
    tmp: Path,
    *,
    goals_server_extension: bool = True,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    ready_timeout: float = 90,
) -> Iterator[LabServer]:
    """Start ``jupyter lab`` with isolated user config/data/runtime dirs under ``tmp``.

    The venv's ``share/jupyter`` and ``etc/jupyter`` stay on the search path, so the
    installed labextension and the ``jupyter_goals`` server extension are found as a user
    would find them. When the labextension is built in the working tree but not installed
    yet, it is added through ``LabApp.extra_labextensions_path``.

    ``goals_server_extension=False`` disables the ``jupyter_goals`` server extension, so every
    ``/api/goals/*`` request 404s (the sidebar's error state).
    """
    tmp = Path(tmp)
    root_dir, state_dir = tmp / "root", tmp / "state"
    config_dir, data_dir, runtime_dir = tmp / "config", tmp / "data", tmp / "runtime"
    for d in (root_dir, state_dir, config_dir, data_dir, runtime_dir):
        d.mkdir(parents=True, exist_ok=True)

    args: list[str] = []
    labextension = installed_labextension()
    built = repo_labextension()
    if labextension is not None and built is not None and _build_id(labextension) != _build_id(built):
        warnings.warn(
            f"testing the installed labextension {labextension}, which differs from the working-tree "
            "build in jupyter_goals/labextension: re-run `pip install -e .` to test the latter",
            stacklevel=3,
        )
    if labextension is None:
        if built is None:
            raise RuntimeError(
                "the jupyter-goals labextension is neither installed nor built: run "
                "`cd labextension && jlpm install && jlpm build:prod` or `pip install .`"
            )
        extra = tmp / "labextensions"
        extra.mkdir(exist_ok=True)
        link = extra / LABEXTENSION_NAME
        if not link.exists():
            link.symlink_to(built, target_is_directory=True)
        args.append(f"--LabApp.extra_labextensions_path={extra}")
        labextension = built

    # No "Would you like to get notified about Jupyter news?" toast over the screenshots.
    notification = config_dir / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True, exist_ok=True)
    (notification / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))

    if not goals_server_extension:
        # On the command line: it outranks every jupyter_server_config.d file, including the
        # environment's own (which a venv ranks above the user's config dir).
        args.append("--ServerApp.jpserver_extensions=jupyter_goals=False")

    args += [
        "--ip=127.0.0.1",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        *extra_args,
    ]
    proc_env = {
        "JUPYTER_CONFIG_DIR": str(config_dir),
        "JUPYTER_DATA_DIR": str(data_dir),
        "JUPYTER_RUNTIME_DIR": str(runtime_dir),
        "JUPYTER_PLATFORM_DIRS": "0",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    server = LabServer(tmp, labextension, args, proc_env)
    try:
        server.start(timeout=ready_timeout)
        yield server
    finally:
        server.stop()


@contextmanager
def launch_chromium(headless: bool = True) -> Iterator[Browser]:
    """Launch ``/usr/bin/chromium`` through Playwright (a fresh profile per launch)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=headless, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class LabPage:
    """One browser tab showing JupyterLab, with helpers for the Goals sidebar."""

    page: Page
    server: LabServer
    console_errors: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, browser: Browser, server: LabServer, timeout_ms: float = 60_000) -> LabPage:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.set_default_timeout(timeout_ms)
        lab = cls(page, server)

        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error":
                lab.console_errors.append(msg.text)

        page.on("console", on_console)
        page.on("pageerror", lambda err: lab.console_errors.append(f"pageerror: {err}"))
        page.goto(server.lab_url)
        lab.wait_restored(timeout_ms)
        return lab

    def wait_restored(self, timeout_ms: float = 60_000) -> None:
        """Wait until JupyterLab has started, restored its layout and filled its main area. The file
        browser opens a Launcher in an empty main area only after its first directory listing, which
        can come after ``app.restored``; the Launcher then takes the focus, and an open dialog sends a
        focus that leaves it back to its first field (a keyboard test's Tab then lands there instead)."""
        self.page.wait_for_function("() => window.jupyterapp !== undefined", timeout=timeout_ms)
        self.page.evaluate("() => window.jupyterapp.restored.then(() => true)")
        self.page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=timeout_ms)
        self.page.wait_for_function("() => !window.jupyterapp.shell.isEmpty('main')", timeout=timeout_ms)

    def reload(self, timeout_ms: float = 60_000) -> None:
        self.page.reload()
        self.wait_restored(timeout_ms)

    def close(self) -> None:
        self.page.context.close()

    @property
    def sidebar(self) -> str:
        return f"#{SIDEBAR_ID}"

    def sidebar_tab(self) -> str:
        return f'.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="{SIDEBAR_ID}"]'

    def has_plugin(self) -> bool:
        return bool(self.page.evaluate("(id) => window.jupyterapp.hasPlugin(id)", "jupyter-goals:sidebar"))

    def open_goals_sidebar(self, via: str = "tab") -> None:
        """Show the Goals panel by clicking its left-sidebar tab or running its command."""
        if via == "command":
            self.page.evaluate("(cmd) => window.jupyterapp.commands.execute(cmd)", OPEN_COMMAND)
        elif via == "tab":
            if not self.page.locator(self.sidebar).is_visible():
                self.page.locator(self.sidebar_tab()).click()
        else:
            raise ValueError(f"unknown way to open the sidebar: {via!r}")
        self.page.locator(self.sidebar).wait_for(state="visible")

    def testid(self, name: str) -> str:
        return f'{self.sidebar} [data-testid="{name}"]'

    def text(self, testid: str) -> str:
        return self.page.locator(self.testid(testid)).first.inner_text().strip()

    def wait_for_text(self, testid: str, text: str, timeout_ms: float = 20_000) -> None:
        """Wait until an element with this data-testid contains ``text``."""
        locator = self.page.locator(self.testid(testid)).filter(has_text=text).first
        try:
            locator.wait_for(state="visible", timeout=timeout_ms)
        except Exception as err:
            raise AssertionError(
                f"{text!r} never appeared in [data-testid={testid}]; panel shows:\n"
                f"{self.page.locator(self.sidebar).inner_text()}\n"
                f"console errors: {self.console_errors}\nserver log:\n{self.server.log_tail(2000)}"
            ) from err

    def click_testid(self, testid: str) -> None:
        self.page.locator(self.testid(testid)).first.click()

    def screenshot(self, path: Path) -> Path:
        self.page.screenshot(path=str(path), full_page=True)
        return path


def browser_missing_reason() -> str | None:
    """Why the browser tests cannot run here (no Chromium, or no playwright), or None when they can."""
    missing = chromium_missing_reason()
    if missing is None:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError as exc:
            missing = f"playwright is not importable ({exc}): it is in the `test` extra, pip install -e '.[test]'"
    return missing


def require_chromium() -> None:
    """Module-level gate of the browser tests: CI installs Chromium (.ci/install-chromium.sh) and
    playwright, so either missing there (``CI`` set; .ci/run sets it) fails the run with the reason;
    elsewhere the module is skipped with the reason (printed in the summary: addopts has ``-rs``)."""
    import pytest

    missing = browser_missing_reason()
    if missing and os.environ.get("CI"):
        raise RuntimeError(f"CI is set and the browser tests cannot run: {missing}")
    if missing:
        pytest.skip(missing, allow_module_level=True)


# --------------------------------------------------------------------------- shared by the browser tests


@pytest.fixture
def jp_asyncio_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """pytest-jupyter's autouse loop fixture installs a loop and closes it afterwards; Playwright's sync
    API would run on that installed loop. Give pytest-jupyter a private loop and leave Playwright its own."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def api(server: LabServer, method: str, path: str, body: Any = None, expect: tuple[int, ...] = (200, 201, 202)) -> Any:
    status, answer = server.request(method, f"api/goals/{path}", body)
    assert status in expect, f"{method} {path} -> {status} {answer!r}\n{server.log_tail(2000)}"
    return answer


def goals_ready(server: LabServer) -> LabServer:
    """The extension answers 503 ``starting`` until its schema is migrated and recovery has run."""
    def ready() -> bool:
        status, health = server.request("GET", "api/goals/health")
        return status == 200 and isinstance(health, dict) and health.get("status") == "ok"

    wait_until(ready, "jupyter_goals to start", 60)
    return server


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20,
               evidence: Callable[[], str] | None = None) -> None:
    """Polls ``check`` until it holds; on timeout fails saying ``what`` (and ``evidence()``: what the page shows)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f"; {evidence()}" if evidence else ""))


def asking_model(tmp: Path) -> str:
    """Asks to write a.txt (an approval in ask mode), then answers once the tool ran."""
    return write_script(tmp / "ask.json", [{"when": {"last_tool_result_contains": ""}, "respond": {"text": "written"}}],
                        default={"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}]})


# --------------------------------------------------------------------------- the front door (issue 12)


def session_view(lab: LabPage, session_id: str | None = None) -> Locator:
    selector = '[data-testid="goals-session-view"]'
    if session_id:
        selector += f'[data-session-id="{session_id}"]'
    return lab.page.locator(selector)


def open_session_view(lab: LabPage, session_id: str, timeout_ms: float = 20_000) -> Locator:
    """Open a session in the main area (the command the panel uses) and wait for its view."""
    lab.page.evaluate("([sid]) => window.jupyterapp.commands.execute('jupyter-goals:open-session', {session_id: sid})",
                      [session_id])
    view = session_view(lab, session_id)
    view.wait_for(timeout=timeout_ms)
    return view


def new_chat_from_panel(lab: LabPage, title: str, *, mode: str = "ask", allow: str = "", model: str = "") -> str:
    """Click "New chat" in the Goals panel, fill the form, create; returns the new session's id."""
    lab.open_goals_sidebar()
    lab.page.get_by_role("button", name="New chat", exact=True).click()
    dialog = lab.page.get_by_role("dialog")
    dialog.get_by_label("Title").fill(title)
    if model:
        dialog.get_by_label("Model").select_option(model)
    dialog.get_by_label("Permission mode").select_option(mode)
    if allow:
        dialog.get_by_label("Allowed tools (comma separated)").fill(allow)
    dialog.get_by_role("button", name="Create").click()
    view = lab.page.locator('[data-testid="goals-session-view"]').filter(
        has=lab.page.get_by_role("heading", name=title)
    )
    view.wait_for(timeout=20_000)
    session_id = view.get_attribute("data-session-id")
    assert session_id
    return session_id


def send(view: Locator, text: str) -> None:
    box = view.get_by_role("textbox", name="Message")
    box.fill(text)
    box.press("Enter")


def effect_events(server: LabServer, session_id: str, state: str) -> list[dict[str, Any]]:
    """The durable event log's `effect.state` records of one session in one state."""
    page = api(server, "GET", "events?format=json&after=0&limit=5000")
    return [
        e
        for e in page["events"]
        if e["kind"] == "effect.state" and e["session_id"] == session_id and e["payload"].get("state") == state
    ]


def transcript(server: LabServer, session_id: str) -> list[dict[str, Any]]:
    return list(api(server, "GET", f"sessions/{session_id}?after=0&limit=5000")["transcript"]["items"])


def notifications(lab: LabPage, text: str) -> int:
    """How many notifications JupyterLab's notification center holds whose message contains ``text``. A
    toast closes after a few seconds (later on a loaded machine the count of toasts is a race); the center
    keeps every notification until it is dismissed. Opens the center (the status bar's popup)."""
    lab.page.evaluate("() => window.jupyterapp.commands.execute('apputils:display-notifications')")
    listing = lab.page.locator(".jp-Notification-List")
    listing.wait_for(timeout=10_000)
    return listing.locator(".jp-Notification-List-Item").filter(has_text=text).count()


def item(view: Locator, kind: str, text: str = "") -> Locator:
    found = view.locator(f'[data-testid="goals-item"][data-kind="{kind}"]')
    return found.filter(has_text=text) if text else found
