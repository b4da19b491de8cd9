"""Reads of a ``D.h5`` view in process (no FUSE): what the daemon serves in
the places of a dataset's chunks, and what it reads ahead of HDF5.

HDF5 reads a selection's chunks one after another: a band of rows in grid
order, a band of columns at a fixed stride of the grid. The view's handle
prefetches along a column of the grid once it has seen one step down it,
and along any other stride once it has seen two steps of it; the store's
own log of reads shows which chunks were fetched, in what order.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import trio
import trio.testing

from layouts.hdf5 import ChunkPart
from layouts.model import ElementType
from mountd.cache.chunkahead import ravel
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.metacache import CachedCatalog
from mountd.tree import make_tree
from mountd.tree.h5view import H5ViewHandle, H5Views
from tests.test_tree import GeneratedChunks, catalog_with, generated_dataset

GRID = (8, 8)


def test_chunks_read_at_one_stride_are_read_ahead_at_that_stride() -> None:
    f4 = np.dtype("<f4")
    ds = dataclasses.replace(generated_dataset("d-1", GRID, (2, 2)), type=ElementType(
        dtype=f4, sidecar=f4.str, hdf5={"class": "H5T_FLOAT", "base": "H5T_IEEE_F32LE"}))
    store = ds.store
    assert isinstance(store, GeneratedChunks)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            tree = make_tree(CachedCatalog(catalog_with(x=ds), ttl=3600),
                             chunk_cache=ChunkCache(1 << 20, nursery),
                             h5views=H5Views())
            view = await (await tree.root()).lookup(".root.h5")
            handle = await view.open()
            assert isinstance(handle, H5ViewHandle)
            file = handle.image.file
            places = {part.index: (start, file.part_end(number)) for number, (start, part)
                      in enumerate(zip(file.starts, file.parts, strict=True))
                      if isinstance(part, ChunkPart)}
            assert sorted(places) == [(i, j) for i in range(8) for j in range(8)]

            async def read(index: tuple[int, int]) -> None:
                start, end = places[index]
                data = await handle.read(start, end - start)
                want = np.full(4, ravel(index, GRID), "<f4").tobytes()
                assert bytes(data) == want, index

            for row in range(2):  # a band of columns: one step down the grid
                await read((row, 0))
            await trio.testing.wait_all_tasks_blocked()
            assert store.reads[:2] == [(0, 0), (1, 0)]
            assert store.reads[2:] == [(row, 0) for row in range(2, 8)]
            for row in range(2, 8):  # from the cache: no read of its own
                await read((row, 0))
            assert len(store.reads) == 8

            store.reads.clear()  # any other stride: after two equal steps
            for col in (1, 3):
                await read((7, col))
            await trio.testing.wait_all_tasks_blocked()
            assert store.reads == [(7, 1), (7, 3)]
            await read((7, 5))
            await trio.testing.wait_all_tasks_blocked()
            assert store.reads == [(7, 1), (7, 3), (7, 5), (7, 7)]

            store.reads.clear()
            for col in range(1, 4):  # a band of rows: grid order
                await read((0, col))
            await trio.testing.wait_all_tasks_blocked()
            assert store.reads[:3] == [(0, 1), (0, 2), (0, 3)]
            assert store.reads[3:5] == [(0, 4), (0, 5)]
            handle.close()
            nursery.cancel_scope.cancel()
    trio.run(main)
