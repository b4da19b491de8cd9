"""An HSDS service endpoint as a ``Catalog``: the same tree as its bucket, over REST.

Owns reading folders, domains and objects through a ``layouts.service.Service``
(the HDF REST API of an HSDS service node, as the user the mount
authenticates as, so the server applies its ACLs) and ``ServiceChunkStore``,
which reads a dataset's chunks as decoded binary selections.

Requests (HSDS 1.0.2's API):

* a folder: ``GET /domains?domain=/FOLDER/`` in pages of ``FOLDER_PAGE``
  (``Limit``, ``Marker``); the top folder is ``/``;
* a domain or folder: ``GET /?domain=/PATH``: its root group id, owner and
  times, and ``GET /acls?domain=/PATH`` for its ACLs (left out where the
  user may not read them);
* an object: ``GET /groups/ID?include_links=1&include_attrs=1`` (and
  ``/datasets/ID``, ``/datatypes/ID`` with ``include_attrs``), whose JSON is
  the stored document plus fields the builder ignores, so
  ``ObjectBuilder`` builds the same object as from the bucket. Its
  ``modified`` is the object's ``lastModified`` as the server reports it;
* a chunk: ``GET /datasets/ID/value?select=[a:b,...]`` with ``Accept:
  application/octet-stream``, the chunk's part of the dataspace, which the
  data nodes read and decode.

What differs from a bucket mount, because the REST API does not show it:

* The server lists no stored chunks, so a dataset directory lists every chunk
  of its grid, and a chunk never written reads as the fill value (it is not
  missing). ``.npy`` files and views are the same bytes either way.
* Edge chunks come back cut at the dataspace's end; the store pads them to the
  full chunk shape (fill bytes for fixed-size types, empty elements for
  variable-length ones), as chunk files are always whole.
* HSDS's domain summaries (``getobjs``) are not used unless the mount says so
  (``-o hs_summaries``, ``Summaries``): nothing over REST proves a summary
  current (it is as old as the last scan, and writes since are not shown),
  so every object is read on its own, many at once (``layouts.model.get_each``).
  With the option, a domain's objects come from its summary, one request per
  domain and ``metadata_ttl``, with the scan's times; one it lacks is read on
  its own.
* A dataset's chunks have no validators to list (``version`` is None), so
  counts made of them are made again each ``metadata_ttl``.
* HSDS 1.0.2 stores a dataset filtered with byte shuffle and no compressor
  unshuffled, and its reader then unshuffles what it serves by mistake
  (``_chunks``). A whole chunk is put right here by shuffling it again; an
  edge chunk, which the server cuts after its mistake, cannot be, and gives
  ``Corrupt`` (EIO) rather than wrong bytes.

Errors come from the ``Service``: ``NotFound`` (ENOENT), ``Forbidden``
(EACCES: the user may not read that domain), ``StorageError`` (EIO). A
malformed answer is ``Corrupt`` naming the request.

Concurrency: the catalog and its stores keep no mutable state but the
``Summaries`` (see there), so any number of trio tasks may call them at
once. Padding an edge chunk and re-encoding variable-length ones is done
inline: they are at most one chunk.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import numcodecs
import numpy as np
import trio

from layouts.bounds import check_json, valid_text
from layouts.errors import Corrupt, Forbidden, FormatError, LayoutError, NotFound, SourceError
from layouts.formats.hsds import _ids
from layouts.formats.hsds._catalog import domain_path
from layouts.formats.hsds._chunks import ChunkSpec, FilterPlan, decode_chunk, filter_plan
from layouts.formats.hsds._linked import linked_chunks
from layouts.formats.hsds._objects import (
    LINKED_LAYOUTS,
    DatasetParts,
    ObjectBuilder,
    load_json,
    object_id,
    root_group_id,
)
from layouts.gather import outcomes
from layouts.hdf5 import MAX_VLEN_CHUNK_BYTES
from layouts.model import (
    AnyObject,
    ChunkIndex,
    ChunkStore,
    Domain,
    ElementType,
    VlenKind,
    fill_element,
    get_each,
    in_chunk_grid,
    no_version,
    store_grid,
)
from layouts.places import Host, Place, PlaceKind
from layouts.service import Service

log = logging.getLogger(__name__)

#: Domains and folders asked for per page of a folder listing.
FOLDER_PAGE = 1000
#: Chunks read at once by ``read_many``.
CHUNK_CONCURRENCY = 32
#: A domain's summary may hold this many times ``-o max_metadata`` (one object's
#: largest JSON): walk100k's, every object of 100,000, is 70 MB with its scan
#: facts, past the default 64 MiB.
SUMMARY_SCALE = 8
#: Domain summaries kept at once (``-o hs_summaries``): one of 100,000 objects
#: is 54 MB of JSON, several times that once parsed; two let a walk of one
#: domain follow an external link into another without reading either again.
KEPT_SUMMARIES = 2

_COLLECTIONS = {"g": "groups", "d": "datasets", "t": "datatypes"}
#: Domain fields the root sidecar shows under ``domain``, as a bucket's
#: ``.domain.json`` holds them.
_DOMAIN_INFO = ("owner", "created", "lastModified")


async def probe_place(place: Place) -> bool:
    """True for a service place: the daemon made it from an endpoint URL."""
    return place.kind is PlaceKind.SERVICE and place.service is not None


async def open_place(place: Place, host: Host) -> ServiceCatalog:
    """The catalog of the endpoint at ``place``: the whole service, the folder or
    domain ``place.prefix`` names on it, or the one domain ``host.domain`` names.
    ``SourceError`` with one line if the service refuses the mount's
    credentials, or what is named is not there."""
    assert place.service is not None
    service, prefix = place.service, place.prefix.strip("/")
    single = None if host.domain is None else domain_path(host.domain)
    summaries = Summaries(host.metadata_ttl, SUMMARY_SCALE * host.max_metadata) \
        if host.trust_summaries else None
    try:
        about = await _answer(service, "/about", {})
    except NotFound:
        raise SourceError(f"{place.location}: not an HSDS service endpoint "
                          "(GET /about answers 404)") from None
    except LayoutError as exc:
        raise SourceError(f"{place.location}: not an HSDS service endpoint "
                          f"(GET /about: {exc})") from exc
    if "hsds_version" not in about:
        raise SourceError(f"{place.location}: not an HSDS service endpoint "
                          "(GET /about names no hsds_version)")
    log.debug("%s runs HSDS %s", service.url, about["hsds_version"])
    try:
        # The credentials are checked by the first request that needs them.
        top = ServiceCatalog(service)
        await top.list_folder(prefix.rpartition("/")[0])
        named = await top.domain(prefix) if prefix else None
        is_domain = named is not None and named.root_id is not None
        catalog = ServiceCatalog(service, prefix, single_domain=single, summaries=summaries)
        found = await catalog.domain(single) if single is not None and not is_domain else None
    except NotFound:
        raise SourceError(f"{place.location}: no such folder or domain "
                          f"{'/' + (single or prefix)}") from None
    except LayoutError as exc:
        raise SourceError(f"{place.location}: {exc}") from exc
    if is_domain:
        if single is not None:
            raise SourceError(f"{place.location}: names a domain already; drop --domain")
        parent, _, name = prefix.rpartition("/")
        return ServiceCatalog(service, parent, single_domain=name, summaries=summaries)
    if single is not None and (found is None or found.root_id is None):
        raise SourceError(f"{place.location}: {host.domain} is a folder, not a domain "
                          "with a root group")
    return catalog


async def _answer(service: Service, path: str, params: Mapping[str, str],
                  limit: int | None = None) -> dict[str, Any]:
    """The JSON object ``GET path?params`` answers; ``Corrupt`` if it is not one
    (or holds more than ``limit`` bytes; None: ``max_metadata``)."""
    raw = await service.get_json(path, params, limit)
    return load_json(f"{service.url}{path}?{urlencode(params)}", raw)


def _param(path: str) -> str:
    """The ``domain`` parameter of a domain or folder path (``a/b``: ``/a/b``)."""
    return "/" + path.strip("/").replace("//", "/")


class ServiceCatalog(ObjectBuilder):
    """A ``Catalog`` over an HSDS service (see the module docstring): the folder
    ``base`` of it (``""``: all of it), or the one domain ``single_domain`` in it.
    With ``summaries``, a scanned domain's objects come from its summary."""

    supports_proof_ages = False

    def __init__(self, service: Service, base: str = "", *,
                 single_domain: str | None = None,
                 summaries: Summaries | None = None) -> None:
        self._service = service
        self._base = base.strip("/")
        self._single = single_domain
        self._summaries = summaries

    @property
    def single_domain(self) -> str | None:
        return self._single

    def drop(self) -> None:
        """Forget the domain summaries (SIGHUP); the rest is asked for anew once the
        caches let go."""
        if self._summaries is not None:
            self._summaries.drop()

    def _param(self, path: str) -> str:
        """The ``domain`` parameter of ``path`` below the base folder."""
        return _param(f"{self._base}/{path.strip('/')}")

    async def list_folder(self, path: str) -> list[str]:
        folder = self._param(path).rstrip("/") + "/"
        names: list[str] = []
        marker: str | None = None
        while True:
            params = {"domain": folder, "Limit": str(FOLDER_PAGE)}
            if marker is not None:
                params["Marker"] = marker
            answer = await _answer(self._service, "/domains", params)
            page = answer.get("domains")
            if not isinstance(page, list):
                raise Corrupt(f"{self._service.url}/domains?domain={folder}",
                              "the answer has no list of domains")
            for item in page:
                name = item.get("name") if isinstance(item, dict) else None
                if not isinstance(name, str):
                    continue
                base = name.rstrip("/").rpartition("/")[2]
                if base and valid_text(base):
                    names.append(base)
            if len(page) < FOLDER_PAGE:
                return names
            last = page[-1].get("name") if isinstance(page[-1], dict) else None
            if not isinstance(last, str) or last == marker:
                return names
            marker = last

    async def domain(self, path: str) -> Domain | None:
        path = path.strip("/")
        if not path:
            return None
        where = f"{self._service.url}/?domain={self._param(path)}"
        answer = await _answer(self._service, "/", {"domain": self._param(path)})
        info = {k: answer[k] for k in _DOMAIN_INFO if k in answer}
        acls = await self._acls(path)
        if acls is not None:  # where a bucket's .domain.json keeps them: after the owner
            info = {**({"owner": info.pop("owner")} if "owner" in info else {}),
                    "acls": acls, **info}
        try:
            check_json(info, "domain")
        except FormatError as exc:
            raise Corrupt(where, str(exc)) from exc
        modified = answer.get("lastModified")
        modified = float(modified) if isinstance(modified, int | float) else None
        root = answer.get("root")
        if root is None:
            return Domain(path=path, root_id=None, modified=modified, info=info)
        return Domain(path=path, root_id=root_group_id(root, where), modified=modified,
                      info=info)

    async def _acls(self, path: str) -> dict[str, Any] | None:
        """The ACLs of a domain or folder, by user, as a bucket's ``.domain.json``
        keeps them; None if the mount's user may not read them (``readACL``)."""
        try:
            answer = await _answer(self._service, "/acls", {"domain": self._param(path)})
        except Forbidden:
            return None
        entries = answer.get("acls")
        if not isinstance(entries, list):
            return None
        return {entry["userName"]: {k: v for k, v in entry.items() if k != "userName"}
                for entry in entries
                if isinstance(entry, dict) and isinstance(entry.get("userName"), str)}

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        hid = object_id(obj_id)
        param = self._param(domain.path)
        builder = _InDomain(self._service, param)
        if self._summaries is not None:
            summary = await self._summaries.get(self._service, param)
            # An entry is used once: the metadata cache keeps what is built from it.
            entry = summary.objects.pop(hid.id, None)
            if isinstance(entry, dict):
                return await builder._build(hid, entry, summary.modified(hid.id))
        params = {"domain": param, "include_attrs": "1"}
        if hid.prefix == "g":
            params["include_links"] = "1"
        doc = await _answer(self._service, f"/{_COLLECTIONS[hid.prefix]}/{hid.id}", params)
        return await builder._build(hid, doc, _number(doc.get("lastModified")))

    async def get_objects(self, domain: Domain, obj_ids: Sequence[str]
                          ) -> list[AnyObject | LayoutError]:
        return await get_each(self, domain, obj_ids)


@dataclass
class _Summary:
    """One domain's summary: its objects' documents by id, and the scan's times."""

    asked: float
    ready: trio.Event = field(default_factory=trio.Event)
    objects: dict[str, Any] = field(default_factory=dict)
    times: Mapping[str, float] = field(default_factory=dict)
    scanned: float = 0.0

    def modified(self, obj_id: str) -> float:
        """A dataset's time as the scan saw it; the scan's time for the rest."""
        return self.times.get(obj_id, self.scanned)


class Summaries:
    """The domain summaries a service serves (``GET /?domain=D&getobjs=1&verbose=1``:
    HSDS's ``.summary.json`` and ``.info.json``), each asked for once per
    ``ttl`` seconds, the last ``KEPT_SUMMARIES`` domains kept.

    Memory: an object's entry is dropped once it is built (the metadata cache
    keeps the object), so a summary holds only what was not asked for yet.

    Concurrency: the first task to ask for a domain's summary fetches it; others
    wait on its ``ready`` event. A failed fetch, or a domain without a summary
    (never scanned), leaves no objects, and its objects are read one by one, as
    is an object asked for again after its entry was used.
    """

    def __init__(self, ttl: float, limit: int) -> None:
        self._ttl = ttl
        self._limit = limit
        self._kept: OrderedDict[str, _Summary] = OrderedDict()

    def drop(self) -> None:
        self._kept.clear()

    async def get(self, service: Service, domain: str) -> _Summary:
        now = trio.current_time()
        kept = self._kept.get(domain)
        if kept is not None and now - kept.asked < self._ttl:
            self._kept.move_to_end(domain)
            await kept.ready.wait()
            return kept
        summary = self._kept[domain] = _Summary(now)
        while len(self._kept) > KEPT_SUMMARIES:
            self._kept.popitem(last=False)
        try:
            answer = await _answer(service, "/", {"domain": domain, "getobjs": "1",
                                                  "verbose": "1"}, self._limit)
            objects = answer.get("domain_objs")
            info = answer.get("scan_info")
            if isinstance(objects, dict) and isinstance(info, dict):
                summary.objects = objects
                summary.scanned = _number(info.get("lastModified"))
                datasets = info.get("datasets")
                if isinstance(datasets, dict):
                    summary.times = {k: _number(v.get("lastModified"))
                                     for k, v in datasets.items() if isinstance(v, dict)}
                log.debug("%s: %d objects from its summary", domain, len(objects))
        except LayoutError as exc:
            log.warning("%s: no summary (%s); its objects are read one by one", domain, exc)
        finally:
            summary.ready.set()
        return summary


def _number(value: Any) -> float:
    """A time from the server's JSON; 0 where it gives none."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else 0.0


class _InDomain(ObjectBuilder):
    """The builder for the objects of one domain: it knows the ``domain``
    parameter its requests send."""

    def __init__(self, service: Service, domain: str) -> None:
        self._service = service
        self._domain = domain

    def _name(self, hid: _ids.HsdsId) -> str:
        return f"{self._service.url}/{_COLLECTIONS[hid.prefix]}/{hid.id}?domain={self._domain}"

    async def _type_doc(self, tid: _ids.HsdsId) -> dict[str, Any]:
        return await _answer(self._service, f"/datatypes/{tid.id}", {"domain": self._domain})

    def _chunk_store(self, parts: DatasetParts) -> tuple[ChunkStore, tuple[int, ...]]:
        chunks = parts.chunks
        cls = parts.layout.get("class")
        if cls in LINKED_LAYOUTS and parts.shape:
            chunks = linked_chunks(cls, parts.shape, parts.etype, chunks)
        plan = filter_plan(parts.filters)
        return ServiceChunkStore(self._service, self._domain, parts.hid.id, parts.shape,
                                 ChunkSpec(htype=parts.htype, etype=parts.etype, chunks=chunks,
                                           plan=FilterPlan()),
                                 fill=parts.fill,
                                 reshuffle=plan.shuffle and not plan.compressed), chunks


class ServiceChunkStore:
    """The chunks of one dataset, read as binary selections of the service.

    ``shape`` is None for an ``H5S_NULL`` dataset (no chunks) and ``()`` for a
    scalar (one chunk, ``(0,)``, read whole). Every chunk of the grid is
    listed, and reads: a chunk the server never stored reads as fill.
    """

    __slots__ = ("_domain", "_dset", "_fill", "_grid", "_reshuffle", "_service", "_shape",
                 "_spec")

    def __init__(self, service: Service, domain: str, dset_id: str,
                 shape: tuple[int, ...] | None, spec: ChunkSpec, *, fill: Any,
                 reshuffle: bool = False) -> None:
        self._service = service
        self._reshuffle = reshuffle and spec.etype.fixed_size and spec.etype.itemsize > 1
        self._domain = domain
        self._dset = dset_id
        self._shape = shape
        self._spec = spec
        self._fill = fill
        self._grid = store_grid(shape, spec.chunks)

    version = no_version

    def _in_grid(self, index: Sequence[int]) -> bool:
        return self._grid is not None and in_chunk_grid(index, self._grid)

    async def exists(self, index: ChunkIndex) -> bool:
        return self._in_grid(index)

    def listing_ready(self) -> bool:
        return True

    async def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        if self._grid is None:
            return
        for index in itertools.product(*(range(n) for n in self._grid)):
            yield index

    async def read_many(self, indices: Sequence[ChunkIndex]
                        ) -> Sequence[bytes | LayoutError | None]:
        return await outcomes(self.read, indices, CHUNK_CONCURRENCY)

    async def read(self, index: ChunkIndex) -> bytes | None:
        if not self._in_grid(index) or self._shape is None:
            return None
        spec = self._spec
        params = {"domain": self._domain}
        if self._shape:
            stops = [min((i + 1) * c, n)
                     for i, c, n in zip(index, spec.chunks, self._shape, strict=True)]
            starts = [i * c for i, c in zip(index, spec.chunks, strict=True)]
            params["select"] = "[" + ",".join(f"{a}:{b}" for a, b in
                                              zip(starts, stops, strict=True)) + "]"
            part = tuple(b - a for a, b in zip(starts, stops, strict=True))
        else:
            part = ()
        path = f"/datasets/{self._dset}/value"
        where = f"{self._service.url}{path}?domain={self._domain}&select={params.get('select', '')}"
        etype = spec.etype
        if etype.vlen is None:
            expected = math.prod(part) * etype.itemsize
            data = await self._service.get_binary(path, params, expected)
            if len(data) != expected:
                raise Corrupt(where, f"the selection has {len(data)} bytes, expected {expected}")
            full = spec.chunks if self._shape else ()
            if self._reshuffle:
                if part != full:
                    raise Corrupt(where, "HSDS 1.0.2 serves a dataset stored with byte shuffle "
                                         "and no compressor unshuffled by mistake; its edge "
                                         "chunks cannot be put right over REST (a mount of "
                                         "the bucket itself reads them)")
                return bytes(numcodecs.Shuffle(etype.itemsize).encode(data))
            return data if part == full else _pad_fixed(data, part, full, etype, self._fill)
        data = await self._service.get_binary(path, params, MAX_VLEN_CHUNK_BYTES)
        part_spec = ChunkSpec(htype=spec.htype, etype=etype, chunks=part, plan=FilterPlan())
        encoded = decode_chunk(data, part_spec, where)
        if not self._shape or part == spec.chunks:
            return encoded
        return _pad_vlen(encoded, part, spec.chunks, etype, where)


def _pad_fixed(data: bytes, part: tuple[int, ...], full: tuple[int, ...],
               etype: ElementType, fill: Any) -> bytes:
    """The elements of ``part`` (C order) at the start of every dimension of a
    chunk of shape ``full``, the rest the fill value."""
    size = etype.itemsize
    out = np.frombuffer(fill_element(etype, fill) * math.prod(full), dtype=np.uint8).copy()
    grid = out.reshape((*full, size))
    grid[tuple(slice(0, n) for n in part)] = np.frombuffer(data, dtype=np.uint8).reshape(
        (*part, size))
    return out.tobytes()


def _codec(etype: ElementType) -> Any:
    """The numcodecs codec of a variable-length type's chunk files."""
    kind = etype.vlen
    if kind is VlenKind.UTF8:
        return numcodecs.VLenUTF8()
    if kind is VlenKind.BYTES:
        return numcodecs.VLenBytes()
    if kind is VlenKind.ARRAY:
        return numcodecs.VLenArray(etype.vlen_base)
    return numcodecs.JSON()


_EMPTY: Mapping[VlenKind | None, Any] = {VlenKind.UTF8: "", VlenKind.BYTES: b""}


def _pad_vlen(encoded: bytes, part: tuple[int, ...], full: tuple[int, ...],
              etype: ElementType, where: str) -> bytes:
    """Chunk-file bytes of ``part`` elements padded to a whole chunk with empty ones."""
    codec = _codec(etype)
    try:
        values = codec.decode(encoded)
    except (ValueError, TypeError) as exc:
        raise Corrupt(where, f"bad variable-length values: {exc}") from exc
    out = np.empty(math.prod(full), dtype=object)
    empty = _EMPTY.get(etype.vlen)
    if etype.vlen is VlenKind.ARRAY:
        empty = np.zeros(0, dtype=etype.vlen_base)
    for i in range(out.size):
        out[i] = empty
    grid = out.reshape(full)
    grid[tuple(slice(0, n) for n in part)] = np.asarray(values, dtype=object).reshape(part)
    return bytes(codec.encode(grid if etype.vlen is VlenKind.JSON else out))

