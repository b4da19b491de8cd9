"""Write-behind of fetched blocks to the disk cache, at most ``limit`` bytes queued.

Owns the queue of blocks on their way from the block cache
(``mountd.io.blockcache``) to its ``DiskCache``: ``spill`` hands a
fetched response's blocks to a writer task in the nursery the caller gives
(the one of background work), so a read does not wait for the disk. The
queue holds at most ``limit`` bytes (``WRITE_BEHIND``); blocks that would
exceed it are not written at all (logged at debug): they stay in memory, and
a later miss fetches them again; so are blocks spilled once the nursery is
closing (the daemon is stopping). With no nursery the blocks are written
inline, and ``spill`` returns once they are on disk. Every queue registers
with its disk cache, which waits for them at unmount (``DiskCache.settle``).

Concurrency: ``queued`` lives in the trio thread. ``spill`` with a nursery
never awaits: it counts the blocks it takes and starts the writer in one
section, which is what lets ``BlockCache`` call it from its own no-await
sections. The writer task gives its bytes back in a ``finally``, so a
cancelled or failed write frees its room. The disk I/O itself runs in the
disk cache's worker threads.
"""

from __future__ import annotations

import logging

import trio

from mountd.io.diskcache import DiskCache

log = logging.getLogger(__name__)

#: Bytes queued for the disk cache at most, by default; more are not written.
WRITE_BEHIND = 64 << 20


class WriteBehind:
    """Blocks on their way to ``disk``, at most ``limit`` bytes at a time."""

    def __init__(self, disk: DiskCache, limit: int = WRITE_BEHIND) -> None:
        self.disk = disk
        self.limit = limit
        #: Bytes handed to writer tasks and not written yet.
        self.queued = 0
        #: Set while nothing is queued.
        self._idle = trio.Event()
        self._idle.set()
        disk.add_queue(self)

    async def drain(self) -> None:
        """Return once every block handed to a writer task is written (or given up)."""
        while self.queued:
            await self._idle.wait()

    async def spill(self, nursery: trio.Nursery | None, url: str, key: str, etag: str,
                    blocks: list[tuple[int, bytes | memoryview]]) -> None:
        """Write the blocks ``(index, data)`` of object ``key`` at ``etag``: behind, in
        ``nursery`` (as many, from the first, as the queue takes), or inline without one."""
        if not blocks:
            return
        if nursery is None:
            await self._write(url, key, etag, blocks, 0)
            return
        # No await from here on.
        size, taken = 0, 0
        while taken < len(blocks) and self.queued + size + len(blocks[taken][1]) <= self.limit:
            size += len(blocks[taken][1])
            taken += 1
        if taken < len(blocks):
            log.debug("disk cache busy: not keeping %d blocks of %s%s", len(blocks) - taken,
                      url, key)
        if taken:
            try:
                nursery.start_soon(self._write, url, key, etag, blocks[:taken], size)
            except RuntimeError:  # the nursery is closing: the daemon is stopping
                log.debug("stopping: not keeping %d blocks of %s%s", taken, url, key)
                return
            if not self.queued:
                self._idle = trio.Event()
            self.queued += size

    async def _write(self, url: str, key: str, etag: str,
                     blocks: list[tuple[int, bytes | memoryview]], queued: int) -> None:
        try:
            for i, block in blocks:
                await self.disk.put(url, key, etag, i, block)
        finally:
            self.queued -= queued
            if not self.queued:
                self._idle.set()
