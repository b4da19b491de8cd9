"""HDF5 type JSON -> ``HType`` and the model's ``ElementType``, for every format.

Owns ``parse_type``: the HDF5/JSON type description (``h5json/hdf5dtype.py``
is the reference; HSDS stores it, and ``layouts.formats.refs._types`` writes it for a
reference file's zarr dtypes) to an ``HType`` tree, and ``element_type`` from
that to the model's ``ElementType``. Storage dtypes follow HSDS: packed numpy
structs for compounds, ``S<n>`` for fixed strings (UTF-8 too), ``V<n>`` for
opaque, ``S48`` for object references, the base integer for enums, and numpy
``bool`` for h5py's boolean enum (``FALSE=0, TRUE=1`` over ``int8``), which is
stored as the same single byte. ``parsed_type`` keeps the parses of the
distinct type JSONs it has seen.

Types are held to ``layouts.bounds`` (``MAX_RANK`` dimensions,
``MAX_ITEM_BYTES`` per element) and nested at most ``MAX_TYPE_DEPTH`` deep.
Errors raise ``FormatError``; callers turn it into ``Corrupt`` with the
storage key.

Concurrency: pure synchronous code; the parse cache is ``functools.lru_cache``
of immutable results, safe from any task or worker thread.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from layouts.bounds import MAX_ITEM_BYTES, MAX_RANK
from layouts.errors import FormatError
from layouts.model import ElementType, VlenKind

#: Deepest type nesting accepted (guards recursion on hostile JSON).
MAX_TYPE_DEPTH = 32
#: Distinct type JSONs whose parse ``parsed_type`` keeps (a domain has few).
TYPE_CACHE = 1024

_INT_BASE = re.compile(r"^H5T_STD_([IU])(8|16|32|64)(LE|BE)?$")
_FLOAT_BASE = re.compile(r"^H5T_IEEE_F(16|32|64)(LE|BE)?$")


@dataclass(frozen=True, slots=True)
class HType:
    """A parsed HDF5 type.

    ``cls`` is one of ``int float enum string opaque ref`` (fixed-size leaves),
    ``vstr`` (variable-length string), ``regionref`` (variable-length blob),
    ``vlen`` (variable-length sequence of ``base``), ``compound`` and ``array``
    (``dims`` of ``base``). ``dtype`` is the storage dtype when the whole type is
    fixed-size, else None.
    """

    cls: str
    dtype: np.dtype[Any] | None
    base: HType | None = None
    dims: tuple[int, ...] = ()
    fields: tuple[tuple[str, HType], ...] = ()
    utf8: bool = False
    is_bool: bool = False
    members: Mapping[str, int] = field(default_factory=dict)

    @property
    def fixed(self) -> bool:
        return self.dtype is not None


# --------------------------------------------------------------------------- parsing


def _base_dtype(name: Any, cls: str) -> np.dtype[Any]:
    if not isinstance(name, str):
        raise FormatError(f"{cls} base must be a string, got {name!r}")
    m = _INT_BASE.match(name) if cls == "H5T_INTEGER" else _FLOAT_BASE.match(name)
    if not m:
        raise FormatError(f"unknown {cls} base {name!r}")
    order = ">" if m.group(m.lastindex or 0) == "BE" else "<"
    if cls == "H5T_INTEGER":
        kind = "i" if m.group(1) == "I" else "u"
        return np.dtype(f"{order}{kind}{int(m.group(2)) // 8}")
    return np.dtype(f"{order}f{int(m.group(1)) // 8}")


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FormatError(f"{what} must be a positive integer, got {value!r}")
    return value


def _item_size(value: Any, what: str) -> int:
    size = _positive_int(value, what)
    if size > MAX_ITEM_BYTES:
        raise FormatError(f"{what} {size} is more than {MAX_ITEM_BYTES} bytes")
    return size


def parse_type(tj: Any, _depth: int = 0) -> HType:
    """Parse HDF5 type JSON (a dict, or a predefined name such as ``H5T_STD_I32LE``)."""
    if _depth > MAX_TYPE_DEPTH:
        raise FormatError("type nesting is too deep")
    if isinstance(tj, str):
        cls = "H5T_FLOAT" if tj.startswith("H5T_IEEE_") else "H5T_INTEGER"
        return HType("float" if cls == "H5T_FLOAT" else "int", _base_dtype(tj, cls))
    if not isinstance(tj, Mapping):
        raise FormatError(f"type must be an object, got {type(tj).__name__}")
    cls = tj.get("class")
    try:
        parser = _PARSERS[cls]
    except (KeyError, TypeError):
        raise FormatError(f"unsupported type class {cls!r}") from None
    t = parser(tj, _depth + 1)
    if t.dtype is not None and t.dtype.itemsize > MAX_ITEM_BYTES:
        raise FormatError(f"type of {t.dtype.itemsize} bytes, more than {MAX_ITEM_BYTES}")
    return t


def _parse_number(tj: Mapping[str, Any], depth: int) -> HType:
    cls = tj["class"]
    dt = _base_dtype(tj.get("base"), cls)
    return HType("int" if cls == "H5T_INTEGER" else "float", dt)


def _parse_string(tj: Mapping[str, Any], depth: int) -> HType:
    length = tj.get("length")
    charset = tj.get("charSet", "H5T_CSET_ASCII")
    if charset not in ("H5T_CSET_ASCII", "H5T_CSET_UTF8"):
        raise FormatError(f"unknown string charSet {charset!r}")
    utf8 = charset == "H5T_CSET_UTF8"
    if length == "H5T_VARIABLE":
        return HType("vstr", None, utf8=utf8)
    n = _item_size(length, "string length")
    return HType("string", np.dtype(f"S{n}"), utf8=utf8)


def _parse_opaque(tj: Mapping[str, Any], depth: int) -> HType:
    return HType("opaque", np.dtype(f"V{_item_size(tj.get('size'), 'opaque size')}"))


def _parse_reference(tj: Mapping[str, Any], depth: int) -> HType:
    base = tj.get("base")
    if base == "H5T_STD_REF_OBJ":
        length = tj.get("length", 48)
        return HType("ref", np.dtype(f"S{_item_size(length, 'reference length')}"))
    if base == "H5T_STD_REF_DSETREG":
        return HType("regionref", None)
    raise FormatError(f"unknown reference base {base!r}")


def _parse_enum(tj: Mapping[str, Any], depth: int) -> HType:
    base = parse_type(tj.get("base"), depth)
    if base.cls != "int" or base.dtype is None:
        raise FormatError("enum base must be an integer type")
    raw = tj.get("mapping", tj.get("members"))
    members: dict[str, int] = {}
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, list):
        try:
            items = [(m["name"], m["value"]) for m in raw]
        except (KeyError, TypeError):
            raise FormatError("enum members need name and value") from None
    else:
        raise FormatError("enum type has no members")
    for name, value in items:
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int):
            raise FormatError(f"bad enum member {name!r}: {value!r}")
        members[name] = value
    is_bool = base.dtype.itemsize == 1 and base.dtype.kind == "i" and members == {
        "FALSE": 0, "TRUE": 1}
    # h5py's boolean convention; numpy's bool has the same one-byte 0/1 storage.
    dtype = np.dtype("?") if is_bool else base.dtype
    return HType("enum", dtype, is_bool=is_bool, members=members)


def _parse_vlen(tj: Mapping[str, Any], depth: int) -> HType:
    return HType("vlen", None, base=parse_type(tj.get("base"), depth))


def _parse_array(tj: Mapping[str, Any], depth: int) -> HType:
    raw = tj.get("dims")
    dims_list = [raw] if isinstance(raw, int) else raw
    if not isinstance(dims_list, list) or not dims_list or len(dims_list) > MAX_RANK:
        raise FormatError(f"array type needs 1 to {MAX_RANK} dims")
    dims = tuple(_positive_int(d, "array dim") for d in dims_list)
    if math.prod(dims) > MAX_ITEM_BYTES:
        raise FormatError(f"array type of {list(dims)} has more than {MAX_ITEM_BYTES} items")
    base = parse_type(tj.get("base"), depth)
    dt = None if base.dtype is None else _make_dtype((base.dtype, dims))
    return HType("array", dt, base=base, dims=dims)


def _parse_compound(tj: Mapping[str, Any], depth: int) -> HType:
    raw = tj.get("fields")
    if not isinstance(raw, list) or not raw:
        raise FormatError("compound type needs fields")
    fields: list[tuple[str, HType]] = []
    for item in raw:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise FormatError("compound field needs a name")
        fields.append((item["name"], parse_type(item.get("type"), depth)))
    names = [n for n, _ in fields]
    if len(set(names)) != len(names) or "" in names:
        raise FormatError("compound field names must be unique and non-empty")
    dt = None
    if all(t.dtype is not None for _, t in fields):
        dt = _make_dtype([(n, t.dtype) for n, t in fields])
    return HType("compound", dt, fields=tuple(fields))


def _make_dtype(spec: Any) -> np.dtype[Any]:
    try:
        return np.dtype(spec)
    except (TypeError, ValueError) as exc:
        raise FormatError(f"cannot build numpy dtype: {exc}") from exc


_PARSERS = {
    "H5T_INTEGER": _parse_number,
    "H5T_FLOAT": _parse_number,
    "H5T_STRING": _parse_string,
    "H5T_OPAQUE": _parse_opaque,
    "H5T_REFERENCE": _parse_reference,
    "H5T_ENUM": _parse_enum,
    "H5T_VLEN": _parse_vlen,
    "H5T_ARRAY": _parse_array,
    "H5T_COMPOUND": _parse_compound,
}


# --------------------------------------------------------------------------- ElementType


def sidecar_dtype(t: HType) -> Any:
    """The sidecar ``dtype`` value (docs/CONTRACT.md, "Sidecars") for a type.

    Fixed leaves give ``dtype.str``; compounds a ``descr``-like list of
    ``[name, type]`` / ``[name, base, dims]``; a top-level array ``[base, dims]``;
    variable-length types ``"vlen-utf8"``, ``"vlen-bytes"`` or ``{"vlen": BASE}``.
    """
    if t.cls == "compound":
        out: list[Any] = []
        for name, ft in t.fields:
            if ft.cls == "array" and ft.base is not None:
                out.append([name, sidecar_dtype(ft.base), list(ft.dims)])
            else:
                out.append([name, sidecar_dtype(ft)])
        return out
    if t.cls == "array" and t.base is not None:
        return [sidecar_dtype(t.base), list(t.dims)]
    if t.cls == "vstr":
        return VlenKind.UTF8.value
    if t.cls == "regionref":
        return VlenKind.BYTES.value
    if t.cls == "vlen" and t.base is not None:
        return {"vlen": sidecar_dtype(t.base)}
    assert t.dtype is not None
    return t.dtype.str


def _simple_fixed(t: HType) -> bool:
    """A fixed type numcodecs ``VLenArray`` can carry: no fields, no sub-array."""
    return t.dtype is not None and t.dtype.names is None and t.dtype.subdtype is None


def element_type(tj: Any, t: HType) -> ElementType:
    """The model's ``ElementType`` for parsed type ``t`` whose raw JSON is ``tj``."""
    if isinstance(tj, Mapping):
        hdf5 = dict(tj)
    else:  # a predefined name such as H5T_STD_I32LE, spelled out as HSDS does
        hdf5 = {"class": "H5T_FLOAT" if t.cls == "float" else "H5T_INTEGER", "base": tj}
    side = sidecar_dtype(t)
    if t.dtype is not None:
        return ElementType(dtype=t.dtype, sidecar=side, hdf5=hdf5)
    obj = np.dtype(object)
    if t.cls == "vstr":
        return ElementType(dtype=obj, sidecar=side, hdf5=hdf5, vlen=VlenKind.UTF8)
    if t.cls == "regionref":
        return ElementType(dtype=obj, sidecar=side, hdf5=hdf5, vlen=VlenKind.BYTES)
    if t.cls == "vlen" and t.base is not None and _simple_fixed(t.base):
        return ElementType(dtype=obj, sidecar=side, hdf5=hdf5, vlen=VlenKind.ARRAY,
                           vlen_base=t.base.dtype)
    return ElementType(dtype=obj, sidecar=side, hdf5=hdf5, vlen=VlenKind.JSON)


def parsed_type(tj: Any) -> tuple[HType, ElementType]:
    """``parse_type(tj)`` and its ``element_type``, shared by every dataset and
    attribute with the same type JSON: a 10,000-object domain has a handful of
    distinct types, and parsing one costs more than spelling it as a key.
    Errors are not kept; the results are immutable and shared."""
    try:
        key = orjson.dumps(tj)
    except (orjson.JSONEncodeError, TypeError):
        key = None  # not plain JSON (past 64-bit integers): parsed, not kept
    if key is None:
        t = parse_type(tj)
        return t, element_type(tj, t)
    return _parsed_type(key)


@functools.lru_cache(maxsize=TYPE_CACHE)
def _parsed_type(key: bytes) -> tuple[HType, ElementType]:
    tj = orjson.loads(key)
    t = parse_type(tj)
    return t, element_type(tj, t)

