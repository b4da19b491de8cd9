"""The format-free tree: HDF5 model objects shown as MOUNT-SPEC.md entries.

Owns the mapping from the object model (``layouts.model``) to nodes: folder
and domain directories, group and dataset directories, sidecars, chunk files,
symlinks for soft, external and cyclic hard links, and name escaping.
Extra per-object files (``.npy``, convention views) plug in as
``ObjectView``s without changes here.

Everything is lazy. A node holds only where it is (``ObjPath``); it reads the
model through ``Tree.obj`` (a TTL-cached catalog) when asked for content.
What is derived from an object (rendered metadata files, a group's name
index, xattrs, a small dataset's chunk names) is memoised in ``Tree.memo``
for as long as the catalog hands out the same object instance. A dataset
directory streams its chunk names from storage (``StreamListing``); it never
holds them all. A walker opening a group's child directories in order (``ls
-R``, ``find``) gets the next ones loaded in the background
(``mountd.dirahead``), and a reader of chunk files in grid order gets the
next chunks decoded ahead (``mountd.chunkahead``). Chunks are fetched
through the chunk cache one at a time (``Tree.chunk``) or in batches
(``Tree.chunks``, ``Tree.prefetch_chunks``; ``mountd.chunkbatch``).

Concurrency: the tree's mutable state is the reference-path index (rebuilt
whole and swapped in with no ``await`` in between), the memo and the two
readahead states (all changed only by synchronous calls), so tasks may share
every node freely. Background loading runs in the nursery the daemon gives
the chunk cache (``Tree.nursery``; none: no background work), at most
``LIST_CONCURRENCY`` fetches at once.
"""

from __future__ import annotations

import collections
import logging
import posixpath
import re
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

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
from mountd import chunkbatch, sidecar, zarrmeta
from mountd.chunkahead import GridReadahead
from mountd.chunkcache import ChunkCache
from mountd.chunklist import ChunkList, ChunkListBuilder
from mountd.dirahead import DirReadahead
from mountd.errors import MountError, NotFound, StorageError
from mountd.io import readahead
from mountd.memo import Memo
from mountd.metacache import CachedCatalog
from mountd.names import display_name
from mountd.nodes import (
    BytesHandle,
    DirListing,
    DirNode,
    FileHandle,
    FileNode,
    Node,
    NodeType,
    Row,
    SnapshotListing,
    Stat,
    StreamListing,
    SymlinkNode,
    listed_stat,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How many soft links one path may pass through before it counts as a loop.
MAX_SOFT_DEPTH = 16
#: Objects fetched at once while listing a group (one remote round trip each).
LIST_CONCURRENCY = 128
#: Children whose objects are fetched ahead when a group is loaded in the background.
PRELOAD_LINKS = 1000
#: Chunks of one dataset listed ahead in the background (one page of an S3 listing);
#: a dataset with more is listed when its directory is read.
SMALL_LISTING = 1000
#: Most chunk indices of one dataset kept once listed (8 bytes each, in the memo);
#: longer listings are read from storage each time.
MAX_KEPT_CHUNKS = 4_000_000
#: Objects loaded per batch (one worker-thread call on local disk) when a group is listed.
LOAD_BATCH = 256
#: Batches loaded at once (remote stores overlap their round trips).
LOAD_CONCURRENCY = 4
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
                 ttl: float = 60.0, chunk_cache: ChunkCache | None = None) -> None:
        self.catalog = catalog
        self.views = tuple(views)
        self.chunk_cache = chunk_cache or ChunkCache(0)
        self.memo = Memo()
        #: Largest readahead, in bytes of decoded chunks: a quarter of the chunk cache.
        self.readahead_cap = min(readahead.CAP, self.chunk_cache.budget // 4)
        self.grid_readahead = GridReadahead(self.readahead_cap)
        self.dir_readahead: DirReadahead[ObjectDir] = DirReadahead(cap=LIST_CONCURRENCY // 2)
        self.preload_limiter = trio.CapacityLimiter(LIST_CONCURRENCY)
        #: Directories being loaded ahead, by ``ObjPath.key``, from the moment
        #: the load is scheduled; each event is set when its load ends.
        self.loading: dict[Hashable, trio.Event] = {}
        self.started = time.time()
        #: ``-o metadata_ttl``: how long anything read from storage may be served.
        self.ttl = ttl
        self._ref_index: dict[str, tuple[float, dict[str, str]]] = {}
        self._peek: Callable[[Domain, str], AnyObject | None] = (
            catalog.peek_object if isinstance(catalog, CachedCatalog) else _no_peek)

    # -- model access ---------------------------------------------------

    async def obj(self, op: ObjPath) -> AnyObject:
        """The object at ``op``. A link to an object that is not stored is broken
        metadata (EIO), not a missing name."""
        try:
            return await self.catalog.get_object(op.domain, op.id)
        except NotFound as exc:
            raise StorageError(str(exc), f"object {op.id} linked at {op.h5path} is missing") \
                from exc

    def peek(self, op: ObjPath) -> AnyObject | None:
        """The object at ``op`` if the catalog's cache holds it fresh (no I/O)."""
        return self._peek(op.domain, op.id)

    def all_fresh(self, domain: Domain, objects: list[tuple[str, AnyObject]] | None) -> bool:
        """True if the cache still hands out exactly these objects of ``domain``."""
        if objects is None:
            return False
        peek = self._peek
        return all(peek(domain, obj_id) is obj for obj_id, obj in objects)

    async def load_objects(self, domain: Domain, obj_ids: Sequence[str]) -> None:
        """Bring many objects into the catalog's cache at once, in batches of
        ``LOAD_BATCH`` (one worker-thread call each on local disk), up to
        ``LOAD_CONCURRENCY`` batches at a time. Failures stay in the cache,
        to be reported when the object is used."""
        catalog = self.catalog
        if not isinstance(catalog, CachedCatalog) or not obj_ids:
            return
        batches = [obj_ids[i:i + LOAD_BATCH] for i in range(0, len(obj_ids), LOAD_BATCH)]

        async def load(batch: Sequence[str]) -> None:
            await catalog.get_objects(domain, batch)

        await for_each(batches, load, workers=LOAD_CONCURRENCY)

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

    def epoch(self) -> Hashable:
        """The current ``ttl``-long period of the mount's clock. Chunks are cached
        per period, so a chunk read from storage is served for at most ``ttl``
        seconds (MOUNT-SPEC.md, Consistency); with ``ttl`` 0 every call is a
        period of its own."""
        now = time.monotonic()
        return int(now // self.ttl) if self.ttl > 0 else now

    def keep_pages(self, key: Hashable) -> bool:
        """Whether the kernel may keep the page cache of file ``key`` at this
        open: only if its last open was in this same period, so the pages it
        holds came from chunks still served now. Otherwise the open drops them."""
        epoch = self.epoch()
        last = self.memo.get(("opened", key))
        self.memo.put(("opened", key), epoch, 16)
        return last == epoch

    async def chunk(self, op: ObjPath, ds: Dataset, index: ChunkIndex) -> bytes | None:
        """A decoded chunk through the shared cache; None if it is not stored."""
        return await self.chunk_cache.get((op.domain.path, ds.id, self.epoch(), index),
                                          lambda: ds.read_chunk(index))

    def cached_chunk(self, op: ObjPath, ds: Dataset,
                     index: ChunkIndex) -> tuple[bool, bytes | None]:
        """``(True, chunk)`` when the chunk is in the cache now; no I/O."""
        return self.chunk_cache.peek((op.domain.path, ds.id, self.epoch(), index))

    def _chunk_keys(self, op: ObjPath, ds: Dataset,
                    indices: Sequence[ChunkIndex]) -> list[Hashable]:
        epoch = self.epoch()
        return [(op.domain.path, ds.id, epoch, index) for index in indices]

    async def chunks(self, op: ObjPath, ds: Dataset,
                     indices: Sequence[ChunkIndex]) -> list[bytes | MountError | None]:
        """Decoded chunks through the shared cache, the missing ones read in
        batches: for each index the chunk, None (not stored) or its error."""
        return await self.chunk_cache.get_many(
            self._chunk_keys(op, ds, indices), chunkbatch.fetcher(ds), chunkbatch.batch_size(ds))

    def prefetch_chunks(self, op: ObjPath, ds: Dataset, indices: Sequence[ChunkIndex]) -> int:
        """Start decoding chunks in the background, in batches; how many of
        ``indices`` (from the first) the cache accepted for now."""
        return self.chunk_cache.prefetch_many(
            self._chunk_keys(op, ds, indices), chunkbatch.fetcher(ds), chunkbatch.batch_size(ds))

    def chunk_file_read(self, op: ObjPath, ds: Dataset, index: ChunkIndex) -> None:
        """A chunk file is being read: prefetch the next chunks in grid order if
        this dataset's chunk files are being read in that order."""
        self.grid_readahead.on_read((op.domain.path, ds.id), ds, index,
                                    lambda ahead: self.prefetch_chunks(op, ds, ahead))

    # -- background loading ---------------------------------------------

    @property
    def nursery(self) -> trio.Nursery | None:
        """Where background work runs: the nursery the daemon gives the chunk cache."""
        return self.chunk_cache.nursery

    def dir_opened(self, node: ObjectDir) -> None:
        """A child directory of a group is being listed: load the next ones in
        the background if the group's children are being walked in order."""
        nursery = self.nursery
        if nursery is None or not node.op.names:
            return
        for child in self.dir_readahead.opened(node.op.parent.key, node.op.key):
            if not child.loaded() and child.op.key not in self.loading:
                # Registered now, not when the task first runs, so a listing
                # that comes before then waits for this load, not repeats it.
                self.loading[child.op.key] = trio.Event()
                nursery.start_soon(self._preload, child)

    async def _preload(self, node: ObjectDir) -> None:
        try:
            await node.preload()
        except MountError as exc:
            log.debug("loading %s ahead failed: %s", node.op.h5path, exc)
        except Exception:
            log.exception("loading %s ahead failed", node.op.h5path)
        finally:
            self.loading.pop(node.op.key).set()

    async def preload_object(self, op: ObjPath) -> None:
        """Fetch one object into the catalog's cache, in the background."""
        async with self.preload_limiter:
            try:
                await self.obj(op)
            except MountError as exc:
                log.debug("loading %s ahead failed: %s", op.h5path, exc)

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

    def h5_location(self, op: ObjPath, h5path: str) -> tuple[str, ...]:
        """Where the HDF5 path ``h5path``, read from the group at ``op``, would be
        in the mount, by its names alone: ``..`` above the domain's root stays
        at the root, as in HDF5, so the place is always inside the domain."""
        names = [] if h5path.startswith("/") else list(op.names)
        for comp in h5path.split("/"):
            if comp == "..":
                if names:
                    names.pop()
            elif comp not in ("", "."):
                names.append(comp)
        return self.domain_prefix(op.domain) + tuple(display_name(n) for n in names)

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
        self._ref_index[domain.path] = (now + self.ttl, index)
        return index

    def times(self, op: ObjPath, obj: AnyObject) -> tuple[float, float]:
        """(mtime, ctime) of an object's entries: a domain root uses the domain's."""
        return _times(obj if op.names else op.domain, self)

    def resolver(self, domain: Domain) -> Callable[[ObjectRef], Awaitable[str | None]]:
        async def resolve(ref: ObjectRef) -> str | None:
            return await self.ref_path(domain, ref)
        return resolve


async def for_each(items: Sequence[T], work: Callable[[T], Awaitable[None]],
                   workers: int = LIST_CONCURRENCY) -> None:
    """Run ``work`` on every item, at most ``workers`` at once. The workers
    share one iterator, so a group of 100,000 links costs ``workers`` tasks,
    not one task per link."""
    todo = iter(items)

    async def worker() -> None:
        for item in todo:
            await work(item)

    async with trio.open_nursery() as nursery:
        for _ in range(min(workers, len(items))):
            nursery.start_soon(worker)


def _no_peek(domain: Domain, obj_id: str) -> AnyObject | None:
    """A catalog without a cache has nothing fresh to hand out."""
    return None


def _times(obj: AnyObject | Domain | None, tree: Tree) -> tuple[float, float]:
    modified = getattr(obj, "modified", None) or tree.started
    created = getattr(obj, "created", None) or modified
    return float(modified), float(created)


class InDomain:
    """Mixed into the nodes of one domain's objects: the domain's metadata
    (its ACLs) applies to them."""

    op: ObjPath

    async def domain_info(self) -> Mapping[str, Any] | None:
        return self.op.domain.info


class SnapshotDir(DirNode):
    """A directory whose listing is computed whole by ``listing()``."""

    @abstractmethod
    async def listing(self) -> list[Row]:
        """Every entry, in the order readdir shows them."""

    def open_listing(self) -> DirListing:
        return SnapshotListing(self.listing)

    async def lookup(self, name: str) -> Node:
        for entry_name, node, _ in await self.listing():
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

    async def domain_info(self) -> Mapping[str, Any] | None:
        """The folder's own ``.domain.json`` metadata (None for the top)."""
        if not self.path:
            return None
        domain = await self.tree.catalog.domain(self.path)
        return None if domain is None else domain.info

    async def listing(self) -> list[Row]:
        names = await self.tree.catalog.list_folder(self.path)
        domains: dict[str, Domain | MountError | None] = {}

        async def probe(name: str) -> None:
            try:
                domains[name] = await self.tree.catalog.domain(self._child(name))
            except MountError as exc:
                domains[name] = exc

        await for_each(names, probe)
        items: list[Row] = []
        real = set(names)
        for name in names:
            domain = domains[name]
            if isinstance(domain, MountError):
                items.append(Row(name, BrokenDir(self.tree, self._child(name))))
            elif domain is not None and domain.root_id is not None:
                op = ObjPath(domain, (), (domain.root_id,))
                items.append(Row(name, GroupDir(self.tree, op)))
                if name + SIDECAR not in real:
                    items.append(Row(name + SIDECAR, sidecar_file(self.tree, op)))
            else:
                items.append(Row(name, FolderDir(self.tree, self._child(name))))
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


class BrokenDir(DirNode):
    """A folder entry whose ``.domain.json`` cannot be read: listed, so the
    rest of the folder shows, but every use gives that object's error (asked
    of the catalog again each time, so it ends with ``metadata_ttl``)."""

    def __init__(self, tree: Tree, path: str) -> None:
        self.tree = tree
        self.path = path

    @property
    def key(self) -> Hashable:
        return ("broken", self.path)

    async def _fail(self) -> MountError:
        """The domain's error now; NotFound once it reads (look it up again)."""
        try:
            await self.tree.catalog.domain(self.path)
        except MountError as exc:
            return exc
        return NotFound(self.path)

    async def stat(self) -> Stat:
        raise await self._fail()

    def open_listing(self) -> DirListing:
        async def fail() -> list[Row]:
            raise await self._fail()
        return SnapshotListing(fail)

    async def lookup(self, name: str) -> Node:
        raise await self._fail()


class ObjectDir(InDomain, DirNode):
    """The directory of an HDF5 object (a committed datatype's is empty)."""

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
        """The object's ``user.h5.*`` attributes (a shared dict: do not change it)."""
        obj = await self.tree.obj(self.op)
        key = ("xattrs", self.op.domain.path, obj.id)
        attrs: dict[str, bytes] | None = self.tree.memo.get(key, obj)
        if attrs is None:
            attrs = await sidecar.object_xattrs(obj, self.tree.resolver(self.op.domain))
            self.tree.memo.put(key, attrs, sum(len(k) + len(v) for k, v in attrs.items()), obj)
        return attrs

    def open_listing(self) -> DirListing:
        return SnapshotListing(self._nothing)

    async def _nothing(self) -> list[Row]:
        await self.tree.obj(self.op)
        return []

    async def lookup(self, name: str) -> Node:
        await self.tree.obj(self.op)
        raise NotFound(name)

    async def preload(self) -> None:
        """Fetch, in the background, what listing this directory will need."""
        await self.tree.preload_object(self.op)

    def loaded(self) -> bool:
        """True if listing this directory needs no storage round trip now."""
        return self.tree.peek(self.op) is not None


def object_dir(tree: Tree, op: ObjPath, kind: ObjectKind) -> ObjectDir:
    if kind is ObjectKind.GROUP:
        return GroupDir(tree, op)
    if kind is ObjectKind.DATASET:
        return DatasetDir(tree, op)
    return ObjectDir(tree, op)


#: Rough bytes one name of a group index costs, for the memo's budget.
_INDEX_ENTRY_BYTES = 200
#: Rough bytes one memoised readdir row costs beyond its node (which the inode
#: table holds anyway while the kernel knows the entry).
_ROW_BYTES = 160


@dataclass(frozen=True, slots=True)
class _Rows:
    """A group's readdir rows; ``objects`` are the (id, object) pairs they were
    made from (None: not reusable); ``dirs`` the child directories in order."""

    rows: list[Row]
    objects: list[tuple[str, AnyObject]] | None
    dirs: list[tuple[Hashable, ObjectDir]]


@dataclass(frozen=True, slots=True)
class _GroupIndex:
    """Entry name -> (link name, suffix), real link names winning; and the names sorted."""

    names: dict[str, tuple[str, str]]
    order: list[str]


class GroupDir(ObjectDir):
    """A group: for each link ``P``, the entries ``P``, ``P.json`` and views."""

    def __init__(self, tree: Tree, op: ObjPath, mount_root: bool = False) -> None:
        super().__init__(tree, op)
        self.mount_root = mount_root

    def _suffixes(self) -> list[str]:
        return [SIDECAR, *(view.suffix for view in self.tree.views)]

    def _index(self, group: Group) -> _GroupIndex:
        """The group's entry names, built once per group object (O(1) lookups after)."""
        key = ("index", self.op.domain.path, group.id)
        index: _GroupIndex | None = self.tree.memo.get(key, group)
        if index is not None:
            return index
        names: dict[str, tuple[str, str]] = {}
        suffixes = self._suffixes()
        for name in sorted(group.links):
            for suffix in suffixes:
                names.setdefault(display_name(name, suffix), (name, suffix))
        for name in group.links:
            names[display_name(name)] = (name, "")
        index = _GroupIndex(names, sorted(names))
        self.tree.memo.put(key, index, _INDEX_ENTRY_BYTES * len(names), group)
        return index

    def open_listing(self) -> DirListing:
        return SnapshotListing(self.listing)

    async def listing(self) -> list[Row]:
        """Every entry with its stat, sorted by name after the group's own files.

        The rows are memoised with the group object and checked, before
        reuse, against the child objects they were made from (one dict
        lookup each, no I/O); a group with soft, external or cyclic links is
        computed afresh each time, as its symlink texts depend on other groups.
        """
        group = await self.tree.group(self.op)
        self.tree.dir_opened(self)
        key = ("rows", self.op.key)
        rows: _Rows | None = self.tree.memo.get(key, group, self.op.domain)
        if rows is None or not self.tree.all_fresh(self.op.domain, rows.objects):
            rows = await self._rows(group)
            if rows.objects is not None:
                self.tree.memo.put(key, rows, _ROW_BYTES * len(rows.rows), group, self.op.domain)
        self.tree.dir_readahead.remember(self.op.key, rows.dirs)
        return rows.rows

    async def _rows(self, group: Group) -> _Rows:
        index = self._index(group)
        times = self.tree.times(self.op, group)
        children = self._children(group)
        await self.tree.load_objects(self.op.domain, [op.id for op in children])
        per_link: dict[str, dict[str, Node]] = {}

        async def fill(name: str) -> None:
            per_link[name] = await self._link_entries(name, group.links[name], times, True)

        await for_each(list(group.links), fill)
        rows = [Row(name, node, await listed_stat(node))
                for name, node in self._own_files().items() if name not in index.names]
        for shown in index.order:
            name, suffix = index.names[shown]
            node = per_link[name].get(suffix)
            if node is not None:
                rows.append(Row(shown, node, await listed_stat(node)))
        objects: list[tuple[str, AnyObject]] | None = None
        if len(children) == len(group.links):
            objects = []
            for op in children:
                obj = self.tree.peek(op)
                if obj is None:  # not loaded (an error): make the rows again next time
                    objects = None
                    break
                objects.append((op.id, obj))
        dirs = [(row.node.op.key, row.node) for row in rows if isinstance(row.node, ObjectDir)]
        return _Rows(rows, objects, dirs)

    def _children(self, group: Group) -> list[ObjPath]:
        """Where the group's hard links lead, leaving out links back to an ancestor."""
        return [self.op.child(name, link.target) for name, link in group.links.items()
                if link.kind is LinkKind.HARD and self.op.ancestor(link.target) is None]

    def loaded(self) -> bool:
        """True once the group's rows are made and still current."""
        group = self.tree.peek(self.op)
        if not isinstance(group, Group):
            return False
        rows: _Rows | None = self.tree.memo.get(("rows", self.op.key), group, self.op.domain)
        return rows is not None and self.tree.all_fresh(self.op.domain, rows.objects)

    async def preload(self) -> None:
        """Fetch the group and the objects of its first ``PRELOAD_LINKS`` children."""
        async with self.tree.preload_limiter:
            group = await self.tree.group(self.op)
        children = self._children(group)[:PRELOAD_LINKS]
        await self.tree.load_objects(self.op.domain, [op.id for op in children])

    async def lookup(self, name: str) -> Node:
        group = await self.tree.group(self.op)
        found = self._index(group).names.get(name)
        if found is None:
            own = self._own_files().get(name)
            if own is None:
                raise NotFound(name)
            return own
        link_name, suffix = found
        times = self.tree.times(self.op, group)
        entries = await self._link_entries(link_name, group.links[link_name], times, False)
        node = entries.get(suffix)
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

    async def _link_entries(self, name: str, link: Link, times: tuple[float, float],
                            listing: bool) -> dict[str, Node]:
        """The entries one link contributes, by suffix (``""`` is the link itself),
        for a ``listing`` or a lookup. Symlinks get the group's ``times`` (the
        model has no times of links)."""
        if link.kind is LinkKind.HARD and self.op.ancestor(link.target) is None:
            return await self._object_entries(self.op.child(name, link.target), link, listing)
        if link.kind is LinkKind.HARD:
            target = self.op.ancestor(link.target)
        elif link.kind is LinkKind.SOFT:
            target = await self.tree.resolve(self.op, link.target)
        else:
            domain = await self.tree.external_domain(self.op.domain, link)
            target = (None if domain is None
                      else await self.tree.resolve(self.tree.root_path(domain), link.target))
        here = self.tree.dir_location(self.op)
        if target is None:
            if link.kind is LinkKind.SOFT:
                text = self.tree.relative(self.tree.h5_location(self.op, link.target), here)
            else:
                text = inside_text(f"{link.domain}::{link.target}")
            return {"": Symlink(("link", self.op.key, name), text, times)}
        entries: dict[str, Node] = {
            "": Symlink(("link", self.op.key, name),
                        self.tree.relative(self.tree.dir_location(target), here), times),
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
                                          self.tree.relative(location, here), times)
        return entries

    async def _object_entries(self, op: ObjPath, link: Link, listing: bool) -> dict[str, Node]:
        """The object's directory, sidecar and views. The object is fetched when
        the views or its kind need it, and always for a ``listing``: readdir
        stats every entry next, so the listing fetches its children concurrently."""
        kind = link.target_kind
        obj: AnyObject | None = None
        if listing or kind is None or self.tree.views:
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


async def _close(stream: AsyncIterator[ChunkIndex]) -> None:
    """Finish a chunk listing left early (async generators hold storage pages)."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def chunk_name(index: ChunkIndex) -> str:
    return ".".join(str(i) for i in index)


def parse_chunk_name(name: str) -> ChunkIndex | None:
    parts = name.split(".")
    if not all(_CHUNK_NAME.fullmatch(p) for p in parts):
        return None
    return tuple(int(p) for p in parts)


class DatasetDir(ObjectDir):
    """A dataset: one file per stored chunk, named by grid index.

    The chunk indices of a dataset (at most ``MAX_KEPT_CHUNKS``), once
    listed, are memoised with the dataset object as a ``ChunkList``: listing
    it again, and looking up its chunks, then need no storage round trip
    until the object is fetched anew (``-o metadata_ttl``). A remembered
    listing comes in grid order, a first one in storage order.
    """

    def _own_files(self, ds: Dataset) -> dict[str, Node]:
        files: dict[str, Node] = {}
        if zarrmeta.has_zarray(ds):
            files[ZARRAY_NAME] = MetaFile(self.tree, self.op, ZARRAY_NAME, _render_zarray)
        files[ZATTRS_NAME] = MetaFile(self.tree, self.op, ZATTRS_NAME, _render_zattrs)
        return files

    def open_listing(self) -> DirListing:
        return StreamListing(self._entries)

    async def _entries(self) -> AsyncIterator[Row]:
        """The zarr files, then the stored chunks in storage order (never all held).
        Chunk files of a fixed-size type all have the same stat, made once here."""
        ds = await self.tree.dataset(self.op)
        self.tree.dir_opened(self)
        for name, node in self._own_files(ds).items():
            yield Row(name, node)
        chunk_stat = chunk_file_stat(self.tree, ds)
        suffix = zarrmeta.chunk_name_suffix(ds)
        loading = self.tree.loading.get(self.op.key)
        if loading is not None:  # being listed ahead right now: wait for it
            await loading.wait()
        known = self._known_chunks(ds)
        if known is not None:
            for index in known:
                yield Row(chunk_name(index) + suffix, ChunkFile(self.tree, self.op, index),
                          chunk_stat)
            return
        seen = ChunkListBuilder(_listing_grid(ds), MAX_KEPT_CHUNKS)
        stored = ds.store.iter_stored()
        try:
            async for index in stored:
                if not ds.in_grid(index):
                    continue
                seen.add(index)
                yield Row(chunk_name(index) + suffix, ChunkFile(self.tree, self.op, index),
                          chunk_stat)
        finally:
            await _close(stored)
        self._remember_chunks(ds, seen)

    def _chunks_key(self, ds: Dataset) -> Hashable:
        return ("chunks", self.op.domain.path, ds.id)

    def _known_chunks(self, ds: Dataset) -> ChunkList | None:
        """The chunk indices of the dataset, if listed since the object was fetched."""
        known: ChunkList | None = self.tree.memo.get(self._chunks_key(ds), ds)
        return known

    def _remember_chunks(self, ds: Dataset, seen: ChunkListBuilder) -> None:
        """Keep a whole listing (a listing left early or too long is not kept)."""
        chunks = seen.result()
        if chunks is not None:
            self.tree.memo.put(self._chunks_key(ds), chunks, chunks.nbytes, ds)

    def loaded(self) -> bool:
        ds = self.tree.peek(self.op)
        return isinstance(ds, Dataset) and self._known_chunks(ds) is not None

    async def preload(self) -> None:
        """List the chunks of a small dataset ahead (one storage round trip)."""
        async with self.tree.preload_limiter:
            ds = await self.tree.dataset(self.op)
            if self._known_chunks(ds) is None:
                await self._list_small(ds)

    async def _list_small(self, ds: Dataset) -> None:
        """Remember the chunk indices if there are at most ``SMALL_LISTING``."""
        seen = ChunkListBuilder(_listing_grid(ds), SMALL_LISTING)
        stored = ds.store.iter_stored()
        try:
            async for index in stored:
                if ds.in_grid(index):
                    seen.add(index)
                    if seen.gave_up:
                        return
        finally:
            await _close(stored)
        self._remember_chunks(ds, seen)

    async def lookup(self, name: str) -> Node:
        ds = await self.tree.dataset(self.op)
        own = self._own_files(ds).get(name)
        if own is not None:
            return own
        suffix = zarrmeta.chunk_name_suffix(ds)
        if not name.endswith(suffix):
            raise NotFound(name)
        index = parse_chunk_name(name[:len(name) - len(suffix)])
        if index is None or not ds.in_grid(index):
            raise NotFound(name)
        known = self._known_chunks(ds)
        if not (index in known if known is not None else await ds.store.exists(index)):
            raise NotFound(name)
        return ChunkFile(self.tree, self.op, index)


def _listing_grid(ds: Dataset) -> tuple[int, ...]:
    """The grid a dataset's chunk indices live in (a scalar's one chunk is ``(0,)``)."""
    return (1,) if ds.shape == () else ds.grid


def inside_text(raw: str) -> str:
    """Symlink text for a link that leads nowhere in the mount: ``raw`` made
    relative and unable to climb (no empty, ``.`` or ``..`` component; each
    component escaped as a name), so it resolves below the link's directory."""
    parts = [display_name(p) for p in raw.split("/") if p not in ("", ".")]
    return "/".join(parts) or display_name(raw)


class Symlink(SymlinkNode):
    """A symlink with fixed text; ``times`` is its (mtime, ctime).

    It has no xattrs: Linux refuses ``user.*`` attributes on symlinks before
    asking the filesystem (ENODATA), so the link as stored is kept in the
    parent group's sidecar (``links``) instead.
    """

    def __init__(self, key: Hashable, text: str, times: tuple[float, float]) -> None:
        self._key = key
        self._text = text
        self._mtime, self._ctime = times

    @property
    def key(self) -> Hashable:
        return self._key

    async def stat(self) -> Stat:
        return Stat(NodeType.SYMLINK, size=len(self._text.encode("utf-8", "surrogateescape")),
                    mtime=self._mtime, ctime=self._ctime)

    async def target(self) -> str:
        return self._text


MetaRender = Callable[["Tree", ObjPath, AnyObject], Awaitable[bytes]]


class MetaFile(InDomain, FileNode):
    """A small file rendered from one object's metadata (``P.json``, ``.zattrs``...).

    Its size is exact: ``stat`` renders the content from the cached object,
    and the rendering is memoised for ``open`` and later ``stat`` calls while
    the catalog returns the same object.
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
        return await self._content(await self.tree.obj(self.op))

    async def _content(self, obj: AnyObject) -> bytes:
        data: bytes | None = self.tree.memo.get(self.key, obj, self.op.domain)
        if data is None:
            data = await self._render(self.tree, self.op, obj)
            self.tree.memo.put(self.key, data, len(data), obj, self.op.domain)
        return data

    async def stat(self) -> Stat:
        obj = await self.tree.obj(self.op)
        mtime, ctime = self.tree.times(self.op, obj)
        return Stat(NodeType.FILE, size=len(await self._content(obj)), mtime=mtime, ctime=ctime)

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


def chunk_file_stat(tree: Tree, ds: Dataset) -> Stat:
    """The stat a listing gives every chunk file of ``ds``: exact for fixed-size
    types; for variable-length ones sizes differ by chunk and cost a decode,
    so it is a stand-in (``exact`` False) that the file's own stat replaces."""
    mtime, ctime = _times(ds, tree)
    if ds.chunk_nbytes is None:
        return Stat(NodeType.FILE, mtime=mtime, ctime=ctime, exact=False)
    return Stat(NodeType.FILE, size=ds.chunk_nbytes, mtime=mtime, ctime=ctime)


class ChunkFile(InDomain, FileNode):
    """One decoded chunk of a dataset."""

    def __init__(self, tree: Tree, op: ObjPath, index: ChunkIndex) -> None:
        self.tree = tree
        self.op = op
        self.index = index

    @property
    def key(self) -> Hashable:
        return ("chunk", self.op.key, self.index)

    async def stat(self) -> Stat:
        """Exact: a variable-length chunk is decoded to learn its size (kept
        with the dataset object, so for ``metadata_ttl``)."""
        ds = await self.tree.dataset(self.op)
        listed = chunk_file_stat(self.tree, ds)
        if listed.exact:
            return listed
        size: int | None = self.tree.memo.get(self._size_key, ds)
        if size is None:
            size = len(await self._data(ds))
            self.tree.memo.put(self._size_key, size, 16, ds)
        return Stat(NodeType.FILE, size=size, mtime=listed.mtime, ctime=listed.ctime)

    @property
    def _size_key(self) -> Hashable:
        return ("chunk size", self.op.key, self.index)

    async def _data(self, ds: Dataset) -> bytes:
        self.tree.chunk_file_read(self.op, ds, self.index)
        data = await self.tree.chunk(self.op, ds, self.index)
        if data is None:
            where = f"{self.op.domain.path}{self.op.h5path} chunk {chunk_name(self.index)}"
            raise StorageError(where, "chunk is no longer stored")
        return data

    async def open(self) -> FileHandle:
        """The kernel keeps the file's pages only while they are current
        (``Tree.keep_pages``). A variable-length chunk is decoded now; if its
        size is not the one last reported, the kernel's idea of the size is
        stale, so this open bypasses the page cache (``direct_io``)."""
        ds = await self.tree.dataset(self.op)
        keep = self.tree.keep_pages(self.key)
        if ds.chunk_nbytes is not None:
            return BytesHandle(lambda: self._data(ds), keep_cache=keep)
        data = await self._data(ds)
        reported = self.tree.memo.get(self._size_key, ds)
        self.tree.memo.put(self._size_key, len(data), 16, ds)

        async def loaded() -> bytes:
            return data

        return BytesHandle(loaded, direct_io=reported != len(data), keep_cache=keep)
