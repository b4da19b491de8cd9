"""Reading a whole mount (in-process tree or real FUSE) and checking it against h5py.

The checking side of ``tests/test_fuzz.py``:

* ``tree_snapshot(config)`` opens a source as the daemon does
  (``mountd.sources.open_source``, ``CachedCatalog``, ``make_tree`` with the
  views of ``layouts.views.VIEWS`` and a chunk cache whose prefetches run in a
  nursery) and walks every entry: lookups of every listed name, every file read to its end
  (``READ_CAP`` bytes at most), every symlink's text, every directory's
  xattrs. An operation that raises a ``MountError`` is recorded as an
  ``error`` entry (what the FUSE layer turns into an errno); any other
  exception propagates, because it is a bug. ``mount_snapshot`` does the same
  through a real FUSE mount with ``os`` calls.
* ``check_invariants`` holds for every snapshot, valid source or not: strict
  JSON in every metadata file, ``st_size`` equal to the bytes read, ``.npy``
  files that NumPy parses with as many bytes as their header promises, chunk
  names inside the dataset's grid and of the chunk size, symlinks relative
  and inside the mount.
* ``check_h5`` compares a snapshot with h5py's reading of the source HDF5
  file, link by link: directory listings (with the generated ``.json``/``.npy``
  names and the rule that a real link wins over a generated name), sidecars
  (kind, path, id, shape, maxshape, dtype, chunks, fill value, attributes,
  scalar value, stored soft links), ``.npy`` bytes, chunk files (exactly what
  the HSDS writer stored; for LINDI the region inside the dataset), ``.zarray``
  and ``.zattrs``, xattrs and soft-link targets. ``View.affected`` names the
  HDF5 paths a damage test spoiled; their own entries are not compared.

Problems are collected as strings so one failure shows all of them.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import posixpath
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numcodecs
import numpy as np
import trio

from layouts.views import VIEWS
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.metacache import CachedCatalog
from mountd.config import MountConfig
from mountd.errors import MountError
from mountd.sources import open_source
from mountd.tree import make_tree
from mountd.tree.h5view import H5Views
from mountd.tree.names import display_name
from mountd.tree.nodes import DirNode, FileNode, Node, SymlinkNode
from tests.fuzzgen import HsdsDomain
from tests.h5compare import expected_json, h5_normpath, mount_rel, walk_links

#: Most bytes read of one file (a damaged shape can declare an enormous .npy).
READ_CAP = 8 << 20
#: Bytes asked for per read call, as the kernel does with large reads.
READ_STEP = 128 << 10
#: Generated entry suffixes of a link, in the tree's order.
SUFFIXES = ("", ".json", ".npy")
#: Files every group directory has of its own.
OWN_FILES = (".zattrs", ".zgroup")
ROOT_SIDECAR = ".root.json"
#: The file view of a mount whose root is a root group (``mountd.tree.h5view``).
ROOT_H5 = ".root.h5"


@dataclass
class Entry:
    """One mount entry as read: a directory's names, a file's bytes, a symlink's
    text, or the error (class and message, or errno name) that reading gave."""

    kind: str
    names: tuple[str, ...] = ()
    data: bytes = b""
    size: int | None = None
    exact: bool = True
    text: str = ""
    xattrs: dict[str, bytes] = field(default_factory=dict)
    error: str = ""

    def same_as(self, other: Entry) -> bool:
        """Equal as a user sees it (the stat's exactness is the tree's own business)."""
        return (self.kind, self.names, self.data, self.text, self.xattrs, self.size) == (
            other.kind, other.names, other.data, other.text, other.xattrs, other.size)


Snapshot = dict[str, Entry]


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


# --------------------------------------------------------------------------- reading


async def _read_file(node: FileNode) -> tuple[bytes, int, bool]:
    handle = await node.open()
    parts: list[bytes] = []
    offset = 0
    while offset < READ_CAP:
        piece = bytes(await handle.read(offset, READ_STEP))
        parts.append(piece)
        offset += len(piece)
        if len(piece) < READ_STEP:
            break
    st = await node.stat()
    return b"".join(parts), st.size, st.exact


async def _visit(path: str, node: Node, snap: Snapshot) -> None:
    try:
        if isinstance(node, DirNode):
            listing = node.open_listing()
            try:
                rows = [(name, child) async for _, name, child, _ in listing.entries(0)]
            finally:
                await listing.aclose()
            names = tuple(sorted(name for name, _ in rows))
            assert len(set(names)) == len(names), f"{path}: a name listed twice: {names}"
            snap[path] = Entry("dir", names=names, xattrs=dict(await node.xattrs()))
            for name, listed in rows:
                child_path = _join(path, name)
                try:
                    child = await node.lookup(name)
                except MountError as exc:
                    snap[child_path] = Entry("error", error=f"{type(exc).__name__}: {exc}")
                    continue
                assert child.type is listed.type, f"{child_path}: listed as {listed.type}, " \
                                                  f"looked up as {child.type}"
                await _visit(child_path, child, snap)
        elif isinstance(node, FileNode):
            data, size, exact = await _read_file(node)
            snap[path] = Entry("file", data=data, size=size, exact=exact)
        elif isinstance(node, SymlinkNode):
            snap[path] = Entry("symlink", text=await node.target())
        else:
            raise AssertionError(f"{path}: unknown node {node!r}")
    except MountError as exc:
        snap[path] = Entry("error", error=f"{type(exc).__name__}: {exc}")


async def tree_snapshot(config: MountConfig, timeout: float = 60.0) -> Snapshot:
    """Every entry of the mount ``config`` describes, through the daemon's own
    objects but no FUSE. A source that cannot be opened gives one error entry
    at ``""``; a walk longer than ``timeout`` seconds fails (a hang)."""
    snap: Snapshot = {}
    with trio.fail_after(timeout):
        try:
            async with open_source(config) as source, trio.open_nursery() as nursery:
                cache = ChunkCache(1 << 20, nursery)
                tree = make_tree(CachedCatalog(source.catalog, ttl=config.metadata_ttl),
                                 views=VIEWS, ttl=config.metadata_ttl, chunk_cache=cache,
                                 h5views=H5Views.for_mount(config))
                if source.block_cache is not None:
                    source.block_cache.nursery = nursery
                try:
                    root = await tree.root()
                except MountError as exc:
                    snap[""] = Entry("error", error=f"{type(exc).__name__}: {exc}")
                else:
                    await _visit("", root, snap)
                nursery.cancel_scope.cancel()
        except MountError as exc:
            snap[""] = Entry("error", error=f"{type(exc).__name__}: {exc}")
    return snap


def snapshot(config: MountConfig) -> Snapshot:
    """``tree_snapshot`` run to completion under its own ``trio.run``."""
    return trio.run(tree_snapshot, config)


def mount_snapshot(mountpoint: Path) -> Snapshot:
    """Every entry of a real mount, read with ``os`` calls (symlinks not followed)."""
    snap: Snapshot = {}

    def visit(rel: str) -> None:
        path = mountpoint / rel if rel else mountpoint
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                names = tuple(sorted(os.listdir(path)))
                xattrs = {n: os.getxattr(path, n) for n in os.listxattr(path)}
                snap[rel] = Entry("dir", names=names, xattrs=xattrs)
                for name in names:
                    visit(_join(rel, name))
            elif stat.S_ISLNK(st.st_mode):
                snap[rel] = Entry("symlink", text=os.readlink(path))
            else:
                with open(path, "rb") as f:
                    data = f.read(READ_CAP)
                snap[rel] = Entry("file", data=data, size=os.stat(path).st_size)
        except OSError as exc:
            snap[rel] = Entry("error", error=errno.errorcode.get(exc.errno or 0, str(exc)))

    visit("")
    return snap


# --------------------------------------------------------------------------- invariants


def strict_json(data: bytes) -> Any:
    """Parse ``data`` as strict JSON: NaN, Infinity and duplicate-free text only."""

    def refuse(word: str) -> Any:
        raise ValueError(f"not strict JSON: {word}")

    return json.loads(data, parse_constant=refuse)


def _chunk_index(name: str) -> tuple[int, ...] | None:
    parts = name.split(".")
    if not all(p == "0" or (p.isascii() and p.isdigit() and p[0] != "0") for p in parts):
        return None
    return tuple(int(p) for p in parts)


def check_invariants(snap: Snapshot) -> list[str]:
    """What docs/CONTRACT.md promises of every entry, whatever the source holds."""
    problems: list[str] = []
    for path, entry in snap.items():
        name = path.rsplit("/", 1)[-1]
        if entry.kind == "file":
            if len(entry.data) < READ_CAP and entry.exact and entry.size != len(entry.data):
                problems.append(f"{path}: st_size {entry.size}, read {len(entry.data)} bytes")
            if name.endswith(".json") or name in (".zattrs", ".zgroup", ".zarray"):
                _check_json_file(path, entry, problems)
            elif name.endswith(".npy"):
                _check_npy_file(path, entry, problems)
        elif entry.kind == "symlink":
            _check_symlink(path, entry, problems)
        elif entry.kind == "dir" and f"{path}/.zarray" in {
                _join(path, n) for n in entry.names}:
            _check_chunk_names(snap, path, entry, problems)
    return problems


def _check_json_file(path: str, entry: Entry, problems: list[str]) -> None:
    if len(entry.data) >= READ_CAP:
        return
    try:
        strict_json(entry.data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        problems.append(f"{path}: not strict JSON ({exc}): {entry.data[:120]!r}")


def _check_npy_file(path: str, entry: Entry, problems: list[str]) -> None:
    buf = io.BytesIO(entry.data)
    try:
        version = np.lib.format.read_magic(buf)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0  # 3.0 differs only in the text encoding
        shape, _, dtype = read_header(buf)
    except (ValueError, SyntaxError, EOFError) as exc:
        problems.append(f"{path}: not an .npy header: {exc}")
        return
    want = buf.tell() + math.prod(shape) * dtype.itemsize
    if entry.size is not None and entry.size != want:
        problems.append(f"{path}: st_size {entry.size}, header says {want} bytes")


def _check_symlink(path: str, entry: Entry, problems: list[str]) -> None:
    text = entry.text
    level = path.count("/")  # directories above the link, below the mount root
    for comp in text.split("/"):
        level += -1 if comp == ".." else comp not in ("", ".")
        if level < 0:
            break
    if text.startswith("/") or level < 0:
        problems.append(f"{path}: symlink leaves the mount: {text!r}")


def _check_chunk_names(snap: Snapshot, path: str, entry: Entry, problems: list[str]) -> None:
    zarray = snap.get(_join(path, ".zarray"))
    if zarray is None or zarray.kind != "file" or len(zarray.data) >= READ_CAP:
        return
    try:
        meta = strict_json(zarray.data)
        shape, chunks = list(meta["shape"]), list(meta["chunks"])
        itemsize = np.dtype(meta["dtype"]).itemsize if not meta.get("filters") else None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        return
    for name in entry.names:
        if name.startswith("."):
            continue
        index = _chunk_index(name)
        grid = [-(-n // c) if c else 0 for n, c in zip(shape, chunks, strict=False)] or [1]
        if index is None or len(index) != len(grid) or any(
                not 0 <= i < g for i, g in zip(index, grid, strict=True)):
            problems.append(f"{path}/{name}: chunk name outside the grid {grid}")
            continue
        chunk = snap.get(_join(path, name))
        if itemsize and chunk is not None and chunk.kind == "file" and \
                chunk.size != math.prod(chunks) * itemsize:
            problems.append(f"{path}/{name}: {chunk.size} bytes, chunk needs "
                            f"{math.prod(chunks) * itemsize}")


# --------------------------------------------------------------------------- against h5py


@dataclass
class View:
    """How one source shows one HDF5 file.

    ``root`` is the mount path of the root group's directory (``""`` when the
    mount root is the root group), ``root_sidecar`` that of its sidecar.
    ``hsds`` is what the HSDS writer stored (None for LINDI); ``inlined`` the
    datasets whose data LINDI copied into the reference file (it re-chunks them
    and writes zarr's fill value). ``affected(h5path)`` is True for objects a
    damage test spoiled, ``chunk_affected(h5path, chunk_name)`` for one chunk.
    """

    kind: str
    root: str
    root_sidecar: str
    hsds: HsdsDomain | None = None
    inlined: frozenset[str] = frozenset()
    affected: Callable[[str], bool] = lambda _path: False
    chunk_affected: Callable[[str, str], bool] = lambda _path, _name: False


def _winners(links: list[str]) -> dict[tuple[str, str], str]:
    """(link name, suffix) -> shown name, for the entries a group may show: a
    real link's own name wins over any generated name (docs/CONTRACT.md, "Names")."""
    shown: dict[str, tuple[str, str]] = {}
    for name in sorted(links):
        for suffix in SUFFIXES[1:]:
            shown.setdefault(display_name(name, suffix), (name, suffix))
    for name in links:
        shown[display_name(name)] = (name, "")
    return {pair: disp for disp, pair in shown.items()}


def _target(f: h5py.File, group_path: str, link: Any) -> tuple[str, Any] | None:
    """The HDF5 path and object a link leads to (None if it does not resolve)."""
    if isinstance(link, h5py.SoftLink):
        path = h5_normpath(link.path, group_path)
        obj = f.get(path)
        return None if obj is None else (path, obj)
    return None


def _fixed(obj: Any) -> bool:
    return isinstance(obj, h5py.Dataset) and obj.dtype.kind != "O"


class Checker:
    """Compares one snapshot with one HDF5 file as ``View`` says it is shown."""

    def __init__(self, snap: Snapshot, f: h5py.File, view: View) -> None:
        self.snap = snap
        self.f = f
        self.view = view
        self.problems: list[str] = []
        self.checked = 0

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def mount_path(self, h5path: str) -> str:
        rel = mount_rel(h5path)
        return _join(self.view.root, rel) if rel else self.view.root

    def sidecar_path(self, h5path: str) -> str:
        if h5path == "/":
            return self.view.root_sidecar
        parent, name = posixpath.split(h5path)
        return _join(self.mount_path(parent), display_name(name, ".json"))

    def entry(self, path: str, kind: str) -> Entry | None:
        entry = self.snap.get(path)
        if entry is None:
            self.problem(f"{path}: missing")
            return None
        if entry.kind != kind:
            self.problem(f"{path}: expected a {kind}, got {entry.kind} {entry.error}")
            return None
        self.checked += 1
        return entry

    def json_of(self, path: str) -> Any:
        entry = self.entry(path, "file")
        if entry is None:
            return None
        try:
            return strict_json(entry.data)
        except (ValueError, UnicodeDecodeError) as exc:
            self.problem(f"{path}: {exc}")
            return None

    def expect(self, path: str, what: str, got: Any, want: Any) -> None:
        if got != want:
            self.problem(f"{path}: {what} is {got!r:.300}, expected {want!r:.300}")

    # ---------------------------------------------------------------- walking

    def run(self) -> list[str]:
        view = self.view
        if not view.affected("/"):
            self.group("/", self.f["/"], mount_root=view.root == "")
            self.sidecar("/", self.f["/"], view.root_sidecar)
        for info in walk_links(self.f):
            if info.cycle_to is not None:
                continue  # generated files never hold hard links back to an ancestor
            parent, name = posixpath.split(info.path)
            if view.affected(parent):
                continue
            if view.affected(info.path):
                continue
            if isinstance(info.link, h5py.SoftLink):
                self.soft(info.path, info.link)
                continue
            winners = _winners(list(self.f[parent]))
            side = winners.get((name, ".json"))
            side_path = _join(self.mount_path(parent), side) if side else None
            if isinstance(info.obj, h5py.Group):
                self.group(info.path, info.obj)
                if side_path:
                    self.sidecar(info.path, info.obj, side_path)
            else:
                npy = winners.get((name, ".npy")) if _fixed(info.obj) else None
                self.dataset(info.path, info.obj, side_path,
                             _join(self.mount_path(parent), npy) if npy else None)
        return self.problems

    def group(self, h5path: str, grp: h5py.Group, mount_root: bool = False) -> None:
        path = self.mount_path(h5path)
        entry = self.entry(path, "dir")
        if entry is None:
            return
        links = list(grp)
        winners = _winners(links)
        want: set[str] = set()
        relaxed: set[str] = set()
        for (name, suffix), shown in winners.items():
            child_path = _join(h5path.rstrip("/"), name) if h5path != "/" else f"/{name}"
            link = grp.get(name, getlink=True)
            if isinstance(link, h5py.SoftLink):
                target = _target(self.f, h5path, link)
                obj = None if target is None else target[1]
                spoiled = target is None or self.view.affected(target[0]) or \
                    self.view.affected(child_path)
            else:
                obj = grp.get(name)
                spoiled = self.view.affected(child_path)
            if suffix == ".npy" and not _fixed(obj):
                if spoiled:
                    relaxed.add(shown)
                continue
            if spoiled:
                relaxed.add(shown)
            else:
                want.add(shown)
        taken = {display_name(n, s) for n in links for s in SUFFIXES}
        own = set(OWN_FILES) | ({ROOT_SIDECAR, ROOT_H5} if mount_root else set())
        want |= own - taken
        got = set(entry.names)
        missing = want - got
        extra = got - want - relaxed
        if missing or extra:
            self.problem(f"{path}/: missing {sorted(missing)}, unexpected {sorted(extra)}")
        self.xattrs(path, entry, grp, "group")
        zattrs = self.json_of(_join(path, ".zattrs"))
        if zattrs is not None:
            self.expect(path, ".zattrs", zattrs, self.attributes(grp))

    def attributes(self, obj: h5py.HLObject) -> dict[str, Any]:
        return {name: expected_json(value, self.f) for name, value in obj.attrs.items()}

    def xattrs(self, path: str, entry: Entry, obj: h5py.HLObject, kind: str) -> None:
        self.expect(path, "user.h5.kind", entry.xattrs.get("user.h5.kind"), kind.encode())
        for name, value in self.attributes(obj).items():
            text = isinstance(obj.attrs[name], str | bytes)
            key = f"user.h5.attr.{name}"
            if len(key.encode()) > 255:
                continue
            raw = entry.xattrs.get(key)
            if raw is None:
                self.problem(f"{path}: no xattr {key!r}")
            elif text:
                self.expect(path, key, raw.decode("utf-8", "surrogateescape"), value)
            else:
                self.expect(path, key, strict_json(raw), value)

    def sidecar(self, h5path: str, obj: h5py.HLObject, side_path: str) -> dict[str, Any] | None:
        doc = self.json_of(side_path)
        if not isinstance(doc, dict):
            return None
        kind = "group" if isinstance(obj, h5py.Group) else "dataset"
        self.expect(side_path, "kind", doc.get("kind"), kind)
        self.expect(side_path, "path", doc.get("path"), h5path)
        self.expect(side_path, "attributes", doc.get("attributes"), self.attributes(obj))
        if self.view.hsds is not None:
            self.expect(side_path, "id", doc.get("id"), self.view.hsds.ids[h5path])
        if kind == "group":
            def spoiled(name: str) -> bool:
                return self.view.affected(posixpath.join(h5path, name))

            soft = {name: {"kind": "soft", "path": link.path} for name in obj
                    if isinstance(link := obj.get(name, getlink=True), h5py.SoftLink)
                    and not spoiled(name)}
            links = doc.get("links", {})
            if isinstance(links, dict):
                links = {k: v for k, v in links.items() if not spoiled(k)}
            self.expect(side_path, "links", links, soft)
            if h5path == "/" and self.view.kind == "hsds" and self.view.root:
                domain = doc.get("domain") or {}
                self.expect(side_path, "domain keys", sorted(domain),
                            ["acls", "created", "lastModified", "owner"])
        return doc

    # ---------------------------------------------------------------- links

    def soft(self, h5path: str, link: h5py.SoftLink) -> None:
        parent, name = posixpath.split(h5path)
        target = _target(self.f, parent, link)
        assert target is not None, f"generated soft link {h5path} -> {link.path} dangles"
        target_path, obj = target
        winners = _winners(list(self.f[parent]))
        here = self.mount_path(parent)
        for suffix in SUFFIXES:
            shown = winners.get((name, suffix))
            if shown is None or (suffix == ".npy" and not _fixed(obj)):
                continue
            if suffix and self.view.affected(target_path):
                continue
            path = _join(here, shown)
            entry = self.entry(path, "symlink")
            if entry is None:
                continue
            if suffix == "":
                want = self.mount_path(target_path)
            elif target_path == "/":
                want = self.view.root_sidecar if suffix == ".json" else \
                    _join(posixpath.dirname(self.view.root), f".root{suffix}")
            else:
                tparent, tname = posixpath.split(target_path)
                want = _join(self.mount_path(tparent), display_name(tname, suffix))
            got = posixpath.normpath(posixpath.join("/" + here, entry.text)).lstrip("/")
            self.expect(path, f"symlink {entry.text!r} target", got, want)

    # ---------------------------------------------------------------- datasets

    def dataset(self, h5path: str, ds: h5py.Dataset, side_path: str | None,
                npy_path: str | None) -> None:
        path = self.mount_path(h5path)
        entry = self.entry(path, "dir")
        if entry is None:
            return
        self.xattrs(path, entry, ds, "dataset")
        vlen = ds.dtype.kind == "O"
        dtype_text = "vlen-utf8" if vlen else ds.dtype.str
        shown = entry.xattrs.get("user.h5.dtype", b"").decode()
        # LINDI writes scalars in native byte order, strings only as wide as the value.
        lenient = self.view.kind == "lindi" and ds.shape == () and not vlen
        mount_dtype = ds.dtype
        if lenient:
            try:
                mount_dtype = np.dtype(shown)
            except TypeError:
                self.problem(f"{path}: user.h5.dtype {shown!r} is not a dtype")
                return
            self.expect(path, "dtype kind", mount_dtype.kind, ds.dtype.kind)
            dtype_text = shown
        self.expect(path, "user.h5.dtype", shown, dtype_text)
        view = self.view
        chunk_spoiled = any(view.chunk_affected(h5path, n) for n in entry.names)
        scalar_spoiled = ds.shape == () and chunk_spoiled
        doc = None
        if side_path is not None and not scalar_spoiled:
            doc = self.sidecar(h5path, ds, side_path)
        chunks: list[int] | None = None
        if doc is not None:
            self.expect(side_path or path, "shape", doc.get("shape"), list(ds.shape))
            self.expect(side_path or path, "dtype", doc.get("dtype"), dtype_text)
            chunks = doc.get("chunks")
            self.dataset_sidecar(h5path, ds, side_path or path, doc)
        if chunks is None:
            zarray = self.json_of(_join(path, ".zarray"))
            chunks = zarray.get("chunks") if isinstance(zarray, dict) else None
        zattrs = self.json_of(_join(path, ".zattrs"))
        if isinstance(zattrs, dict):
            dims = zattrs.pop("_ARRAY_DIMENSIONS", [None] * len(ds.shape))
            self.expect(path, "_ARRAY_DIMENSIONS rank", len(dims), len(ds.shape))
            self.expect(path, ".zattrs", zattrs, self.attributes(ds))
        if npy_path is not None and not chunk_spoiled:
            self.npy(npy_path, ds, mount_dtype)
        if chunks is not None:
            self.chunk_files(h5path, path, entry, ds, chunks, mount_dtype)

    def dataset_sidecar(self, h5path: str, ds: h5py.Dataset, where: str,
                        doc: dict[str, Any]) -> None:
        view = self.view
        vlen = ds.dtype.kind == "O"
        if view.hsds is not None:
            did = view.hsds.ids[h5path]
            self.expect(where, "chunks", doc.get("chunks"), list(view.hsds.chunks[did]))
            self.expect(where, "maxshape", doc.get("maxshape"),
                        list(ds.maxshape) if ds.maxshape is not None else list(ds.shape))
        else:
            self.expect(where, "maxshape", doc.get("maxshape"), list(ds.shape))
        # lindi writes zarr's default fill value for what it inlines, and for every
        # string or boolean dataset (all of which it inlines, when not empty).
        if not vlen and (view.hsds is not None or (
                h5path not in view.inlined and ds.dtype.kind in "iuf")):
            fill = expected_json(np.asarray(ds.fillvalue, dtype=ds.dtype)[()], self.f)
            self.expect(where, "fill_value", doc.get("fill_value"), fill)
        if ds.shape == ():
            value = ds.asstr()[()] if vlen else ds[()]
            self.expect(where, "value", doc.get("value"), expected_json(value, self.f))

    def npy(self, npy_path: str, ds: h5py.Dataset, dtype: np.dtype[Any]) -> None:
        entry = self.entry(npy_path, "file")
        if entry is None:
            return
        try:
            arr = np.load(io.BytesIO(entry.data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            self.problem(f"{npy_path}: numpy cannot load it: {exc}")
            return
        self.expect(npy_path, "dtype", arr.dtype, dtype)
        self.expect(npy_path, "shape", arr.shape, ds.shape)
        want = np.ascontiguousarray(np.asarray(ds[()]).astype(ds.dtype))
        got = np.ascontiguousarray(arr.astype(ds.dtype))
        if got.tobytes() != want.tobytes() and not self.lindi_signed_zero(got, want):
            diff = np.flatnonzero(got.reshape(-1).view(np.uint8) !=
                                  want.reshape(-1).view(np.uint8)) if got.shape == want.shape \
                else []
            self.problem(f"{npy_path}: data differs from h5py (first bytes {list(diff[:5])})")

    def lindi_signed_zero(self, got: np.ndarray, want: np.ndarray) -> bool:
        """True if a LINDI ``.npy`` differs from h5py only in the sign of zeros:
        lindi 0.4.6 writes a fill value of -0.0 as 0.0 (and reads it back so),
        which shows where no chunk was written. Written -0.0 values are still
        compared byte for byte in the chunk files."""
        return self.view.kind == "lindi" and want.dtype.kind == "f" and \
            got.shape == want.shape and bool(np.array_equal(got, want, equal_nan=True))

    def chunk_files(self, h5path: str, path: str, entry: Entry, ds: h5py.Dataset,
                    chunks: list[int], dtype: np.dtype[Any]) -> None:
        names = [n for n in entry.names if not n.startswith(".")]
        shape = ds.shape
        vlen = ds.dtype.kind == "O"
        data = ds.asstr()[()] if vlen else ds[()]
        hsds = self.view.hsds
        if hsds is not None:
            did = hsds.ids[h5path]
            stored = hsds.stored[did]
            want_names = {".".join(map(str, i)) for i in stored}
            spoiled = {n for n in names if self.view.chunk_affected(h5path, n)}
            self.expect(path, "chunk names", set(names) - spoiled, want_names - spoiled)
        for name in names:
            if self.view.chunk_affected(h5path, name):
                continue
            index = _chunk_index(name)
            chunk = self.entry(_join(path, name), "file")
            if chunk is None or index is None:
                continue
            if hsds is not None:
                want = stored.get(index)
                if want is None:
                    self.problem(f"{path}/{name}: listed but never stored")
                elif chunk.data != want:
                    self.problem(f"{path}/{name}: chunk bytes differ from what was stored")
                continue
            block_shape = tuple(chunks) or (1,)
            if vlen:
                got = np.asarray(numcodecs.VLenUTF8().decode(chunk.data), dtype=object)
            else:
                if len(chunk.data) != math.prod(block_shape) * dtype.itemsize:
                    self.problem(f"{path}/{name}: {len(chunk.data)} bytes for chunks {chunks}")
                    continue
                got = np.frombuffer(chunk.data, dtype=dtype).astype(ds.dtype)
            got = got.reshape(block_shape)
            if shape == ():
                same = got.reshape(-1)[:1].tolist() == np.asarray(data).reshape(-1).tolist() \
                    if vlen else got.tobytes() == np.asarray(data, dtype=ds.dtype).tobytes()
            else:
                region = tuple(slice(i * c, min((i + 1) * c, n))
                               for i, c, n in zip(index, chunks, shape, strict=True))
                inside = got[tuple(slice(0, r.stop - r.start) for r in region)]
                same = inside.tolist() == data[region].tolist() if vlen else \
                    np.ascontiguousarray(inside).tobytes() == \
                    np.ascontiguousarray(data[region], dtype=ds.dtype).tobytes()
            if not same:
                self.problem(f"{path}/{name}: chunk differs from h5py inside the dataset")


def check_h5(snap: Snapshot, h5: Path, view: View) -> tuple[list[str], int]:
    """(problems, number of entries compared) of ``snap`` against ``h5`` seen by ``view``."""
    with h5py.File(h5, "r") as f:
        checker = Checker(snap, f, view)
        problems = checker.run()
        return problems, checker.checked

