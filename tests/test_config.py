"""One configuration object: the CLI's ``recover --explain`` decides with the server's configuration
(read from the state dir the server wrote it to), so it explains the decision the server then makes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.config import CONFIG_FILE, GoalsConfig
from tests.servers import db_rows, running_shell, server_env

JUPYTER = str(Path(sys.executable).parent / "jupyter")

RULES: list[dict[str, Any]] = [
    {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "finished"}},
    {"when": {"purpose": "work", "last_user_contains": "slow"},
     "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 3; echo ran >> out.txt"}}]}},
]


def test_the_saved_configuration_round_trips_without_its_secrets(tmp_path: Path) -> None:
    cfg = GoalsConfig(state_dir=tmp_path, control_db_url="sqlite:///c.db", usage_db_url="sqlite:///u.db",
                      default_model="tiny", models={"tiny": {"provider": "scripted", "model": "/x.json"}},
                      trusted_tools={"t": {"module": "m", "qualname": "f"}}, tool_env_allow=("HOME",),
                      max_recovery_attempts=2, secrets={"JUPYTER_GOALS_TOKEN": "s3cret"})
    path = cfg.save()
    assert "s3cret" not in path.read_text()
    assert GoalsConfig.load(tmp_path) == GoalsConfig(**{**cfg.__dict__, "secrets": {}})
    (tmp_path / CONFIG_FILE).write_text("not json")
    assert GoalsConfig.load(tmp_path) is None


@pytest.mark.slow
def test_recover_explain_decides_with_the_servers_configuration(tmp_path: Path) -> None:
    """A chat on a named model (``GoalsApp.models``, known only to the server's configuration) is killed
    -9 mid-command. ``recover --explain`` says the next start admits it (without the server's
    configuration the model is unknown and it would say: wait ``resource_missing.model``); the next
    start does admit it, and the chat finishes."""
    with server_env(tmp_path, RULES) as env:
        models = json.dumps({"tiny": {"provider": "scripted", "model": str(env["script"]), "context_window": 100000}})
        server = env["make"]([f"--GoalsApp.models={models}"]).start()
        cl = server.client()
        sid = str(cl.create_session(title="named", cwd=str(env["root"]), model="tiny",
                                    permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "run something slow", client_request_id="r1")
        running_shell(env["state"])
        server.kill()
        assert db_rows(env["state"], "SELECT model FROM sessions WHERE session_id = ?", (sid,)) == [{"model": "tiny"}]

        explain = subprocess.run([JUPYTER, "goals", "--state-dir", str(env["state"]), "recover", "--explain"],
                                 capture_output=True, text=True, timeout=120)
        assert explain.returncode == 0, explain.stderr
        mine = [(d["decision"], d["reason_code"], d["facts"]["model_problem"])
                for d in json.loads(explain.stdout) if d["session_id"] == sid]
        assert mine == [("admit", "recovered", None)]

        server.start()
        snap = server.client().wait(sid, timeout=60)
        assert snap["work"]["phase"] == "done"
        assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "finished"
        # the server's own pass admitted it (a second attempt), never waiting for the model
        assert len(db_rows(env["state"], "SELECT attempt_id FROM attempts")) == 2
        assert not db_rows(env["state"], "SELECT seq FROM events WHERE payload LIKE '%resource_missing.model%'")
