"""Every example notebook in notebooks/ runs top to bottom in a real ipykernel (nbclient) against a real
``jupyter server`` with the bundled demo model, offline; the outputs show the states reached and the
ids the MIME bundles carry. Notebook 02 is run while the test kills the server with SIGKILL during its
slow command and starts it again: the command still runs exactly once."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from jupyter_goals.clients.notebook import cards
from jupyter_goals.server.app import demo_model
from tests.kernels import bundles, cell_outputs, ci_env, run_notebook, scripted_server, text
from tests.openai_server import OpenAITestServer, Plan, openai_usage
from tests.servers import ServerProcess, db_rows, wait_for

pytestmark = pytest.mark.slow  # real server, real kernels

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with scripted_server(tmp_path_factory.mktemp("notebooks"), [], model=demo_model()) as s:
        yield s


def run(server: ServerProcess, name: str, **env: str) -> tuple[nbformat.NotebookNode, Path]:
    workdir = server.root_dir / Path(name).stem  # each notebook in its own folder, as a person would keep it
    workdir.mkdir()
    return run_notebook(NOTEBOOKS / name, server, workdir, **env), workdir


def ids(outputs: list[dict[str, Any]], mime: str) -> list[dict[str, str]]:
    return [b[mime] for b in bundles(outputs, mime)]


def test_the_examples_are_the_six_notebooks_run_here() -> None:
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == [
        "01_first_chat_and_goal.ipynb", "02_approvals_and_restart.ipynb", "03_background_job.ipynb",
        "04_usage_and_budget.ipynb", "05_workflow_api.ipynb", "06_real_model.ipynb"]


def test_01_first_chat_and_goal(server: ServerProcess) -> None:
    nb, workdir = run(server, "01_first_chat_and_goal.ipynb")
    [chat] = bundles(cell_outputs(nb, "chat"), cards.CHAT_MIME)
    assert "offline demo model" in chat["text/html"]
    assert set(chat) == {cards.CHAT_MIME, "text/html", "text/plain"}  # ids plus the fallback snapshot
    [goal_bundle] = bundles(cell_outputs(nb, "goal"), cards.GOAL_MIME)
    assert set(goal_bundle) == {cards.GOAL_MIME, "text/html", "text/plain"}  # ids plus the fallback snapshot
    goal_ids = goal_bundle[cards.GOAL_MIME]
    assert set(goal_ids) == {"goal_id", "session_id"}
    assert ids(cell_outputs(nb, "wait"), cards.GOAL_MIME) == [goal_ids]
    assert "state achieved" in text(cell_outputs(nb, "wait"))
    assert server.client().goal(goal_ids["goal_id"])["state"] == "achieved"
    assert (workdir / "hello.txt").read_text() == "hello\n"
    [record] = ids(cell_outputs(nb, "history"), cards.HISTORY_MIME)
    assert record["session_id"] == goal_ids["session_id"]
    # the notebook's path is bound to the session the Goal ran in (--bypass rebinds it)
    bound = server.client().notebook_session("01_first_chat_and_goal/01_first_chat_and_goal.ipynb")
    assert bound["session_id"] == goal_ids["session_id"]


def test_02_approvals_and_a_server_killed_during_the_slow_command(server: ServerProcess) -> None:
    result: dict[str, Any] = {}

    def execute() -> None:
        try:
            result["nb"], result["dir"] = run(server, "02_approvals_and_restart.ipynb")
        except BaseException as exc:  # reported below
            result["error"] = exc

    runner = threading.Thread(target=execute)
    runner.start()

    def slow_command_running() -> bool:
        rows = db_rows(server.state_dir, "SELECT effect_id FROM effects WHERE state = 'dispatched'"
                                         " AND arguments LIKE '%sleep 10%'")
        # its stdout file exists once the command itself started (before that, a crash leaves it unknown)
        return any((server.state_dir / "effects" / r["effect_id"] / "stdout").exists() for r in rows)

    wait_for(lambda: slow_command_running() or not runner.is_alive(), timeout=240, what="the slow command running")
    assert "error" not in result, result.get("error")
    server.kill()  # SIGKILL of the server and its workers while the command runs
    server.start(same_port=True)  # the kernel keeps waiting on the same address
    runner.join(400)
    assert not runner.is_alive() and "error" not in result, result.get("error")

    nb, workdir = result["nb"], result["dir"]
    [goal_ids] = ids(cell_outputs(nb, "goal"), cards.GOAL_MIME)
    [approval_bundle] = bundles(cell_outputs(nb, "wait"), cards.APPROVAL_MIME)  # the Goal stopped at an approval
    assert set(approval_bundle) == {cards.APPROVAL_MIME, "text/html", "text/plain"}
    approval = approval_bundle[cards.APPROVAL_MIME]
    assert set(approval) == {"approval_id", "session_id"} and approval["session_id"] == goal_ids["session_id"]
    assert "Goal achieved" in text(cell_outputs(nb, "approve"))
    assert (workdir / "hello.txt").read_text() == "hello\n"
    assert "did not start it again" in text(cell_outputs(nb, "after"))  # the answer says what happened
    assert (workdir / "slow-demo.log").read_text().count("\n") == 1  # ran exactly once across the crash


def test_03_background_job(server: ServerProcess) -> None:
    nb, _ = run(server, "03_background_job.ipynb")
    out = text(cell_outputs(nb, "result"))
    assert out.splitlines()[0] == "done"
    assert "Those are the files" in out


def test_04_usage_and_a_hard_budget(server: ServerProcess) -> None:
    nb, _ = run(server, "04_usage_and_budget.ipynb")
    usage = text(cell_outputs(nb, "usage"))
    assert "Known $0.00" in usage and "'input'" in usage
    budget = text(cell_outputs(nb, "budget"))
    assert budget.startswith("budget_exhausted")


def test_05_workflow_api_sync_and_async(server: ServerProcess) -> None:
    nb, _ = run(server, "05_workflow_api.ipynb")
    assert "Those are the files" in text(cell_outputs(nb, "sync"))
    answers = text(cell_outputs(nb, "async"))
    assert answers.count("offline demo model") == 2


def test_06_real_model_is_skipped_without_a_key(server: ServerProcess) -> None:
    nb, _ = run(server, "06_real_model.ipynb", OPENAI_API_KEY="")
    assert text(cell_outputs(nb, "check")).startswith("Skipped: OPENAI_API_KEY is not set")
    assert cell_outputs(nb, "chat") == []


def test_06_real_model_talks_to_an_openai_compatible_server(tmp_path: Path) -> None:
    """With a key, notebook 06 chats through the OpenAI-compatible provider (here a local scripted one)."""
    with OpenAITestServer(Plan(text_chunks=["Hello ", "in five words, friend."], usage_chunks=[openai_usage(12, 6)])) as fake:
        env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": fake.base_url, "OPENAI_MODEL": "test-model"}
        s = ServerProcess(tmp_path / "state", tmp_path / "root", model=demo_model(), env=env)
        (tmp_path / "root").mkdir()
        try:
            s.start()
            workdir = s.root_dir / "06"
            workdir.mkdir()
            nb = run_notebook(NOTEBOOKS / "06_real_model.ipynb", s, workdir, **env)
        finally:
            s.kill()
        assert text(cell_outputs(nb, "check")) == ""
        answer = text(cell_outputs(nb, "chat"))
        assert answer.startswith("Hello in five words, friend.") and "Known" in answer
        assert fake.requests and fake.requests[0].body["model"] == "test-model"


# ---------------------------------------------------------------------- as CI runs notebooks: no Jupyter session


def run_cli(args: list[str], cwd: Path, env: dict[str, str]) -> None:
    """``python -m <tool> …`` as a CI step; its stderr is the failure message."""
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]


def test_every_example_runs_under_nbconvert_execute_without_a_jupyter_session(server: ServerProcess) -> None:
    """``jupyter nbconvert --execute notebooks/*.ipynb`` beside a running server, as a CI job runs the
    examples: each kernel has no ``JPY_SESSION_NAME``, was not started by the server and finds it through
    its runtime file. Not knowing their notebook, the kernels of one folder share that folder's session
    (``GoalsClient.kernel_notebook_path``); 02 still stops at its approval, since it starts a session of its own."""
    folder = server.root_dir / "ci" / "notebooks"
    folder.mkdir(parents=True)
    for notebook in NOTEBOOKS.glob("*.ipynb"):
        shutil.copy(notebook, folder)
    out = server.root_dir / "ci" / "executed"
    run_cli(["nbconvert", "--to", "notebook", "--execute", f"--output-dir={out}", "--ExecutePreprocessor.timeout=300",
             *sorted(str(p) for p in folder.glob("*.ipynb"))], server.root_dir, ci_env(server, OPENAI_API_KEY=""))
    executed = {p.name: nbformat.read(p, as_version=4) for p in out.glob("*.ipynb")}
    assert sorted(executed) == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))

    first = executed["01_first_chat_and_goal.ipynb"]
    assert "offline demo model" in text(cell_outputs(first, "chat"))
    assert "state achieved" in text(cell_outputs(first, "wait")) and (folder / "hello.txt").read_text() == "hello\n"
    nb = executed["02_approvals_and_restart.ipynb"]
    [goal_ids] = ids(cell_outputs(nb, "goal"), cards.GOAL_MIME)
    [approval] = ids(cell_outputs(nb, "wait"), cards.APPROVAL_MIME)  # not 01's --bypass session of this folder
    assert approval["session_id"] == goal_ids["session_id"]
    assert "Goal achieved" in text(cell_outputs(nb, "approve"))
    assert "slow command finished" in text(cell_outputs(nb, "after"))
    assert (folder / "slow-demo.log").read_text().count("\n") == 1
    # the folder's session is now 02's: a re-run from this folder finds it again
    assert server.client().notebook_session(f"{folder}/")["session_id"] == goal_ids["session_id"]
    assert text(cell_outputs(executed["03_background_job.ipynb"], "result")).splitlines()[0] == "done"
    assert text(cell_outputs(executed["04_usage_and_budget.ipynb"], "budget")).startswith("budget_exhausted")
    assert text(cell_outputs(executed["05_workflow_api.ipynb"], "async")).count("offline demo model") == 2
    assert text(cell_outputs(executed["06_real_model.ipynb"], "check")).startswith("Skipped: OPENAI_API_KEY")


def test_02_runs_under_papermill_from_the_server_root(server: ServerProcess) -> None:
    """``papermill notebooks/02_approvals_and_restart.ipynb out.ipynb`` run in the server's root: papermill's
    kernel works in papermill's own folder (here the root, whose session key is ``./``), not the notebook's."""
    out = server.root_dir.parent / "papermill-02.ipynb"
    run_cli(["papermill", "--no-progress-bar", str(NOTEBOOKS / "02_approvals_and_restart.ipynb"), str(out)],
            server.root_dir, ci_env(server))
    nb = nbformat.read(out, as_version=4)
    [goal_ids] = ids(cell_outputs(nb, "goal"), cards.GOAL_MIME)
    assert "Goal achieved" in text(cell_outputs(nb, "approve"))
    assert "slow command finished" in text(cell_outputs(nb, "after"))
    assert (server.root_dir / "slow-demo.log").read_text().count("\n") == 1
    assert server.client().notebook_session("./")["session_id"] == goal_ids["session_id"]
