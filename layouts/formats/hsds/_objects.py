"""Building the object model from HSDS object JSON: what a bucket stores and a service answers.

Owns ``ObjectBuilder``, the part of an HSDS catalog that turns one object's
JSON document (a group's links and attributes, a dataset's type, shape,
layout, filters and fill value, a committed datatype) into a model object,
and the helpers that parse and share those pieces. The document is the same
whether it was read from a bucket (``db/.../.group.json``), from a domain's
summary, or from an HSDS service's ``GET /groups/ID?include_links=1&include_attrs=1``
(the service answers with the stored JSON plus fields this ignores). Two
things differ between the sources, and a subclass supplies them: where a
committed datatype's document is read (``_type_doc``), and what reads a
dataset's chunks (``_chunk_store``).

Bounds: everything parsed is held to ``layouts.bounds`` (ranks, element and
byte counts, JSON depth), so one hostile object gives ``Corrupt`` for itself
alone. A link whose name no file name can show, or whose JSON is malformed,
is left out of its group, logged once per group.

Concurrency: a builder keeps no mutable state; the shared descriptions and
tuples are kept in ``functools.lru_cache``, which is safe across trio tasks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
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
from layouts.errors import Corrupt, FormatError, report_once
from layouts.formats.hsds import _ids, _json
from layouts.formats.hsds._values import attribute_value, fill_value
from layouts.hdf5 import MAX_TYPE_DEPTH, HType, parsed_type
from layouts.model import (
    AnyObject,
    Attribute,
    ChunkStore,
    Dataset,
    Datatype,
    ElementType,
    Group,
    Link,
    LinkKind,
    ObjectKind,
)

#: Layout classes whose chunks live in another file (``hsload --link``).
LINKED_LAYOUTS = ("H5D_CONTIGUOUS_REF", "H5D_CHUNKED_REF", "H5D_CHUNKED_REF_INDIRECT")
#: Malformed links named in the one log line of a group that has them.
LOGGED_BAD_LINKS = 3

#: Distinct dataset descriptions kept shared (``_description``), and the
#: largest shared, as JSON bytes.
SHARED_DESCRIPTIONS = 1024
SHARED_DESCRIPTION_BYTES = 4096
#: Distinct dimension tuples and filter plans kept shared (``shared``).
SHARED_VALUES = 4096

_Hashable = TypeVar("_Hashable", bound=Hashable)

_LINK_KINDS = {"H5L_TYPE_HARD": LinkKind.HARD, "H5L_TYPE_SOFT": LinkKind.SOFT,
               "H5L_TYPE_EXTERNAL": LinkKind.EXTERNAL}


def load_json(key: str, raw: bytes) -> dict[str, Any]:
    """A JSON object document; ``Corrupt`` naming ``key`` if it is not one."""
    try:
        doc = _json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Corrupt(key, f"not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise Corrupt(key, f"expected a JSON object, got {type(doc).__name__}")
    return doc


def object_json(key: str, raw: bytes) -> dict[str, Any]:
    """An object's JSON. A zero-length object (a write in progress, or lost)
    is Corrupt: something links to it, so it is not simply missing."""
    if not raw:
        raise Corrupt(key, "object JSON is empty")
    return load_json(key, raw)


def object_id(obj_id: str) -> _ids.HsdsId:
    """The parsed id of an object a link or a request names; ``Corrupt`` if it is
    not an HSDS id."""
    try:
        return _ids.parse_id(_ids.normalize_id(obj_id))
    except _ids.BadId as exc:
        raise Corrupt(f"id:{obj_id}", str(exc)) from exc


def root_group_id(root: Any, where: str) -> str:
    """A domain's ``root`` as a group id; ``Corrupt`` naming ``where`` if it is not one."""
    try:
        root_id = _ids.parse_id(root) if isinstance(root, str) else None
    except _ids.BadId:
        root_id = None
    if root_id is None or root_id.kind is not ObjectKind.GROUP:
        raise Corrupt(where, f"root is not a group id: {root!r}")
    return root_id.id


@dataclass(frozen=True, slots=True)
class DatasetParts:
    """What a dataset's JSON says about its chunks, handed to ``_chunk_store``."""

    hid: _ids.HsdsId
    #: The name errors about the dataset give (its JSON's storage key).
    key: str
    shape: tuple[int, ...] | None
    chunks: tuple[int, ...]
    htype: HType
    etype: ElementType
    layout: Mapping[str, Any]
    filters: Any
    fill: Any


class ObjectBuilder:
    """Model objects from HSDS object JSON; subclasses say where committed types
    are read (``_type_doc``) and what reads a dataset's chunks (``_chunk_store``)."""

    def _name(self, hid: _ids.HsdsId) -> str:
        """What errors about the object ``hid`` name: its JSON's storage key."""
        return hid.json_key()

    async def _type_doc(self, tid: _ids.HsdsId) -> dict[str, Any]:
        """The JSON document of the committed datatype ``tid``."""
        raise NotImplementedError

    def _chunk_store(self, parts: DatasetParts) -> tuple[ChunkStore, tuple[int, ...]]:
        """The chunk store of a dataset, and its chunk shape (a linked layout
        may choose its own grid)."""
        raise NotImplementedError

    async def _build(self, hid: _ids.HsdsId, doc: dict[str, Any],
                     modified: float) -> AnyObject:
        """The model object of ``hid`` from its JSON document (or summary entry),
        whose storage time is ``modified``."""
        key = self._name(hid)
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
        doc = await self._type_doc(tid)
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
        store, chunks = self._chunk_store(DatasetParts(
            hid=hid, key=key, shape=shape, chunks=chunks, htype=htype, etype=etype,
            layout=layout, filters=filters, fill=fill))
        check_sizes(shape, chunks, etype)
        return Dataset(
            id=hid.id, attrs=self._attrs(doc), modified=modified, shape=shape,
            maxshape=maxshape, type=etype, chunks=chunks, fill_value=fill, hdf5=hdf5, store=store,
            stored_ref=_ids.stored_ref)


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
def shared(value: _Hashable) -> _Hashable:
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
    return shared(tuple(dims))


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
    return dims, shared(tuple(maxshape))


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
