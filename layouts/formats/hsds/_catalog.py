"""The HSDS storage layout: a bucket (or one of its domains) as a ``Catalog``.

Owns reading HSDS metadata JSON from a ``Store`` and building the object model
from it: folders and domains (``.domain.json``), groups and links, datasets
(shape, layout, filters, fill value, chunk store) and committed datatypes.
Types are parsed by ``layouts.hdf5._types`` and values decoded by
``layouts.formats.hsds._values``; chunks by ``layouts.formats.hsds._chunks``, or
``layouts.formats.hsds._linked`` for datasets whose data stays in an HDF5 file
(``hsload --link``); ids and keys by ``layouts.formats.hsds._ids``.

Every failure leaves as ``NotFound`` (nothing there), ``Corrupt`` (stored bytes
that are not valid HSDS, naming the key) or ``StorageError`` from the store.

Metadata from a bucket someone else controls is held to the bounds of
``layouts.bounds``, so one hostile object gives ``Corrupt`` for itself alone
and nothing built from it can exhaust memory or the stack later: every JSON
object is read capped at ``max_metadata`` bytes (``storage.fetch_capped``);
ranks, element sizes, element and byte counts are bounded (``MAX_RANK``,
``MAX_ITEM_BYTES``, ``MAX_ELEMENTS``, ``check_sizes``); JSON kept as stored
(``domain`` info, a dataset's type, filters and layout) is checked by
``check_json``. A link whose name no file name can show (empty, holding
``/``, not valid Unicode; see ``bounds.link_name_problem``) or whose JSON is
malformed is left out of its group, logged once per group.

An object's ``modified`` time is the storage time of its JSON (the file's
mtime, or S3's LastModified), never a time the JSON holds, so a tree shows
the same bytes whether its objects were read one by one or built from
HSDS's domain summaries. With a ``DomainIndex`` (``layouts.formats.hsds._domains``),
a walk lists a domain once: objects the listing does not hold are missing
with no request, those a current summary covers are built from it, and the
rest are read in one batch; ``load_objects`` says how old each answer's
proof is, for the metadata cache.

As a source (``layouts.formats``): ``probe_place`` recognises a bucket in a
directory or an object-store prefix, and ``open_place`` opens it (or the one
domain ``--domain`` names), refusing with ``SourceError`` what cannot be
mounted.

Concurrency: ``HsdsCatalog`` keeps no mutable state of its own (the domain
index has its rules), so any number of trio tasks may call it at once.
Metadata JSON is small and parsed inline. The ``open_uri`` resolver it is
given is called from trio tasks and must not block.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

import orjson

from layouts.bounds import (
    MAX_ELEMENTS,
    MAX_RANK,
    check_json,
    check_sizes,
    link_name_problem,
    valid_text,
)
from layouts.decoding import DecodedCache
from layouts.errors import Corrupt, FormatError, LayoutError, NotFound, SourceError, report_once
from layouts.formats.hsds import _ids, _json
from layouts.formats.hsds._chunks import ChunkSpec, HsdsChunkStore, filter_plan
from layouts.formats.hsds._domains import DomainIndex, DomainState
from layouts.formats.hsds._linked import linked_chunks, linked_store
from layouts.formats.hsds._values import attribute_value, fill_value
from layouts.hdf5 import MAX_TYPE_DEPTH, parsed_type
from layouts.model import (
    AnyObject,
    Attribute,
    ChunkStore,
    Dataset,
    Datatype,
    Domain,
    Group,
    Link,
    LinkKind,
    ObjectKind,
)
from layouts.places import Host, Place, PlaceKind
from layouts.storage import DEFAULT_MAX_METADATA, OpenUri, Store, fetch_capped

log = logging.getLogger(__name__)

DOMAIN_FILE = ".domain.json"
#: Layout classes whose chunks live in another file (``hsload --link``).
LINKED_LAYOUTS = ("H5D_CONTIGUOUS_REF", "H5D_CHUNKED_REF", "H5D_CHUNKED_REF_INDIRECT")
#: Malformed links named in the one log line of a group that has them.
LOGGED_BAD_LINKS = 3
#: How many top-level prefixes ``probe`` checks for a ``.domain.json``.
PROBE_PREFIXES = 64

#: Distinct dataset descriptions kept shared (``_description``), and the
#: largest shared, as JSON bytes.
SHARED_DESCRIPTIONS = 1024
SHARED_DESCRIPTION_BYTES = 4096
#: Distinct dimension tuples and filter plans kept shared (``_shared``).
SHARED_VALUES = 4096

_Hashable = TypeVar("_Hashable", bound=Hashable)

_LINK_KINDS = {"H5L_TYPE_HARD": LinkKind.HARD, "H5L_TYPE_SOFT": LinkKind.SOFT,
               "H5L_TYPE_EXTERNAL": LinkKind.EXTERNAL}


def _clean_path(path: str) -> str:
    return path.strip("/")


def _prefix(path: str) -> str:
    """The listing prefix of a folder path: ``""`` or ``a/b/``."""
    path = _clean_path(path)
    return f"{path}/" if path else ""


def _load_json(key: str, raw: bytes) -> dict[str, Any]:
    try:
        doc = _json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Corrupt(key, f"not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise Corrupt(key, f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _object_json(key: str, raw: bytes) -> dict[str, Any]:
    """An object's JSON. A zero-length object (a write in progress, or lost)
    is Corrupt: something links to it, so it is not simply missing."""
    if not raw:
        raise Corrupt(key, "object JSON is empty")
    return _load_json(key, raw)


def _root_uuid1(domain: Domain) -> str | None:
    """The ``uuid1`` of a schema v2 domain's root group (its objects' prefix)."""
    if domain.root_id is None:
        return None
    try:
        return _ids.parse_id(domain.root_id).uuid1
    except _ids.BadId:
        return None


def _parse_id(obj_id: str) -> _ids.HsdsId:
    try:
        return _ids.parse_id(_ids.normalize_id(obj_id))
    except _ids.BadId as exc:
        raise Corrupt(f"id:{obj_id}", str(exc)) from exc


async def probe(store: Store) -> bool:
    """True if ``store`` looks like an HSDS bucket: it has ``db/`` or a
    top-level folder with a ``.domain.json``. Storage errors propagate."""
    try:
        listing = await store.list_dir("")
    except NotFound:
        return False
    if "db/" in listing.prefixes:
        return True
    for prefix in listing.prefixes[:PROBE_PREFIXES]:
        if await store.exists(prefix + DOMAIN_FILE):
            return True
    return False


async def probe_place(place: Place) -> bool:
    """True if ``place`` (a directory or bucket) holds an HSDS bucket (``probe``)."""
    return place.store is not None and await probe(place.store)


async def open_place(place: Place, host: Host) -> HsdsCatalog:
    """The catalog of the bucket at ``place``, or of the one domain ``host.domain``
    names; ``SourceError`` if that is not a domain with a root group."""
    assert place.store is not None
    source, domain = place.location, host.domain
    single = None if domain is None else _domain_path(domain)
    # With metadata_ttl 0 every walk would list the whole domain again.
    index = DomainIndex(place.store, host.metadata_ttl, eager=place.kind is PlaceKind.BUCKET,
                        records=host.records) if host.metadata_ttl > 0 else None
    catalog = HsdsCatalog(place.store, single_domain=single, open_uri=host.storage_opener(),
                          max_metadata=host.max_metadata, domain_index=index,
                          decoded=host.decoded_cache)
    if single is not None:
        try:
            found = await catalog.domain(single)
        except NotFound:
            raise SourceError(f"{source}: no such domain {domain}") from None
        except LayoutError as exc:
            raise SourceError(f"{source}: domain {domain}: {exc}") from exc
        if found is None or found.root_id is None:
            raise SourceError(f"{source}: {domain} is a folder, not a domain with a root group")
    return catalog


def _domain_path(domain: str) -> str:
    path = domain.strip("/")
    if not path:
        raise SourceError("--domain needs a domain path such as /home/user/file.h5")
    return path


class HsdsCatalog:
    """A ``Catalog`` over an HSDS bucket stored in ``store``.

    ``single_domain`` (``/home/u/f.h5`` or ``home/u/f.h5``) mounts just that
    domain; it is kept without slashes at either end. ``open_uri`` opens the
    HDF5 files that linked datasets name (``layouts.storage.OpenUri``);
    without it their chunks cannot be read, while their metadata still can.
    ``max_metadata`` is the largest JSON object read, in bytes (``Corrupt``
    beyond it). With ``domain_index``, a walk lists each domain once and
    builds what its summary covers from it (``layouts.formats.hsds._domains``).
    ``decoded`` keeps decoded chunks across mounts (``layouts.decoding``).
    It is an ``AgedCatalog`` (``load_objects``, ``proven``).
    """

    supports_proof_ages = True

    def __init__(self, store: Store, single_domain: str | None = None,
                 open_uri: OpenUri | None = None,
                 max_metadata: int = DEFAULT_MAX_METADATA,
                 domain_index: DomainIndex | None = None, *,
                 decoded: DecodedCache | None = None) -> None:
        self._store = store
        self._index = domain_index
        self._decoded = decoded
        self._open_uri = open_uri
        self._single = _clean_path(single_domain) if single_domain is not None else None
        self._max_metadata = max_metadata

    probe = staticmethod(probe)

    @property
    def single_domain(self) -> str | None:
        return self._single

    @property
    def store(self) -> Store:
        return self._store

    @property
    def domain_index(self) -> DomainIndex | None:
        return self._index

    def drop(self) -> None:
        """Forget what the catalog keeps besides answers (SIGHUP): the domain
        states, so objects and chunks written since are found."""
        if self._index is not None:
            self._index.drop()

    # ------------------------------------------------------------------ folders

    async def list_folder(self, path: str) -> list[str]:
        prefix = _prefix(path)
        listing = await self._store.list_dir(prefix)
        names = []
        for sub in listing.prefixes:
            name = sub[len(prefix):].rstrip("/")
            if not name or (not prefix and name == "db"):
                continue
            names.append(name)
        return names

    async def domain(self, path: str) -> Domain | None:
        path = _clean_path(path)
        key = f"{path}/{DOMAIN_FILE}" if path else DOMAIN_FILE
        try:
            fetched = await fetch_capped(self._store, key, self._max_metadata)
        except NotFound:
            fetched = None
        if fetched is None or not fetched.data:
            if await self._has_prefix(path):
                return None
            raise NotFound(key)
        doc = _load_json(key, fetched.data)
        root = doc.get("root")
        if root is not None:
            try:
                root_id = _ids.parse_id(root) if isinstance(root, str) else None
            except _ids.BadId:
                root_id = None
            if root_id is None or root_id.kind is not ObjectKind.GROUP:
                raise Corrupt(key, f"root is not a group id: {root!r}")
            root = root_id.id
        info = {k: v for k, v in doc.items() if k != "root"}
        try:
            check_json(info, "domain")
        except FormatError as exc:
            raise Corrupt(key, str(exc)) from exc
        return Domain(path=path, root_id=root, modified=fetched.info.mtime, info=info)

    async def _has_prefix(self, path: str) -> bool:
        try:
            listing = await self._store.list_dir(_prefix(path))
        except NotFound:
            return False
        return bool(listing.prefixes or listing.keys)

    # ------------------------------------------------------------------ objects

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        found = (await self.load_objects(domain, [obj_id]))[0][0]
        if isinstance(found, LayoutError):
            raise found
        return found

    async def get_objects(self, domain: Domain,
                          obj_ids: Sequence[str]) -> list[AnyObject | LayoutError]:
        """Many objects at once, each or the error loading it raised, in order."""
        return [found for found, _ in await self.load_objects(domain, obj_ids)]

    async def load_objects(self, domain: Domain, obj_ids: Sequence[str]
                           ) -> list[tuple[AnyObject | LayoutError, float]]:
        """Many objects at once, each (or the error loading it raised) with the
        age of what proves it current, in seconds, in order.

        Objects of the domain's root prefix come from its ``DomainState`` when
        the index has one (or makes one now, for a walk): an object the
        listing does not hold is ``NotFound``, one built before from JSON
        with the same validator is the same instance, one a current summary
        covers is built from its entry; their age is the listing's. The
        JSON of the rest is read with one ``fetch_many`` (one worker-thread
        call on a local directory, concurrent GETs elsewhere) and parsed here.
        """
        hids: list[_ids.HsdsId | LayoutError] = []
        for obj_id in obj_ids:
            try:
                hids.append(_parse_id(obj_id))
            except LayoutError as exc:
                hids.append(exc)
        uuid1 = _root_uuid1(domain)
        mine = sum(1 for hid in hids if isinstance(hid, _ids.HsdsId) and hid.uuid1 == uuid1)
        state = await self._index.state(uuid1, mine) \
            if self._index is not None and uuid1 is not None and mine else None
        age = self._index.age(state) if self._index is not None and state is not None else 0.0
        out: list[tuple[AnyObject | LayoutError, float]] = [(NotFound(""), 0.0)] * len(hids)
        unread: list[int] = []
        for pos, hid in enumerate(hids):
            if isinstance(hid, LayoutError):
                out[pos] = (hid, 0.0)
            elif state is None or hid.uuid1 != uuid1:
                unread.append(pos)
            else:
                found = await self._from_state(state, hid)
                if found is None:
                    unread.append(pos)
                else:
                    out[pos] = (found, age)
        if not unread:
            return out
        reads = await self._store.fetch_many(
            [hid.json_key() for pos in unread if isinstance(hid := hids[pos], _ids.HsdsId)],
            self._max_metadata)
        for pos, got in zip(unread, reads, strict=True):
            hid = hids[pos]
            assert isinstance(hid, _ids.HsdsId)
            in_state = state is not None and hid.uuid1 == uuid1
            try:
                if isinstance(got, LayoutError):
                    raise got
                obj = await self._build(hid, _object_json(hid.json_key(), got.data),
                                        got.info.mtime)
            except LayoutError as exc:
                out[pos] = (exc, age if in_state else 0.0)
                continue
            if state is not None and in_state:
                state.built[hid.id] = (got.info.etag, obj)
            out[pos] = (obj, age if in_state else 0.0)
        return out

    def proven(self, obj_id: str) -> tuple[AnyObject, float] | None:
        """The object this catalog built from its domain's listing, if the current
        listing of that domain (the id's ``uuid1``) shows its JSON unchanged
        since, with the listing's age (no I/O)."""
        uuid1 = obj_id[2:19] if len(obj_id) > 19 else None
        state = None if self._index is None or uuid1 is None else self._index.fresh(uuid1)
        if state is None or self._index is None:
            return None
        kept = state.built.get(obj_id)
        found = state.listing.objects.get(obj_id)
        if kept is None or found is None or kept[0] != found.etag:
            return None
        return kept[1], self._index.age(state)

    async def _from_state(self, state: DomainState, hid: _ids.HsdsId
                          ) -> AnyObject | LayoutError | None:
        """The object as ``state`` knows it: missing, built before, or built from
        its summary entry; None if its JSON must be read."""
        found = state.listing.objects.get(hid.id)
        if found is None:
            return NotFound(hid.json_key())
        kept = state.built.get(hid.id)
        if kept is not None and kept[0] == found.etag:
            return kept[1]
        entry = state.docs.pop(hid.id, None)
        if entry is None:
            return None
        try:
            obj = await self._build(hid, _json.loads(entry), found.mtime)
        except (ValueError, LayoutError):
            return None  # the entry does not build: the object's own JSON says why
        state.built[hid.id] = (found.etag, obj)
        return obj

    async def _object(self, obj_id: str) -> AnyObject:
        hid = _parse_id(obj_id)
        fetched = await fetch_capped(self._store, hid.json_key(), self._max_metadata)
        return await self._build(hid, _object_json(hid.json_key(), fetched.data),
                                 fetched.info.mtime)

    async def _build(self, hid: _ids.HsdsId, doc: dict[str, Any],
                     modified: float) -> AnyObject:
        """The model object of ``hid`` from its JSON document (or summary entry),
        whose storage time is ``modified``."""
        key = hid.json_key()
        if doc.get("id", hid.id) != hid.id:
            raise Corrupt(key, f"holds object {doc.get('id')!r}, not {hid.id}")
        try:
            if hid.prefix == "g":
                return self._group(hid, key, doc, modified)
            if hid.prefix == "t":
                tj = doc.get("type")
                check_json(tj, "type")
                return Datatype(id=hid.id, attrs=self._attrs(doc), modified=modified,
                                type=parsed_type(tj)[1])
            return await self._dataset(hid, key, doc, modified)
        except (FormatError, KeyError, TypeError, ValueError, OverflowError,
                RecursionError) as exc:
            raise Corrupt(key, str(exc) or type(exc).__name__) from exc

    async def _read_json(self, key: str) -> dict[str, Any]:
        return _object_json(key, (await fetch_capped(self._store, key, self._max_metadata)).data)

    def _group(self, hid: _ids.HsdsId, key: str, doc: Mapping[str, Any],
               modified: float) -> Group:
        raw_links = doc.get("links", {})
        if not isinstance(raw_links, Mapping):
            raise FormatError("links must be an object")
        links: dict[str, Link] = {}
        bad: list[str] = []
        for name, item in raw_links.items():
            problem = link_name_problem(name)
            link = None if problem is not None else self._link(item)
            if link is None:
                bad.append(f"{name!r:.80} ({problem or 'malformed: ' + repr(item)[:80]})")
                continue
            links[name] = link
        if bad:
            report_once(Corrupt(f"{key} (links)", f"{len(bad)} of the links of {hid.id} "
                                f"are left out: {', '.join(bad[:LOGGED_BAD_LINKS])}"))
        return Group(id=hid.id, attrs=self._attrs(doc), modified=modified, links=links)

    @staticmethod
    def _link(item: Any) -> Link | None:
        """The link one ``links`` entry stores, or None if it is malformed."""
        if type(item) is not dict:
            return None
        cls = item.get("class")
        kind = _LINK_KINDS.get(cls) if type(cls) is str else None
        if kind is LinkKind.HARD:
            target = item.get("id")
            if type(target) is not str or not valid_text(target):
                return None
            try:
                obj_id = _ids.normalize_id(target)
            except _ids.BadId:
                return Link(LinkKind.HARD, target)
            target_kind = _ids.id_kind(obj_id)
            if target_kind is None:
                return Link(LinkKind.HARD, target)
            return Link(LinkKind.HARD, obj_id, target_kind=target_kind)
        path = item.get("h5path")
        if kind is None or type(path) is not str or not valid_text(path):
            return None
        if kind is LinkKind.SOFT:
            return Link(LinkKind.SOFT, path)
        domain = item.get("h5domain", item.get("domain"))
        if type(domain) is not str or not valid_text(domain):
            return None
        return Link(LinkKind.EXTERNAL, path, domain=domain)

    @staticmethod
    def _attrs(doc: Mapping[str, Any]) -> tuple[Attribute, ...]:
        raw = doc.get("attributes", {})
        if not isinstance(raw, Mapping):
            raise FormatError("attributes must be an object")
        out = []
        for name, item in raw.items():
            if not valid_text(name):
                raise FormatError(f"attribute name {name!r:.80} is not valid Unicode")
            if not isinstance(item, Mapping):
                raise FormatError(f"attribute {name!r:.80} is not an object")
            try:
                htype, etype = parsed_type(item.get("type"))
                shape = _shape(item.get("shape"))[0]
                value = attribute_value(htype, shape, item.get("value"), item.get("encoding"))
            except FormatError as exc:
                raise FormatError(f"attribute {name!r}: {exc}") from exc
            out.append(Attribute(name=name, value=value, dtype=etype.sidecar,
                                 hdf5=etype.hdf5, shape=shape))
        return tuple(out)

    async def _resolve_type(self, tj: Any, depth: int = 0) -> Any:
        """Inline a committed type given by id (``t-...``/``datatypes/...``)."""
        if not isinstance(tj, str) or tj.startswith("H5T_"):
            return tj
        if depth > MAX_TYPE_DEPTH:
            raise FormatError("committed type chain is too long")
        try:
            tid = _ids.parse_id(_ids.normalize_id(tj))
        except _ids.BadId as exc:
            raise FormatError(str(exc)) from exc
        if tid.prefix != "t":
            raise FormatError(f"type refers to a non-type object {tj!r}")
        doc = await self._read_json(tid.json_key())
        inner = await self._resolve_type(doc.get("type"), depth + 1)
        return {**inner, "id": tid.id} if isinstance(inner, Mapping) else inner

    async def _dataset(self, hid: _ids.HsdsId, key: str, doc: Mapping[str, Any],
                       modified: float) -> Dataset:
        tj = await self._resolve_type(doc.get("type"))
        cprops = doc.get("creationProperties") or {}
        if not isinstance(cprops, Mapping):
            raise FormatError("creationProperties must be an object")
        layout = _layout(doc, cprops)
        filters = cprops.get("filters") or []
        hdf5 = _description(tj, filters, layout)
        htype, etype = parsed_type(tj)
        shape, maxshape = _shape(doc.get("shape"))
        chunks = _chunk_shape(shape, layout)
        fill = fill_value(htype, cprops.get("fillValue"), cprops.get("fillValue_encoding"))
        store: ChunkStore
        cls = layout.get("class")
        if cls in LINKED_LAYOUTS:
            if not shape:
                raise FormatError(f"{cls} layout on a dataset without dimensions")
            chunks = linked_chunks(cls, shape, etype, chunks)
            store = linked_store(key, shape, etype, chunks, layout, filters=filters, fill=fill,
                                 open_uri=self._open_uri, load_table=self._chunk_table)
        else:
            plan = _shared(filter_plan(filters))
            partitions = layout.get("partition_count", 0)
            if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 0:
                raise FormatError(f"bad partition_count {partitions!r}")
            spec = ChunkSpec(htype=htype, etype=etype, chunks=chunks, plan=plan)
            store = HsdsChunkStore(self._store, hid, shape, spec, partitions,
                                   domain_index=self._index, decoded=self._decoded)
        check_sizes(shape, chunks, etype)
        return Dataset(
            id=hid.id, attrs=self._attrs(doc), modified=modified, shape=shape,
            maxshape=maxshape, type=etype, chunks=chunks, fill_value=fill, hdf5=hdf5, store=store,
            stored_ref=_ids.stored_ref)

    async def _chunk_table(self, table_id: str) -> Dataset:
        """The chunk table of an ``H5D_CHUNKED_REF_INDIRECT`` dataset."""
        try:
            table = await self._object(table_id)
        except NotFound as exc:
            raise Corrupt(f"id:{table_id}", "chunk table is missing") from exc
        if not isinstance(table, Dataset):
            raise Corrupt(f"id:{table_id}", "chunk table is not a dataset")
        if table.hdf5.get("layout", {}).get("class") == "H5D_CHUNKED_REF_INDIRECT":
            raise Corrupt(f"id:{table_id}", "a chunk table cannot itself have a chunk table")
        return table


# ---------------------------------------------------------------------- dataset helpers


def _description(tj: Any, filters: Any, layout: Mapping[str, Any]) -> Mapping[str, Any]:
    """A dataset's ``hdf5`` description (type, filters, layout as stored),
    checked (``check_json``), one read-only instance shared by every dataset
    described alike: the datasets of a domain have a handful of distinct
    descriptions, and a walk of 100,000 of them would otherwise keep (and
    check, and redact for each sidecar, ``mountd.tree.sidecar``) 100,000
    copies. A large one (a linked dataset's layout may list where each chunk
    is in its file) stays the dataset's own dict, so the shared ones stay
    small."""
    try:
        key = orjson.dumps([tj, filters, layout])
    except (orjson.JSONEncodeError, TypeError):  # past 64-bit integers, lone surrogates
        key = None
    if key is None or len(key) > SHARED_DESCRIPTION_BYTES:
        return _checked_description(tj, filters, dict(layout))
    return _shared_description(key)


@functools.lru_cache(maxsize=SHARED_DESCRIPTIONS)
def _shared_description(key: bytes) -> Mapping[str, Any]:
    """``_description`` of the JSON ``key`` spells (a failed check is not kept)."""
    return MappingProxyType(_checked_description(*orjson.loads(key)))


def _checked_description(tj: Any, filters: Any, layout: Any) -> dict[str, Any]:
    check_json(tj, "type")
    check_json(layout, "layout")
    check_json(filters, "filters")
    return {"type": tj, "filters": filters, "layout": layout}


@functools.lru_cache(maxsize=SHARED_VALUES)
def _shared(value: _Hashable) -> _Hashable:
    """``value`` (a shape, maxshape or chunk shape, a filter plan), the first
    equal one seen: most datasets of a domain share theirs."""
    return value


def _dims(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise FormatError(f"{what} must be a list")
    if len(value) > MAX_RANK:
        raise FormatError(f"{what} has {len(value)} entries, more than {MAX_RANK}")
    dims = []
    for d in value:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise FormatError(f"bad {what} entry {d!r}")
        dims.append(d)
    return _shared(tuple(dims))


def _shape(shape: Any) -> tuple[tuple[int, ...] | None, tuple[int | None, ...] | None]:
    """(shape, maxshape) from HSDS shape JSON; None shape for ``H5S_NULL``."""
    if not isinstance(shape, Mapping):
        raise FormatError("shape must be an object")
    cls = shape.get("class")
    if cls == "H5S_NULL":
        return None, None
    if cls == "H5S_SCALAR":
        return (), ()
    if cls != "H5S_SIMPLE":
        raise FormatError(f"unknown shape class {cls!r}")
    dims = _dims(shape.get("dims"), "dims")
    if not dims:
        raise FormatError("H5S_SIMPLE shape without dims")
    if math.prod(dims) > MAX_ELEMENTS:
        raise FormatError(f"shape {list(dims)} has too many elements")
    raw_max = shape.get("maxdims")
    if raw_max is None:
        return dims, dims
    if not isinstance(raw_max, list) or len(raw_max) != len(dims):
        raise FormatError("maxdims must be a list as long as dims")
    maxshape: list[int | None] = []
    for m, d in zip(raw_max, dims, strict=True):
        if m in (0, "H5S_UNLIMITED"):
            maxshape.append(None)
        elif isinstance(m, int) and not isinstance(m, bool) and m >= d:
            maxshape.append(m)
        else:
            raise FormatError(f"bad maxdims entry {m!r}")
    return dims, _shared(tuple(maxshape))


def _layout(doc: Mapping[str, Any], cprops: Mapping[str, Any]) -> Mapping[str, Any]:
    """The layout in force: a top-level ``layout`` (older servers) unless the
    creation properties hold a linked layout, else ``creationProperties.layout``."""
    top = doc.get("layout")
    inner = cprops.get("layout")
    if top is not None and not isinstance(top, Mapping):
        raise FormatError("layout must be an object")
    if inner is not None and not isinstance(inner, Mapping):
        raise FormatError("creationProperties.layout must be an object")
    if isinstance(inner, Mapping) and inner.get("class") in LINKED_LAYOUTS:
        return inner
    return top or inner or {}


def _chunk_shape(shape: tuple[int, ...] | None, layout: Mapping[str, Any]) -> tuple[int, ...]:
    """Chunk shape: layout ``dims`` for chunked layouts; the whole dataset for
    contiguous, compact or missing layouts (HSDS stores those as one chunk)."""
    if not shape:
        return ()
    raw = layout.get("dims")
    if raw is None:
        if str(layout.get("class", "")).startswith("H5D_CHUNKED"):
            raise FormatError("chunked layout without dims")
        return shape
    chunks = _dims(raw, "layout dims")
    if len(chunks) != len(shape) or any(c <= 0 for c in chunks):
        raise FormatError(f"layout dims {list(chunks)} do not fit shape {list(shape)}")
    return chunks
