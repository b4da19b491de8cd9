"""The package boundaries of ``layouts/`` and ``mountd/``, checked on the source.

A module whose name starts with an underscore is private to the package that
holds it: only modules inside that package (or below it) import it, and
everything else goes through the package's ``__init__``. ``layouts/`` never
imports ``mountd`` (ruff's TID251 says so too). Tests and benchmarks may reach
private modules: they test and measure them.

The modules of ``mountd/tree`` import one another one way: what runs when a
module is imported (imports under ``if TYPE_CHECKING:`` are annotations
only, and do not count) makes no cycle, and ``mountd.tree.core`` reaches no
node module, the nodes being given to the tree by ``mountd.tree.build``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("layouts", "mountd")
#: The package whose modules import one another one way, and its shared context.
TREE = "mountd.tree"
CORE = "mountd.tree.core"
#: The module of the node kinds: it and every module importing it are node modules.
NODES = "mountd.tree.nodes"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every module ``path`` imports, names from a
    package included as ``package.name``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _private_owner(dotted: str) -> str | None:
    """The package a private module of ``dotted`` belongs to, if any."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__") and i > 0:
            return ".".join(parts[:i])
    return None


def _violations() -> list[str]:
    found = []
    for top in CHECKED:
        for path in sorted((REPO / top).rglob("*.py")):
            module = _module_name(path)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for line, dotted in _imports(path):
                if not dotted.startswith(CHECKED):
                    continue
                owner = _private_owner(dotted)
                if owner is not None and package != owner and \
                        not package.startswith(owner + "."):
                    found.append(f"{path.relative_to(REPO)}:{line}: {dotted} is private "
                                 f"to {owner}")
                if top == "layouts" and dotted.split(".")[0] == "mountd":
                    found.append(f"{path.relative_to(REPO)}:{line}: layouts imports {dotted}")
    return found


def test_no_module_reaches_into_another_package() -> None:
    assert _violations() == []


def test_the_check_sees_a_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a module outside a format's package that imports one
    of its private modules, and ``layouts`` importing ``mountd``, are found."""
    fake = tmp_path / "repo"
    (fake / "mountd" / "tree").mkdir(parents=True)
    (fake / "layouts" / "formats" / "hsds").mkdir(parents=True)
    (fake / "mountd" / "tree" / "h5view.py").write_text(
        "from layouts.formats.hsds._ids import normalize_id\n")
    (fake / "layouts" / "formats" / "hsds" / "_catalog.py").write_text(
        "from layouts.formats.hsds import _ids\nfrom mountd import names\n")
    monkeypatch.setattr(f"{__name__}.REPO", fake)
    assert _violations() == [
        "layouts/formats/hsds/_catalog.py:2: layouts imports mountd",
        "layouts/formats/hsds/_catalog.py:2: layouts imports mountd.names",
        "mountd/tree/h5view.py:1: layouts.formats.hsds._ids is private to "
        "layouts.formats.hsds",
        "mountd/tree/h5view.py:1: layouts.formats.hsds._ids.normalize_id is private to "
        "layouts.formats.hsds",
    ]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_on_import(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` that run when the module is imported: those
    at its top level and in the blocks of its ``if``, ``try``, ``with`` and
    ``class`` statements, but not under ``if TYPE_CHECKING:`` nor in functions."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _run_on_import(stmt.body)
            yield from _run_on_import(stmt.orelse)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse,
                          stmt.finalbody):
                yield from _run_on_import(block)
        elif isinstance(stmt, ast.With | ast.ClassDef):
            yield from _run_on_import(stmt.body)


def _import_graph(package: str) -> dict[str, set[str]]:
    """The modules of ``package`` (not its subpackages), each with the modules
    of ``package`` it imports when it is imported; ``from package import m``
    imports the module ``m``."""
    paths = {_module_name(path): path
             for path in sorted((REPO / package.replace(".", "/")).glob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        found: set[str] = set()
        for stmt in _run_on_import(tree.body):
            if isinstance(stmt, ast.Import):
                found.update(alias.name for alias in stmt.names)
            elif isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                for alias in stmt.names:
                    name = f"{stmt.module}.{alias.name}"
                    found.add(name if name in paths else stmt.module)
        graph[module] = found & paths.keys()
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module importing ``start`` imports, ``start`` excluded."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen - {start}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of imports in ``graph`` (its modules in order, the first
    again at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            found = visit(imported)
            if found is not None:
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module)
        if found is not None:
            return found
    return None


def _tree_violations() -> list[str]:
    graph = _import_graph(TREE)
    nodes = {NODES} | {module for module, imported in graph.items() if NODES in imported}
    found = [f"{CORE} imports the node module {module}"
             for module in sorted(_reach(graph, CORE) & nodes)]
    cycle = _cycle(graph)
    if cycle is not None:
        found.append("import cycle: " + " -> ".join(cycle))
    return found


def test_the_tree_imports_one_way() -> None:
    """No import cycle in ``mountd/tree``, and ``core`` reaches no node module."""
    assert _tree_violations() == []


def test_the_tree_check_sees_a_cycle_and_a_node_import(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: ``core`` reaching node modules through others (by
    imports in a ``try`` block and a class body), and a cycle, are found;
    imports for annotations only, and in functions, are not."""
    fake = tmp_path / "repo"
    tree = fake / "mountd" / "tree"
    tree.mkdir(parents=True)
    (tree / "__init__.py").write_text("from mountd.tree.core import Tree\n")
    (tree / "nodes.py").write_text("import trio\n")
    (tree / "viewnodes.py").write_text("from mountd.tree.nodes import Node\n")
    (tree / "core.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from mountd.tree import paths\n"
        "if TYPE_CHECKING:\n"
        "    from mountd.tree.viewnodes import ViewFileNode\n")
    (tree / "paths.py").write_text(
        "try:\n    from mountd.tree.groups import GroupDir\nexcept ImportError:\n    pass\n")
    (tree / "groups.py").write_text(
        "class GroupDir:\n    from mountd.tree import nodes\n"
        "def later():\n    from mountd.tree.core import Tree\n")
    monkeypatch.setattr(f"{__name__}.REPO", fake)
    assert _tree_violations() == [
        "mountd.tree.core imports the node module mountd.tree.groups",
        "mountd.tree.core imports the node module mountd.tree.nodes",
    ]
    (tree / "nodes.py").write_text("from mountd.tree.core import Tree\n")
    assert _tree_violations()[-1] == ("import cycle: mountd.tree.core -> mountd.tree.paths -> "
                                      "mountd.tree.groups -> mountd.tree.nodes -> "
                                      "mountd.tree.core")
