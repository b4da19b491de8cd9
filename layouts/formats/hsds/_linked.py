"""Linked HSDS datasets (``hsload --link``): chunks that stay in an HDF5 file.

Owns what the linked layout classes of HSDS mean: the HSDS chunk grid of
each, and which chunk store of ``layouts.hdf5._linked`` reads it from the
original HDF5 file through the ``OpenUri`` resolver the catalog is given.
Where the HDF5 chunks are comes from ``layouts.formats.hsds._locations``. What HSDS
1.0.2 does, and so what is done here (``h5json/dset_util.py``
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

A chunk whose entries are absent or have size 0 is not stored (``read`` gives
None: the fill value).

``OpenUri`` maps a ``file_uri`` to the ``Store`` to read and the key in it:
``s3://bucket/key``, or on POSIX storage ``bucket/path/file.h5`` relative to
HSDS's ROOT_DIR. It is called without awaiting (so it must not block), once
per uri and chunk store, and raises ``StorageError`` naming the uri to refuse
one.

Concurrency: building a store is synchronous and keeps no shared state; the
stores' own rules are ``layouts.hdf5._linked``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from layouts.errors import FormatError
from layouts.formats.hsds._locations import ChunkTable, LoadTable, chunk_map
from layouts.hdf5 import (
    ChunkedRefStore,
    ContiguousRefStore,
    LinkedFiles,
    LinkedSpec,
    location,
    pipeline,
)
from layouts.model import ElementType
from layouts.storage import OpenUri

#: HSDS's upper chunk size for the grid of a contiguous dataset (h5json CHUNK_MAX).
CONTIGUOUS_CHUNK_MAX = 8096 * 1024
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
                               chunk_map(str(_uri(layout, True)), chunks, layout.get("chunks")))
    table_id = layout.get("chunk_table")
    if not isinstance(table_id, str):
        raise FormatError(f"H5D_CHUNKED_REF_INDIRECT needs a chunk_table id, got {table_id!r}")
    locator = ChunkTable(key, table_id, load_table, uri=_uri(layout, False), chunks=chunks,
                         hyper=_hyper_dims(layout, chunks))
    return ChunkedRefStore(spec, files, locator)
