"""Chunk-row bands: the chunk rows of a sequential ``.npy`` reader, held by it.

Owns ``ChunkRows``, used by one ``NpyReader`` (``layouts.views._npy``). A
``.npy`` is in C order, so a read of whole rows crosses every chunk of its
*chunk row* (the chunks sharing one index of the first grid dimension), and a
sequential reader asks for each chunk row in many small bands of rows. When
the mount's chunk cache cannot hold a chunk row (``ViewContext.cache_holds``,
which also logs that once per dataset), each of those bands would decode
every chunk of the row again. Instead the reader decodes the row once,
``GROUP_BYTES`` of chunks at a time through the chunk cache, into a *band*
of its own: the C-order elements of the row's rows, in memory leased from
the mount's budget (``ViewContext.lease``). Its reads are then slices of
the band. While it reads chunk row ``k`` it assembles ``k + 1`` in the
background, as the chunk cache's prefetch would have, and it keeps ``k - 1``
until its reads are ``BEHIND`` bytes (at most a band) past it, since the
kernel's requests may arrive a little out of order; it never drops a band
reads are waiting on. So one pass decodes each chunk once, and a reader
holds at most three bands (the third only for the first ``BEHIND`` bytes of
each row).

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
``await``. Each band is assembled by one task in the context's nursery
(none: no bands), after the band before it; reads wait on its event.
``close``, or the mount taking a lease back (``reclaim``, between awaits),
drops a band: its task is cancelled and its lease released, and reads
already waiting on it go the ordinary way.
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
#: (at least one chunk): what it holds besides the band.
GROUP_BYTES = 16 << 20
#: How far a reader's requests may trail its newest one: the band before is
#: kept until the reads are this many bytes (at most a band) past it.
BEHIND = 8 << 20


@dataclass(eq=False, slots=True)
class _Band:
    """Chunk row ``row``: elements ``[start, stop)`` of the array, in C order."""

    row: int
    start: int
    stop: int
    lease: Lease | None = None
    ready: trio.Event = field(default_factory=trio.Event)
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
            if band.data is None or band.lease is None:
                return None
            band.lease.touch()
            parts.append(band.data[max(e0, band.start) - band.start:
                                   min(e1, band.stop) - band.start])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def close(self) -> None:
        """Drop every band: no read follows."""
        for band in list(self._bands.values()):
            self._drop(band)

    def _use_bands(self) -> bool:
        """Whether this reader may hold bands: the chunk cache cannot hold a
        chunk row, and background work may run."""
        if self._cache_holds is None:
            self._cache_holds = self.ctx.cache_holds(self.ds, self.per_row)
        return not self._cache_holds and self.ctx.nursery is not None

    def _held(self, row: int) -> _Band | None:
        """The band of ``row`` if it is held and may serve (assembling counts)."""
        band = self._bands.get(row)
        if band is None or band.lease is None:
            return None
        if band.ready.is_set() and (band.data is None or not band.lease.fresh()):
            self._drop(band)
            return None
        return band

    def _start(self, row: int) -> _Band | None:
        """Lease and start assembling the band of ``row`` (after the band before
        it, if that is still being assembled); None if no lease is given."""
        nursery = self.ctx.nursery
        if nursery is None:
            return None
        band = _Band(row, *self.span(row))
        band.lease = self.ctx.lease((band.stop - band.start) * self.item.itemsize,
                                    lambda: self._drop(band))
        if band.lease is None:
            return None
        self._bands[row] = band
        before = self._bands.get(row - 1)
        nursery.start_soon(self._assemble, band,
                           before if before is not None and not before.ready.is_set() else None)
        return band

    def _move_on(self, e0: int, k0: int, k1: int) -> None:
        """A sequential read of chunk rows ``k0..k1`` from element ``e0``: drop
        the bands it has left behind (the one before ``k0`` once ``behind``
        elements past it) and any far ahead, unless reads are waiting on
        them; then start the next row's."""
        for band in list(self._bands.values()):
            if not band.waiting and (band.row < k0 - 1 or band.row > k1 + 1 or
                                     (band.row == k0 - 1 and e0 - band.stop >= self.behind)):
                self._drop(band)
        after = k1 + 1
        if after < self.count and self._held(after) is None:
            self._start(after)

    def _drop(self, band: _Band) -> None:
        """Forget ``band``: cancel its assembly, release its lease. Reads that
        already have its elements keep them."""
        if self._bands.get(band.row) is band:
            del self._bands[band.row]
        band.scope.cancel()
        if band.lease is not None:
            band.lease.release()

    async def _assemble(self, band: _Band, before: _Band | None) -> None:
        """Fill ``band`` (in the nursery); on failure leave it without data."""
        try:
            with band.scope:
                if before is not None:
                    await before.ready.wait()
                band.data = await self._gather(band)
        except LayoutError as exc:
            log.debug("band of chunk row %d of %s not assembled: %s", band.row, self.ctx.path, exc)
        except Exception as exc:
            report_unexpected(f"chunk-row band of {self.ctx.path}", exc)
        finally:
            band.ready.set()

    async def _gather(self, band: _Band) -> np.ndarray:
        """The elements of ``band``, from the chunks of its chunk row, asked for
        ``GROUP_BYTES`` at a time and copied in as they come."""
        shape, chunks = self.ds.shape or (), self.ds.chunks
        r0, r1 = band.start // self.inner, band.stop // self.inner
        start, stop = (r0, *(0,) * (len(shape) - 1)), (r1, *shape[1:])
        out = np.empty(band.stop - band.start, dtype=self.item)
        rows = out.reshape(r1 - r0, *shape[1:])
        nbytes = self.ds.chunk_elements * self.item.itemsize
        indices = list(chunks_of_box((start, stop), chunks))
        step = max(1, GROUP_BYTES // max(1, nbytes))
        for at in range(0, len(indices), step):
            group = indices[at:at + step]
            for index, data in zip(group, await self.ctx.chunks(self.ds, group), strict=True):
                if data is not None and len(data) != nbytes:
                    raise self.ctx.error(f"chunk has {len(data)} bytes, expected {nbytes}")
                self._copy(rows, (start, stop), index,
                           None if data is None else np.frombuffer(data, self.item))
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
