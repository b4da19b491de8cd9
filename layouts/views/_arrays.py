"""Arrays read through a view's context: chunk geometry, row ranges, whole arrays.

Owns the mapping from a box of a dataset's elements to the chunks that
intersect it (``chunks_of_box``; ``row_chunks`` for a range of rows, which
``prefetch_rows`` starts in the background), copying those chunks' parts into an array
(``fill_box``), a chunk file's bytes as elements (``decode_chunk``), and the
reads views build on ``ViewContext.chunks``: a range of rows along the first
dimension (``read_rows``) and a whole array (``read_array``), for fixed-size
and variable-length types alike. Chunks that are not stored read as the
fill value. A read holds its result and the chunks it touches, so a view
streaming a large dataset reads it a few chunks' rows at a time.

Stateless; safe from any number of tasks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import numcodecs
import numpy as np

from layouts.errors import Corrupt
from layouts.model import ChunkIndex, Dataset, VlenKind
from layouts.views._api import ViewContext

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (start, stop) per dimension


def chunks_of_box(box: Box, chunks: tuple[int, ...]) -> Iterator[ChunkIndex]:
    """Indices of the chunks that intersect ``box``, in grid C order."""
    start, stop = box
    return itertools.product(*(range(a // c, -(-b // c))
                               for a, b, c in zip(start, stop, chunks, strict=True)))


def fill_box(dest: np.ndarray, box: Box, chunks: tuple[int, ...],
             got: Mapping[ChunkIndex, np.ndarray | None], fill: Any) -> None:
    """Copy into ``dest`` (the elements of ``box``) the part of every chunk
    inside the box: ``got`` holds each chunk shaped as ``chunks`` (trailing
    dimensions of a sub-array type after them), or None for ``fill``.

    Compound elements without objects are copied as raw bytes (numpy copies
    a structured array field by field, some 25 times slower)."""
    if dest.dtype.names is not None and not dest.dtype.hasobject:
        raw = np.dtype((np.void, dest.dtype.itemsize))
        dest, fill = dest.view(raw), np.asarray(fill).view(raw)
        got = {index: None if block is None else block.view(raw) for index, block in got.items()}
    # Per dimension, each chunk position the box meets with the slice of the box
    # and of the chunk it covers; a chunk's slices are then one pick per dimension.
    axes = []
    for a, b, c in zip(*box, chunks, strict=True):
        axis = []
        for i in range(a // c, -(-b // c)):
            o = i * c
            lo, hi = max(a, o), min(b, o + c)
            axis.append((i, slice(lo - a, hi - a), slice(lo - o, hi - o)))
        axes.append(axis)
    for picks in itertools.product(*axes):
        index, dst, src = zip(*picks, strict=True)
        block = got[index]
        if block is None:
            dest[dst] = fill
        else:
            dest[dst] = block[src]


def decode_chunk(ds: Dataset, data: bytes) -> np.ndarray:
    """A chunk file's bytes as a flat array of the dataset's elements (a
    sub-array type adds its dimensions after the first). Raises ``Corrupt``
    for bytes the dataset's codec cannot decode (text that is not UTF-8)."""
    vlen = ds.type.vlen
    if vlen is None:
        return np.frombuffer(data, dtype=ds.type.dtype)
    codec: numcodecs.abc.Codec
    if vlen is VlenKind.UTF8:
        codec = numcodecs.VLenUTF8()
    elif vlen is VlenKind.BYTES:
        codec = numcodecs.VLenBytes()
    elif vlen is VlenKind.ARRAY:
        codec = numcodecs.VLenArray(ds.type.vlen_base)
    else:
        codec = numcodecs.JSON()
    try:
        return np.asarray(codec.decode(data)).reshape(-1)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise Corrupt(ds.id, f"a chunk does not decode as {vlen.name}: {exc}") from exc


def _fill(ds: Dataset) -> Any:
    """What an element not stored reads as, ready to assign to a slice."""
    if ds.type.fixed_size:
        base, dims = ds.type.base_and_dims
        return np.frombuffer(ds.fill_bytes(), dtype=base).reshape(dims)
    value = np.empty((), dtype=object)
    value[()] = ds.effective_fill
    return value


def _element_layout(ds: Dataset) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The dtype of a read's result and the dimensions each element adds."""
    if ds.type.fixed_size:
        return ds.type.base_and_dims
    return np.dtype(object), ()


def _rows_box(shape: tuple[int, ...], start: int, stop: int) -> Box:
    """Rows ``[start, stop)`` along the first dimension, whole along the others."""
    return (start, *(0,) * (len(shape) - 1)), (stop, *shape[1:])


def row_chunks(ds: Dataset, start: int, stop: int) -> list[ChunkIndex]:
    """The chunks rows ``[start, stop)`` (clipped to the shape) of a dataset
    with at least one dimension lie in, in grid C order; none without chunks."""
    shape = ds.shape
    if not shape or not ds.chunks:
        return []
    start, stop = max(0, start), min(stop, shape[0])
    return list(chunks_of_box(_rows_box(shape, start, stop), ds.chunks)) if start < stop else []


def prefetch_rows(ctx: ViewContext, ds: Dataset, start: int, stop: int) -> int:
    """Start the chunks rows ``[start, stop)`` lie in (``row_chunks``) in the
    background; how many of them, from the first, were accepted."""
    indices = row_chunks(ds, start, stop)
    return ctx.prefetch(ds, indices) if indices else 0


async def read_rows(ctx: ViewContext, ds: Dataset, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` (clipped to the shape) along the first dimension
    of a dataset with at least one dimension: shape ``(rows, *shape[1:])``
    plus a sub-array type's dimensions; ``object`` elements for
    variable-length types."""
    shape = ds.shape
    if not shape:
        raise ctx.error("rows of a dataset with no dimensions")
    start, stop = max(0, start), min(stop, shape[0])
    dtype, dims = _element_layout(ds)
    out = np.empty((max(0, stop - start), *shape[1:], *dims), dtype=dtype)
    if out.size == 0:
        return out
    box = _rows_box(shape, start, stop)
    indices = list(chunks_of_box(box, ds.chunks))
    got = {index: None if data is None else decode_chunk(ds, data).reshape(ds.chunks + dims)
           for index, data in zip(indices, await ctx.chunks(ds, indices), strict=True)}
    fill_box(out, box, ds.chunks, got, _fill(ds))
    return out


async def read_array(ctx: ViewContext, ds: Dataset) -> np.ndarray:
    """The whole array of a dataset with a dataspace (a scalar as a 0-d
    array), as ``read_rows`` gives rows. It is held whole: for small ones."""
    if ds.shape is None:
        raise ctx.error("no dataspace")
    if ds.shape:
        return await read_rows(ctx, ds, 0, ds.shape[0])
    dtype, dims = _element_layout(ds)
    out = np.empty(dims, dtype=dtype)
    data = await ctx.chunk(ds, (0,))
    if data is None:
        out[...] = _fill(ds)
    else:
        out[()] = decode_chunk(ds, data)[0]
    return out
