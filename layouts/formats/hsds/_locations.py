"""Where the HDF5 chunks of a linked HSDS dataset are (``H5D_CHUNKED_REF*``).

Owns HSDS's two ways of saying it, each a ``Locator`` of ``layouts.hdf5._linked``
(which reads the ``Piece`` it gives): ``chunk_map`` parses the ``chunks`` map
of ``H5D_CHUNKED_REF`` into a ``ChunkMap``, and ``ChunkTable`` reads the chunk
table dataset of ``H5D_CHUNKED_REF_INDIRECT`` (``hsds/dset_lib.py``
``getChunkLocations``).

A chunk table holds one ``(offset, size[, file_uri])`` row per HDF5 chunk,
indexed like the HDF5 chunk grid; HSDS reads the fields by position. A row of
size 0 is an unallocated chunk. With ``hyper_dims`` (the HDF5 chunk shape,
dividing the HSDS chunk shape ``dims``) HSDS chunk ``c`` is the block of HDF5
chunks ``c * dims / hyper_dims + j``, each placed at ``j * hyper_dims``; rows
past the table's end are unallocated.

Concurrency: a ``ChunkTable`` loads its table dataset once and keeps the
last decoded table chunks (``TABLE_CACHE_BYTES``, each counted with its
``ENTRY_OVERHEAD``, so chunks not stored, which hold nothing, are bounded
too), both filled without an await between check and set, so any number
of trio tasks may use it; a race only repeats a read.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np

from layouts.bounds import MAX_CHUNK_BYTES
from layouts.errors import Corrupt, FormatError
from layouts.formats.hsds import _ids
from layouts.hdf5 import ChunkMap, Piece, location
from layouts.model import ChunkIndex, Dataset, VlenKind

#: Loads a chunk table dataset by id (given by the catalog).
LoadTable = Callable[[str], Awaitable[Dataset]]
#: Decoded chunk-table chunks kept per dataset, in bytes of row arrays.
TABLE_CACHE_BYTES = 8 * 1024 * 1024
#: What one kept table chunk costs besides its rows (its key, the LRU's links).
ENTRY_OVERHEAD = 256


def chunk_map(uri: str, chunks: tuple[int, ...], entries: Any) -> ChunkMap:
    """``H5D_CHUNKED_REF``: the layout's ``chunks`` map (``{"i_j": [offset, size]}``),
    parsed at ``get_object``."""
    if not isinstance(entries, Mapping):
        raise FormatError("H5D_CHUNKED_REF chunks must be an object")
    found: dict[ChunkIndex, tuple[int, int]] = {}
    for name, value in entries.items():
        index = _ids.parse_chunk_name(str(name), len(chunks))
        if index is None:
            raise FormatError(f"H5D_CHUNKED_REF chunk name {name!r} is not an index")
        found[index] = location(value, f"chunk {name}")
    return ChunkMap(uri, chunks, found)


@dataclass(frozen=True, slots=True)
class _Rows:
    """One chunk of a chunk table: offsets, sizes and file uris (or None) by local index."""

    offsets: np.ndarray[Any, Any]
    sizes: np.ndarray[Any, Any]
    uris: np.ndarray[Any, Any] | None

    @property
    def nbytes(self) -> int:
        """The bytes the rows hold, the text of file uris included."""
        uris = self.uris
        text = 0
        if uris is not None and uris.dtype == object:
            text = sum(len(u) for u in uris.flat if isinstance(u, str | bytes))
        return self.offsets.nbytes + self.sizes.nbytes + text + (
            uris.nbytes if uris is not None else 0)


class ChunkTable:
    """``H5D_CHUNKED_REF_INDIRECT``: locations from a chunk table dataset, loaded lazily."""

    def __init__(self, key: str, table_id: str, load: LoadTable, *, uri: str | None,
                 chunks: tuple[int, ...], hyper: tuple[int, ...] | None) -> None:
        self._key = key
        self._table_id = table_id
        self._load = load
        self._uri = uri
        self._shape = hyper or chunks
        self._factors = tuple(c // h for c, h in zip(chunks, self._shape, strict=True))
        self._table: Dataset | None = None
        #: Decoded table chunks (None: not stored) and what each counts, used last at the end.
        self._cache: OrderedDict[ChunkIndex, tuple[_Rows | None, int]] = OrderedDict()
        self._cached_bytes = 0

    @property
    def piece_shape(self) -> tuple[int, ...]:
        return self._shape

    async def _get_table(self) -> Dataset:
        if self._table is None:
            table = await self._load(self._table_id)
            if table.shape is None or len(table.shape) != len(self._shape):
                raise Corrupt(self._key, f"chunk table {self._table_id} has shape "
                                         f"{table.shape}, not rank {len(self._shape)}")
            if table.type.fixed_size:
                names = table.type.dtype.names or ()
                if len(names) < 2 or any(table.type.dtype[n].kind not in "iu" for n in names[:2]):
                    raise Corrupt(self._key, f"chunk table {self._table_id} is not made of "
                                             f"(offset, size[, file_uri]) rows")
            elif table.type.vlen is not VlenKind.JSON:
                raise Corrupt(self._key, f"chunk table {self._table_id} has type "
                                         f"{table.type.sidecar}")
            self._table = table
        return self._table

    async def _rows(self, table: Dataset, index: ChunkIndex) -> _Rows | None:
        """The decoded table chunk at ``index`` (None if not stored), through the cache."""
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index][0]
        rows = await self._read_rows(table, index)
        if index not in self._cache:  # another task may have read it meanwhile
            cost = ENTRY_OVERHEAD + (rows.nbytes if rows is not None else 0)
            self._cache[index] = (rows, cost)
            self._cached_bytes += cost
            while self._cached_bytes > TABLE_CACHE_BYTES and len(self._cache) > 1:
                _, (_, gone) = self._cache.popitem(last=False)
                self._cached_bytes -= gone
        return rows

    async def _read_rows(self, table: Dataset, index: ChunkIndex) -> _Rows | None:
        data = await table.read_chunk(index)
        if data is None:
            return None
        where = f"{self._key} (chunk table {self._table_id}, chunk {list(index)})"
        try:
            if table.type.fixed_size:
                arr = np.frombuffer(data, dtype=table.type.dtype).reshape(table.chunks)
                names = arr.dtype.names or ()
                uris = arr[names[2]] if len(names) > 2 else None
                return _Rows(arr[names[0]].astype(np.int64), arr[names[1]].astype(np.int64),
                             uris)
            items = numcodecs.JSON().decode(data).reshape(-1)
            locs = [location(item, where) for item in items]
            uris = np.empty(len(items), dtype=object)
            uris[:] = [item[2] if len(item) > 2 else None for item in items]
        except (FormatError, ValueError, TypeError) as exc:
            raise Corrupt(self._key, f"{where}: {exc}") from exc
        return _Rows(np.array([o for o, _ in locs], dtype=np.int64).reshape(table.chunks),
                     np.array([s for _, s in locs], dtype=np.int64).reshape(table.chunks),
                     uris.reshape(table.chunks))

    def _piece(self, rows: _Rows, local: tuple[int, ...], at: tuple[int, ...]) -> Piece | None:
        offset, size = int(rows.offsets[local]), int(rows.sizes[local])
        if size == 0:
            return None
        if offset < 0 or not 0 < size <= MAX_CHUNK_BYTES:
            raise Corrupt(self._key, f"chunk table {self._table_id} row {list(local)}: "
                                     f"bad offset {offset} or size {size}")
        uri = rows.uris[local] if rows.uris is not None else None
        if isinstance(uri, bytes | np.bytes_):
            uri = bytes(uri).rstrip(b"\0").decode("utf-8", "replace")
        uri = uri or self._uri
        if not isinstance(uri, str):
            raise Corrupt(self._key, f"chunk table {self._table_id} row {list(local)} has no "
                                     f"file_uri and the layout has none")
        return Piece(uri, offset, size, at)

    async def pieces(self, index: ChunkIndex) -> list[Piece]:
        table = await self._get_table()
        assert table.shape is not None
        wanted: dict[ChunkIndex, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
        for j in itertools.product(*(range(f) for f in self._factors)):
            h5 = tuple(i * f + k for i, f, k in zip(index, self._factors, j, strict=True))
            if all(h < n for h, n in zip(h5, table.shape, strict=True)):
                tindex = tuple(h // c for h, c in zip(h5, table.chunks, strict=True))
                local = tuple(h % c for h, c in zip(h5, table.chunks, strict=True))
                at = tuple(k * s for k, s in zip(j, self._shape, strict=True))
                wanted.setdefault(tindex, []).append((local, at))
        pieces: list[Piece] = []
        for tindex, items in wanted.items():
            rows = await self._rows(table, tindex)
            if rows is None:
                continue
            for local, at in items:
                piece = self._piece(rows, local, at)
                if piece is not None:
                    pieces.append(piece)
        return pieces

    async def indices(self) -> AsyncIterator[ChunkIndex]:
        table = await self._get_table()
        assert table.shape is not None
        seen: set[ChunkIndex] | None = set() if any(f > 1 for f in self._factors) else None
        async for tindex in table.store.iter_stored():
            rows = await self._rows(table, tindex)
            if rows is None:
                continue
            for local in zip(*np.nonzero(rows.sizes), strict=True):
                h5 = [t * c + int(k) for t, c, k in zip(tindex, table.chunks, local, strict=True)]
                if any(h >= n for h, n in zip(h5, table.shape, strict=True)):
                    continue
                index = tuple(h // f for h, f in zip(h5, self._factors, strict=True))
                if seen is not None:
                    if index in seen:
                        continue
                    seen.add(index)
                yield index
