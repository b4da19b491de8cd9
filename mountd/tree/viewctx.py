"""The view context: what a view sees of the mount for one object.

Owns ``ObjectContext``, the tree's implementation of
``layouts.views._api.ViewContext``, and the two ways the tree asks views about
an object without letting a view's failure spread: ``shows`` (does a view
apply, for a listing or a symlink) and ``sidecar_keys`` (the keys views add
to a sidecar). A context gives a view the object and its path, other
objects by path (``Links.resolve``) or reference (``RefIndex``), chunks
through the tree's chunk cache, a readahead window, leases of the tree's
held memory (``mountd.cache.held``) and the nursery; and it records every
object ``child`` and ``deref`` returned (``seen``), so what the tree
derives through it (a view file's size, a sidecar) is kept only while
those objects are current too, and the data epoch of every dataset whose
chunks it read (``read``), so a view file's size is kept only while that
data is unchanged too (``mountd.tree.viewsizes``).

Concurrency: a context is made for one operation (a listing entry, a stat,
an open, a render); its only mutable state is ``seen`` and ``read``, which
only grow, with no ``await`` between a fetch's end and its record. An open file's
reader keeps its context for the life of the handle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from layouts.model import AnyObject, ChunkIndex, Dataset, ObjectRef
from layouts.views import BlockCounts, Lease, Readahead, View
from mountd.cache.chunkahead import chunk_unit
from mountd.errors import MountError, StorageError, report_unexpected
from mountd.tree.paths import ObjPath, root_path

if TYPE_CHECKING:
    from mountd.tree.core import Tree

log = logging.getLogger(__name__)

#: The data epoch recorded for a dataset whose chunks were read in more than
#: one: equal to no epoch, so nothing derived from them is kept.
MIXED: Hashable = object()


class ObjectContext:
    """A view's context for the object at ``op``."""

    __slots__ = ("_obj", "_tree", "block_counts", "op", "read", "seen")

    def __init__(self, tree: Tree, op: ObjPath, obj: AnyObject) -> None:
        self._tree = tree
        self._obj = obj
        self.op = op
        #: The objects ``child`` and ``deref`` returned, as (id, object).
        self.seen: list[tuple[str, AnyObject]] = []
        #: Each dataset whose chunks were read, by id, with the data epoch they
        #: were read in (``MIXED`` if reads spanned more than one).
        self.read: dict[str, tuple[Dataset, Hashable]] = {}
        #: Where a view file's block counts are kept while it is sized
        #: (``mountd.tree.viewsizes`` sets it; ``mountd.tree.blockcounts``).
        self.block_counts: BlockCounts | None = None

    @property
    def obj(self) -> AnyObject:
        return self._obj

    @property
    def path(self) -> str:
        return self.op.h5path

    @property
    def name(self) -> str:
        return self.op.names[-1] if self.op.names else ""

    async def child(self, path: str) -> AnyObject | None:
        target = await self._tree.links.resolve(self.op, path)
        return None if target is None else await self._fetch(target)

    async def deref(self, ref: ObjectRef) -> AnyObject | None:
        path = await self._tree.refs.ref_path(self.op.domain, ref)
        if path is None:
            return None
        target = await self._tree.links.resolve(root_path(self.op.domain), path)
        return None if target is None else await self._fetch(target)

    async def _fetch(self, target: ObjPath) -> AnyObject:
        obj = await self._tree.obj(target)
        self.seen.append((target.id, obj))
        return obj

    async def note_read(self, ds: Dataset) -> None:
        """Record the data epoch ``ds``'s chunks are read in now (or, for a size
        kept on disk, the epoch of the data it stands for)."""
        epoch = await self._tree.data_epoch(self.op, ds)
        noted = self.read.get(ds.id)
        if noted is None:
            self.read[ds.id] = (ds, epoch)
        elif noted[1] != epoch:
            self.read[ds.id] = (ds, MIXED)

    async def chunk(self, ds: Dataset, index: ChunkIndex) -> bytes | None:
        await self.note_read(ds)
        return await self._tree.chunk(self.op, ds, index)

    async def chunks(self, ds: Dataset, indices: Sequence[ChunkIndex]) -> list[bytes | None]:
        await self.note_read(ds)
        out: list[bytes | None] = []
        for data in await self._tree.chunks(self.op, ds, indices):
            if isinstance(data, MountError):
                raise data
            out.append(data)
        return out

    def prefetch(self, ds: Dataset, indices: Sequence[ChunkIndex]) -> int:
        return self._tree.prefetch_chunks(self.op, ds, indices)

    def chunk_cost(self, ds: Dataset) -> int:
        return chunk_unit(ds)

    def cache_holds(self, ds: Dataset, count: int) -> bool:
        return self._tree.cache_holds(self.op, ds, count)

    def lease(self, nbytes: int, reclaim: Callable[[], None]) -> Lease | None:
        return self._tree.held.lease(nbytes, reclaim)

    def readahead(self) -> Readahead:
        return self._tree.readahead()

    @property
    def nursery(self) -> trio.Nursery | None:
        return self._tree.nursery

    def error(self, reason: str) -> Exception:
        return StorageError(self.op.h5path, reason)


async def shows(view: View, ctx: ObjectContext) -> bool:
    """Whether ``view`` applies to the context's object, for a listing: a view
    that cannot tell (a broken child, a bug in the view) does not, so the
    object's other entries are still shown."""
    try:
        return await view.applies(ctx)
    except MountError as exc:
        log.debug("view %s of %s left out: %s", view.suffix, ctx.path, exc)
    except Exception as exc:
        report_unexpected(f"view {type(view).__name__} of {ctx.path}", exc)
    return False


async def sidecar_keys(views: Sequence[View], ctx: ObjectContext) -> dict[str, Any]:
    """The keys ``views`` add to the context's object's sidecar: for each
    ``sidecar_key``, the value of the first view that applies and gives one.
    A view that fails leaves its key out; the rest of the sidecar stands."""
    keys: dict[str, Any] = {}
    for view in views:
        key = view.sidecar_key
        if key is None or key in keys or not await shows(view, ctx):
            continue
        try:
            value = await view.sidecar(ctx)
        except MountError as exc:
            log.debug("sidecar key %s of %s left out: %s", key, ctx.path, exc)
            continue
        except Exception as exc:
            report_unexpected(f"view {type(view).__name__} of {ctx.path}", exc)
            continue
        if value is not None:
            keys[key] = value
    return keys
