"""The ``Catalog`` over a LINDI or kerchunk reference file: ``RefCatalog``.

A reference file describes one HDF5 file as Zarr v2 keys (``layouts.formats.refs._table``
reads it into a ``RefTable``). This module owns what the keys mean as HDF5
objects, shown as the HSDS reader shows the same file:

* Object ids are HDF5 paths (``/``, ``/g1/dset``). A prefix with ``.zgroup``
  is a group, one with ``.zarray`` a dataset; a missing intermediate
  ``.zgroup`` is an implicit group. A group whose ``.zattrs`` holds
  ``_SOFT_LINK {path}`` (and nothing below it) is a soft link in its parent.
  LINDI refuses HDF5 external links, so there are none; a hard link to one
  object twice is written twice by LINDI, so it shows as two objects.
* Datasets come from ``.zarray`` plus the ``_SCALAR``, ``_COMPOUND_DTYPE``
  and ``_EXTERNAL_ARRAY_LINK`` annotations (``layouts.formats.refs._types``); chunks
  are read from inline bytes or byte ranges and decoded by
  ``layouts.formats.refs._codecs``. A ``json2`` object array is told apart as strings
  or object references by the ``_REFERENCE`` objects of its first chunk.
* ``_EXTERNAL_ARRAY_LINK`` datasets (more than 1000 chunks, not listed in
  the file) are read through the ``ExternalArrays`` given, on the grid of
  their ``.zarray``; without one, their chunk reads raise ``StorageError``.
* What the reference format does not keep is shown as HSDS shows an HDF5
  file without it: ``maxshape`` is ``shape``, times are the reference file's
  mtime, the domain has no ``info``.

One pass over the keys at construction builds the index (children of each
group, stored chunk names of each dataset as one newline-joined string);
it takes time in proportion to the number of refs, so callers with very
large files may construct the catalog in a worker thread.

Errors: ``NotFound`` for an id that names nothing; ``Corrupt`` naming the key
for metadata that is not valid, on that object only; read errors of the
storage (``StorageError``, ``Forbidden``) propagate unchanged.

A reference file may be hostile, so its metadata is held to the bounds every
reader shares (``layouts.bounds``: ``check_sizes``, ``check_json``): a
``.zattrs`` or ``.zarray`` is read capped at ``max_metadata`` bytes and nested
at most ``MAX_JSON_DEPTH`` deep, a ``.zarray`` has at most ``MAX_RANK``
dimensions. A child whose name no file name can show
(``bounds.link_name_problem``: empty, from a key with ``//``; not valid
Unicode) is left out of its group, logged once per group. The key index is
built without recursion, and the paths of implicit groups it makes up are
bounded by ``MAX_IMPLICIT_BYTES`` in all, so keys nested ever deeper without
``.zgroup`` cannot make it grow faster than the file.

Concurrency: objects are built lazily and memoised; the memo is filled with
no await between its check and its set (``dict.setdefault``), so any number
of trio tasks may call the catalog and a race only builds an object twice.
Chunks are decoded through ``layouts.decoding`` (in a worker thread once they
reach ``THREAD_THRESHOLD`` bytes). The ``OpenUri`` given must not block.

With a ``DecodedCache`` (``-o cache_decoded``), a chunk stored as a byte
range of a file the cache keeps is first looked up there, by the file's key
and a token of the range and a hash of the dataset's ``ChunkSpec`` (codecs,
types, chunk shape, fill, order); a hit is neither read nor decoded. Inline
chunks and ``_EXTERNAL_ARRAY_LINK`` datasets are not kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from layouts.bounds import MAX_RANK, check_json, check_sizes, link_name_problem
from layouts.decoding import DecodedCache, decode_sized, decoded_token
from layouts.errors import (
    Corrupt,
    Forbidden,
    FormatError,
    LayoutError,
    Missing,
    NotFound,
    StorageError,
    report_once,
)
from layouts.formats.refs._codecs import (
    ChunkSpec,
    Codecs,
    Kind,
    codecs,
    decode_bytes,
    decode_chunk,
    has_references,
)
from layouts.formats.refs._table import BadRef, RangeRef, Ref, RefFormatError, RefTable
from layouts.formats.refs._types import (
    REFERENCE_WIDTH,
    VLEN_ASCII_JSON,
    VLEN_UTF8_JSON,
    ZArray,
    attributes,
    compound_type,
    fill_value,
    parse_zarray,
    reference_json,
    type_json,
)
from layouts.hdf5 import LinkedFiles, element_type, parse_type
from layouts.model import (
    AnyObject,
    Attribute,
    ChunkIndex,
    ChunkStore,
    Dataset,
    Domain,
    Group,
    Link,
    LinkKind,
    ObjectKind,
    VlenKind,
    chunk_grid,
    get_each,
    in_chunk_grid,
    no_version,
    read_each,
)
from layouts.storage import DEFAULT_MAX_METADATA, ByteRange, Fetched, OpenUri, Store, too_large

log = logging.getLogger(__name__)

ROOT_ID = "/"
#: Most bytes of paths of implicit groups (prefixes with children but no
#: ``.zgroup``) the key index makes up; keys that would need more are left out.
MAX_IMPLICIT_BYTES = 64 << 20
#: Children with unshowable names named in the one log line of their group.
LOGGED_BAD_NAMES = 3


@dataclass(frozen=True, slots=True)
class DatasetShape:
    """What an ``ExternalArrays`` store needs to know of one dataset.

    ``chunks`` is the grid of the ``.zarray`` (the HDF5 chunking, for LINDI);
    ``dtype`` the chunk file's element dtype (``object`` for variable-length
    types, then encoded as ``vlen`` says); ``fill`` one element of the fill
    value (``b""`` for variable-length types); ``key`` names the dataset in
    messages (its ``.zarray`` key).
    """

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype[Any]
    fill: bytes
    key: str
    vlen: VlenKind | None = None


class ExternalArrays(Protocol):
    """Reads the chunks of ``_EXTERNAL_ARRAY_LINK`` datasets from their HDF5 file.

    ``url`` is already resolved (``RefTable.resolve``); ``name`` is the
    dataset's path in that file. Called without awaiting: must not block.
    """

    def store(self, url: str, name: str, dataset: DatasetShape) -> ChunkStore: ...


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _object_id(prefix: str) -> str:
    return "/" + prefix


def _load_json(key: str, raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw.decode("utf-8"))
        if isinstance(doc, str):  # metadata given as a JSON string holding JSON
            doc = json.loads(doc)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Corrupt(key, f"not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise Corrupt(key, f"expected a JSON object, got {type(doc).__name__}")
    try:
        check_json(doc, key)
    except FormatError as exc:
        raise Corrupt(key, str(exc)) from exc
    return doc


# --------------------------------------------------------------------------- the key index


class KeyIndex:
    """Groups, datasets, children and stored chunk names of a ref table's keys.

    ``children`` maps a group prefix (``""`` for the root) to its child names
    in key order; ``chunks`` maps a dataset prefix to its chunk names
    (``0.0``, or ``0/0`` with the ``/`` separator) joined by newlines.
    ``ref_width`` is the reference width: 48 bytes, or the longest object path.
    ``cut`` counts the objects left unreachable because their implicit
    groups would pass ``MAX_IMPLICIT_BYTES``.
    """

    __slots__ = ("_implicit_bytes", "children", "chunks", "cut", "datasets", "groups",
                 "implicit", "ref_width")

    def __init__(self, keys: Iterable[str]) -> None:
        self.groups: set[str] = {""}
        self.datasets: set[str] = set()
        self.implicit: set[str] = set()
        self.children: dict[str, list[str]] = {}
        self.ref_width = REFERENCE_WIDTH
        self.cut = 0
        self._implicit_bytes = 0
        stored: dict[str, list[str]] = {}
        for key in keys:
            prefix, _, leaf = key.rpartition("/")
            if leaf in (".zarray", ".zgroup"):
                if prefix and prefix not in self.groups and prefix not in self.datasets \
                        and prefix not in self.implicit:
                    self._add_child(prefix)
                (self.datasets if leaf == ".zarray" else self.groups).add(prefix)
            elif leaf and leaf[0] != ".":
                found = stored.get(prefix)
                if found is None:
                    stored[prefix] = found = []
                found.append(key)
        if "" in self.datasets:
            log.warning("the reference file's root is an array; only groups can be mounted")
            self.datasets.discard("")
        self.implicit -= self.groups | self.datasets
        if self.cut:
            log.warning("%d objects of the reference file are left out: their paths nest "
                        "more than %d bytes of groups without .zgroup", self.cut,
                        MAX_IMPLICIT_BYTES)
        self.chunks: dict[str, str] = {}
        for prefix, found in stored.items():
            owner = prefix
            for _ in range(MAX_RANK):  # "/"-separated chunk names: one level per dimension
                if not owner or owner in self.datasets:
                    break
                owner = owner.rpartition("/")[0]
            if owner not in self.datasets:
                continue
            names = "\n".join(k[len(owner) + 1:] for k in found)
            before = self.chunks.get(owner)
            self.chunks[owner] = names if before is None else f"{before}\n{names}"

    def _add_child(self, prefix: str) -> None:
        """Make ``prefix`` a child of its parent, and each parent not yet known an
        implicit group, up to a known one (a loop: keys may nest very deep)."""
        while True:
            parent, _, name = prefix.rpartition("/")
            self.ref_width = max(self.ref_width,
                                 len(prefix.encode("utf-8", "surrogatepass")) + 1)
            siblings = self.children.get(parent)
            if siblings is None:
                self.children[parent] = siblings = []
            siblings.append(name)
            if len(siblings) > 1 or not parent or parent in self.groups \
                    or parent in self.datasets or parent in self.implicit:
                return
            self._implicit_bytes += len(parent)
            if self._implicit_bytes > MAX_IMPLICIT_BYTES:
                self.cut += 1
                return
            self.implicit.add(parent)
            prefix = parent

    def is_group(self, prefix: str) -> bool:
        return prefix in self.groups or prefix in self.implicit


# --------------------------------------------------------------------------- reading refs


class RefReader:
    """The bytes of one ref: inline, or a byte range of the file its URL names.

    ``read_capped`` reads a metadata ref (``key`` names it in errors) of at
    most ``limit`` bytes, refusing a longer one with ``Corrupt`` before it is read.
    """

    def __init__(self, open_uri: OpenUri) -> None:
        self._open_uri = open_uri
        self._files = LinkedFiles(open_uri)

    async def read(self, ref: Ref) -> bytes:
        if isinstance(ref, bytes):
            return ref
        if isinstance(ref, BadRef):
            raise Corrupt("reference file", ref.problem)
        if ref.length == 0:
            return b""
        if ref.length is not None:
            return await self._files.read(ref.url, ref.offset, ref.length)
        store, key = self._open_uri(ref.url)
        try:
            return await store.get(key, ByteRange(ref.offset) if ref.offset else None)
        except NotFound:
            raise StorageError(ref.url, f"file not found ({store.url} {key})") from None

    def locate(self, url: str) -> tuple[Store, str]:
        """The store and key the file ``url`` names is read at."""
        return self._files.locate(url)

    async def fetch(self, url: str, offset: int, size: int) -> Fetched:
        """The ``size`` bytes at ``offset`` of the file ``url`` names, with the info of
        the file version they are of."""
        return await self._files.fetch(url, offset, size)

    async def read_capped(self, ref: Ref, key: str, limit: int) -> bytes:
        if isinstance(ref, RangeRef) and ref.length is None:
            store, name = self._open_uri(ref.url)
            try:
                size = (await store.head(name)).size - ref.offset
                if size > limit:
                    raise too_large(key, limit, size)
                data = await store.get(name, ByteRange(ref.offset, limit + 1))
            except NotFound:
                raise StorageError(ref.url, f"file not found ({store.url} {name})") from None
            if len(data) > limit:
                raise too_large(key, limit)
            return data
        if isinstance(ref, BadRef):
            raise Corrupt(key, ref.problem)
        size = len(ref) if isinstance(ref, bytes) else ref.length
        if size is not None and size > limit:
            raise too_large(key, limit, size)
        return await self.read(ref)


# --------------------------------------------------------------------------- chunk stores


class RefChunkStore:
    """The chunks of one dataset that the reference file lists: ``ChunkStore``.

    ``shape`` is ``()`` for a scalar (one chunk, index ``(0,)``, key ``0``).
    ``names`` are the stored chunk names from the key index. ``decoded`` keeps
    decoded chunks of the files it keeps.
    """

    def __init__(self, refs: Mapping[str, Ref], reader: RefReader, prefix: str,
                 shape: tuple[int, ...], spec: ChunkSpec, *, separator: str, names: str,
                 meta_key: str, decoded: DecodedCache | None = None) -> None:
        self._refs = refs
        self._reader = reader
        self._decoded = decoded
        self._token = decoded_token("ref", spec) if decoded is not None else ""
        self._prefix = prefix
        self._spec = spec
        self._separator = separator
        self._names = names
        self._meta_key = meta_key
        self._scalar = not shape
        self._grid = (1,) if not shape else chunk_grid(shape, spec.chunks)

    def _in_grid(self, index: ChunkIndex) -> bool:
        return in_chunk_grid(index, self._grid)

    def _name(self, index: ChunkIndex) -> str:
        return "0" if self._scalar else self._separator.join(map(str, index))

    def key(self, index: ChunkIndex) -> str:
        """The ref key of the chunk at ``index``."""
        return _join(self._prefix, self._name(index))

    async def exists(self, index: ChunkIndex) -> bool:
        return self._in_grid(index) and self.key(index) in self._refs

    async def read(self, index: ChunkIndex) -> bytes | None:
        if not self._in_grid(index):
            return None
        key = self.key(index)
        ref = self._refs.get(key)
        if ref is None:
            return None
        spec = self._spec
        if spec.codecs.problem:
            raise Corrupt(self._meta_key, spec.codecs.problem)
        if self._decoded is not None and isinstance(ref, RangeRef) and ref.length:
            kept = await self._read_kept(ref, ref.length, key, self._decoded)
            if kept is not None:
                return kept
        return await self._decode(await self._reader.read(ref), key)

    async def read_many(self, indices: Sequence[ChunkIndex]
                        ) -> list[bytes | LayoutError | None]:
        """No batch read of its own: chunk by chunk (``read_each``)."""
        return await read_each(self, indices)

    async def _read_kept(self, ref: RangeRef, size: int, key: str,
                         decoded: DecodedCache) -> bytes | None:
        """The chunk of ``ref`` (of ``size`` bytes) through the ``DecodedCache``: its
        bytes, else read, decode and keep; None if it does not keep the file's chunks."""
        store, name = self._reader.locate(ref.url)
        if not decoded.keeps(store):
            return None
        token = f"{self._token}-{ref.offset}-{size}"
        kept = await decoded.get(store, name, token)
        if kept is not None:
            return kept
        fetched = await self._reader.fetch(ref.url, ref.offset, size)
        data = await self._decode(fetched.data, key)
        await decoded.put(store, name, token, fetched.info.etag, data)
        return data

    async def _decode(self, raw: bytes, key: str) -> bytes:
        spec = self._spec
        return await decode_sized(len(raw) + (spec.nbytes or len(raw)),
                                  decode_chunk, raw, spec, key)

    def _index(self, name: str) -> ChunkIndex | None:
        parts = name.split(self._separator)
        if not all(p.isascii() and p.isdigit() for p in parts):
            return None
        index = tuple(map(int, parts))
        if self._scalar:
            index = (0,) if index == (0,) else ()
        if not self._in_grid(index) or self._name(index) != name:
            return None
        return index

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        for name in self._names.split("\n") if self._names else ():
            index = self._index(name)
            if index is not None:
                yield index

    def listing_ready(self) -> bool:
        return True  # the names are in the reference file, in memory

    version = no_version


class NoExternalStore:
    """An ``_EXTERNAL_ARRAY_LINK`` dataset on a mount that cannot read HDF5 files."""

    def __init__(self, url: str, name: str) -> None:
        self._what = f"{url}::{name}"

    def _error(self) -> StorageError:
        return StorageError(self._what, "_EXTERNAL_ARRAY_LINK dataset, and this mount "
                                        "cannot read HDF5 files")

    async def exists(self, index: ChunkIndex) -> bool:
        raise self._error()

    async def read(self, index: ChunkIndex) -> bytes | None:
        raise self._error()

    async def read_many(self, indices: Sequence[ChunkIndex]
                        ) -> list[bytes | LayoutError | None]:
        """No batch read of its own: chunk by chunk (``read_each``)."""
        return await read_each(self, indices)

    async def _stored(self) -> list[ChunkIndex]:
        raise self._error()

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        for index in await self._stored():
            yield index

    def listing_ready(self) -> bool:
        return True  # it fails at once

    version = no_version


# --------------------------------------------------------------------------- the catalog


@dataclass(frozen=True, slots=True)
class _Annotations:
    """LINDI's annotations of a dataset's ``.zattrs``."""

    scalar: bool = False
    compound: dict[str, Any] | None = None
    external: tuple[str, str] | None = None


class RefCatalog:
    """A ``Catalog`` of the one HDF5 file a ``RefTable`` describes.

    ``open_uri`` opens the files ``RangeRef`` URLs name (it may raise
    ``Forbidden``); ``external`` reads ``_EXTERNAL_ARRAY_LINK`` datasets;
    ``max_metadata`` is the largest ``.zattrs`` or ``.zarray`` read, in bytes;
    ``decoded`` keeps decoded chunks across mounts (``layouts.decoding``).
    """

    supports_proof_ages = False

    def __init__(self, table: RefTable, open_uri: OpenUri,
                 external: ExternalArrays | None = None,
                 max_metadata: int = DEFAULT_MAX_METADATA, *,
                 decoded: DecodedCache | None = None) -> None:
        self._table = table
        self._decoded = decoded
        self._refs = table.refs
        self._reader = RefReader(open_uri)
        self._external = external
        self._max_metadata = max_metadata
        self._index = KeyIndex(table.refs)
        self._objects: dict[str, AnyObject] = {}
        self._domain = Domain(path="", root_id=ROOT_ID, modified=table.mtime, info={})
        log.debug("%s: %d refs, %d groups, %d datasets", table.location, len(table.refs),
                  len(self._index.groups) + len(self._index.implicit), len(self._index.datasets))

    @property
    def single_domain(self) -> str:
        return ""

    async def list_folder(self, path: str) -> list[str]:
        raise NotFound(path)

    async def domain(self, path: str) -> Domain | None:
        if path.strip("/"):
            raise NotFound(path)
        return self._domain

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        found = self._objects.get(obj_id)
        if found is not None:
            return found
        obj = await self._build(obj_id)
        return self._objects.setdefault(obj_id, obj)

    async def get_objects(self, domain: Domain,
                          obj_ids: Sequence[str]) -> list[AnyObject | LayoutError]:
        """No batch load of its own: one by one (``get_each``)."""
        return await get_each(self, domain, obj_ids)

    def drop(self) -> None:
        """Nothing to forget besides answers: the reference table, read when the
        file was opened, is not read again, and the objects built from it stay."""

    async def _build(self, obj_id: str) -> AnyObject:
        if not obj_id.startswith("/") or (obj_id != ROOT_ID and obj_id.endswith("/")):
            raise NotFound(obj_id)
        prefix = obj_id[1:]
        index = self._index
        if prefix in index.datasets:
            if prefix in index.groups:
                raise Corrupt(_join(prefix, ".zarray"), "the prefix has .zgroup as well")
            return await self._dataset(prefix)
        if index.is_group(prefix):
            return await self._group(prefix)
        raise NotFound(obj_id)

    async def _json(self, key: str) -> dict[str, Any] | None:
        ref = self._refs.get(key)
        if ref is None:
            return None
        return _load_json(key, await self._reader.read_capped(ref, key, self._max_metadata))

    async def _attrs(self, prefix: str) -> tuple[dict[str, Any], tuple[Attribute, ...]]:
        key = _join(prefix, ".zattrs")
        doc = await self._json(key) or {}
        try:
            return doc, attributes(doc)
        except FormatError as exc:
            raise Corrupt(key, str(exc)) from exc

    # -- groups -----------------------------------------------------------

    async def _group(self, prefix: str) -> Group:
        _, attrs = await self._attrs(prefix)
        links: dict[str, Link] = {}
        bad: list[str] = []
        for name in self._index.children.get(prefix, ()):
            problem = link_name_problem(name)
            if problem is None:
                links[name] = await self._link(_join(prefix, name))
            else:
                bad.append(f"{name!r:.80} ({problem})")
        if bad:
            report_once(Corrupt(_join(prefix, "(children)"),
                                f"{len(bad)} children of /{prefix} are left out: "
                                f"{', '.join(bad[:LOGGED_BAD_NAMES])}"))
        mtime = self._table.mtime
        return Group(id=_object_id(prefix), attrs=attrs, modified=mtime,
                     links=links)

    async def _link(self, child: str) -> Link:
        index = self._index
        if child in index.datasets:
            return Link(LinkKind.HARD, _object_id(child), target_kind=ObjectKind.DATASET)
        key = _join(child, ".zattrs")
        if child not in index.children and key in self._refs:
            try:
                doc = await self._json(key)
            except Corrupt as exc:  # reported when the child itself is read
                log.debug("link %s: %s", child, exc)
                doc = None
            soft = doc.get("_SOFT_LINK") if doc else None
            if isinstance(soft, Mapping) and isinstance(soft.get("path"), str) and soft["path"]:
                return Link(LinkKind.SOFT, soft["path"])
        return Link(LinkKind.HARD, _object_id(child), target_kind=ObjectKind.GROUP)

    # -- datasets ---------------------------------------------------------

    def _annotations(self, doc: Mapping[str, Any], zarray: ZArray) -> _Annotations:
        scalar = doc.get("_SCALAR", False)
        if not isinstance(scalar, bool):
            raise FormatError(f"_SCALAR must be true or false, got {scalar!r}")
        if scalar and (zarray.shape != (1,) or zarray.chunks != (1,)):
            raise FormatError(f"_SCALAR array of shape {list(zarray.shape)}")
        spec = doc.get("_COMPOUND_DTYPE")
        compound = None if spec is None else compound_type(spec, self._index.ref_width)
        link = doc.get("_EXTERNAL_ARRAY_LINK")
        external = None
        if link is not None:
            if not (isinstance(link, Mapping) and link.get("link_type") == "hdf5_dataset"
                    and isinstance(link.get("url"), str) and isinstance(link.get("name"), str)):
                raise FormatError(f"bad _EXTERNAL_ARRAY_LINK {link!r}")
            try:
                url = self._table.resolve(link["url"])
            except RefFormatError as exc:
                raise FormatError(str(exc)) from exc
            external = (url, link["name"])
        return _Annotations(scalar, compound, external)

    async def _dataset(self, prefix: str) -> Dataset:
        zkey = _join(prefix, ".zarray")
        doc, attrs = await self._attrs(prefix)
        try:
            zarray = parse_zarray(await self._json(zkey) or {})
        except FormatError as exc:
            raise Corrupt(zkey, str(exc)) from exc
        try:
            notes = self._annotations(doc, zarray)
        except FormatError as exc:
            raise Corrupt(_join(prefix, ".zattrs"), str(exc)) from exc
        try:
            pipeline = codecs(zarray.codecs)
            kind, tj = await self._element(prefix, zarray, pipeline, notes)
            etype = element_type(tj, parse_type(tj))
            check_sizes(zarray.shape, zarray.chunks, etype)
            fill = fill_value(etype, zarray.dtype, zarray.fill_value)
        except FormatError as exc:
            raise Corrupt(zkey, str(exc)) from exc
        shape = () if notes.scalar else zarray.shape
        chunks = () if not shape else zarray.chunks
        fill_bytes = np.asarray(fill).tobytes() if etype.fixed_size else b""
        spec = ChunkSpec(kind, zarray.chunks, zarray.dtype, etype.dtype, pipeline, fill_bytes,
                         zarray.fortran)
        store: ChunkStore
        if notes.external is not None:
            store = self._external_store(notes.external, DatasetShape(
                shape, chunks, etype.dtype, fill_bytes, zkey, etype.vlen))
        else:
            store = RefChunkStore(self._refs, self._reader, prefix, shape, spec,
                                  separator=zarray.separator,
                                  names=self._index.chunks.get(prefix, ""), meta_key=zkey,
                                  decoded=self._decoded)
        layout = {"class": "H5D_CHUNKED", "dims": list(chunks)} if shape else \
            {"class": "H5D_CONTIGUOUS"}
        mtime = self._table.mtime
        return Dataset(id=_object_id(prefix), attrs=attrs, modified=mtime,
                       shape=shape, maxshape=shape, type=etype, chunks=chunks,
                       fill_value=fill, store=store,
                       hdf5={"type": dict(etype.hdf5),
                             "filters": [dict(c) for c in zarray.codecs], "layout": layout})

    def _external_store(self, link: tuple[str, str], shape: DatasetShape) -> ChunkStore:
        url, name = link
        if self._external is None:
            return NoExternalStore(url, name)
        return self._external.store(url, name, shape)

    async def _element(self, prefix: str, zarray: ZArray, pipeline: Codecs,
                       notes: _Annotations) -> tuple[Kind, dict[str, Any]]:
        """How chunks decode, and the HSDS-style type JSON of the elements."""
        dtype = zarray.dtype
        if dtype.kind != "O":
            if notes.compound is not None:
                raise FormatError(f"_COMPOUND_DTYPE on an array of {dtype.str}")
            if dtype.kind == "U":
                return Kind.TEXT, dict(VLEN_UTF8_JSON)
            return Kind.RAW, type_json(dtype)
        object_id = pipeline.object_id
        if notes.compound is not None:
            if object_id != "json2":
                raise FormatError("_COMPOUND_DTYPE array without the json2 codec")
            return Kind.JSON_COMPOUND, notes.compound
        if object_id == "json2":
            if await self._holds_references(prefix, pipeline):
                return Kind.JSON_REF, reference_json(self._index.ref_width)
            return Kind.JSON_TEXT, dict(VLEN_UTF8_JSON)
        if object_id == "vlen-utf8":
            return Kind.VLEN, dict(VLEN_UTF8_JSON)
        if object_id == "vlen-bytes":
            return Kind.VLEN, dict(VLEN_ASCII_JSON)
        codec = pipeline.object_codec
        if object_id == "vlen-array" and codec is not None:
            return Kind.VLEN, {"class": "H5T_VLEN", "base": type_json(np.dtype(codec.dtype))}
        raise FormatError(f"object array without a known object codec ({object_id})")

    async def _holds_references(self, prefix: str, pipeline: Codecs) -> bool:
        """True if the first stored chunk of a json2 array holds LINDI references."""
        names = self._index.chunks.get(prefix)
        if not names or pipeline.problem:
            return False
        key = _join(prefix, names.partition("\n")[0])
        try:
            raw = await self._reader.read(self._refs[key])
            data = await decode_sized(len(raw), decode_bytes, raw, pipeline, key)
        except (Corrupt, Missing, Forbidden) as exc:  # reported when the chunk is read
            log.debug("cannot tell the element type of %s: %s", prefix, exc)
            return False
        return has_references(data)

