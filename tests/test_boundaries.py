"""The package boundaries of ``layouts/`` and ``mountd/``, checked on the source.

A module whose name starts with an underscore is private to the package that
holds it: only modules inside that package (or below it) import it, and
everything else goes through the package's ``__init__``. ``layouts/`` never
imports ``mountd`` (ruff's TID251 says so too). Tests and benchmarks may reach
private modules: they test and measure them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("layouts", "mountd")


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
