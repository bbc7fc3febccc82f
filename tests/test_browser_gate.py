"""The browser tests' gate (``tests/browser.py::require_chromium``): with ``CI`` set a missing Chromium
fails the run with the reason; elsewhere the module is skipped and the summary says why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.browser import REPO_ROOT


def run_gated_module(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    module = tmp_path / "test_gated.py"
    module.write_text("from tests.browser import require_chromium\n\nrequire_chromium()\n\n\ndef test_x():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update({"JUPYTER_GOALS_CHROMIUM": str(tmp_path / "no-chromium"), "PYTHONPATH": str(REPO_ROOT)})
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", str(REPO_ROOT / "pyproject.toml"),
                           "--rootdir", str(tmp_path), str(module)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_missing_chromium_fails_the_run_in_ci_with_the_reason(tmp_path: Path) -> None:
    run = run_gated_module(tmp_path, ci=True)
    assert run.returncode != 0, run.stdout
    assert "CI is set and the browser tests cannot run" in run.stdout and "no-chromium not found" in run.stdout


def test_a_missing_chromium_skips_locally_and_the_summary_says_why(tmp_path: Path) -> None:
    run = run_gated_module(tmp_path, ci=False)
    assert run.returncode == 5, run.stdout  # pytest's "no tests ran": the module was skipped, nothing failed
    assert "1 skipped" in run.stdout
    assert "SKIPPED" in run.stdout and "no-chromium not found: run .ci/install-chromium.sh" in run.stdout
