"""HSDS type JSON -> ``ElementType``, and HSDS values -> model values.

Owns three things, all pure synchronous code with no shared state (safe from
any task or worker thread):

* ``parse_type``: the type JSON HSDS stores (``h5json/hdf5dtype.py`` is the
  reference) to an ``HType`` tree, and ``element_type`` from that to the model's
  ``ElementType``. Storage dtypes follow HSDS: packed numpy structs for
  compounds, ``S<n>`` for fixed strings (UTF-8 too), ``V<n>`` for opaque,
  ``S48`` for object references, the base integer for enums, and numpy
  ``bool`` for h5py's boolean enum (``FALSE=0, TRUE=1`` over ``int8``), which
  is stored as the same single byte.
* ``read_elements``: HSDS's variable-length byte layout (``h5json/array_util.py``
  ``copyElement``/``readElement``): elements in C order; a fixed part is its raw
  bytes; a variable-length string, sequence or region reference is an int32 LE
  *byte* count followed by the bytes; compound fields follow each other.
* Value conversion to the model's JSON-like convention: ``attribute_value``
  (stored JSON or base64 attribute values), ``fill_value`` and ``to_plain``.
* The bounds hostile metadata is held to, shared with the LINDI reader:
  ``MAX_RANK`` dimensions, ``MAX_ITEM_BYTES`` per element, JSON nested at most
  ``MAX_JSON_DEPTH`` deep and text that is valid Unicode (``check_json``,
  ``valid_text``), so nothing built from metadata can exhaust memory or the
  stack, or fail to encode, later.

Errors in stored data raise ``FormatError``; callers turn it into ``Corrupt``
with the storage key.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from layouts.hsds_ids import BadId, normalize_id
from layouts.model import ElementType, ObjectRef, VlenKind

#: HSDS limits one variable-length element to this many bytes (array_util.MAX_VLEN_ELEMENT);
#: we accept more but not absurd counts.
MAX_VLEN_BYTES = 1 << 30
#: Deepest type nesting accepted (guards recursion on hostile JSON).
MAX_TYPE_DEPTH = 32
#: Most dimensions of a dataspace or array type (HDF5's H5S_MAX_RANK).
MAX_RANK = 32
#: Largest element of a fixed-size type, in bytes (a fill value is one element).
MAX_ITEM_BYTES = 1 << 24
#: Deepest nesting of metadata JSON that is kept and shown as it is stored
#: (sidecars walk it recursively): room for ``MAX_TYPE_DEPTH`` levels of types,
#: three JSON levels each.
MAX_JSON_DEPTH = 128
#: Distinct type JSONs whose parse ``parsed_type`` keeps (a domain has few).
TYPE_CACHE = 1024

_INT_BASE = re.compile(r"^H5T_STD_([IU])(8|16|32|64)(LE|BE)?$")
_FLOAT_BASE = re.compile(r"^H5T_IEEE_F(16|32|64)(LE|BE)?$")
_FLOAT_WORDS = {"nan": math.nan, "inf": math.inf, "infinity": math.inf,
                "-inf": -math.inf, "-infinity": -math.inf}
_COUNT = struct.Struct("<i")


class FormatError(ValueError):
    """Stored HSDS metadata or data does not follow the format."""


@dataclass(frozen=True, slots=True)
class HType:
    """A parsed HSDS type.

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


def valid_text(text: str) -> bool:
    """True if ``text`` is valid Unicode: JSON's ``\\ud800`` escapes give lone
    surrogates, which no file name, xattr or strict JSON output can hold."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json(value: Any, what: str) -> None:
    """Raise ``FormatError`` if parsed JSON ``value`` nests deeper than
    ``MAX_JSON_DEPTH`` or holds a key or string that is not ``valid_text``.

    Iterative, so a hostile depth cannot exhaust the stack here; callers run
    it on the JSON they keep as stored (sidecar ``hdf5`` and ``domain``
    values, a reference file's ``.zattrs``), which is later walked recursively.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        kind = type(item)
        if kind is str:
            if not valid_text(item):
                raise FormatError(f"{what}: text that is not valid Unicode: {item!r:.80}")
            continue
        if kind is dict:
            children: Any = item.values()
            for key in item:
                if not valid_text(key):
                    raise FormatError(f"{what}: a key that is not valid Unicode: {key!r:.80}")
        elif kind is list:
            children = item
        else:
            continue
        if level >= MAX_JSON_DEPTH:
            raise FormatError(f"{what}: JSON nested more than {MAX_JSON_DEPTH} deep")
        stack.extend((child, level + 1) for child in children
                     if type(child) in (dict, list, str))


def parse_type(tj: Any, _depth: int = 0) -> HType:
    """Parse HSDS type JSON (a dict, or a predefined name such as ``H5T_STD_I32LE``)."""
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
    """The sidecar ``dtype`` value (MOUNT-SPEC.md) for a type.

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


# --------------------------------------------------------------------------- variable-length bytes


def read_count(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The int32 LE byte count at ``pos`` and the position after its bytes."""
    if pos + 4 > len(buf):
        raise FormatError(f"variable-length data ends inside a count at byte {pos}")
    (count,) = _COUNT.unpack_from(buf, pos)
    end = pos + 4 + count
    if count < 0 or count > MAX_VLEN_BYTES or end > len(buf):
        raise FormatError(f"bad variable-length count {count} at byte {pos}")
    return count, end


def _read(t: HType, buf: bytes | memoryview, pos: int) -> tuple[Any, int]:
    """One element of ``t`` starting at ``pos``: (native value, next position)."""
    if t.dtype is not None:
        end = pos + t.dtype.itemsize
        if end > len(buf):
            raise FormatError(f"data ends inside a fixed-size element at byte {pos}")
        return np.frombuffer(buf, dtype=t.dtype, count=1, offset=pos)[0], end
    if t.cls in ("vstr", "regionref"):
        count, end = read_count(buf, pos)
        return bytes(buf[pos + 4:end]), end
    if t.cls == "vlen" and t.base is not None:
        count, end = read_count(buf, pos)
        base = t.base
        if base.dtype is not None:
            size = base.dtype.itemsize
            if count % size:
                raise FormatError(f"sequence of {count} bytes is not whole {base.dtype} items")
            return np.frombuffer(buf, dtype=base.dtype, count=count // size, offset=pos + 4), end
        items = []
        cur = pos + 4
        while cur < end:
            item, cur = _read(base, buf, cur)
            items.append(item)
        if cur != end:
            raise FormatError(f"sequence items overrun their byte count at byte {pos}")
        return items, end
    if t.cls == "compound":
        values = []
        for _, ft in t.fields:
            value, pos = _read(ft, buf, pos)
            values.append(value)
        return tuple(values), pos
    if t.cls == "array" and t.base is not None:
        values = []
        for _ in range(math.prod(t.dims)):
            value, pos = _read(t.base, buf, pos)
            values.append(value)
        return values, pos
    raise FormatError(f"cannot read type class {t.cls}")


def read_elements(t: HType, buf: bytes | memoryview, count: int) -> list[Any]:
    """``count`` elements of ``t`` from HSDS variable-length bytes (whole buffer used)."""
    out = []
    pos = 0
    for _ in range(count):
        value, pos = _read(t, buf, pos)
        out.append(value)
    if pos != len(buf):
        raise FormatError(f"{len(buf) - pos} unexpected bytes after {count} elements")
    return out


# --------------------------------------------------------------------------- values


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _ref(text: str, attr: bool) -> Any:
    if not text:
        return None
    try:
        obj_id = normalize_id(text)
    except BadId as exc:
        raise FormatError(str(exc)) from exc
    return ObjectRef(obj_id=obj_id) if attr else obj_id


def _nest(items: Sequence[Any], dims: Sequence[int]) -> Any:
    """Flat C-order items to nested lists of ``dims``."""
    if not dims:
        return items[0]
    if len(dims) == 1:
        return list(items)
    step = math.prod(dims[1:])
    return [_nest(items[i * step:(i + 1) * step], dims[1:]) for i in range(dims[0])]


def to_plain(t: HType, native: Any, attr: bool) -> Any:
    """A native element (numpy scalar, bytes, tuple, list) as a JSON-like value.

    Compounds become lists in field order. ``attr=True`` gives the attribute
    convention (``ObjectRef`` for references, ``bytes`` for opaque data and
    strings that are not UTF-8); ``attr=False`` gives strict JSON for ``json2``
    chunk files (reference ids as strings, opaque as ``{"base64": ...}``).
    """
    cls = t.cls
    if cls in ("int", "float"):
        return native.item() if isinstance(native, np.generic) else native
    if cls == "enum":
        value = int(native)
        return bool(value) if t.is_bool else value
    if cls == "string":
        raw = bytes(native)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw if attr else _decode_text(raw)
    if cls == "vstr":
        return _decode_text(bytes(native))
    if cls in ("opaque", "regionref"):
        raw = bytes(native)
        return raw if attr else {"base64": base64.b64encode(raw).decode("ascii")}
    if cls == "ref":
        return _ref(bytes(native).rstrip(b"\0").decode("ascii", "replace"), attr)
    if cls == "vlen" and t.base is not None:
        return [to_plain(t.base, item, attr) for item in native]
    if cls == "compound":
        values = [native[i] for i in range(len(t.fields))]
        return [to_plain(ft, v, attr) for (_, ft), v in zip(t.fields, values, strict=True)]
    if cls == "array" and t.base is not None:
        flat = np.asarray(native).reshape(-1) if t.base.fixed else native
        return _nest([to_plain(t.base, v, attr) for v in flat], t.dims)
    raise FormatError(f"cannot convert type class {cls}")


def _json_float(value: Any) -> float:
    if isinstance(value, str):
        word = _FLOAT_WORDS.get(value.strip().lower())
        if word is None:
            raise FormatError(f"not a number: {value!r}")
        return word
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FormatError(f"not a number: {value!r}")
    return float(value)


def _json_int(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise FormatError(f"not an integer: {value!r}")
    return value


def _json_opaque(t: HType, value: Any) -> bytes:
    if not isinstance(value, str):
        raise FormatError(f"opaque value must be a base64 string, got {value!r}")
    try:
        raw = base64.b64decode(value, validate=True) if value else b""
    except (binascii.Error, ValueError) as exc:
        raise FormatError(f"bad base64 opaque value: {exc}") from exc
    size = t.dtype.itemsize if t.dtype is not None else len(raw)
    if len(raw) > size:
        raise FormatError(f"opaque value of {len(raw)} bytes for a {size}-byte type")
    return raw.ljust(size, b"\0")


def _field_values(t: HType, value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        try:
            return [value[name] for name, _ in t.fields]
        except KeyError as exc:
            raise FormatError(f"compound value lacks field {exc}") from None
    if not isinstance(value, list) or len(value) != len(t.fields):
        raise FormatError(f"compound value needs {len(t.fields)} fields, got {value!r}")
    return value


def _region_ref(value: Any, attr: bool) -> Any:
    if value is None or value == "":
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("id"), str):
        raise FormatError(f"bad region reference {value!r}")
    target = value["id"] if value["id"][:2] == "d-" else f"d-{value['id']}"
    out = {k: v for k, v in value.items() if k != "id"}
    out["ref"] = ObjectRef(obj_id=target) if attr else target
    return out


def json_to_plain(t: HType, value: Any, attr: bool) -> Any:
    """One element stored as HSDS JSON, as a model value (see ``to_plain``)."""
    cls = t.cls
    if cls == "int":
        return _json_int(value)
    if cls == "float":
        return _json_float(value)
    if cls == "enum":
        return bool(value) if t.is_bool else _json_int(value)
    if cls in ("string", "vstr"):
        if value is None:
            return ""
        if isinstance(value, bytes):
            return _decode_text(value)
        if not isinstance(value, str):
            raise FormatError(f"string value expected, got {value!r}")
        if not valid_text(value):
            raise FormatError(f"string value that is not valid Unicode: {value!r:.80}")
        return value
    if cls == "opaque":
        raw = _json_opaque(t, value)
        return raw if attr else {"base64": base64.b64encode(raw).decode("ascii")}
    if cls == "ref":
        if value is None:
            return None
        if not isinstance(value, str):
            raise FormatError(f"reference must be an id string, got {value!r}")
        return _ref(value, attr)
    if cls == "regionref":
        return _region_ref(value, attr)
    if cls == "vlen" and t.base is not None:
        if value is None:
            return []
        if not isinstance(value, list):
            value = [value]
        return [json_to_plain(t.base, v, attr) for v in value]
    if cls == "compound":
        return [json_to_plain(ft, v, attr)
                for (_, ft), v in zip(t.fields, _field_values(t, value), strict=True)]
    if cls == "array" and t.base is not None:
        return _json_nested(t.base, value, t.dims, attr)
    raise FormatError(f"cannot convert type class {cls}")


def _json_nested(t: HType, value: Any, dims: Sequence[int], attr: bool) -> Any:
    if not dims:
        return json_to_plain(t, value, attr)
    if not isinstance(value, list) or len(value) != dims[0]:
        raise FormatError(f"expected a list of {dims[0]} items, got {str(value)[:80]}")
    return [_json_nested(t, v, dims[1:], attr) for v in value]


def _json_to_native(t: HType, value: Any) -> Any:
    """A JSON element as something numpy assigns into ``t.dtype`` (fixed types)."""
    cls = t.cls
    if cls == "int":
        return _json_int(value)
    if cls == "float":
        return _json_float(value)
    if cls == "enum":
        return _json_int(value)
    if cls in ("string", "ref"):
        if value is None:
            return b""
        if not isinstance(value, str):
            raise FormatError(f"string value expected, got {value!r}")
        return value.encode("utf-8", "surrogateescape")
    if cls == "opaque":
        return _json_opaque(t, value)
    if cls == "compound":
        return tuple(_json_to_native(ft, v)
                     for (_, ft), v in zip(t.fields, _field_values(t, value), strict=True))
    if cls == "array" and t.base is not None:
        flat: list[Any] = []
        _flatten(value, len(t.dims), flat)
        if len(flat) != math.prod(t.dims):
            raise FormatError(f"array value has {len(flat)} items, type needs {t.dims}")
        base = t.base
        items = [_json_to_native(base, v) for v in flat]
        return np.array(items, dtype=base.dtype).reshape(t.dims)
    raise FormatError(f"type class {cls} is not fixed-size")


def _flatten(value: Any, depth: int, out: list[Any]) -> None:
    if depth == 0:
        out.append(value)
        return
    if not isinstance(value, list):
        raise FormatError(f"expected a nested list, got {value!r}")
    for v in value:
        _flatten(v, depth - 1, out)


def decode_base64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise FormatError("base64 value must be a string")
    try:
        return base64.b64decode(text, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise FormatError(f"bad base64 value: {exc}") from exc


def attribute_value(t: HType, shape: tuple[int, ...] | None, value: Any,
                    encoding: str | None) -> Any:
    """An attribute's stored ``value`` as a model value.

    ``shape`` is None for ``H5S_NULL`` (the value is None), ``()`` for a scalar
    (a plain value), else dims (nested lists). With ``encoding="base64"`` the
    value is the HSDS byte layout of all elements.
    """
    if shape is None or value is None:
        return None  # H5S_NULL, or HSDS dropped the value (it does for some base64 ones)
    count = math.prod(shape)
    if encoding is not None:
        if encoding != "base64":
            raise FormatError(f"unknown attribute encoding {encoding!r}")
        raw = decode_base64(value)
        if t.dtype is not None:
            if len(raw) != count * t.dtype.itemsize:
                raise FormatError(f"{len(raw)} bytes for {count} elements of {t.dtype}")
            natives: list[Any] = list(np.frombuffer(raw, dtype=t.dtype, count=count))
        else:
            natives = read_elements(t, raw, count)
        return _nest([to_plain(t, v, attr=True) for v in natives], shape)
    return _json_nested(t, value, shape, attr=True)


def fill_value(t: HType, value: Any, encoding: str | None) -> Any:
    """A dataset's ``fillValue`` as the model wants it.

    A NumPy scalar of the storage dtype for fixed types (zeros, as in HDF5,
    when none is stored); a JSON-like value or None for variable-length ones.
    """
    if value is None:
        if t.dtype is None:
            return None
        return _subarray_fill(np.zeros(t.dims, t.dtype.base)) if t.cls == "array" else \
            np.zeros((), dtype=t.dtype)[()]
    if encoding not in (None, "None"):
        if encoding != "base64":
            raise FormatError(f"unknown fillValue_encoding {encoding!r}")
        raw = decode_base64(value)
        if t.dtype is not None:
            if len(raw) != t.dtype.itemsize:
                raise FormatError(f"fill value of {len(raw)} bytes for {t.dtype}")
            native = np.frombuffer(raw, dtype=t.dtype, count=1)[0]
            return _subarray_fill(native) if t.cls == "array" else native
        return to_plain(t, read_elements(t, raw, 1)[0], attr=False)
    if t.dtype is None:
        return json_to_plain(t, value, attr=False)
    if t.cls == "array":
        return _subarray_fill(np.asarray(_json_to_native(t, value)))
    arr = np.zeros((), dtype=t.dtype)
    try:
        arr[()] = _json_to_native(t, value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FormatError(f"fill value {value!r} does not fit {t.dtype}: {exc}") from exc
    return arr[()]


def _subarray_fill(items: np.ndarray[Any, Any]) -> Any:
    """The fill value of a sub-array type.

    NumPy has no scalar of a sub-array dtype. When every item is the same, the
    base scalar broadcasts to exactly one element; otherwise the array of items
    is returned, which ``Dataset.fill_bytes`` cannot encode as one element.
    """
    flat = np.ascontiguousarray(items.reshape(-1))
    rows = flat.view(np.uint8).reshape(flat.size, flat.dtype.itemsize)
    if bool((rows == rows[0]).all()):
        return flat[0]
    return items
