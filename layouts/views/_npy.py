"""``P.npy``: a whole dataset as a NumPy ``.npy`` file, read chunk by chunk.

A view on the view API (``layouts.views._api``), registered in
``layouts.views._registry``: every dataset of fixed-size type with a dataspace gets
``P.npy``, whose size follows from the dataset alone (``known_size``).

Owns the NPY header of a dataset and the mapping from a byte range of the
file to the chunks it touches. A read is split into at most ``2*ndim-1``
boxes of the array (a C-order run of elements is a few hyper-rectangles);
only the chunks intersecting those boxes are fetched, all with one batch
call to the mount's decoded-chunk cache (``ViewContext.chunks``: misses
are read many chunks per store call, never one task per chunk), and copied
out with NumPy. When chunks hold whole rows (every dimension but the first is whole,
as in 1-D datasets of many tiny chunks), each chunk is one C-order run and
the read is the needed parts of its chunks joined, with no per-chunk NumPy
work. Otherwise, when a row (one index of the first dimension) is at most
``BAND_ROW_BYTES``, a read gathers whole rows, one box: a sequential reader
gathers a band of the rows its readahead covers too (the ``BAND_BYTES`` from
the read's first element, rounded up to a whole row, cut at a chunk row) and
keeps that one band, so most of its reads are a slice of it, with no
per-chunk work at all. Chunks that are not stored read
as the fill value; a chunk that cannot be read fails the reads that need it
(EIO) and no others.

Chunk rows: when the chunk cache cannot hold one chunk row of the dataset,
a sequential reader decodes each chunk row once into memory of its own
(``layouts.views._rowbands``) and serves its reads from it, instead of
decoding every chunk again for each band of rows; it then prefetches
nothing through the chunk cache (its next chunk row is assembled in the
background instead). The rest of this docstring is the ordinary way, for
every other read.

Readahead: each reader has a readahead window from the context (about
1 MiB at first, doubling while the reads are sequential, up to a quarter of
the chunk cache, back to nothing after a jump). After each read, the chunks holding the
window's bytes after it are started in the background in grid (C) order
through the chunk cache, in batches, bounded by the window's bytes (each
chunk counting its cache entry's overhead too) and by ``AHEAD_CHUNKS``, so
fetching and decoding run ahead of the kernel's requests without a window
of tiny chunks meaning millions of them. A watermark (the first element not
yet covered by an accepted prefetch) makes a steady reader ask only for the
new part of the window, and not even that while the window moves inside
chunk rows whose every chunk it already asked for (``asked_row``).

Elements are copied as opaque ``V<itemsize>`` items, so every fixed-size
type (compound, strings, references) is moved byte for byte in the dataset's
own byte order.

Concurrency: a reader's only mutable state is its readahead window, its
watermark, its band and its chunk rows (see ``_rowbands``), each set with no
``await`` in between; concurrent reads of one reader are safe (the last band
gathered is the one kept). ``close`` gives back the chunk rows. A
band holds chunk bytes as they were when it was gathered, for as long as the
file stays open and the reads stay in it, as the kernel's page cache does.
The NPY headers of the dtypes and shapes in use are kept, one per pair
(``_header``), not one per dataset.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from layouts.model import ChunkIndex, Dataset
from layouts.views._api import AHEAD_CHUNKS, FileView, Reader, ViewContext
from layouts.views._arrays import Box, chunks_of_box, fill_box
from layouts.views._rowbands import ChunkRows

#: Rows (along the first dimension) at most this large are gathered whole: a
#: read's elements are then a slice of one box of whole rows, at most two rows
#: more than it asked for, instead of up to ``2*ndim-1`` boxes.
BAND_ROW_BYTES = 256 << 10
#: A sequential reader gathers about this many bytes of whole rows at once and
#: keeps them for its next reads: one band per open reader, memory outside the
#: chunk cache's budget (as the reply buffers of reads under way are).
BAND_BYTES = 4 << 20


def npy_dtype_shape(ds: Dataset) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The dtype and shape the ``.npy`` declares (sub-array types widen the shape)."""
    base, dims = ds.type.base_and_dims
    return base, (ds.shape or ()) + dims


def npy_header(ds: Dataset) -> bytes:
    """The NPY header of the dataset: version 1.0 when it fits, else 2.0, else 3.0."""
    return _header(*npy_dtype_shape(ds))


@functools.lru_cache(maxsize=4096)
def _header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The NPY header for ``dtype`` and ``shape`` (a wide group's datasets share a few)."""
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": shape}
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, fields)
    except (ValueError, UnicodeEncodeError):
        buf = io.BytesIO()
        try:
            np.lib.format.write_array_header_2_0(buf, fields)
        except UnicodeEncodeError:
            # Field names outside Latin-1 need version 3.0, which numpy writes
            # only through this helper (np.save uses it the same way).
            buf = io.BytesIO()
            np.lib.format._write_array_header(buf, fields, (3, 0))
    return buf.getvalue()


def flat_boxes(shape: tuple[int, ...], lo: int, hi: int) -> Iterator[Box]:
    """The boxes that make up C-order elements ``[lo, hi)`` of ``shape``, in order."""
    if lo >= hi:
        return
    if len(shape) == 1:
        yield (lo,), (hi,)
        return
    inner = math.prod(shape[1:])
    r0, o0 = divmod(lo, inner)
    r1, o1 = divmod(hi, inner)
    if r0 == r1:
        for start, stop in flat_boxes(shape[1:], o0, o1):
            yield (r0, *start), (r0 + 1, *stop)
        return
    if o0:
        for start, stop in flat_boxes(shape[1:], o0, inner):
            yield (r0, *start), (r0 + 1, *stop)
        r0 += 1
    if r1 > r0:
        yield (r0, *(0,) * (len(shape) - 1)), (r1, *shape[1:])
    if o1:
        for start, stop in flat_boxes(shape[1:], 0, o1):
            yield (r1, *start), (r1 + 1, *stop)


def chunks_in_order(shape: tuple[int, ...], chunks: tuple[int, ...],
                    lo: int, hi: int) -> list[tuple[ChunkIndex, int]]:
    """The chunks holding C-order elements ``[lo, hi)``, in grid C order, each
    with the first of those elements it holds."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    first: dict[ChunkIndex, int] = {}
    for box in flat_boxes(shape, lo, hi):
        start = box[0]
        for index in chunks_of_box(box, chunks):
            at = sum(max(a, i * c) * s
                     for a, i, c, s in zip(start, index, chunks, strides, strict=True))
            if at < first.get(index, hi):
                first[index] = at
    return sorted(first.items())


def _dataset(ctx: ViewContext) -> Dataset:
    """The context's dataset (the tree asks ``applies`` before anything else)."""
    ds = ctx.obj
    if not isinstance(ds, Dataset):
        raise ctx.error("not a dataset")
    return ds


class NpyView(FileView):
    """The ``.npy`` view: for every dataset of fixed-size type with a dataspace."""

    suffix = ".npy"
    own_data = True

    async def applies(self, ctx: ViewContext) -> bool:
        ds = ctx.obj
        return isinstance(ds, Dataset) and ds.type.fixed_size and ds.shape is not None

    def known_size(self, ctx: ViewContext) -> int:
        ds = _dataset(ctx)
        return len(npy_header(ds)) + math.prod(ds.shape or ()) * ds.type.itemsize

    async def open(self, ctx: ViewContext) -> Reader:
        return NpyReader(ctx, _dataset(ctx))


class NpyReader(Reader):
    """One open ``P.npy``: the header, then elements from the chunks a read touches."""

    def __init__(self, ctx: ViewContext, ds: Dataset) -> None:
        self.ctx = ctx
        self.ds = ds
        self.header = npy_header(ds)
        self.shape = ds.shape or ()
        self.itemsize = ds.type.itemsize
        self.elements = math.prod(self.shape)
        self.size = len(self.header) + self.elements * self.itemsize
        self.item = np.dtype(f"V{self.itemsize}")
        self.fill = np.frombuffer(ds.fill_bytes(), dtype=self.item)[0]
        #: Chunks hold whole rows (every dimension but the first is whole), so
        #: chunk ``k`` along the first dimension is one C-order run of elements.
        self.runs = bool(self.shape) and ds.chunks[1:] == self.shape[1:]
        self._fill_chunk: bytes | None = None
        #: The band of whole rows gathered last: first row, end row, elements.
        self._band: tuple[int, int, np.ndarray] | None = None
        self.readahead = ctx.readahead()
        #: First element not yet covered by an accepted prefetch.
        self.prefetched_to = 0
        #: The last chunk row (index along the first grid dimension) every chunk of
        #: which a prefetch of this sequential run accepted (-1: none).
        self.asked_row = -1
        #: The chunk rows it holds when the chunk cache cannot (``_rowbands``).
        self.chunk_rows = ChunkRows(ctx, ds, self.item, self.fill) if self.shape else None

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        hlen = len(self.header)
        head = self.header[offset:min(end, hlen)] if offset < hlen else b""
        if end <= hlen:
            return head
        d0, d1 = max(offset, hlen) - hlen, end - hlen
        e0, e1 = d0 // self.itemsize, -(-d1 // self.itemsize)
        ahead = self.readahead.observe(offset, end - offset)
        got = await self._from_bands(e0, e1)
        if got is None:
            if not ahead:
                self.prefetched_to = e1
                self.asked_row = -1
            elif self.shape:
                self._prefetch(e1, min(self.elements, e1 + -(-ahead // self.itemsize)), ahead)
            got = await self._elements(e0, e1, ahead)
        raw = got.view(np.uint8)
        data = memoryview(raw[d0 - e0 * self.itemsize:d1 - e0 * self.itemsize])
        return head + bytes(data) if head else data

    async def _from_bands(self, e0: int, e1: int) -> np.ndarray | None:
        """Elements ``[e0, e1)`` from the chunk rows the reader holds, or None:
        read them the ordinary way (and prefetch through the chunk cache)."""
        if self.chunk_rows is None:
            return None
        bands = self.chunk_rows.claim(e0, e1)
        return None if bands is None else await self.chunk_rows.elements(bands, e0, e1)

    def close(self) -> None:
        if self.chunk_rows is not None:
            self.chunk_rows.close()

    def _filled_chunk(self) -> bytes:
        """A whole chunk of the fill value (made when first needed)."""
        if self._fill_chunk is None:
            self._fill_chunk = np.full(self.ds.chunk_elements, self.fill, self.item).tobytes()
        return self._fill_chunk

    def _band_end(self, e0: int, e1: int, inner: int, ahead: int) -> int:
        """Where a band of whole rows for a read of elements ``[e0, e1)`` ends: it
        holds the ``BAND_BYTES`` from ``e0`` on (fewer if ``ahead`` is less),
        rounded up to a whole row, so that reads of one size following this one
        are each inside one band (a band counted from its first row would end a
        part of a row short of the fourth 1 MiB read when the ``.npy`` header
        shifts the elements, and the next band would gather that read's rows
        again); cut at a chunk boundary along the first dimension where that
        still holds the read (so it needs no chunks of the next chunk row)."""
        c0 = self.ds.chunks[0]
        r1 = -(-e1 // inner)
        want = e0 + max(e1 - e0, min(BAND_BYTES, (e1 - e0) * self.itemsize + ahead)
                        // self.itemsize)
        end = -(-want // inner)
        aligned = end // c0 * c0
        b1 = aligned if aligned >= r1 else min(end, -(-r1 // c0) * c0)
        return min(max(b1, r1), self.shape[0])

    async def _elements(self, e0: int, e1: int, ahead: int) -> np.ndarray:
        """Elements ``[e0, e1)`` in C order, as a flat array of ``V<itemsize>`` items.
        ``ahead``: the reader's readahead (0 unless it is sequential); the rows
        after the read's that it covers may be gathered now and kept for the
        next reads."""
        if not self.shape:
            out = np.empty(e1 - e0, dtype=self.item)
            data = await self.ctx.chunk(self.ds, (0,))
            out[:] = np.frombuffer(data, self.item)[0] if data is not None else self.fill
            return out
        if self.runs:
            return await self._run_elements(e0, e1)
        inner = self.elements // self.shape[0]
        r0, r1 = e0 // inner, -(-e1 // inner)
        band = self._band
        if band is not None and band[0] <= r0 and r1 <= band[1]:
            return band[2][e0 - band[0] * inner:e1 - band[0] * inner]
        if inner * self.itemsize <= BAND_ROW_BYTES or (r0 * inner, r1 * inner) == (e0, e1):
            b1 = self._band_end(e0, e1, inner, ahead) if ahead else r1
            rows = await self._gather([((r0, *(0,) * (len(self.shape) - 1)),
                                        (b1, *self.shape[1:]))])
            if b1 > r1:
                self._band = (r0, b1, rows)
            return rows[e0 - r0 * inner:e1 - r0 * inner]
        return await self._gather(list(flat_boxes(self.shape, e0, e1)))

    async def _gather(self, boxes: list[Box]) -> np.ndarray:
        """The elements of ``boxes``, each in C order, joined: a flat array of
        ``V<itemsize>`` items, from one batch of the chunks they touch."""
        chunks = self.ds.chunks
        indices = list(dict.fromkeys(index for box in boxes
                                     for index in chunks_of_box(box, chunks)))
        got = {index: None if data is None else np.frombuffer(data, self.item).reshape(chunks)
               for index, data in zip(indices, await self.ctx.chunks(self.ds, indices),
                                      strict=True)}
        shapes = [[b - a for a, b in zip(*box, strict=True)] for box in boxes]
        out = np.empty(sum(math.prod(shape) for shape in shapes), dtype=self.item)
        pos = 0
        for box, shape in zip(boxes, shapes, strict=True):
            count = math.prod(shape)
            fill_box(out[pos:pos + count].reshape(shape), box, chunks, got, self.fill)
            pos += count
        return out

    async def _run_elements(self, e0: int, e1: int) -> np.ndarray:
        """``_elements`` when each chunk is one C-order run: the parts of the
        chunks ``[e0, e1)`` falls in, joined."""
        per = self.ds.chunk_elements
        nbytes = per * self.itemsize
        k0, k1 = e0 // per, -(-e1 // per)
        rest = (0,) * (len(self.shape) - 1)
        got = await self.ctx.chunks(self.ds, [(k, *rest) for k in range(k0, k1)])
        parts: list[bytes | memoryview] = []
        for data in got:
            if data is None:
                parts.append(self._filled_chunk())
                continue
            if len(data) != nbytes:
                raise self.ctx.error(f"chunk has {len(data)} bytes, expected {nbytes}")
            parts.append(data)
        skip = (e0 - k0 * per) * self.itemsize
        last = (e1 - (k1 - 1) * per) * self.itemsize
        if len(parts) == 1:
            parts[0] = memoryview(parts[0])[skip:last]
        else:
            parts[0] = memoryview(parts[0])[skip:]
            parts[-1] = memoryview(parts[-1])[:last]
        return np.frombuffer(b"".join(parts), dtype=self.item)

    def _prefetch(self, e1: int, e2: int, ahead: int) -> None:
        """Start the chunks holding elements ``[e1, e2)`` in grid order, from the
        watermark on (what earlier reads started is not asked for again): at
        most ``ahead`` bytes of them counting each cache entry's overhead, and
        at most ``AHEAD_CHUNKS`` of them."""
        lo = max(e1, self.prefetched_to)
        if lo >= e2:
            return
        # Bounds the list below; the chunks past it are asked for by later reads.
        e2 = min(e2, lo + AHEAD_CHUNKS * self.ds.chunk_elements)
        # A steady reader's window mostly moves within chunk rows already asked
        # for whole: nothing to ask (the same chunks would be listed and found).
        unit = self.elements // self.shape[0] * self.ds.chunks[0]
        if (e2 - 1) // unit <= self.asked_row:
            self.prefetched_to = e2
            return
        if self.runs:
            per = self.ds.chunk_elements
            rest = (0,) * (len(self.shape) - 1)
            wanted = [((k, *rest), max(lo, k * per)) for k in range(lo // per, -(-e2 // per))]
        else:
            wanted = chunks_in_order(self.shape, self.ds.chunks, lo, e2)
        # Chunks much wider than the window (a row across many chunks) may not
        # flood the cache: at most ``ahead`` bytes of them at once.
        room = min(AHEAD_CHUNKS, max(1, -(-ahead // self.ctx.chunk_cost(self.ds))))
        accepted = self.ctx.prefetch(self.ds, [index for index, _ in wanted[:room]])
        # What was refused or left out is asked for again by a later read, from here.
        if accepted < len(wanted):
            self.prefetched_to = wanted[accepted][1]
            return
        self.prefetched_to = e2
        # Every chunk of a chunk row holding a whole row of the window was asked for.
        inner = self.elements // self.shape[0]
        last = e2 // inner - 1
        if last * inner >= lo:
            self.asked_row = max(self.asked_row, last // self.ds.chunks[0])
