"""The decoded-chunk cache (``-o chunk_cache=SIZE``).

Owns decoded chunk bytes, keyed by (domain, dataset id, chunk index), in an
LRU under a byte budget. A sequential read of a ``.npy`` arrives as many
small kernel requests that touch the same chunks; with this cache each chunk
is fetched and decoded once. Every entry costs its bytes plus
``ENTRY_OVERHEAD`` (its key, the LRU's bookkeeping, the bytes object's
header) against the budget, so a dataset of millions of tiny chunks cannot
hold more memory than the budget says.

Chunks of ``mountd.cache.bufpool.POOLED_MIN`` bytes or more are kept in the
cache's ``BufferPool`` (recycled ``mmap`` slots, not the C heap; their cost
is their slot's size) and handed to readers as read-only ``memoryview``s of
it. Evicting one only drops the cache's reference: a reader still holding
the view keeps the slot until it lets go (the pool counts it as in use),
and no slot is written while a view of it lives.

Chunks are fetched one at a time (``get``) or in batches (``get_many``,
``prefetch_many``): a batch fetch reads many chunks with one call (one
worker-thread hop for a local bucket), which is what makes datasets of tiny
chunks affordable. A batch fetch answers one outcome per key, a chunk, None
(not stored) or the ``MountError`` reading it raised, so one bad chunk fails
only the reads that need it.

Concurrency: one fetch per key. The first task to miss inserts a pending
``trio.Event`` with no ``await`` between the check and the insert, then
fetches; tasks that want the same key meanwhile wait on the event and read
the outcome. A failed fetch is not cached for long: its waiters, and readers
within ``error_ttl`` seconds after it, see the same error, and the next reader
after that tries again; at most ``MAX_FAILED`` failures are remembered, the
oldest forgotten first. (The kernel retries a failed readahead at once with
a single-page read; without this, a stalled store would hold that reader for
the whole timeout twice.) A fetch that ends without an outcome (cancelled)
leaves its waiters a ``StorageError``. ``prefetch_many`` starts batch fetches
in the cache's ``nursery`` (set by whoever owns the background work, None
until then: no prefetching), so background work always has an owner; it never
raises. At most ``prefetch_limit`` prefetch batches and ``prefetch_chunks``
prefetched chunks are under way at once; what is refused is left for the
reader's readahead to ask again on its next read.

Fetches under way are charged to the budget too: each reserves ``unit``
bytes per chunk (what the caller says one entry will cost) until its
outcome is stored, and storing evicts until the entries and the
reservations together fit (``reserved``). A prefetch is refused, so it
waits for the reader's next read, while reservations would pass half the
budget (``PREFETCH_SHARE``); a reader's own fetch is never refused: it
may overdraw the budget until it is stored.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass

import trio

from mountd.cache import bufpool
from mountd.errors import MountError, StorageError

log = logging.getLogger(__name__)

#: A decoded chunk: ``bytes``, or a read-only view of a pooled buffer.
Chunk = bytes | memoryview
#: One chunk, or None when it is not stored.
Fetch = Callable[[], Awaitable[bytes | None]]
#: What fetching one key of a batch gave: the chunk, None (not stored) or the error.
Outcome = Chunk | MountError | None
#: Fetches a batch of keys: one outcome per key, in order.
FetchMany = Callable[[list[Hashable]], Awaitable[Sequence[Outcome]]]

#: Prefetch batches running at once, by default: enough to keep a remote store busy.
PREFETCH_LIMIT = 64
#: Chunks being prefetched at once, by default (all batches together).
PREFETCH_CHUNKS = 16384
#: Batches of one ``get_many`` fetched at once.
FETCH_CONCURRENCY = 4
#: How long a failed fetch's error is given to new readers before a retry.
ERROR_TTL = 2.0
#: The part of the budget that fetches under way may reserve before prefetches wait.
PREFETCH_SHARE = 0.5
#: Failures remembered at most: past it the oldest goes, expired or not (its
#: next reader fetches again sooner, which is all a forgotten failure costs).
MAX_FAILED = 1024
#: What an entry costs besides its bytes: the key tuples, the LRU's node and
#: the bytes object's header (about 250 bytes on CPython 3.11, measured in
#: tests/test_chunkcache.py).
ENTRY_OVERHEAD = 256


def entry_cost(value: Chunk | None) -> int:
    """What keeping ``value`` counts against the budget."""
    return ENTRY_OVERHEAD if value is None else ENTRY_OVERHEAD + bufpool.charge(len(value))


@dataclass(slots=True)
class _Pending:
    done: trio.Event
    value: Chunk | None = None
    error: BaseException | None = None


#: Keys of one batch fetch with their pending entries (and where each goes in
#: the caller's result list, -1 for a prefetch).
_Group = list[tuple[int, Hashable, _Pending]]


class ChunkCache:
    """An LRU of decoded chunks, at most ``budget`` bytes (0 disables keeping them)."""

    def __init__(self, budget: int, nursery: trio.Nursery | None = None,
                 prefetch_limit: int = PREFETCH_LIMIT, error_ttl: float = ERROR_TTL,
                 prefetch_chunks: int = PREFETCH_CHUNKS) -> None:
        self._budget = budget
        #: The budget the mount gave, which ``-o memory_limit`` may lower ``budget`` from.
        self.configured = budget
        self.pool = bufpool.BufferPool(budget)
        self.error_ttl = error_ttl
        #: Recent failures, oldest first: (when, error) by key.
        self._failed: OrderedDict[Hashable, tuple[float, MountError]] = OrderedDict()
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._items: OrderedDict[Hashable, Chunk | None] = OrderedDict()
        self._pending: dict[Hashable, _Pending] = {}
        self.nursery = nursery
        self._prefetch_limit = prefetch_limit
        self._prefetch_chunks = prefetch_chunks
        #: Prefetch batches and chunks under way.
        self.prefetch_tasks = 0
        self.prefetching = 0
        #: Bytes reserved by fetches under way; prefetches refused for want of room.
        self.reserved = 0
        self.refused = 0

    @property
    def budget(self) -> int:
        """Bytes the entries may cost at most."""
        return self._budget

    @budget.setter
    def budget(self, budget: int) -> None:
        """A new budget: past it, the least recently used entries go at once, and the
        pool unmaps the slots that wait beyond it."""
        self._budget = self.pool.limit = budget
        self._fit(keep=0)
        self.pool.trim()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items or key in self._pending

    def peek(self, key: Hashable) -> tuple[bool, Chunk | None]:
        """``(True, chunk)`` if ``key`` is cached now (counted as a hit), else ``(False, None)``."""
        if key not in self._items:
            return False, None
        self._items.move_to_end(key)
        self.hits += 1
        return True, self._items[key]

    def _recent_failure(self, key: Hashable) -> MountError | None:
        failed = self._failed.get(key)
        if failed is None:
            return None
        if trio.current_time() - failed[0] < self.error_ttl:
            return failed[1]
        del self._failed[key]
        return None

    async def get(self, key: Hashable, fetch: Fetch, unit: int = 0) -> Chunk | None:
        """The chunk for ``key``: from the cache, from a fetch under way, or fetched now
        (reserving ``unit`` bytes meanwhile)."""
        if key in self._items:
            self._items.move_to_end(key)
            self.hits += 1
            return self._items[key]
        failed = self._recent_failure(key)
        if failed is not None:
            raise failed
        pending = self._pending.get(key)
        if pending is not None:
            self.hits += 1
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            return pending.value
        self.misses += 1
        pending = _Pending(trio.Event())
        self._pending[key] = pending
        self.reserved += unit
        try:
            try:
                value = await fetch()
            finally:
                self.reserved -= unit
        except BaseException as exc:
            pending.error = exc
            if isinstance(exc, MountError):
                self._remember_failure(key, exc)
            raise
        else:
            pending.value = self._store(key, value)
        finally:
            del self._pending[key]
            pending.done.set()
        return pending.value

    async def get_many(self, keys: Sequence[Hashable], fetch: FetchMany,
                       batch: int = 1, unit: int = 0) -> list[Outcome]:
        """The outcome for every key, in order: cached ones at once, ones under way
        when their fetch ends, the rest fetched ``batch`` keys per ``fetch`` call,
        ``FETCH_CONCURRENCY`` calls at once, each reserving ``unit`` bytes a key."""
        out: list[Outcome] = [None] * len(keys)
        waits: list[tuple[int, _Pending]] = []
        mine: _Group = []
        items = self._items
        for pos, key in enumerate(keys):
            if key in items:
                items.move_to_end(key)
                out[pos] = items[key]
                continue
            pending = self._pending.get(key)
            if pending is not None:
                waits.append((pos, pending))
                continue
            failed = self._recent_failure(key) if self._failed else None
            if failed is not None:
                out[pos] = failed
                continue
            pending = _Pending(trio.Event())
            self._pending[key] = pending
            mine.append((pos, key, pending))
        self.hits += len(keys) - len(mine)
        self.misses += len(mine)
        groups = [mine[i:i + batch] for i in range(0, len(mine), max(1, batch))]
        try:
            if len(groups) == 1:
                await self._reserve_and_fetch(groups[0], fetch, out, unit)
            elif groups:
                todo = iter(groups)

                async def worker() -> None:
                    for group in todo:
                        await self._reserve_and_fetch(group, fetch, out, unit)

                async with trio.open_nursery() as nursery:
                    for _ in range(min(FETCH_CONCURRENCY, len(groups))):
                        nursery.start_soon(worker)
        finally:
            self._abandon(mine)
        for pos, pending in waits:
            await pending.done.wait()
            error = pending.error
            if error is None:
                out[pos] = pending.value
            elif isinstance(error, MountError):
                out[pos] = error
            else:
                out[pos] = StorageError(str(keys[pos]), "fetch did not finish")
        return out

    async def _reserve_and_fetch(self, group: _Group, fetch: FetchMany,
                                 out: list[Outcome], unit: int) -> None:
        self.reserved += unit * len(group)
        await self._fetch_group(group, fetch, out, unit * len(group))

    async def _fetch_group(self, group: _Group, fetch: FetchMany,
                           out: list[Outcome] | None, held: int) -> None:
        """Fetch one batch and settle its pending entries (and ``out``, if given);
        the ``held`` bytes its caller reserved are given back once the fetch ends,
        before its outcomes are stored."""
        try:
            values: Sequence[Outcome] = await fetch([key for _, key, _ in group])
        except MountError as exc:
            values = [exc] * len(group)
        finally:
            self.reserved -= held
        if len(values) != len(group):
            raise RuntimeError(f"batch fetch gave {len(values)} outcomes for {len(group)} keys")
        for (pos, key, pending), value in zip(group, values, strict=True):
            outcome: Outcome = value
            if isinstance(value, MountError):
                pending.error = value
                self._remember_failure(key, value)
            else:
                outcome = pending.value = self._store(key, value)
            del self._pending[key]
            pending.done.set()
            if out is not None:
                out[pos] = outcome

    def _abandon(self, group: _Group) -> None:
        """Settle what a batch fetch left pending (it was cancelled or crashed)."""
        for _, key, pending in group:
            if not pending.done.is_set():
                pending.error = StorageError(str(key), "fetch did not finish")
                del self._pending[key]
                pending.done.set()

    def _remember_failure(self, key: Hashable, exc: MountError) -> None:
        now = trio.current_time()
        self._failed.pop(key, None)  # re-inserted below, newest
        while self._failed and (len(self._failed) >= MAX_FAILED
                                or now - next(iter(self._failed.values()))[0] >= self.error_ttl):
            self._failed.popitem(last=False)
        self._failed[key] = (now, exc)

    def _store(self, key: Hashable, value: Chunk | None) -> Chunk | None:
        """Keep ``value`` (in a pooled buffer if it is large enough), evicting the
        least recently used entries; the value to hand out (as kept, if kept)."""
        size = entry_cost(value)
        if size > self.budget:
            return value
        if value is not None and self.pool.pooled(len(value)):
            value = memoryview(self.pool.keep(value)).toreadonly()
        self._items[key] = value
        self.used += size
        # The entry just stored is newest: it stays even while reservations overdraw.
        self._fit(keep=1)
        return value

    def _fit(self, keep: int) -> None:
        """Evict the least recently used entries, all but the ``keep`` newest at most,
        until the entries and the reservations fit the budget."""
        while self.used + self.reserved > self.budget and len(self._items) > keep:
            _, evicted = self._items.popitem(last=False)
            self.used -= entry_cost(evicted)
            self.evictions += 1

    def prefetch_many(self, keys: Sequence[Hashable], fetch: FetchMany, batch: int = 1,
                      unit: int = 0) -> int:
        """Start fetching ``keys`` in the background, ``batch`` per ``fetch`` call,
        each reserving ``unit`` bytes of the budget until it is stored.

        Returns how many of ``keys``, from the first on, are now cached, under
        way or started; the first key past that was refused (no nursery, the
        prefetch limits reached, or no room in the budget) and should be asked
        for again later.
        """
        if self.nursery is None:
            return 0
        accepted = 0
        group: _Group = []
        room = self.budget * PREFETCH_SHARE
        for key in keys:
            if key in self._items or key in self._pending:
                accepted += 1
                continue
            if self.reserved + unit * (len(group) + 1) > room:
                self.refused += 1
                break
            if self.prefetching >= self._prefetch_chunks or \
                    (not group and self.prefetch_tasks >= self._prefetch_limit):
                break
            pending = _Pending(trio.Event())
            self._pending[key] = pending
            group.append((-1, key, pending))
            self.prefetching += 1
            accepted += 1
            if len(group) >= batch:
                self._start(group, fetch, unit)
                group = []
        if group:
            self._start(group, fetch, unit)
        return accepted

    def _start(self, group: _Group, fetch: FetchMany, unit: int) -> None:
        assert self.nursery is not None
        self.prefetch_tasks += 1
        self.misses += len(group)
        self.reserved += unit * len(group)
        self.nursery.start_soon(self._prefetch_group, group, fetch, unit * len(group))

    async def _prefetch_group(self, group: _Group, fetch: FetchMany, held: int) -> None:
        try:
            await self._fetch_group(group, fetch, None, held)
        except Exception:
            log.exception("prefetch of %d chunks from %s failed", len(group), group[0][1])
        finally:
            self._abandon(group)
            self.prefetch_tasks -= 1
            self.prefetching -= len(group)
