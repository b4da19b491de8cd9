"""Zarr v2 metadata for the tree: ``.zgroup``, ``.zarray`` and ``.zattrs``.

Owns how a model object is described to Zarr v2 readers (docs/CONTRACT.md,
"Zarr metadata"). Chunk files are already decoded, so ``.zarray`` says
``compressor: null`` and lists ``filters`` only for variable-length codecs.
Fill values follow the Zarr v2 spec's JSON encoding. Where HDF5 dimension
scales (``DIMENSION_LIST``, ``CLASS = DIMENSION_SCALE``) name the dimensions,
``.zattrs`` carries ``_ARRAY_DIMENSIONS`` for xarray.

A dataset whose element type is an HDF5 array type (``H5T_ARRAY``, nested
ones included) is shown as NumPy and h5py read it: the base type as dtype,
the array's dims appended to ``shape`` and ``chunks``. Each chunk holds the
whole of those dims, so its bytes are unchanged, and its Zarr v2 grid index
is the stored one with a ``0`` per array dim (``chunk_name_suffix``). Zarr
has one fill value per array, so such a dataset whose fill value's items
differ has no ``.zarray``. The appended dims are named ``NAME_dim_K`` in
``_ARRAY_DIMENSIONS`` (HDF5 names only the dataspace's dimensions). A
compound type with array-typed fields keeps them as fields: the Zarr v2
spec's structured dtypes give a field a shape (``[name, dtype, shape]``).

Pure functions over model objects, plus a reference resolver for paths.
"""

from __future__ import annotations

import base64
import math
import posixpath
from typing import Any

import numcodecs
import numpy as np

from layouts.model import AnyObject, Dataset, ObjectRef, VlenKind
from mountd.tree import jsonvalue
from mountd.tree.sidecar import RefResolver, resolved_jsonable

ZGROUP = b'{\n  "zarr_format": 2\n}\n'


def _dump(doc: Any) -> bytes:
    return jsonvalue.encode_indented(doc) + b"\n"


def zarr_element(ds: Dataset) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The dtype Zarr sees for ``ds`` and the dims appended to its shape and chunks.

    A sub-array element type (nested ones flattened, outer dims first) gives
    its base type and the array's dims; any other type is itself with none.
    """
    return ds.type.base_and_dims


def _fill_item(ds: Dataset) -> bytes | None:
    """One item of the fill value in the Zarr dtype, as chunk-file bytes.

    None when the items of a sub-array type's fill value differ: Zarr has a
    single fill value for the whole array. Fixed-size types only.
    """
    base, dims = zarr_element(ds)
    if not dims:
        return ds.fill_bytes()
    fill = ds.fill_value
    items = np.zeros(dims, base) if fill is None else \
        np.broadcast_to(np.asarray(fill, dtype=base), dims)
    raw = items.tobytes()
    first = raw[:base.itemsize]
    return first if raw == first * math.prod(dims) else None


def has_zarray(ds: Dataset) -> bool:
    """Zarr v2 cannot describe a null dataspace, nor a sub-array type whose
    fill value's items differ."""
    if ds.shape is None:
        return False
    return not ds.type.fixed_size or not zarr_element(ds)[1] or _fill_item(ds) is not None


def chunk_name_suffix(ds: Dataset) -> str:
    """What a chunk file's name adds to the name of its stored index.

    The Zarr v2 grid index of a sub-array type's chunk has a ``0`` more per
    array dim: ``".0"`` each, except that a scalar's one chunk ``0`` already
    names the first. ``""`` for every other type.
    """
    dims = zarr_element(ds)[1]
    return ".0" * (len(dims) - (0 if ds.shape or not dims else 1))


def _zarr_dtype(ds: Dataset) -> Any:
    if not ds.type.fixed_size:
        return "|O"
    dtype = zarr_element(ds)[0]
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
    """The fill value as the Zarr v2 spec encodes it in JSON (one item of the
    Zarr dtype; None where ``has_zarray`` finds a sub-array fill's items differ)."""
    if not ds.type.fixed_size:
        fill = ds.fill_value
        return fill if fill is None or isinstance(fill, str | int | float) else None
    raw = _fill_item(ds)
    if raw is None:
        return None
    dtype = zarr_element(ds)[0]
    if dtype.names is not None or dtype.kind in "SV":
        return base64.b64encode(raw).decode("ascii")
    value = np.frombuffer(raw, dtype=dtype)[0]
    if dtype.kind == "c":
        return [jsonvalue.jsonable(float(value.real)), jsonvalue.jsonable(float(value.imag))]
    if dtype.kind == "f":
        return jsonvalue.jsonable(float(value))
    return value.item()


def zarray_bytes(ds: Dataset) -> bytes:
    """The ``.zarray`` of a dataset ``has_zarray`` accepts."""
    dims = zarr_element(ds)[1]
    return _dump({
        "zarr_format": 2,
        "shape": [*(ds.shape or ()), *dims],
        "chunks": [*(ds.chunks if ds.shape else ()), *dims],
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
    """The ``_ARRAY_DIMENSIONS`` of a dataset, or None where its dimensions have no names.

    The dataspace's dimensions are named by HDF5 dimension scales; a scalar
    has none to name, which is always known: ``[]``. The dims a sub-array
    type appends are named ``NAME_dim_K`` (``NAME`` the dataset's link name,
    ``K`` from 0), so that every Zarr dimension has a name.
    """
    if not isinstance(obj, Dataset) or obj.shape is None:
        return None
    names = await _dataspace_dimensions(obj, h5path, resolve)
    if names is None:
        return None
    name = posixpath.basename(h5path)
    return names + [f"{name}_dim_{k}" for k in range(len(zarr_element(obj)[1]))]


async def _dataspace_dimensions(ds: Dataset, h5path: str,
                                resolve: RefResolver) -> list[str] | None:
    """Names of the dataspace's dimensions from HDF5 dimension scales, or None."""
    shape = ds.shape or ()
    if shape == ():
        return []
    attrs = {a.name: a.value for a in ds.attrs}
    if _text(attrs.get("CLASS")) == "DIMENSION_SCALE" and len(shape) == 1:
        return [posixpath.basename(h5path)]
    dims = attrs.get("DIMENSION_LIST")
    if not isinstance(dims, list) or len(dims) != len(shape):
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
