"""The block cache's parts without a store: ``BlockTable`` (LRU order, byte budget,
idle-object bound, forgetting, invalidation, and a property test against a plain
model), ``runs``, the readahead ``Windows`` and ``prefetch_plan``, and ``WriteBehind``'s
queue bound. No FUSE, no servers."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts.storage import ObjectInfo
from mountd.io.blocktable import BlockTable, ObjKey, runs
from mountd.io.diskcache import DiskCache
from mountd.io.readahead import ReadaheadWindow, Windows, prefetch_plan
from mountd.io.writebehind import WriteBehind

A: ObjKey = ("mem://one/", "a")
B: ObjKey = ("mem://one/", "b")


def info(etag: str = "e1", size: int = 100) -> ObjectInfo:
    return ObjectInfo(size, etag, 0.0)


def blocks_in_memory(table: BlockTable, ok: ObjKey, upto: int = 16) -> list[int]:
    return [i for i in range(upto) if (*ok, i) in table]


# --------------------------------------------------------------------------- BlockTable


def test_least_recently_used_blocks_go_first() -> None:
    table = BlockTable(budget=30)
    table.remember(A, info(), now=0.0)
    for i in range(3):
        assert table.put(A, i, b"x" * 10) == 0
    assert table.hit((*A, 0)) == b"x" * 10  # 0 is used again: 1 is now the oldest
    assert table.put(A, 3, b"y" * 10) == 1
    assert blocks_in_memory(table, A) == [0, 2, 3]
    assert table.used == 30 and table.block_count == 3
    assert table.object(A) is not None and table.object(A).blocks == {0, 2, 3}
    assert table.hit((*A, 1)) is None


def test_the_byte_budget_is_kept_and_a_block_too_big_is_not() -> None:
    table = BlockTable(budget=25)
    table.remember(A, info(), now=0.0)
    assert table.put(A, 0, b"a" * 10) == 0
    assert table.put(A, 1, b"b" * 10) == 0
    assert table.put(A, 2, b"c" * 20) == 2  # both others go to make room
    assert table.used == 20 and blocks_in_memory(table, A) == [2]
    assert table.put(A, 3, b"d" * 26) == 0  # bigger than the whole budget: not kept
    assert table.used == 20 and blocks_in_memory(table, A) == [2]
    assert table.put(A, 2, b"e" * 5) == 0  # the same block again replaces its bytes
    assert table.used == 5 and table.hit((*A, 2)) == b"e" * 5
    table.budget = 0
    assert table.put(A, 4, b"f") == 0 and table.used == 5  # a smaller budget: nothing new


def test_idle_objects_are_bounded_and_the_longest_idle_goes() -> None:
    table = BlockTable(budget=10, idle_objects=3)
    k = [("mem://one/", f"k{i}") for i in range(9)]
    for n in range(5):
        table.remember(k[n], info(), now=float(n))
    assert len(table) == 3 and table.idle_count == 3
    assert [table.object(ok) is not None for ok in k[:5]] == [False, False, True, True, True]
    # an object with blocks is not idle, so it does not count against the bound
    table.put(k[2], 0, b"x" * 10)
    table.remember(k[5], info(), now=5.0)
    table.remember(k[6], info(), now=6.0)
    assert table.object(k[3]) is None and table.object(k[2]) is not None
    assert table.idle_count == 3 and len(table) == 4
    table.remember(k[7], info(), now=7.0)  # k4 goes
    # k2's only block is evicted for k7's: k2 is idle now, the newest idle one
    assert table.put(k[7], 0, b"y" * 10) == 1
    assert table.object(k[2]) is not None and table.object(k[2]).blocks == set()
    table.remember(k[8], info(), now=8.0)
    assert table.object(k[5]) is None and table.object(k[2]) is not None
    assert table.idle_count == 3 and len(table) == 4  # k2, k6, k8 idle; k7 holds a block


def test_forgetting_an_object_drops_its_blocks_only() -> None:
    table = BlockTable(budget=100)
    table.remember(A, info(), now=0.0)
    table.remember(B, info(), now=0.0)
    for i in range(3):
        table.put(A, i, b"a" * 10)
    table.put(B, 0, b"b" * 10)
    table.forget(A)
    assert table.object(A) is None and blocks_in_memory(table, A) == []
    assert table.used == 10 and table.hit((*B, 0)) == b"b" * 10
    table.forget(A)  # forgetting an unknown object is nothing
    assert len(table) == 1
    entry = table.remember(B, info("e2"), now=1.0)  # known afresh: its old blocks go
    assert entry.blocks == set() and table.used == 0 and table.block_count == 0


def test_invalidation_drops_only_the_etag_named() -> None:
    table = BlockTable(budget=100)
    table.remember(A, info("e1"), now=0.0)
    table.put(A, 0, b"old")
    assert table.invalidate(A, "e0") is False  # another version: kept
    assert table.hit((*A, 0)) == b"old"
    assert table.invalidate(A, "e1") is True
    assert table.object(A) is None and table.used == 0
    assert table.invalidate(A, "e1") is False  # already gone


class _Model:
    """What a ``BlockTable`` must hold, computed the plain way."""

    def __init__(self, budget: int, idle_limit: int) -> None:
        self.budget = budget
        self.idle_limit = idle_limit
        self.lru: list[tuple[ObjKey, int, int]] = []  # (object, index, size), oldest first
        self.objects: set[ObjKey] = set()
        self.idle: list[ObjKey] = []  # oldest first

    def _idle(self, ok: ObjKey) -> None:
        self.idle.append(ok)
        while len(self.idle) > self.idle_limit:
            self.objects.discard(self.idle.pop(0))

    def _has_blocks(self, ok: ObjKey) -> bool:
        return any(o == ok for o, _, _ in self.lru)

    def forget(self, ok: ObjKey) -> None:
        self.objects.discard(ok)
        self.lru = [e for e in self.lru if e[0] != ok]
        if ok in self.idle:
            self.idle.remove(ok)

    def remember(self, ok: ObjKey) -> None:
        self.forget(ok)
        self.objects.add(ok)
        self._idle(ok)

    def hit(self, ok: ObjKey, index: int) -> None:
        for n, (o, i, _) in enumerate(self.lru):
            if (o, i) == (ok, index):
                self.lru.append(self.lru.pop(n))
                return

    def put(self, ok: ObjKey, index: int, size: int) -> int:
        if size > self.budget:
            return 0
        if ok in self.idle:
            self.idle.remove(ok)
        self.lru = [e for e in self.lru if (e[0], e[1]) != (ok, index)]
        self.lru.append((ok, index, size))
        evicted = 0
        while sum(s for _, _, s in self.lru) > self.budget:
            gone, _, _ = self.lru.pop(0)
            evicted += 1
            if not self._has_blocks(gone):
                self._idle(gone)
        return evicted


_ALL: list[ObjKey] = [("mem://one/", k) for k in "abcde"]
_keys = st.sampled_from(_ALL)
_ops = st.lists(st.one_of(
    st.tuples(st.just("remember"), _keys, st.just(0), st.just(0)),
    st.tuples(st.just("forget"), _keys, st.just(0), st.just(0)),
    st.tuples(st.just("hit"), _keys, st.integers(0, 3), st.just(0)),
    st.tuples(st.just("put"), _keys, st.integers(0, 3), st.integers(0, 12)),
), max_size=60)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 40), idle_limit=st.integers(1, 3), ops=_ops)
def test_block_table_matches_a_plain_model(budget: int, idle_limit: int,
                                           ops: list[tuple[str, ObjKey, int, int]]) -> None:
    table, model = BlockTable(budget, idle_objects=idle_limit), _Model(budget, idle_limit)
    for op, ok, index, size in ops:
        if op == "remember":
            table.remember(ok, info(), now=0.0)
            model.remember(ok)
        elif op == "forget":
            table.forget(ok)
            model.forget(ok)
        elif op == "hit":
            table.hit((*ok, index))
            model.hit(ok, index)
        elif ok in model.objects:  # put: only of a known object, as the cache does
            assert table.put(ok, index, bytes(size)) == model.put(ok, index, size)
        # Same objects, same blocks of each after every step: an eviction of the
        # wrong block (not the least recently used) shows up here at once.
        assert table.used == sum(s for _, _, s in model.lru) <= budget
        assert model.objects == {o for o in _ALL if table.object(o) is not None}
        assert table.idle_count == len(model.idle) <= idle_limit
        for o in model.objects:
            entry = table.object(o)
            assert entry is not None
            assert entry.blocks == {i for m, i, _ in model.lru if m == o}


def test_runs_are_consecutive_and_capped() -> None:
    assert list(runs([5, 1, 2, 3, 7, 8], 2)) == [[1, 2], [3], [5], [7, 8]]
    assert list(runs([], 4)) == []
    assert list(runs(range(5), 5)) == [[0, 1, 2, 3, 4]]


# --------------------------------------------------------------------------- readahead


def test_windows_are_kept_per_key_for_the_last_keys_only() -> None:
    windows = Windows(start=10, cap=40, most=2)
    assert windows.observe("a", 0, 10) == 0  # a first read
    assert windows.observe("a", 10, 10) == 10
    assert windows.observe("b", 0, 10) == 0
    assert windows.observe("a", 20, 10) == 20  # "a" kept its window beside "b"
    assert windows.observe("c", 0, 10) == 0  # "b" is the one read longest ago: it goes
    assert len(windows) == 2
    assert windows.observe("b", 10, 10) == 0  # forgotten: a first read again
    assert windows.observe("a", 30, 10) == 0  # and "a" went when "b" came back
    one = ReadaheadWindow(10, 40)
    assert [one.observe(o, 10) for o in (0, 10, 20, 30, 40)] == [0, 10, 20, 40, 40]


def test_prefetch_plan_starts_after_the_read_and_skips_present_blocks() -> None:
    present = {3}
    plan = prefetch_plan(1500, 1000 * 8, 1000, 2000, present.__contains__)
    assert plan == [[2], [4, 5], [6, 7]]  # block 1 holds byte 1500: the read's own
    assert prefetch_plan(2000, 4000, 1000, 1000, lambda i: False) == [[2], [3]]
    assert prefetch_plan(2000, 2000, 1000, 1000, lambda i: False) == []
    assert prefetch_plan(2000, 2001, 1000, 8000, lambda i: False) == [[2]]


# --------------------------------------------------------------------------- write-behind


class _HeldDisk(DiskCache):
    """A disk cache whose writes wait until ``release`` is set, and are recorded."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, 1 << 20)
        self.release = trio.Event()
        self.written: list[tuple[str, int, bytes]] = []

    async def put(self, url: str, key: str, etag: str, index: int, data: bytes) -> None:
        await self.release.wait()
        self.written.append((key, index, data))


def test_write_behind_queues_at_most_its_limit(tmp_path: Path) -> None:
    async def main() -> None:
        disk = _HeldDisk(tmp_path)
        writer = WriteBehind(disk, limit=25)
        async with trio.open_nursery() as nursery:
            await writer.spill(nursery, "u", "a", "e", [(0, b"x" * 10), (1, b"y" * 10)])
            assert writer.queued == 20
            # 5 bytes of room left: the first block of the next response does not fit
            await writer.spill(nursery, "u", "b", "e", [(0, b"z" * 10), (1, b"w" * 5)])
            assert writer.queued == 20
            await writer.spill(nursery, "u", "c", "e", [(0, b"v" * 5)])
            assert writer.queued == 25
            await trio.testing.wait_all_tasks_blocked()
            disk.release.set()
        assert writer.queued == 0
        assert sorted(disk.written) == [("a", 0, b"x" * 10), ("a", 1, b"y" * 10),
                                        ("c", 0, b"v" * 5)]
        await writer.spill(nursery, "u", "d", "e", [(0, b"late")])  # the nursery is closed
        assert writer.queued == 0 and len(disk.written) == 3
        await writer.spill(None, "u", "d", "e", [(0, b"inline")])  # no nursery: written now
        assert disk.written[-1] == ("d", 0, b"inline") and writer.queued == 0
    trio.run(main)


def test_a_cancelled_write_gives_its_room_back(tmp_path: Path) -> None:
    async def main() -> None:
        disk = _HeldDisk(tmp_path)
        writer = WriteBehind(disk, limit=10)
        async with trio.open_nursery() as nursery:
            await writer.spill(nursery, "u", "a", "e", [(0, b"x" * 10)])
            await trio.testing.wait_all_tasks_blocked()
            assert writer.queued == 10
            nursery.cancel_scope.cancel()
        assert writer.queued == 0 and disk.written == []
    trio.run(main)
