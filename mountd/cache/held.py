"""Memory that open files hold outside the caches, under one mount-wide budget.

Owns ``HeldMemory``: the bytes readers keep for themselves beyond the chunk
cache, leased from a byte budget (``ROW_BANDS_BYTES``). Today its only
tenant is the ``.npy`` reader's chunk-row bands (``layouts.views._rowbands``):
when the chunk cache cannot hold the chunk row a sequential reader is in,
the reader decodes the row once into a band of its own, leased here.

A lease is given whole or not at all. Its memory (``Lease.buffer``) comes
from the budget's own ``BufferPool`` (``mountd.cache.bufpool``): a band
left by one reader is reused by the next without fresh pages, and a buffer
still referenced after its lease ends (an array a read is copying from)
goes back to the pool only once that reference is gone. When the budget is short, leases
idle for ``IDLE`` seconds or more (an open file nobody reads, an ``mmap``
left open) are taken back, least recently used first: their holder's
``reclaim`` callback drops what it held, and its next read works as if it
never had it. A lease also goes stale with the period of the mount's
clock that made it (``metadata_ttl``, SIGHUP): what it holds was decoded
then, and may not be served in a later period. With a budget of 0 (a mount
with ``metadata_ttl=0``, which keeps nothing decoded) no lease is given.

Concurrency: trio tasks of one thread; every method is synchronous with
no ``await``, so each is atomic. ``reclaim`` callbacks run inside
``lease`` and must not block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import trio

from mountd.cache.bufpool import BufferPool

#: The budget of a mount: bytes all its open files may hold at once.
ROW_BANDS_BYTES = 256 << 20
#: A lease unused for this long may be taken back for another reader.
IDLE = 5.0


class Lease:
    """``nbytes`` of the budget, held until ``release`` (or taken back)."""

    __slots__ = ("_buffer", "_owner", "_reclaim", "epoch", "nbytes", "used_at")

    def __init__(self, owner: HeldMemory, nbytes: int, epoch: Hashable,
                 reclaim: Callable[[], None]) -> None:
        self._owner: HeldMemory | None = owner
        self._reclaim = reclaim
        self._buffer: bytearray | memoryview | None = None
        self.nbytes = nbytes
        self.epoch = epoch
        self.used_at = trio.current_time()

    @property
    def held(self) -> bool:
        """True until released or taken back."""
        return self._owner is not None

    def fresh(self) -> bool:
        """Held, and made in the mount's current period: what it holds may be served."""
        return self._owner is not None and self._owner.epoch() == self.epoch

    def touch(self) -> None:
        """Count one use (a read served): the lease is not idle."""
        if self._owner is not None:
            self.used_at = trio.current_time()
            self._owner.hits += 1
            self._owner.touched(self)

    def buffer(self) -> bytearray | memoryview:
        """The leased memory, ``nbytes`` of it, writable; the same buffer on every call."""
        if self._buffer is None:
            pool = None if self._owner is None else self._owner.pool
            self._buffer = bytearray(self.nbytes) if pool is None else pool.buffer(self.nbytes)
        return self._buffer

    def release(self) -> None:
        """Give the bytes back (again: nothing)."""
        self._buffer = None
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.returned(self)

    def take_back(self) -> None:
        """Release, and tell the holder to drop what it held."""
        if self._owner is not None:
            self.release()
            self._reclaim()


class HeldMemory:
    """Leases of at most ``budget`` bytes in all; ``epoch`` names the current period."""

    def __init__(self, budget: int, epoch: Callable[[], Hashable], idle: float = IDLE) -> None:
        self.budget = budget
        self.epoch = epoch
        self.idle = idle
        self.pool = BufferPool(budget)
        self.used = 0
        #: Reads served from leased memory, leases refused, leases taken back.
        self.hits = 0
        self.refused = 0
        self.reclaimed = 0
        #: Leases held, least recently used first.
        self._leases: OrderedDict[Lease, None] = OrderedDict()

    def lease(self, nbytes: int, reclaim: Callable[[], None]) -> Lease | None:
        """``nbytes`` of the budget, or None when even taking back the idle and
        stale leases leaves no room. ``reclaim`` is called if the lease is
        taken back later."""
        if self.used + nbytes > self.budget >= nbytes:
            self._take_back(nbytes)
        if self.used + nbytes > self.budget:
            self.refused += 1
            return None
        lease = Lease(self, nbytes, self.epoch(), reclaim)
        self._leases[lease] = None
        self.used += nbytes
        return lease

    def _take_back(self, nbytes: int) -> None:
        """Take back idle or stale leases, oldest use first, until ``nbytes`` fit."""
        now, epoch = trio.current_time(), self.epoch()
        for lease in list(self._leases):
            if nbytes <= self.budget - self.used:
                return
            if now - lease.used_at >= self.idle or lease.epoch != epoch:
                self.reclaimed += 1
                lease.take_back()

    def touched(self, lease: Lease) -> None:
        self._leases.move_to_end(lease)

    def returned(self, lease: Lease) -> None:
        del self._leases[lease]
        self.used -= lease.nbytes

    def __len__(self) -> int:
        return len(self._leases)
