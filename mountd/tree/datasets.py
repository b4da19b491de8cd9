"""A dataset's directory: its chunk files and Zarr v2 metadata.

Owns ``DatasetDir`` (one file per stored chunk, named by grid index, plus
``.zarray`` and ``.zattrs``), ``ChunkFile`` (one decoded chunk) and the
chunk-file naming rules. A dataset directory streams its chunk names from
storage (``StreamListing``); it never holds them all, except a small one's. The chunk indices of
a dataset (at most ``MAX_KEPT_CHUNKS``), once listed whole, are memoised
with the dataset object as a ``ChunkList``, so listing it again (in the
same order) and looking up its chunks need no storage round trip until the
object is fetched anew (``-o metadata_ttl``). A dataset whose rows (Zarr
files and chunk files) fit one ``STREAM_BATCH`` is listed whole
(``SmallOrStreamListing``), from its rows with their stats. When a walker
is coming (``mountd.tree.preload``), a small dataset (at most
``SMALL_LISTING`` chunks) is listed ahead in the background and its rows
are made (its Zarr files rendered for their sizes) and memoised with the
dataset object and the domain; the walker's listing takes them out of the
memo, since a walk lists each directory once and a walk of 100,000 datasets
would otherwise keep 100,000 sets of rows. Listing it again makes the rows
anew from the memoised sizes and chunk list: no storage round trip, nothing
rendered. Reading chunk files in grid order prefetches the next chunks
(``Tree.chunk_file_read``).

Concurrency: nodes are immutable; a listing is one stream per open
directory, and what it learns is memoised by synchronous calls.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator, Hashable
from typing import TYPE_CHECKING

from layouts.model import ChunkIndex, Dataset
from mountd.cache.chunklist import ChunkList, ChunkListBuilder
from mountd.errors import MountError, NotFound, StorageError
from mountd.tree import zarrmeta
from mountd.tree.meta import ZARRAY_NAME, ZATTRS_NAME, zarray_file, zattrs_file
from mountd.tree.nodes import (
    STREAM_BATCH,
    BytesHandle,
    DirListing,
    FileHandle,
    FileNode,
    Node,
    NodeType,
    Row,
    SmallOrStreamListing,
    Stat,
)
from mountd.tree.objdir import ObjectDir
from mountd.tree.paths import InDomain, ObjPath

if TYPE_CHECKING:
    from mountd.tree.core import Tree

#: Chunks of one dataset listed ahead in the background (one page of an S3 listing);
#: a dataset with more is listed when its directory is read.
SMALL_LISTING = 1000
#: Most chunk indices of one dataset kept once listed (16 bytes each, in the memo);
#: longer listings are read from storage each time.
MAX_KEPT_CHUNKS = 4_000_000

#: Rough bytes one memoised row of a small dataset costs, with its node.
_ROW_BYTES = 400

_CHUNK_NAME = re.compile(r"0|[1-9][0-9]*")


async def _close(stream: AsyncIterator[ChunkIndex]) -> None:
    """Finish a chunk listing left early (async generators hold storage pages)."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def chunk_name(index: ChunkIndex) -> str:
    return ".".join(str(i) for i in index)


def parse_chunk_name(name: str) -> ChunkIndex | None:
    parts = name.split(".")
    if not all(_CHUNK_NAME.fullmatch(p) for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _listing_grid(ds: Dataset) -> tuple[int, ...]:
    """The grid a dataset's chunk indices live in (a scalar's one chunk is ``(0,)``)."""
    return (1,) if ds.shape == () else ds.grid


class DatasetDir(ObjectDir):
    """A dataset: one file per stored chunk, named by grid index."""

    __slots__ = ()

    def _own_files(self, ds: Dataset) -> dict[str, Node]:
        files: dict[str, Node] = {}
        if zarrmeta.has_zarray(ds):
            files[ZARRAY_NAME] = zarray_file(self.tree, self.op)
        files[ZATTRS_NAME] = zattrs_file(self.tree, self.op)
        return files

    def open_listing(self) -> DirListing:
        return SmallOrStreamListing(self._whole, self._batches)

    async def _whole(self) -> list[Row] | None:
        """Every row, if the dataset's rows fit one ``STREAM_BATCH`` and its
        chunks are known (memoised, ``_small_rows``); else None: stream them.
        Tells the preloader that the directory is being listed, and waits for
        a listing of it ahead to end."""
        ds = await self.tree.dataset(self.op)
        self.tree.preload.dir_opened(self)
        kept = self._taken_rows(ds)
        if kept is None:
            await self.tree.preload.finished(self.op.key)
            kept = self._taken_rows(ds)
        return kept if kept is not None else await self._make_rows(ds, keep=False)

    def _kept_rows(self, ds: Dataset) -> list[Row] | None:
        kept: list[Row] | None = self.tree.memo.get(self._rows_key, ds, self.op.domain)
        return kept

    def _taken_rows(self, ds: Dataset) -> list[Row] | None:
        """The rows made ahead for this listing, handed over: the memo keeps
        them no longer (a walk lists each directory once)."""
        taken: list[Row] | None = self.tree.memo.take(self._rows_key, ds, self.op.domain)
        return taken

    async def _make_rows(self, ds: Dataset, keep: bool) -> list[Row] | None:
        """``_whole``'s rows, made now; memoised when whole and ``keep`` (made
        ahead of a walker)."""
        own = [Row(name, node) for name, node in self._own_files(ds).items()]
        known = self._known_chunks(ds)
        if known is None and ds.store.listing_ready():
            # Listing it costs no round trip: a small one is then listed whole.
            await self._list_small(ds)
            known = self._known_chunks(ds)
        if known is not None and len(own) + len(known) <= STREAM_BATCH:
            return await self._small_rows(ds, own, known, keep)
        return None

    async def _batches(self) -> AsyncIterator[list[Row]]:
        """The zarr files, then the stored chunks in storage order, in batches
        of at most ``STREAM_BATCH`` (never all held). Chunk files of a
        fixed-size type all have the same stat, made once here."""
        ds = await self.tree.dataset(self.op)
        batch = [Row(name, node) for name, node in self._own_files(ds).items()]
        chunk_stat = chunk_file_stat(self.tree, ds)
        suffix = zarrmeta.chunk_name_suffix(ds)
        known = self._known_chunks(ds)
        if known is not None:
            indices = iter(known)
            while True:
                batch.extend(Row(chunk_name(index) + suffix,
                                 ChunkFile(self.tree, self.op, index), chunk_stat)
                             for index in itertools.islice(indices, STREAM_BATCH - len(batch)))
                if not batch:
                    return
                yield batch
                batch = []
        seen = ChunkListBuilder(_listing_grid(ds), MAX_KEPT_CHUNKS)
        stored = ds.store.iter_stored()
        try:
            async for index in stored:
                if not ds.in_grid(index):
                    continue
                seen.add(index)
                batch.append(Row(chunk_name(index) + suffix,
                                 ChunkFile(self.tree, self.op, index), chunk_stat))
                if len(batch) == STREAM_BATCH:
                    yield batch
                    batch = []
        finally:
            await _close(stored)
        if batch:
            yield batch
        self._remember_chunks(ds, seen)

    @property
    def _rows_key(self) -> Hashable:
        return ("rows", self.op.key)

    async def _small_rows(self, ds: Dataset, own: list[Row], known: ChunkList,
                          keep: bool) -> list[Row]:
        """Every row of a dataset whose few chunks are ``known``: the Zarr files
        with their stats, then the chunk files. If ``keep``, memoised with the
        dataset object and the domain, which those stats and the chunk list
        derive from (as a group's rows are), unless a stat failed: readdir
        then stats that file itself and reports the error."""
        rows: list[Row] = []
        whole = True
        for name, node, _ in own:
            try:
                rows.append(Row(name, node, await node.listed()))
            except MountError:
                rows.append(Row(name, node))
                whole = False
        chunk_stat = chunk_file_stat(self.tree, ds)
        suffix = zarrmeta.chunk_name_suffix(ds)
        rows.extend(Row(chunk_name(index) + suffix, ChunkFile(self.tree, self.op, index),
                        chunk_stat) for index in known)
        if whole and keep:
            self.tree.memo.put(self._rows_key, rows, _ROW_BYTES * len(rows), ds,
                               self.op.domain)
        return rows

    def _chunks_key(self, ds: Dataset) -> Hashable:
        return ("chunks", self.op.domain.path, ds.id)

    def _known_chunks(self, ds: Dataset) -> ChunkList | None:
        """The chunk indices of the dataset, if listed since the object was fetched."""
        known: ChunkList | None = self.tree.memo.get(self._chunks_key(ds), ds)
        return known

    def _remember_chunks(self, ds: Dataset, seen: ChunkListBuilder) -> None:
        """Keep a whole listing (a listing left early or too long is not kept)."""
        chunks = seen.result()
        if chunks is not None:
            self.tree.memo.put(self._chunks_key(ds), chunks, chunks.nbytes, ds)

    def loaded(self) -> bool:
        """True once the rows a listing gives at once are made, or the dataset's
        chunks are too many to be listed at once: nothing to load ahead."""
        ds = self.tree.peek(self.op)
        if not isinstance(ds, Dataset):
            return False
        known = self._known_chunks(ds)
        return (self._kept_rows(ds) is not None
                or (known is not None
                    and len(known) + len(self._own_files(ds)) > STREAM_BATCH))

    async def preload(self) -> None:
        """List the chunks of a small dataset ahead (one storage round trip,
        none when the domain's listing is at hand), and make its rows: the
        sizes of its Zarr files are rendered while the walker is still in
        the directories before it."""
        async with self.tree.preload.limiter:
            ds = await self.tree.dataset(self.op)
            if self._known_chunks(ds) is None and not ds.store.listing_ready():
                await self._list_small(ds)
        if self._kept_rows(ds) is None:
            await self._make_rows(ds, keep=True)

    async def _list_small(self, ds: Dataset) -> None:
        """Remember the chunk indices if there are at most ``SMALL_LISTING``."""
        seen = ChunkListBuilder(_listing_grid(ds), SMALL_LISTING)
        stored = ds.store.iter_stored()
        try:
            async for index in stored:
                if ds.in_grid(index):
                    seen.add(index)
                    if seen.gave_up:
                        return
        finally:
            await _close(stored)
        self._remember_chunks(ds, seen)

    async def lookup(self, name: str) -> Node:
        ds = await self.tree.dataset(self.op)
        own = self._own_files(ds).get(name)
        if own is not None:
            return own
        suffix = zarrmeta.chunk_name_suffix(ds)
        if not name.endswith(suffix):
            raise NotFound(name)
        index = parse_chunk_name(name[:len(name) - len(suffix)])
        if index is None or not ds.in_grid(index):
            raise NotFound(name)
        known = self._known_chunks(ds)
        if not (index in known if known is not None else await ds.store.exists(index)):
            raise NotFound(name)
        return ChunkFile(self.tree, self.op, index)


def chunk_file_stat(tree: Tree, ds: Dataset) -> Stat:
    """The stat a listing gives every chunk file of ``ds``: exact for fixed-size
    types; for variable-length ones sizes differ by chunk and cost a decode,
    so it is a stand-in (``exact`` False) that the file's own stat replaces."""
    mtime, ctime = tree.stamps(ds)
    if ds.chunk_nbytes is None:
        return Stat(NodeType.FILE, mtime=mtime, ctime=ctime, exact=False)
    return Stat(NodeType.FILE, size=ds.chunk_nbytes, mtime=mtime, ctime=ctime)


class ChunkFile(InDomain, FileNode):
    """One decoded chunk of a dataset."""

    __slots__ = ("index", "key", "op", "tree")

    def __init__(self, tree: Tree, op: ObjPath, index: ChunkIndex) -> None:
        self.tree = tree
        self.op = op
        self.index = index
        self.key: Hashable = ("chunk", op.key, index)

    async def stat(self) -> Stat:
        """Exact: a variable-length chunk is decoded to learn its size (kept
        with the dataset object and its data epoch, so while neither changed)."""
        ds = await self.tree.dataset(self.op)
        listed = chunk_file_stat(self.tree, ds)
        if listed.exact:
            return listed
        key = self._size_key(await self.tree.data_epoch(self.op, ds))
        size: int | None = self.tree.memo.get(key, ds)
        if size is None:
            size = len(await self._data(ds))
            self.tree.memo.put(key, size, 16, ds)
        return Stat(NodeType.FILE, size=size, mtime=listed.mtime, ctime=listed.ctime)

    def _size_key(self, data_epoch: Hashable) -> Hashable:
        """The memo key of the chunk's size in the dataset's ``data_epoch``."""
        return ("chunk size", self.op.key, self.index, data_epoch)

    async def _data(self, ds: Dataset) -> bytes:
        self.tree.chunk_file_read(self.op, ds, self.index)
        data = await self.tree.chunk(self.op, ds, self.index)
        if data is None:
            where = f"{self.op.domain.path}{self.op.h5path} chunk {chunk_name(self.index)}"
            raise StorageError(where, "chunk is no longer stored")
        return data

    async def open(self) -> FileHandle:
        """The kernel keeps the file's pages only while they are current
        (``Tree.keep_pages``: while the dataset's data epoch is the same). A
        variable-length chunk is decoded now; if its size is not the one last
        reported, the kernel's idea of the size is stale, so this open bypasses
        the page cache (``direct_io``)."""
        ds = await self.tree.dataset(self.op)
        epoch = await self.tree.data_epoch(self.op, ds)
        keep = self.tree.keep_pages(self.key, epoch)
        if ds.chunk_nbytes is not None:
            return BytesHandle(lambda: self._data(ds), keep_cache=keep)
        data = await self._data(ds)
        key = self._size_key(epoch)
        reported = self.tree.memo.get(key, ds)
        self.tree.memo.put(key, len(data), 16, ds)

        async def loaded() -> bytes:
            return data

        return BytesHandle(loaded, direct_io=reported != len(data), keep_cache=keep)
