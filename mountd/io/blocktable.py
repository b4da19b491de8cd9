"""The block cache's memory: blocks in an LRU under a byte budget, and their objects.

Owns two structures kept in step, and nothing else (no trio, no I/O, no
clock: the caller passes the time):

- the LRU of blocks, ``(store URL, object key, block index) -> bytes`` (or
  a ``memoryview`` of a pooled buffer, ``mountd.cache.bufpool``), whose
  charges (``charge`` of each block's length: what holding it costs) are at
  most ``budget`` bytes; putting a block evicts the least recently used ones
  until the rest fits, and a block costing more than the whole budget is not
  kept;
- the object table, ``(store URL, object key) -> ObjectEntry``: the object's
  ``ObjectInfo``, when the cache last validated it, and which of its blocks
  are in memory. Every block in memory has its object in the table. An
  object without blocks is *idle*; at most ``idle_objects`` idle objects are
  remembered, the one idle longest is forgotten first, so the table holds at
  most ``idle_objects`` plus the number of blocks in memory entries.

Forgetting an object (``forget``, ``invalidate``) drops its blocks with it.
The etag rules (when an entry is stale, when a different etag drops it) are
``mountd.io.blockcache``'s; this module only keeps what it is told.

Also here: ``runs``, the grouping of block indices into runs of consecutive
ones that both the cache's fetches and its readahead plan with.

Concurrency: plain synchronous code, with no ``await`` anywhere, so each
method is atomic with respect to other trio tasks; ``BlockCache`` relies on
that (its module docstring names the sections built from these calls). Not
thread-safe. ``ObjectEntry.blocks`` is the table's own: read it, never change
it; ``info`` and ``validated`` are the cache's to set.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from layouts.storage import ObjectInfo

#: Objects without blocks in memory whose info is still remembered, by default.
IDLE_OBJECTS = 10_000

ObjKey = tuple[str, str]
BlockKey = tuple[str, str, int]
#: A block's bytes: ``bytes``, or a view of a pooled buffer.
Block = bytes | memoryview


@dataclass(slots=True)
class ObjectEntry:
    """One object as the cache knows it: its info, when that was validated, its blocks in memory."""

    info: ObjectInfo
    validated: float
    blocks: set[int] = field(default_factory=set)


class BlockTable:
    """The LRU of blocks (charged at most ``budget`` bytes) and the table of their objects."""

    def __init__(self, budget: int, idle_objects: int = IDLE_OBJECTS,
                 charge: Callable[[int], int] = int) -> None:
        self.budget = budget
        self.charge = charge
        #: At least 1, so an object just remembered is still known when its blocks come.
        self.idle_objects = max(idle_objects, 1)
        #: Bytes charged for the blocks in memory, and reserved by fetches under way
        #: (set by the cache): putting a block evicts until both fit the budget.
        self.used = 0
        self.reserved = 0
        self._mem: OrderedDict[BlockKey, Block] = OrderedDict()
        self._objects: dict[ObjKey, ObjectEntry] = {}
        self._idle: OrderedDict[ObjKey, None] = OrderedDict()

    def __len__(self) -> int:
        """Objects known, idle or not."""
        return len(self._objects)

    def __contains__(self, bk: BlockKey) -> bool:
        """Whether the block is in memory (without making it recently used)."""
        return bk in self._mem

    @property
    def block_count(self) -> int:
        """Blocks in memory."""
        return len(self._mem)

    @property
    def idle_count(self) -> int:
        """Objects known that have no block in memory."""
        return len(self._idle)

    def object(self, ok: ObjKey) -> ObjectEntry | None:
        """The object's entry, or None if it is not known."""
        return self._objects.get(ok)

    def hit(self, bk: BlockKey) -> Block | None:
        """The block if it is in memory, now the most recently used one; else None."""
        data = self._mem.get(bk)
        if data is not None:
            self._mem.move_to_end(bk)
        return data

    def remember(self, ok: ObjKey, info: ObjectInfo, now: float) -> ObjectEntry:
        """Know the object afresh as ``info``, validated at ``now``, with no blocks (any
        blocks of an earlier entry are dropped)."""
        self.forget(ok)
        entry = self._objects[ok] = ObjectEntry(info, now)
        self._make_idle(ok)
        return entry

    def forget(self, ok: ObjKey) -> None:
        """Drop the object and its blocks, if it is known."""
        entry = self._objects.pop(ok, None)
        if entry is None:
            return
        self._idle.pop(ok, None)
        for i in entry.blocks:
            self.used -= self.charge(len(self._mem.pop((*ok, i))))

    def invalidate(self, ok: ObjKey, etag: str) -> bool:
        """Drop the object and its blocks if it is still known with ``etag``; whether it was."""
        entry = self._objects.get(ok)
        if entry is None or entry.info.etag != etag:
            return False
        self.forget(ok)
        return True

    def fits(self, nbytes: int) -> bool:
        """Whether a block of ``nbytes`` would be kept at all (costs at most the budget)."""
        return self.charge(nbytes) <= self.budget

    def put(self, ok: ObjKey, index: int, data: Block) -> int:
        """Keep block ``index`` of the known object ``ok`` as the most recently used one,
        evicting the least recently used blocks until the budget holds; how many went.
        A block costing more than the budget is not kept. KeyError if ``ok`` is not known."""
        if not self.fits(len(data)):
            return 0
        entry = self._objects[ok]
        bk = (*ok, index)
        old = self._mem.pop(bk, None)
        if old is not None:
            self.used -= self.charge(len(old))
        self._mem[bk] = data
        self.used += self.charge(len(data))
        if not entry.blocks:
            self._idle.pop(ok, None)
        entry.blocks.add(index)
        # The block just put is newest and fits the budget alone: it is never evicted
        # here, even while reservations overdraw the budget.
        return self.fit(keep=1)

    def fit(self, keep: int = 0) -> int:
        """Evict the least recently used blocks, all but the ``keep`` newest at most,
        until the blocks and the reservations fit the budget; how many went."""
        evicted = 0
        while self.used + self.reserved > self.budget and len(self._mem) > keep:
            (url, key, i), old = self._mem.popitem(last=False)
            self.used -= self.charge(len(old))
            evicted += 1
            owner = self._objects[url, key]
            owner.blocks.discard(i)
            if not owner.blocks:
                self._make_idle((url, key))
        return evicted

    def _make_idle(self, ok: ObjKey) -> None:
        self._idle[ok] = None
        while len(self._idle) > self.idle_objects:
            gone, _ = self._idle.popitem(last=False)
            del self._objects[gone]


def runs(indices: Iterable[int], most: int) -> Iterator[list[int]]:
    """Sorted ``indices`` as runs of consecutive numbers, each at most ``most`` long."""
    run: list[int] = []
    for i in sorted(indices):
        if run and (i != run[-1] + 1 or len(run) == most):
            yield run
            run = []
        run.append(i)
    if run:
        yield run
