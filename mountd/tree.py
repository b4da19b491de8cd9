"""The format-free tree: HDF5 model objects shown as MOUNT-SPEC.md entries.

Owns the mapping from the object model (``layouts.model``) to nodes: folder
and domain directories, group and dataset directories, sidecars, chunk files,
symlinks for soft, external and cyclic hard links, and name escaping.
Extra per-object files (``.npy``, convention views) plug in as
``ObjectView``s without changes here.

Everything is lazy. A node holds only where it is (``ObjPath``); it reads the
model through ``Tree.obj`` (a TTL-cached catalog) when asked for content.

Concurrency: the tree keeps no mutable state apart from the reference-path
index, which is rebuilt whole and swapped in with no ``await`` in between, so
tasks may share every node freely.
"""

from __future__ import annotations

import collections
import logging
import posixpath
import re
import time
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from layouts.model import (
    AnyObject,
    Catalog,
    ChunkIndex,
    Dataset,
    Domain,
    Group,
    Link,
    LinkKind,
    ObjectKind,
    ObjectRef,
)
from mountd import sidecar, zarrmeta
from mountd.chunkcache import ChunkCache
from mountd.errors import MountError, NotFound, StorageError
from mountd.names import display_name
from mountd.nodes import (
    BytesHandle,
    DirListing,
    DirNode,
    FileHandle,
    FileNode,
    Node,
    NodeType,
    SnapshotListing,
    Stat,
    SymlinkNode,
)

log = logging.getLogger(__name__)

#: How many soft links one path may pass through before it counts as a loop.
MAX_SOFT_DEPTH = 16
#: Objects fetched at once while listing a group.
LIST_CONCURRENCY = 32
#: Most objects visited when indexing a domain to resolve references.
REF_INDEX_LIMIT = 200_000

ROOT_SIDECAR = ".root.json"
SIDECAR = ".json"
_CHUNK_NAME = re.compile(r"0|[1-9][0-9]*")


@dataclass(frozen=True, slots=True)
class ObjPath:
    """Where an object was reached: its domain, link names from the root, ids on the way."""

    domain: Domain
    names: tuple[str, ...]
    ids: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.ids[-1]

    @property
    def h5path(self) -> str:
        return "/" + "/".join(self.names)

    @property
    def parent(self) -> ObjPath:
        return ObjPath(self.domain, self.names[:-1], self.ids[:-1])

    def child(self, name: str, obj_id: str) -> ObjPath:
        return ObjPath(self.domain, (*self.names, name), (*self.ids, obj_id))

    def ancestor(self, obj_id: str) -> ObjPath | None:
        """The ancestor (or self) with id ``obj_id`` on this path, if any."""
        for depth in range(len(self.ids) - 1, -1, -1):
            if self.ids[depth] == obj_id:
                return ObjPath(self.domain, self.names[:depth], self.ids[:depth + 1])
        return None

    @property
    def key(self) -> Hashable:
        return (self.domain.path, self.names)


class ObjectView(Protocol):
    """An extra file beside an object, named ``P<suffix>`` (for example ``.npy``)."""

    suffix: str

    def applies(self, obj: AnyObject) -> bool:
        """True if objects like ``obj`` get this view."""
        ...

    def node(self, tree: Tree, op: ObjPath, obj: AnyObject) -> FileNode:
        """The view's file for the object at ``op``."""
        ...


class Tree:
    """Shared context of all nodes: the catalog, views, and location rules."""

    def __init__(self, catalog: Catalog, views: Sequence[ObjectView] = (),
                 ref_index_ttl: float = 60.0, chunk_cache: ChunkCache | None = None) -> None:
        self.catalog = catalog
        self.views = tuple(views)
        self.chunk_cache = chunk_cache or ChunkCache(0)
        self.started = time.time()
        self._ref_index_ttl = ref_index_ttl
        self._ref_index: dict[str, tuple[float, dict[str, str]]] = {}

    # -- model access ---------------------------------------------------

    async def obj(self, op: ObjPath) -> AnyObject:
        """The object at ``op``. A link to an object that is not stored is broken
        metadata (EIO), not a missing name."""
        try:
            return await self.catalog.get_object(op.domain, op.id)
        except NotFound as exc:
            raise StorageError(str(exc), f"object {op.id} linked at {op.h5path} is missing") \
                from exc

    async def group(self, op: ObjPath) -> Group:
        """The object at ``op``, which must be a group (else EIO: it changed kind)."""
        obj = await self.obj(op)
        if not isinstance(obj, Group):
            raise StorageError(op.h5path, f"expected a group, found a {obj.kind.value}")
        return obj

    async def dataset(self, op: ObjPath) -> Dataset:
        """The object at ``op``, which must be a dataset (else EIO: it changed kind)."""
        obj = await self.obj(op)
        if not isinstance(obj, Dataset):
            raise StorageError(op.h5path, f"expected a dataset, found a {obj.kind.value}")
        return obj

    async def root(self) -> DirNode:
        """The node at the mount root."""
        single = self.catalog.single_domain
        if single is None:
            return FolderDir(self, "")
        domain = await self.catalog.domain(single)
        if domain is None or domain.root_id is None:
            raise NotFound(single)
        return GroupDir(self, ObjPath(domain, (), (domain.root_id,)), mount_root=True)

    # -- chunks ---------------------------------------------------------

    async def chunk(self, op: ObjPath, ds: Dataset, index: ChunkIndex) -> bytes | None:
        """A decoded chunk through the shared cache; None if it is not stored."""
        return await self.chunk_cache.get((op.domain.path, ds.id, index),
                                          lambda: ds.read_chunk(index))

    def cached_chunk(self, op: ObjPath, ds: Dataset,
                     index: ChunkIndex) -> tuple[bool, bytes | None]:
        """``(True, chunk)`` when the chunk is in the cache now; no I/O."""
        return self.chunk_cache.peek((op.domain.path, ds.id, index))

    def prefetch_chunk(self, op: ObjPath, ds: Dataset, index: ChunkIndex) -> None:
        self.chunk_cache.prefetch((op.domain.path, ds.id, index), lambda: ds.read_chunk(index))

    # -- locations in the mount -----------------------------------------

    def domain_prefix(self, domain: Domain) -> tuple[str, ...]:
        if self.catalog.single_domain is not None:
            return ()
        return tuple(p for p in domain.path.split("/") if p)

    def dir_location(self, op: ObjPath) -> tuple[str, ...]:
        return self.domain_prefix(op.domain) + tuple(display_name(n) for n in op.names)

    def file_location(self, op: ObjPath, suffix: str) -> tuple[str, ...]:
        """Where ``P<suffix>`` of the object at ``op`` is (``P.json``, ``P.npy``...)."""
        if op.names:
            return (*self.dir_location(op.parent), display_name(op.names[-1], suffix))
        prefix = self.domain_prefix(op.domain)
        if not prefix:
            return (ROOT_SIDECAR,) if suffix == SIDECAR else (f".root{suffix}",)
        return (*prefix[:-1], prefix[-1] + suffix)

    @staticmethod
    def relative(target: tuple[str, ...], from_dir: tuple[str, ...]) -> str:
        return posixpath.relpath("/" + "/".join(target), "/" + "/".join(from_dir))

    # -- links ----------------------------------------------------------

    def root_path(self, domain: Domain) -> ObjPath:
        if domain.root_id is None:
            raise NotFound(domain.path)
        return ObjPath(domain, (), (domain.root_id,))

    async def resolve(self, start: ObjPath, h5path: str, depth: int = 0) -> ObjPath | None:
        """The object an HDF5 path names, following links; None if it does not resolve."""
        if depth > MAX_SOFT_DEPTH:
            return None
        cur = self.root_path(start.domain) if h5path.startswith("/") else start
        for comp in h5path.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                cur = cur.parent if cur.names else cur
                continue
            try:
                group = await self.obj(cur)
            except MountError:
                return None
            if not isinstance(group, Group):
                return None
            link = group.links.get(comp)
            if link is None:
                return None
            if link.kind is LinkKind.HARD:
                cur = cur.ancestor(link.target) or cur.child(comp, link.target)
            elif link.kind is LinkKind.SOFT:
                found = await self.resolve(cur, link.target, depth + 1)
                if found is None:
                    return None
                cur = found
            else:
                return None
        return cur

    async def external_domain(self, here: Domain, link: Link) -> Domain | None:
        """The domain an external link points into, if it is in this mount."""
        if self.catalog.single_domain is not None or not link.domain:
            return None
        name = link.domain
        if not name.startswith("/"):
            name = posixpath.join("/" + posixpath.dirname(here.path), name)
        path = posixpath.normpath(name).strip("/")
        try:
            domain = await self.catalog.domain(path)
        except MountError:
            return None
        if domain is None or domain.root_id is None:
            return None
        return domain

    # -- object references ----------------------------------------------

    async def ref_path(self, domain: Domain, ref: ObjectRef) -> str | None:
        """The HDF5 path of a referenced object (first found breadth-first)."""
        if ref.path is not None:
            return ref.path
        if ref.obj_id is None:
            return None
        index = await self._domain_index(domain)
        return index.get(ref.obj_id)

    async def _domain_index(self, domain: Domain) -> dict[str, str]:
        now = time.monotonic()
        cached = self._ref_index.get(domain.path)
        if cached is not None and cached[0] > now:
            return cached[1]
        root = self.root_path(domain)
        index: dict[str, str] = {root.id: "/"}
        queue = collections.deque([root])
        while queue and len(index) < REF_INDEX_LIMIT:
            op = queue.popleft()
            try:
                group = await self.obj(op)
            except MountError:
                continue
            if not isinstance(group, Group):
                continue
            for name, link in group.links.items():
                if link.kind is not LinkKind.HARD or link.target in index:
                    continue
                child = op.child(name, link.target)
                index[link.target] = child.h5path
                if link.target_kind in (None, ObjectKind.GROUP):
                    queue.append(child)
        self._ref_index[domain.path] = (now + self._ref_index_ttl, index)
        return index

    def times(self, op: ObjPath, obj: AnyObject) -> tuple[float, float]:
        """(mtime, ctime) of an object's entries: a domain root uses the domain's."""
        return _times(obj if op.names else op.domain, self)

    def resolver(self, domain: Domain) -> Callable[[ObjectRef], Awaitable[str | None]]:
        async def resolve(ref: ObjectRef) -> str | None:
            return await self.ref_path(domain, ref)
        return resolve


def _times(obj: AnyObject | Domain | None, tree: Tree) -> tuple[float, float]:
    modified = getattr(obj, "modified", None) or tree.started
    created = getattr(obj, "created", None) or modified
    return float(modified), float(created)


class SnapshotDir(DirNode):
    """A directory whose listing is computed whole by ``listing()``."""

    @abstractmethod
    async def listing(self) -> list[tuple[str, Node]]:
        """Every entry, in the order readdir shows them."""

    def open_listing(self) -> DirListing:
        return SnapshotListing(self.listing)

    async def lookup(self, name: str) -> Node:
        for entry_name, node in await self.listing():
            if entry_name == name:
                return node
        raise NotFound(name)


class FolderDir(SnapshotDir):
    """An HSDS folder, or a plain directory of the bucket (``path`` "" is the top)."""

    def __init__(self, tree: Tree, path: str) -> None:
        self.tree = tree
        self.path = path

    @property
    def key(self) -> Hashable:
        return ("folder", self.path)

    async def stat(self) -> Stat:
        domain = await self.tree.catalog.domain(self.path) if self.path else None
        mtime, ctime = _times(domain, self.tree)
        return Stat(NodeType.DIR, mtime=mtime, ctime=ctime)

    async def listing(self) -> list[tuple[str, Node]]:
        names = await self.tree.catalog.list_folder(self.path)
        domains: dict[str, Domain | None] = {}
        limiter = trio.CapacityLimiter(LIST_CONCURRENCY)

        async def probe(name: str) -> None:
            async with limiter:
                try:
                    domains[name] = await self.tree.catalog.domain(self._child(name))
                except MountError:
                    domains[name] = None

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(probe, name)
        items: list[tuple[str, Node]] = []
        real = set(names)
        for name in names:
            domain = domains[name]
            if domain is not None and domain.root_id is not None:
                op = ObjPath(domain, (), (domain.root_id,))
                items.append((name, GroupDir(self.tree, op)))
                if name + SIDECAR not in real:
                    items.append((name + SIDECAR, sidecar_file(self.tree, op)))
            else:
                items.append((name, FolderDir(self.tree, self._child(name))))
        return items

    def _child(self, name: str) -> str:
        return f"{self.path}/{name}" if self.path else name

    async def lookup(self, name: str) -> Node:
        names = await self.tree.catalog.list_folder(self.path)
        if name in names:
            domain = await self.tree.catalog.domain(self._child(name))
            if domain is not None and domain.root_id is not None:
                return GroupDir(self.tree, self.tree.root_path(domain))
            return FolderDir(self.tree, self._child(name))
        if name.endswith(SIDECAR) and name[:-len(SIDECAR)] in names:
            domain = await self.tree.catalog.domain(self._child(name[:-len(SIDECAR)]))
            if domain is not None and domain.root_id is not None:
                return sidecar_file(self.tree, self.tree.root_path(domain))
        raise NotFound(name)


class ObjectDir(SnapshotDir):
    """The directory of an HDF5 object; subclasses list what is inside."""

    def __init__(self, tree: Tree, op: ObjPath) -> None:
        self.tree = tree
        self.op = op

    @property
    def key(self) -> Hashable:
        return ("dir", self.op.key)

    async def stat(self) -> Stat:
        mtime, ctime = self.tree.times(self.op, await self.tree.obj(self.op))
        return Stat(NodeType.DIR, mtime=mtime, ctime=ctime)

    async def xattrs(self) -> dict[str, bytes]:
        obj = await self.tree.obj(self.op)
        return await sidecar.object_xattrs(obj, self.tree.resolver(self.op.domain))

    async def listing(self) -> list[tuple[str, Node]]:
        await self.tree.obj(self.op)
        return []


def object_dir(tree: Tree, op: ObjPath, kind: ObjectKind) -> ObjectDir:
    if kind is ObjectKind.GROUP:
        return GroupDir(tree, op)
    if kind is ObjectKind.DATASET:
        return DatasetDir(tree, op)
    return ObjectDir(tree, op)


class GroupDir(ObjectDir):
    """A group: for each link ``P``, the entries ``P``, ``P.json`` and views."""

    def __init__(self, tree: Tree, op: ObjPath, mount_root: bool = False) -> None:
        super().__init__(tree, op)
        self.mount_root = mount_root

    def _suffixes(self) -> list[str]:
        return [SIDECAR, *(view.suffix for view in self.tree.views)]

    def _index(self, group: Group) -> dict[str, tuple[str, str]]:
        """Entry name -> (link name, suffix); real link names win over generated ones."""
        index: dict[str, tuple[str, str]] = {}
        for name in sorted(group.links):
            for suffix in self._suffixes():
                index.setdefault(display_name(name, suffix), (name, suffix))
        for name in group.links:
            index[display_name(name)] = (name, "")
        return index

    async def listing(self) -> list[tuple[str, Node]]:
        group = await self.tree.group(self.op)
        index = self._index(group)
        per_link: dict[str, dict[str, Node]] = {}
        limiter = trio.CapacityLimiter(LIST_CONCURRENCY)

        async def fill(name: str) -> None:
            async with limiter:
                per_link[name] = await self._link_entries(name, group.links[name])

        async with trio.open_nursery() as nursery:
            for name in group.links:
                nursery.start_soon(fill, name)
        items = [(name, node) for name, node in self._own_files().items() if name not in index]
        for shown in sorted(index):
            name, suffix = index[shown]
            node = per_link[name].get(suffix)
            if node is not None:
                items.append((shown, node))
        return items

    async def lookup(self, name: str) -> Node:
        group = await self.tree.group(self.op)
        index = self._index(group)
        if name not in index:
            own = self._own_files().get(name)
            if own is None:
                raise NotFound(name)
            return own
        link_name, suffix = index[name]
        node = (await self._link_entries(link_name, group.links[link_name])).get(suffix)
        if node is None:
            raise NotFound(name)
        return node

    def _own_files(self) -> dict[str, Node]:
        """Files of the group itself: zarr metadata, and the mount root's sidecar."""
        files: dict[str, Node] = {}
        if self.mount_root:
            files[ROOT_SIDECAR] = sidecar_file(self.tree, self.op)
        files[ZATTRS_NAME] = MetaFile(self.tree, self.op, ZATTRS_NAME, _render_zattrs)
        files[ZGROUP_NAME] = MetaFile(self.tree, self.op, ZGROUP_NAME, _render_zgroup)
        return files

    async def _link_entries(self, name: str, link: Link) -> dict[str, Node]:
        """The entries one link contributes, by suffix (``""`` is the link itself)."""
        here = self.tree.dir_location(self.op)
        if link.kind is LinkKind.HARD and self.op.ancestor(link.target) is None:
            return await self._object_entries(self.op.child(name, link.target), link)
        if link.kind is LinkKind.HARD:
            target = self.op.ancestor(link.target)
        elif link.kind is LinkKind.SOFT:
            target = await self.tree.resolve(self.op, link.target)
        else:
            domain = await self.tree.external_domain(self.op.domain, link)
            target = (None if domain is None
                      else await self.tree.resolve(self.tree.root_path(domain), link.target))
        if target is None:
            text = link.target if link.kind is LinkKind.SOFT else f"{link.domain}::{link.target}"
            return {"": Symlink(("link", self.op.key, name), text, self.tree.started)}
        entries: dict[str, Node] = {
            "": Symlink(("link", self.op.key, name),
                        self.tree.relative(self.tree.dir_location(target), here),
                        self.tree.started),
        }
        try:
            obj = await self.tree.obj(target)
        except MountError:
            return entries
        for suffix in self._suffixes():
            if suffix == SIDECAR or any(v.suffix == suffix and v.applies(obj)
                                        for v in self.tree.views):
                location = self.tree.file_location(target, suffix)
                entries[suffix] = Symlink(("link", self.op.key, name, suffix),
                                          self.tree.relative(location, here), self.tree.started)
        return entries

    async def _object_entries(self, op: ObjPath, link: Link) -> dict[str, Node]:
        kind = link.target_kind
        obj: AnyObject | None = None
        if kind is None or self.tree.views:
            try:
                obj = await self.tree.obj(op)
                kind = obj.kind
            except MountError:
                if kind is None:
                    kind = ObjectKind.GROUP
        entries: dict[str, Node] = {
            "": object_dir(self.tree, op, kind),
            SIDECAR: sidecar_file(self.tree, op),
        }
        if obj is not None:
            for view in self.tree.views:
                if view.applies(obj):
                    entries[view.suffix] = view.node(self.tree, op, obj)
        return entries


def chunk_name(index: ChunkIndex) -> str:
    return ".".join(str(i) for i in index)


def parse_chunk_name(name: str) -> ChunkIndex | None:
    parts = name.split(".")
    if not all(_CHUNK_NAME.fullmatch(p) for p in parts):
        return None
    return tuple(int(p) for p in parts)


class DatasetDir(ObjectDir):
    """A dataset: one file per stored chunk, named by grid index."""

    def _own_files(self, ds: Dataset) -> dict[str, Node]:
        files: dict[str, Node] = {}
        if zarrmeta.has_zarray(ds):
            files[ZARRAY_NAME] = MetaFile(self.tree, self.op, ZARRAY_NAME, _render_zarray)
        files[ZATTRS_NAME] = MetaFile(self.tree, self.op, ZATTRS_NAME, _render_zattrs)
        return files

    async def listing(self) -> list[tuple[str, Node]]:
        ds = await self.tree.dataset(self.op)
        indices = [idx async for idx in ds.store.iter_stored() if ds.in_grid(idx)]
        indices.sort()
        return [*self._own_files(ds).items(),
                *((chunk_name(idx), ChunkFile(self.tree, self.op, idx)) for idx in indices)]

    async def lookup(self, name: str) -> Node:
        ds = await self.tree.dataset(self.op)
        own = self._own_files(ds).get(name)
        if own is not None:
            return own
        index = parse_chunk_name(name)
        if index is None or not ds.in_grid(index) or not await ds.store.exists(index):
            raise NotFound(name)
        return ChunkFile(self.tree, self.op, index)


class Symlink(SymlinkNode):
    def __init__(self, key: Hashable, text: str, mtime: float) -> None:
        self._key = key
        self._text = text
        self._mtime = mtime

    @property
    def key(self) -> Hashable:
        return self._key

    async def stat(self) -> Stat:
        return Stat(NodeType.SYMLINK, size=len(self._text.encode("utf-8", "surrogateescape")),
                    mtime=self._mtime, ctime=self._mtime)

    async def target(self) -> str:
        return self._text


MetaRender = Callable[["Tree", ObjPath, AnyObject], Awaitable[bytes]]


class MetaFile(FileNode):
    """A small file rendered from one object's metadata (``P.json``, ``.zattrs``...).

    Its size is exact: ``stat`` renders the content, from the cached object.
    """

    def __init__(self, tree: Tree, op: ObjPath, name: str, render: MetaRender) -> None:
        self.tree = tree
        self.op = op
        self.name = name
        self._render = render

    @property
    def key(self) -> Hashable:
        return ("meta", self.name, self.op.key)

    async def content(self) -> bytes:
        return await self._render(self.tree, self.op, await self.tree.obj(self.op))

    async def stat(self) -> Stat:
        mtime, ctime = self.tree.times(self.op, await self.tree.obj(self.op))
        return Stat(NodeType.FILE, size=len(await self.content()), mtime=mtime, ctime=ctime)

    async def open(self) -> FileHandle:
        handle = BytesHandle(self.content)
        await handle.data()
        return handle


async def _render_sidecar(tree: Tree, op: ObjPath, obj: AnyObject) -> bytes:
    domain = op.domain if not op.names else None
    return await sidecar.sidecar_bytes(obj, op.h5path, domain, tree.resolver(op.domain))


async def _render_zattrs(tree: Tree, op: ObjPath, obj: AnyObject) -> bytes:
    return await zarrmeta.zattrs_bytes(obj, op.h5path, tree.resolver(op.domain))


async def _render_zarray(tree: Tree, op: ObjPath, obj: AnyObject) -> bytes:
    if not isinstance(obj, Dataset):
        raise StorageError(op.h5path, "not a dataset")
    return zarrmeta.zarray_bytes(obj)


async def _render_zgroup(tree: Tree, op: ObjPath, obj: AnyObject) -> bytes:
    return zarrmeta.ZGROUP


def sidecar_file(tree: Tree, op: ObjPath) -> MetaFile:
    return MetaFile(tree, op, SIDECAR, _render_sidecar)


ZGROUP_NAME = ".zgroup"
ZATTRS_NAME = ".zattrs"
ZARRAY_NAME = ".zarray"


class ChunkFile(FileNode):
    """One decoded chunk of a dataset."""

    def __init__(self, tree: Tree, op: ObjPath, index: ChunkIndex) -> None:
        self.tree = tree
        self.op = op
        self.index = index

    @property
    def key(self) -> Hashable:
        return ("chunk", self.op.key, self.index)

    async def stat(self) -> Stat:
        ds = await self.tree.dataset(self.op)
        mtime, ctime = _times(ds, self.tree)
        return Stat(NodeType.FILE, size=ds.chunk_nbytes or 0, mtime=mtime, ctime=ctime)

    async def open(self) -> FileHandle:
        ds = await self.tree.dataset(self.op)
        where = f"{self.op.domain.path}{self.op.h5path} chunk {chunk_name(self.index)}"

        async def load() -> bytes:
            data = await self.tree.chunk(self.op, ds, self.index)
            if data is None:
                raise StorageError(where, "chunk is no longer stored")
            return data

        return BytesHandle(load, direct_io=ds.chunk_nbytes is None, keep_cache=True)
