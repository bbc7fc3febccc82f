"""One configuration object: the CLI's ``recover --explain`` decides with the server's configuration
(read from the state dir the server wrote it to), so it explains the decision the server then makes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyter_goals.config import CONFIG_FILE, ConfigError, GoalsConfig
from jupyter_goals.runtime.worker import INVALID_CONFIG_EXIT
from tests.servers import db_rows, running_shell, server_env, wait_for

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
    assert GoalsConfig.load(tmp_path) == cfg.replace(secrets={})
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


# every GoalsApp trait with a value other than its default, as it reaches the configuration
EVERY_TRAIT: dict[str, Any] = {
    "state_dir": "/srv/goals-state", "control_db_url": "postgresql://db.example/control",
    "usage_db_url": "postgresql://db.example/usage", "default_model": "scripted:/models/s.json", "workers": 3,
    "max_concurrent_turns": 7, "lease_ttl_s": 31.0, "heartbeat_s": 3.5, "auto_recover": False,
    "allow_cross_host_takeover": True, "reconcile_interval_s": 9.0, "safety_tick_s": 0.25,
    "price_table": "/srv/prices.json", "trusted_tools": {"t": {"impl": "m:f", "capability": "read_only"}},
    "max_recovery_attempts": 2, "recovery_backoff_s": 0.3, "provider_retry_base_s": 0.7, "shutdown_timeout_s": 4.0,
    "models": {"tiny": {"provider": "scripted", "model": "/x.json"}}, "cancel_grace_s": 1.5,
    "max_request_bytes": 1024, "max_message_chars": 99, "tool_env_allow": ["MY_SETTING", "PROJ_*"],
}


def test_every_trait_reaches_the_configuration_and_the_worker_document_under_its_own_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One configuration object, every setting named as its trait: each ``GoalsApp.<name>`` set on the
    app is ``GoalsConfig.<name>`` with the same value, and the one document a worker reads on its stdin
    gives back the very same configuration, the server's secrets included."""
    from jupyter_goals.server.app import GoalsApp

    monkeypatch.delenv("JUPYTER_GOALS_STATE_DIR", raising=False)
    assert set(EVERY_TRAIT) == set(GoalsApp.class_own_traits(config=True))  # a new trait is listed here too
    app = GoalsApp(**EVERY_TRAIT)
    cfg = app.service_config()
    for name, value in EVERY_TRAIT.items():
        assert value != GoalsApp.class_traits()[name].default(), f"{name}: choose a value other than the default"
        expected = Path(value) if name == "state_dir" else tuple(value) if name == "tool_env_allow" else value
        assert getattr(cfg, name) == expected, name

    with_secret = cfg.replace(secrets={"JUPYTER_GOALS_TOKEN": "tok-123"})
    assert GoalsConfig.from_document(with_secret.document()) == with_secret
    assert "tok-123" not in repr(with_secret) and "tok-123" not in json.dumps(with_secret.public())


@pytest.mark.parametrize(("traits", "named"), [
    ({"heartbeat_s": 0.0}, ["GoalsApp.heartbeat_s: Input should be greater than 0"]),
    ({"heartbeat_s": 5.0, "lease_ttl_s": 3.0}, ["GoalsApp.heartbeat_s (5.0) must be shorter than GoalsApp.lease_ttl_s"]),
    ({"max_concurrent_turns": 0, "cancel_grace_s": -1.0},
     ["GoalsApp.max_concurrent_turns: Input should be greater than or equal to 1 (given 0)",
      "GoalsApp.cancel_grace_s: Input should be greater than or equal to 0 (given -1.0)"]),
])
def test_a_configuration_no_server_can_run_with_is_refused_once_naming_each_setting(
    traits: dict[str, Any], named: list[str],
) -> None:
    from jupyter_goals.server.app import GoalsApp

    with pytest.raises(ConfigError) as refused:
        GoalsApp(**traits).service_config()
    for sentence in named:
        assert sentence in str(refused.value)


def _worker(document: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jupyter_goals.runtime.worker", "--worker-id", "w_test",
                           "--no-parent-death"], input=document, capture_output=True, text=True, timeout=60)


def test_a_worker_given_an_invalid_configuration_document_exits_saying_what_is_wrong(tmp_path: Path) -> None:
    """A worker runs only on the configuration its server validated: a document it cannot accept makes it
    exit at once (EX_CONFIG) with one line naming each wrong setting, never run on defaults, never
    repeat a secret, and never touch a store."""
    secret = "tok-s3cret-value"
    cases = [
        ("not json", ["Invalid JSON"]),
        (json.dumps(["a", "list"]), ["Input should be an object"]),
        (json.dumps({"state_dir": str(tmp_path), "default_model": "m", "heartbeat_s": -1, "workers": "two",
                     "capacity": 8}),
         ["GoalsApp.heartbeat_s: Input should be greater than 0 (given -1)",
          "GoalsApp.workers: Input should be a valid integer", "GoalsApp.capacity: Extra inputs are not permitted"]),
        (json.dumps({"state_dir": str(tmp_path), "secrets": {"JUPYTER_GOALS_TOKEN": secret}}),
         ["GoalsApp.default_model: Field required"]),
    ]
    for document, named in cases:
        done = _worker(document)
        assert done.returncode == INVALID_CONFIG_EXIT, done.stderr
        assert done.stderr.startswith("jupyter_goals worker w_test: invalid configuration document on stdin: ")
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
        for sentence in named:
            assert sentence in done.stderr, done.stderr
        assert secret not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no store opened, no wake-up socket bound


@pytest.mark.slow
def test_traits_reach_each_worker_in_one_stdin_document_never_in_its_argv_or_environment(tmp_path: Path) -> None:
    """A real server started with ``--GoalsApp.lease_ttl_s=123.5 --GoalsApp.heartbeat_s=0.2`` starts a
    worker whose command line names only its id and whose environment holds no secret; the worker still
    runs with both settings (its leases are 123.5 s long, renewed every 0.2 s) and with the server's
    token, which it redacts from a tool's output."""
    rules: list[dict[str, Any]] = [
        {"when": {"purpose": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "read"}},
        {"when": {"purpose": "work"},
         "respond": {"tool_calls": [{"name": "shell", "arguments": {"command": "cat token.txt"}}]}},
    ]
    with server_env(tmp_path, rules) as env:
        server = env["make"](["--GoalsApp.lease_ttl_s=123.5", "--GoalsApp.heartbeat_s=0.2"])
        (env["root"] / "token.txt").write_text(server.token)  # a tool that finds the server's token prints it
        server.start()
        (worker,) = server.workers()
        pid, worker_id = int(worker["pid"]), str(worker["worker_id"])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        assert argv[1:] == ["-m", "jupyter_goals.runtime.worker", "--worker-id", worker_id]
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        assert server.token not in environ and "JUPYTER_GOALS_TOKEN=" not in environ

        beats: dict[float, float] = {}  # heartbeat_at -> lease_expires_at, as the worker wrote them

        def beating() -> bool:
            for row in db_rows(env["state"], "SELECT heartbeat_at, lease_expires_at FROM workers WHERE worker_id = ?",
                               (worker_id,)):
                beats[row["heartbeat_at"]] = row["lease_expires_at"]
            return len(beats) >= 6

        wait_for(beating, timeout=10, what="six heartbeats (at the default heartbeat_s of 2 s this takes 10 s)")
        assert all(lease - beat == pytest.approx(123.5, abs=1e-3) for beat, lease in beats.items())
        times = sorted(beats)
        assert all(0.15 < later - earlier < 1.5 for earlier, later in zip(times, times[1:], strict=False))

        cl = server.client()
        sid = str(cl.create_session(title="token", cwd=str(env["root"]),
                                    permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "show me the file", client_request_id="t1")
        snap = cl.wait(sid, timeout=60)
        assert snap["work"]["phase"] == "done", snap["work"]
        result = next(i for i in snap["transcript"]["items"] if i["kind"] == "tool_result")["content"]
        assert "[redacted: JUPYTER_GOALS_TOKEN]" in result and server.token not in result


@pytest.mark.slow
def test_a_server_configured_with_a_heartbeat_longer_than_the_lease_does_not_start_the_extension(
    tmp_path: Path,
) -> None:
    """Validated once, before anything runs: the extension is not started (its routes are 404) and the
    log names both settings, instead of workers whose leases expire between their heartbeats."""
    with server_env(tmp_path, []) as env:
        server = env["make"](["--GoalsApp.heartbeat_s=5", "--GoalsApp.lease_ttl_s=3"]).start(wait=False)
        server.ready = "status"  # Jupyter answers; the extension must not
        server.wait_ready()
        headers = {"Authorization": f"token {server.token}"}
        assert httpx.get(f"{server.url}api/goals/health", headers=headers, timeout=5).status_code == 404
        log = server.log()
        assert "jupyter_goals is not started, its configuration is invalid" in log, log
        assert "GoalsApp.heartbeat_s (5.0) must be shorter than GoalsApp.lease_ttl_s (3.0)" in log, log
        assert not (env["state"] / "control.db").exists()
