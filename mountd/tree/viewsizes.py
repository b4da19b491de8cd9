"""The sizes of view files: computed once per entry and kept while current.

Owns ``ViewSizes``, which the tree makes over its memo and itself
(``Tree.view_sizes``) and the view file nodes (``mountd.tree.viewnodes``)
ask. A size is kept in the memo with the object, with every object the
view read through the context (``ObjectContext.seen``) and with the data
epoch of every dataset whose chunks it read (``ObjectContext.read``). It is
served for as long as the catalog hands out those same instances and each
of those datasets is in the same data epoch: a table whose chunks are
rewritten in storage, its description unchanged, is counted again once
``metadata_ttl`` has run out, so its size and its bytes never disagree.

The size of a view that read nothing but its own dataset is also recorded
under the dataset's version (``mountd.tree.sizerecords``: in memory, and
with ``-o cache_dir`` on disk), so a later period that serves new
instances of unchanged objects, or a later mount, takes it from there
instead of counting (a count that outlasts ``metadata_ttl`` is not thrown
away); a file made of blocks of its rows also has its blocks' counts
recorded (``mountd.tree.blockcounts``), so a changed dataset costs a count
of the blocks whose chunks changed.

Concurrency: one size computation per entry runs at a time: ``ViewSizes``
keeps an event per entry being sized, registered with no ``await`` between
the check and the insert; others wait for it and then read the kept size
(or compute it themselves if it failed).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from layouts.model import AnyObject, Dataset, Domain
from layouts.views import ViewFile
from mountd.cache.memo import Memo
from mountd.tree.blockcounts import BlockBook
from mountd.tree.paths import ObjPath
from mountd.tree.sizerecords import SizeRecords
from mountd.tree.viewctx import MIXED, ObjectContext

#: Rough bytes one object or dataset a kept size depends on costs in the memo.
_SEEN_BYTES = 64


class Freshness(Protocol):
    """What tells whether the objects and data a size came from are current
    (``mountd.tree.core.Tree``)."""

    def all_fresh(self, domain: Domain, objects: Sequence[tuple[str, AnyObject]] | None
                  ) -> bool: ...

    def known_data_epoch(self, op: ObjPath, ds: Dataset) -> Hashable | None: ...

    async def data_epoch(self, op: ObjPath, ds: Dataset) -> Hashable: ...

    async def data_version(self, op: ObjPath, ds: Dataset) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class _Kept:
    size: int
    seen: list[tuple[str, AnyObject]]
    #: Each dataset read, with the data epoch its chunks were read in.
    read: tuple[tuple[Dataset, Hashable], ...]


class ViewSizes:
    """The sizes of view files, computed once and kept while current."""

    def __init__(self, memo: Memo, fresh: Freshness, records: SizeRecords) -> None:
        self._memo = memo
        self._fresh = fresh
        self._records = records
        self._sizing: dict[Hashable, trio.Event] = {}

    def _entry(self, key: Hashable, ctx: ObjectContext) -> _Kept | None:
        """The entry kept under ``key`` if the objects it came from are current."""
        kept: _Kept | None = self._memo.get(key, ctx.obj)
        if kept is None or not self._fresh.all_fresh(ctx.op.domain, kept.seen):
            return None
        return kept

    def kept(self, key: Hashable, ctx: ObjectContext) -> int | None:
        """The size kept under ``key``, if everything it came from is known to be
        current now, with no I/O (a dataset whose data epoch this period has not
        learnt yet counts as changed)."""
        kept = self._entry(key, ctx)
        if kept is None:
            return None
        known = self._fresh.known_data_epoch
        if any(known(ctx.op, ds) != epoch for ds, epoch in kept.read):
            return None
        return kept.size

    async def _current(self, key: Hashable, ctx: ObjectContext) -> int | None:
        """The size kept under ``key``, if everything it came from is current,
        learning the data epochs of this period where needed."""
        kept = self._entry(key, ctx)
        if kept is None:
            return None
        for ds, epoch in kept.read:
            if await self._fresh.data_epoch(ctx.op, ds) != epoch:
                return None
        return kept.size

    async def size(self, key: Hashable, ctx: ObjectContext, file: ViewFile,
                   record: tuple[str, str] | None = None) -> int:
        """The exact size of ``file``: kept, or computed now and kept. ``record``
        names it among the records, with the view it is a file of (see the module
        docstring)."""
        while (pending := self._sizing.get(key)) is not None:
            await pending.wait()
        done = self._sizing[key] = trio.Event()
        try:
            size = await self._current(key, ctx)
            if size is None:
                version = await self._version(ctx, record)
                if record is not None and version is not None:
                    size = await self._recorded(ctx, record, version)
                size = size if size is not None else await self._count(ctx, file, record, version)
                self._keep(key, ctx, size)
        finally:
            del self._sizing[key]
            done.set()
        return size

    async def _count(self, ctx: ObjectContext, file: ViewFile, record: tuple[str, str] | None,
                     version: bytes | None) -> int:
        """Size ``file`` now, and record the size (with the counts of its blocks,
        ``mountd.tree.blockcounts``) where it rests on its own data."""
        obj = ctx.obj
        if record is None or version is None or not isinstance(obj, Dataset):
            return await file.size(ctx)
        name, view = record
        book = BlockBook(self._records, ctx, name, self._records.blocks_validator(view, obj),
                         version)
        ctx.block_counts = book
        try:
            size = await file.size(ctx)
        finally:
            ctx.block_counts = None
        if self._own_data(ctx):
            await book.save()
            await self._records.save(name, self._records.validator(view, obj, version), size)
        return size

    def _keep(self, key: Hashable, ctx: ObjectContext, size: int) -> None:
        kept = _Kept(size, list(ctx.seen), tuple(ctx.read.values()))
        self._memo.put(key, kept, 16 + _SEEN_BYTES * (len(kept.seen) + len(kept.read)),
                       ctx.obj)

    @staticmethod
    def _own_data(ctx: ObjectContext) -> bool:
        """True if the view read its own dataset's chunks and nothing else, all
        in one data epoch (a count that outlived a change to storage is not
        recorded under the version it started from)."""
        return not ctx.seen and list(ctx.read) == [ctx.obj.id] and \
            ctx.read[ctx.obj.id][1] is not MIXED

    async def _version(self, ctx: ObjectContext, record: tuple[str, str] | None
                       ) -> bytes | None:
        """The version of the context's dataset that records of ``record``'s view
        are kept under now (``Tree.data_version``); None when none are."""
        if record is None or not isinstance(ctx.obj, Dataset):
            return None
        return await self._fresh.data_version(ctx.op, ctx.obj)

    async def _recorded(self, ctx: ObjectContext, record: tuple[str, str],
                        version: bytes) -> int | None:
        """The size recorded, noted as read from the dataset's data epoch now."""
        assert isinstance(ctx.obj, Dataset)
        name, view = record
        size = await self._records.load(name, self._records.validator(view, ctx.obj, version))
        if size is not None:
            await ctx.note_read(ctx.obj)
        return size
