"""``jupyter goals status | recover [--explain] | stop-all | doctor``: works on the stores directly,
so it also works while the server is down."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from jupyter_goals.store import control as c
from jupyter_goals.store.db import Database, MigrationFailed, StorageUnavailable
from jupyter_goals.store.schema import current_version, migrate


def _config(args: argparse.Namespace) -> tuple[Path, str, str]:
    from jupyter_goals.server.app import GoalsApp

    app = GoalsApp()
    cfg = app.service_config()
    state = Path(args.state_dir).absolute() if args.state_dir else cfg.state_dir
    control = args.control_db_url or (cfg.control_db_url if not args.state_dir else f"sqlite:///{state / 'control.db'}")
    usage = cfg.usage_db_url if not args.state_dir else f"sqlite:///{state / 'usage.db'}"
    return state, control, usage


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_status(db: Database) -> int:
    def run(tx: c.Tx) -> list[dict[str, Any]]:  # type: ignore[name-defined]
        return tx.all(
            "SELECT w.work_id, s.title, w.kind, w.desired_state, w.phase, w.reason_code, w.reason, w.control_version"
            " FROM work_items w JOIN sessions s ON s.session_id = w.session_id ORDER BY w.created_at DESC LIMIT 50"
        )

    rows = db.transact(run, write=False)
    if not rows:
        print("No work yet.")
    for r in rows:
        print(f"{r['work_id']}  {r['phase']:<11} {r['desired_state']:<9} {r['title'][:30]:<30} {r['reason']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jupyter goals", description="Durable AI-agent work for Jupyter.")
    p.add_argument("--state-dir", help="state dir (default: $JUPYTER_GOALS_STATE_DIR or the Jupyter data dir)")
    p.add_argument("--control-db-url", help="control database URL")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="list recent work items with state and reason")
    rec = sub.add_parser("recover", help="run the Coordinator's recovery entry point once")
    rec.add_argument("--explain", action="store_true", help="only print what recovery would decide, and why")
    sub.add_parser("stop-all", help="quit and stop all tasks: persist user stop intent for every running item")
    sub.add_parser("doctor", help="check the stores, schema and model")
    demo = sub.add_parser("demo", help="offline: kill -9 a server while a chat's command runs, restart it, and watch"
                                       " the chat finish by itself with the command run exactly once")
    demo.add_argument("--dir", help="where to keep the demo's state and workspace (default: a new temp dir)")
    args = p.parse_args(argv)
    if args.command == "demo":
        from jupyter_goals.demo.crash_demo import run_demo

        return run_demo(args.dir)
    state, control_url, usage_url = _config(args)
    if args.command == "doctor":
        return doctor(state, control_url, usage_url)
    if control_url.startswith("sqlite:///") and not os.path.exists(control_url.removeprefix("sqlite:///")):
        print(f"error: no control database at {control_url} (has the server run with this state dir?)", file=sys.stderr)
        return 2
    db = Database(control_url)
    try:
        version = db.transact(current_version, write=False)
        if version == 0:
            print("error: the control database has no schema yet", file=sys.stderr)
            return 2
        if args.command == "status":
            return cmd_status(db)
        if args.command == "stop-all":
            stopped = db.transact(c.stop_all)
            print(f"Stopped {len(stopped)} work item(s)." if stopped else "Nothing was running.")
            return 0
        if args.command == "recover":
            return asyncio.run(recover(db, state, args.explain))
    except StorageUnavailable as exc:
        print(f"error: storage unavailable: {exc}", file=sys.stderr)
        return 3
    finally:
        db.close()
    return 0


async def recover(db: Database, state: Path, explain: bool) -> int:
    from jupyter_goals.recovery.coordinator import Coordinator
    from jupyter_goals.runtime.tools import ToolRegistry
    from jupyter_goals.server.app import demo_model

    coord = Coordinator(db, state_dir=state, default_model=demo_model(), registry=ToolRegistry())
    if explain:
        _print(await coord.explain())
    else:
        coord.admission_open = False  # only the server's Coordinator admits; this repairs and decides
        _print((await coord.recover()).as_dict())
    return 0


def doctor(state: Path, control_url: str, usage_url: str) -> int:
    ok = True
    print(f"state dir: {state}")
    for which, url in (("control", control_url), ("usage", usage_url)):
        db = Database(url)
        try:
            v = db.transact(current_version, write=False)
            print(f"{which}: {url} schema v{v}")
        except StorageUnavailable as exc:
            ok = False
            print(f"{which}: UNAVAILABLE: {exc}")
        finally:
            db.close()
    try:
        for which, url in (("control", control_url), ("usage", usage_url)):
            if url.startswith("sqlite:///") and not os.path.exists(url.removeprefix("sqlite:///")):
                continue
            db = Database(url)
            try:
                migrate_check(db, which)
            finally:
                db.close()
    except MigrationFailed as exc:
        ok = False
        print(f"migration: FAILED: {exc}")
    print("ok" if ok else "problems found")
    return 0 if ok else 1


def migrate_check(db: Database, which: str) -> None:
    from jupyter_goals.store.schema import MIGRATIONS

    v = db.transact(current_version, write=False)
    newest = MIGRATIONS[which][-1][0]
    if v > newest:
        raise MigrationFailed(f"{which} schema v{v} is newer than this code (v{newest})")
    if v < newest:
        print(f"{which}: will migrate v{v} -> v{newest} at next server start (a backup is made first)")
    _ = migrate  # migrations themselves run only in the server


if __name__ == "__main__":
    sys.exit(main())
