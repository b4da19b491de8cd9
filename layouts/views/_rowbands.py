"""Chunk-row bands: the chunk rows of a sequential ``.npy`` reader, held by it.

Owns ``ChunkRows``, used by one ``NpyReader`` (``layouts.views._npy``). A
``.npy`` is in C order, so a read of whole rows crosses every chunk of its
*chunk row* (the chunks sharing one index of the first grid dimension), and a
sequential reader asks for each chunk row in many small bands of rows. When
the mount's chunk cache cannot hold a chunk row (``ViewContext.cache_holds``,
which also logs that once per dataset), each of those bands would decode
every chunk of the row again. Instead the reader decodes the row once,
through the chunk cache, into a *band* of its own: the C-order elements of
the row's rows, in memory leased from the mount's budget
(``ViewContext.lease``: the band's array is made in the lease's ``buffer``),
filled by ``WORKERS`` tasks that each ask for ``GROUP_BYTES / WORKERS`` of
chunks at a time and copy them in, so decoding does not wait for the
copies. Its reads are then slices of the band.
While it reads chunk row ``k`` it assembles ``k + 1`` in the background, as
the chunk cache's prefetch would have, and it keeps ``k - 1`` until its
reads are ``BEHIND`` bytes (at most a band) past it, since the kernel's
requests may arrive a little out of order; it never drops a band reads are
waiting on. A band left behind leaves its memory to the next one (fresh
memory costs page faults, and on some VMs far more). So one pass decodes
each chunk once, and a reader holds at most three bands' memory (the third
only for the first ``BEHIND`` bytes of each row, or as the spare).

Which reads use bands: a read that starts a chunk row, or continues from
the chunk row of the reader's previous read (or the one after it), starts
the bands it needs; any read is served from the bands already held. A read
across more than two chunk rows is not. A band is not used (the read goes
the ordinary way, through the chunk cache) when its lease is refused (the
budget is short, or one band is more than all of it), when the mount took
the lease back or it went stale (``metadata_ttl``), or when assembling it
failed: the ordinary read then raises the unreadable chunk's error for the
reads that need it, and no others.

Concurrency: the reader's bands change only in synchronous code with no
``await``. Each band is assembled by one task (and its workers) in the
context's nursery (none: no bands), once every chunk of the band before it
has been asked for; reads wait on its event. ``close``, or the mount
taking a lease back (``reclaim``, between awaits), drops a band: its task is
cancelled and its lease released, and reads already waiting on it go the
ordinary way.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio

from layouts.errors import LayoutError, report_unexpected
from layouts.model import ChunkIndex, Dataset
from layouts.views._api import Lease, ViewContext
from layouts.views._arrays import chunks_of_box, fill_box

log = logging.getLogger(__name__)

#: Decoded bytes of the chunks asked for at once while a band is assembled
#: (at least one chunk per worker): what it holds besides the band.
GROUP_BYTES = 16 << 20
#: Tasks asking for a band's chunks at once.
WORKERS = 4
#: How far a reader's requests may trail its newest one: the band before is
#: kept until the reads are this many bytes (at most a band) past it.
BEHIND = 8 << 20


@dataclass(eq=False, slots=True)
class _Room:
    """Memory leased for one band at a time, and the array made in it."""

    lease: Lease | None = None
    array: np.ndarray | None = None


@dataclass(eq=False, slots=True)
class _Band:
    """Chunk row ``row``: elements ``[start, stop)`` of the array, in C order."""

    row: int
    start: int
    stop: int
    room: _Room
    ready: trio.Event = field(default_factory=trio.Event)
    #: Set once every chunk of the band has been asked for.
    asked: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: The elements, once assembled (None until then, or if that failed).
    data: np.ndarray | None = None
    #: Reads given this band that have not taken their elements yet.
    waiting: int = 0


class ChunkRows:
    """The chunk-row bands of one reader of ``ds`` (at least one dimension);
    elements are ``item``, unstored ones ``fill``."""

    def __init__(self, ctx: ViewContext, ds: Dataset, item: np.dtype[Any], fill: Any) -> None:
        shape = ds.shape or ()
        self.ctx = ctx
        self.ds = ds
        self.item = item
        self.fill = fill
        #: Rows, elements per row, rows per chunk row, chunk rows, chunks per chunk row.
        self.length = shape[0]
        self.inner = math.prod(shape[1:])
        self.rows = ds.chunks[0]
        self.count = -(-self.length // self.rows)
        self.per_row = math.prod(-(-s // c) for s, c in zip(shape[1:], ds.chunks[1:],
                                                              strict=True))
        self.behind = min(BEHIND // item.itemsize, self.rows * self.inner)
        self._bands: dict[int, _Band] = {}
        #: The room of the last band left behind, for the next band (fresh
        #: memory costs page faults, and on some VMs far more).
        self._spare: _Room | None = None
        #: The chunk row of the previous read.
        self._last: int | None = None
        #: Whether the chunk cache holds a chunk row (asked at the first read that could use bands).
        self._cache_holds: bool | None = None

    def span(self, row: int) -> tuple[int, int]:
        """Elements ``[start, stop)`` of chunk row ``row``."""
        first = row * self.rows
        return first * self.inner, min(first + self.rows, self.length) * self.inner

    def claim(self, e0: int, e1: int) -> list[_Band] | None:
        """The bands that serve elements ``[e0, e1)`` (a non-empty range),
        started now if this read may start them; None: the read goes the
        ordinary way. Synchronous: what it decides holds for concurrent reads."""
        k0, k1 = e0 // self.inner // self.rows, (e1 - 1) // self.inner // self.rows
        if k1 - k0 > 1:
            return None
        last, self._last = self._last, k1
        sequential = e0 == self.span(k0)[0] or (last is not None and k0 - 1 <= last <= k1)
        if sequential and not self._use_bands():
            return None
        bands: list[_Band] = []
        for row in range(k0, k1 + 1):
            band = self._held(row)
            if band is None and sequential:
                band = self._start(row)
            if band is None:
                return None
            bands.append(band)
        if sequential:
            self._move_on(e0, k0, k1)
        for band in bands:
            band.waiting += 1
        return bands

    async def elements(self, bands: list[_Band], e0: int, e1: int) -> np.ndarray | None:
        """Elements ``[e0, e1)`` from ``bands`` (what ``claim`` gave), once they
        are assembled; None if one of them could not be."""
        try:
            for band in bands:
                await band.ready.wait()
        finally:
            for band in bands:
                band.waiting -= 1
        parts = []
        for band in bands:
            lease = band.room.lease
            if band.data is None or lease is None:
                return None
            lease.touch()
            parts.append(band.data[max(e0, band.start) - band.start:
                                   min(e1, band.stop) - band.start])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def close(self) -> None:
        """Drop every band and the spare room: no read follows."""
        for band in list(self._bands.values()):
            self._drop(band)
        self._keep_spare(None)

    def _use_bands(self) -> bool:
        """Whether this reader may hold bands: the chunk cache cannot hold a
        chunk row, and background work may run."""
        if self._cache_holds is None:
            self._cache_holds = self.ctx.cache_holds(self.ds, self.per_row)
        return not self._cache_holds and self.ctx.nursery is not None

    def _held(self, row: int) -> _Band | None:
        """The band of ``row`` if it is held and may serve (assembling counts)."""
        band = self._bands.get(row)
        if band is None or band.room.lease is None:
            return None
        if band.ready.is_set() and (band.data is None or not band.room.lease.fresh()):
            self._drop(band)
            return None
        return band

    def _start(self, row: int) -> _Band | None:
        """Lease and start assembling the band of ``row`` (once the band before
        it, if it is being assembled, has asked for all its chunks); None if
        no lease is given."""
        nursery = self.ctx.nursery
        if nursery is None:
            return None
        start, stop = self.span(row)
        room = self._spare
        if room is not None and room.array is not None and room.array.size >= stop - start \
                and room.lease is not None and room.lease.fresh():
            self._spare = None
        else:
            self._keep_spare(None)
            room = _Room()
            room.lease = self.ctx.lease((stop - start) * self.item.itemsize,
                                        lambda: self._lost(room))
            if room.lease is None:
                return None
        band = _Band(row, start, stop, room)
        self._bands[row] = band
        before = self._bands.get(row - 1)
        nursery.start_soon(self._assemble, band,
                           before.asked if before is not None else None)
        return band

    def _move_on(self, e0: int, k0: int, k1: int) -> None:
        """A sequential read of chunk rows ``k0..k1`` from element ``e0``: drop
        the bands it has left behind (the one before ``k0`` once ``behind``
        elements past it) and any far ahead, unless reads are waiting on
        them; then start the next row's."""
        for band in list(self._bands.values()):
            if not band.waiting and (band.row < k0 - 1 or band.row > k1 + 1 or
                                     (band.row == k0 - 1 and e0 - band.stop >= self.behind)):
                self._drop(band, spare=band.data is not None)
        after = k1 + 1
        if after < self.count and self._held(after) is None:
            self._start(after)

    def _drop(self, band: _Band, spare: bool = False) -> None:
        """Forget ``band``: cancel its assembly, and release its lease, or with
        ``spare`` keep its room for the next band (no read holds its elements:
        they are copied out before any other task runs)."""
        if self._bands.get(band.row) is band:
            del self._bands[band.row]
        band.scope.cancel()
        if spare:
            self._keep_spare(band.room)
        elif band.room.lease is not None:
            band.room.lease.release()

    def _keep_spare(self, room: _Room | None) -> None:
        """Make ``room`` the spare one, releasing the one before."""
        if self._spare is not None and self._spare.lease is not None:
            self._spare.lease.release()
        self._spare = room

    def _lost(self, room: _Room) -> None:
        """The mount took ``room``'s lease back: drop what is in it."""
        if self._spare is room:
            self._spare = None
        for band in list(self._bands.values()):
            if band.room is room:
                self._drop(band)

    async def _assemble(self, band: _Band, before: trio.Event | None) -> None:
        """Fill ``band`` (in the nursery); on failure leave it without data."""
        try:
            with band.scope:
                if before is not None:
                    await before.wait()
                band.data = await self._gather(band)
        except LayoutError as exc:
            log.debug("band of chunk row %d of %s not assembled: %s", band.row, self.ctx.path, exc)
        except Exception as exc:
            report_unexpected(f"chunk-row band of {self.ctx.path}", exc)
        finally:
            band.asked.set()
            band.ready.set()

    async def _gather(self, band: _Band) -> np.ndarray:
        """The elements of ``band``, from the chunks of its chunk row: ``WORKERS``
        tasks each ask for a group of them and copy it in, then the next."""
        shape, chunks = self.ds.shape or (), self.ds.chunks
        r0, r1 = band.start // self.inner, band.stop // self.inner
        box = (r0, *(0,) * (len(shape) - 1)), (r1, *shape[1:])
        room = band.room
        if room.array is None:
            assert room.lease is not None
            room.array = np.frombuffer(room.lease.buffer(), dtype=self.item)
        out = room.array[:band.stop - band.start]
        rows = out.reshape(r1 - r0, *shape[1:])
        nbytes = self.ds.chunk_elements * self.item.itemsize
        indices = list(chunks_of_box(box, chunks))
        step = max(1, GROUP_BYTES // WORKERS // max(1, nbytes))
        groups = iter(range(0, len(indices), step))
        failed: list[LayoutError] = []

        async def worker(scope: trio.CancelScope) -> None:
            for at in groups:
                group = indices[at:at + step]
                if at + step >= len(indices):
                    band.asked.set()
                try:
                    for index, data in zip(group, await self.ctx.chunks(self.ds, group),
                                           strict=True):
                        if data is not None and len(data) != nbytes:
                            raise self.ctx.error(f"chunk has {len(data)} bytes, "
                                                 f"expected {nbytes}")
                        self._copy(rows, box, index,
                                   None if data is None else np.frombuffer(data, self.item))
                except LayoutError as exc:
                    failed.append(exc)
                    scope.cancel()
                    return

        async with trio.open_nursery() as nursery:
            for _ in range(min(WORKERS, -(-len(indices) // step))):
                nursery.start_soon(worker, nursery.cancel_scope)
        if failed:
            raise failed[0]
        return out

    def _copy(self, rows: np.ndarray, box: tuple[tuple[int, ...], tuple[int, ...]],
              index: ChunkIndex, chunk: np.ndarray | None) -> None:
        """Copy the part of chunk ``index`` (flat elements; None: the fill value)
        inside ``box`` into ``rows``, the elements of ``box``."""
        chunks = self.ds.chunks
        lo = tuple(max(a, i * c) for a, i, c in zip(box[0], index, chunks, strict=True))
        hi = tuple(min(b, (i + 1) * c) for b, i, c in zip(box[1], index, chunks, strict=True))
        dest = rows[tuple(slice(x - a, y - a) for x, y, a in zip(lo, hi, box[0], strict=True))]
        fill_box(dest, (lo, hi), chunks,
                 {index: None if chunk is None else chunk.reshape(chunks)}, self.fill)
