"""Zarr v2 metadata of a reference file -> model types, fill values and attributes.

Owns the meaning of one ``.zarray`` and one ``.zattrs`` as LINDI 0.4.6
(``lindi/LindiH5ZarrStore``, ``lindi/conversion``) and kerchunk write them,
expressed the way the HSDS reader shows the same HDF5 file:

* ``type_json``: an HSDS-style ``hdf5.type`` JSON synthesised from a NumPy
  dtype (what HSDS stores for the same h5py dtype: ``H5T_STD_I8LE`` for any
  one-byte integer, h5py's ``FALSE/TRUE`` enum for ``bool``, ``H5T_CSET_ASCII``
  fixed strings). The model's ``ElementType`` is then built by
  ``layouts.hdf5._types`` from that JSON, so dtypes and sidecar ``dtype``
  values are the HSDS reader's own.
* ``compound_type``: LINDI's ``_COMPOUND_DTYPE [[name, type], ...]``; a
  ``<REFERENCE>`` field becomes an ``H5T_REFERENCE`` of ``ref_width`` bytes
  (the chunk file holds the target's HDF5 path there, where HSDS holds an id).
* ``parse_zarray`` / ``fill_value``: the ``.zarray`` fields and the Zarr v2
  JSON encoding of fill values.
* ``attributes``: ``.zattrs`` minus LINDI's annotations and kerchunk's
  ``_ARRAY_DIMENSIONS``; ``"NaN"``/``"Infinity"``/``"-Infinity"`` (LINDI's
  ``encode_nan_inf_ninf``) become floats, ``{"_REFERENCE": {path, ...}}``
  becomes ``ObjectRef(path=...)``.

What JSON cannot keep (and so differs from HSDS): the charset of strings
(fixed strings read as ASCII, variable-length ones as UTF-8), enum mappings
(plain integers), attribute types (``Attribute.dtype`` is None).

Pure synchronous code without shared state; errors raise
``layouts.errors.FormatError``, which callers turn into ``Corrupt`` naming the key.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from layouts.bounds import MAX_ITEM_BYTES, MAX_RANK
from layouts.errors import FormatError
from layouts.model import Attribute, ElementType, ObjectRef

#: ``.zattrs`` keys that are annotations, not HDF5 attributes (lindi's
#: ``_special_attribute_keys`` plus kerchunk/xarray's dimension names).
ANNOTATIONS = frozenset({"_SCALAR", "_COMPOUND_DTYPE", "_REFERENCE", "_EXTERNAL_ARRAY_LINK",
                         "_SOFT_LINK", "_ARRAY_DIMENSIONS"})
#: The ``_COMPOUND_DTYPE`` type name of an object-reference field.
REFERENCE_FIELD = "<REFERENCE>"
#: Width of a reference in HSDS chunks (``S48``); wider when a file's paths are longer.
REFERENCE_WIDTH = 48

VLEN_UTF8_JSON: Mapping[str, Any] = {"class": "H5T_STRING", "length": "H5T_VARIABLE",
                                     "charSet": "H5T_CSET_UTF8", "strPad": "H5T_STR_NULLTERM"}
VLEN_ASCII_JSON: Mapping[str, Any] = {**VLEN_UTF8_JSON, "charSet": "H5T_CSET_ASCII"}

_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_BOOL_JSON = {"class": "H5T_ENUM",
              "members": [{"name": "FALSE", "value": 0}, {"name": "TRUE", "value": 1}],
              "base": {"class": "H5T_INTEGER", "base": "H5T_STD_I8LE"}}


# --------------------------------------------------------------------------- types


def reference_json(width: int) -> dict[str, Any]:
    """HSDS's object-reference type, ``width`` bytes long."""
    return {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_OBJ", "length": width,
            "charSet": "H5T_CSET_ASCII", "strPad": "H5T_STR_NULLPAD"}


def type_json(dtype: np.dtype[Any]) -> dict[str, Any]:
    """The HSDS type JSON of a fixed-size NumPy dtype (key order as HSDS writes it)."""
    if dtype.names is not None:
        return {"class": "H5T_COMPOUND",
                "fields": [{"name": name, "type": type_json(dtype.fields[name][0])}
                           for name in dtype.names]}
    if dtype.subdtype is not None:
        base, dims = dtype.subdtype
        return {"dims": list(dims), "class": "H5T_ARRAY", "base": type_json(base)}
    kind, size = dtype.kind, dtype.itemsize
    order = "BE" if dtype.str[0] == ">" else "LE"
    if kind == "b":
        return {**_BOOL_JSON}
    if kind in "iu" and size in (1, 2, 4, 8):
        return {"class": "H5T_INTEGER",
                "base": f"H5T_STD_{'I' if kind == 'i' else 'U'}{size * 8}{order}"}
    if kind == "f" and size in (2, 4, 8):
        return {"class": "H5T_FLOAT", "base": f"H5T_IEEE_F{size * 8}{order}"}
    if kind == "c" and size in (8, 16):  # h5py's complex: a compound of r and i
        part = {"class": "H5T_FLOAT", "base": f"H5T_IEEE_F{size * 4}{order}"}
        return {"class": "H5T_COMPOUND", "fields": [{"name": "r", "type": part},
                                                    {"name": "i", "type": dict(part)}]}
    if kind == "S":
        return {"class": "H5T_STRING", "length": size, "charSet": "H5T_CSET_ASCII",
                "strPad": "H5T_STR_NULLPAD"}
    if kind == "V" and size > 0:
        return {"class": "H5T_OPAQUE", "size": size}
    raise FormatError(f"dtype {dtype.str} has no HDF5 equivalent")


def _dtype(value: Any) -> np.dtype[Any]:
    try:
        return np.dtype(value)
    except (TypeError, ValueError, SyntaxError) as exc:
        raise FormatError(f"bad dtype {value!r}: {exc}") from exc


def compound_type(spec: Any, ref_width: int) -> dict[str, Any]:
    """HSDS type JSON for LINDI's ``_COMPOUND_DTYPE`` (``[[name, numpy type], ...]``)."""
    if not isinstance(spec, list) or not spec:
        raise FormatError(f"_COMPOUND_DTYPE must be a non-empty list, got {spec!r}")
    fields = []
    for item in spec:
        if not (isinstance(item, list) and len(item) == 2
                and isinstance(item[0], str) and isinstance(item[1], str)):
            raise FormatError(f"bad _COMPOUND_DTYPE field {item!r}")
        name, kind = item
        ftype = reference_json(ref_width) if kind == REFERENCE_FIELD else type_json(_dtype(kind))
        fields.append({"name": name, "type": ftype})
    return {"class": "H5T_COMPOUND", "fields": fields}


# --------------------------------------------------------------------------- .zarray


@dataclass(frozen=True, slots=True)
class ZArray:
    """The fields of one ``.zarray`` (Zarr v2)."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype[Any]
    fill_value: Any
    fortran: bool
    separator: str
    #: Codec configs in encoding order: the filters, then the compressor.
    codecs: tuple[Mapping[str, Any], ...]


def _ints(value: Any, what: str, least: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise FormatError(f"{what} must be a list, got {str(value)[:80]}")
    if len(value) > MAX_RANK:
        raise FormatError(f"{what} has {len(value)} dimensions, more than {MAX_RANK}")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < least for v in value):
        raise FormatError(f"bad {what} {value!r}")
    return tuple(value)


def _descr(value: Any) -> Any:
    """A Zarr v2 structured dtype (a list of ``[name, type[, shape]]``) for NumPy."""
    if not isinstance(value, list):
        return value
    fields = []
    for item in value:
        if not isinstance(item, list) or len(item) not in (2, 3) or not isinstance(item[0], str):
            raise FormatError(f"bad structured dtype field {str(item)[:80]}")
        base = _descr(item[1])
        fields.append((item[0], base, _ints(item[2], "field shape", 1)) if len(item) == 3
                      else (item[0], base))
    return fields


def parse_zarray(doc: Mapping[str, Any]) -> ZArray:
    """Check and unpack a ``.zarray`` document."""
    if doc.get("zarr_format", 2) != 2:
        raise FormatError(f"zarr_format {doc.get('zarr_format')!r} is not 2")
    shape = _ints(doc.get("shape"), "shape", 0)
    chunks = _ints(doc.get("chunks"), "chunks", 1)
    if len(chunks) != len(shape):
        raise FormatError(f"chunks {list(chunks)} do not fit shape {list(shape)}")
    dtype = _dtype(_descr(doc.get("dtype")))
    if dtype.itemsize > MAX_ITEM_BYTES:
        raise FormatError(f"dtype of {dtype.itemsize} bytes, more than {MAX_ITEM_BYTES}")
    order = doc.get("order", "C")
    if order not in ("C", "F"):
        raise FormatError(f"bad order {order!r}")
    separator = doc.get("dimension_separator") or "."
    if separator not in (".", "/"):
        raise FormatError(f"bad dimension_separator {separator!r}")
    filters = doc.get("filters") or []
    compressor = doc.get("compressor")
    if not isinstance(filters, list):
        raise FormatError(f"filters must be a list, got {filters!r}")
    codecs = [*filters, *([compressor] if compressor is not None else [])]
    for config in codecs:
        if not isinstance(config, Mapping) or not isinstance(config.get("id"), str):
            raise FormatError(f"bad codec config {config!r}")
    return ZArray(shape, chunks, dtype, doc.get("fill_value"), order == "F", separator,
                  tuple(codecs))


def _fill_bytes(text: Any, size: int) -> bytes:
    """A base64 fill value (Zarr v2, for strings, opaque and structured types)."""
    if not isinstance(text, str):
        raise FormatError(f"fill value {text!r} is not base64 text")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FormatError(f"bad base64 fill value: {exc}") from exc
    if len(raw) > size:
        raise FormatError(f"fill value of {len(raw)} bytes for a {size}-byte type")
    return raw.ljust(size, b"\0")


def _fill_number(value: Any, kind: str) -> Any:
    if isinstance(value, str) and kind in "fc":
        special = _SPECIAL_FLOATS.get(value)
        if special is None:
            raise FormatError(f"bad fill value {value!r}")
        return special
    if kind == "c" and isinstance(value, list) and len(value) == 2:
        return complex(_fill_number(value[0], "f"), _fill_number(value[1], "f"))
    if kind == "b" and isinstance(value, bool | int):
        return bool(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FormatError(f"bad fill value {value!r}")
    return value


def fill_value(etype: ElementType, zarr_dtype: np.dtype[Any], value: Any) -> Any:
    """A dataset's fill value as the model wants it (see ``Dataset.fill_value``).

    Fixed-size types give a NumPy scalar of ``etype.dtype`` (zeros when the
    ``.zarray`` has none, as HSDS shows an HDF5 dataset without one).
    Variable-length types give None, as HSDS does (LINDI writes ``0`` or ``""``
    there, which is zarr's default, not the HDF5 file's).
    """
    if not etype.fixed_size:
        return None
    arr = np.zeros((), dtype=zarr_dtype if zarr_dtype.kind != "O" else etype.dtype)
    if value is not None and zarr_dtype.kind != "O":
        if zarr_dtype.kind == "S":
            arr[()] = _fill_bytes(value, zarr_dtype.itemsize).rstrip(b"\0")
        elif zarr_dtype.kind == "V":
            arr = np.frombuffer(_fill_bytes(value, zarr_dtype.itemsize), dtype=zarr_dtype)[0]
        else:
            try:
                arr[()] = _fill_number(value, zarr_dtype.kind)
            except (TypeError, ValueError, OverflowError) as exc:
                raise FormatError(f"fill value {value!r} does not fit {zarr_dtype}: {exc}") \
                    from exc
    if arr.dtype.names is not None and arr.dtype != etype.dtype:
        arr = np.asarray(arr).astype(etype.dtype)
    return np.frombuffer(np.asarray(arr).tobytes(), dtype=etype.dtype)[0]


# --------------------------------------------------------------------------- .zattrs


def _number_leaves(value: Any) -> bool:
    """True if every leaf of a nested list is a number or a NaN/Infinity word."""
    if isinstance(value, list):
        return all(_number_leaves(v) for v in value)
    if isinstance(value, str):
        return value in _SPECIAL_FLOATS
    return isinstance(value, int | float) and not isinstance(value, bool)


def _reference(value: Mapping[str, Any]) -> ObjectRef:
    ref = value["_REFERENCE"]
    path = ref.get("path") if isinstance(ref, Mapping) else None
    if not isinstance(path, str) or not path:
        raise FormatError(f"_REFERENCE without a path: {ref!r}")
    return ObjectRef(path=path)


def _value(value: Any, floats: bool) -> Any:
    if isinstance(value, str):
        return _SPECIAL_FLOATS.get(value, value) if floats else value
    if isinstance(value, list):
        return [_value(v, floats) for v in value]
    if isinstance(value, Mapping):
        if "_REFERENCE" in value:
            return _reference(value)
        return {k: attr_value(v) for k, v in value.items()}
    return value


def attr_value(value: Any) -> Any:
    """One ``.zattrs`` value as a model value.

    A lone NaN/Infinity word, or one in a list of numbers, is the float LINDI
    encoded (it refuses those words as string attributes); in a list holding
    other strings it stays a string.
    """
    if isinstance(value, list):
        return _value(value, _number_leaves(value))
    return _value(value, True)


def attributes(doc: Mapping[str, Any]) -> tuple[Attribute, ...]:
    """The HDF5 attributes in a ``.zattrs`` document."""
    return tuple(Attribute(name=name, value=attr_value(value))
                 for name, value in doc.items() if name not in ANNOTATIONS)


def reference_path(value: Any) -> str | None:
    """The target path of a LINDI reference element (``{"_REFERENCE": {...}}``);
    None for a null reference. Raises ``FormatError`` for anything else."""
    if value is None:
        return None
    if isinstance(value, Mapping) and "_REFERENCE" in value:
        path = _reference(value).path
        assert path is not None
        return path
    raise FormatError(f"not a reference: {str(value)[:80]}")


def nested_items(items: Sequence[Any], dims: Sequence[int]) -> list[Any]:
    """Flat C-order elements of nested lists of shape ``dims`` (numcodecs JSON rows)."""
    if not dims:  # a 0-d array: numcodecs writes its one element as a 1-item list
        if not isinstance(items, list) or len(items) != 1:
            raise FormatError(f"expected one item, got {str(items)[:80]}")
        return list(items)
    if not isinstance(items, list) or len(items) != dims[0]:
        raise FormatError(f"expected a list of {dims[0]} items, got {str(items)[:80]}")
    if len(dims) == 1:
        return list(items)
    out: list[Any] = []
    for item in items:
        out.extend(nested_items(item, dims[1:]))
    return out
