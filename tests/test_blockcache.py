"""The block cache: hits, misses and requests, merging, LRU, single flight, failures,
etag validation (TTL and if_match), readahead and its failures.

``MemoryStore`` is the fault-injecting fake: objects in memory whose etag
changes on every write, a log of every request, and failures on demand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import trio
import trio.testing

from layouts.storage import ByteRange, Fetched, Listing, ObjectInfo
from mountd.errors import Changed, NotFound, StorageError
from mountd.io.blockcache import BlockCache

BS = 1024


def payload(size: int, seed: int = 0) -> bytes:
    pattern = bytes((i * 7 + seed) % 256 for i in range(256 * 7))
    return (pattern * (size // len(pattern) + 1))[:size]


class MemoryStore:
    """Objects in memory; records every request as (method, key, start, length, if_match)."""

    def __init__(self, url: str = "mem://one/") -> None:
        self._url = url
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.requests: list[tuple[str, str, int, int | None, str | None]] = []
        #: (key, start, stop or None for "to the end") -> whether the request fails
        self.fails: Callable[[str, int, int | None], bool] = lambda key, start, stop: False
        self.delay = 0.0
        self._version = 0

    @property
    def url(self) -> str:
        return self._url

    def put(self, key: str, data: bytes) -> str:
        self._version += 1
        etag = f"e{self._version}"
        self.objects[key] = (data, etag)
        return etag

    def fetches(self) -> list[tuple[str, int, int | None]]:
        return [(k, s, n) for m, k, s, n, _ in self.requests if m == "fetch"]

    def heads(self) -> int:
        return sum(1 for r in self.requests if r[0] == "head")

    def _info(self, key: str) -> ObjectInfo:
        if key not in self.objects:
            raise NotFound(key)
        data, etag = self.objects[key]
        return ObjectInfo(len(data), etag, 0.0)

    async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        return (await self.fetch(key, byte_range)).data

    async def fetch(self, key: str, byte_range: ByteRange | None = None,
                    if_match: str | None = None) -> Fetched:
        start = 0 if byte_range is None else byte_range.start
        length = None if byte_range is None else byte_range.length
        self.requests.append(("fetch", key, start, length, if_match))
        await trio.sleep(self.delay)
        info = self._info(key)
        if self.fails(key, start, None if length is None else start + length):
            raise StorageError(key, "injected failure")
        if if_match is not None and info.etag != if_match:
            raise Changed(key, "changed")
        data = self.objects[key][0]
        return Fetched(data[start:] if length is None else data[start:start + length], info)

    async def head(self, key: str) -> ObjectInfo:
        self.requests.append(("head", key, 0, None, None))
        await trio.sleep(self.delay)
        return self._info(key)

    async def exists(self, key: str) -> bool:
        return key in self.objects

    async def list_dir(self, prefix: str) -> Listing:
        return Listing([], sorted(k for k in self.objects if k.startswith(prefix)))

    async def iter_dir(self, prefix: str) -> AsyncIterator[str]:
        for key in (await self.list_dir(prefix)).keys:
            yield key

    def iter_keys(self, prefix: str) -> AsyncIterator[str]:
        return self.iter_dir(prefix)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(budget: int = 64 * BS, **kwargs) -> BlockCache:
    return BlockCache(budget, block_size=BS, **kwargs)


def test_whole_reads_are_one_request_then_hits() -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make()
        data = payload(3 * BS + 100)
        store.put("a", data)
        got = await cache.read(store, "a")
        assert got.data == data and got.info.size == len(data) and got.info.etag == "e1"
        assert store.fetches() == [("a", 0, None)]
        s = cache.stats
        assert (s.misses, s.hits, s.requests, s.bytes_fetched, s.heads) == (4, 0, 1, len(data), 0)
        assert cache.used == len(data)
        assert (await cache.read(store, "a")).data == data
        assert (await cache.read(store, "a", ByteRange(BS + 10, 20))).data == data[BS + 10:BS + 30]
        assert (s.hits, s.requests) == (5, 1)
        small = b'{"id": "g-1"}'
        store.put("meta.json", small)
        assert (await cache.read(store, "meta.json")).data == small
        assert (await cache.read(store, "meta.json", ByteRange(2, 4))).data == small[2:6]
        assert store.fetches()[1:] == [("meta.json", 0, None)] and s.requests == 2
    trio.run(main)


def test_ranged_reads_fetch_block_aligned_spans() -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make()
        data = payload(10 * BS)
        store.put("a", data)
        assert (await cache.read(store, "a", ByteRange(10, 100))).data == data[10:110]
        assert store.fetches() == [("a", 0, BS)]
        assert (await cache.read(store, "a", ByteRange(500, 100))).data == data[500:600]
        assert len(store.fetches()) == 1
        across = await cache.read(store, "a", ByteRange(BS + 1000, 2 * BS))
        assert across.data == data[BS + 1000:3 * BS + 1000]
        assert store.fetches()[1:] == [("a", BS, 3 * BS)]
        tail = await cache.read(store, "a", ByteRange(10 * BS - 5, 100))
        assert tail.data == data[-5:] and store.fetches()[2:] == [("a", 9 * BS, BS)]
        assert (await cache.read(store, "a", ByteRange(20 * BS, 10))).data == b""
        assert (await cache.read(store, "a", ByteRange(3 * BS))).data == data[3 * BS:]
        assert store.fetches()[3:] == [("a", 4 * BS, 5 * BS)]
        s = cache.stats
        assert (s.misses, s.hits, s.requests) == (1 + 3 + 1 + 5, 1 + 2, 4)
        assert s.bytes_fetched == 10 * BS
    trio.run(main)


def test_adjacent_missing_blocks_are_merged_into_one_request() -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make()
        data = payload(6 * BS)
        etag = store.put("a", data)
        await cache.read(store, "a", ByteRange(0, 10))
        await cache.read(store, "a", ByteRange(3 * BS, 10))
        store.requests.clear()
        got = await cache.read(store, "a", ByteRange(0, 5 * BS))
        assert got.data == data[:5 * BS]
        assert sorted(store.requests) == [("fetch", "a", BS, 2 * BS, etag),
                                          ("fetch", "a", 4 * BS, BS, etag)]
        assert (cache.stats.hits, cache.stats.misses) == (2, 2 + 3)
    trio.run(main)


def test_lru_eviction_under_the_budget() -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make(budget=3 * BS)
        data = payload(8 * BS)
        store.put("a", data)

        async def block(i: int) -> bytes:
            return (await cache.read(store, "a", ByteRange(i * BS, BS))).data

        for i in (0, 1, 2, 0, 3):  # 0 is touched again, so 1 is the oldest when 3 comes
            assert await block(i) == data[i * BS:(i + 1) * BS]
        assert cache.used == 3 * BS
        assert [s for _, s, _ in store.fetches()] == [0, BS, 2 * BS, 3 * BS]
        await block(0)
        await block(1)
        assert [s for _, s, _ in store.fetches()][4:] == [BS]
        # a whole object larger than the budget: served whole, its last blocks kept
        store.put("b", data)
        assert (await cache.read(store, "b")).data == data
        assert cache.used == 3 * BS and len(store.fetches()) == 6
        assert (await cache.read(store, "b", ByteRange(5 * BS, 3 * BS))).data == data[5 * BS:]
        assert len(store.fetches()) == 6
    trio.run(main)


@pytest.mark.parametrize("budget", [0, 1])
def test_tiny_budget_still_serves(budget: int) -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make(budget=budget)
        data = payload(2 * BS + 1)
        store.put("a", data)
        assert (await cache.read(store, "a")).data == data
        assert (await cache.read(store, "a", ByteRange(BS - 1, 3))).data == data[BS - 1:BS + 2]
        assert cache.used <= budget and len(store.fetches()) == 2
    trio.run(main)


def test_concurrent_readers_share_one_fetch_per_block() -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make()
        store.delay = 0.01
        data = payload(4 * BS)
        store.put("a", data)
        store.put("whole", data)
        results: list[bytes] = []

        async def reader(key: str, byte_range: ByteRange | None) -> None:
            results.append((await cache.read(store, key, byte_range)).data)

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(reader, "a", ByteRange(0, 100))
            await trio.testing.wait_all_tasks_blocked()  # block 0 is on its way
            nursery.start_soon(reader, "a", ByteRange(50, BS))
            for _ in range(3):
                nursery.start_soon(reader, "whole", None)
        assert sorted(store.fetches()) == [("a", 0, BS), ("a", BS, BS), ("whole", 0, None)]
        assert results.count(data[:100]) == 5 and results.count(data) == 3
        assert data[50:BS + 50] in results
        assert cache.stats.requests == 3
    trio.run(main)


def test_failures_reach_every_waiter_and_are_not_cached() -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make()
        store.delay = 0.01
        data = payload(2 * BS)
        store.put("a", data)
        store.fails = lambda key, start, stop: True
        errors: list[StorageError] = []

        async def reader(byte_range: ByteRange | None) -> None:
            try:
                await cache.read(store, "a", byte_range)
            except StorageError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(reader, ByteRange(0, 10))
            for _ in range(2):
                nursery.start_soon(reader, None)
        assert len(errors) == 5 and len(store.fetches()) == 2
        assert cache.used == 0
        store.fails = lambda key, start, stop: False
        assert (await cache.read(store, "a", ByteRange(0, 10))).data == data[:10]
        assert (await cache.read(store, "a")).data == data
        with pytest.raises(NotFound):
            await cache.read(store, "missing")
        with pytest.raises(NotFound):
            await cache.read(store, "missing", ByteRange(0, 10))
    trio.run(main)


def test_change_is_seen_after_the_ttl_with_one_head() -> None:
    async def main() -> None:
        store, clock = MemoryStore(), Clock()
        cache = make(validate_ttl=60, clock=clock)
        old, new = payload(2 * BS + 5), payload(3 * BS, seed=1)
        store.put("a", old)
        assert (await cache.read(store, "a")).data == old
        etag = store.put("a", new)
        clock.now += 30
        assert (await cache.read(store, "a")).data == old  # within the TTL: not asked
        assert store.heads() == 0 and len(store.fetches()) == 1
        clock.now += 31
        got = await cache.read(store, "a")
        assert got.data == new and got.info.etag == etag
        assert store.heads() == 1 and store.requests[-1] == ("fetch", "a", 0, 3 * BS, etag)
        assert (cache.stats.heads, cache.stats.invalidations) == (1, 1)
        assert cache.used == len(new)
        clock.now += 61
        assert (await cache.read(store, "a", ByteRange(0, 10))).data == new[:10]
        assert store.heads() == 2 and len(store.fetches()) == 2  # same etag: blocks kept
        assert (await cache.info(store, "a")).etag == etag
        assert store.heads() == 2  # validated within the TTL
        clock.now += 61
        store.delay = 0.01
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(cache.info, store, "a")
        assert store.heads() == 3
        del store.objects["a"]
        clock.now += 61
        with pytest.raises(NotFound):
            await cache.read(store, "a")
        assert cache.used == 0
    trio.run(main)


def test_changed_from_if_match_drops_the_object_and_reads_again() -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make(validate_ttl=60, clock=Clock())
        old, new = payload(4 * BS), payload(4 * BS, seed=1)
        first = store.put("a", old)
        assert (await cache.read(store, "a", ByteRange(0, BS))).data == old[:BS]
        second = store.put("a", new)
        # block 0 is cached (old), block 1 is fetched with if_match: the read must not mix them
        got = await cache.read(store, "a", ByteRange(BS - 10, 20))
        assert got.data == new[BS - 10:BS + 10] and got.info.etag == second
        assert store.requests[1:] == [("fetch", "a", BS, BS, first),
                                      ("fetch", "a", 0, 2 * BS, None)]
        assert cache.stats.invalidations == 1 and cache.used == 2 * BS
        assert (await cache.read(store, "a")).data == new
        assert store.requests[-1] == ("fetch", "a", 2 * BS, 2 * BS, second)
    trio.run(main)


def test_sequential_reads_prefetch_a_growing_window_that_resets_on_a_jump() -> None:
    async def main() -> None:
        store = MemoryStore()
        data = payload(64 * BS)
        store.put("a", data)
        cache = make(readahead_start=BS, readahead_cap=4 * BS, prefetch_request=2 * BS)
        steps = []
        async with trio.open_nursery() as nursery:
            cache.nursery = nursery
            for i in (0, 1, 2, 3, 4, 40, 41):
                before = len(store.requests)
                got = await cache.read(store, "a", ByteRange(i * BS, BS))
                assert got.data == data[i * BS:(i + 1) * BS]
                await trio.testing.wait_all_tasks_blocked()
                steps.append(sorted((s // BS, n // BS) for _, s, n in store.fetches()[before:]))
        assert steps == [
            [(0, 1)],                  # first read: no readahead
            [(1, 1), (2, 1)],          # sequential: 1 block ahead
            [(3, 2)],                  # window 2: blocks 3-4; block 2 was prefetched
            [(5, 2), (7, 1)],          # window 4 (the cap): 5-7, in requests of 2 blocks
            [(8, 1)],                  # still 4 ahead: only block 8 is new
            [(40, 1)],                 # a jump: no readahead
            [(41, 1), (42, 1)],        # sequential again: back to 1 block
        ]
        s = cache.stats
        assert s.prefetches == 6 and s.requests == 6 + 4
        assert (s.hits, s.misses) == (3, 4)
    trio.run(main)


def test_prefetch_failures_are_swallowed_and_not_cached() -> None:
    async def main() -> None:
        store = MemoryStore()
        data = payload(16 * BS)
        store.put("a", data)
        store.fails = lambda key, start, stop: stop is None or stop > 4 * BS
        cache = make(readahead_start=BS, readahead_cap=8 * BS)
        async with trio.open_nursery() as nursery:
            cache.nursery = nursery
            for i in range(4):
                await cache.read(store, "a", ByteRange(i * BS, BS))
                await trio.testing.wait_all_tasks_blocked()
            store.delay = 0.01
            await cache.read(store, "a", ByteRange(4 * BS - 10, 10))  # prefetches 4.. again
            # the reader waits for the failing prefetch, then fetches block 4 itself
            with pytest.raises(StorageError):
                await cache.read(store, "a", ByteRange(4 * BS, 10))
        assert cache.stats.prefetches >= 2
        assert store.fetches()[-1] == ("a", 4 * BS, BS)
        store.fails = lambda key, start, stop: False
        # the nursery is closed now: readahead is skipped, the read is served
        assert (await cache.read(store, "a", ByteRange(4 * BS, 10))).data == data[4 * BS:][:10]
    trio.run(main)


def test_one_cache_serves_several_stores() -> None:
    async def main() -> None:
        one, two = MemoryStore("mem://one/"), MemoryStore("mem://two/")
        one.put("a", b"first")
        two.put("a", b"second")
        cache = make()
        assert (await cache.read(one, "a")).data == b"first"
        assert (await cache.read(two, "a")).data == b"second"
        assert (await cache.read(one, "a", ByteRange(1, 2))).data == b"ir"
        assert (len(one.fetches()), len(two.fetches())) == (1, 1)
    trio.run(main)


def test_an_empty_read_of_a_stale_object_validates_it() -> None:
    async def main() -> None:
        store, clock = MemoryStore(), Clock()
        cache = make(validate_ttl=60, clock=clock)
        store.put("e", b"")
        assert (await cache.read(store, "e")).data == b""
        assert (await cache.read(store, "e")).data == b"" and len(store.requests) == 1
        store.put("e", b"grown")
        clock.now += 61
        assert (await cache.read(store, "e")).data == b"grown"
        assert [r[0] for r in store.requests] == ["fetch", "head", "fetch"]
    trio.run(main)


def test_a_cancelled_reader_lets_a_waiter_fetch_the_block() -> None:
    async def main() -> None:
        store, cache = MemoryStore(), make()
        store.delay = 0.05
        data = payload(2 * BS)
        store.put("a", data)
        got: list[bytes] = []

        async def impatient(byte_range: ByteRange | None) -> None:
            with trio.move_on_after(0.01):
                await cache.read(store, "a", byte_range)

        async def patient(byte_range: ByteRange | None) -> None:
            got.append((await cache.read(store, "a", byte_range)).data)

        for byte_range in (ByteRange(0, 10), None):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(impatient, byte_range)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(patient, byte_range)
            cache = make()
        assert got == [data[:10], data]
        assert store.fetches() == [("a", 0, BS), ("a", 0, BS), ("a", 0, None), ("a", 0, None)]
    trio.run(main)


def test_prefetches_under_way_are_bounded() -> None:
    async def main() -> None:
        store = MemoryStore()
        store.put("a", payload(32 * BS))
        cache = make(readahead_start=8 * BS, prefetch_request=BS, prefetch_limit=2)
        async with trio.open_nursery() as nursery:
            cache.nursery = nursery
            await cache.read(store, "a", ByteRange(0, BS))
            await cache.read(store, "a", ByteRange(BS, BS))  # 8 blocks ahead, 2 at a time
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(s // BS for _, s, _ in store.fetches()) == [0, 1, 2, 3]
            await cache.read(store, "a", ByteRange(2 * BS, BS))  # the next 2
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(s // BS for _, s, _ in store.fetches()[4:]) == [4, 5]
        assert cache.stats.prefetches == 4
    trio.run(main)
