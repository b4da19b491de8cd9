"""Records a format keeps about a remote store across mounts, in the disk cache.

Owns ``DiskRecords``, the ``layouts.places.Records`` port over the mount's
``BlockCache`` and its ``DiskCache`` (``-o cache_dir``). A record is one
disk-cache entry: block 0 of the name ``NAME + SEPARATOR``, at the fixed
etag ``FORMAT``, so it is found by name alone and a record of another
format is a miss (removed by the disk cache, as is a broken one); ``NAME``
is the format's own. ``SEPARATOR`` holds NUL, which no S3 key or URL path
holds, so a record's name is never a real object's. What a record says, and
whether it is current, is the format's business; the disk cache's size and
free-space rules apply to it as to blocks. Local stores take no part: their
files are on disk already.

``vouch`` passes what a listing showed to the block cache
(``BlockCache.vouch``), dated by its age, so the blocks of those objects on
disk are served without a ``head`` until ``validate_ttl`` after the listing.

``save`` writes behind, through a ``WriteBehind`` queue of its own, in the
block cache's nursery (inline without one).

Concurrency: no state of its own but the write-behind queue (see
``mountd.io.writebehind``); any number of trio tasks may call it.
"""

from __future__ import annotations

from collections.abc import Sequence

from layouts.storage import ObjectInfo, Store
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.diskcache import DiskCache
from mountd.io.writebehind import WriteBehind

#: After a record's name.
SEPARATOR = "\0record\0"
#: The etag every record is kept at: the version of the records' layout.
FORMAT = "h5mount-record-1"


class DiskRecords:
    """Records about the stores of ``blocks``, in ``blocks``' disk cache."""

    def __init__(self, blocks: BlockCache) -> None:
        if blocks.disk is None:
            raise ValueError("records are kept in a disk cache, and this block cache has none")
        self._blocks = blocks
        self._disk: DiskCache = blocks.disk
        self._writer = WriteBehind(blocks.disk)

    def keeps(self, store: Store) -> bool:
        return isinstance(store, CachedStore) and store.cache is self._blocks

    async def load(self, store: Store, name: str) -> bytes | None:
        if not self.keeps(store):
            return None
        await self._disk.load()
        return await self._disk.get(store.url, name + SEPARATOR, FORMAT, 0)

    async def save(self, store: Store, name: str, data: bytes) -> None:
        if self.keeps(store):
            await self._writer.spill(self._blocks.nursery, store.url, name + SEPARATOR, FORMAT,
                                     [(0, data)])

    async def vouch(self, store: Store, listed: Sequence[tuple[str, ObjectInfo | None]],
                    age: float) -> None:
        if self.keeps(store):
            await self._blocks.vouch(store, listed, age)
