"""Decoded chunks in the disk cache (``-o cache_decoded``): ``DecodedDiskCache``.

Owns the ``layouts.decoding.DecodedCache`` port over the mount's
``BlockCache`` and its ``DiskCache``. A chunk decoded from an object of a
store of that block cache (a ``CachedStore``: S3, HTTP) is kept as one
disk-cache entry, block 0 of the name ``KEY + SEPARATOR + TOKEN``, at the
etag of the bytes it was decoded from; ``SEPARATOR`` holds NUL, which no S3
key or URL path holds, so the name is never a real object's. Local stores
take no part: their files are on disk already, and the page cache serves
them.

- Validation is the block cache's own. ``get`` looks in the disk cache's
  index first (no I/O): a chunk never kept costs nothing more. A kept one is
  served only at the etag the block cache holds for its object, which is at
  most ``validate_ttl`` seconds old (``BlockCache.info``: from memory, else
  one ``head``). An entry of another etag is stale: a miss, and removed by
  the disk cache, as is a broken one (CRC).
- ``put`` writes behind, through a ``WriteBehind`` queue of its own (so
  decoded chunks do not crowd out the blocks the block cache spills) in the
  block cache's nursery; the disk cache's size and free-space rules apply.
- A kept chunk is read from disk straight into a buffer from
  ``layouts.decoding.OUTPUT`` (the chunk cache's pool, in the daemon), which
  the chunk cache keeps without a copy.
- A known cost: the block cache still spills the encoded blocks of an
  object whose chunk is kept decoded, so both take room in ``cache_dir``.
- Counters: ``decoded_hits`` and ``decoded_misses`` of the block cache's
  ``stats`` (reads of kept stores only).

Concurrency: no state of its own but the write-behind queue (see
``mountd.io.writebehind``); counters change in sections with no ``await``.
Any number of trio tasks may call it.
"""

from __future__ import annotations

import logging

from layouts.decoding import OUTPUT
from layouts.storage import Store
from mountd.errors import NotFound
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.diskcache import DiskCache
from mountd.io.writebehind import WriteBehind

log = logging.getLogger(__name__)

#: Between an object's key and a token in the name of a decoded chunk.
SEPARATOR = "\0decoded\0"


class DecodedDiskCache:
    """Decoded chunks of the objects of ``blocks``' stores, in ``blocks``' disk cache."""

    def __init__(self, blocks: BlockCache) -> None:
        if blocks.disk is None:
            raise ValueError("decoded chunks are kept in a disk cache, and this block "
                             "cache has none")
        self._blocks = blocks
        self._disk: DiskCache = blocks.disk
        self._writer = WriteBehind(blocks.disk)

    def keeps(self, store: Store) -> bool:
        return isinstance(store, CachedStore) and store.cache is self._blocks

    async def get(self, store: Store, key: str, token: str
                  ) -> bytes | bytearray | memoryview | None:
        if not self.keeps(store):
            return None
        name = key + SEPARATOR + token
        stats = self._blocks.stats
        await self._disk.load()
        data = None
        if self._disk.has_any(store.url, name, (0,)):
            try:
                info = await store.head(key)
            except NotFound:
                log.debug("%s%s is gone; not serving its decoded chunk", store.url, key)
                info = None
            if info is not None:
                data = await self._disk.get(store.url, name, info.etag, 0, OUTPUT.take)
        if data is None:
            stats.decoded_misses += 1
        else:
            stats.decoded_hits += 1
        return data

    async def put(self, store: Store, key: str, token: str, etag: str, data: bytes) -> None:
        if not self.keeps(store):
            return
        await self._writer.spill(self._blocks.nursery, store.url, key + SEPARATOR + token,
                                 etag, [(0, data)])
