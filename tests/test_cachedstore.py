"""``CachedStore`` over real files (``LocalStore``): reads through the cache, listings
passed through, changes seen, one cache shared by two stores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from layouts.storage import ByteRange, Store
from mountd.errors import Changed, NotFound
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.diskcache import DiskCache
from mountd.io.local import LocalStore
from tests.test_blockcache import MemoryStore, payload

BS = 1024


def write_tree(root: Path) -> bytes:
    big = payload(3 * BS + 500)
    (root / "db" / "g").mkdir(parents=True)
    (root / "db" / "g" / ".group.json").write_text('{"id": "g-1"}')
    (root / "big.bin").write_bytes(big)
    return big


def test_cached_local_store_reads_real_files(tmp_path: Path) -> None:
    async def main() -> None:
        big = write_tree(tmp_path)
        cache = BlockCache(1 << 20, block_size=BS, validate_ttl=60)
        store: Store = CachedStore(LocalStore(tmp_path), cache)
        assert store.url == LocalStore(tmp_path).url
        assert await store.get("db/g/.group.json") == b'{"id": "g-1"}'
        assert await store.get("big.bin") == big
        assert await store.get("big.bin", ByteRange(BS - 3, 10)) == big[BS - 3:BS + 7]
        assert await store.get("big.bin", ByteRange(3 * BS)) == big[3 * BS:]
        assert (cache.stats.requests, cache.stats.hits) == (2, 2 + 1)
        fetched = await store.fetch("big.bin", ByteRange(0, 4))
        info = await store.head("big.bin")
        assert fetched.data == big[:4] and fetched.info == info and info.size == len(big)
        with pytest.raises(Changed):
            await store.fetch("big.bin", if_match="not-the-etag")
        assert await store.exists("big.bin") and not await store.exists("nothing")
        assert (await store.list_dir("")).keys == ["big.bin"]
        assert [k async for k in store.iter_dir("db/")] == ["db/g/"]
        listed = await store.list_tree("", lambda key: key.endswith(".json"), 10)
        assert listed is not None
        infos = dict(listed)
        assert sorted(infos) == ["big.bin", "db/g/.group.json"] and infos["big.bin"] is None
        assert infos["db/g/.group.json"] == await store.inner.head("db/g/.group.json")
        with pytest.raises(NotFound):
            await store.get("nothing")
        assert cache.stats.requests == 3 and cache.stats.heads == 0  # the failed one counts
    trio.run(main)


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    async def main() -> None:
        big = write_tree(tmp_path)
        cache = BlockCache(1 << 20, block_size=BS, validate_ttl=0,
                           disk=DiskCache(tmp_path / "cache", 1 << 20,
                                          free_space=lambda path: (1 << 40, 1 << 41)))
        store = CachedStore(LocalStore(tmp_path), cache)
        assert await store.get("big.bin") == big
        assert await store.get("big.bin") == big
        assert (cache.stats.heads, cache.stats.requests) == (1, 1)
        changed = payload(2 * BS, seed=3)
        (tmp_path / "big.bin").write_bytes(changed)
        os.utime(tmp_path / "big.bin", ns=(1, 1))  # a new mtime whatever the clock's grain
        assert await store.get("big.bin", ByteRange(10, 20)) == changed[10:30]
        assert await store.get("big.bin") == changed
        assert cache.stats.invalidations == 1
        again = CachedStore(LocalStore(tmp_path), BlockCache(0, block_size=BS, disk=cache.disk))
        assert await again.get("big.bin") == changed
        assert again.cache.stats.requests == 0 and again.cache.stats.disk_hits == 2
    trio.run(main)


def test_one_cache_shared_by_two_stores(tmp_path: Path) -> None:
    async def main() -> None:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        (tmp_path / "a" / "x").write_bytes(b"from a")
        (tmp_path / "b" / "x").write_bytes(b"from b")
        cache = BlockCache(1 << 20)
        one = CachedStore(LocalStore(tmp_path / "a"), cache)
        two = CachedStore(LocalStore(tmp_path / "b"), cache)
        memory = CachedStore(MemoryStore(), cache)
        assert isinstance(memory.inner, MemoryStore)
        memory.inner.put("x", b"from memory")
        for _ in range(2):
            assert await one.get("x") == b"from a"
            assert await two.get("x") == b"from b"
            assert await memory.get("x") == b"from memory"
        assert (cache.stats.requests, cache.stats.hits) == (3, 3)
    trio.run(main)
