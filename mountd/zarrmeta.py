"""Zarr v2 metadata for the tree: ``.zgroup``, ``.zarray`` and ``.zattrs``.

Owns how a model object is described to Zarr v2 readers (MOUNT-SPEC.md,
"Zarr compatibility"). Chunk files are already decoded, so ``.zarray`` says
``compressor: null`` and lists ``filters`` only for variable-length codecs.
Fill values follow the Zarr v2 spec's JSON encoding. Where HDF5 dimension
scales (``DIMENSION_LIST``, ``CLASS = DIMENSION_SCALE``) name the dimensions,
``.zattrs`` carries ``_ARRAY_DIMENSIONS`` for xarray.

Pure functions over model objects, plus a reference resolver for paths.
"""

from __future__ import annotations

import base64
import posixpath
from typing import Any

import numcodecs
import numpy as np

from layouts.model import AnyObject, Dataset, ObjectRef, VlenKind
from mountd import jsonvalue
from mountd.sidecar import RefResolver, resolved_jsonable

ZGROUP = b'{\n  "zarr_format": 2\n}\n'


def _dump(doc: Any) -> bytes:
    return jsonvalue.encode_indented(doc) + b"\n"


def has_zarray(ds: Dataset) -> bool:
    """Zarr v2 cannot describe a null dataspace or a bare sub-array element type."""
    return ds.shape is not None and ds.type.dtype.subdtype is None


def _zarr_dtype(ds: Dataset) -> Any:
    if not ds.type.fixed_size:
        return "|O"
    dtype = ds.type.dtype
    if dtype.names is not None:
        return jsonvalue.jsonable(dtype.descr)
    return dtype.str


def _filters(ds: Dataset) -> list[dict[str, Any]] | None:
    kind = ds.type.vlen
    if kind is None:
        return None
    if kind is VlenKind.UTF8:
        return [{"id": "vlen-utf8"}]
    if kind is VlenKind.BYTES:
        return [{"id": "vlen-bytes"}]
    if kind is VlenKind.ARRAY:
        base = ds.type.vlen_base
        return [{"id": "vlen-array", "dtype": base.str if base is not None else "|u1"}]
    return [dict(numcodecs.JSON().get_config())]


def zarr_fill_value(ds: Dataset) -> Any:
    """The fill value as the Zarr v2 spec encodes it in JSON."""
    if not ds.type.fixed_size:
        fill = ds.fill_value
        return fill if fill is None or isinstance(fill, str | int | float) else None
    dtype = ds.type.dtype
    if dtype.names is not None or dtype.kind in "SV":
        return base64.b64encode(ds.fill_bytes()).decode("ascii")
    value = np.frombuffer(ds.fill_bytes(), dtype=dtype)[0]
    if dtype.kind == "c":
        return [jsonvalue.jsonable(float(value.real)), jsonvalue.jsonable(float(value.imag))]
    if dtype.kind == "f":
        return jsonvalue.jsonable(float(value))
    return value.item()


def zarray_bytes(ds: Dataset) -> bytes:
    shape = ds.shape or ()
    return _dump({
        "zarr_format": 2,
        "shape": list(shape),
        "chunks": list(ds.chunks) if shape else [],
        "dtype": _zarr_dtype(ds),
        "compressor": None,
        "fill_value": zarr_fill_value(ds),
        "order": "C",
        "filters": _filters(ds),
        "dimension_separator": ".",
    })


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


async def array_dimensions(obj: AnyObject, h5path: str,
                           resolve: RefResolver) -> list[str] | None:
    """Dimension names from HDF5 dimension scales, or None where there are none.

    A scalar has no dimensions to name, which is always known: ``[]``.
    """
    if not isinstance(obj, Dataset) or obj.shape is None:
        return None
    if obj.shape == ():
        return []
    attrs = {a.name: a.value for a in obj.attrs}
    if _text(attrs.get("CLASS")) == "DIMENSION_SCALE" and len(obj.shape) == 1:
        return [posixpath.basename(h5path)]
    dims = attrs.get("DIMENSION_LIST")
    if not isinstance(dims, list) or len(dims) != len(obj.shape):
        return None
    names = []
    for refs in dims:
        ref = refs[0] if isinstance(refs, list) and refs else refs
        if not isinstance(ref, ObjectRef):
            return None
        path = await resolve(ref)
        if not path:
            return None
        names.append(posixpath.basename(path))
    return names


async def zattrs_bytes(obj: AnyObject, h5path: str, resolve: RefResolver) -> bytes:
    out: dict[str, Any] = await resolved_jsonable({a.name: a.value for a in obj.attrs}, resolve)
    dims = await array_dimensions(obj, h5path, resolve)
    if dims is not None:
        out["_ARRAY_DIMENSIONS"] = dims
    return _dump(out)
