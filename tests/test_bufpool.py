"""The buffer pool (``mountd.cache.bufpool``) and the caches' use of it: size
classes and charges, slots used again only once every view of them is gone
(slices, ``numpy`` arrays), the limit on mapped bytes, buffers taken in
worker threads; the block cache and the chunk cache charging slots to their
budgets and never changing bytes a reader holds. No FUSE, no servers."""

from __future__ import annotations

import gc
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import trio

from layouts import decoding
from layouts.hdf5 import _blosc
from mountd.cache.bufpool import POOLED_MIN, BufferPool, charge, size_class
from mountd.cache.chunkcache import ENTRY_OVERHEAD, ChunkCache
from mountd.cache.held import HeldMemory
from mountd.io.blockcache import BlockCache
from mountd.io.diskcache import DiskCache
from mountd.io.local import LocalStore

MIB = 1 << 20


def test_size_classes_are_whole_pages_and_at_most_a_quarter_more() -> None:
    for n in (1, 4096, 4097, 300_000, MIB, MIB + 1, 3 * MIB + 5, 4 * MIB, 17 * MIB):
        cls = size_class(n)
        assert cls >= n and cls % 4096 == 0
        assert cls <= max(4096, n * 5 // 4 + 4096)
    assert size_class(4 * MIB) == 4 * MIB
    assert charge(100) == 100  # small: bytes on the heap, charged as they are
    assert charge(POOLED_MIN) == size_class(POOLED_MIN)


def test_a_slot_comes_back_only_when_every_view_is_gone() -> None:
    pool = BufferPool(limit=8 * MIB)
    buf = pool.take(MIB)
    buf[:] = b"a" * MIB
    part = buf[10:20]
    arr = np.frombuffer(buf, np.uint8)[5:9]
    del buf
    gc.collect()
    assert pool.in_use == MIB and pool.reused == 0
    other = pool.take(MIB)  # a slot of its own: the first is still held
    other[:] = b"b" * MIB
    assert bytes(part) == b"a" * 10 and bytes(arr) == b"aaaa"
    del part
    assert pool.in_use == 2 * MIB
    del arr
    assert pool.in_use == MIB
    again = pool.take(MIB)
    assert pool.reused == 1 and pool.resident == 2 * MIB
    del other, again
    assert pool.in_use == 0 and pool.resident == 2 * MIB


def test_resident_bytes_stay_within_the_limit_while_slots_wait() -> None:
    pool = BufferPool(limit=4 * MIB)
    held = [pool.take(MIB) for _ in range(4)]
    assert pool.resident == 4 * MIB and pool.over == 0
    extra = pool.take(MIB)  # taking never fails: the pool goes over its limit
    assert pool.over == MIB and pool.peak_over == MIB
    del extra  # given back over the limit: unmapped at once
    assert pool.resident == 4 * MIB and pool.unmapped == 1
    del held[:2]
    assert pool.resident == 4 * MIB  # two wait for reuse
    big = pool.take(2 * MIB)  # another class: the waiting ones make room
    assert pool.resident == 4 * MIB and pool.over == 0
    del big, held


def test_copy_keeps_small_data_as_bytes_of_its_own() -> None:
    pool = BufferPool(limit=MIB)
    body = bytes(range(256)) * 64
    small = pool.copy(memoryview(body)[:100])
    assert type(small) is bytes and small == body[:100]
    large = pool.copy(b"x" * POOLED_MIN)
    assert isinstance(large, memoryview) and bytes(large) == b"x" * POOLED_MIN


def test_buffers_taken_and_dropped_in_threads() -> None:
    pool = BufferPool(limit=16 * MIB)
    kept: list[memoryview] = []
    lock = threading.Lock()

    def work(seed: int) -> None:
        for i in range(50):
            buf = pool.take(POOLED_MIN + 4096 * (i % 3))
            buf[:8] = seed.to_bytes(8, "little")
            if i % 10 == 0:
                with lock:
                    kept.append(buf)
            assert int.from_bytes(buf[:8], "little") == seed
            del buf

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.in_use == sum(size_class(len(b)) for b in kept)
    kept.clear()
    assert pool.in_use == 0 and pool.resident <= 16 * MIB


# --------------------------------------------------------------------------- the caches


def test_block_cache_charges_slots_and_readers_get_bytes_of_their_own(tmp_path: Path) -> None:
    data = bytes(range(256)) * (12 * 1024)  # 3 MiB: three 1 MiB blocks
    (tmp_path / "k").write_bytes(data)
    store = LocalStore(tmp_path)

    async def main() -> None:
        cache = BlockCache(4 * MIB)
        first = (await cache.read(store, "k")).data
        assert type(first) is bytes and first == data
        assert cache.used == 3 * MIB and cache.pool.in_use == 3 * MIB
        cache.budget = 2 * MIB  # the least recently used block goes, its slot unmapped
        assert cache.pool.limit == 2 * MIB
        assert cache.used == cache.pool.resident == 2 * MIB and cache.stats.evictions == 1
        again = (await cache.read(store, "k")).data  # two blocks from the cache, copied
        assert again == data and cache.stats.misses == 4

    trio.run(main)


def test_chunk_cache_keeps_large_chunks_pooled_and_a_reader_keeps_its_view() -> None:
    async def main() -> None:
        cache = ChunkCache(2 * MIB + 2 * ENTRY_OVERHEAD)

        def fetch(fill: int) -> Callable[[], Awaitable[bytes]]:
            async def one() -> bytes:
                return bytes([fill]) * MIB
            return one

        a = await cache.get("a", fetch(1))
        assert isinstance(a, memoryview) and a.readonly and a == bytes([1]) * MIB
        assert cache.used == MIB + ENTRY_OVERHEAD
        await cache.get("b", fetch(2))
        await cache.get("c", fetch(3))  # evicts a; its slot is still ours
        assert "a" not in cache
        assert cache.pool.in_use == 3 * MIB
        await cache.get("d", fetch(4))  # b's slot comes back, a's stays held
        assert bytes(a) == bytes([1]) * MIB
        del a
        assert cache.pool.in_use == 2 * MIB

    trio.run(main)


@pytest.mark.parametrize("size", [100, POOLED_MIN])
def test_chunk_cache_charges_small_chunks_as_they_are(size: int) -> None:
    async def main() -> None:
        cache = ChunkCache(8 * MIB)

        async def one() -> bytes:
            return b"z" * size

        await cache.get("k", one)
        assert cache.used == ENTRY_OVERHEAD + charge(size)

    trio.run(main)


def test_a_chunk_decoded_into_the_pool_is_kept_without_a_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ChunkCache(8 * MIB)
    monkeypatch.setattr(decoding.OUTPUT, "take", cache.pool.buffer)
    data = np.arange(MIB // 4, dtype="<f4").tobytes()
    frame = numcodecs.Blosc(cname="zlib", clevel=4, shuffle=numcodecs.Blosc.SHUFFLE).encode(data)
    decoded = _blosc.decode(frame, len(data), "chunk")
    assert decoded is not None and cache.pool.owns(decoded) and decoded == data

    async def main() -> None:
        async def one() -> memoryview:
            assert isinstance(decoded, memoryview)
            return decoded

        got = await cache.get("k", one)
        assert isinstance(got, memoryview) and got.readonly and got == data
        assert cache.pool.taken == 1  # the decoder's buffer, not a copy of it

    trio.run(main)
    assert _blosc.decode(numcodecs.Blosc(cname="zlib").encode(b"x" * 100), 100, "small") \
        == b"x" * 100  # small: a bytearray of its own


def test_row_band_leases_reuse_the_memory_of_released_ones() -> None:
    async def main() -> None:
        held = HeldMemory(4 * MIB, lambda: 0)
        first = held.lease(2 * MIB, lambda: None)
        assert first is not None
        band = np.frombuffer(first.buffer(), np.float32)
        band[:] = 1.0
        assert first.buffer() is first.buffer() and held.pool.in_use == 2 * MIB
        first.release()
        assert held.pool.in_use == 2 * MIB  # the array still reads it
        del band
        assert held.pool.in_use == 0
        second = held.lease(2 * MIB, lambda: None)
        assert second is not None and len(second.buffer()) == 2 * MIB
        assert held.pool.reused == 1 and held.pool.resident == 2 * MIB

    trio.run(main)


def test_a_pool_of_one_slot_size_gives_every_buffer_a_whole_slot() -> None:
    pool = BufferPool(limit=2 * MIB, smallest=64 << 10, slot=MIB)
    assert pool.charge(100 << 10) == MIB and pool.charge(1000) == 1000
    full = pool.take(MIB)
    del full
    tail = pool.take(300 << 10)  # a last block: the full one's slot, no fresh pages
    assert len(tail) == 300 << 10 and pool.reused == 1 and pool.resident == MIB
    del tail


def test_a_block_read_from_disk_lands_in_the_buffer_asked_for(tmp_path: Path) -> None:
    async def main() -> None:
        disk = DiskCache(tmp_path, 8 * MIB)
        data = bytes(range(256)) * 4096  # 1 MiB
        await disk.put("s3://b/", "k", "e1", 0, data)
        pool = BufferPool(limit=4 * MIB)
        got = await disk.get("s3://b/", "k", "e1", 0, pool.buffer)
        assert got is not None and pool.owns(got) and got == data
        plain = await disk.get("s3://b/", "k", "e1", 0)
        assert type(plain) is bytes and plain == data

    trio.run(main)
