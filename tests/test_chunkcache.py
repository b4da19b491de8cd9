"""The decoded-chunk cache: hits, misses, one fetch per key, budget (with the
per-entry overhead), failures, batch fetches and bounded batch prefetches."""

from __future__ import annotations

import tracemalloc
from collections.abc import Hashable, Sequence

import pytest
import trio
import trio.testing

from mountd.cache import chunkcache
from mountd.cache.chunkcache import ENTRY_OVERHEAD, ChunkCache, Outcome
from mountd.errors import Corrupt, StorageError


class Fetcher:
    """Counts fetches per key and returns ``size`` bytes (or None / an error)."""

    def __init__(self, size: int = 100) -> None:
        self.size = size
        self.calls: dict[object, int] = {}
        self.fail: set[object] = set()

    def __call__(self, key: object):
        async def fetch() -> bytes | None:
            self.calls[key] = self.calls.get(key, 0) + 1
            await trio.sleep(0.01)
            if key in self.fail:
                raise Corrupt(str(key), "broken")
            return None if key == "absent" else bytes([len(self.calls) % 256]) * self.size
        return fetch


def test_hits_misses_and_single_flight() -> None:
    async def main() -> None:
        cache, fetcher = ChunkCache(10_000), Fetcher()
        results = []

        async def reader() -> None:
            results.append(await cache.get("a", fetcher("a")))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(reader)
        assert fetcher.calls == {"a": 1}
        assert len(set(results)) == 1 and len(results[0]) == 100
        assert (cache.misses, cache.hits) == (1, 4)
        assert await cache.get("a", fetcher("a")) == results[0]
        assert (cache.misses, cache.hits) == (1, 5)
        assert cache.peek("a") == (True, results[0]) and cache.peek("b") == (False, None)
        assert await cache.get("absent", fetcher("absent")) is None
        assert await cache.get("absent", fetcher("absent")) is None
        assert fetcher.calls["absent"] == 1
    trio.run(main)


def test_budget_evicts_least_recently_used() -> None:
    async def main() -> None:
        entry = 100 + ENTRY_OVERHEAD
        cache, fetcher = ChunkCache(3 * entry + 50), Fetcher(100)
        for key in "abc":
            await cache.get(key, fetcher(key))
        assert cache.used == 3 * entry  # every entry counts its overhead too
        await cache.get("a", fetcher("a"))  # a is now the most recent
        await cache.get("d", fetcher("d"))  # evicts b
        assert cache.used <= 3 * entry + 50
        assert cache.peek("b") == (False, None)
        assert cache.peek("a")[0] and cache.peek("d")[0]
        await cache.get("b", fetcher("b"))
        assert fetcher.calls["b"] == 2
        big = ChunkCache(entry - 1)
        await big.get("x", fetcher("x"))  # larger than the whole budget: not kept
        assert big.used == 0 and big.peek("x") == (False, None)
    trio.run(main)


@pytest.mark.slow
def test_entry_overhead_covers_what_a_tiny_chunk_costs() -> None:
    """The budget is honest for tiny chunks: what 20,000 cached 4-byte chunks
    (keyed as the tree keys them) hold is at most what they count."""
    async def main() -> None:
        cache = ChunkCache(1 << 30)

        async def fetch(keys: list[Hashable]) -> list[Outcome]:
            return [i.to_bytes(4, "little") for *_, (i,) in keys]  # type: ignore[misc]

        domain, ds_id = "/home/u/f.h5", "d-1234"
        keys = [(domain, ds_id, (i,)) for i in range(20_000)]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        await cache.get_many(keys, fetch, batch=256)
        del keys
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert cache.used == 20_000 * (4 + ENTRY_OVERHEAD)
        assert held <= cache.used
    trio.run(main)


class BatchFetcher:
    """A batch fetch that records each call's keys; ``absent`` keys are not
    stored, ``bad`` ones fail, and a call with ``crash`` in it raises."""

    def __init__(self) -> None:
        self.calls: list[list[Hashable]] = []
        self.running = 0
        self.most = 0

    async def __call__(self, keys: list[Hashable]) -> Sequence[Outcome]:
        self.calls.append(keys)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await trio.sleep(0.01)
            if "crash" in keys:
                raise KeyError("crash")
            return [None if k == "absent" else Corrupt(str(k), "broken") if k == "bad"
                    else str(k).encode() for k in keys]
        finally:
            self.running -= 1


def test_get_many_fetches_misses_in_batches_once_each() -> None:
    async def main() -> None:
        cache, fetch = ChunkCache(1 << 20), BatchFetcher()
        await cache.get_many(["k0", "k1"], fetch, batch=10)
        keys = [f"k{i}" for i in range(100)] + ["absent", "bad"]
        results: list[list[Outcome]] = []

        async def reader() -> None:
            results.append(await cache.get_many(keys, fetch, batch=10))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            nursery.start_soon(reader)  # waits for the first reader's fetches
        # the cached k0 and k1 are not fetched again; 100 misses in batches of 10
        assert sorted(len(c) for c in fetch.calls) == [2, *[10] * 10]
        assert sorted(k for c in fetch.calls for k in c) == sorted(keys)
        assert fetch.most <= chunkcache.FETCH_CONCURRENCY
        for got in results:
            assert got[:100] == [f"k{i}".encode() for i in range(100)]
            assert got[100] is None and isinstance(got[101], Corrupt)
        # a failure is kept briefly like any other; the good chunks are cached
        again = await cache.get_many(["bad", "k5"], fetch)
        assert isinstance(again[0], Corrupt) and again[1] == b"k5"
        assert len(fetch.calls) == 11
    trio.run(main)


def test_get_many_leaves_no_waiter_hanging_when_a_batch_crashes() -> None:
    async def main() -> None:
        cache, fetch = ChunkCache(1 << 20), BatchFetcher()
        keys = ["a", "crash", "b", "c"]
        waited: list[Outcome] = []

        async def waiter() -> None:
            await trio.sleep(0.001)
            waited.extend(await cache.get_many(["c"], fetch))

        with pytest.raises(ExceptionGroup):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await cache.get_many(keys, fetch, batch=2)
        # the waiter was given an error for "c" (unless its batch had finished)
        assert waited == [] or waited == [b"c"] or isinstance(waited[0], StorageError)
        assert "crash" not in cache and "a" not in cache
        assert await cache.get_many(["a"], fetch) == [b"a"]  # fetched again
    trio.run(main)


def test_failures_reach_waiters_and_are_kept_only_briefly() -> None:
    async def main() -> None:
        cache, fetcher = ChunkCache(10_000, error_ttl=2.0), Fetcher()
        fetcher.fail.add("bad")
        errors = []

        async def reader() -> None:
            try:
                await cache.get("bad", fetcher("bad"))
            except Corrupt as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(reader)
        assert len(errors) == 3 and fetcher.calls["bad"] == 1
        fetcher.fail.clear()
        # Within error_ttl (the kernel's immediate retry) the error comes back unfetched...
        await trio.sleep(1.0)
        with pytest.raises(Corrupt):
            await cache.get("bad", fetcher("bad"))
        assert fetcher.calls["bad"] == 1
        # ...after it, the next reader fetches again.
        await trio.sleep(1.5)
        assert await cache.get("bad", fetcher("bad")) is not None
        assert fetcher.calls["bad"] == 2
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_prefetch_many_is_bounded_and_swallows_errors() -> None:
    async def main() -> None:
        fetch = BatchFetcher()
        async with trio.open_nursery() as nursery:
            cache = ChunkCache(1 << 20, nursery, prefetch_limit=3, prefetch_chunks=10)
            keys = [f"k{i}" for i in range(30)]
            # batches of 4: room for 10 chunks (4 + 4 + 2)
            assert cache.prefetch_many(keys, fetch, batch=4) == 10
            assert cache.prefetching == 10 and cache.prefetch_tasks == 3
            # under way already: accepted again without a new fetch; then refused
            assert cache.prefetch_many(keys[:12], fetch, batch=4) == 10
            assert len(fetch.calls) == 0  # started, not yet run
            # a reader of a key under way waits for the prefetch, not a fetch of its own
            assert await cache.get_many(["k3"], fetch) == [b"k3"]
            await trio.sleep(0.05)  # the prefetches finish
            assert sorted(len(c) for c in fetch.calls) == [2, 4, 4]
            assert cache.prefetching == 0 and cache.prefetch_tasks == 0
            # the batch limit binds too: 3 batches of 1
            assert cache.prefetch_many(keys[10:20], fetch, batch=1) == 3
            await trio.sleep(0.05)  # the prefetches finish
            # errors (per chunk or a crash of the whole batch) never escape
            assert cache.prefetch_many(["bad", "crash"], fetch, batch=2) == 2
            await trio.sleep(0.05)  # the prefetches finish
            assert "crash" not in cache and cache.prefetch_tasks == 0
        assert cache.peek("k0")[0] and not cache.peek("bad")[0]
        without = ChunkCache(1 << 20)
        assert without.prefetch_many(["z"], fetch) == 0  # no nursery: nothing happens
    trio.run(main)


@pytest.mark.parametrize("budget", [0, 1])
def test_tiny_budget_still_serves(budget: int) -> None:
    async def main() -> None:
        cache, fetcher = ChunkCache(budget), Fetcher()
        assert len(await cache.get("k", fetcher("k")) or b"") == 100
        assert cache.used <= budget
    trio.run(main)
