"""No symlink leads out of the mount (docs/CONTRACT.md, "Links"), whatever a
bucket or reference file says.

A property test builds groups holding soft and external links with generated
hostile targets (``..`` runs, absolute host paths, ``::``, empty and ``.``
components) at several depths, on a multi-domain and a single-domain tree,
and checks every symlink the tree shows: its text is relative, and resolved
lexically from the link's directory it stays inside the mount (inside the
domain for soft links, or beside it for the root's own ``f.h5.json``), while
the group's sidecar keeps the links as stored.
``tests/test_mount_hsds.py`` and ``tests/test_mount_refs.py`` check the same
invariant on real mounts of HSDS and LINDI sources.
"""

from __future__ import annotations

import json

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts.model import Domain, Link, LinkKind, ObjectKind
from mountd.tree import Tree, make_tree
from mountd.tree.nodes import DirNode, FileNode, Node, SymlinkNode
from tests.modelcat import MemoryCatalog, group

COMPONENTS = ("..", "..", ".", "", "etc", "passwd", "g", "a::b", "%2E%2E", "x y", "é")
DOMAIN = "home/u/f.h5"

components = st.lists(st.sampled_from(COMPONENTS), min_size=0, max_size=12)
hostile_paths = st.builds(lambda lead, parts: lead + "/".join(parts),
                          st.sampled_from(("", "/", "//")), components)


def lexically_inside(link_dir: tuple[str, ...], text: str, top: tuple[str, ...]) -> bool:
    """True if ``text`` read from ``link_dir`` never leaves ``top`` (both as
    component tuples below the mount root), even part way through."""
    if text.startswith("/"):
        return False
    where = list(link_dir)
    for comp in text.split("/"):
        if comp == "..":
            if len(where) <= len(top):
                return False
            where.pop()
        elif comp not in ("", "."):
            where.append(comp)
    return tuple(where[:len(top)]) == top


def catalog(soft: list[str], external: list[tuple[str, str]], single: bool) -> MemoryCatalog:
    """A domain whose root and a nested group (``/g/h``) hold the given links."""
    links: dict[str, object] = {f"s{i}": Link(LinkKind.SOFT, path) for i, path in enumerate(soft)}
    links.update({f"e{i}": Link(LinkKind.EXTERNAL, path, domain=domain)
                  for i, (domain, path) in enumerate(external)})
    nested = {"g": Link(LinkKind.HARD, "g-g", target_kind=ObjectKind.GROUP)}
    objects = {
        "g-root": group("g-root", **nested, **links),
        "g-g": group("g-g", h=Link(LinkKind.HARD, "g-h", target_kind=ObjectKind.GROUP)),
        "g-h": group("g-h", **links),
    }
    domains = {DOMAIN: Domain(DOMAIN, "g-root", 2.0),
               "home/u": Domain("home/u", None, 2.0)}
    folders = {"": ["home"], "home": ["u"], "home/u": ["f.h5"]}
    return MemoryCatalog(domains, objects, folders, single_domain=DOMAIN if single else None)


async def walk(tree: Tree, path: str) -> Node:
    node: Node = await tree.root()
    for part in path.split("/"):
        assert isinstance(node, DirNode)
        node = await node.lookup(part)
    return node


async def symlinks(tree: Tree) -> list[tuple[tuple[str, ...], str, SymlinkNode]]:
    """(directory, name, node) of every symlink in the tree, by listing it."""
    found = []
    stack: list[tuple[tuple[str, ...], Node]] = [((), await tree.root())]
    while stack:
        where, node = stack.pop()
        assert isinstance(node, DirNode)
        async for _, name, child, _ in node.open_listing().entries(0):
            if isinstance(child, SymlinkNode):
                found.append((where, name, child))
            elif isinstance(child, DirNode) and not name.startswith("."):
                stack.append(((*where, name), child))
    return found


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(soft=st.lists(hostile_paths, min_size=1, max_size=4),
       external=st.lists(st.tuples(hostile_paths, hostile_paths), max_size=3),
       single=st.booleans())
def test_every_symlink_stays_inside(soft: list[str], external: list[tuple[str, str]],
                                    single: bool) -> None:
    async def main() -> None:
        tree = make_tree(catalog(soft, external, single))
        domain_top = () if single else tuple(DOMAIN.split("/"))
        seen = await symlinks(tree)
        assert len(seen) >= 2 * (len(soft) + len(external))  # the root's and /g/h's
        for where, name, node in seen:
            text = await node.target()
            # A soft link stays in its domain; its .json/.npy siblings may
            # reach the root's own files, which sit next to the domain's dir.
            top = () if name.startswith("e") else (
                domain_top if "." not in name else domain_top[:-1])
            assert lexically_inside(where, text, top), (where, name, text)
        # the links as stored are in the sidecar of the group holding them
        side = await walk(tree, "g/h.json" if single else f"{DOMAIN}/g/h.json")
        assert isinstance(side, FileNode)
        stored = json.loads(bytes(await (await side.open()).read(0, 1 << 20)))["links"]
        assert stored == {**{f"s{i}": {"kind": "soft", "path": p} for i, p in enumerate(soft)},
                          **{f"e{i}": {"kind": "external", "domain": d, "path": p}
                             for i, (d, p) in enumerate(external)}}
    trio.run(main)


def test_dangling_soft_link_is_its_normalised_path() -> None:
    """Soft links that resolve nowhere point where the target would be,
    ``..`` above the root staying at the root, written relative."""
    async def main() -> None:
        tree = make_tree(catalog(["/../../../../../../etc/passwd", "../../../../../etc/passwd",
                                  "a/../../b"], [("/etc/passwd", "/x")], single=False))
        texts = {(w, n): await s.target() for w, n, s in await symlinks(tree)}
        root = tuple(DOMAIN.split("/"))
        assert texts[(root, "s0")] == "etc/passwd"
        assert texts[(root, "s1")] == "etc/passwd"
        assert texts[(root, "s2")] == "b"
        assert texts[(root, "e0")] == "etc/passwd::/x"
        nested = (*root, "g", "h")
        assert texts[(nested, "s0")] == "../../etc/passwd"
        assert texts[(nested, "s1")] == "../../etc/passwd"  # /g/h/../../.. is the root
        assert texts[(nested, "s2")] == "../b"  # /g/h/a/../../b is /g/b
    trio.run(main)
