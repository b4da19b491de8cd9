"""``-o memory_limit`` (``mountd.cache.memlimit``) over real caches: a block cache
reading local files, a chunk cache and a memo, each filled to a known size.
Resident memory is the one thing given (a list of samples), so each test
says exactly how far over the limit the daemon is; what the caches then
let go of, and what their pools unmap, is measured on the caches
themselves. The real daemon under a limit is in ``tests/test_mount_budget.py``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from mountd.cache import memlimit
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.memlimit import (
    IDLE_INTERVAL,
    INTERVAL,
    NEAR_INTERVAL,
    SLACK,
    TRIM_EVERY,
    Lender,
    MemoryLimit,
)
from mountd.cache.memo import ENTRY_OVERHEAD, Memo
from mountd.io.blockcache import BlockCache
from mountd.io.local import LocalStore

MIB = 1 << 20
BLOCKS, CHUNKS, MEMO = 16 * MIB, 8 * MIB, 4 * MIB
LIMIT = 100 * MIB


class Caches:
    """A block cache holding 12 MiB of a local file, a chunk cache holding 6 MiB
    of 1 MiB chunks, a memo holding 3 MiB, and a limit over them whose resident
    memory is whatever the test appends to ``samples``."""

    def __init__(self, tmp_path: Path) -> None:
        self.data = bytes(range(256)) * (12 * 4096)  # 12 MiB
        (tmp_path / "obj").write_bytes(self.data)
        self.blocks = BlockCache(BLOCKS)
        self.chunks = ChunkCache(CHUNKS)
        self.memo = Memo(budget=MEMO)
        self.store = LocalStore(tmp_path)
        self.samples: list[int] = []
        self.held = 0
        self.limit = MemoryLimit(LIMIT, [
            Lender("blocks", self.blocks, BLOCKS, BLOCKS // 8),
            Lender("memo", self.memo, MEMO, MEMO // 8),
            Lender("chunks", self.chunks, CHUNKS, CHUNKS // 2),
        ], besides=lambda: self.held, rss=self.samples.pop)

    async def fill(self) -> None:
        await self.blocks.read(self.store, "obj")
        for i in range(6):
            async def fetch(i: int = i) -> bytes:
                return bytes([i]) * MIB
            await self.chunks.get(i, fetch)
        for i in range(3):
            self.memo.put(("value", i), object(), MIB - ENTRY_OVERHEAD)

    def check(self, rss: int) -> None:
        self.samples.append(rss)
        self.limit.check()

    def budgets(self) -> tuple[int, int, int]:
        return self.blocks.budget, self.memo.budget, self.chunks.budget


@pytest.fixture
def caches(tmp_path: Path) -> Caches:
    made = Caches(tmp_path)
    trio.run(made.fill)
    assert (made.blocks.used, made.chunks.used, made.memo.used) == (
        12 * MIB, 6 * (MIB + 256), 3 * MIB)
    return made


def test_under_the_limit_nothing_is_lent(caches: Caches) -> None:
    caches.check(LIMIT)
    assert caches.budgets() == (BLOCKS, MEMO, CHUNKS) and caches.limit.lent == 0


def test_the_overshoot_is_taken_from_what_the_first_cache_holds(caches: Caches) -> None:
    mapped = caches.blocks.pool.resident
    caches.check(LIMIT + 5 * MIB)
    # The block cache held 12 MiB of its 16: it keeps 7, and lets the other 5 go.
    assert caches.budgets() == (7 * MIB, MEMO, CHUNKS)
    assert caches.blocks.used == 7 * MIB
    assert caches.blocks.pool.resident == mapped - 5 * MIB  # unmapped, not kept waiting
    assert caches.limit.lent == BLOCKS - 7 * MIB == caches.limit.peak_lent
    assert caches.memo.used == 3 * MIB and caches.chunks.used == 6 * (MIB + 256)


def test_a_deep_overshoot_goes_on_to_the_next_caches_down_to_their_floors(
        caches: Caches, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "mountd.cache.memlimit")
    caches.check(LIMIT + 14 * MIB)
    # blocks: 12 held, down to their floor of 2 (10 let go); memo: 3 held, 4 let
    # go is more than it has, so down to its floor of 0.5 (2.5); chunks: the last
    # 1.5 of 6 held.
    assert caches.budgets() == (2 * MIB, MEMO // 8, 6 * (MIB + 256) - 3 * MIB // 2)
    assert caches.blocks.used <= 2 * MIB and caches.memo.used <= MEMO // 8
    assert caches.chunks.used <= caches.chunks.budget
    assert "cache budgets lowered" in caplog.text
    caches.check(LIMIT + 30 * MIB)
    assert caches.budgets() == (BLOCKS // 8, MEMO // 8, CHUNKS // 2)
    assert caches.limit.lent == BLOCKS + MEMO + CHUNKS - (BLOCKS // 8 + MEMO // 8 + CHUNKS // 2)
    caches.check(LIMIT + 30 * MIB)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "every cache at its floor" in warnings[0].getMessage()


def test_room_comes_back_the_last_cut_first_once_memory_is_well_under(caches: Caches) -> None:
    caches.check(LIMIT + 30 * MIB)
    floors = caches.budgets()
    caches.check(LIMIT - SLACK + MIB)  # under the limit, but within the slack: kept
    assert caches.budgets() == floors
    caches.check(LIMIT - SLACK - 3 * MIB)  # 3 MiB of room: the chunk cache's first
    assert caches.budgets() == (floors[0], floors[1], floors[2] + 3 * MIB)
    caches.check(LIMIT - SLACK - 10 * MIB)  # chunks full (+1), memo full (+3.5), blocks +5.5
    assert caches.budgets() == (floors[0] + 11 * MIB // 2, MEMO, CHUNKS)
    caches.check(0)
    assert caches.budgets() == (BLOCKS, MEMO, CHUNKS) and caches.limit.lent == 0
    assert caches.limit.peak_lent == BLOCKS + MEMO + CHUNKS - sum(floors)


def test_memory_held_under_budgets_that_do_not_lend_raises_the_limit(caches: Caches) -> None:
    caches.held = 10 * MIB  # chunk rows of open .npy files
    caches.check(LIMIT + 10 * MIB)
    assert caches.budgets() == (BLOCKS, MEMO, CHUNKS)
    caches.check(LIMIT + 11 * MIB)
    assert caches.budgets() == (11 * MIB, MEMO, CHUNKS)


def test_room_is_what_is_left_under_the_limit_plus_what_the_caches_can_let_go(
        caches: Caches) -> None:
    # Held above the floors: blocks 12 - 2, memo 3 - 0.5, chunks 6 (and 6 x 256) - 4.
    spare = 10 * MIB + 5 * MIB // 2 + 2 * MIB + 6 * 256
    caches.samples.append(LIMIT - 20 * MIB)
    assert caches.limit.room() == 20 * MIB + spare
    caches.held = 10 * MIB  # chunk rows of open .npy files raise the limit
    caches.samples.append(LIMIT + 40 * MIB)
    assert caches.limit.room() == spare - 30 * MIB < 0
    caches.check(LIMIT + 15 * MIB)  # 5 MiB over: the block cache lets 5 of its 12 go
    assert caches.blocks.budget == 7 * MIB
    caches.samples.append(LIMIT + 15 * MIB)
    assert caches.limit.room() == -5 * MIB + (spare - 5 * MIB)


def test_the_caches_keep_serving_at_their_floors(caches: Caches) -> None:
    caches.check(LIMIT + 64 * MIB)

    async def read() -> None:
        for _ in range(2):
            got = await caches.blocks.read(caches.store, "obj")
            assert bytes(got.data) == caches.data
        for i in range(6):
            async def fetch(i: int = i) -> bytes:
                return bytes([i]) * MIB
            assert bytes(await caches.chunks.get(i, fetch) or b"") == bytes([i]) * MIB

    trio.run(read)
    assert caches.blocks.used <= BLOCKS // 8 and caches.chunks.used <= CHUNKS // 2
    assert caches.blocks.pool.resident <= BLOCKS // 8
    assert caches.chunks.pool.resident <= CHUNKS // 2


def test_the_limit_is_checked_until_cancelled(caches: Caches) -> None:
    caches.samples.extend([LIMIT + 5 * MIB] * 50)

    async def main() -> None:
        caches.limit.interval = 0.01
        with trio.move_on_after(0.2):
            await caches.limit.run()

    trio.run(main)
    assert caches.limit.resident == LIMIT + 5 * MIB and caches.limit.lent > 0
    assert len(caches.samples) < 50


def test_samples_come_faster_the_nearer_memory_is_to_the_limit(caches: Caches) -> None:
    assert IDLE_INTERVAL > INTERVAL > NEAR_INTERVAL
    caches.held = 200 * MIB  # the limit is 300 MiB while it is held
    paces = []
    for rss in (150 * MIB - 1, 150 * MIB, 300 * MIB - SLACK, 300 * MIB - SLACK + 1,
                320 * MIB):
        caches.check(rss)
        paces.append(caches.limit.pause())
    assert paces == [IDLE_INTERVAL, INTERVAL, INTERVAL, NEAR_INTERVAL, NEAR_INTERVAL]


def test_where_resident_memory_cannot_be_read_the_limit_stops_and_says_so(
        caches: Caches, caplog: pytest.LogCaptureFixture) -> None:
    def unreadable() -> int:
        raise FileNotFoundError("/proc/self/statm")

    caches.limit.rss = unreadable
    trio.run(caches.limit.run)  # returns instead of raising into the daemon's nursery
    assert "memory_limit is off" in caplog.text
    assert caches.budgets() == (BLOCKS, MEMO, CHUNKS)


def test_the_heap_is_trimmed_before_the_caches_lend_at_most_once_per_period(
        caches: Caches, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(memlimit.time, "monotonic", lambda: now[0])
    trims: list[float] = []
    after = [LIMIT - 2 * MIB, LIMIT + 4 * MIB]  # resident memory once each trim is done

    def trim() -> None:
        trims.append(now[0])
        caches.samples.append(after.pop(0))

    caches.limit.trim = trim
    caches.check(LIMIT + 4 * MIB)
    assert trims == [1000.0] and caches.limit.lent == 0  # back under: nothing lent
    now[0] += TRIM_EVERY / 2
    caches.check(LIMIT + 3 * MIB)
    assert trims == [1000.0] and caches.budgets() == (9 * MIB, MEMO, CHUNKS)
    now[0] += TRIM_EVERY / 2
    caches.check(LIMIT + 10 * MIB)  # trimmed again; the 4 MiB still over are lent
    assert trims == [1000.0, 1000.0 + TRIM_EVERY]
    assert caches.budgets() == (5 * MIB, MEMO, CHUNKS)


def test_room_asked_with_trim_counts_what_the_heap_gave_back(
        caches: Caches, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(memlimit.time, "monotonic", lambda: now[0])
    trims: list[float] = []
    caches.limit.trim = lambda: trims.append(now[0])
    caches.samples.append(LIMIT)
    spare = caches.limit.room()  # with no trim asked for, none is done
    assert spare > 0 and trims == []
    caches.samples.append(LIMIT - 30 * MIB)  # what the trimmed heap leaves resident
    assert caches.limit.room(trim=True) == 30 * MIB + spare and trims == [1000.0]
    now[0] += TRIM_EVERY / 2
    caches.samples.append(LIMIT - 30 * MIB)
    assert caches.limit.room(trim=True) == 30 * MIB + spare and trims == [1000.0]
    caches.check(LIMIT + 5 * MIB)  # over, but trimmed too lately to trim again: lent
    assert trims == [1000.0] and caches.limit.lent > 0
