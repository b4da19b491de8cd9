"""The tree's shared context: model access and the chunk-cache facade.

Owns ``Tree``, which every node holds: the catalog (objects read through
``obj``, a TTL-cached catalog whose fresh entries ``peek`` sees without
I/O), the registered views, the memo of derived values, the times of
entries, the decoded-chunk cache keyed per data epoch (``chunk``, ``chunks``,
``prefetch_chunks``: the ``ttl``-long periods through which a dataset's
stored chunks stayed the same, ``mountd.cache.dataepochs``) with the
readahead of chunk files read in grid order and whether a reader's chunks
fit in it (``cache_holds``), the memory open files hold apart from it
(``held``), and the page-cache rule of files (``keep_pages``). It makes the
parts that own the rest: where entries are (``places``,
``mountd.tree.paths``), link resolution (``links``), object references
(``refs``), loading ahead (``preload``) and the sizes of view files
(``view_sizes``).

What depends on the nodes is given to it when it is made, by
``mountd.tree.build``: the views (the conventions, and the ``D.h5`` images
``h5views``) and how to make the node at the mount root (``root``). This
module imports no node module, so the tree's modules import one another
one way (``tests/test_boundaries.py``).

Concurrency: the memo and the readahead states change only in synchronous
calls, so tasks may share every node freely. Background work runs in the
nursery the daemon gives the chunk cache (``nursery``; none: no background
work).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import trio

from layouts.model import (
    AnyObject,
    Catalog,
    ChunkIndex,
    Dataset,
    Domain,
    Group,
    same_description,
)
from layouts.views import FileView, View
from mountd.cache import cachefit, chunkbatch
from mountd.cache.chunkahead import GridReadahead, chunk_unit
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.dataepochs import DataEpochs, version_digest
from mountd.cache.held import ROW_BANDS_BYTES, HeldMemory
from mountd.cache.memo import MAX_BYTES as MEMO_BYTES
from mountd.cache.memo import Memo
from mountd.cache.metacache import CachedCatalog
from mountd.errors import MountError, NotFound, StorageError
from mountd.io import readahead
from mountd.tree.fanout import for_each
from mountd.tree.links import Links
from mountd.tree.paths import SIDECAR, ObjPath, Places
from mountd.tree.preload import Preloader
from mountd.tree.refindex import RefIndex
from mountd.tree.sizerecords import SizeRecords
from mountd.tree.viewsizes import ViewSizes

if TYPE_CHECKING:
    from mountd.tree.h5view import H5Views
    from mountd.tree.nodes import DirNode

#: Objects loaded per batch (one worker-thread call on local disk) when a group is listed.
LOAD_BATCH = 256
#: Batches loaded at once (remote stores overlap their round trips).
LOAD_CONCURRENCY = 4
#: Smallest dataset (decoded bytes its chunk grid can hold) whose cached chunks
#: and pages are checked against storage at the end of a period, not dropped.
VERSIONED_BYTES = 1 << 20


class Tree:
    """Shared context of all nodes: the catalog, views, caches and location rules."""

    def __init__(self, catalog: Catalog, views: Sequence[View] = (),
                 ttl: float = 60.0, chunk_cache: ChunkCache | None = None, *,
                 root: Callable[[Tree], Awaitable[DirNode]],
                 h5views: H5Views | None = None, memo_bytes: int = MEMO_BYTES,
                 size_records: SizeRecords | None = None) -> None:
        self.catalog = catalog
        self.views = tuple(views)
        #: The views that show an entry ``P<suffix>`` beside the objects they apply to.
        self.entry_views = tuple(v for v in self.views if isinstance(v, FileView))
        #: The suffixes of a link's generated entries, in the order they claim
        #: names: the sidecar's, then the entry views'.
        self.entry_suffixes = (SIDECAR, *(view.suffix for view in self.entry_views))
        #: The views that add a key to the sidecars of the objects they apply to.
        self.sidecar_views = tuple(v for v in self.views if v.sidecar_key is not None)
        self.chunk_cache = chunk_cache or ChunkCache(0)
        self.memo = Memo(budget=memo_bytes)
        #: Each dataset's data epoch: the periods its cached chunks stay current.
        self.data_epochs = DataEpochs()
        #: Opens that let the kernel keep a file's pages, and opens that dropped them.
        self.pages_kept = 0
        self.pages_dropped = 0
        #: Periods started early by ``refresh`` (part of every ``epoch``).
        self._refreshes = 0
        #: Largest readahead, in bytes of decoded chunks: a quarter of the chunk cache.
        self.readahead_cap = cachefit.readahead_cap(self.chunk_cache.budget)
        self.grid_readahead = GridReadahead(self.readahead_cap)
        self.started = time.time()
        #: ``-o metadata_ttl``: how long anything read from storage may be served.
        self.ttl = ttl
        #: What open files hold apart from the chunk cache (none when nothing
        #: decoded is kept, ``metadata_ttl=0``).
        self.held = HeldMemory(ROW_BANDS_BYTES if ttl > 0 else 0, self.epoch)
        self.places = Places(catalog)
        self.links = Links(catalog, self.obj)
        self.refs = RefIndex(self.obj, self.epoch)
        self.preload = Preloader(self.obj, self.chunk_cache)
        self.view_sizes = ViewSizes(self.memo, self, size_records or SizeRecords(None, ""))
        self._cached = catalog if isinstance(catalog, CachedCatalog) else None
        #: The ``D.h5`` file views, when the mount shows them (``-o h5view``).
        self.h5views = h5views
        #: Makes the node at the mount root (``mountd.tree.build.mount_root``).
        self._root = root

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
        return None if self._cached is None else self._cached.peek_object(op.domain, op.id)

    def all_fresh(self, domain: Domain, objects: Sequence[tuple[str, AnyObject]] | None) -> bool:
        """True if the cache still hands out exactly these objects of ``domain``."""
        if objects is None:
            return False
        if self._cached is None:
            return not objects
        peek = self._cached.peek_object
        return all(peek(domain, obj_id) is obj for obj_id, obj in objects)

    def renewed(self, domain: Domain, objects: list[tuple[str, AnyObject]]) -> bool:
        """True if, for each of these objects of ``domain``, the cache hands out
        now the very same object or one that describes it alike (read again
        since, unchanged: ``same_description``); such a one then takes its
        place in ``objects``, so that ``all_fresh`` holds for them."""
        if self._cached is None:
            return not objects
        peek = self._cached.peek_object
        now: list[tuple[int, AnyObject]] = []
        for pos, (obj_id, obj) in enumerate(objects):
            current = peek(domain, obj_id)
            if current is obj:
                continue
            if current is None or not same_description(current, obj):
                return False
            now.append((pos, current))
        for pos, current in now:
            objects[pos] = (objects[pos][0], current)
        return True

    async def load_objects(self, domain: Domain, obj_ids: Sequence[str]) -> None:
        """Bring many objects into the catalog's cache at once, in batches of
        ``LOAD_BATCH`` (one worker-thread call each on local disk), up to
        ``LOAD_CONCURRENCY`` batches at a time. Failures stay in the cache,
        to be reported when the object is used."""
        catalog = self._cached
        if catalog is None or not obj_ids:
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
        """The node at the mount root, made as this tree was told (``root``)."""
        return await self._root(self)

    def times(self, op: ObjPath, obj: AnyObject) -> tuple[float, float]:
        """(mtime, ctime) of an object's entries: a domain root uses the domain's."""
        return self.stamps(obj if op.names else op.domain)

    def stamps(self, source: AnyObject | Domain | None) -> tuple[float, float]:
        """(mtime, ctime) of an object's or a domain's entries: both the storage
        time of its stored metadata; the mount's start where it has none."""
        modified = float(source.modified or self.started) if source is not None \
            else self.started
        return modified, modified

    # -- chunks ---------------------------------------------------------

    def epoch(self) -> Hashable:
        """The current ``ttl``-long period of the mount's clock. What is read from
        storage is served for one period, unless storage shows it unchanged
        when the next begins (``data_epoch``), so a change shows within ``ttl``
        seconds (docs/CONTRACT.md, "Consistency"); with ``ttl`` 0 every call is
        a period of its own. ``refresh`` starts a new period at once."""
        now = time.monotonic()
        return self._refreshes, int(now // self.ttl) if self.ttl > 0 else now

    def refresh(self) -> None:
        """Start a new period now (SIGHUP), as when ``metadata_ttl`` runs out: the
        reference indexes (``refs``) of the old one are no longer used, and the
        cached chunks and kept page caches only where storage shows their
        dataset unchanged."""
        self._refreshes += 1

    def keep_pages(self, key: Hashable, data_epoch: Hashable | None = None) -> bool:
        """Whether the kernel may keep the page cache of file ``key`` at this
        open: only if its last open was in the same data epoch (a file made of
        one dataset's chunks: ``data_epoch``), else in this same period, so the
        pages it holds came from bytes still served now. Otherwise the open
        drops them."""
        now = self.epoch() if data_epoch is None else data_epoch
        last = self.memo.get(("opened", key))
        self.memo.put(("opened", key), now, 16)
        if last == now:
            self.pages_kept += 1
            return True
        self.pages_dropped += 1
        return False

    async def data_epoch(self, op: ObjPath, ds: Dataset) -> Hashable:
        """The data epoch of ``ds`` now (``mountd.cache.dataepochs``): the period,
        or the first of the periods its stored chunks and description have
        stayed the same through. With ``ttl`` 0 nothing outlives its call; a
        dataset of less than ``VERSIONED_BYTES`` is read again rather than
        checked (a walk or a ``D.h5`` build reads thousands of small ones once)."""
        if self._unversioned(ds):
            return self.epoch()
        return await self.data_epochs.data_epoch((op.domain.path, ds.id), self.epoch(),
                                                 lambda: _version(ds))

    async def data_version(self, op: ObjPath, ds: Dataset) -> bytes | None:
        """The digest of what ``ds``'s bytes derive from (``_version``), learnt in
        this period; None when it has none (see ``data_epoch``). Unlike a data
        epoch it means the same in every mount."""
        if self._unversioned(ds):
            return None
        # The period the version is learnt in, taken once: learning it may outlast
        # the period, and the next one has learnt none yet.
        key, period = (op.domain.path, ds.id), self.epoch()
        await self.data_epochs.data_epoch(key, period, lambda: _version(ds))
        version = self.data_epochs.version(key, period)
        return version if isinstance(version, bytes) else None

    def known_data_epoch(self, op: ObjPath, ds: Dataset) -> Hashable | None:
        """``data_epoch`` with no I/O and no wait: None until this period's
        version of ``ds`` is learnt (by a read)."""
        if self._unversioned(ds):
            return self.epoch()
        return self.data_epochs.known((op.domain.path, ds.id), self.epoch())

    def _unversioned(self, ds: Dataset) -> bool:
        """True if ``ds``'s data epoch is simply the period (see ``data_epoch``)."""
        return self.ttl <= 0 or chunkbatch.chunk_bytes(ds) * math.prod(ds.grid) < VERSIONED_BYTES

    async def chunk(self, op: ObjPath, ds: Dataset, index: ChunkIndex) -> bytes | None:
        """A decoded chunk through the shared cache; None if it is not stored."""
        epoch = await self.data_epoch(op, ds)
        return await self.chunk_cache.get((op.domain.path, ds.id, epoch, index),
                                          lambda: ds.read_chunk(index), chunk_unit(ds))

    @staticmethod
    def _chunk_keys(op: ObjPath, ds: Dataset, epoch: Hashable,
                    indices: Sequence[ChunkIndex]) -> list[Hashable]:
        return [(op.domain.path, ds.id, epoch, index) for index in indices]

    async def chunks(self, op: ObjPath, ds: Dataset,
                     indices: Sequence[ChunkIndex]) -> list[bytes | MountError | None]:
        """Decoded chunks through the shared cache, the missing ones read in
        batches: for each index the chunk, None (not stored) or its error."""
        epoch = await self.data_epoch(op, ds)
        return await self.chunk_cache.get_many(
            self._chunk_keys(op, ds, epoch, indices), chunkbatch.fetcher(ds),
            chunkbatch.batch_size(ds), chunk_unit(ds))

    def prefetch_chunks(self, op: ObjPath, ds: Dataset, indices: Sequence[ChunkIndex]) -> int:
        """Start decoding chunks in the background, in batches; how many of
        ``indices`` (from the first) the cache accepted for now."""
        epoch = self.known_data_epoch(op, ds)
        if epoch is None:  # not before this period's version is learnt (by a read)
            return 0
        return self.chunk_cache.prefetch_many(
            self._chunk_keys(op, ds, epoch, indices), chunkbatch.fetcher(ds),
            chunkbatch.batch_size(ds), chunk_unit(ds))

    def chunk_file_read(self, op: ObjPath, ds: Dataset, index: ChunkIndex) -> None:
        """A chunk file is being read: prefetch the next chunks in grid order if
        this dataset's chunk files are being read in that order."""
        self.grid_readahead.on_read((op.domain.path, ds.id), ds, index,
                                    lambda ahead: self.prefetch_chunks(op, ds, ahead))

    def cache_holds(self, op: ObjPath, ds: Dataset, count: int) -> bool:
        """Whether the chunk cache holds ``count`` chunks of ``ds`` beside its
        readahead; if not, the mount says so in its log, once per dataset."""
        budget, need = self.chunk_cache.budget, count * chunk_unit(ds)
        if cachefit.holds(budget, need):
            return True
        where = f"{op.h5path} in {op.domain.path}" if op.domain.path else op.h5path
        cachefit.warn_small(where, self.chunk_cache.configured, budget, count, need,
                            band=count * chunkbatch.chunk_bytes(ds), held_budget=self.held.budget)
        return False

    def readahead(self) -> readahead.ReadaheadWindow:
        """A new readahead window for one reader of decoded chunks, up to
        ``readahead_cap`` (none when the chunk cache has no room for it)."""
        cap = self.readahead_cap
        return readahead.ReadaheadWindow(readahead.START if cap >= readahead.START else 0, cap)

    @property
    def nursery(self) -> trio.Nursery | None:
        """Where background work runs: the nursery the daemon gives the chunk cache."""
        return self.chunk_cache.nursery


async def _version(ds: Dataset) -> Hashable | None:
    """``version_digest`` of ``ds`` now; None when its store cannot tell."""
    stored = await ds.store.version()
    return None if stored is None else version_digest(ds, stored)
