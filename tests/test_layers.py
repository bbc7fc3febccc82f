"""Layering rules read from the source with ``ast``: SQL lives behind ``jupyter_goals/store/`` only, the
package's imports have no cycles, every import points down the declared layers (``LAYERS``), and no
module imports from a test module (shared fixtures and helpers
live in support modules such as ``tests/restkit.py`` and ``tests/servers.py``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_goals"
TESTS = Path(__file__).resolve().parent
BENCH = TESTS.parent / "bench"
SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER|REPLACE|UPSERT|PRAGMA|BEGIN|COMMIT|ROLLBACK|SAVEPOINT"
    r"|RELEASE|VACUUM|LISTEN|NOTIFY|LOCK|TRUNCATE)\b",
    re.IGNORECASE,
)
# the Tx methods that run SQL text (store/db.py); called on anything outside store/ they are SQL placement
SQL_METHODS = frozenset({"execute", "executemany", "executescript", "one", "all", "scalar", "script",
                         "insert_seq", "last_seq"})


def _text(node: ast.expr) -> str | None:
    """The leading literal text of a string expression (constant, f-string or concatenation)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _text(node.values[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left)
    return None


def _receiver(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def sql_outside_store(package: Path = PACKAGE) -> list[str]:
    """Every call outside ``store/`` that passes SQL text, or calls a transaction's SQL method."""
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            first = _text(node.args[0]) if node.args else None
            receiver = _receiver(node.func.value)
            if (first is not None and SQL_START.match(first)) or (
                node.func.attr in SQL_METHODS and receiver in ("tx", "conn", "connection", "cursor", "cur")
            ):
                found.append(f"{rel}:{node.lineno}: {receiver}.{node.func.attr}({(first or '')[:60]!r})")
    return found


def test_sql_lives_behind_the_store_only() -> None:
    assert sql_outside_store() == []


def test_sql_placement_check_finds_sql_in_a_module_outside_the_store(tmp_path: Path) -> None:
    """The check above is not vacuous: it finds each form of SQL placement it is meant to refuse."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "ok.py").write_text('def f(tx):\n    return tx.all("SELECT 1")\n')
    (tmp_path / "runtime.py").write_text(
        "def f(tx, t):\n"
        '    tx.one("SELECT * FROM work_items WHERE work_id = ?", (1,))\n'
        "    t.execute(\"UPDATE effects SET state = 'x'\")\n"
        '    tx.scalar(f"SELECT COUNT(*) FROM {t}")\n'
        "    tx.execute(query)\n"
    )
    found = sql_outside_store(tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "3", "4", "5"], found
    assert all(line.startswith("runtime.py") for line in found)


# --------------------------------------------------------------------------- import cycles


def _modules(package: Path) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports, at any depth in the file (a function-local import
    still ties the two modules together, it only hides the cycle from the interpreter)."""
    mods = _modules(package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    if f"{base}.{alias.name}" in mods:
                        graph[name].add(f"{base}.{alias.name}")
                    elif base in mods:
                        graph[name].add(base)
        graph[name].discard(name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles_among_the_package_modules() -> None:
    assert import_cycles(import_graph()) == []


def test_import_cycle_check_finds_a_cycle_through_a_function_local_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "base.py").write_text("def f():\n    from pkg.sub import adapter\n")
    (pkg / "sub" / "adapter.py").write_text("from pkg import base\n")
    (pkg / "leaf.py").write_text("from . import base\n")
    assert import_cycles(import_graph(pkg)) == [["pkg.base", "pkg.sub.adapter"]]


# --------------------------------------------------------------------------- the layer order

#: the package's layers, lowest first: a module may import its own layer and those below, never one above.
#: A node is a module or a package (its longest prefix here decides); the package root is left out (it
#: only re-exports the client and registers the extensions, lazily).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("jupyter_goals.models", "jupyter_goals.events", "jupyter_goals.identity", "jupyter_goals.faults", "jupyter_goals.config"),
    ("jupyter_goals.clients.rest",),  # the one Python client library: knows nothing of the server's code
    ("jupyter_goals.store",),
    ("jupyter_goals.providers",),
    ("jupyter_goals.host",),
    ("jupyter_goals.usage",),
    ("jupyter_goals.goals",),
    ("jupyter_goals.recovery",),
    ("jupyter_goals.runtime",),
    ("jupyter_goals.server",),
    ("jupyter_goals.testing",),
    ("jupyter_goals.clients", "jupyter_goals.clients.tui", "jupyter_goals.acp"),  # jupyter_goals.acp: the short name of clients.acp
)


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for level, nodes in enumerate(layers):
        for node in nodes:
            if (module == node or module.startswith(node + ".")) and (best is None or len(node) > best[0]):
                best = (len(node), level)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Every import of a module from a higher layer, and every module no layer names (root aside)."""
    found: list[str] = []
    root = layers[0][0].split(".")[0]
    for module, targets in sorted(graph.items()):
        if module == root:
            continue
        level = layer_of(module, layers)
        if level is None:
            found.append(f"{module}: in no layer")
            continue
        for target in sorted(targets):
            up = layer_of(target, layers)
            if target != root and up is not None and up > level:
                found.append(f"{module} imports {target} (layer {up} above {level})")
    return found


def test_every_import_points_down_the_declared_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_the_layer_check_finds_an_upward_import_and_a_module_in_no_layer(tmp_path: Path) -> None:
    """A deliberately wrong import: the store importing the turn loop (and a module no layer names)."""
    pkg = tmp_path / "pkg"
    for sub in ("store", "runtime"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("")
    (pkg / "store" / "db.py").write_text("from pkg import models\n")
    (pkg / "store" / "effects.py").write_text("def f():\n    from pkg.runtime import turn\n")
    (pkg / "runtime" / "turn.py").write_text("from pkg.store import db\n")
    (pkg / "stray.py").write_text("")
    layers = (("pkg.models",), ("pkg.store",), ("pkg.runtime",))
    assert upward_imports(import_graph(pkg), layers) == [
        "pkg.store.effects imports pkg.runtime.turn (layer 2 above 1)", "pkg.stray: in no layer"]


# --------------------------------------------------------------------------- shared test code


def _test_module(name: str) -> bool:
    package, _, module = name.rpartition(".")
    return package == "tests" and module.startswith("test_")


def imports_of_test_modules(*roots: Path) -> list[str]:
    """Every import (at any depth in the file) of a ``tests.test_*`` module: ``from tests.test_x import``,
    ``from tests import test_x``, ``import tests.test_x``, and their relative forms inside ``tests/``."""
    found: list[str] = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:  # relative: only the tests package's own modules are reached this way
                        base = ".".join(["tests"] + ([base] if base else []))
                    names = [base] if base != "tests" else [f"tests.{a.name}" for a in node.names]
                else:
                    continue
                found += [f"{path.relative_to(root.parent)}:{node.lineno}: {n}" for n in names if _test_module(n)]
    return found


def test_no_module_imports_from_a_test_module() -> None:
    """Shared fixtures and helpers live in support modules (restkit, servers, inproc, storekit, ...): a test
    module imported by another runs its module-level code there (``pytestmark``, ``require_chromium()``'s
    skip) and ties the two files' fixtures together."""
    assert imports_of_test_modules(TESTS, BENCH) == []


def test_test_module_import_check_finds_each_form(tmp_path: Path) -> None:
    """The check above is not vacuous: it finds each form of import of a test module, and only those."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "helpers.py").write_text("import json\n")
    (tests / "test_a.py").write_text(
        "from tests.test_b import helper\n"
        "from tests import test_b, helpers\n"
        "import tests.test_b\n"
        "from .test_b import helper\n"
        "from . import test_b\n"
        "def f():\n"
        "    from tests.test_b import fixture\n"
        "from tests.helpers import ok\n"
        "from tests import helpers\n"
        "import test_utils_elsewhere\n"
    )
    found = imports_of_test_modules(tests)
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4", "5", "7"], found
    assert all(line.startswith("tests/test_a.py") for line in found)


# --------------------------------------------------------------------------- module size

MAX_MODULE_LINES = 500


def test_no_module_of_the_package_is_over_500_lines() -> None:
    """A module over 500 lines has more than one reason to change: split it by reason (issue 28)."""
    long = {str(p.relative_to(PACKAGE)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}
