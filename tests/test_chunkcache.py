"""The decoded-chunk cache: hits, misses, one fetch per key, budget, failures."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mountd.chunkcache import ChunkCache
from mountd.errors import Corrupt


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
        cache, fetcher = ChunkCache(350), Fetcher(100)
        for key in "abc":
            await cache.get(key, fetcher(key))
        await cache.get("a", fetcher("a"))  # a is now the most recent
        await cache.get("d", fetcher("d"))  # evicts b
        assert cache.used <= 350
        assert cache.peek("b") == (False, None)
        assert cache.peek("a")[0] and cache.peek("d")[0]
        await cache.get("b", fetcher("b"))
        assert fetcher.calls["b"] == 2
        big = ChunkCache(50)
        await big.get("x", fetcher("x"))  # larger than the whole budget: not kept
        assert big.used == 0 and big.peek("x") == (False, None)
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


def test_prefetch_runs_in_the_given_nursery_and_swallows_errors() -> None:
    async def main() -> None:
        fetcher = Fetcher()
        fetcher.fail.add("bad")
        async with trio.open_nursery() as nursery:
            cache = ChunkCache(10_000, nursery, prefetch_limit=2)
            cache.prefetch("a", fetcher("a"))
            cache.prefetch("a", fetcher("a"))  # under way: not started twice
            cache.prefetch("bad", fetcher("bad"))
            cache.prefetch("c", fetcher("c"))  # over the limit of 2: skipped
        assert fetcher.calls == {"a": 1, "bad": 1}
        assert cache.peek("a")[0] and not cache.peek("bad")[0]
        without = ChunkCache(10_000)
        without.prefetch("z", fetcher("z"))  # no nursery: nothing happens
        assert "z" not in fetcher.calls
    trio.run(main)


@pytest.mark.parametrize("budget", [0, 1])
def test_tiny_budget_still_serves(budget: int) -> None:
    async def main() -> None:
        cache, fetcher = ChunkCache(budget), Fetcher()
        assert len(await cache.get("k", fetcher("k")) or b"") == 100
        assert cache.used <= budget
    trio.run(main)
