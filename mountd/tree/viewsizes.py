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


@dataclass(frozen=True, slots=True)
class _Record:
    """Where one view file's size is recorded: its name and view, the dataset
    and its version, and the validator the size is kept under."""

    name: str
    view: str
    ds: Dataset
    version: bytes
    validator: str


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
                recorded = await self._record_of(ctx, record)
                if recorded is not None:
                    size = await self._recorded(ctx, recorded)
                size = size if size is not None else await self._count(ctx, file, recorded)
                self._keep(key, ctx, size)
        finally:
            del self._sizing[key]
            done.set()
        return size

    async def _count(self, ctx: ObjectContext, file: ViewFile, recorded: _Record | None) -> int:
        """Size ``file`` now, and record the size (with the counts of its blocks,
        ``mountd.tree.blockcounts``) where it rests on its own data."""
        if recorded is None:
            return await file.size(ctx)
        book = BlockBook(self._records, ctx, recorded.name,
                         self._records.blocks_validator(recorded.view, recorded.ds),
                         recorded.version)
        ctx.block_counts = book
        try:
            size = await file.size(ctx)
        finally:
            ctx.block_counts = None
        if self._own_data(ctx):
            await book.save()
            await self._records.save(recorded.name, recorded.validator, size)
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

    async def _record_of(self, ctx: ObjectContext, record: tuple[str, str] | None
                         ) -> _Record | None:
        """Where a size of ``record``'s view over the context's dataset is recorded
        now, under the dataset's version (``Tree.data_version``); None when no
        size of it is."""
        ds = ctx.obj
        if record is None or not isinstance(ds, Dataset):
            return None
        version = await self._fresh.data_version(ctx.op, ds)
        if version is None:
            return None
        name, view = record
        return _Record(name, view, ds, version, self._records.validator(view, ds, version))

    async def _recorded(self, ctx: ObjectContext, recorded: _Record) -> int | None:
        """The size recorded, noted as read from the dataset's data epoch now."""
        size = await self._records.load(recorded.name, recorded.validator)
        if size is not None:
            await ctx.note_read(recorded.ds)
        return size
