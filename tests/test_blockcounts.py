"""``mountd.tree.blockcounts``: which kept block counts a count may take.

A dataset in memory whose store lists each chunk's validator (a counter
bumped on every write, as an etag changes), a context that records what
the book notes as read, and the book's records in memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import numpy as np
import trio

from layouts.model import ChunkIndex, Dataset
from mountd.cache.dataepochs import version_digest
from mountd.tree.blockcounts import BlockBook
from mountd.tree.sizerecords import SizeRecords
from tests.modelcat import MemoryChunks, dataset

NAME, VALIDATOR = "t.csv", "blocks"


class Versioned(MemoryChunks):
    """Chunks in memory, each listed with how many times it was written."""

    def __init__(self, chunks: dict[ChunkIndex, bytes]) -> None:
        super().__init__(chunks)
        self.writes = dict.fromkeys(chunks, 1)

    def write(self, index: ChunkIndex, data: bytes) -> None:
        self.chunks[index] = data
        self.writes[index] = self.writes.get(index, 0) + 1

    async def version(self) -> dict[ChunkIndex, Hashable]:
        return dict(self.writes)


class Ctx:
    """The part of an ``ObjectContext`` a book uses."""

    def __init__(self, obj: Dataset) -> None:
        self.obj = obj
        self.noted = 0

    async def note_read(self, ds: Dataset) -> None:
        self.noted += 1


def table() -> tuple[Dataset, Versioned]:
    """A 1-D dataset of 12 rows in chunks of 4, all stored."""
    plain = dataset("d-1", np.arange(12, dtype="<i4"), (4,))
    store = Versioned(plain.store.chunks)  # type: ignore[attr-defined]
    return dataclasses.replace(plain, store=store), store


async def book_of(records: SizeRecords, ds: Dataset, version: bytes | None = None
                  ) -> tuple[BlockBook, Ctx]:
    ctx = Ctx(ds)
    if version is None:
        version = version_digest(ds, await ds.store.version())
    return BlockBook(records, ctx, NAME, VALIDATOR, version), ctx  # type: ignore[arg-type]


def test_a_count_is_taken_only_while_its_chunks_are_unchanged() -> None:
    async def main() -> None:
        records = SizeRecords(None, "")
        ds, store = table()
        book, _ = await book_of(records, ds)
        for start in (0, 4, 8):
            assert await book.get(ds, start, start + 4) is None
            book.put(ds, start, start + 4, 100 + start)
        await book.save()
        store.write((1,), b"\0" * 16)
        book, ctx = await book_of(records, ds)
        assert [await book.get(ds, s, s + 4) for s in (0, 4, 8)] == [100, None, 108]
        assert ctx.noted == 2
        # A block spanning a changed chunk is not taken either.
        assert await book.get(ds, 2, 6) is None
    trio.run(main)


def test_nothing_is_taken_or_kept_when_storage_moved_on_from_the_data_epoch() -> None:
    """The book's listing shows another version than the data epoch's (a chunk
    written since the epoch began, whose old bytes the epoch may still serve):
    no count is taken, and what is counted is not kept."""
    async def main() -> None:
        records = SizeRecords(None, "")
        ds, store = table()
        book, _ = await book_of(records, ds)
        assert await book.get(ds, 0, 4) is None
        book.put(ds, 0, 4, 7)
        await book.save()
        epoch = version_digest(ds, await store.version())
        store.write((2,), b"\1" * 16)  # after the epoch's version was learnt
        book, _ = await book_of(records, ds, epoch)
        assert await book.get(ds, 0, 4) is None
        book.put(ds, 0, 4, 9)
        await book.save()
        book, _ = await book_of(records, ds)
        assert await book.get(ds, 0, 4) == 7
    trio.run(main)


def test_another_dataset_is_never_answered() -> None:
    async def main() -> None:
        records = SizeRecords(None, "")
        ds, _ = table()
        other, _ = table()
        other = dataclasses.replace(other, id="d-2")
        book, _ = await book_of(records, ds)
        assert await book.get(other, 0, 4) is None
    trio.run(main)
