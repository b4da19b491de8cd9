"""The disk cache: it survives a new cache over the same directory, drops stale and
broken blocks, keeps to its size and to the free space it must leave."""

from __future__ import annotations

from pathlib import Path

import trio

from layouts.storage import ByteRange
from mountd.io.blockcache import BlockCache
from mountd.io.direct import ALIGN
from mountd.io.diskcache import FORMAT, MIN_FREE_BYTES, DiskCache
from tests.test_blockcache import MemoryStore, payload

BS = 4096
PLENTY = (1 << 40, 1 << 41)


def plenty(path: str) -> tuple[int, int]:
    return PLENTY


def files(root: Path) -> list[Path]:
    return sorted(p for p in (root / FORMAT).glob("*/*") if p.is_file())


def block_file(root: Path, index: int) -> Path:
    return next(p for p in files(root) if p.name.split("-")[1] == str(index))


def cache_over(root: Path, ttl: float = 60.0) -> BlockCache:
    return BlockCache(1 << 20, block_size=BS, validate_ttl=ttl,
                      disk=DiskCache(root, 1 << 20, free_space=plenty))


def test_blocks_survive_a_new_cache_over_the_same_directory(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        data = payload(5 * BS + 7)
        store.put("a", data)
        first = cache_over(tmp_path)
        assert (await first.read(store, "a")).data == data
        assert first.disk is not None and first.disk.stats.writes == 6
        assert len(files(tmp_path)) == 6
        store.requests.clear()
        second = cache_over(tmp_path)
        assert (await second.read(store, "a")).data == data
        assert store.fetches() == [] and store.heads() == 1  # validated once, then from disk
        assert (second.stats.disk_hits, second.stats.misses) == (6, 6)
        assert (await second.read(store, "a", ByteRange(BS, 10))).data == data[BS:BS + 10]
        assert second.stats.hits == 1 and store.heads() == 1
        third = cache_over(tmp_path)
        assert (await third.read(store, "a", ByteRange(2 * BS + 5, BS))).data == \
            data[2 * BS + 5:3 * BS + 5]
        assert store.fetches() == [] and store.heads() == 2 and third.stats.disk_hits == 2
    trio.run(main)


def test_blocks_of_another_etag_are_dropped(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        old, new = payload(3 * BS), payload(3 * BS, seed=1)
        store.put("a", old)
        await cache_over(tmp_path).read(store, "a")
        before = files(tmp_path)
        etag = store.put("a", new)
        store.requests.clear()
        cache = cache_over(tmp_path)
        assert (await cache.read(store, "a")).data == new
        assert store.heads() == 1 and store.requests[-1] == ("fetch", "a", 0, 3 * BS, etag)
        assert cache.disk is not None and cache.disk.stats.stale == 3
        after = files(tmp_path)
        assert len(after) == 3 and not set(before) & set(after)
    trio.run(main)


def test_after_the_ttl_disk_blocks_are_validated_again(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        old, new = payload(2 * BS), payload(2 * BS, seed=1)
        store.put("a", old)
        cache = BlockCache(0, block_size=BS, validate_ttl=0,  # no memory: every hit is disk
                           disk=DiskCache(tmp_path, 1 << 20, free_space=plenty))
        assert (await cache.read(store, "a")).data == old
        assert (await cache.read(store, "a")).data == old
        assert store.heads() == 1 and len(store.fetches()) == 1
        store.put("a", new)
        assert (await cache.read(store, "a")).data == new
        assert store.heads() == 2 and len(store.fetches()) == 2
    trio.run(main)


def test_size_cap_evicts_the_least_recently_used(tmp_path: Path) -> None:
    async def main() -> None:
        each = ALIGN + BS  # a block's file: its header padded to ALIGN, then its data
        disk = DiskCache(tmp_path, 3 * each + 100, free_space=plenty)
        blocks = [payload(BS, seed=i) for i in range(5)]
        for i in range(3):
            await disk.put("mem://x/", "a", "e1", i, blocks[i])
        assert await disk.get("mem://x/", "a", "e1", 0) == blocks[0]  # 1 is now the oldest
        await disk.put("mem://x/", "a", "e1", 3, blocks[3])
        assert [disk.has_any("mem://x/", "a", [i]) for i in range(4)] == [True, False, True, True]
        assert await disk.get("mem://x/", "a", "e1", 1) is None
        assert disk.used <= disk.size and len(files(tmp_path)) == 3
        assert disk.stats.evictions == 1
        again = DiskCache(tmp_path, 3 * each + 100, free_space=plenty)
        assert await again.get("mem://x/", "a", "e1", 3) == blocks[3]
        assert again.used == disk.used
        smaller = DiskCache(tmp_path, each + 100, free_space=plenty)
        await smaller.load()  # a smaller size than before: evicted down at start-up
        assert len(files(tmp_path)) == 1 and smaller.used <= smaller.size
    trio.run(main)


def test_broken_files_are_misses_and_removed(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        data = payload(3 * BS)
        store.put("a", data)
        await cache_over(tmp_path).read(store, "a")
        flipped, short, whole = (block_file(tmp_path, i) for i in range(3))
        raw = bytearray(flipped.read_bytes())
        raw[-1] ^= 0xFF
        flipped.write_bytes(bytes(raw))  # CRC fails
        short.write_bytes(short.read_bytes()[:100])  # cut short by a crash
        (whole.parent / f"{whole.name}.1234abcd.tmp").write_bytes(b"half")
        store.requests.clear()
        cache = cache_over(tmp_path)
        assert (await cache.read(store, "a")).data == data
        assert cache.disk is not None
        assert (cache.disk.stats.corrupt, cache.stats.disk_hits) == (2, 1)
        assert store.fetches() == [("a", 0, 2 * BS)]  # the two broken blocks, fetched again
        assert len(files(tmp_path)) == 3  # rewritten; the temporary file is gone
        again = cache_over(tmp_path)
        assert (await again.read(store, "a")).data == data and again.stats.disk_hits == 3
    trio.run(main)


def test_free_space_is_left_on_the_file_system(tmp_path: Path) -> None:
    async def main() -> None:
        limit = {"free": 0}

        def free_space(path: str) -> tuple[int, int]:
            # what the file system would have free: a budget less what the cache holds
            held = sum(p.stat().st_size for p in files(tmp_path))
            return limit["free"] - held, 10 * MIN_FREE_BYTES  # 5 % of that < 1 GiB floor

        disk = DiskCache(tmp_path, 1 << 30, free_space=free_space)
        limit["free"] = MIN_FREE_BYTES + int(2.5 * (ALIGN + BS))
        for i in range(3):
            await disk.put("mem://x/", "a", "e1", i, payload(BS, seed=i))
        # the third block fitted only after the first was evicted to make room
        assert [disk.has_any("mem://x/", "a", [i]) for i in range(3)] == [False, True, True]
        assert (disk.stats.writes, disk.stats.evictions, disk.stats.skipped) == (3, 1, 0)
        limit["free"] = MIN_FREE_BYTES  # too little even with everything evicted
        await disk.put("mem://x/", "a", "e1", 3, payload(BS))
        assert not disk.has_any("mem://x/", "a", [3]) and disk.stats.skipped == 1
        assert disk.has_any("mem://x/", "a", [2])
    trio.run(main)


def test_writes_go_behind_in_the_nursery(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        data = payload(4 * BS)
        store.put("a", data)
        cache = cache_over(tmp_path)
        async with trio.open_nursery() as nursery:
            cache.nursery = nursery
            assert (await cache.read(store, "a")).data == data
        assert cache.disk is not None and cache.disk.stats.writes == 4
        assert len(files(tmp_path)) == 4
    trio.run(main)


def test_settle_waits_for_queued_writes_and_gives_up_at_its_timeout(tmp_path: Path) -> None:
    """What the daemon does before it cancels background work at unmount: every
    block queued for the disk is on it once ``settle`` returns True; a write that
    does not end makes it return False at the timeout."""
    async def main() -> None:
        store = MemoryStore()
        data = payload(4 * BS)
        store.put("a", data)
        cache = cache_over(tmp_path)
        disk = cache.disk
        assert disk is not None
        async with trio.open_nursery() as nursery:
            cache.nursery = nursery
            assert (await cache.read(store, "a")).data == data
            assert await disk.settle(10.0)
            assert disk.stats.writes == 4 and len(files(tmp_path)) == 4
            release = trio.Event()
            real_put = disk.put

            async def stuck_put(*args: object) -> None:
                await release.wait()
                await real_put(*args)  # type: ignore[arg-type]

            disk.put = stuck_put  # type: ignore[method-assign]
            store.put("b", payload(BS))
            await cache.read(store, "b")
            assert not await disk.settle(0.2)
            release.set()
            assert await disk.settle(10.0)
            assert len(files(tmp_path)) == 5
            nursery.cancel_scope.cancel()
    trio.run(main)


def test_data_starts_aligned_and_an_older_layout_is_removed(tmp_path: Path) -> None:
    """A block's data starts at a multiple of ``ALIGN`` in its file, so it is read
    around the page cache; the directory of the layout before is removed at start-up
    and nothing else in the cache directory is touched."""
    async def main() -> None:
        old = tmp_path / "v1" / "ab"
        old.mkdir(parents=True)
        (old / "ab00-0-00").write_bytes(b"an old block")
        mine = tmp_path / "notes.txt"
        mine.write_text("kept")
        disk = DiskCache(tmp_path, 1 << 20, free_space=plenty)
        data = payload(BS + 123)
        await disk.put("mem://x/", "a", "e1", 0, data)
        assert not (tmp_path / "v1").exists() and mine.read_text() == "kept"
        (path,) = files(tmp_path)
        raw = path.read_bytes()
        assert len(raw) == ALIGN + len(data) and raw[ALIGN:] == data
        got = await DiskCache(tmp_path, 1 << 20, free_space=plenty).get(
            "mem://x/", "a", "e1", 0, bytearray)
        assert isinstance(got, bytearray) and got == data
    trio.run(main)
