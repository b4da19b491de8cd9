"""The view API: extra entries a convention shows beside an HDF5 object.

Owns the contract between the views in ``layouts.views`` (the generic ``.npy``
and table views, and the anndata and LEGEND conventions) and the tree that
shows them (``mountd.tree``). A convention is a module or subpackage defining
``View``s plus one line each in ``layouts.views._registry.VIEWS``; nothing in
``mountd`` changes. This module, and every convention, imports only
``layouts`` modules, the standard library, NumPy and trio, never ``mountd``.

For every object the tree shows, it asks each registered view whether it
applies (``View.applies``, async: it may look at the object's children). A
view that applies contributes:

* a file ``P<suffix>`` (a ``FileView``): an exact size and a ``Reader`` that
  produces any byte range on demand;
* and, with a ``sidecar_key``, that key in the object's sidecar
  (``View.sidecar``). A plain ``View`` with no suffix contributes only that.

``P<suffix>`` follows the naming rules (docs/CONTRACT.md, "Names") like any name: it is
escaped, and a real link of the same name wins.

A view sees the mount only through a ``ViewContext``, never the tree: the
object and where it was reached, other objects by path or reference,
decoded chunks through the mount's chunk cache (with background prefetch
and a readahead window), and the nursery for background work. Array reads built on it are in
``layouts.views._arrays``; a reader streamed from an async generator, with its size
counted by streaming, is in ``layouts.views._stream``, and one made of blocks of
array texts, sized from their lengths, in ``layouts.views._csvblock``.

Sizes: ``st_size`` is exact (docs/CONTRACT.md, "File attributes"). A file whose
size costs no I/O and follows from ``ctx.obj`` alone gives it from
``known_size``; any other computes it in ``size`` (by default by reading
the content through once). The tree calls ``size`` on the first ``stat`` or
``open`` and keeps the result while the object, and every object
``ctx.child`` or ``ctx.deref`` returned meanwhile, are current; a listing
gives a stand-in until then, which the kernel is told not to keep.

Errors: a view lets the context's errors through (an unreadable chunk, a
broken object) and raises ``ctx.error(reason)`` when the data is not what it
expects; either way the reader gets EIO and the log one line. A view that
stops applying to a changed object makes its entries give EIO.

Concurrency: a view is one stateless object shared by every task; what it
needs comes in the context, made afresh for each operation. A ``Reader``
serves one open file and may be read by several tasks at once: it changes
its own state with no ``await`` in between, or guards it with a lock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from layouts.model import AnyObject, ChunkIndex, Dataset, ObjectRef

#: Most chunks a reader starts ahead of one read, however small they are (the
#: mount's readahead of chunk files in grid order keeps the same bound).
AHEAD_CHUNKS = 32768
#: Bytes read at a time when a file's size is counted by reading it.
SIZE_STEP = 1 << 20


class Readahead(Protocol):
    """The sequential-read state of one reader: how far ahead to fetch."""

    def observe(self, offset: int, size: int) -> int:
        """Record a read of ``size`` bytes at ``offset``; how many bytes after
        it to fetch ahead (0 while the reads are not sequential)."""
        ...


class Lease(Protocol):
    """Memory a reader holds for itself outside the chunk cache, charged to
    the mount's budget until released (``ViewContext.lease``)."""

    def fresh(self) -> bool:
        """True while what the lease holds may be served: not taken back, and
        made in the mount's current period (``metadata_ttl``)."""
        ...

    def touch(self) -> None:
        """Record a use (one read served from it): a lease in use is not idle."""
        ...

    def buffer(self) -> bytearray | memoryview:
        """The leased memory: a writable buffer of the bytes leased, the same one
        on every call; it may hold what an earlier holder left in it."""
        ...

    def release(self) -> None:
        """Give the memory back (a second call does nothing)."""
        ...


class BlockCounts(Protocol):
    """The counts of a view file's blocks kept from an earlier count, for a
    file whose blocks are each made of some rows of the view's own dataset
    and nothing else (``ViewContext.block_counts``): a block's count stands
    while the stored chunks those rows lie in are unchanged."""

    async def get(self, ds: Dataset, start: int, stop: int) -> int | None:
        """The count kept for the block of rows ``[start, stop)`` of ``ds``
        (the context's object), if the chunks it came from are unchanged in
        storage since; else None."""
        ...

    def put(self, ds: Dataset, start: int, stop: int, count: int) -> None:
        """Keep the count of the block of rows ``[start, stop)`` of ``ds``,
        just counted (from chunks read after ``get`` was first called)."""
        ...


class ViewContext(Protocol):
    """What a view may see and do for one object, in one operation."""

    @property
    def obj(self) -> AnyObject:
        """The object the view is asked about."""
        ...

    @property
    def path(self) -> str:
        """Its HDF5 path as reached (a hard-linked object has several)."""
        ...

    @property
    def name(self) -> str:
        """Its link name: the last component of ``path`` ("" at a file's root)."""
        ...

    async def child(self, path: str) -> AnyObject | None:
        """The object at ``path`` from this one (``"codes"``, ``"obs/_index"``;
        absolute from the file's root), following hard and soft links; None if
        nothing is there. Raises if it is there but cannot be read."""
        ...

    async def deref(self, ref: ObjectRef) -> AnyObject | None:
        """The object an object reference (an attribute value) points to in
        this file; None if it does not resolve."""
        ...

    async def chunk(self, ds: Dataset, index: ChunkIndex) -> bytes | None:
        """One chunk file's bytes of ``ds`` (this object or one the context
        returned) through the chunk cache; None if it is not stored."""
        ...

    async def chunks(self, ds: Dataset, indices: Sequence[ChunkIndex]) -> list[bytes | None]:
        """Chunks of ``ds`` through the chunk cache, the missing ones read in
        batches: for each index its bytes or None. Raises the first error."""
        ...

    def prefetch(self, ds: Dataset, indices: Sequence[ChunkIndex]) -> int:
        """Start decoding chunks into the cache in the background; how many of
        ``indices`` (from the first) were accepted. The rest are for a later
        call to ask again."""
        ...

    def chunk_cost(self, ds: Dataset) -> int:
        """What one chunk of ``ds`` counts against a readahead window: its
        decoded bytes plus what the chunk cache spends on it."""
        ...

    def cache_holds(self, ds: Dataset, count: int) -> bool:
        """Whether the chunk cache holds ``count`` chunks of ``ds`` at once
        beside its readahead. When it does not, the mount logs that once per
        dataset, with the cache size that would."""
        ...

    def lease(self, nbytes: int, reclaim: Callable[[], None]) -> Lease | None:
        """``nbytes`` of the mount's budget for memory readers hold themselves,
        or None when it has no room. The mount may take an idle lease back
        for another reader: it then calls ``reclaim``, which must drop what
        the lease held, with no ``await``."""
        ...

    def readahead(self) -> Readahead:
        """A new readahead window for one reader, sized for this mount's chunk
        cache (one that never reads ahead when there is no room)."""
        ...

    @property
    def nursery(self) -> trio.Nursery | None:
        """Where background work may run; None: none may."""
        ...

    @property
    def block_counts(self) -> BlockCounts | None:
        """While a file of the view is being sized, where the counts of its
        blocks are kept between counts (the mount keeps them in memory and in
        ``cache_dir``); None when they are not."""
        ...

    def error(self, reason: str) -> Exception:
        """The exception to raise when the object's data is not what the view
        expects: EIO for the reader, logged once with the object's path."""
        ...


class Reader(ABC):
    """One open view file."""

    @abstractmethod
    async def read(self, offset: int, size: int) -> bytes | memoryview:
        """Up to ``size`` bytes at ``offset``; fewer only at the end of the file.
        A memoryview may be the reader's own buffer: it is copied before the
        reader is awaited again."""

    def close(self) -> None:  # noqa: B027 - most readers hold nothing to give back
        """The file is closed: give back what the reader holds (its leases,
        its background work). No read follows."""


class ViewFile(ABC):
    """A file a view shows, ``P<suffix>``. Its methods get the context of the
    view's object."""

    def known_size(self, ctx: ViewContext) -> int | None:
        """The exact size, when it costs no I/O and follows from ``ctx.obj``
        alone; None when ``size`` must compute it."""
        return None

    async def size(self, ctx: ViewContext) -> int:
        """The exact size of a file with no ``known_size``: by default the
        content is read through once, ``SIZE_STEP`` bytes at a time."""
        reader = await self.open(ctx)
        total = 0
        try:
            while True:
                got = len(await reader.read(total, SIZE_STEP))
                total += got
                if got < SIZE_STEP:
                    return total
        finally:
            reader.close()

    @abstractmethod
    async def open(self, ctx: ViewContext) -> Reader:
        """A reader of the content."""


class View(ABC):
    """What a convention recognises in one kind of object.

    Subclass ``FileView`` to show a file beside the object; subclass ``View``
    itself to contribute only a sidecar key.
    """

    #: The entry is ``P<suffix>``; None: no entry.
    suffix: str | None = None
    #: The key this view adds to the sidecar of the objects it applies to.
    sidecar_key: str | None = None

    @abstractmethod
    async def applies(self, ctx: ViewContext) -> bool:
        """True if the object gets this view. Asked for every object listed,
        so it should decide from the object itself where it can, and look at
        children only for objects that may qualify."""

    async def sidecar(self, ctx: ViewContext) -> Any:
        """The value of ``sidecar_key`` for an object this view applies to
        (JSON-like; ``ObjectRef``s become paths); None leaves the key out."""
        return None


class FileView(View, ViewFile):
    """A view shown as the file ``P<suffix>``.

    ``own_data`` is True for a view whose bytes derive from its object alone, a
    dataset's description and chunks (``P.npy``): the mount may then keep the
    file's pages for as long as that dataset is unchanged in storage, not only
    for one ``metadata_ttl`` period.
    """

    suffix: str
    own_data: bool = False
