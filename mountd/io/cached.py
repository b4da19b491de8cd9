"""``CachedStore``: a ``Store`` whose reads go through a shared ``BlockCache``.

Owns nothing but the pairing of one inner store with a cache: ``get``,
``fetch``, ``fetch_many`` and ``head`` are answered by the cache (keyed by the
inner store's URL, so one cache serves many stores), while ``exists`` and the
listings pass straight through; what ``list_tree`` shows of each object
validates the blocks the cache holds of it (``BlockCache.vouch``). The
daemon wraps each remote store with it::

    cache = BlockCache(budget, disk=DiskCache(...) or None, validate_ttl=ttl)
    store = CachedStore(S3Store(...), cache)
    cache.nursery = background_nursery

``fetch(if_match=...)`` is checked against the etag the cache holds, which
may be up to ``validate_ttl`` seconds old, like every other cached read.

Concurrency: no state of its own; the cache's rules apply.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence

from layouts.errors import LayoutError
from layouts.storage import ByteRange, Fetched, Listing, ObjectInfo, Store, fetch_each
from mountd.errors import Changed
from mountd.io.blockcache import BlockCache

log = logging.getLogger(__name__)


class CachedStore:
    """``inner`` with its object reads cached in ``cache``."""

    def __init__(self, inner: Store, cache: BlockCache) -> None:
        self.inner = inner
        self.cache = cache

    @property
    def url(self) -> str:
        return self.inner.url

    async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        return (await self.cache.read(self.inner, key, byte_range)).data

    async def fetch(self, key: str, byte_range: ByteRange | None = None,
                    if_match: str | None = None) -> Fetched:
        fetched = await self.cache.read(self.inner, key, byte_range)
        if if_match is not None and fetched.info.etag != if_match:
            raise Changed(key, f"changed (etag {fetched.info.etag}, expected {if_match})")
        return fetched

    async def head(self, key: str) -> ObjectInfo:
        return await self.cache.info(self.inner, key)

    async def exists(self, key: str) -> bool:
        return await self.inner.exists(key)

    async def list_dir(self, prefix: str) -> Listing:
        return await self.inner.list_dir(prefix)

    def iter_dir(self, prefix: str) -> AsyncIterator[str]:
        return self.inner.iter_dir(prefix)

    async def list_tree(self, prefix: str, info_for: Callable[[str], bool],
                        limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
        """The inner store's listing, whose infos the cache takes as validations of
        the objects it holds (``BlockCache.vouch``)."""
        found = await self.inner.list_tree(prefix, info_for, limit)
        if found is not None:
            await self.cache.vouch(self.inner, found)
        return found

    async def fetch_many(self, keys: Sequence[str],
                         limit: int | None = None) -> list[Fetched | LayoutError]:
        return await fetch_each(self, keys, limit)
