"""The shipped pytest plugin (``jupyter_goals.testing.plugin``) starts real servers for any project."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a real server in a pytest subprocess

OUTSIDE_TEST = '''
import os


def test_a_chat_on_a_real_server(goals_server, goals_servers):
    client = goals_server.client()
    sid = client.create_session(title="plugin")["session_id"]
    client.send(sid, "hello", client_request_id="plugin-1")
    snap = client.wait(sid, timeout=60)
    assert snap["work"]["phase"] == "done"
    assert snap["session"]["cwd"] == str(goals_servers.root)  # its own root folder under tmp_path
    answers = [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"]
    assert any("offline demo model" in a for a in answers), answers
    with open(os.environ["PIDS_FILE"], "a") as out:
        out.write(f"{goals_server.proc.pid}\\n")
'''


def test_an_outside_project_gets_a_started_server_that_is_killed_after_its_test(pytester: pytest.Pytester) -> None:
    pids = pytester.path / "pids.txt"
    pytester.makeconftest('pytest_plugins = ["jupyter_goals.testing.plugin"]\n')
    pytester.makepyfile(test_outside=OUTSIDE_TEST)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIDS_FILE", str(pids))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)
    [pid] = [int(line) for line in pids.read_text().split()]
    try:  # the server the fixture started is gone once its test ended (its pid unused, or reused by another)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        cmdline = b""
    assert b"jupyter_server" not in cmdline, f"server {pid} still runs"
