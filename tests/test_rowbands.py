"""A ``.npy`` read through a chunk cache smaller than one chunk row (issue 27).

No FUSE: the tree over an in-memory catalog, the ``.npy`` handle read as the
kernel reads it (sequential requests, some at once and out of order, random
ones). Every chunk read from the store is a decode, counted per chunk: a
sequential pass must read each chunk once however small the chunk cache
(``layouts.views._rowbands``), while the bytes stay numpy's. Also the budget
of held memory (``mountd.cache.held``), the log line and the cache size it
advises (``mountd.cache.cachefit``).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import logging
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
import trio
import trio.testing

import layouts.errors
from layouts.model import ChunkIndex, Dataset
from layouts.views._npy import NpyReader, NpyView
from mountd.cache import cachefit
from mountd.cache.chunkahead import chunk_unit
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.held import HeldMemory
from mountd.tree import Tree, make_tree
from mountd.tree.viewnodes import ViewHandle
from tests.modelcat import MemoryChunks, dataset
from tests.test_tree import catalog_with, walk

#: 768 x 4096 float32 (12 MiB) in 256 x 512 chunks (512 KiB): 3 chunk rows of
#: 8 chunks, 4 MiB each; the last chunk row is cut short by the shape below.
SHAPE = (700, 4096)
CHUNKS = (256, 512)
PER_ROW = 8
#: Too small for one chunk row, large enough for a readahead window (1 MiB).
SMALL = 4 << 20


class CountingChunks(MemoryChunks):
    """Chunks in memory that count how often each was read (decoded)."""

    def __init__(self, chunks: dict[ChunkIndex, bytes]) -> None:
        super().__init__(chunks)
        self.reads: collections.Counter[ChunkIndex] = collections.Counter()

    async def read(self, index: ChunkIndex) -> bytes | None:
        self.reads[index] += 1
        await trio.sleep(0)
        return await super().read(index)


def array(shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    return np.arange(np.prod(shape), dtype="<f4").reshape(shape)


def counted(data: np.ndarray, chunks: tuple[int, ...] = CHUNKS,
            stored: list[ChunkIndex] | None = None) -> tuple[Dataset, CountingChunks]:
    ds = dataset("d-x", data, chunks, stored=stored, fill=-1.0)
    store = CountingChunks(ds.store.chunks)  # type: ignore[attr-defined]
    return dataclasses.replace(ds, store=store), store


def npy_bytes(data: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, data)
    return buf.getvalue()


async def open_npy(tree: Tree) -> NpyReader:
    handle = await (await walk(tree, "x.npy")).open()  # type: ignore[attr-defined]
    assert isinstance(handle, ViewHandle) and isinstance(handle.reader, NpyReader)
    return handle.reader


async def sequential(reader: NpyReader, step: int, at_once: int = 1,
                     rng: np.random.Generator | None = None) -> bytes:
    """The whole file in ``step``-byte requests, ``at_once`` in flight (each batch
    started in a shuffled order when ``rng`` is given), as the kernel sends them."""
    out = bytearray(reader.size)
    offsets = list(range(0, reader.size, step))

    async def one(offset: int) -> None:
        got = bytes(await reader.read(offset, step))
        out[offset:offset + len(got)] = got

    for at in range(0, len(offsets), at_once):
        batch = offsets[at:at + at_once]
        if rng is not None:
            rng.shuffle(batch)
        async with trio.open_nursery() as nursery:
            for offset in batch:
                nursery.start_soon(one, offset)
    return bytes(out)


#: The tree's ``metadata_ttl``: no period ends during a test (bands are served
#: in the period they were decoded in; ``test_a_new_period_decodes_again``).
TTL = 1e9


def run(main: Callable[[Tree], Awaitable[None]], ds: Dataset, budget: int = SMALL,
        clock: trio.abc.Clock | None = None) -> None:
    async def outer() -> None:
        async with trio.open_nursery() as nursery:
            tree = make_tree(catalog_with(x=ds), views=[NpyView()], ttl=TTL,
                             chunk_cache=ChunkCache(budget, nursery))
            await main(tree)
            nursery.cancel_scope.cancel()
    trio.run(outer, clock=clock)


@pytest.mark.parametrize("budget", [SMALL, 256 << 10])
@pytest.mark.parametrize("step", [4096, 128 << 10, 1 << 20])
def test_a_sequential_pass_decodes_each_chunk_once(budget: int, step: int) -> None:
    """With the chunk cache smaller than a chunk row (with readahead, and so
    small it has none), reads of any size decode each chunk once per pass,
    and give numpy's bytes; the leases are given back at close."""
    data = array()
    ds, store = counted(data)

    async def main(tree: Tree) -> None:
        for _ in range(2):
            store.reads.clear()
            reader = await open_npy(tree)
            assert await sequential(reader, step) == npy_bytes(data)
            assert set(store.reads.values()) == {1}
            assert len(store.reads) == 3 * PER_ROW
            assert tree.held.used > 0
            reader.close()
            assert tree.held.used == 0 and len(tree.held) == 0
    run(main, ds, budget)


def test_requests_at_once_and_out_of_order() -> None:
    """The kernel's requests, eight at once, started out of order: each chunk
    decoded once, and the bytes right; holding at most three bands."""
    data = array()
    ds, store = counted(data)
    band = CHUNKS[0] * SHAPE[1] * 4

    async def main(tree: Tree) -> None:
        reader = await open_npy(tree)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, tree.held.used)
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            got = await sequential(reader, 128 << 10, at_once=8, rng=np.random.default_rng(5))
            nursery.cancel_scope.cancel()
        assert got == npy_bytes(data)
        assert set(store.reads.values()) == {1}
        assert band <= peak <= 3 * band
        reader.close()
    run(main, ds)


def test_random_reads_and_a_second_reader_stay_right() -> None:
    """Random reads (some served from held bands, most the ordinary way) while
    another reader of the same file reads it sequentially: both see numpy's bytes."""
    data = array()
    expected = npy_bytes(data)
    ds, _ = counted(data)
    rng = np.random.default_rng(7)

    async def main(tree: Tree) -> None:
        one, two = await open_npy(tree), await open_npy(tree)

        async def randomly() -> None:
            for _ in range(300):
                offset = int(rng.integers(0, len(expected)))
                size = int(rng.choice([1, 7, 4096, 65536, 1 << 20, 5 << 20]))
                assert bytes(await one.read(offset, size)) == expected[offset:offset + size]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(randomly)
            assert await sequential(two, 256 << 10) == expected
        one.close()
        two.close()
        assert tree.held.used == 0
    run(main, ds)


def test_unstored_chunks_read_as_fill() -> None:
    data = array()
    stored = [(i, j) for i in range(3) for j in range(PER_ROW) if (i + j) % 3]
    ds, store = counted(data, stored=stored)
    expected = data.copy()
    for i in range(3):
        for j in range(PER_ROW):
            if (i + j) % 3 == 0:
                expected[i * 256:(i + 1) * 256, j * 512:(j + 1) * 512] = -1.0

    async def main(tree: Tree) -> None:
        reader = await open_npy(tree)
        assert await sequential(reader, 1 << 20) == npy_bytes(expected)
        assert set(store.reads.values()) == {1}
        reader.close()
    run(main, ds)


def test_three_dimensions_and_rows_in_whole_chunks() -> None:
    """Chunk rows of a 3-D array, and chunks that hold whole rows (one chunk
    per chunk row, larger than the cache): each chunk decoded once."""
    for shape, chunks in (((40, 60, 300), (16, 25, 128)), ((100, 8192), (40, 8192))):
        data = array(shape)
        ds, store = counted(data, chunks)

        async def main(tree: Tree, data: np.ndarray = data,
                       store: CountingChunks = store) -> None:
            reader = await open_npy(tree)
            assert await sequential(reader, 64 << 10) == npy_bytes(data)
            assert set(store.reads.values()) == {1}
            reader.close()
        run(main, ds, budget=512 << 10)


def test_no_room_in_the_budget_falls_back_and_says_why(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk row larger than all the held memory: the reader reads the
    ordinary way (each chunk decoded again for every band of rows: the cliff),
    right all the same, and the log says so once, with the size that would do."""
    monkeypatch.setattr(layouts.errors, "_reported", collections.OrderedDict())
    data = array()
    ds, store = counted(data)

    async def main(tree: Tree) -> None:
        tree.held = HeldMemory(1 << 20, tree.epoch)
        for _ in range(2):
            reader = await open_npy(tree)
            assert await sequential(reader, 1 << 20) == npy_bytes(data)
            reader.close()
        assert max(store.reads.values()) > 2
        assert tree.held.refused > 0 and tree.held.used == 0

    with caplog.at_level(logging.WARNING, logger="mountd.cache.cachefit"):
        run(main, ds)
    lines = [r.getMessage() for r in caplog.records if "chunk row" in r.getMessage()]
    need = PER_ROW * chunk_unit(ds)
    assert len(lines) == 1
    assert lines[0].startswith("chunk_cache=4M is smaller than one chunk row of /x in f.h5 "
                              "(8 chunks, 4 MiB); ")
    assert f"use -o chunk_cache={cachefit.cache_for(need) >> 20}M or more" in lines[0]
    assert "decodes each chunk again" in lines[0]


def test_the_advised_cache_needs_no_bands(caplog: pytest.LogCaptureFixture) -> None:
    """With the chunk cache the log line advises, the ordinary read decodes
    each chunk once, holding nothing apart; one MiB less, it needs bands."""
    data = array()
    need = PER_ROW * chunk_unit(counted(data)[0])
    advised = cachefit.cache_for(need)
    assert cachefit.holds(advised, need) and not cachefit.holds(advised - (1 << 20), need)
    for budget in (advised, 64 << 20):
        ds, store = counted(data)

        async def main(tree: Tree, store: CountingChunks = store) -> None:
            reader = await open_npy(tree)
            assert await sequential(reader, 1 << 20, at_once=4) == npy_bytes(data)
            assert set(store.reads.values()) == {1}
            assert tree.held.hits == 0
            reader.close()
        with caplog.at_level(logging.WARNING, logger="mountd.cache.cachefit"):
            run(main, ds, budget)
    assert not [r for r in caplog.records if "chunk row" in r.getMessage()]


def test_cache_for() -> None:
    mib = 1 << 20
    assert cachefit.cache_for(64 * mib + 16 * 256) == 86 * mib
    assert cachefit.cache_for(3 * mib) == 4 * mib
    assert cachefit.cache_for(192 * mib) == 256 * mib
    assert cachefit.cache_for(1024 * mib) == 1088 * mib
    for need in (1, mib, 100 * mib + 1, 500 * mib):
        size = cachefit.cache_for(need)
        assert cachefit.holds(size, need) and not cachefit.holds(size - mib, need)


def test_an_idle_readers_bands_go_to_a_busy_one() -> None:
    """Room for two bands: a reader that stopped reading holds them until they
    have been idle for a while; then a new reader takes them over, and the
    first one, reading again, is still right."""
    data = array()
    expected = npy_bytes(data)
    ds, _ = counted(data)
    band = CHUNKS[0] * SHAPE[1] * 4
    clock = trio.testing.MockClock()

    async def main(tree: Tree) -> None:
        tree.held = HeldMemory(2 * band, tree.epoch, idle=5.0)
        idle, busy = await open_npy(tree), await open_npy(tree)
        assert bytes(await idle.read(0, 1 << 20)) == expected[:1 << 20]
        await trio.testing.wait_all_tasks_blocked()
        assert tree.held.used == 2 * band
        assert bytes(await busy.read(0, 1 << 20)) == expected[:1 << 20]
        assert tree.held.refused > 0 and tree.held.reclaimed == 0
        clock.jump(6.0)
        assert await sequential(busy, 1 << 20) == expected
        assert tree.held.reclaimed == 2
        assert await sequential(idle, 1 << 20) == expected
        idle.close()
        busy.close()
        assert tree.held.used == 0
    run(main, ds, clock=clock)


def test_a_new_period_decodes_again() -> None:
    """Bands are decoded chunks: a new period (``metadata_ttl``, SIGHUP) does
    not serve them, and with ``metadata_ttl=0`` nothing is held at all."""
    data = array()
    ds, store = counted(data)

    async def main(tree: Tree) -> None:
        reader = await open_npy(tree)
        assert bytes(await reader.read(0, 1 << 20)) == npy_bytes(data)[:1 << 20]
        tree.refresh()
        assert await sequential(reader, 1 << 20) == npy_bytes(data)
        assert store.reads[(0, 0)] == 2 and store.reads[(2, 0)] == 1
        reader.close()
    run(main, ds)

    async def no_ttl() -> None:
        async with trio.open_nursery() as nursery:
            tree = make_tree(catalog_with(x=ds), views=[NpyView()], ttl=0,
                             chunk_cache=ChunkCache(SMALL, nursery))
            reader = await open_npy(tree)
            assert await sequential(reader, 1 << 20) == npy_bytes(data)
            assert tree.held.budget == 0 and tree.held.hits == 0
            nursery.cancel_scope.cancel()
    trio.run(no_ttl)


def test_held_memory_leases() -> None:
    """Leases within the budget; one larger than all of it is refused without
    taking anything back; idle or stale leases are taken back for a new one."""
    clock = trio.testing.MockClock()
    period = [0]

    async def main() -> None:
        held = HeldMemory(100, lambda: period[0], idle=5.0)
        dropped: list[str] = []
        a = held.lease(60, lambda: dropped.append("a"))
        b = held.lease(30, lambda: dropped.append("b"))
        assert a is not None and b is not None and held.used == 90
        assert held.lease(20, lambda: None) is None
        clock.jump(6.0)
        b.touch()
        assert held.lease(101, lambda: None) is None and not dropped
        c = held.lease(20, lambda: dropped.append("c"))
        assert c is not None and dropped == ["a"] and not a.fresh() and b.fresh()
        assert held.used == 50 and held.reclaimed == 1 and held.refused == 2
        a.release()
        assert held.used == 50
        period[0] = 1
        assert not b.fresh() and not c.fresh()
        d = held.lease(90, lambda: dropped.append("d"))
        assert d is not None and dropped == ["a", "b", "c"] and held.used == 90
        d.release()
        d.release()
        assert held.used == 0 and len(held) == 0
    trio.run(main, clock=clock)
