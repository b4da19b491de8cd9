"""A catalog built from model objects in memory, for unit tests of the tree.

The tree's input is the object model; building that input directly lets the
tests state exact edge cases (cycles, name collisions, long names) that a
writer may not produce on demand. Chunk data is given as bytes per index.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

import numcodecs
import numpy as np

from layouts.formats.refs._types import type_json
from layouts.model import (
    AnyObject,
    ChunkIndex,
    Dataset,
    Domain,
    ElementType,
    Group,
    VlenKind,
    get_each,
    no_version,
    read_each,
)
from mountd.errors import MountError, NotFound


class MemoryChunks:
    def __init__(self, chunks: Mapping[ChunkIndex, bytes]) -> None:
        self.chunks = dict(chunks)

    async def read(self, index: ChunkIndex) -> bytes | None:
        return self.chunks.get(index)

    async def read_many(self, indices: Sequence[ChunkIndex]) -> list[bytes | MountError | None]:
        return await read_each(self, indices)

    async def exists(self, index: ChunkIndex) -> bool:
        return index in self.chunks

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        for index in list(self.chunks):
            yield index

    def listing_ready(self) -> bool:
        return False

    version = no_version


class MemoryCatalog:
    """Folders are given as name lists; objects by id within each domain."""

    supports_proof_ages = False

    def __init__(
        self,
        domains: Mapping[str, Domain],
        objects: Mapping[str, AnyObject],
        folders: Mapping[str, list[str]],
        single_domain: str | None = None,
    ) -> None:
        self.domains = dict(domains)
        self.objects = dict(objects)
        self.folders = dict(folders)
        self._single = single_domain

    @property
    def single_domain(self) -> str | None:
        return self._single

    async def list_folder(self, path: str) -> list[str]:
        if path not in self.folders:
            raise NotFound(path)
        return self.folders[path]

    async def domain(self, path: str) -> Domain | None:
        if path in self.domains:
            return self.domains[path]
        if path in self.folders:
            return None
        raise NotFound(path)

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        if obj_id not in self.objects:
            raise NotFound(obj_id)
        return self.objects[obj_id]

    async def get_objects(self, domain: Domain,
                          obj_ids: Sequence[str]) -> list[AnyObject | MountError]:
        return await get_each(self, domain, obj_ids)

    def drop(self) -> None:
        """Nothing is kept besides the objects given."""


def float_type() -> ElementType:
    dtype = np.dtype("<f4")
    return ElementType(dtype=dtype, sidecar=dtype.str, hdf5={"class": "H5T_FLOAT"})


def dataset(
    obj_id: str,
    data: np.ndarray,
    chunks: tuple[int, ...],
    stored: list[ChunkIndex] | None = None,
    fill: float = 0.0,
) -> Dataset:
    """A float32 dataset whose chunks are cut from ``data`` (padded with ``fill``)."""
    grid = [range(-(-n // c)) for n, c in zip(data.shape, chunks, strict=True)]
    blocks: dict[ChunkIndex, bytes] = {}
    for index in np.ndindex(*[len(g) for g in grid]):
        if stored is not None and index not in stored:
            continue
        block = np.full(chunks, fill, dtype="<f4")
        region = tuple(
            slice(i * c, min((i + 1) * c, n))
            for i, c, n in zip(index, chunks, data.shape, strict=True)
        )
        part = data[region]
        block[tuple(slice(0, s) for s in part.shape)] = part
        blocks[index] = block.tobytes()
    return Dataset(
        id=obj_id,
        shape=data.shape,
        maxshape=data.shape,
        type=float_type(),
        chunks=chunks,
        fill_value=np.float32(fill),
        store=MemoryChunks(blocks),
    )


def group(obj_id: str, **links: object) -> Group:
    return Group(id=obj_id, links=dict(links))  # type: ignore[arg-type]


def strings(obj_id: str, values: list[str], rows_per_chunk: int) -> Dataset:
    """A 1-D variable-length UTF-8 string dataset, chunks encoded as numcodecs
    ``VLenUTF8`` (edge chunks padded with the chunk's first value)."""
    codec = numcodecs.VLenUTF8()
    blocks: dict[ChunkIndex, bytes] = {}
    for k in range(-(-len(values) // rows_per_chunk)):
        got = values[k * rows_per_chunk:(k + 1) * rows_per_chunk]
        part = np.empty(rows_per_chunk, dtype=object)
        part[:] = [*got, *[got[0]] * (rows_per_chunk - len(got))]
        blocks[(k,)] = bytes(codec.encode(part))
    etype = ElementType(dtype=np.dtype(object), sidecar=VlenKind.UTF8.value,
                        hdf5={"class": "H5T_STRING", "charSet": "H5T_CSET_UTF8",
                              "length": "H5T_VARIABLE"},
                        vlen=VlenKind.UTF8)
    return Dataset(id=obj_id, shape=(len(values),), maxshape=(len(values),), type=etype,
                   chunks=(rows_per_chunk,), fill_value=None, store=MemoryChunks(blocks))


def table(obj_id: str, values: np.ndarray, rows_per_chunk: int) -> Dataset:
    """A 1-D dataset of compound type (a plain HDF5 table: it gets ``P.csv``)."""
    dtype = values.dtype
    blocks: dict[ChunkIndex, bytes] = {}
    for k in range(-(-len(values) // rows_per_chunk)):
        block = np.zeros(rows_per_chunk, dtype)
        part = values[k * rows_per_chunk:(k + 1) * rows_per_chunk]
        block[:len(part)] = part
        blocks[(k,)] = block.tobytes()
    etype = ElementType(dtype=dtype, sidecar=dtype.descr, hdf5=type_json(dtype))
    return Dataset(id=obj_id, shape=values.shape, maxshape=values.shape, type=etype,
                   chunks=(rows_per_chunk,), fill_value=np.zeros((), dtype)[()],
                   store=MemoryChunks(blocks))
