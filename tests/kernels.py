"""Real ipykernel processes for notebook tests: start one the way jupyter_server does (its notebook
path in ``JPY_SESSION_NAME``), run cells, restart it, and run whole notebooks with nbclient.

Written once and shared by the magics, widget and example-notebook tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.servers import ServerProcess, write_script


@contextmanager
def scripted_server(tmp: Path, rules: list[dict[str, Any]], default: dict[str, Any] | None = None,
                    model: str | None = None) -> Iterator[ServerProcess]:
    """A real server on ``tmp/state`` with root ``tmp/root`` and a scripted model; killed at the end."""
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    s = ServerProcess(tmp / "state", root, model=model or write_script(tmp / "script.json", rules, default))
    try:
        yield s.start()  # killed below even when it never became ready
    finally:
        s.kill()


def kernel_env(server: ServerProcess, notebook: Path | None, **extra: str) -> dict[str, str]:
    """The environment a kernel started by ``server`` for ``notebook`` gets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_GOALS_", "JPY_"))}
    env.update({"JUPYTER_GOALS_SERVER_URL": server.url, "JUPYTER_GOALS_TOKEN": server.token})
    if notebook is not None:
        env["JPY_SESSION_NAME"] = str(notebook)  # jupyter_server: the notebook's absolute path
    env.update(extra)
    return env


class Kernel:
    """One ipykernel; ``run`` executes a cell and returns its outputs as nbformat-like dicts."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=str(cwd))
        self._connect()

    def _connect(self) -> None:
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 120.0) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = []

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind in ("display_data", "execute_result", "update_display_data"):
                outputs.append({"output_type": kind, "data": content["data"]})
            elif kind == "stream":
                outputs.append({"output_type": "stream", "text": content["text"]})
            elif kind == "error":
                outputs.append({"output_type": "error", "ename": content["ename"], "evalue": content["evalue"]})

        self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        return outputs

    def restart(self) -> None:
        """What "Restart kernel" does: a new process with the same launch environment."""
        self.kc.stop_channels()
        self.km.restart_kernel(now=True)
        self._connect()

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def errors(outputs: list[dict[str, Any]]) -> list[str]:
    return [f"{o['ename']}: {o['evalue']}" for o in outputs if o["output_type"] == "error"]


def bundles(outputs: list[dict[str, Any]], mime: str) -> list[dict[str, Any]]:
    return [o["data"] for o in outputs if mime in o.get("data", {})]


def text(outputs: list[dict[str, Any]]) -> str:
    return "".join(o.get("text", "") for o in outputs) + "".join(
        str(o["data"].get("text/plain", "")) for o in outputs if "data" in o)


def run_notebook(path: Path, server: ServerProcess, workdir: Path, timeout: int = 300,
                 **env: str) -> nbformat.NotebookNode:
    """Execute a notebook top to bottom in a real kernel against ``server`` (nbclient); raises on an
    error cell. The executed notebook is returned with its outputs."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(workdir)}})
    client.execute(env=kernel_env(server, workdir / path.name, **env), cwd=str(workdir))
    return nb


def cell_outputs(nb: nbformat.NotebookNode, tag: str) -> list[dict[str, Any]]:
    """The outputs of the code cell tagged ``tag`` (cell metadata ``tags``)."""
    cells = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"one cell tagged {tag!r} expected, found {len(cells)}"
    return [dict(o) for o in cells[0].get("outputs", [])]


def runtime_dir(server: ServerProcess) -> Path:
    """Where ``server`` wrote its ``jpserver-*.json`` (tests/servers.py gives each server its own)."""
    return server.state_dir.parent / "jupyter_runtime"


def ci_env(server: ServerProcess, **extra: str) -> dict[str, str]:
    """The environment of a CI job that runs notebooks with ``jupyter nbconvert --execute`` or papermill
    beside a running ``jupyter server``: no ``JPY_SESSION_NAME`` and none of the extension's variables, so
    its kernels find the server through its runtime file and cannot know their notebook."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_GOALS_", "JPY_"))}
    env["JUPYTER_RUNTIME_DIR"] = str(runtime_dir(server))
    env.update(extra)
    return env
