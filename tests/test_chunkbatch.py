"""Batched chunk reads: HSDS ``read_many`` and a ``.npy`` of tiny chunks.

No FUSE: the HSDS store reads a local directory, and the ``.npy`` handle is
driven through the tree as the kernel would drive it.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import trio

from layouts.formats.hsds import _ids as hsds_ids
from layouts.formats.hsds._chunks import ChunkSpec, HsdsChunkStore, filter_plan
from layouts.hdf5._types import element_type, parse_type
from layouts.model import ChunkIndex, Dataset, Domain
from layouts.storage import Fetched
from layouts.views import _npy
from layouts.views._npy import NpyReader, NpyView
from mountd.cache.chunkahead import AHEAD_CHUNKS
from mountd.cache.chunkcache import ENTRY_OVERHEAD, ChunkCache
from mountd.errors import Corrupt, MountError
from mountd.io.local import LocalStore
from mountd.tree import Tree, make_tree
from mountd.tree.paths import ObjPath, root_path
from mountd.tree.viewnodes import ViewHandle
from tests.test_tree import catalog_with, walk

DSET = hsds_ids.parse_id("d-02cd0518-2c584e72-86ef-55279d-623eb6")
GZIP = [{"class": "H5Z_FILTER_DEFLATE", "id": 1, "level": 6}]


class CountingStore(LocalStore):
    """A local store that counts ``get`` and ``fetch_many`` calls."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets = 0
        self.batches: list[int] = []

    async def get(self, key, byte_range=None):  # type: ignore[no-untyped-def]
        self.gets += 1
        return await super().get(key, byte_range)

    async def fetch_many(self, keys: Sequence[str],
                         limit: int | None = None) -> list[Fetched | MountError]:
        self.batches.append(len(keys))
        return await super().fetch_many(keys, limit)


def tiny_store(tmp_path: Path, count: int, skip: set[int], bad: set[int]) -> CountingStore:
    """``count`` one-element int32 chunks stored as HSDS stores gzip (Blosc with
    zlib); chunk i holds ``i * 3``; ``skip`` are not stored, ``bad`` are garbage."""
    chunk_dir = tmp_path / DSET.chunk_dir()
    chunk_dir.mkdir(parents=True)
    blosc = numcodecs.Blosc(cname="zlib", clevel=6, shuffle=numcodecs.Blosc.SHUFFLE)
    for i in range(count):
        if i in skip:
            continue
        raw = b"\x02\x01garbage" if i in bad else blosc.encode(np.array([i * 3], "<i4"))
        (chunk_dir / str(i)).write_bytes(raw)
    return CountingStore(tmp_path)


def spec() -> ChunkSpec:
    tj = {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"}
    htype = parse_type(tj)
    return ChunkSpec(htype=htype, etype=element_type(tj, htype), chunks=(1,),
                     plan=filter_plan(GZIP))


def test_hsds_read_many_is_one_store_call_with_an_outcome_per_chunk(tmp_path: Path) -> None:
    store = tiny_store(tmp_path, 50, skip={7}, bad={9})
    chunks = HsdsChunkStore(store, DSET, (50,), spec())

    async def main() -> None:
        indices: list[ChunkIndex] = [(i,) for i in range(50)] + [(50,)]  # (50,): off the grid
        got = await chunks.read_many(indices)
        assert store.batches == [50] and store.gets == 0
        for i, value in enumerate(got[:50]):
            if i == 7:
                assert value is None
            elif i == 9:
                assert isinstance(value, Corrupt)
            else:
                assert value == np.array([i * 3], "<i4").tobytes()
        assert got[50] is None
        # the same answers as reading one at a time
        assert await chunks.read((3,)) == got[3]
    trio.run(main)


def tiny_dataset(store: CountingStore, count: int) -> Dataset:
    tj = {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"}
    return Dataset(id=DSET.id, shape=(count,), maxshape=(None,),
                   type=element_type(tj, parse_type(tj)), chunks=(1,),
                   fill_value=np.int32(-1), store=HsdsChunkStore(store, DSET, (count,), spec()))


async def read_npy(tree: Tree, step: int) -> tuple[NpyReader, list[bytes | MountError]]:
    node = await walk(tree, "x.npy")
    opened = await node.open()  # type: ignore[attr-defined]
    assert isinstance(opened, ViewHandle)
    handle = opened.reader
    assert isinstance(handle, NpyReader)
    parts: list[bytes | MountError] = []
    offset = 0
    while offset < handle.size:
        try:
            parts.append(bytes(await handle.read(offset, step)))
        except MountError as exc:
            parts.append(exc)
        offset += step
    return handle, parts


@pytest.mark.parametrize("budget", [1 << 20, 64 << 20])
@pytest.mark.slow
def test_npy_of_tiny_chunks_reads_in_batches_within_budget(tmp_path: Path, budget: int) -> None:
    count = 10_000
    store = tiny_store(tmp_path, count, skip={5, 9_999}, bad={7_345})
    ds = tiny_dataset(store, count)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache = ChunkCache(budget, nursery)
            tree = make_tree(catalog_with(x=ds), views=[NpyView()], chunk_cache=cache)
            tracemalloc.start()
            handle, parts = await read_npy(tree, 16 << 10)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            nursery.cancel_scope.cancel()
        # only the read holding the bad chunk fails
        hlen, step = len(handle.header), 16 << 10
        bad_at = (hlen + 7_345 * 4) // step
        assert [i for i, p in enumerate(parts) if isinstance(p, MountError)] == [bad_at]
        data = b"".join(p if isinstance(p, bytes) else bytes(step) for p in parts)
        got = np.frombuffer(data[hlen:], "<i4")
        expected = np.arange(count, dtype="<i4") * 3
        expected[[5, 9_999]] = -1  # not stored: the fill value
        lo, hi = (bad_at * step - hlen) // 4, ((bad_at + 1) * step - hlen) // 4
        np.testing.assert_array_equal(np.delete(got, range(lo, hi)),
                                      np.delete(expected, range(lo, hi)))
        # every chunk object read once or twice (a small budget evicts), in batches
        assert store.gets == 0
        assert count <= sum(store.batches) <= 2 * count + 100
        assert len(store.batches) <= 2 * sum(store.batches) / 100
        assert max(store.batches) <= 256
        assert cache.used <= budget
        # what the whole read held: the cache budget, readahead bounded by count
        # (the entries it may add beyond the budget for a moment) and the reads
        assert peak <= budget + AHEAD_CHUNKS * (ENTRY_OVERHEAD + 300) + (8 << 20)
        assert math.prod(ds.shape or ()) == count
    trio.run(main)


def grid_dataset(tmp_path: Path, shape: tuple[int, int], chunks: tuple[int, int]
                 ) -> tuple[Dataset, np.ndarray]:
    """A 2-D float32 dataset stored as HSDS stores gzip chunks, and its values."""
    values = np.arange(math.prod(shape), dtype="<f4").reshape(shape)
    chunk_dir = tmp_path / DSET.chunk_dir()
    chunk_dir.mkdir(parents=True)
    blosc = numcodecs.Blosc(cname="zlib", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE)
    for i in range(shape[0] // chunks[0]):
        for j in range(shape[1] // chunks[1]):
            block = values[i * chunks[0]:(i + 1) * chunks[0], j * chunks[1]:(j + 1) * chunks[1]]
            (chunk_dir / f"{i}_{j}").write_bytes(blosc.encode(np.ascontiguousarray(block)))
    tj = {"class": "H5T_FLOAT", "base": "H5T_IEEE_F32LE"}
    etype = element_type(tj, parse_type(tj))
    ds = Dataset(id=DSET.id, shape=shape, maxshape=shape, type=etype, chunks=chunks,
                 fill_value=np.float32(0),
                 store=HsdsChunkStore(CountingStore(tmp_path), DSET, shape, ChunkSpec(
                     htype=parse_type(tj), etype=etype, chunks=chunks,
                     plan=filter_plan(GZIP))))
    return ds, values


def test_a_sequential_npy_reader_copies_each_row_about_once_and_asks_per_chunk_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads of one size, shifted off the rows by the ``.npy`` header, each fall in
    one band of rows (a band is counted from the read's first element, so no read
    is left a part of a row short and gathered again); and once a chunk row was
    asked for whole, the reads inside it do not list and ask for its chunks again."""
    shape, chunks = (4096, 256), (64, 64)   # 4 MiB: rows of 1 KiB, chunk rows of 64 KiB
    ds, values = grid_dataset(tmp_path, shape, chunks)
    monkeypatch.setattr(_npy, "BAND_BYTES", 8 << 10)  # 8 rows: 4 reads of 2 KiB
    copied: list[int] = []
    real_fill = _npy.fill_box

    def counting_fill(dest: np.ndarray, *args: Any) -> None:
        copied.append(dest.nbytes)
        real_fill(dest, *args)

    monkeypatch.setattr(_npy, "fill_box", counting_fill)
    asked: list[int] = []
    real_prefetch = Tree.prefetch_chunks

    def counting_prefetch(self: Tree, op: ObjPath, ds: Dataset,
                          indices: Sequence[ChunkIndex]) -> int:
        asked.append(len(indices))
        return real_prefetch(self, op, ds, indices)

    monkeypatch.setattr(Tree, "prefetch_chunks", counting_prefetch)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            # a readahead window of 1 MiB (a quarter of the cache), shorter than
            # the dataset, as a large array's window is
            cache = ChunkCache(4 << 20, nursery)
            tree = make_tree(catalog_with(x=ds), views=[NpyView()], chunk_cache=cache)
            handle, parts = await read_npy(tree, 2 << 10)
            nursery.cancel_scope.cancel()
        data = b"".join(p for p in parts if isinstance(p, bytes))
        assert len(parts) == -(-handle.size // (2 << 10)) and len(data) == handle.size
        np.testing.assert_array_equal(
            np.frombuffer(data[len(handle.header):], "<f4").reshape(shape), values)
        # each band holds 8 rows and a part of one more: a row in 8 is copied twice
        assert sum(copied) <= values.nbytes * 9 // 8 + (4 << 10), (sum(copied), values.nbytes)
        # asked once or twice per chunk row (64 of them), not at each of the 2,049 reads
        assert 0 < len(asked) <= 2 * shape[0] // chunks[0] + 2, asked
    trio.run(main)


def test_a_version_learnt_past_the_end_of_its_period_is_still_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Tree.data_version`` gives the version learnt in the period it was asked
    in, even when learning it (a listing, on slow storage) outlasts that period.
    It gave None then, so a view's size recorded under the version was not
    looked up and a table was counted again (``test_mount_viewsizes``' slow S3
    case failed about one run in five)."""
    ds, _ = grid_dataset(tmp_path, (1024, 256), (64, 64))   # 1 MiB: versioned
    tree = make_tree(catalog_with(x=ds))
    period = [0]
    monkeypatch.setattr(tree, "epoch", lambda: period[0])
    listing = HsdsChunkStore.version

    async def outlasting(self: HsdsChunkStore) -> Any:
        stored = await listing(self)
        period[0] += 1   # the period ends while the listing is under way
        return stored

    monkeypatch.setattr(HsdsChunkStore, "version", outlasting)
    op = root_path(Domain("f.h5", "g-root", 2.0)).child("x", ds.id)

    async def main() -> None:
        first = await tree.data_version(op, ds)
        assert isinstance(first, bytes) and period[0] == 1
        # learnt again in the next period, storage unchanged: the same version
        assert await tree.data_version(op, ds) == first and period[0] == 2
    trio.run(main)
