"""The metadata documents of one HDF5 object: the ``.json`` sidecar and xattrs.

Owns the sidecar's shape (docs/CONTRACT.md, "Sidecars"), with the keys
views add to it (``layouts.views._api.View.sidecar``, given here by the tree),
and the ``user.h5.*`` extended attributes. Where storage's own descriptions
may name a file by URL (``hdf5``: an HSDS ``file_uri``; an external link's
``domain``), their strings are shown through ``mountd.logsafe.redact``;
attribute values and data are HDF5 content, shown as stored. Works on model objects; the only
I/O is through the callables it is given (reading a scalar's one chunk,
resolving object references to paths). The one state is a bounded table
of the shown forms of shared ``hdf5`` descriptions, changed only in
synchronous code (a dict assignment or clear, atomic in any thread); safe
from any number of tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from layouts.model import AnyObject, Dataset, Datatype, Domain, Group, LinkKind, ObjectRef
from layouts.views import decode_chunk
from mountd import logsafe
from mountd.tree import jsonvalue

log = logging.getLogger(__name__)

XATTR_MAX = 64 * 1024
#: Shown ``hdf5`` descriptions kept (``_shown_description``); all are
#: dropped when it is full.
SHOWN_DESCRIPTIONS = 256

#: id of a model description -> (that description, the secrets' generation
#: it was redacted in, its shown form). The description is held so its id is
#: not reused while the entry lives.
_SHOWN: dict[int, tuple[Mapping[str, Any], int, jsonvalue.Plain]] = {}

RefResolver = Callable[[ObjectRef], Awaitable[str | None]]


async def resolved_jsonable(value: Any, resolve: RefResolver,
                            holding_refs: Sequence[Any] | None = None) -> Any:
    """``value`` as strict-JSON-safe Python, object references resolved to paths.

    ``holding_refs``, when given, are the only parts of ``value`` that may hold
    references (attribute values, say), so the rest is not searched.
    """
    scan = [value] if holding_refs is None else holding_refs
    refs = {ref: await resolve(ref) for part in scan for ref in set(jsonvalue.find_refs(part))}
    return jsonvalue.jsonable(value, refs)


async def scalar_value(ds: Dataset) -> Any:
    """The value of a scalar dataset (its fill value when the chunk is not stored)."""
    data = await ds.read_chunk((0,))
    if data is None:
        return ds.effective_fill
    return decode_chunk(ds, data)[0]


def _dataset_fields(ds: Dataset) -> dict[str, Any]:
    return {
        "shape": None if ds.shape is None else list(ds.shape),
        "maxshape": None if ds.maxshape is None else list(ds.maxshape),
        "dtype": ds.type.sidecar,
        "chunks": list(ds.chunks),
        "fill_value": ds.effective_fill,
        "hdf5": _shown_description(ds.hdf5),
    }


def _shown_description(hdf5: Mapping[str, Any]) -> jsonvalue.Plain:
    """A dataset's ``hdf5`` description as its sidecar shows it (redacted,
    converted). A read-only one (``MappingProxyType``) is one a catalog shares
    among the datasets described alike (``Dataset.hdf5``): its shown form is
    kept by its identity, so a walk redacts each such description once."""
    shared = isinstance(hdf5, MappingProxyType)  # else a dataset's own: not kept
    secrets = logsafe.generation()
    kept = _SHOWN.get(id(hdf5)) if shared else None
    if kept is not None and kept[0] is hdf5 and kept[1] == secrets:
        return kept[2]
    shown = jsonvalue.Plain(jsonvalue.jsonable(logsafe.redact_strings(hdf5)))
    if shared:
        if len(_SHOWN) >= SHOWN_DESCRIPTIONS:
            _SHOWN.clear()
        _SHOWN[id(hdf5)] = (hdf5, secrets, shown)
    return shown


async def sidecar_document(obj: AnyObject, h5path: str, domain: Domain | None,
                           resolve: RefResolver,
                           views: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The sidecar of ``obj`` reached at ``h5path`` as JSON-safe Python.

    ``domain`` is given for a domain's root group, whose sidecar carries the
    domain's own metadata. ``views`` are the keys views add, after the
    sidecar's own (which they cannot replace).
    """
    doc: dict[str, Any] = {"kind": obj.kind.value, "path": h5path, "id": obj.id}
    if isinstance(obj, Dataset):
        doc.update(_dataset_fields(obj))
        if obj.shape == ():
            doc["value"] = await scalar_value(obj)
    elif isinstance(obj, Datatype):
        doc["dtype"] = obj.type.sidecar
        doc["hdf5"] = {"type": dict(obj.type.hdf5)}
    elif isinstance(obj, Group):
        if domain is not None and domain.info:
            doc["domain"] = dict(domain.info)
        links = stored_links(obj)
        if links:
            doc["links"] = links
    doc["attributes"] = {a.name: a.value for a in obj.attrs}
    doc["modified"] = obj.modified
    added = {key: value for key, value in (views or {}).items() if key not in doc}
    doc.update(added)
    # References live in attribute values, data and what views add; the rest
    # is storage JSON.
    holding = [*doc["attributes"].values(), doc.get("value"), doc.get("fill_value"),
               *added.values()]
    result: dict[str, Any] = await resolved_jsonable(doc, resolve, holding)
    return result


def stored_links(group: Group) -> dict[str, dict[str, str | None]]:
    """The group's soft and external links as stored, by name: their symlinks'
    texts are rewritten to stay inside the mount, so the raw targets are kept
    here (hard links are the directories themselves)."""
    out: dict[str, dict[str, str | None]] = {}
    for name, link in group.links.items():
        if link.kind is LinkKind.SOFT:
            out[name] = {"kind": "soft", "path": link.target}
        elif link.kind is LinkKind.EXTERNAL:
            out[name] = {"kind": "external", "domain": logsafe.redact_strings(link.domain),
                         "path": link.target}
    return out


async def sidecar_bytes(obj: AnyObject, h5path: str, domain: Domain | None,
                        resolve: RefResolver, views: Mapping[str, Any] | None = None) -> bytes:
    doc = await sidecar_document(obj, h5path, domain, resolve, views)
    return jsonvalue.encode_indented(doc) + b"\n"


async def object_xattrs(obj: AnyObject, resolve: RefResolver) -> dict[str, bytes]:
    """``user.h5.*`` attributes of ``obj``; values over 64 KiB are left out."""
    out: dict[str, bytes] = {"user.h5.id": obj.id.encode(), "user.h5.kind": obj.kind.value.encode()}
    if isinstance(obj, Dataset | Datatype):
        sidecar_dtype = obj.type.sidecar
        out["user.h5.dtype"] = (sidecar_dtype if isinstance(sidecar_dtype, str)
                                else jsonvalue.dumps(sidecar_dtype, indent=None)).encode()
    if isinstance(obj, Dataset):
        shape = None if obj.shape is None else list(obj.shape)
        out["user.h5.shape"] = jsonvalue.dumps(shape, indent=None).encode()
    for attr in obj.attrs:
        name = f"user.h5.attr.{attr.name}"
        if len(name.encode()) > 255:
            continue
        if isinstance(attr.value, str):
            value = attr.value.encode("utf-8", "surrogateescape")
        else:
            value = jsonvalue.dumps(await resolved_jsonable(attr.value, resolve),
                                    indent=None).encode()
        if len(value) > XATTR_MAX:
            log.debug("xattr %s of %s left out: %d bytes", name, obj.id, len(value))
            continue
        out[name] = value
    return out
