"""The example notebook runs as a user would run it, against a real server with the bundled demo model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import jupyter_goals
from tests.servers import ServerProcess

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "getting_started.ipynb"
DEMO_MODEL = f"scripted:{Path(jupyter_goals.__file__).parent / 'demo' / 'demo_script.json'}"


def test_getting_started_notebook_runs_top_to_bottom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    root.mkdir()
    server = ServerProcess(tmp_path / "state", root, model=DEMO_MODEL).start()
    try:
        monkeypatch.setenv("JUPYTER_GOALS_SERVER_URL", server.url)  # what the extension sets for its kernels
        monkeypatch.setenv("JUPYTER_GOALS_TOKEN", server.token)
        namespace: dict[str, object] = {}
        for cell in json.loads(NOTEBOOK.read_text())["cells"]:
            if cell["cell_type"] == "code":
                exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)  # noqa: S102
        snap = namespace["snap"]
        assert isinstance(snap, dict)
        assert snap["work"]["phase"] == "done"
        assert "slow command finished" in snap["transcript"]["items"][-1]["content"]
        assert len((root / "slow-demo.log").read_text().splitlines()) == 1
    finally:
        server.kill()
