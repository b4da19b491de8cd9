"""The block counts of one view file being sized, recorded block by block.

Owns ``BlockBook``, the tree's ``layouts.views.BlockCounts``: what a view
file made of blocks of its dataset's rows (a table's CSV, a column's lines;
``layouts.views._csvblock.RowPlan``) is given while ``ViewSizes`` sizes it.
Before the first block, the book learns the dataset's stored chunks with
their validators (``ChunkStore.version``, one listing) and reads the counts
an earlier count kept (``SizeRecords.load_blocks``: in memory, or with
``cache_dir`` on disk). A block's count is taken from there when the digest
of the validators of the chunks its rows lie in (a chunk not stored counts
as such) is the one kept with it; else the view counts the block and gives
the count to the book. When the file is sized, ``save`` keeps this count's
blocks, so the next count (a later period, or a remount, after a chunk was
rewritten or rows appended) reads and counts only the blocks whose chunks
changed.

Why this is safe: the book's listing must show the dataset's version in
its current data epoch (``Tree.data_version``), the version the chunks
this count reads (from storage, or from the chunk cache of that epoch)
belong to; if storage changed since the epoch began, nothing is taken or
kept. A chunk that changes after the listing has another validator at
the next listing, so a count made of its newer bytes is never taken for
the validator it is kept under. A chunk whose validator the listing does
not give (a store that shows only that it is stored) never vouches for a
kept count.

Concurrency: a book serves one size computation, which ``ViewSizes`` runs
once at a time per file; its state changes with no ``await`` in between.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping

from layouts.model import ChunkIndex, Dataset
from layouts.views import row_chunks
from mountd.cache.dataepochs import version_digest
from mountd.tree.sizerecords import Blocks, SizeRecords
from mountd.tree.viewctx import ObjectContext


class BlockBook:
    """The counts of the blocks of one view file over the context's dataset,
    kept as ``name`` under ``validator`` (``SizeRecords.blocks_validator``)."""

    def __init__(self, records: SizeRecords, ctx: ObjectContext, name: str,
                 validator: str, version: bytes) -> None:
        self._records = records
        self._ctx = ctx
        #: The dataset's version in this data epoch (``Tree.data_version``).
        self._version = version
        self._name = name
        self._validator = validator
        self._loaded = False
        #: The stored chunks' validators, learnt before any block is read.
        self._chunks: Mapping[ChunkIndex, Hashable] | None = None
        self._kept: Blocks = {}
        #: This count's blocks: kept ones taken, and new ones counted.
        self._counted: Blocks = {}
        #: The digest of each block asked for, for its ``put``.
        self._digests: dict[tuple[int, int], bytes] = {}

    async def get(self, ds: Dataset, start: int, stop: int) -> int | None:
        if ds.id != self._ctx.obj.id:
            return None
        if not self._loaded:
            self._loaded = True
            chunks = await ds.store.version()
            if chunks is not None and version_digest(ds, chunks) == self._version:
                self._chunks = chunks
                self._kept = await self._records.load_blocks(self._name, self._validator)
        digest = self._digest(ds, start, stop)
        if digest is None:
            return None
        self._digests[start, stop] = digest
        kept = self._kept.get((start, stop))
        if kept is None or kept[0] != digest:
            return None
        self._counted[start, stop] = kept
        # What the size now rests on, as if the block had been read.
        await self._ctx.note_read(ds)
        return kept[1]

    def put(self, ds: Dataset, start: int, stop: int, count: int) -> None:
        digest = self._digests.get((start, stop))
        if ds.id == self._ctx.obj.id and digest is not None:
            self._counted[start, stop] = (digest, count)

    def _digest(self, ds: Dataset, start: int, stop: int) -> bytes | None:
        """The digest of the validators of the chunks rows ``[start, stop)`` lie
        in; None when one of them has none."""
        chunks = self._chunks
        if chunks is None or not ds.chunks or not ds.grid:
            return None
        parts = []
        for index in row_chunks(ds, start, stop):
            stored = index in chunks
            validator = chunks.get(index)
            if stored and validator is None:
                return None
            parts.append((index, stored, validator))
        return hashlib.blake2b(repr(parts).encode("utf-8", "surrogateescape"),
                               digest_size=16).digest()

    async def save(self) -> None:
        """Keep this count's blocks, if they are not those kept already."""
        if self._counted and self._counted != self._kept:
            await self._records.save_blocks(self._name, self._validator, self._counted)
