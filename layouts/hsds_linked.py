"""Linked HSDS datasets (``hsload --link``): chunks that stay in an HDF5 file.

Owns the ``ChunkStore`` of each layout whose data lives in the original HDF5
file, the HSDS chunk grid of each, and reading that file through the
``OpenUri`` resolver the catalog is given. Where the HDF5 chunks are comes
from ``layouts.hsds_locations``; how they are decoded from ``layouts.h5filters``.
What HSDS 1.0.2 does, and so what is done here (``h5json/dset_util.py``
``getChunkDims``/``getContiguousLayout``, ``hsds/dset_lib.py``
``getChunkLocations``, ``hsds/datanode_lib.py`` ``get_chunk_bytes``):

* ``H5D_CONTIGUOUS_REF {file_uri, offset, size}``: the dataset is one
  unfiltered C-order array at ``offset``. HSDS cuts it into a grid of its own
  (``contiguous_ref_chunks``), so every chunk is one byte span of the file.
* ``H5D_CHUNKED_REF {file_uri, dims, chunks: {"i_j": [offset, size]}}``: one
  HDF5 chunk per HSDS chunk of shape ``dims``.
* ``H5D_CHUNKED_REF_INDIRECT {dims, chunk_table, [file_uri], [hyper_dims]}``:
  the locations are rows of a chunk table dataset; with ``hyper_dims`` one
  HSDS chunk is a block of HDF5 chunks.

Decoding is bounded (``layouts.h5filters``): no HDF5 chunk decodes to more
than its size, and one whose stored size is beyond ``h5filters.stored_limit``
of that is refused before it is read, so a location stating gigabytes does
not make the reader fetch them.

A chunk whose entries are absent or have size 0 is not stored (``read`` gives
None: the fill value). Chunks are returned full-size; elements outside the
dataset, or of an absent HDF5 chunk inside a hyper chunk, hold the fill value.

``OpenUri`` maps a ``file_uri`` to the ``Store`` to read and the key in it:
``s3://bucket/key``, or on POSIX storage ``bucket/path/file.h5`` relative to
HSDS's ROOT_DIR. It is called without awaiting (so it must not block), once
per uri and chunk store, and raises ``StorageError`` naming the uri to refuse
one.

Concurrency: stores hold immutable state plus caches filled without an await
between check and set (resolved uris here, chunk tables in ``ChunkTable``),
so any number of trio tasks may use them; a race only repeats a cheap step.
Decoding or cutting a chunk of ``THREAD_THRESHOLD`` bytes or more runs in a
worker thread under ``hsds_chunks.DECODE_LIMITER``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from layouts.h5filters import Pipeline, decode, pipeline, stored_limit
from layouts.hsds_chunks import decode_sized
from layouts.hsds_locations import ChunkMap, ChunkTable, LoadTable, Locator, Piece, location
from layouts.hsds_types import FormatError
from layouts.model import ChunkIndex, ElementType, chunk_grid, in_chunk_grid
from mountd.errors import Corrupt, NotFound, StorageError
from mountd.io.store import ByteRange, Store

log = logging.getLogger(__name__)

#: Resolves a ``file_uri`` to (store, key); see the module docstring.
OpenUri = Callable[[str], tuple[Store, str]]

#: HSDS's upper chunk size for the grid of a contiguous dataset (h5json CHUNK_MAX).
CONTIGUOUS_CHUNK_MAX = 8096 * 1024
#: HDF5 chunks closer together than this in one file are read with one request.
MAX_GAP = 64 * 1024
#: Largest byte range read with one request when joining HDF5 chunks.
MAX_SPAN = 64 * 1024 * 1024
#: Largest contiguous array accepted (the HSDS element limit, in bytes).
MAX_CONTIGUOUS_BYTES = (1 << 63) - 1


def contiguous_ref_chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """HSDS's chunk grid for ``H5D_CONTIGUOUS_REF`` (h5json ``getContiguousLayout``).

    From the last dimension inwards each takes its full extent while the chunk
    stays under ``CONTIGUOUS_CHUNK_MAX`` bytes; the first that does not fit is
    halved (rounding up) until it does or is 1; dimensions before it are 1.
    """
    if any(n == 0 for n in shape):
        return shape
    chunks = [1] * len(shape)
    size = itemsize
    for dim in reversed(range(len(shape))):
        extent = shape[dim]
        if extent * size < CONTIGUOUS_CHUNK_MAX:
            chunks[dim] = extent
            size *= extent
            continue
        while extent > 1:
            extent = -(-extent // 2)
            if extent * size < CONTIGUOUS_CHUNK_MAX:
                break
        chunks[dim] = extent
        break
    return tuple(chunks)


def _fill_element(fill: Any, dtype: np.dtype[Any]) -> bytes:
    """One element of the fill value as bytes (zeros when there is none)."""
    if fill is None:
        return bytes(dtype.itemsize)
    if dtype.subdtype is not None:
        base, sub = dtype.subdtype
        return np.broadcast_to(np.asarray(fill, dtype=base), sub).tobytes()
    return np.asarray(fill, dtype=dtype).tobytes()


@dataclass(frozen=True, slots=True)
class LinkedSpec:
    """What every linked store of one dataset needs, fixed at ``get_object``."""

    #: The dataset's JSON key, named in errors about its metadata.
    key: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    itemsize: int
    #: One element of the fill value.
    fill: bytes
    pipe: Pipeline
    #: Why no chunk of this dataset can be read, if something makes it so.
    problem: str | None = None

    @property
    def grid(self) -> tuple[int, ...]:
        return chunk_grid(self.shape, self.chunks)

    @property
    def nbytes(self) -> int:
        return math.prod(self.chunks) * self.itemsize

    def in_grid(self, index: Sequence[int]) -> bool:
        return in_chunk_grid(index, self.grid)

    def extent(self, index: ChunkIndex) -> tuple[int, ...]:
        """How much of the chunk at ``index`` lies inside the dataset."""
        return tuple(min(c, n - i * c) for i, c, n in zip(index, self.chunks, self.shape,
                                                           strict=True))

    def fill_block(self) -> np.ndarray[Any, Any]:
        """A chunk of elements (as ``V<itemsize>``) all holding the fill value."""
        dtype = np.dtype(f"V{self.itemsize}")
        block = np.empty(self.chunks, dtype=dtype)
        block[...] = np.frombuffer(self.fill, dtype=dtype)[0]
        return block


def _elements(data: bytes, itemsize: int) -> np.ndarray[Any, Any]:
    return np.frombuffer(data, dtype=np.dtype(f"V{itemsize}"))


def _pad(block: np.ndarray[Any, Any], extent: tuple[int, ...], spec: LinkedSpec) -> None:
    """Set the part of ``block`` outside the dataset to the fill value."""
    fill = np.frombuffer(spec.fill, dtype=block.dtype)[0]
    for dim, (inside, size) in enumerate(zip(extent, block.shape, strict=True)):
        if inside < size:
            block[(slice(None),) * dim + (slice(inside, None),)] = fill


# --------------------------------------------------------------------------- the file


class LinkedFiles:
    """Reads byte ranges of the files that ``file_uri`` values name."""

    def __init__(self, open_uri: OpenUri | None) -> None:
        self._open_uri = open_uri
        self._opened: dict[str, tuple[Store, str]] = {}

    def _open(self, uri: str) -> tuple[Store, str]:
        found = self._opened.get(uri)
        if found is None:
            if self._open_uri is None:
                raise StorageError(uri, "linked data file, and this mount cannot open file_uri")
            found = self._open_uri(uri)
            log.debug("linked data file %s is %s in %s", uri, found[1], found[0].url)
            self._opened[uri] = found
        return found

    async def read(self, uri: str, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset`` of the file ``uri`` names."""
        store, key = self._open(uri)
        try:
            data = await store.get(key, ByteRange(offset, size))
        except NotFound:
            raise StorageError(uri, f"linked data file not found ({store.url} {key})") from None
        if len(data) != size:
            raise Corrupt(f"{uri}@{offset}", f"file ends {len(data)} bytes into a "
                                             f"{size}-byte range")
        return data

    async def read_pieces(self, pieces: Sequence[Piece]) -> list[bytes]:
        """The bytes of each piece; pieces close together are read in one request."""
        out = [b""] * len(pieces)
        order = sorted(range(len(pieces)), key=lambda i: (pieces[i].uri, pieces[i].offset))
        group: list[int] = []
        for i in order:
            if group:
                first, piece = pieces[group[0]], pieces[i]
                end = max(pieces[j].offset + pieces[j].size for j in group)
                if (piece.uri != first.uri or piece.offset - end > MAX_GAP
                        or piece.offset + piece.size - first.offset > MAX_SPAN):
                    await self._read_group(pieces, group, out)
                    group = []
            group.append(i)
        if group:
            await self._read_group(pieces, group, out)
        return out

    async def _read_group(self, pieces: Sequence[Piece], group: list[int],
                          out: list[bytes]) -> None:
        start = pieces[group[0]].offset
        end = max(pieces[j].offset + pieces[j].size for j in group)
        data = await self.read(pieces[group[0]].uri, start, end - start)
        for j in group:
            begin = pieces[j].offset - start
            out[j] = data[begin:begin + pieces[j].size]


# --------------------------------------------------------------------------- contiguous


def _cut(spec: LinkedSpec, raw: bytes, extent: tuple[int, ...],
         strides: tuple[int, ...]) -> bytes:
    """The chunk whose in-dataset part starts ``raw`` with the given element strides."""
    view = np.lib.stride_tricks.as_strided(
        _elements(raw, spec.itemsize), shape=extent,
        strides=tuple(s * spec.itemsize for s in strides), writeable=False)
    if extent == spec.chunks:
        return view.tobytes()
    block = spec.fill_block()
    block[tuple(slice(0, e) for e in extent)] = view
    return block.tobytes()


class ContiguousRefStore:
    """``H5D_CONTIGUOUS_REF``: each chunk is cut from one C-order array in the file."""

    def __init__(self, spec: LinkedSpec, files: LinkedFiles, uri: str, offset: int,
                 size: int) -> None:
        self._spec = spec
        self._files = files
        self._uri = uri
        self._offset = offset
        self._size = size
        strides = [1] * len(spec.shape)
        for dim in reversed(range(len(spec.shape) - 1)):
            strides[dim] = strides[dim + 1] * spec.shape[dim + 1]
        self._strides = tuple(strides)

    async def exists(self, index: ChunkIndex) -> bool:
        return self._size > 0 and self._spec.in_grid(index)

    async def read(self, index: ChunkIndex) -> bytes | None:
        spec = self._spec
        if not await self.exists(index):
            return None
        if spec.problem:
            raise Corrupt(spec.key, spec.problem)
        extent = spec.extent(index)
        origin = [i * c for i, c in zip(index, spec.chunks, strict=True)]
        first = sum(o * s for o, s in zip(origin, self._strides, strict=True))
        last = sum((o + e - 1) * s for o, e, s in zip(origin, extent, self._strides, strict=True))
        start, length = first * spec.itemsize, (last + 1 - first) * spec.itemsize
        if start + length > self._size:
            raise Corrupt(spec.key, f"chunk {list(index)} needs bytes up to {start + length} "
                                    f"of a {self._size}-byte contiguous array")
        raw = await self._files.read(self._uri, self._offset + start, length)
        return await decode_sized(length + spec.nbytes, _cut, spec, raw, extent,
                                      self._strides)

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        if self._size > 0:
            for index in np.ndindex(*self._spec.grid):
                yield index


# --------------------------------------------------------------------------- chunked


def _assemble(spec: LinkedSpec, shape: tuple[int, ...], pieces: Sequence[Piece],
              raws: Sequence[bytes], extent: tuple[int, ...]) -> bytes:
    """Decode each HDF5 chunk and put it in place in a full HSDS chunk."""
    nbytes = math.prod(shape) * spec.itemsize
    if len(pieces) == 1 and shape == spec.chunks == extent:
        return decode(raws[0], spec.pipe, spec.itemsize, nbytes, pieces[0].name)
    block = spec.fill_block()
    for piece, raw in zip(pieces, raws, strict=True):
        data = decode(raw, spec.pipe, spec.itemsize, nbytes, piece.name)
        block[tuple(slice(a, a + s) for a, s in zip(piece.at, shape, strict=True))] = \
            _elements(data, spec.itemsize).reshape(shape)
    _pad(block, extent, spec)
    return block.tobytes()


class ChunkedRefStore:
    """``H5D_CHUNKED_REF`` and ``H5D_CHUNKED_REF_INDIRECT``: filtered HDF5 chunks."""

    def __init__(self, spec: LinkedSpec, files: LinkedFiles, locator: Locator) -> None:
        self._spec = spec
        self._files = files
        self._locator = locator

    async def exists(self, index: ChunkIndex) -> bool:
        return self._spec.in_grid(index) and bool(await self._locator.pieces(index))

    async def read(self, index: ChunkIndex) -> bytes | None:
        spec = self._spec
        if not spec.in_grid(index):
            return None
        if spec.problem:
            raise Corrupt(spec.key, spec.problem)
        pieces = await self._locator.pieces(index)
        if not pieces:
            return None
        nbytes = math.prod(self._locator.piece_shape) * spec.itemsize
        for piece in pieces:
            if piece.size > stored_limit(nbytes):
                raise Corrupt(piece.name, f"stored chunk of {piece.size} bytes, too large "
                                          f"for a {nbytes}-byte chunk")
        raws = await self._files.read_pieces(pieces)
        return await decode_sized(sum(map(len, raws)) + spec.nbytes, _assemble, spec,
                                      self._locator.piece_shape, pieces, raws,
                                      spec.extent(index))

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        async for index in self._locator.indices():
            if self._spec.in_grid(index):
                yield index


# --------------------------------------------------------------------------- building


def _uri(layout: Mapping[str, Any], required: bool) -> str | None:
    uri = layout.get("file_uri")
    if uri is None and not required:
        return None
    if not isinstance(uri, str) or not uri:
        raise FormatError(f"{layout.get('class')} layout needs a file_uri, got {uri!r}")
    return uri


def _hyper_dims(layout: Mapping[str, Any], chunks: tuple[int, ...]) -> tuple[int, ...] | None:
    raw = layout.get("hyper_dims")
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != len(chunks) or any(
            isinstance(h, bool) or not isinstance(h, int) or h <= 0 or c % h
            for h, c in zip(raw, chunks, strict=False)):
        raise FormatError(f"hyper_dims {raw!r} do not divide the chunk shape {list(chunks)}")
    return tuple(raw)


def linked_chunks(cls: str, shape: tuple[int, ...], etype: ElementType,
                  layout_dims: tuple[int, ...]) -> tuple[int, ...]:
    """The HSDS chunk shape of a linked dataset (``layout_dims``: the layout's ``dims``)."""
    if cls == "H5D_CONTIGUOUS_REF":
        return contiguous_ref_chunks(shape, etype.itemsize) if etype.fixed_size else shape
    return layout_dims


def linked_store(key: str, shape: tuple[int, ...], etype: ElementType,
                 chunks: tuple[int, ...], layout: Mapping[str, Any], *, filters: Any,
                 fill: Any, open_uri: OpenUri | None,
                 load_table: LoadTable) -> ContiguousRefStore | ChunkedRefStore:
    """The chunk store of a dataset whose layout class is one of the linked ones."""
    cls = layout.get("class")
    pipe = pipeline(filters)
    problem = None
    if not etype.fixed_size:
        problem = "variable-length types cannot be linked to an HDF5 file"
    elif pipe.unknown and cls != "H5D_CONTIGUOUS_REF":
        problem = f"unsupported filter {pipe.unknown}"
    itemsize = etype.itemsize if etype.fixed_size else 0
    fill_bytes = _fill_element(fill, etype.dtype) if etype.fixed_size else b""
    spec = LinkedSpec(key, shape, chunks, itemsize, fill_bytes, pipe, problem)
    files = LinkedFiles(open_uri)
    if cls == "H5D_CONTIGUOUS_REF":
        offset, size = location([layout.get("offset"), layout.get("size")], cls,
                                 limit=MAX_CONTIGUOUS_BYTES)
        return ContiguousRefStore(spec, files, str(_uri(layout, True)), offset, size)
    if cls == "H5D_CHUNKED_REF":
        return ChunkedRefStore(spec, files,
                               ChunkMap(str(_uri(layout, True)), chunks, layout.get("chunks")))
    table_id = layout.get("chunk_table")
    if not isinstance(table_id, str):
        raise FormatError(f"H5D_CHUNKED_REF_INDIRECT needs a chunk_table id, got {table_id!r}")
    locator = ChunkTable(key, table_id, load_table, uri=_uri(layout, False), chunks=chunks,
                         hyper=_hyper_dims(layout, chunks))
    return ChunkedRefStore(spec, files, locator)
