"""LINDI ``_EXTERNAL_ARRAY_LINK`` datasets: chunks read from the HDF5 file itself.

LINDI leaves the chunks of a dataset with more than 1000 of them out of the
reference file and names the HDF5 file and dataset instead. This module owns
reading those: ``H5ExternalArrays`` opens each such file once with h5py over
``BlockFile``, a file-like object whose reads go through the mount's
``OpenUri`` (for a URL, the shared block cache). h5py only ever runs in a trio
worker thread; its reads come back to the trio loop with
``trio.from_thread.run``.

How a dataset is read is planned once, from h5py's view of it:

* chunked, with the same chunk shape as the ``.zarray``, no filter skipped
  in any chunk, and filters ``layouts.hdf5._filters`` can undo: h5py gives each
  stored chunk's byte range, and chunks are then read exactly like a linked
  HSDS dataset (``layouts.hdf5._linked.ChunkedRefStore``): parallel range reads,
  neighbours merged, decoded in worker threads. This is the fast path large
  arrays take.
* contiguous and unfiltered: one byte span, cut into the ``.zarray`` grid
  (``h5linked.ContiguousRefStore``).
* anything else (compact, other grids, unknown filters, variable-length
  types): h5py reads each chunk's region itself, serially, and the result is
  padded to the full chunk with the fill value.

Decompression is bounded on every path. The linked stores decode with
``layouts.hdf5._filters`` (capped at the chunk's size). libhdf5 is not capped (its
deflate filter grows its buffer until the stream ends), so before h5py reads
a region of a filtered dataset, each stored HDF5 chunk it touches is read and
checked by ``h5filters.check_for_hdf5`` against that chunk's size in the
file; a bomb is ``Corrupt`` for that chunk only, and so is a chunk of a filter
that check cannot bound (Blosc2, SZ, ZFP and other plugins). Residual risk,
in libhdf5: the global heap objects of variable-length elements, whose stated
lengths h5py allocates.

Concurrency: any number of trio tasks may read. Opening a file and planning
a dataset are single-flight (a ``trio.Lock`` each); the results are kept for
the mount's life. h5py calls are serialised by h5py's own lock.
"""

from __future__ import annotations

import io
import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import h5py
import numcodecs
import numpy as np
import trio

from layouts.errors import Corrupt, LayoutError, NotFound, StorageError
from layouts.formats.refs._catalog import DatasetShape
from layouts.hdf5 import (
    ChunkedRefStore,
    ChunkMap,
    ContiguousRefStore,
    LinkedFiles,
    LinkedSpec,
    check_for_hdf5,
    location,
    pipeline,
    stored_limit,
)
from layouts.model import (
    ChunkIndex,
    ChunkStore,
    VlenKind,
    chunk_grid,
    in_chunk_grid,
    no_version,
    read_each,
)
from layouts.storage import OpenUri

log = logging.getLogger(__name__)

T = TypeVar("T")

#: h5py calls run one at a time per file anyway (h5py's lock); more threads only wait.
_H5PY_LIMITER = trio.CapacityLimiter(2)


class BlockFile(io.RawIOBase):
    """A read-only, seekable file over ``LinkedFiles.read``, for h5py in a worker thread.

    Every read is one ``trio.from_thread.run`` call back to the trio loop, so
    this object may only be used from a thread started by ``trio.to_thread``.
    """

    def __init__(self, url: str, size: int, files: LinkedFiles) -> None:
        super().__init__()
        self._url = url
        self._size = size
        self._files = files
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        count = max(0, min(len(view), self._size - self._pos))
        if count == 0:
            return 0
        data = trio.from_thread.run(self._files.read, self._url, self._pos, count)
        view[:count] = data
        self._pos += count
        return count


class _H5File:
    """One HDF5 file opened with h5py, once, on first use."""

    def __init__(self, url: str, open_uri: OpenUri) -> None:
        self.url = url
        self.files = LinkedFiles(open_uri)
        self._open_uri = open_uri
        self._lock = trio.Lock()
        self._file: h5py.File | None = None

    async def run(self, fn: Callable[[h5py.File], T]) -> T:
        """``fn(file)`` in a worker thread, the file opened first."""
        h5 = await self._opened()
        return await trio.to_thread.run_sync(fn, h5, limiter=_H5PY_LIMITER)

    async def _opened(self) -> h5py.File:
        async with self._lock:
            if self._file is None:
                store, key = self._open_uri(self.url)
                try:
                    size = (await store.head(key)).size
                except NotFound:
                    raise StorageError(self.url, "external array file not found") from None
                raw = BlockFile(self.url, size, self.files)
                try:
                    self._file = await trio.to_thread.run_sync(
                        lambda: h5py.File(raw, "r"), limiter=_H5PY_LIMITER)
                except OSError as exc:
                    raise Corrupt(self.url, f"not an HDF5 file h5py can open: {exc}") from exc
                log.debug("opened external array file %s (%d bytes)", self.url, size)
            return self._file


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one external dataset is read: a linked store, or h5py per chunk."""

    stored: frozenset[ChunkIndex]
    fast: ChunkedRefStore | ContiguousRefStore | None


def _chunk_key(index: ChunkIndex) -> str:
    return "_".join(map(str, index))


class ExternalArrayStore:
    """The ``ChunkStore`` of one ``_EXTERNAL_ARRAY_LINK`` dataset."""

    def __init__(self, file: _H5File, name: str, shape: DatasetShape) -> None:
        self._file = file
        self._name = name
        self._shape = shape
        self._grid = chunk_grid(shape.shape, shape.chunks)
        self._lock = trio.Lock()
        self._plan: _Plan | None = None

    @property
    def _what(self) -> str:
        return f"{self._file.url}::{self._name}"

    def _in_grid(self, index: ChunkIndex) -> bool:
        return in_chunk_grid(index, self._grid)

    async def _get_plan(self) -> _Plan:
        async with self._lock:
            if self._plan is None:
                try:
                    self._plan = await self._file.run(self._make_plan)
                except KeyError:
                    raise StorageError(self._what, "no such dataset in the HDF5 file") from None
            return self._plan

    def _make_plan(self, h5: h5py.File) -> _Plan:
        """Runs in a worker thread."""
        ds = h5[self._name]
        if not isinstance(ds, h5py.Dataset):
            raise StorageError(self._what, "not a dataset")
        spec = self._shape
        if tuple(ds.shape) != spec.shape:
            raise Corrupt(self._what, f"HDF5 dataset has shape {ds.shape}, the reference "
                                      f"file says {list(spec.shape)}")
        dsid = ds.id
        if ds.chunks is not None:
            return self._chunked_plan(ds, dsid)
        everything = frozenset(np.ndindex(*self._grid)) if math.prod(spec.shape) else frozenset()
        offset = dsid.get_offset()
        layout = dsid.get_create_plist().get_layout()
        if layout == h5py.h5d.CONTIGUOUS and offset is None:
            return _Plan(frozenset(), None)  # never written: every chunk is the fill value
        if layout == h5py.h5d.CONTIGUOUS and ds.dtype.kind not in "OV" and \
                ds.dtype.itemsize == spec.dtype.itemsize:
            linked = self._linked_spec(pipeline([]))
            fast = ContiguousRefStore(linked, self._file.files, self._file.url, offset,
                                      dsid.get_storage_size())
            return _Plan(everything, fast)
        return _Plan(everything, None)

    def _linked_spec(self, pipe: Any) -> LinkedSpec:
        spec = self._shape
        return LinkedSpec(self._what, spec.shape, spec.chunks, spec.dtype.itemsize, spec.fill,
                          pipe)

    def _chunked_plan(self, ds: h5py.Dataset, dsid: Any) -> _Plan:
        spec = self._shape
        plist = dsid.get_create_plist()
        filters = [{"id": code, "name": name.decode(errors="replace")}
                   for code, _flags, _values, name in
                   (plist.get_filter(i) for i in range(plist.get_nfilters()))]
        pipe = pipeline(filters)
        entries: dict[ChunkIndex, list[int]] = {}
        masked = False
        chunks = tuple(ds.chunks)
        for i in range(dsid.get_num_chunks()):
            info = dsid.get_chunk_info(i)
            if info.byte_offset is None or not info.size:
                continue
            masked = masked or info.filter_mask != 0
            index = tuple(o // c for o, c in zip(info.chunk_offset, chunks, strict=True))
            entries[index] = [info.byte_offset, info.size]
        if chunks != spec.chunks:
            # Other grids: a .zarray chunk is stored if any HDF5 chunk overlaps it.
            stored: set[ChunkIndex] = set()
            for index in entries:
                spans = [range(o * h // c, (min((o + 1) * h, n) - 1) // c + 1)
                         for o, h, c, n in zip(index, chunks, spec.chunks, spec.shape,
                                               strict=True)]
                stored.update(itertools.product(*spans))
            return _Plan(frozenset(stored), None)
        stored = frozenset(entries)
        if masked or pipe.unknown or ds.dtype.kind in "O" or \
                ds.dtype.itemsize != spec.dtype.itemsize:
            log.debug("%s: read through h5py (filter mask %s, unknown filter %s)",
                      self._what, masked, pipe.unknown)
            return _Plan(stored, None)
        # Read as linked chunks: each location is held to a stored chunk's bounds first.
        locations = {index: location(value, f"chunk {_chunk_key(index)}")
                     for index, value in entries.items()}
        fast = ChunkedRefStore(self._linked_spec(pipe), self._file.files,
                               ChunkMap(self._file.url, chunks, locations))
        return _Plan(stored, fast)

    async def exists(self, index: ChunkIndex) -> bool:
        return self._in_grid(index) and index in (await self._get_plan()).stored

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        for index in sorted((await self._get_plan()).stored):
            yield index

    def listing_ready(self) -> bool:
        return False

    version = no_version

    async def read(self, index: ChunkIndex) -> bytes | None:
        if not self._in_grid(index):
            return None
        plan = await self._get_plan()
        if index not in plan.stored:
            return None
        if plan.fast is not None:
            return await plan.fast.read(index)
        try:
            return await self._file.run(lambda h5: self._read_region(h5, index))
        except LayoutError:
            raise
        except (OSError, ValueError, TypeError) as exc:
            raise Corrupt(self._what, f"h5py cannot read chunk {list(index)}: {exc}") from exc

    async def read_many(self, indices: Sequence[ChunkIndex]
                        ) -> list[bytes | LayoutError | None]:
        """No batch read of its own: chunk by chunk (``read_each``)."""
        return await read_each(self, indices)

    def _check_filtered(self, ds: h5py.Dataset, region: tuple[slice, ...]) -> None:
        """Before libhdf5 undoes the filters of the stored chunks ``region`` touches,
        check each with ``check_for_hdf5`` (worker thread; reads go to the trio loop).
        Raises Corrupt naming the chunk's bytes (``url@offset``)."""
        if ds.chunks is None:
            return
        dsid = ds.id
        plist = dsid.get_create_plist()
        filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
        if not filters:
            return
        chunks = tuple(ds.chunks)
        nbytes = math.prod(chunks) * _file_itemsize(ds)
        starts = [range(part.start // c * c, part.stop, c)
                  for part, c in zip(region, chunks, strict=True)]
        for offset in itertools.product(*starts):
            info = dsid.get_chunk_info_by_coord(offset)
            if info.byte_offset is None or not info.size:
                continue
            key = f"{self._file.url}@{info.byte_offset}"
            if info.size > stored_limit(nbytes):
                raise Corrupt(key, f"stored chunk of {info.size} bytes, too large for a "
                                   f"{nbytes}-byte chunk")
            raw = trio.from_thread.run(self._file.files.read, self._file.url,
                                       info.byte_offset, info.size)
            active = [(code, values) for bit, (code, _flags, values, _name) in enumerate(filters)
                      if not info.filter_mask >> bit & 1]
            check_for_hdf5(raw, active, nbytes, key)

    def _read_region(self, h5: h5py.File, index: ChunkIndex) -> bytes:
        """One chunk read by h5py (worker thread), padded with the fill value;
        variable-length types encoded with their numcodecs codec."""
        spec = self._shape
        region = tuple(slice(i * c, min((i + 1) * c, n))
                       for i, c, n in zip(index, spec.chunks, spec.shape, strict=True))
        ds = h5[self._name]
        self._check_filtered(ds, region)
        data = np.asarray(ds[region])
        inside = tuple(slice(0, s) for s in data.shape)
        if spec.vlen is not None:
            block = np.full(spec.chunks, None, dtype=object)
            block[inside] = data
            return _encode_vlen(block.reshape(-1), spec.vlen, self._what)
        data = data.astype(spec.dtype, copy=False)
        if data.shape == spec.chunks:
            return data.tobytes()
        block = np.empty(spec.chunks, dtype=spec.dtype)
        block[...] = np.frombuffer(spec.fill, dtype=spec.dtype)[0]
        block[inside] = data
        return block.tobytes()


def _file_itemsize(ds: h5py.Dataset) -> int:
    """An upper bound on the bytes one element of ``ds`` takes in the file: its
    type's size, or for types with variable-length parts (16 bytes each in the file:
    length, heap address, index; h5py's type counts 8 or 16) twice that plus 16."""
    size = int(ds.id.get_type().get_size())
    return 2 * size + 16 if ds.dtype.hasobject else size


def _encode_vlen(items: np.ndarray, vlen: VlenKind, what: str) -> bytes:
    """Variable-length elements as the chunk file holds them (docs/CONTRACT.md,
    "Chunk files"); unset elements (None, outside the dataset) are empty."""
    if vlen is VlenKind.UTF8:
        texts = [x.decode("utf-8", "surrogateescape") if isinstance(x, bytes)
                 else "" if x is None else str(x) for x in items]
        return bytes(numcodecs.VLenUTF8().encode(np.array(texts, dtype=object)))
    if vlen is VlenKind.BYTES:
        raw = [b"" if x is None else bytes(x) if isinstance(x, bytes | bytearray)
               else str(x).encode() for x in items]
        return bytes(numcodecs.VLenBytes().encode(np.array(raw, dtype=object)))
    raise Corrupt(what, f"h5py cannot give {vlen.value} elements of an external array")


class H5ExternalArrays:
    """Implements ``ExternalArrays`` (``_catalog``): one h5py file per URL, opened lazily."""

    def __init__(self, open_uri: OpenUri) -> None:
        self._open_uri = open_uri
        self._files: dict[str, _H5File] = {}

    def store(self, url: str, name: str, dataset: DatasetShape) -> ChunkStore:
        file = self._files.get(url)
        if file is None:
            file = self._files[url] = _H5File(url, self._open_uri)
        return ExternalArrayStore(file, name, dataset)

