"""Several hosts on one PostgreSQL store, for the tests that need two real servers sharing it
(``tests/test_hosts.py``, ``tests/test_control_wake.py``): ``Hosts`` (host A and host B, each with its own
state dir and host name) on the stores of the ``hosts_store`` fixture (``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.servers import ServerProcess, write_script


def one_step_rules() -> list[dict[str, Any]]:
    """A chat whose message contains "work" runs one 30-second shell command that appends ``once`` to
    ``once.txt``, then answers "ok" (or "unknown; stop." after an unknown outcome)."""
    return [
        {"when": {"last_user_contains": "work", "tool_result_unknown": True}, "respond": {"text": "unknown; stop."}},
        {"when": {"last_user_contains": "work", "last_tool_result_contains": "exit status"}, "respond": {"text": "ok"}},
        {"when": {"last_user_contains": "work"}, "respond": {"text": "running", "tool_calls": [
            {"name": "shell", "arguments": {"command": "sleep 30; echo once >> once.txt"}}]}},
    ]


class Hosts:
    """Two servers on one store: host A and host B, each with its own state dir, one shared folder."""

    def __init__(self, tmp_path: Path, store: tuple[str, str], rules: list[dict[str, Any]],
                 extra: list[str] | None = None) -> None:
        self.control_url, usage_url = store
        self.root = tmp_path / "root"
        self.root.mkdir()
        model = write_script(tmp_path / "script.json", rules)
        args = [f"--GoalsApp.control_db_url={self.control_url}", f"--GoalsApp.usage_db_url={usage_url}",
                "--GoalsApp.max_concurrent_turns=4", *(extra or [])]
        self.a = ServerProcess(tmp_path / "a" / "state", self.root, model=model, extra=args,
                               env={"JUPYTER_GOALS_HOST_NAME": "host-a"})
        self.b = ServerProcess(tmp_path / "b" / "state", self.root, model=model, extra=args,
                               env={"JUPYTER_GOALS_HOST_NAME": "host-b"})
        for s in (self.a, self.b):
            s.state_dir.parent.mkdir(parents=True)

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Rows of the shared control store, read the way an operator would."""
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.control_url, row_factory=dict_row) as conn:
            return [dict(r) for r in conn.execute(sql.replace("?", "%s"), params)]  # type: ignore[arg-type]

    def close(self) -> None:
        self.a.kill()
        self.b.kill()
