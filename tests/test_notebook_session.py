"""A notebook's session is kept by the server (``PUT /api/goals/notebook-session``), follows the
contents manager's renames, and a kernel finds its server without a default URL (real server process)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jupyter_goals.clients.notebook import cards
from jupyter_goals.clients.rest import GoalsClient, GoalsError, ServerNotFound, find_server
from tests.kernels import Kernel, bundles, ci_env, errors, scripted_server, text
from tests.servers import ServerProcess, db_rows

pytestmark = pytest.mark.slow  # a real jupyter server process


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("nbsession")
    (tmp / "root" / "work").mkdir(parents=True)
    with scripted_server(tmp, [], {"text": "ok"}) as s:
        yield s


def contents(server: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=f"{server.url}api/contents", headers={"Authorization": f"token {server.token}"})


def test_put_is_get_or_create_one_session_per_path(server: ServerProcess) -> None:
    http = server.client().http
    first = http.put("/notebook-session", json={"path": "work/a.ipynb"})
    assert first.status_code == 201, first.text
    again = http.put("/notebook-session", json={"path": "work/./x/../a.ipynb"})  # same notebook, other spelling
    assert again.status_code == 200
    assert again.json()["session_id"] == first.json()["session_id"] and again.json()["path"] == "work/a.ipynb"
    # the absolute path a kernel gets in JPY_SESSION_NAME names the same notebook
    absolute = http.put("/notebook-session", json={"path": str(server.root_dir / "work" / "a.ipynb")})
    assert absolute.status_code == 200 and absolute.json()["session_id"] == first.json()["session_id"]
    session = server.client().session(first.json()["session_id"])["session"]
    assert session["title"] == "a.ipynb" and session["cwd"] == str(server.root_dir / "work")  # the notebook's folder
    rows = db_rows(server.state_dir, "SELECT path, session_id FROM notebook_sessions WHERE path = 'work/a.ipynb'")
    assert rows == [{"path": "work/a.ipynb", "session_id": first.json()["session_id"]}]


@pytest.mark.parametrize("body", [{"path": "../outside.ipynb"}, {"path": "/etc/passwd"}, {"path": ""},
                                  {"path": "x.ipynb", "colour": "red"}, {}])
def test_bad_notebook_paths_are_400(server: ServerProcess, body: dict[str, str]) -> None:
    r = server.client().http.put("/notebook-session", json=body)
    assert r.status_code == 400 and set(r.json()) == {"error", "message"}


def test_binding_to_an_existing_session_and_an_unknown_one(server: ServerProcess) -> None:
    client = server.client()
    other = client.create_session(title="other")["session_id"]
    assert client.notebook_session("b.ipynb", session_id=other)["session_id"] == other
    assert client.notebook_session("b.ipynb")["session_id"] == other
    with pytest.raises(GoalsError) as err:
        client.notebook_session("b.ipynb", session_id="ses_missing")
    assert err.value.status == 404



def test_no_notebook_path_is_refused_by_the_client_saying_what_to_do(server: ServerProcess,
                                                                    bare_env: pytest.MonkeyPatch) -> None:
    """Outside a kernel (a script, a terminal) ``kernel_notebook_path()`` is None; ``notebook_session(None)``
    is refused before anything is sent, with what to do instead (it used to be a pydantic 400)."""
    client = GoalsClient(server.url, server.token)
    assert client.kernel_notebook_path() is None
    for path in (None, "", "  "):
        with pytest.raises(ValueError) as err:
            client.notebook_session(path)
        message = str(err.value)
        for named in ("GoalsClient(notebook=", "JUPYTER_GOALS_NOTEBOOK", "create_session()"):
            assert named in message
        assert "Input should be" not in message


def test_a_folder_path_names_the_session_of_the_kernels_that_run_there(server: ServerProcess) -> None:
    """A path ending in ``/`` (what a kernel that cannot know its notebook sends: its working directory)
    names that folder's session: its folder as cwd, ``./`` for the root, moved with the folder."""
    client = server.client()
    work = client.notebook_session(f"{server.root_dir / 'work'}/")
    assert work["path"] == "work/" and client.notebook_session("work/")["session_id"] == work["session_id"]
    assert client.notebook_session("work/a.ipynb")["session_id"] != work["session_id"]  # a notebook is its own
    session = client.session(work["session_id"])["session"]
    assert session["cwd"] == str(server.root_dir / "work") and session["title"] == "work/"
    root = client.notebook_session(f"{server.root_dir}/")
    assert root["path"] == "./" and client.notebook_session("./")["session_id"] == root["session_id"]
    assert client.session(root["session_id"])["session"]["cwd"] == str(server.root_dir)
    with contents(server) as files:
        assert files.put("/kfold", json={"type": "directory"}).status_code in (200, 201)
        sid = client.notebook_session("kfold/")["session_id"]
        assert files.patch("/kfold", json={"path": "kmoved"}).status_code == 200
        assert client.notebook_session("kmoved/")["session_id"] == sid
    with pytest.raises(GoalsError) as err:  # a kernel working outside the server root has no folder session
        client.notebook_session(f"{server.state_dir}/")
    assert err.value.status == 400
    assert "outside the server root" in err.value.message and "JUPYTER_GOALS_NOTEBOOK" in err.value.message


def test_a_kernel_that_cannot_know_its_notebook_uses_what_it_is_told_else_its_folder(server: ServerProcess) -> None:
    """A plain kernel (nbconvert, papermill, nbclient: no ``JPY_SESSION_NAME``, not the server's): the
    ``notebook`` argument, VS Code's ``__vsc_ipynb_file__``, ``JUPYTER_GOALS_NOTEBOOK``, else its working
    directory; outside the server root the magics keep a session of their own."""
    kernel = Kernel(ci_env(server), server.root_dir / "work")
    try:
        out = kernel.run("from jupyter_goals import GoalsClient\ngoals = GoalsClient()\n"
                         "print(goals.address.found_by, '|', goals.kernel_notebook_path())")
        assert text(out).strip() == f"runtime file (the working directory) | {server.root_dir / 'work'}/", out
        out = kernel.run("import os\nos.environ['JUPYTER_GOALS_NOTEBOOK'] = 'work/told.ipynb'\n"
                         "print(goals.kernel_notebook_path(), GoalsClient(notebook='arg.ipynb').kernel_notebook_path())")
        assert text(out).split() == ["work/told.ipynb", "arg.ipynb"], out
        out = kernel.run(f"__vsc_ipynb_file__ = {str(server.root_dir / 'vs.ipynb')!r}\nprint(goals.kernel_notebook_path())")
        assert text(out).strip() == str(server.root_dir / "vs.ipynb"), out
        out = kernel.run(f"del __vsc_ipynb_file__, os.environ['JUPYTER_GOALS_NOTEBOOK']\nos.chdir({str(server.state_dir)!r})\n"
                         "%load_ext jupyter_goals\n%chat --wait hello")
        assert not errors(out), out
        [bundle] = bundles(out, cards.CHAT_MIME)
        assert "ok" in bundle["text/html"]
    finally:
        kernel.shutdown()


def test_renaming_a_notebook_or_its_folder_keeps_its_session(server: ServerProcess) -> None:
    client = server.client()
    with contents(server) as files:
        assert files.put("/c.ipynb", json={"type": "notebook"}).status_code in (200, 201)
        sid = client.notebook_session("c.ipynb")["session_id"]
        r = files.patch("/c.ipynb", json={"path": "renamed.ipynb"})  # what JupyterLab's rename sends
        assert r.status_code == 200, r.text
        assert client.notebook_session("renamed.ipynb")["session_id"] == sid
        assert client.notebook_session("c.ipynb")["session_id"] != sid  # the old name is free again

        assert files.put("/proj", json={"type": "directory"}).status_code in (200, 201)
        assert files.put("/proj/d.ipynb", json={"type": "notebook"}).status_code in (200, 201)
        inner = client.notebook_session("proj/d.ipynb")["session_id"]
        assert files.patch("/proj", json={"path": "moved"}).status_code == 200
        assert client.notebook_session("moved/d.ipynb")["session_id"] == inner
    kinds = [e["kind"] for e in client.events(after=0, limit=5000)["events"] if e["session_id"] in (sid, inner)]
    assert kinds.count("notebook.renamed") == 2


# ---------------------------------------------------------------------- finding the server


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("JUPYTER_GOALS_SERVER_URL", "JUPYTER_GOALS_TOKEN", "JUPYTER_GOALS_NOTEBOOK", "JPY_PARENT_PID",
                 "JPY_SESSION_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "empty-runtime"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_explicit_arguments_win_over_the_environment(server: ServerProcess, bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("JUPYTER_GOALS_SERVER_URL", "http://127.0.0.1:9/")
    found = find_server(server.url, server.token)
    assert (found.url, found.token, found.found_by) == (server.url, server.token, "argument")
    assert GoalsClient(server.url, server.token).health()["status"] == "ok"


def test_environment_variables_come_next(server: ServerProcess, bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("JUPYTER_GOALS_SERVER_URL", server.url)
    bare_env.setenv("JUPYTER_GOALS_TOKEN", server.token)
    assert find_server().found_by == "JUPYTER_GOALS_SERVER_URL"
    assert GoalsClient().health()["status"] == "ok"


def test_runtime_files_are_matched_to_the_kernels_server(server: ServerProcess, bare_env: pytest.MonkeyPatch) -> None:
    runtime = server.state_dir.parent / "jupyter_runtime"  # where this server wrote its jpserver-*.json
    assert list(runtime.glob("jpserver-*.json"))
    bare_env.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    assert server.proc is not None
    bare_env.setenv("JPY_PARENT_PID", str(server.proc.pid))  # what jupyter_client gives the kernels it starts
    found = find_server()
    assert found.found_by == "runtime file (JPY_PARENT_PID)" and found.token == server.token
    assert GoalsClient().health()["status"] == "ok"

    bare_env.setenv("JPY_PARENT_PID", "1")
    bare_env.setenv("JPY_SESSION_NAME", str(server.root_dir / "work" / "a.ipynb"))
    assert find_server().found_by == "runtime file (the notebook's folder)"

    bare_env.delenv("JPY_SESSION_NAME")
    bare_env.chdir(server.root_dir / "work")
    assert find_server().found_by == "runtime file (the working directory)"
    bare_env.chdir(server.state_dir)  # outside the root: only one server runs here, so it is that one
    assert find_server().found_by == "runtime file (the only running server)"


def test_no_server_is_a_clear_error_naming_what_was_tried(bare_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    # a runtime file of a server that is gone does not count
    (runtime / "jpserver-999999.json").write_text(json.dumps({"pid": 999999, "url": "http://127.0.0.1:9/"}))
    bare_env.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    with pytest.raises(ServerNotFound) as err:
        GoalsClient()
    text = str(err.value)
    for named in ("url/token arguments", "JUPYTER_GOALS_SERVER_URL", str(runtime), "no running server",
                  "JPY_PARENT_PID=unset", "jupyter server list"):
        assert named in text
    assert "8888" not in text


def test_a_request_waits_for_a_server_that_is_restarting(server: ServerProcess) -> None:
    """Connection refused (and 503 ``starting``) is retried for ``retry_s``: nothing was processed."""
    patient, impatient = GoalsClient(server.url, server.token, retry_s=90), GoalsClient(server.url, server.token,
                                                                                       retry_s=0)
    server.kill()
    with pytest.raises(httpx.ConnectError):
        impatient.health()
    restarter = threading.Timer(1.0, lambda: server.start(same_port=True, wait=False))
    restarter.start()
    try:
        # answered by the restarted server on the same port, once past its 503 "starting"
        assert isinstance(patient.sessions(), list)
    finally:
        restarter.join()
    server.wait_ready()
