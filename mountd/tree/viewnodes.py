"""The nodes of views: the ``P<suffix>`` files conventions show.

Owns ``ViewFileNode`` (a view's file beside an object) and the handle of an
open view file, which closes its reader when the file is released;
``mountd.tree.viewsizes`` keeps the sizes views compute.

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

Concurrency: nodes are immutable; one size computation per entry runs at a
time (``mountd.tree.viewsizes``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from layouts.model import Dataset
from layouts.views import FileView, Reader
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


class ViewHandle(FileHandle):
    """An open view file: its reader, with the page-cache rules of the tree."""

    def __init__(self, reader: Reader, *, direct_io: bool, keep_cache: bool) -> None:
        self.reader = reader
        self.direct_io = direct_io
        self.keep_cache = keep_cache

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        return await self.reader.read(offset, size)

    def close(self) -> None:
        self.reader.close()


class ViewFileNode(InDomain, FileNode):
    """The file ``P<suffix>`` a view shows for the object at ``op``."""

    __slots__ = ("key", "op", "tree", "view")

    def __init__(self, tree: Tree, op: ObjPath, view: FileView) -> None:
        self.tree = tree
        self.op = op
        self.view = view
        self.key: Hashable = ("view", op.key, view.suffix)

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

    @property
    def _record(self) -> tuple[str, str]:
        """The file's name on disk (``mountd.tree.sizerecords``) and its view's."""
        return (f"{self.op.domain.path}{self.op.h5path}{self.view.suffix}",
                f"{type(self.view).__module__}.{type(self.view).__qualname__}")

    async def stat(self) -> Stat:
        ctx, file = await self._file()
        size = file.known_size(ctx)
        if size is None:
            size = await self.tree.view_sizes.size(self._size_key, ctx, file, self._record)
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
        (``Tree.keep_pages``: for a view of a dataset's own data, while that
        data is unchanged); a file sized only now is read past them."""
        ctx, file = await self._file()
        sized_now = False
        if file.known_size(ctx) is None and \
                self.tree.view_sizes.kept(self._size_key, ctx) is None:
            await self.tree.view_sizes.size(self._size_key, ctx, file, self._record)
            sized_now = True
        obj = ctx.obj
        # A view of one dataset's data keeps its pages while that data is unchanged.
        epoch = await self.tree.data_epoch(self.op, obj) \
            if file.own_data and isinstance(obj, Dataset) else None
        keep = self.tree.keep_pages(self.key, epoch)
        return ViewHandle(await file.open(ctx), direct_io=sized_now, keep_cache=keep)
