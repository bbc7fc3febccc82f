"""The benchmark harness runs from the checkout root and answers one JSON object keyed by figure name.

It times nothing and checks no figure against its target (that is what ``python -m bench`` prints): only that
``python -m bench --quick --only events --json`` runs a real server end to end and reports each figure with
its baseline, ratio, target and verdict, plus the machine and the versions of the baselines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def quick_json(*names: str, timeout: float) -> dict[str, Any]:
    """``python -m bench --quick --only NAMES --json``, run to its end; its one JSON object."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", ",".join(names), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


@pytest.mark.slow
def test_python_m_bench_quick_only_json_prints_the_figures_with_their_keys() -> None:
    out = quick_json("events", timeout=300)
    assert "event_latency_p99_ms" in out
    fig = out["figures"]["event_latency_p99_ms"]
    assert set(fig) >= {"name", "value", "unit", "baseline", "ratio", "target", "verdict", "limit"}
    assert fig["value"] is not None, fig  # measured: the run did not fail
    assert fig["verdict"] in ("PASS", "FALLS SHORT")
    assert fig["detail"]["many_clients"]["missing"] == 0  # every client got every committed event
    meta = out["meta"]
    assert set(meta["machine"]) >= {"cores", "memory_gb", "disk"}
    assert set(meta["versions"]) >= {"sqlite", "postgresql", "dbos", "langgraph", "langgraph-checkpoint-sqlite"}


def test_python_m_bench_refuses_an_unknown_benchmark_name() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--only", "nosuch"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "unknown benchmark(s) nosuch" in proc.stderr


@pytest.mark.slow
def test_the_windowed_loop_benchmark_resumes_seeded_sessions_and_compacts_only_with_a_window() -> None:
    out = quick_json("windowed", timeout=600)
    windowed, plain = out["figures"]["windowed_loop_rate_ratio"], out["figures"]["nowindow_loop_rate_ratio"]
    assert windowed["verdict"] in ("PASS", "FALLS SHORT") and windowed["value"] > 0, windowed
    w, n = windowed["detail"]["windowed"], windowed["detail"]["no_window"]
    # the seeded history was read and compacted on the windowed model, never on the plain one
    assert w["compactions_small"] >= 1 and w["compactions_large"] >= 1, w
    assert n["compactions_small"] == 0 and n["compactions_large"] == 0, n
    assert plain["value"] > 0 and plain["verdict"] == "-"
