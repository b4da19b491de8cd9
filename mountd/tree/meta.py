"""Metadata files: an object's sidecar and its Zarr v2 files, rendered.

Owns ``MetaFile``, a small file rendered whole from one object's metadata
(``P.json``, ``.root.json``, ``.zattrs``, ``.zarray``, ``.zgroup``), and the
renderers of each: the sidecar (``mountd.tree.sidecar``, with the keys the
registered views add, ``mountd.tree.viewctx.sidecar_keys``) and the Zarr
files (``mountd.tree.zarrmeta``).

A rendering's size is memoised with the object (and the domain, whose
metadata a root sidecar shows), in one entry for all the object's files at
one path, and with every other object it was derived from (what views read
through their context), for as long as the catalog hands out those same
instances: ``stat`` renders the content to learn its exact size, later
``stat`` calls reuse it, and ``open`` renders it again (from the same
objects, so to the same bytes).

Concurrency: nodes are immutable; two tasks that render at once both
render, and the second one's is kept (the memo's rule for pure derivations).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from layouts.model import AnyObject, Dataset
from mountd.errors import StorageError
from mountd.tree import sidecar, zarrmeta
from mountd.tree.nodes import BytesHandle, FileHandle, FileNode, NodeType, Stat
from mountd.tree.paths import SIDECAR, InDomain, ObjPath
from mountd.tree.viewctx import ObjectContext, sidecar_keys

if TYPE_CHECKING:
    from mountd.tree.core import Tree

ZGROUP_NAME = ".zgroup"
ZATTRS_NAME = ".zattrs"
ZARRAY_NAME = ".zarray"

#: What a renderer gives: the content, and the other objects it was derived
#: from, as (id, object).
Rendered = tuple[bytes, Sequence[tuple[str, AnyObject]]]
MetaRender = Callable[["Tree", ObjPath, AnyObject], Awaitable[Rendered]]
#: Rough bytes one object a rendering depends on costs in the memo.
_SEEN_BYTES = 64
#: Rough bytes the kept sizes of one object's metadata files cost in the memo
#: beyond the memo's own overhead (a small dict of up to four).
_SIZES_BYTES = 360

#: The kept sizes of an object's metadata files, by name: the size, or the
#: size and the other objects its rendering was derived from.
_Sizes = dict[str, int | tuple[int, tuple[tuple[str, AnyObject], ...]]]


class MetaFile(InDomain, FileNode):
    """A small file rendered from one object's metadata (``P.json``, ``.zattrs``...).

    Its size is exact: ``stat`` renders the content from the cached object and
    keeps its size, while the catalog returns the same objects; ``open``
    renders it again (tens of microseconds), so the memo holds a number per
    file, not its bytes, and a walk of 100,000 objects fits in it.
    """

    __slots__ = ("_render", "key", "name", "op", "tree")

    def __init__(self, tree: Tree, op: ObjPath, name: str, render: MetaRender) -> None:
        self.tree = tree
        self.op = op
        self.name = name
        self._render = render
        self.key: Hashable = ("meta", name, op.key)

    async def content(self) -> bytes:
        return await self._content(await self.tree.obj(self.op))

    async def _content(self, obj: AnyObject, sizes: _Sizes | None = None) -> bytes:
        """The rendering, its size kept (in ``sizes``, the object's kept sizes if
        the caller has them) with what it was derived from."""
        data, seen = await self._render(self.tree, self.op, obj)
        if sizes is None:
            sizes = self._sizes(obj)
        if seen:
            sizes[self.name] = (len(data), tuple(seen))
            self._keep(sizes, obj)  # again: its cost in the memo grew
        else:
            sizes[self.name] = len(data)
        return data

    def _sizes(self, obj: AnyObject) -> _Sizes:
        """The sizes kept for the metadata files of the object at this path
        (one memo entry for all of them), made empty if there are none."""
        sizes: _Sizes | None = self.tree.memo.get(("meta", self.op.key), obj, self.op.domain)
        if sizes is None:
            sizes = {}
            self._keep(sizes, obj)
        return sizes

    def _keep(self, sizes: _Sizes, obj: AnyObject) -> None:
        seen = sum(len(kept[1]) for kept in sizes.values() if type(kept) is tuple)
        self.tree.memo.put(("meta", self.op.key), sizes, _SIZES_BYTES + _SEEN_BYTES * seen,
                           obj, self.op.domain)

    async def _size(self, obj: AnyObject) -> int:
        sizes = self._sizes(obj)
        kept = sizes.get(self.name)
        if type(kept) is int:
            return kept
        if kept is not None and self.tree.all_fresh(self.op.domain, kept[1]):
            return kept[0]
        return len(await self._content(obj, sizes))

    async def stat(self) -> Stat:
        obj = await self.tree.obj(self.op)
        mtime, ctime = self.tree.times(self.op, obj)
        return Stat(NodeType.FILE, size=await self._size(obj), mtime=mtime, ctime=ctime)

    async def open(self) -> FileHandle:
        handle = BytesHandle(self.content)
        await handle.data()
        return handle


async def _render_sidecar(tree: Tree, op: ObjPath, obj: AnyObject) -> Rendered:
    domain = op.domain if not op.names else None
    ctx = ObjectContext(tree, op, obj)
    views = await sidecar_keys(tree.sidecar_views, ctx)
    data = await sidecar.sidecar_bytes(obj, op.h5path, domain, tree.refs.resolver(op.domain),
                                       views)
    return data, ctx.seen


async def _render_zattrs(tree: Tree, op: ObjPath, obj: AnyObject) -> Rendered:
    return await zarrmeta.zattrs_bytes(obj, op.h5path, tree.refs.resolver(op.domain)), ()


async def _render_zarray(tree: Tree, op: ObjPath, obj: AnyObject) -> Rendered:
    if not isinstance(obj, Dataset):
        raise StorageError(op.h5path, "not a dataset")
    return zarrmeta.zarray_bytes(obj), ()


async def _render_zgroup(tree: Tree, op: ObjPath, obj: AnyObject) -> Rendered:
    return zarrmeta.ZGROUP, ()


def sidecar_file(tree: Tree, op: ObjPath) -> MetaFile:
    return MetaFile(tree, op, SIDECAR, _render_sidecar)


def zattrs_file(tree: Tree, op: ObjPath) -> MetaFile:
    return MetaFile(tree, op, ZATTRS_NAME, _render_zattrs)


def zgroup_file(tree: Tree, op: ObjPath) -> MetaFile:
    return MetaFile(tree, op, ZGROUP_NAME, _render_zgroup)


def zarray_file(tree: Tree, op: ObjPath) -> MetaFile:
    return MetaFile(tree, op, ZARRAY_NAME, _render_zarray)
