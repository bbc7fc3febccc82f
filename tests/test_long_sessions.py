"""Long, busy sessions at constant cost (issue 14): the worker re-projects only what changed each step
(property-tested in test_repair.py), and a history that would overflow the model's context window is
compacted once into a durable summary that requests then carry instead of what it covers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jupyter_goals.models import ItemKind
from jupyter_goals.server.catalog import NAMED_ENV
from tests.inproc import Rig
from tests.servers import db_rows, server_env

SUMMARY_MARKER = "[summary of the earlier conversation"
BIG = "x" * 8000  # about 2,000 tokens a read: the third request would pass 80% of a 4,000-token window


def rules() -> list[dict[str, Any]]:
    return [
        {"when": {"purpose": "compaction"},
         "respond": {"text": "The user asked to read big.txt repeatedly; it was read twice, all x's.",
                     "usage": {"input_tokens": 4000, "output_tokens": 20}}},
        {"when": {"purpose": "work", "any_text_contains": SUMMARY_MARKER},
         "respond": {"text": "done after compaction", "usage": {"input_tokens": 60, "output_tokens": 5}}},
        {"when": {"purpose": "work"},
         "respond": {"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}],
                     "usage": {"input_tokens": 100, "output_tokens": 10}}},
    ]


def named(script: str, window: int = 4000) -> dict[str, Any]:
    return {"tiny": {"provider": "scripted", "model": script.removeprefix("scripted:"), "context_window": window}}


async def test_a_long_history_is_compacted_once_and_the_work_continues_on_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig(tmp_path, rules())
    monkeypatch.setenv(NAMED_ENV, json.dumps(named(rig.model)))
    (rig.root / "big.txt").write_text(BIG)
    try:
        sid = rig.tx(lambda tx: __import__("jupyter_goals.store.control", fromlist=["c"]).create_session(
            tx, "long", str(rig.root), "tiny", {"mode": "bypass"}))["session_id"]
        rig.send(sid, "read big.txt until you are told to stop")
        await rig.run_until_quiet()
        items = rig.items(sid)
        kinds = [i.kind for i in items]
        assert kinds.count(ItemKind.COMPACTION) == 1
        summary = next(i for i in items if i.kind == ItemKind.COMPACTION)
        assert summary.meta["up_to_seq"] < summary.seq and summary.content.startswith("The user asked")
        # the stored transcript is never shortened: both reads stay, with their full output
        assert sum(1 for i in items if i.kind == ItemKind.TOOL_RESULT and i.content == BIG) == 2
        assert [i.content for i in items if i.kind == ItemKind.ASSISTANT][-1] == "done after compaction"
        purposes = [r["purpose"] for r in rig.rows("SELECT purpose FROM requests ORDER BY created_at")]
        assert purposes == ["work", "work", "compaction", "work"]  # attributed and counted like any other
    finally:
        rig.close()


async def test_a_model_without_a_known_context_window_is_never_compacted(tmp_path: Path) -> None:
    rig = Rig(tmp_path, [{"when": {"purpose": "work", "last_tool_result_contains": "x"}, "respond": {"text": "ok"}},
                         *rules()[2:]])
    (rig.root / "big.txt").write_text(BIG * 4)
    try:
        sid = rig.session({"mode": "bypass"})
        rig.send(sid, "read it")
        await rig.run_until_quiet()
        assert not [i for i in rig.items(sid) if i.kind == ItemKind.COMPACTION]
    finally:
        rig.close()


@pytest.mark.slow
def test_a_crash_right_after_the_compaction_commit_reuses_the_summary(tmp_path: Path) -> None:
    """The worker dies at ``provider.after_commit`` of the compaction request (its 3rd commit), then the
    server is killed -9: after the restart the summary is not made again and the session continues."""
    with server_env(tmp_path, rules()) as env:
        (env["root"] / "big.txt").write_text(BIG)
        models = json.dumps(named(str(env["script"]).join(["scripted:", ""])))
        server = env["make"]([f"--GoalsApp.models={models}"], env={"JUPYTER_GOALS_CRASH_SCOPE": "group"})
        server.start(crash_at="provider.after_commit#3")
        cl = server.client()
        sid = str(cl.create_session(title="long", cwd=str(env["root"]), model="tiny",
                                    permissions={"mode": "bypass"})["session"]["session_id"])
        cl.send(sid, "read big.txt until you are told to stop", client_request_id="r1")
        # the worker takes the whole server down with it at the point (faults.py): a live server would
        # go on with the work before a kill from here
        assert server.wait_exit(timeout=60) == -9
        assert (env["state"] / "faults" / "provider.after_commit.fired").exists()
        compactions = db_rows(env["state"], "SELECT item_id FROM transcript WHERE kind = 'compaction'")
        assert len(compactions) == 1  # the crash came after the summary was durable
        server.start()
        snap = server.client().wait(sid, timeout=60)
        assert [i["content"] for i in snap["transcript"]["items"] if i["kind"] == "assistant"][-1] == "done after compaction"
        assert len(db_rows(env["state"], "SELECT item_id FROM transcript WHERE kind = 'compaction'")) == 1
        assert len(db_rows(env["state"], "SELECT request_id FROM requests WHERE purpose = 'compaction'")) == 1
