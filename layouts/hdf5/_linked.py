"""Chunk stores over data that stays in an HDF5 file, read by byte range.

Both formats have datasets whose chunks are not in the source itself but in
the HDF5 file it was made from: HSDS linked datasets (``hsload --link``,
``layouts.formats.hsds._linked``) and LINDI external arrays (``layouts.formats.refs._external``).
This module owns reading those, whatever said where they are:

* ``LinkedFiles`` reads byte ranges of the files that URIs name, through the
  ``OpenUri`` resolver the format is given; HDF5 chunks close together in one
  file are read with one request (``MAX_GAP``, ``MAX_SPAN``). It remembers
  what the ``MAX_OPENED`` URIs read last resolved to (an HSDS chunk table
  may name a file per chunk); one read again after that is resolved again.
* ``Piece`` is one stored HDF5 chunk (file, byte range, place in the model's
  chunk), and a ``Locator`` says which pieces make each chunk: ``ChunkMap``
  when the locations are known up front, one piece per chunk; HSDS's chunk
  table (``layouts.formats.hsds._locations.ChunkTable``) is another.
* ``ContiguousRefStore`` cuts the chunks of a grid out of one unfiltered
  C-order array in a file; ``ChunkedRefStore`` decodes filtered HDF5 chunks
  (``layouts.hdf5._filters``) and puts them in place.

Decoding is bounded (``layouts.hdf5._filters``): no HDF5 chunk decodes to more
than its size, and one whose stored size is beyond ``h5filters.stored_limit``
of that is refused before it is read, so a location stating gigabytes does
not make the reader fetch them. A chunk with no stored piece reads as None
(the fill value). Chunks are returned full-size; elements outside the
dataset, or of an absent HDF5 chunk inside a larger chunk, hold the fill
value.

Concurrency: stores hold immutable state plus caches filled without an await
between check and set (resolved uris in ``LinkedFiles``), so any number of
trio tasks may use them; a race only repeats a cheap step. Decoding or
cutting a chunk goes through ``layouts.decoding`` (a worker thread once it
reaches ``THREAD_THRESHOLD`` bytes).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from layouts.bounds import MAX_CHUNK_BYTES
from layouts.decoding import decode_sized
from layouts.errors import Corrupt, FormatError, LayoutError, Missing, NotFound, StorageError
from layouts.hdf5._filters import Pipeline, decode, stored_limit
from layouts.model import ChunkIndex, chunk_grid, in_chunk_grid, no_version, read_each
from layouts.storage import ByteRange, Fetched, OpenUri, Store

log = logging.getLogger(__name__)

#: HDF5 chunks closer together than this in one file are read with one request.
MAX_GAP = 64 * 1024
#: Largest byte range read with one request when joining HDF5 chunks.
MAX_SPAN = 64 * 1024 * 1024
#: URIs whose resolution one ``LinkedFiles`` remembers.
MAX_OPENED = 4096


@dataclass(frozen=True, slots=True)
class LinkedSpec:
    """What every store of one dataset's linked chunks needs, fixed when the dataset
    is built."""

    #: What errors about the dataset's metadata name (for HSDS, its JSON key).
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


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True, slots=True)
class Piece:
    """One stored HDF5 chunk, and where its first element goes in the model's chunk."""

    uri: str
    offset: int
    size: int
    at: tuple[int, ...]

    @property
    def name(self) -> str:
        """How errors about these bytes name them."""
        return f"{self.uri}@{self.offset}"


class Locator(Protocol):
    """Where the HDF5 chunks of each chunk of the dataset's grid are."""

    @property
    def piece_shape(self) -> tuple[int, ...]:
        """The shape of one HDF5 chunk."""
        ...

    async def pieces(self, index: ChunkIndex) -> list[Piece]:
        """The stored HDF5 chunks of the chunk at ``index`` (in the grid)."""
        ...

    def indices(self) -> AsyncIterator[ChunkIndex]:
        """Chunk indices with at least one stored HDF5 chunk (maybe off the grid)."""
        ...


def location(value: Any, what: str, limit: int = MAX_CHUNK_BYTES) -> tuple[int, int]:
    """(offset, size) of stored bytes; FormatError if they are not sane."""
    if not isinstance(value, Sequence) or len(value) < 2:
        raise FormatError(f"{what}: expected [offset, size], got {value!r}")
    offset, size = value[0], value[1]
    for v in (offset, size):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise FormatError(f"{what}: offset and size must be integers, got {value!r}")
    offset, size = int(offset), int(size)
    if offset < 0 or not 0 <= size <= limit:
        raise FormatError(f"{what}: bad offset {offset} or size {size}")
    return offset, size


class ChunkMap:
    """One HDF5 chunk per chunk of the grid, each at a location known up front
    (checked by ``location``): ``H5D_CHUNKED_REF``'s ``chunks`` map
    (``layouts.formats.hsds._locations.chunk_map``), or the chunks h5py lists for a
    LINDI external array. A size of 0 is a chunk not stored."""

    def __init__(self, uri: str, chunks: tuple[int, ...],
                 entries: Mapping[ChunkIndex, tuple[int, int]]) -> None:
        self._uri = uri
        self._shape = chunks
        self._entries = entries

    @property
    def piece_shape(self) -> tuple[int, ...]:
        return self._shape

    async def pieces(self, index: ChunkIndex) -> list[Piece]:
        offset, size = self._entries.get(index, (0, 0))
        if not size:
            return []
        return [Piece(self._uri, offset, size, (0,) * len(index))]

    async def indices(self) -> AsyncIterator[ChunkIndex]:
        for index, (_, size) in self._entries.items():
            if size:
                yield index


# --------------------------------------------------------------------------- the file


def _not_found(uri: str, store: Store, key: str) -> Missing:
    return Missing(uri, f"linked data file not found ({store.url} {key})")


def _exactly(data: bytes, uri: str, offset: int, size: int) -> bytes:
    """``data``, if it is the whole ``size``-byte range at ``offset``; else ``Corrupt``."""
    if len(data) != size:
        raise Corrupt(f"{uri}@{offset}", f"file ends {len(data)} bytes into a "
                                         f"{size}-byte range")
    return data


class LinkedFiles:
    """Reads byte ranges of the files that URIs name (an HSDS ``file_uri``, a LINDI
    external array's or ref's URL), each resolved once by ``open_uri``."""

    def __init__(self, open_uri: OpenUri | None) -> None:
        self._open_uri = open_uri
        self._opened: OrderedDict[str, tuple[Store, str]] = OrderedDict()

    def locate(self, uri: str) -> tuple[Store, str]:
        """The store and key the file ``uri`` names is read at."""
        found = self._opened.get(uri)
        if found is not None:
            self._opened.move_to_end(uri)
            return found
        if self._open_uri is None:
            raise StorageError(uri, "linked data file, and this mount cannot open file_uri")
        found = self._opened[uri] = self._open_uri(uri)
        log.debug("linked data file %s is %s in %s", uri, found[1], found[0].url)
        while len(self._opened) > MAX_OPENED:
            self._opened.popitem(last=False)
        return found

    async def read(self, uri: str, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset`` of the file ``uri`` names."""
        store, key = self.locate(uri)
        try:
            data = await store.get(key, ByteRange(offset, size))
        except NotFound:
            raise _not_found(uri, store, key) from None
        return _exactly(data, uri, offset, size)

    async def fetch(self, uri: str, offset: int, size: int) -> Fetched:
        """``read``, with the ``ObjectInfo`` of the file version the bytes are of."""
        store, key = self.locate(uri)
        try:
            fetched = await store.fetch(key, ByteRange(offset, size))
        except NotFound:
            raise _not_found(uri, store, key) from None
        _exactly(fetched.data, uri, offset, size)
        return fetched

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
    """Each chunk is cut from one unfiltered C-order array in the file (HSDS
    ``H5D_CONTIGUOUS_REF``, a contiguous LINDI external array)."""

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

    async def read_many(self, indices: Sequence[ChunkIndex]
                        ) -> list[bytes | LayoutError | None]:
        """No batch read of its own: chunk by chunk (``read_each``)."""
        return await read_each(self, indices)

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        if self._size > 0:
            for index in np.ndindex(*self._spec.grid):
                yield index

    def listing_ready(self) -> bool:
        return True  # every chunk of the grid, from its shape alone

    version = no_version


# --------------------------------------------------------------------------- chunked


def _assemble(spec: LinkedSpec, shape: tuple[int, ...], pieces: Sequence[Piece],
              raws: Sequence[bytes], extent: tuple[int, ...]) -> bytes:
    """Decode each HDF5 chunk and put it in place in a full chunk of the grid."""
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
    """Filtered HDF5 chunks, found by a ``Locator`` (HSDS ``H5D_CHUNKED_REF`` and
    ``H5D_CHUNKED_REF_INDIRECT``, a chunked LINDI external array)."""

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

    async def read_many(self, indices: Sequence[ChunkIndex]
                        ) -> list[bytes | LayoutError | None]:
        """No batch read of its own: chunk by chunk (``read_each``)."""
        return await read_each(self, indices)

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        async for index in self._locator.indices():
            if self._spec.in_grid(index):
                yield index

    def listing_ready(self) -> bool:
        return False

    version = no_version
