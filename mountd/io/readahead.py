"""The sequential-read detector and its growing readahead window.

Owns one rule, shared by the block cache (bytes of one object) and the tree
(chunks of one dataset in grid order): the window starts at ``start`` bytes,
doubles on every read that begins where the previous one ended, up to
``cap``, and falls back to ``start`` after a jump. The kernel serves one
reader with several requests at once, which may arrive out of order, so a
read that begins within one window (or one read) of the expected offset
still counts as sequential. ``observe`` returns how
many bytes after the read to fetch ahead (0 while the reader is not
sequential).

Concurrency: pure state changed only inside ``observe`` with no ``await``,
so one window may be shared by the tasks serving one open file. It is not
thread-safe.
"""

from __future__ import annotations

#: Default first window: about what the kernel asks for at once.
START = 1 << 20
#: Default largest window.
CAP = 64 << 20


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
