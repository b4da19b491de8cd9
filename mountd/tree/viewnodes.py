"""The nodes of views: the ``P<suffix>`` files conventions show.

Owns ``ViewFileNode`` (a view's file beside an object), the handle of an
open view file, and ``ViewSizes``, which keeps the sizes views compute.

Every operation reads the object afresh, makes a context for it
(``mountd.tree.viewctx``) and asks the view whether it still applies: an
object that changed so that it no longer has the view gives EIO.

Sizes (docs/CONTRACT.md, "File attributes"): a file with a ``known_size`` is
exact at once, in listings too. Any other is sized by the view on its first
``stat`` or ``open`` and the size kept in the memo with the object and with
every object the view read through the context, for as long as the catalog
hands out those same instances. A listing gives the kept size, or 0, as a
stand-in (``exact`` False: the kernel keeps it for no time, so the next
``stat`` asks), since the listing's own rows may be kept longer than the
objects a size was derived from. An ``open`` that had to size the file
bypasses the page cache (``direct_io``): the kernel may hold a stand-in.

Concurrency: nodes are immutable. One size computation per entry runs at a
time: ``ViewSizes`` keeps an event per entry being sized, registered with no
``await`` between the check and the insert; others wait for it and then
read the kept size (or compute it themselves if it failed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import trio

from layouts.model import AnyObject, Domain
from layouts.views import FileView, Reader, ViewFile
from mountd.cache.memo import Memo
from mountd.errors import StorageError
from mountd.tree.nodes import (
    FileHandle,
    FileNode,
    NodeType,
    Stat,
)
from mountd.tree.paths import InDomain, ObjPath
from mountd.tree.viewctx import ObjectContext

if TYPE_CHECKING:
    from mountd.tree.core import Tree

#: Rough bytes one object a kept size depends on costs in the memo.
_SEEN_BYTES = 64

AllFresh = Callable[[Domain, Sequence[tuple[str, AnyObject]] | None], bool]


class ViewSizes:
    """The sizes of view files, computed once and kept while current."""

    def __init__(self, memo: Memo, all_fresh: AllFresh) -> None:
        self._memo = memo
        self._all_fresh = all_fresh
        self._sizing: dict[Hashable, trio.Event] = {}

    def kept(self, key: Hashable, ctx: ObjectContext) -> int | None:
        """The size kept under ``key``, if everything it came from is current."""
        kept: tuple[int, list[tuple[str, AnyObject]]] | None = self._memo.get(key, ctx.obj)
        if kept is None or not self._all_fresh(ctx.op.domain, kept[1]):
            return None
        return kept[0]

    async def size(self, key: Hashable, ctx: ObjectContext, file: ViewFile) -> int:
        """The exact size of ``file``: kept, or computed now and kept."""
        while (pending := self._sizing.get(key)) is not None:
            await pending.wait()
        size = self.kept(key, ctx)
        if size is not None:
            return size
        done = self._sizing[key] = trio.Event()
        try:
            size = await file.size(ctx)
            seen = list(ctx.seen)
            self._memo.put(key, (size, seen), 16 + _SEEN_BYTES * len(seen), ctx.obj)
        finally:
            del self._sizing[key]
            done.set()
        return size


class ViewHandle(FileHandle):
    """An open view file: its reader, with the page-cache rules of the tree."""

    def __init__(self, reader: Reader, *, direct_io: bool, keep_cache: bool) -> None:
        self.reader = reader
        self.direct_io = direct_io
        self.keep_cache = keep_cache

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        return await self.reader.read(offset, size)


class ViewFileNode(InDomain, FileNode):
    """The file ``P<suffix>`` a view shows for the object at ``op``."""

    def __init__(self, tree: Tree, op: ObjPath, view: FileView) -> None:
        self.tree = tree
        self.op = op
        self.view = view

    @functools.cached_property
    def key(self) -> Hashable:
        return ("view", self.op.key, self.view.suffix)

    async def _file(self) -> tuple[ObjectContext, FileView]:
        """A context for the object, and the view (EIO if the object no longer
        has the view)."""
        obj = await self.tree.obj(self.op)
        ctx = ObjectContext(self.tree, self.op, obj)
        if not await self.view.applies(ctx):
            raise StorageError(self.op.h5path, f"no longer shown as {self.view.suffix}")
        return ctx, self.view

    def _stat(self, ctx: ObjectContext, size: int, exact: bool = True) -> Stat:
        mtime, ctime = self.tree.times(self.op, ctx.obj)
        return Stat(NodeType.FILE, size=size, mtime=mtime, ctime=ctime, exact=exact)

    @property
    def _size_key(self) -> Hashable:
        return ("view size", self.op.key, self.view.suffix)

    async def stat(self) -> Stat:
        ctx, file = await self._file()
        size = file.known_size(ctx)
        if size is None:
            size = await self.tree.view_sizes.size(self._size_key, ctx, file)
        return self._stat(ctx, size)

    async def listed(self) -> Stat:
        ctx, file = await self._file()
        size = file.known_size(ctx)
        if size is not None:
            return self._stat(ctx, size)
        kept = self.tree.view_sizes.kept(self._size_key, ctx)
        return self._stat(ctx, kept or 0, exact=False)

    async def open(self) -> FileHandle:
        """The kernel keeps the file's pages while they are current
        (``Tree.keep_pages``); a file sized only now is read past them."""
        ctx, file = await self._file()
        sized_now = False
        if file.known_size(ctx) is None and \
                self.tree.view_sizes.kept(self._size_key, ctx) is None:
            await self.tree.view_sizes.size(self._size_key, ctx, file)
            sized_now = True
        keep = self.tree.keep_pages(self.key)
        return ViewHandle(await file.open(ctx), direct_io=sized_now, keep_cache=keep)
