"""The block cache for remote reads (``-o cache_size=SIZE``), shared by every cached store.

Owns the bytes of remote objects cut into blocks of ``block_size`` bytes,
keyed by (store URL, object key, block index), in a memory LRU under a byte
budget, with an optional ``DiskCache`` below it; one ``BlockCache`` serves
any number of stores, as the store URL is part of every key. This module
owns etag validation, claims and single flight, whole-object reads and the
running of readahead; three parts are modules of their own:

- ``mountd.io.blocktable``: the LRU of blocks under the budget and the
  object table (``BlockTable``), pure and synchronous;
- ``mountd.io.readahead``: the per-object readahead windows (``Windows``)
  and which blocks a readahead fetches (``prefetch_plan``);
- ``mountd.io.writebehind``: the queue of blocks written behind to the disk
  cache (``WriteBehind``), at most ``WRITE_BEHIND`` bytes.

Design, mountpoint-s3 style:

- Per object the cache remembers its ``ObjectInfo`` (size, etag) and when
  that was last validated. Within ``validate_ttl`` seconds cached blocks are
  served without asking storage. Missing blocks are fetched with
  ``if_match=etag``; a ``Changed`` answer drops every block of the object and
  the read starts once more from scratch. After the TTL, a read that would
  use cached blocks (memory or disk) first sends one ``head``; a different
  etag drops the object's blocks. A first read of an unknown object sends no
  ``head``: ``fetch`` returns the info along with the bytes.
- Every block in memory belongs to the object's current etag. A read checks
  that all the blocks it joins carry one etag, so it never mixes versions.
- A whole read of an unknown object (``get(key)``: metadata JSON, HSDS
  chunks) is one request for the whole object, cut into blocks from that one
  response. Other reads ask for block-aligned spans, and adjacent missing
  blocks go in one request.
- Blocks are 1 MiB. The kernel sends reads of at most 1 MiB, HDF5 metadata
  and chunk reads through a reference file are scattered and often small, and
  a miss costs at most one block more than asked, while sequential throughput
  comes from merging blocks into one request and from readahead, not from
  big blocks. 1 MiB is also the first readahead window and keeps a disk
  cache to one file per MiB.
- A response is cut into copies, not memoryview slices: each block is
  copied into a pooled buffer (below), or into ``bytes`` of its own when
  small. Measured on the 2-core test VM: cutting 64 MiB into 1 MiB copies
  takes 30 ms (about 2 GB/s, a few percent of the time the bytes took to
  arrive), slices take no time. But a slice pins the whole response for as
  long as any one block of it is cached, so the budget would no longer count
  the memory held. A read returns a copy of the blocks it wants (a small
  ``bytes`` block as is, when the read wants all of it).
- Readahead: each object has a ``ReadaheadWindow`` (the shared sequential-read
  rule, kept in ``readahead.Windows`` for the ``WINDOWS`` objects read last;
  one per object because the ``Store`` protocol carries no reader identity,
  so interleaved readers of one object reset each other's window). A
  sequential ranged read claims the missing blocks after it
  (``readahead.prefetch_plan``) and fetches them in the ``nursery`` set by
  the owner of background work, in requests of at most ``prefetch_request``
  bytes, with at most ``prefetch_limit`` under way; no nursery means no
  readahead. Prefetches never raise: a failed one lets go of its blocks, and
  a reader waiting on them fetches them itself.
- Memory: blocks of ``POOLED_BLOCK`` bytes or more live in the cache's
  ``BufferPool`` (recycled ``mmap`` slots of ``block_size``, not the C heap),
  each charged a whole slot; a read gets a copy of its own, never a view
  of a slot. A ranged fetch under way reserves its bytes in the budget
  (``BlockTable.reserved``) until its blocks are put, and putting evicts
  until the blocks and the reservations fit. A readahead that would take
  reservations past half the budget (``PREFETCH_SHARE``) is dropped (the
  reader's next read plans it again); a reader's own fetch is never refused,
  and may overdraw until its blocks are put.
- Fetched blocks are written behind to the disk cache in the same nursery
  (inline without one), at most ``WRITE_BEHIND`` bytes queued
  (``writebehind.WriteBehind``).
- A listing proves the etags it shows: ``vouch`` takes them as validations
  of the objects whose blocks are cached, so a walk that lists a domain (and
  a remount's first walk, whose blocks are on disk) sends no ``head`` for
  them.
- At most ``IDLE_OBJECTS`` objects without blocks in memory are remembered
  (``blocktable``); pending fetches, heads and whole reads are only those
  under way.

Counters are in ``stats`` (``CacheStats``): ``hits`` and ``misses`` count the
blocks reads wanted (a block already on its way is a hit); ``disk_hits`` the
misses the disk served; ``requests`` every fetch sent to storage, of which
``prefetches`` were readahead, and ``prefetches_dropped`` readahead
requests not sent for want of room in the budget; ``bytes_fetched``; ``heads``;
``invalidations``, objects dropped because their etag changed;
``evictions``, blocks dropped from memory for room; and, counted by
``mountd.io.decodedcache`` (``-o cache_decoded``) for the stores of this
cache, ``decoded_hits`` and ``decoded_misses``: chunk reads that found their
decoded bytes on disk, and those that did not.

Concurrency: one fetch per block. All state (the block table, pending
fetches, windows, the write-behind queue, counters) lives in the trio thread
and changes only in sections with no ``await``, which is what makes them
atomic; adding an ``await`` to one of them breaks this. These sections are:
the claim loop in ``_gather`` (look in memory, then among pending fetches,
else insert a ``_Pending``), the whole of ``_prefetch`` (plan and claim the
blocks, start the tasks), everything after a fetch returns up to the
settling of its pending blocks (``_accept``, ``_put``, ``_settle``), applying
a ``head`` (``_validate``) or a listing (``vouch``), and
``_forget``/``_invalidate``. The
``BlockTable`` and ``Windows`` calls these sections make (eviction included)
are synchronous, atomic by construction; ``WriteBehind.spill`` keeps its own
no-await section (see ``mountd.io.writebehind``). Whoever claims a block
must settle it, with data, an error, or neither (given up, when cancelled or
when a prefetch fails): ``_load`` settles every claim in a ``finally``.
Waiters never fetch a claimed block; they see its data or error, and claim
it again if it was given up. Heads and whole reads of unknown objects are
single-flight the same way, keyed by object. The disk cache does its I/O in
its own worker threads.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio

from layouts.storage import ByteRange, Fetched, ObjectInfo, Store
from mountd.cache.bufpool import BufferPool
from mountd.errors import Changed, NotFound, StorageError
from mountd.io.blocktable import Block, BlockKey, BlockTable, ObjectEntry, ObjKey, runs
from mountd.io.diskcache import DiskCache
from mountd.io.readahead import CAP, START, Windows, prefetch_plan
from mountd.io.writebehind import WriteBehind

log = logging.getLogger(__name__)

#: Bytes per block; see the module docstring for why.
BLOCK_SIZE = 1 << 20
#: Largest prefetch request, so a large window is fetched by several requests at once.
PREFETCH_REQUEST = 8 << 20
#: Prefetch requests under way at most (8 x 8 MiB covers the largest window).
PREFETCH_LIMIT = 8
#: Blocks of at least this many bytes live in the pool, each in a slot of ``block_size``
#: (an object's last block too: one slot size is what makes every slot reusable).
POOLED_BLOCK = 64 << 10
#: The part of the budget that fetches under way may reserve before readahead is dropped.
PREFETCH_SHARE = 0.5


@dataclass(slots=True)
class CacheStats:
    """What the cache did; see the module docstring."""

    hits: int = 0
    misses: int = 0
    disk_hits: int = 0
    requests: int = 0
    prefetches: int = 0
    bytes_fetched: int = 0
    heads: int = 0
    invalidations: int = 0
    evictions: int = 0
    decoded_hits: int = 0
    decoded_misses: int = 0
    prefetches_dropped: int = 0


@dataclass(slots=True)
class _Pending:
    """A fetch under way. Settled with ``info`` (and data) or ``error``, or neither if given up."""

    done: trio.Event = field(default_factory=trio.Event)
    data: Block = b""
    info: ObjectInfo | None = None
    error: BaseException | None = None


class BlockCache:
    """Blocks of remote objects in memory, at most ``budget`` bytes, over an optional disk cache."""

    def __init__(self, budget: int, *, disk: DiskCache | None = None,
                 validate_ttl: float = 60.0, block_size: int = BLOCK_SIZE,
                 prefetch_request: int = PREFETCH_REQUEST, prefetch_limit: int = PREFETCH_LIMIT,
                 readahead_start: int = START, readahead_cap: int = CAP,
                 clock: Callable[[], float] = time.monotonic,
                 nursery: trio.Nursery | None = None) -> None:
        self.disk = disk
        self.validate_ttl = validate_ttl
        self.block_size = block_size
        self.prefetch_request = max(prefetch_request, block_size)
        self.prefetch_limit = prefetch_limit
        self.nursery = nursery
        self.stats = CacheStats()
        self._clock = clock
        #: Validations made at or before this time are out of date (``expire``).
        self._expired = -math.inf
        self._pool = BufferPool(budget, smallest=POOLED_BLOCK, slot=block_size)
        self._table = BlockTable(budget, charge=self._pool.charge)
        self._windows = Windows(readahead_start, readahead_cap)
        self._writer = None if disk is None else WriteBehind(disk)
        self._pending: dict[BlockKey, _Pending] = {}
        self._heads: dict[ObjKey, _Pending] = {}
        self._whole: dict[BlockKey, _Pending] = {}
        self._prefetching = 0

    @property
    def budget(self) -> int:
        """Bytes of blocks kept in memory at most."""
        return self._table.budget

    @budget.setter
    def budget(self, budget: int) -> None:
        """A new budget: past it, the least recently used blocks go at once, and the
        pool unmaps the slots that wait beyond it."""
        self._table.budget = self._pool.limit = budget
        self.stats.evictions += self._table.fit()
        self._pool.trim()

    @property
    def used(self) -> int:
        """Bytes charged for the blocks in memory (``mountd.cache.bufpool.BufferPool.charge``)."""
        return self._table.used

    @property
    def pool(self) -> BufferPool:
        """Where blocks of ``POOLED_BLOCK`` bytes or more live."""
        return self._pool

    @property
    def readahead_start(self) -> int:
        """The first readahead window of an object, in bytes."""
        return self._windows.start

    @readahead_start.setter
    def readahead_start(self, start: int) -> None:
        self._windows.start = start

    @property
    def readahead_cap(self) -> int:
        """The largest readahead window of an object, in bytes."""
        return self._windows.cap

    @readahead_cap.setter
    def readahead_cap(self, cap: int) -> None:
        self._windows.cap = cap

    # -- reading -----------------------------------------------------------------------

    async def read(self, store: Store, key: str, byte_range: ByteRange | None = None) -> Fetched:
        """``byte_range`` of the object (all of it for None) and its info, through the cache."""
        ahead = self._observe((store.url, key), byte_range)
        try:
            return await self._read_once(store, key, byte_range, ahead)
        except Changed:
            log.debug("%s%s changed while being read; reading it again", store.url, key)
            return await self._read_once(store, key, byte_range, ahead)

    async def info(self, store: Store, key: str) -> ObjectInfo:
        """The object's info: as remembered if validated within the TTL, else from a ``head``."""
        obj = self._table.object((store.url, key))
        if obj is not None and self._is_fresh(obj):
            return obj.info
        return await self._validate(store, key)

    async def _read_once(self, store: Store, key: str, byte_range: ByteRange | None,
                         ahead: int) -> Fetched:
        start = 0 if byte_range is None else byte_range.start
        length = None if byte_range is None else byte_range.length
        obj = await self._fresh(store, key, start, length)
        bs = self.block_size
        if obj is None:
            if length is None:
                return await self._read_whole(store, key, start)
            end = start + length
            first, last = start // bs, max(end - 1, start) // bs
            snapshot = None
        else:
            snapshot = obj.info
            end = snapshot.size if length is None else min(start + length, snapshot.size)
            if end <= start:
                return Fetched(b"", snapshot)
            if ahead:
                self._prefetch(store, key, snapshot, end, ahead)
            first, last = start // bs, (end - 1) // bs
        try:
            parts, info = await self._gather(store, key, snapshot, first, last)
        except Changed:
            if snapshot is not None:
                self._invalidate((store.url, key), snapshot.etag)
            raise
        return Fetched(self._join(parts, start - first * bs, min(end, info.size) - first * bs),
                       info)

    def _join(self, parts: list[Block], lo: int, hi: int) -> bytes:
        """Bytes ``lo:hi`` of the blocks ``parts`` laid end to end, copying as little as we
        can: always a copy of a pooled block, whose buffer the pool hands out again."""
        pieces: list[tuple[Block, int, int]] = []
        for j, part in enumerate(parts):
            base = j * self.block_size
            a, b = max(lo - base, 0), min(hi - base, len(part))
            if b > a:
                pieces.append((part, a, b))
        if len(pieces) == 1:
            part, a, b = pieces[0]
            # the block itself when all of a ``bytes`` block is wanted
            return part[a:b] if isinstance(part, bytes) else bytes(part[a:b])
        return b"".join(memoryview(part)[a:b] for part, a, b in pieces)

    async def _gather(self, store: Store, key: str, snapshot: ObjectInfo | None, first: int,
                      last: int) -> tuple[list[Block], ObjectInfo]:
        """Blocks ``first..last`` from memory, fetches under way, disk or storage, of one etag."""
        url = store.url
        want = range(first, last + 1)
        parts: dict[int, Block] = {}
        seen = snapshot
        while len(parts) < len(want):
            # No await from here ...
            obj = self._table.object((url, key))
            if obj is not None and seen is not None and obj.info.etag != seen.etag:
                raise Changed(key, "changed while being read")
            claimed: dict[int, _Pending] = {}
            waits: dict[int, _Pending] = {}
            for i in want:
                if i in parts:
                    continue
                bk = (url, key, i)
                data = self._table.hit(bk)
                if data is not None and obj is not None:
                    parts[i] = data
                    seen = obj.info
                    self.stats.hits += 1
                elif bk in self._pending:
                    waits[i] = self._pending[bk]
                    self.stats.hits += 1
                else:
                    claimed[i] = self._pending[bk] = _Pending()
                    self.stats.misses += 1
            # ... to here.
            if claimed:
                await self._load(store, key, seen, claimed, prefetch=False)
            for i, pending in (*claimed.items(), *waits.items()):
                await pending.done.wait()
                if pending.error is not None:
                    raise pending.error
                if pending.info is None:
                    continue  # given up by its claimer: claim it on the next pass
                if seen is not None and pending.info.etag != seen.etag:
                    raise Changed(key, "changed while being read")
                seen = pending.info
                parts[i] = pending.data
        assert seen is not None
        return [parts[i] for i in want], seen

    async def _read_whole(self, store: Store, key: str, start: int) -> Fetched:
        """An unknown object from the block holding ``start`` to its end, in one request."""
        url, bs = store.url, self.block_size
        first = start // bs
        wk = (url, key, first)
        while (flight := self._whole.get(wk)) is not None:
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            if flight.info is not None:
                self.stats.hits += -(-len(flight.data) // bs)
                return Fetched(flight.data[start - first * bs:], flight.info)
        flight = self._whole[wk] = _Pending()
        self.stats.requests += 1
        try:
            fetched = await store.fetch(key, ByteRange(first * bs) if first else None)
            flight.data, flight.info = fetched.data, fetched.info
        except Exception as exc:
            flight.error = exc
            raise
        finally:  # cancelled: neither data nor error, so a waiter fetches it itself
            del self._whole[wk]
            flight.done.set()
        # No await from here to the spill.
        data, info = fetched.data, fetched.info
        nblocks = -(-len(data) // bs)
        self.stats.bytes_fetched += len(data)
        self.stats.misses += nblocks
        if self._accept((url, key), None, info):
            view = memoryview(data)
            blocks = [(first + j, view[j * bs:(j + 1) * bs]) for j in range(nblocks)]
            for i, block in blocks:
                self._put((url, key), i, block)
            await self._spill(url, key, info.etag, blocks)
        return Fetched(data[start - first * bs:], info)

    # -- loading claimed blocks ----------------------------------------------------------

    async def _load(self, store: Store, key: str, info: ObjectInfo | None,
                    claimed: dict[int, _Pending], prefetch: bool) -> None:
        """Settle every block in ``claimed``: from disk, else fetched. Raises only Cancelled."""
        ok = (store.url, key)
        try:
            remaining = dict(claimed)
            obj = self._table.object(ok)
            # ``info`` was validated by ``_fresh`` for this read (or the one that prefetches).
            if (self.disk is not None and info is not None and obj is not None
                    and obj.info.etag == info.etag):
                for i, pending in claimed.items():
                    data = await self.disk.get(store.url, key, info.etag, i, self._pool.buffer)
                    if data is None:
                        continue
                    if not prefetch:
                        self.stats.disk_hits += 1
                    obj = self._table.object(ok)
                    if obj is not None and obj.info.etag == info.etag:
                        self._put(ok, i, data)
                    self._settle((*ok, i), pending, data, info)
                    del remaining[i]
            groups = [{i: claimed[i] for i in run}
                      for run in runs(remaining, len(remaining) or 1)]
            if len(groups) == 1:
                await self._fetch_run(store, key, info, groups[0], prefetch)
            elif groups:
                async with trio.open_nursery() as nursery:
                    for run in groups:
                        nursery.start_soon(self._fetch_run, store, key, info, run, prefetch)
        finally:
            for i, pending in claimed.items():
                if not pending.done.is_set():
                    self._settle((*ok, i), pending)

    async def _fetch_run(self, store: Store, key: str, info: ObjectInfo | None,
                         run: dict[int, _Pending], prefetch: bool) -> None:
        """Fetch the consecutive claimed blocks ``run`` in one request and settle them. Never
        raises but Cancelled: a failure settles them with the error (a prefetch gives them up)."""
        url, bs = store.url, self.block_size
        ok = (url, key)
        start = min(run) * bs
        etag = None if info is None else info.etag
        self.stats.requests += 1
        if prefetch:
            self.stats.prefetches += 1
        held = len(run) * bs
        self._table.reserved += held
        try:
            try:
                fetched = await store.fetch(key, ByteRange(start, held), if_match=etag)
            finally:
                self._table.reserved -= held
            expected = min(len(run) * bs, max(fetched.info.size - start, 0))
            if len(fetched.data) != expected:
                raise StorageError(key, f"short read: {len(fetched.data)} of {expected} bytes "
                                        f"at {start}")
        except Exception as exc:
            if isinstance(exc, Changed) and etag is not None:
                self._invalidate(ok, etag)
            elif isinstance(exc, NotFound):
                self._forget(ok)
            if prefetch:
                log.debug("prefetch of %s%s at %d failed: %s", url, key, start, exc)
            for i, pending in run.items():
                self._settle((url, key, i), pending, error=None if prefetch else exc)
            return
        data, got = fetched.data, fetched.info
        self.stats.bytes_fetched += len(data)
        keep = self._accept(ok, etag, got)
        view = memoryview(data)
        blocks = [(i, view[j * bs:(j + 1) * bs]) for j, i in enumerate(sorted(run))]
        for i, block in blocks:
            if keep and block:
                self._put(ok, i, block)
            # Waiters get the response's bytes, not the pooled copy: a slot evicted
            # while a waiter still held it would stay mapped past the budget.
            self._settle((url, key, i), run[i], block, got)
        if keep:
            await self._spill(url, key, got.etag, [(i, b) for i, b in blocks if b])

    def _settle(self, bk: BlockKey, pending: _Pending, data: Block = b"",
                info: ObjectInfo | None = None, error: BaseException | None = None) -> None:
        pending.data, pending.info, pending.error = data, info, error
        if self._pending.get(bk) is pending:
            del self._pending[bk]
        pending.done.set()

    # -- validation ----------------------------------------------------------------------

    async def vouch(self, store: Store, listed: Iterable[tuple[str, ObjectInfo | None]],
                    age: float = 0.0) -> None:
        """Take the infos a listing of ``store`` gave ``age`` seconds ago as its
        objects' state then, for those whose blocks this cache holds (in memory
        or on disk): they are served without a ``head`` until ``validate_ttl``
        after the listing, and blocks of another etag are dropped. Objects with
        nothing cached are left alone (a first read learns its info with its
        bytes), so a listing of a million keys adds no entries of its own to
        the object table."""
        if self.disk is not None:
            await self.disk.load()
        # No await from here on.
        url, bs = store.url, self.block_size
        for key, info in listed:
            if info is None:
                continue
            ok = (url, key)
            if self._table.object(ok) is not None or (
                    self.disk is not None
                    and self.disk.has_any(url, key, range(max(1, -(-info.size // bs))))):
                self._record(ok, info, age)

    def expire(self) -> None:
        """Treat every validation made so far as out of date (SIGHUP): the next read
        that would serve an object's cached blocks validates it first. A ``head``
        under way now counts as made after this call."""
        self._expired = self._clock()

    def _is_fresh(self, obj: ObjectEntry) -> bool:
        return obj.validated > self._expired and self._clock() - obj.validated < self.validate_ttl

    async def _fresh(self, store: Store, key: str, start: int,
                     length: int | None) -> ObjectEntry | None:
        """The object as known; first a ``head`` if it is stale and the read would use cached
        blocks."""
        ok = (store.url, key)
        obj = self._table.object(ok)
        if obj is not None and self._is_fresh(obj):
            return obj
        bs = self.block_size
        first = start // bs
        if obj is not None:
            end = obj.info.size if length is None else min(start + length, obj.info.size)
            blocks = range(first, (end - 1) // bs + 1) if end > start else range(0)
        elif length is None:
            blocks = range(first, first + 1)
        else:
            blocks = range(first, (start + max(length, 1) - 1) // bs + 1)
        if obj is not None and (not blocks or any(i in blocks for i in obj.blocks)):
            # cached blocks would be served, or nothing read at all (by the old size)
            await self._validate(store, key)
        elif self.disk is not None:
            await self.disk.load()
            if self.disk.has_any(store.url, key, blocks):
                await self._validate(store, key)
        return self._table.object(ok)

    async def _validate(self, store: Store, key: str) -> ObjectInfo:
        """One ``head`` for the object, shared by everyone asking meanwhile; drops it if changed."""
        ok = (store.url, key)
        while (flight := self._heads.get(ok)) is not None:
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            if flight.info is not None:
                return flight.info
        flight = self._heads[ok] = _Pending()
        self.stats.heads += 1
        try:
            info = flight.info = await store.head(key)
        except Exception as exc:
            flight.error = exc
            if isinstance(exc, NotFound):
                self._forget(ok)
            raise
        finally:  # cancelled: neither info nor error, so a waiter asks itself
            del self._heads[ok]
            flight.done.set()
        # No await from here on; waiters run only after this returns.
        self._record(ok, info)
        return info

    def _accept(self, ok: ObjKey, etag: str | None, info: ObjectInfo) -> bool:
        """Record what a fetch made with ``if_match=etag`` said; whether to keep its blocks."""
        obj = self._table.object(ok)
        if etag is not None:
            if obj is None or obj.info.etag != etag:
                return False  # the object moved on while this was fetched
            obj.validated = self._clock()
            return True
        self._record(ok, info)
        return True

    def _record(self, ok: ObjKey, info: ObjectInfo, age: float = 0.0) -> None:
        """Take ``info`` as the object's state ``age`` seconds ago (0: now): blocks of
        another etag are dropped."""
        obj = self._table.object(ok)
        if obj is not None and obj.info.etag != info.etag:
            self._invalidate(ok, obj.info.etag)
            obj = None
        validated = self._clock() - age
        if obj is None:
            self._table.remember(ok, info, validated)
        elif validated >= obj.validated:
            obj.info, obj.validated = info, validated

    def _invalidate(self, ok: ObjKey, etag: str) -> None:
        """Drop the object if it is still known with ``etag``."""
        if self._table.invalidate(ok, etag):
            log.debug("%s%s changed (was etag %s); dropping its blocks", *ok, etag)
            self.stats.invalidations += 1

    # -- memory --------------------------------------------------------------------------

    def _forget(self, ok: ObjKey) -> None:
        """Drop the object and its blocks."""
        self._table.forget(ok)

    def _put(self, ok: ObjKey, index: int, data: Block) -> None:
        """Keep one block of a known object, evicting the least recently used ones: a
        pooled copy of a large one, ``bytes`` of a small one (neither holds the
        response it was cut from)."""
        if self._table.fits(len(data)):
            self.stats.evictions += self._table.put(ok, index, self._pool.keep(data))

    # -- readahead -----------------------------------------------------------------------

    def _observe(self, ok: ObjKey, byte_range: ByteRange | None) -> int:
        """Bytes to read ahead of this read (0 for whole reads and for a first or jumping read)."""
        if byte_range is None or byte_range.length is None:
            return 0
        return self._windows.observe(ok, byte_range.start, byte_range.length)

    def _prefetch(self, store: Store, key: str, info: ObjectInfo, start: int, ahead: int) -> None:
        """Claim the missing blocks of ``start .. start+ahead`` and fetch them in the nursery."""
        if self.nursery is None:
            return
        end = min(start + ahead, info.size)
        if end <= start:
            return
        url = store.url
        plan = prefetch_plan(start, end, self.block_size, self.prefetch_request,
                             lambda i: (url, key, i) in self._table
                             or (url, key, i) in self._pending)
        room = self.budget * PREFETCH_SHARE
        for run in plan:
            if self._prefetching >= self.prefetch_limit:
                return
            if self._table.reserved + len(run) * self.block_size > room:
                self.stats.prefetches_dropped += 1
                return
            claimed = {i: _Pending() for i in run}
            for i, pending in claimed.items():
                self._pending[url, key, i] = pending
            self._prefetching += 1
            try:
                self.nursery.start_soon(self._prefetch_run, store, key, info, claimed)
            except RuntimeError:  # the nursery is closing: the daemon is stopping
                self._prefetching -= 1
                for i, pending in claimed.items():
                    self._settle((url, key, i), pending)
                return

    async def _prefetch_run(self, store: Store, key: str, info: ObjectInfo,
                            claimed: dict[int, _Pending]) -> None:
        try:
            await self._load(store, key, info, claimed, prefetch=True)
        finally:
            self._prefetching -= 1

    # -- disk ----------------------------------------------------------------------------

    async def _spill(self, url: str, key: str, etag: str, blocks: list[tuple[int, Block]]) -> None:
        """Write fetched blocks to the disk cache, if there is one (``WriteBehind.spill``)."""
        if self._writer is not None:
            await self._writer.spill(self.nursery, url, key, etag, blocks)
