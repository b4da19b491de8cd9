"""Laziness and the metadata TTL cache, over a real HSDS bucket, without a mount.

A wrapper store counts the reads that reach the real local store, in the
manner of zarr's logging stores; nothing is faked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest
import trio

from layouts.errors import LayoutError
from layouts.formats.hsds._catalog import HsdsCatalog
from layouts.model import Group, LinkKind
from layouts.storage import ByteRange, Fetched, Listing, ObjectInfo
from mountd.cache.metacache import CachedCatalog
from mountd.errors import NotFound
from mountd.io.local import LocalStore
from mountd.tree import make_tree
from mountd.tree.nodes import DirNode


class CountingStore:
    """Passes every call to a real store and counts them by (method, key)."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner = inner
        self.calls: Counter[tuple[str, str]] = Counter()

    @property
    def url(self) -> str:
        return self.inner.url

    async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        self.calls["get", key] += 1
        return await self.inner.get(key, byte_range)

    async def fetch(self, key: str, byte_range: ByteRange | None = None) -> Fetched:
        self.calls["get", key] += 1
        return await self.inner.fetch(key, byte_range)

    async def fetch_many(self, keys: Sequence[str],
                         limit: int | None = None) -> list[Fetched | LayoutError]:
        for key in keys:
            self.calls["get", key] += 1
        return await self.inner.fetch_many(keys, limit)

    async def head(self, key: str) -> ObjectInfo:
        self.calls["head", key] += 1
        return await self.inner.head(key)

    async def exists(self, key: str) -> bool:
        self.calls["exists", key] += 1
        return await self.inner.exists(key)

    async def list_dir(self, prefix: str) -> Listing:
        self.calls["list", prefix] += 1
        return await self.inner.list_dir(prefix)

    async def list_tree(self, prefix: str, info_for: Callable[[str], bool],
                        limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
        self.calls["tree", prefix] += 1
        return await self.inner.list_tree(prefix, info_for, limit)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup(bucket_dir, ttl: float = 60.0):
    store = CountingStore(LocalStore(bucket_dir))
    clock = Clock()
    cached = CachedCatalog(HsdsCatalog(store), ttl=ttl, clock=clock)
    return store, clock, cached


@pytest.mark.hsds
def test_mount_root_reads_nothing(hsds_bucket) -> None:
    async def main() -> None:
        store, _, cached = setup(hsds_bucket.bucket_dir)
        await make_tree(cached).root()
        assert sum(store.calls.values()) == 0
    trio.run(main)


@pytest.mark.hsds
def test_looking_into_one_group_reads_only_its_objects(hsds_bucket) -> None:
    async def main() -> None:
        store, _, cached = setup(hsds_bucket.bucket_dir)
        node = await make_tree(cached).root()
        for part in ("home", "admin", "links.h5", "g1"):
            assert isinstance(node, DirNode)
            node = await node.lookup(part)
        assert isinstance(node, DirNode)
        gets = [key for (method, key) in store.calls if method == "get"]
        # the folders, the domain and its root group: nothing of other domains
        assert "home/admin/links.h5/.domain.json" in gets
        others = [k for k in gets if k.startswith("home/admin/")
                  and not k.startswith("home/admin/links.h5/") and k != "home/admin/.domain.json"]
        assert others == []
        assert sum(1 for k in gets if k.startswith("db/")) == 1  # the root group
        await node.stat()  # what a FUSE lookup also asks: g1's own JSON
        assert sum(1 for (m, k) in store.calls if m == "get" and k.startswith("db/")) == 2
        before = sum(store.calls.values())
        entries = [name async for _, name, _, _ in node.open_listing().entries(0)]
        assert "g2" in entries and "soft_abs" in entries
        assert sum(store.calls.values()) > before  # g1's children are read only now
    trio.run(main)


@pytest.mark.hsds
def test_ttl_single_flight_and_error_caching(hsds_bucket) -> None:
    async def main() -> None:
        store, clock, cached = setup(hsds_bucket.bucket_dir, ttl=60)
        domain = await cached.domain("home/admin/links.h5")
        assert domain is not None and domain.root_id is not None
        results: list[Group] = []

        async def fetch() -> None:
            obj = await cached.get_object(domain, domain.root_id)
            assert isinstance(obj, Group)
            results.append(obj)

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(fetch)
        key = next(k for (m, k) in store.calls if m == "get" and k.startswith("db/"))
        assert len(results) == 10 and store.calls["get", key] == 1
        clock.now += 59
        await fetch()
        assert store.calls["get", key] == 1
        clock.now += 2
        await fetch()
        assert store.calls["get", key] == 2

        with pytest.raises(NotFound):
            await cached.get_object(domain, "g-00000000-00000000-0000-000000-000000")
        calls = sum(store.calls.values())
        with pytest.raises(NotFound):
            await cached.get_object(domain, "g-00000000-00000000-0000-000000-000000")
        assert sum(store.calls.values()) == calls  # the failure is remembered too
    trio.run(main)


@pytest.mark.hsds
def test_get_objects_loads_a_batch_and_again_after_the_ttl(hsds_bucket) -> None:
    """One read per object for a batch, errors kept per object, nothing read
    while fresh, and every expired object read again in the next batch."""
    class BatchCounting(HsdsCatalog):
        batches = 0

        async def load_objects(self, domain, obj_ids):
            self.batches += 1
            return await super().load_objects(domain, obj_ids)

    async def main() -> None:
        store = CountingStore(LocalStore(hsds_bucket.bucket_dir))
        clock = Clock()
        inner = BatchCounting(store)
        cached = CachedCatalog(inner, ttl=60, clock=clock)
        domain = await cached.domain("home/admin/links.h5")
        assert domain is not None and domain.root_id is not None
        root = await cached.get_object(domain, domain.root_id)
        assert isinstance(root, Group)
        ids = [link.target for link in root.links.values() if link.kind is LinkKind.HARD]
        assert len(ids) >= 2
        missing = "g-00000000-00000000-0000-000000-000000"

        def gets() -> int:
            return sum(n for (method, _), n in store.calls.items() if method == "get")

        before, batches = gets(), inner.batches
        out = await cached.get_objects(domain, [*ids, missing, ids[0]])
        assert gets() - before == len(ids) + 1
        assert inner.batches == batches + 1
        assert [obj.id for obj in out[:len(ids)]] == ids
        assert isinstance(out[len(ids)], NotFound)
        assert out[-1] is out[0]
        assert all(cached.peek_object(domain, i) is obj for i, obj in zip(ids, out, strict=False))
        assert cached.peek_object(domain, missing) is None

        before = gets()
        again = await cached.get_objects(domain, ids)
        assert gets() == before
        assert all(a is b for a, b in zip(again, out, strict=False))

        clock.now += 61
        assert cached.peek_object(domain, ids[0]) is None
        before = gets()
        fresh = await cached.get_objects(domain, ids)
        assert gets() - before == len(ids)
        assert inner.batches == batches + 2  # the expired objects are read as one batch again
        assert [obj.id for obj in fresh] == ids and fresh[0] is not out[0]
    trio.run(main)
