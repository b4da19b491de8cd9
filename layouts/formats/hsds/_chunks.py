"""Finding, listing and decoding the chunk objects of one HSDS dataset.

Owns ``HsdsChunkStore`` (the model's ``ChunkStore`` for HSDS), the filter plan
derived from a dataset's ``filters`` JSON and ``decode_chunk``, which turns a
stored chunk object into the chunk *file* of docs/CONTRACT.md, "Chunk files".

How HSDS 1.0.2 writes chunks (``hsds/util/storUtil.py`` ``_compress``,
``hsds/datanode_lib.py`` ``getFilterOps``), and so how they are read here:

1. With a compression filter, the bytes are a Blosc frame (gzip is Blosc with
   cname ``zlib``); Blosc undoes its own byte shuffle. Older servers wrote raw
   zlib of byte-shuffled data, so raw zlib is unshuffled afterwards.
2. Bitshuffle is applied only for a filter of class ``H5Z_FILTER_SHUFFLE`` named
   ``bitshuffle``: a 12-byte big-endian header (total bytes, block bytes) and
   bitshuffle-LZ4 blocks, then Blosc on top if compressed. A filter of class
   ``H5Z_FILTER_BITSHUFFLE`` is ignored by HSDS 1.0.2 (stored raw). The two are
   told apart by structure: a chunk is unshuffled when it is a consistent
   bitshuffle stream (header total equal to the chunk size, blocks filling it
   exactly), else taken raw if it has the chunk's size. Length alone cannot
   tell: a bitshuffle stream can be exactly the chunk's size.
3. Byte shuffle *without* a compressor is not applied by HSDS 1.0.2 (the
   bytes are stored raw, and HSDS's own reader wrongly unshuffles them).
4. Variable-length chunks are never shuffled. They are converted to the
   numcodecs encodings (``VLenUTF8``/``VLenBytes``/``VLenArray`` are the HSDS
   stream with a uint32 item count in front; ``JSON`` re-encodes the values).

No decoder produces more than the chunk can hold (``layouts.hdf5._inflate``): its
size for fixed-size elements, the bitshuffle worst case for a bitshuffled one,
``MAX_VLEN_CHUNK_BYTES`` for variable-length elements. A Blosc header stating
more, or a zlib stream holding more, makes the chunk ``Corrupt``.

``HsdsChunkStore.read_many`` reads a batch of chunk objects with one
``fetch_many`` of the store (one worker-thread call for a local bucket,
concurrent gets for a remote one), so tiny chunks do not each pay a thread
hop; a missing object reads as None and a bad one as its error, each on its own.

With a ``DecodedCache`` that keeps the store's chunks (``-o cache_decoded``
on a remote bucket), a chunk is first looked up there, by its key and a
token hashing its ``ChunkSpec`` (filters, types, chunk shape); a hit is
neither read nor decoded. A miss is read with ``fetch`` (for the etag the
bytes are of) and its decoded bytes are handed back to the cache.

Chunks are listed from the domain's ``DomainState`` (``layouts.formats.hsds._domains``)
when it has one, or makes one (object stores); else the chunk directory (and
its partition directories) is listed. A read of a chunk that a current state
shows is not stored (in a dataset of at most ``KNOWN_ABSENT`` chunks: a
scalar's value) is answered at once, with no request.

Concurrency: a store holds only immutable state and may be used from many trio
tasks. Decoding a chunk (or a batch) goes through ``layouts.decoding``: once
its stored and decoded size reaches ``THREAD_THRESHOLD`` it runs in a worker
thread under the process-wide ``DECODE_LIMITER``; numcodecs and bitshuffle
release the GIL.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import AsyncIterator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np

from layouts.decoding import DecodedCache, decode_sized, decoded_token
from layouts.errors import Corrupt, FormatError, LayoutError, NotFound
from layouts.formats.hsds import _ids
from layouts.formats.hsds._domains import DomainIndex
from layouts.formats.hsds._values import read_count, read_elements, to_plain
from layouts.gather import outcomes
from layouts.hdf5 import MAX_VLEN_CHUNK_BYTES, HType, blosc_sizes, filter_classes, inflate, unblosc
from layouts.model import ChunkIndex, ElementType, VlenKind, in_chunk_grid, store_grid
from layouts.storage import GET_MANY_CONCURRENCY, Fetched, Store

log = logging.getLogger(__name__)

_NOOP = {"H5Z_FILTER_NONE", "H5Z_FILTER_FLETCHER32", "H5Z_FILTER_NBIT",
         "H5Z_FILTER_SCALEOFFSET"}
_COMPRESSORS = {"H5Z_FILTER_DEFLATE", "H5Z_FILTER_LZF", "H5Z_FILTER_BLOSC", "H5Z_FILTER_SNAPPY",
                "H5Z_FILTER_LZ4", "H5Z_FILTER_LZ4HC", "H5Z_FILTER_ZSTD"}
_ITEM_COUNT = struct.Struct("<I")
#: Stored chunks a dataset may have for a read to be answered "not stored" from
#: its domain's listing (a membership test in that many names), with no request.
KNOWN_ABSENT = 64
#: Most chunks of a dataset listed for its ``version`` (one S3 listing page per
#: 1,000); a dataset with more has none, and its decoded chunks and page cache
#: last one ``metadata_ttl`` period.
MAX_VERSIONED_CHUNKS = 16_384


def _every_key(key: str) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class FilterPlan:
    """What a dataset's ``filters`` JSON means for reading its chunks."""

    compressed: bool = False
    deflate: bool = False
    shuffle: bool = False
    bitshuffle: bool = False
    #: Description of the first filter this reader does not know, if any.
    unknown: str | None = None


def filter_plan(filters: Any) -> FilterPlan:
    """Interpret HSDS filter JSON (a list of ``{class, id, name, ...}``)."""
    compressed = deflate = shuffle = bitshuffle = False
    unknown = None
    for cls, item in filter_classes(filters):
        if cls in _COMPRESSORS:
            compressed = True
            deflate = deflate or cls == "H5Z_FILTER_DEFLATE"
        elif cls == "H5Z_FILTER_SHUFFLE":
            if item.get("name") == "bitshuffle":
                bitshuffle = True
            else:
                shuffle = True
        elif cls == "H5Z_FILTER_BITSHUFFLE":
            bitshuffle = True
        elif cls not in _NOOP and unknown is None:
            unknown = f"{item.get('class')} (id {item.get('id')}, name {item.get('name')})"
    return FilterPlan(compressed, deflate, shuffle, bitshuffle, unknown)


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """Everything needed to decode one dataset's chunks, fixed at ``get_object``."""

    htype: HType
    etype: ElementType
    chunks: tuple[int, ...]
    plan: FilterPlan

    @property
    def elements(self) -> int:
        return math.prod(self.chunks)

    @property
    def nbytes(self) -> int | None:
        """Decoded size for fixed-size types, None for variable-length ones."""
        if self.etype.vlen is not None:
            return None
        return self.elements * self.etype.itemsize


# --------------------------------------------------------------------------- decoding


def _bitshuffle_limit(spec: ChunkSpec) -> int:
    """The most bytes a bitshuffle-LZ4 stream of a chunk of ``spec`` may have: the
    12-byte header, then per block of at least 8 elements its 4-byte size and LZ4's
    worst case for it (n + n/255 + 16), doubled to spare."""
    return 12 + 2 * (spec.nbytes or 0) + 40 * (spec.elements // 8 + 1)


def _limit(plan: FilterPlan, spec: ChunkSpec) -> int:
    """The most bytes the compressor of a chunk of ``spec`` may produce: the chunk's
    size, more for a bitshuffle stream, ``MAX_VLEN_CHUNK_BYTES`` for variable-length
    elements (whose serialized size no metadata states)."""
    if spec.nbytes is None:
        return MAX_VLEN_CHUNK_BYTES
    if plan.bitshuffle:
        return max(spec.nbytes, _bitshuffle_limit(spec))
    return spec.nbytes


def _decompress(raw: bytes, spec: ChunkSpec, key: str) -> tuple[bytes, str]:
    """Undo the compressor: (bytes, "blosc" | "zlib" | "raw"), never more than
    ``_limit`` bytes."""
    plan = spec.plan
    expected = spec.nbytes
    if not plan.compressed:
        return raw, "raw"
    limit = _limit(plan, spec)
    sizes = blosc_sizes(raw)
    if sizes is not None and 1 <= sizes[0] <= 5:
        _, nbytes, cbytes = sizes
        if cbytes != len(raw):
            raise Corrupt(key, f"Blosc frame says {cbytes} bytes but the object has {len(raw)}")
        if nbytes > limit:
            raise Corrupt(key, f"Blosc frame holds {nbytes} bytes, more than the chunk's "
                               f"{limit}")
        if expected is not None and not plan.bitshuffle and nbytes != expected:
            raise Corrupt(key, f"Blosc frame holds {nbytes} bytes, chunk needs {expected}")
        return unblosc(raw, limit, key), "blosc"
    if plan.deflate:
        try:
            return inflate(raw, limit, key, sized=expected is not None), "zlib"
        except Corrupt:
            if expected is None or len(raw) != expected:
                raise
    if expected is not None and len(raw) != expected:
        raise Corrupt(key, f"compressed chunk of {len(raw)} bytes is not a Blosc or zlib stream")
    return raw, "raw"


def _bitshuffle_problem(data: bytes, spec: ChunkSpec) -> str | None:
    """Why ``data`` is not a bitshuffle-LZ4 stream of a chunk of ``spec``, or None."""
    itemsize = spec.etype.itemsize
    if len(data) < 12:
        return "bitshuffle data shorter than its header"
    total = int.from_bytes(data[:8], "big")
    block_nbytes = int.from_bytes(data[8:12], "big")
    if total != spec.nbytes or block_nbytes <= 0 or block_nbytes % (8 * itemsize):
        return f"bad bitshuffle header (total {total}, block {block_nbytes} bytes)"
    problem = _bitshuffle_layout_problem(data, spec.elements, itemsize, block_nbytes // itemsize)
    return f"bad bitshuffle data: {problem}" if problem else None


def _bitunshuffle(data: bytes, spec: ChunkSpec, key: str) -> bytes:
    """Undo bitshuffle-LZ4 if ``data`` is such a stream; a chunk stored raw (the
    chunk's exact size and no valid stream) is returned as it is."""
    problem = _bitshuffle_problem(data, spec)
    if problem is not None:
        if len(data) == spec.nbytes:
            return data
        raise Corrupt(key, problem)
    itemsize = spec.etype.itemsize
    block_nbytes = int.from_bytes(data[8:12], "big")
    try:
        import bitshuffle  # noqa: PLC0415  (optional: only bitshuffled datasets need it)
    except ImportError as exc:
        raise Corrupt(key, "bitshuffle chunks need the 'bitshuffle' package") from exc
    try:
        arr = bitshuffle.decompress_lz4(
            np.frombuffer(data, dtype=np.uint8, offset=12), (spec.elements,),
            np.dtype(f"V{itemsize}"), block_nbytes // itemsize)
    except Exception as exc:  # the extension raises plain Exception/RuntimeError/ValueError
        raise Corrupt(key, f"bitshuffle decompression failed: {exc}") from exc
    return bytes(arr.tobytes())


def _bitshuffle_layout_problem(data: bytes, elements: int, itemsize: int,
                               block: int) -> str | None:
    """Check the block structure the bitshuffle C decoder trusts blindly.

    After the 12-byte header come ``elements // block`` blocks of ``block``
    elements, one block of the remainder rounded down to a multiple of 8 (if
    any), each as a 4-byte big-endian size plus that many LZ4 bytes, and then
    the last ``elements % 8`` elements raw. ``bshuf_decompress_lz4`` is not
    given the input length, so a short or padded stream must be refused here.
    """
    rest = elements % block
    blocks = elements // block + (1 if rest - rest % 8 else 0)
    pos = 12
    for _ in range(blocks):
        if pos + 4 > len(data):
            return f"ends inside a block header at byte {pos}"
        pos += 4 + int.from_bytes(data[pos:pos + 4], "big")
        if pos > len(data):
            return f"block ends past the data at byte {pos}"
    leftover = (elements % 8) * itemsize
    if pos + leftover != len(data):
        return f"{len(data)} bytes where the blocks need {pos + leftover}"
    return None


def _scan_vlen(data: bytes, count: int, itemsize: int | None) -> None:
    """Check that ``data`` is exactly ``count`` HSDS variable-length items."""
    pos = 0
    for _ in range(count):
        start = pos
        size, pos = read_count(data, pos)
        if itemsize and size % itemsize:
            raise FormatError(f"item at byte {start} has {size} bytes, "
                              f"not whole {itemsize}-byte values")
    if pos != len(data):
        raise FormatError(f"{len(data) - pos} unexpected bytes after {count} items")


def _encode_vlen(data: bytes, spec: ChunkSpec) -> bytes:
    kind = spec.etype.vlen
    count = spec.elements
    if kind is VlenKind.JSON:
        values = read_elements(spec.htype, data, count)
        arr = np.empty(count, dtype=object)
        for i, value in enumerate(values):
            arr[i] = to_plain(spec.htype, value, attr=False)
        return bytes(numcodecs.JSON().encode(arr.reshape(spec.chunks)))
    base = spec.etype.vlen_base
    _scan_vlen(data, count, base.itemsize if kind is VlenKind.ARRAY and base is not None else None)
    return _ITEM_COUNT.pack(count) + data


def decode_chunk(raw: bytes, spec: ChunkSpec, key: str) -> bytes:
    """A stored HSDS chunk object as chunk-file bytes (docs/CONTRACT.md, "Chunk files").
    Raises Corrupt."""
    plan = spec.plan
    if plan.unknown:
        raise Corrupt(key, f"unsupported filter {plan.unknown}")
    expected = spec.nbytes
    data, how = _decompress(raw, spec, key)
    if expected is None:
        try:
            return _encode_vlen(data, spec)
        except (FormatError, UnicodeDecodeError, ValueError) as exc:
            raise Corrupt(key, f"bad variable-length chunk: {exc}") from exc
    if plan.bitshuffle:
        data = _bitunshuffle(data, spec, key)
    elif plan.shuffle and how == "zlib" and spec.etype.itemsize > 1:
        data = bytes(numcodecs.Shuffle(spec.etype.itemsize).decode(data))
    if len(data) != expected:
        raise Corrupt(key, f"chunk decodes to {len(data)} bytes, expected {expected}")
    return data


# --------------------------------------------------------------------------- the store


class HsdsChunkStore:
    """The stored chunks of one dataset: ``ChunkStore`` for the object model.

    ``shape`` is None for an ``H5S_NULL`` dataset (no chunks) and ``()`` for a
    scalar (one chunk, index ``(0,)``, key ``0``). ``partition_count`` (>= 2)
    puts chunks under ``p<P>/``. Schema v1 datasets (``dset.is_v2`` False)
    keep their chunks as ``md5(chunk_id)[:5]-chunk_id`` keys at the bucket top.
    ``decoded`` keeps decoded chunks, if it keeps those of ``store``.
    """

    __slots__ = ("_decoded", "_dset", "_grid", "_index", "_partitions", "_shape", "_spec",
                 "_store", "_token")

    def __init__(self, store: Store, dset: _ids.HsdsId, shape: tuple[int, ...] | None,
                 spec: ChunkSpec, partition_count: int = 0, *,
                 domain_index: DomainIndex | None = None,
                 decoded: DecodedCache | None = None) -> None:
        self._store = store
        self._index = domain_index
        self._decoded = decoded if decoded is not None and decoded.keeps(store) else None
        self._token = decoded_token("hsds", spec) if self._decoded is not None else ""
        self._dset = dset
        self._shape = shape
        self._spec = spec
        self._partitions = partition_count if partition_count >= 2 else 0
        self._grid = store_grid(shape, spec.chunks)

    @property
    def spec(self) -> ChunkSpec:
        return self._spec

    def _in_grid(self, index: Sequence[int]) -> bool:
        return self._grid is not None and in_chunk_grid(index, self._grid)

    def key(self, index: ChunkIndex) -> str:
        """The storage key of the chunk at ``index`` (which must be in the grid)."""
        name = _ids.chunk_name(index)
        if not self._dset.is_v2:
            return _ids.v1_key(f"c-{self._dset.id[2:]}_{name}")
        prefix = self._dset.chunk_dir()
        if self._partitions:
            prefix += f"p{_ids.partition_of(index, self._partitions)}/"
        return prefix + name

    async def exists(self, index: ChunkIndex) -> bool:
        if not self._in_grid(index):
            return False
        return await self._store.exists(self.key(index))

    def _listed_chunks(self) -> list[str] | None:
        """The chunk names the domain's current listing shows, if it has one."""
        if self._index is None or self._dset.uuid1 is None:
            return None
        state = self._index.fresh(self._dset.uuid1)
        return None if state is None else state.listing.chunks.get(self._dset.uuid2 or "", [])

    def _not_stored(self, key: str) -> bool:
        """True if the domain's current listing shows ``key`` is not stored: a
        dataset of a few chunks (a scalar's one) is not asked for one it lacks."""
        names = self._listed_chunks()
        return names is not None and len(names) <= KNOWN_ABSENT and \
            key[len(self._dset.chunk_dir()):] not in names

    async def read(self, index: ChunkIndex) -> bytes | None:
        if not self._in_grid(index):
            return None
        if self._spec.plan.unknown:
            # Named by the dataset's JSON: that is what is wrong, and it is logged once.
            raise Corrupt(self._dset.json_key(), f"unsupported filter {self._spec.plan.unknown}")
        key = self.key(index)
        if self._not_stored(key):
            return None
        if self._decoded is not None:
            return await self._read_kept(key, self._decoded)
        try:
            raw = await self._store.get(key)
        except NotFound:
            return None
        return await self._decode(raw, key)

    async def _read_kept(self, key: str, decoded: DecodedCache) -> bytes | None:
        """``read`` through the ``DecodedCache``: its bytes, else read, decode and keep."""
        try:
            kept = await decoded.get(self._store, key, self._token)
            if kept is not None:
                return kept
            fetched = await self._store.fetch(key)
        except NotFound:
            return None
        data = await self._decode(fetched.data, key)
        await decoded.put(self._store, key, self._token, fetched.info.etag, data)
        return data

    async def _decode(self, raw: bytes, key: str) -> bytes:
        if not raw:
            raise Corrupt(key, "chunk object is empty")
        return await decode_sized(len(raw) + (self._spec.nbytes or len(raw)),
                                  decode_chunk, raw, self._spec, key)

    async def read_many(self, indices: Sequence[ChunkIndex]) -> list[bytes | LayoutError | None]:
        """``read`` of every index, in order, each a chunk, None or the error: the
        objects are read with one ``fetch_many`` and decoded together (in one
        worker-thread call once the batch reaches ``THREAD_THRESHOLD``); with a
        ``DecodedCache``, only those it does not hold."""
        if self._spec.plan.unknown:
            raise Corrupt(self._dset.json_key(), f"unsupported filter {self._spec.plan.unknown}")
        out: list[bytes | LayoutError | None] = [None] * len(indices)
        where: list[int] = []
        keys: list[str] = []
        for pos, index in enumerate(indices):
            if self._in_grid(index):
                where.append(pos)
                keys.append(self.key(index))
        if not keys:
            return out
        if self._decoded is not None:
            await self._read_many_kept(out, where, keys, self._decoded)
        else:
            fetched = await self._store.fetch_many(keys)
            await self._decode_into(out, where, keys,
                                    [f.data if isinstance(f, Fetched) else f for f in fetched])
        return out

    async def _read_many_kept(self, out: list[bytes | LayoutError | None], where: list[int],
                              keys: list[str], decoded: DecodedCache) -> None:
        """``read_many`` through the ``DecodedCache``: what it holds goes to ``out``
        (or the error of validating it); the rest is read, decoded and kept."""
        token = self._token
        found = await outcomes(lambda key: decoded.get(self._store, key, token), keys,
                               GET_MANY_CONCURRENCY)
        misses = [(pos, key) for pos, key, kept in zip(where, keys, found, strict=True)
                  if kept is None]
        for pos, kept in zip(where, found, strict=True):
            out[pos] = kept
        if not misses:
            return
        keys = [key for _, key in misses]
        fetched = await outcomes(self._store.fetch, keys, GET_MANY_CONCURRENCY)
        values = await self._decode_into(
            out, [pos for pos, _ in misses], keys,
            [f.data if isinstance(f, Fetched) else f for f in fetched])
        for key, got, value in zip(keys, fetched, values, strict=True):
            if isinstance(got, Fetched) and value is not None \
                    and not isinstance(value, LayoutError):
                await decoded.put(self._store, key, token, got.info.etag, value)

    async def _decode_into(self, out: list[bytes | LayoutError | None], where: list[int],
                           keys: list[str], raws: Sequence[bytes | LayoutError]
                           ) -> list[bytes | LayoutError | None]:
        """Decode ``raws`` (of ``keys``) together into ``out`` at ``where``; the values."""
        nbytes = sum(len(raw) for raw in raws if not isinstance(raw, LayoutError)) + \
            (self._spec.nbytes or 0) * len(keys)
        values = await decode_sized(nbytes, self._decode_all, keys, raws)
        for pos, value in zip(where, values, strict=True):
            out[pos] = value
        return values

    def _decode_all(self, keys: Sequence[str],
                    raws: Sequence[bytes | LayoutError]) -> list[bytes | LayoutError | None]:
        out: list[bytes | LayoutError | None] = []
        for key, raw in zip(keys, raws, strict=True):
            if isinstance(raw, NotFound):
                out.append(None)
            elif isinstance(raw, LayoutError):
                out.append(raw)
            elif not raw:
                out.append(Corrupt(key, "chunk object is empty"))
            else:
                try:
                    out.append(decode_chunk(raw, self._spec, key))
                except Corrupt as exc:
                    out.append(exc)
        return out

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        if self._grid is None:
            return
        if not self._dset.is_v2:
            async for index in self._iter_v1():
                yield index
            return
        if self._index is not None and self._dset.uuid1 is not None:
            state = await self._index.state(self._dset.uuid1, 0, chunks=True)
            if state is not None:
                for index in self._indexed(state.listing.chunks.get(self._dset.uuid2 or "", [])):
                    yield index
                return
        base = self._dset.chunk_dir()
        if not self._partitions:
            async for index in self._iter_dir(base, None):
                yield index
            return
        try:
            listing = await self._store.list_dir(base)
        except NotFound:
            return
        for prefix in listing.prefixes:
            name = prefix[len(base):].rstrip("/")
            number = name[1:]
            if name[:1] != "p" or not number.isdigit() or int(number) >= self._partitions:
                continue
            async for index in self._iter_dir(prefix, int(number)):
                yield index

    async def version(self) -> Mapping[ChunkIndex, Hashable] | None:
        """Each stored chunk's validator (etag, time), from one listing of the
        chunk directory with infos (a local scan with ``stat``; on S3,
        ListObjectsV2 pages, which also revalidate the block cache's copies);
        None for a v1 layout, past ``MAX_VERSIONED_CHUNKS``, or when the
        domain's current listing, which ``read`` trusts for chunks not stored,
        shows other chunks (it is older: this period cannot vouch). Keys that
        name no chunk of the grid are left out, as ``read`` leaves them."""
        if self._grid is None:
            return {}
        if not self._dset.is_v2:
            return None
        names = self._listed_chunks()
        if names is not None and len(names) > MAX_VERSIONED_CHUNKS:
            return None
        base = self._dset.chunk_dir()
        listed = await self._store.list_tree(base, _every_key, MAX_VERSIONED_CHUNKS)
        if listed is None:
            return None
        # The dataset's own JSON lives there too: its description is the tree's
        # part of a version, and a new attribute changes no chunk.
        found = [(key, info) for key, info in listed if not key.rpartition("/")[2].startswith(".")]
        # ``read`` answers "not stored" from the domain's listing: a version holds
        # only if that listing (made before this one, or since) shows these chunks.
        names = self._listed_chunks()
        if names is not None and set(names) != {key[len(base):] for key, _ in found}:
            return None
        validators: dict[ChunkIndex, Hashable] = {}
        for key, info in found:
            index = self._index_of(key[len(base):])
            if index is not None:
                validators[index] = None if info is None else (info.etag, info.mtime)
        return validators

    def listing_ready(self) -> bool:
        """True for a dataset with no chunks, or whose domain's listing is current."""
        if self._grid is None:
            return True
        uuid1 = self._dset.uuid1
        return self._index is not None and uuid1 is not None and \
            self._index.fresh(uuid1) is not None

    def _indexed(self, names: list[str]) -> Iterator[ChunkIndex]:
        """The chunks among the names a domain listing found under the chunk
        directory."""
        for listed in names:
            index = self._index_of(listed)
            if index is not None:
                yield index

    def _index_of(self, listed: str) -> ChunkIndex | None:
        """The chunk a name under the chunk directory stands for, by the same
        rules as listing it (``_iter_dir``); None if it names none."""
        partition: int | None = None
        name = listed
        if self._partitions:
            head, sep, name = listed.partition("/")
            number = head[1:]
            if not sep or head[:1] != "p" or not number.isdigit() or \
                    int(number) >= self._partitions:
                return None
            partition = int(number)
        elif "/" in name:
            return None
        index = _ids.parse_chunk_name(name, len(self._grid or ()))
        if index is None or not self._in_grid(index):
            return None
        if partition is not None and _ids.partition_of(index, self._partitions) != partition:
            return None
        return index

    async def _keys(self, prefix: str) -> AsyncIterator[str]:
        """The keys (not sub-prefixes) directly under ``prefix``, page by page."""
        try:
            async for key in self._store.iter_dir(prefix):
                if not key.endswith("/"):
                    yield key
        except NotFound:
            return

    async def _iter_dir(self, prefix: str, partition: int | None) -> AsyncIterator[ChunkIndex]:
        rank = len(self._grid or ())
        async for key in self._keys(prefix):
            index = _ids.parse_chunk_name(key[len(prefix):], rank)
            if index is None or not self._in_grid(index):
                continue
            if partition is None or _ids.partition_of(index, self._partitions) == partition:
                yield index

    async def _iter_v1(self) -> AsyncIterator[ChunkIndex]:
        stem = f"c-{self._dset.id[2:]}_"
        rank = len(self._grid or ())
        async for key in self._keys(""):
            head, sep, rest = key.partition("-")
            if not sep or len(head) != 5 or not rest.startswith(stem):
                continue
            index = _ids.parse_chunk_name(rest[len(stem):], rank)
            if index is not None and self._in_grid(index) and key == self.key(index):
                yield index
