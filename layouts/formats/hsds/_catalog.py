"""The HSDS storage layout: a bucket (or one of its domains) as a ``Catalog``.

Owns reading HSDS metadata JSON from a ``Store``: folders and domains
(``.domain.json``), each object's JSON (built into the model by
``layouts.formats.hsds._objects``, whose ``ObjectBuilder`` this catalog is),
and which chunk store a dataset gets: ``layouts.formats.hsds._chunks`` for
chunk objects, ``layouts.formats.hsds._linked`` for datasets whose data stays
in an HDF5 file (``hsload --link``); ids and keys by
``layouts.formats.hsds._ids``.

Every failure leaves as ``NotFound`` (nothing there), ``Corrupt`` (stored bytes
that are not valid HSDS, naming the key) or ``StorageError`` from the store.
Metadata from a bucket someone else controls is held to the bounds of
``layouts.bounds`` (see ``_objects``), and every JSON object is read capped
at ``max_metadata`` bytes (``storage.fetch_capped``); the ``domain`` info is
checked by ``check_json``.

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

import logging
from collections.abc import Sequence
from typing import Any

from layouts.bounds import check_json
from layouts.decoding import DecodedCache
from layouts.errors import Corrupt, FormatError, LayoutError, NotFound, SourceError
from layouts.formats.hsds import _ids, _json
from layouts.formats.hsds._chunks import ChunkSpec, HsdsChunkStore, filter_plan
from layouts.formats.hsds._domains import DomainIndex, DomainState
from layouts.formats.hsds._linked import linked_chunks, linked_store
from layouts.formats.hsds._objects import (
    LINKED_LAYOUTS,
    DatasetParts,
    ObjectBuilder,
    load_json,
    object_id,
    object_json,
    root_group_id,
    shared,
)
from layouts.model import AnyObject, ChunkStore, Dataset, Domain
from layouts.places import Host, Place, PlaceKind
from layouts.storage import DEFAULT_MAX_METADATA, OpenUri, Store, fetch_capped

log = logging.getLogger(__name__)

DOMAIN_FILE = ".domain.json"
#: How many top-level prefixes ``probe`` checks for a ``.domain.json``.
PROBE_PREFIXES = 64

def _clean_path(path: str) -> str:
    return path.strip("/")


def _prefix(path: str) -> str:
    """The listing prefix of a folder path: ``""`` or ``a/b/``."""
    path = _clean_path(path)
    return f"{path}/" if path else ""


def _root_uuid1(domain: Domain) -> str | None:
    """The ``uuid1`` of a schema v2 domain's root group (its objects' prefix)."""
    if domain.root_id is None:
        return None
    try:
        return _ids.parse_id(domain.root_id).uuid1
    except _ids.BadId:
        return None


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
    single = None if domain is None else domain_path(domain)
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


def domain_path(domain: str) -> str:
    """The domain ``--domain`` names, without slashes at either end (a bucket's and
    a service's alike); ``SourceError`` if it names none."""
    path = domain.strip("/")
    if not path:
        raise SourceError("--domain needs a domain path such as /home/user/file.h5")
    return path


class HsdsCatalog(ObjectBuilder):
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
        doc = load_json(key, fetched.data)
        root = doc.get("root")
        if root is not None:
            root = root_group_id(root, key)
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
                hids.append(object_id(obj_id))
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
                obj = await self._build(hid, object_json(hid.json_key(), got.data),
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
        hid = object_id(obj_id)
        fetched = await fetch_capped(self._store, hid.json_key(), self._max_metadata)
        return await self._build(hid, object_json(hid.json_key(), fetched.data),
                                 fetched.info.mtime)

    async def _type_doc(self, tid: _ids.HsdsId) -> dict[str, Any]:
        key = tid.json_key()
        return object_json(key, (await fetch_capped(self._store, key, self._max_metadata)).data)

    def _chunk_store(self, parts: DatasetParts) -> tuple[ChunkStore, tuple[int, ...]]:
        """Chunk objects of the bucket, or byte ranges of the HDF5 file a linked
        layout names (``hsload --link``)."""
        layout, cls = parts.layout, parts.layout.get("class")
        if cls in LINKED_LAYOUTS:
            if not parts.shape:
                raise FormatError(f"{cls} layout on a dataset without dimensions")
            chunks = linked_chunks(cls, parts.shape, parts.etype, parts.chunks)
            return linked_store(parts.key, parts.shape, parts.etype, chunks, layout,
                                filters=parts.filters, fill=parts.fill,
                                open_uri=self._open_uri, load_table=self._chunk_table), chunks
        partitions = layout.get("partition_count", 0)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 0:
            raise FormatError(f"bad partition_count {partitions!r}")
        spec = ChunkSpec(htype=parts.htype, etype=parts.etype, chunks=parts.chunks,
                         plan=shared(filter_plan(parts.filters)))
        return HsdsChunkStore(self._store, parts.hid, parts.shape, spec, partitions,
                              domain_index=self._index, decoded=self._decoded), parts.chunks

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
