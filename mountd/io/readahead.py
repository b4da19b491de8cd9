"""The sequential-read detector, its growing readahead window, and the block cache's plan.

Owns one rule, shared by the block cache (bytes of one object) and the tree
(chunks of one dataset in grid order, directories of a group): the window
starts at ``start`` bytes, doubles on every read that begins where the
previous one ended, up to ``cap``, and falls back to ``start`` after a jump.
The kernel serves one reader with several requests at once, which may arrive
out of order, so a read that begins within one window (or one read) of the
expected offset still counts as sequential. ``observe`` returns how many
bytes after the read to fetch ahead (0 while the reader is not sequential).

For the block cache (``mountd.io.blockcache``) it also owns:

- ``Windows``: one ``ReadaheadWindow`` per object, for the ``most`` objects
  read last (one per object, not per reader, because the ``Store`` protocol
  carries no reader identity: interleaved readers of one object reset each
  other's window);
- ``prefetch_plan``: which blocks a readahead of some bytes fetches, and in
  which requests. Claiming them and fetching them is the cache's business.

Concurrency: pure state changed only inside synchronous methods with no
``await``, so one window may be shared by the tasks serving one open file,
and ``Windows`` by every task of the cache. Not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from mountd.io.blocktable import runs

#: Default first window: about what the kernel asks for at once.
START = 1 << 20
#: Default largest window.
CAP = 64 << 20
#: Objects whose readahead window ``Windows`` remembers, by default.
WINDOWS = 1024


class ReadaheadWindow:
    """Sequential-read state of one reader of one object."""

    def __init__(self, start: int = START, cap: int = CAP) -> None:
        self.start = start
        self.cap = max(cap, start)
        self.window = 0
        self._next: int | None = None

    def observe(self, offset: int, size: int) -> int:
        """Record a read of ``size`` bytes at ``offset``; bytes to read ahead of it."""
        expected = self._next
        slack = max(self.window, self.start, size)
        sequential = expected is not None and abs(offset - expected) <= slack
        self._next = offset + size if expected is None or not sequential \
            else max(expected, offset + size)
        if self.start <= 0:
            return 0
        if not sequential:
            # A first read or a jump: the next read decides whether this is a stream.
            self.window = 0
            return 0
        self.window = self.start if self.window == 0 else min(self.window * 2, self.cap)
        return self.window


class Windows:
    """The readahead windows of the ``most`` keys observed last, each made with ``start``
    and ``cap`` when its key is first (or again, once forgotten) observed."""

    def __init__(self, start: int = START, cap: int = CAP, most: int = WINDOWS) -> None:
        self.start = start
        self.cap = cap
        self.most = most
        self._windows: OrderedDict[Hashable, ReadaheadWindow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def observe(self, key: Hashable, offset: int, size: int) -> int:
        """Record a read of ``size`` bytes at ``offset`` of ``key``; bytes to read ahead of it."""
        window = self._windows.pop(key, None) or ReadaheadWindow(self.start, self.cap)
        self._windows[key] = window
        if len(self._windows) > self.most:
            self._windows.popitem(last=False)
        return window.observe(offset, size)


def prefetch_plan(start: int, end: int, block_size: int, request: int,
                  present: Callable[[int], bool]) -> list[list[int]]:
    """The blocks to fetch ahead for bytes ``start .. end`` of an object, as runs of
    consecutive block indices of at most ``request`` bytes each (one request per run).

    ``start`` is where the read that asks ends: the plan begins at the first block
    wholly after it, as the block holding ``start`` is the read's own. Blocks for
    which ``present`` is true (in memory, or on their way) are left out."""
    if end <= start:
        return []
    first, last = -(-start // block_size), (end - 1) // block_size
    missing = [i for i in range(first, last + 1) if not present(i)]
    return list(runs(missing, max(request // block_size, 1)))
