"""HSDS values -> model values: stored JSON, base64 and variable-length bytes.

Owns two things, all pure synchronous code with no shared state (safe from
any task or worker thread), over types parsed by ``layouts.hdf5._types``:

* ``read_elements``: HSDS's variable-length byte layout (``h5json/array_util.py``
  ``copyElement``/``readElement``): elements in C order; a fixed part is its raw
  bytes; a variable-length string, sequence or region reference is an int32 LE
  *byte* count followed by the bytes; compound fields follow each other.
* Value conversion to the model's JSON-like convention: ``attribute_value``
  (stored JSON or base64 attribute values), ``fill_value`` and ``to_plain``;
  object references are HSDS ids (``layouts.formats.hsds._ids``).

Errors in stored data raise ``FormatError``; callers turn it into ``Corrupt``
with the storage key.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from layouts.bounds import valid_text
from layouts.errors import FormatError
from layouts.formats.hsds._ids import BadId, normalize_id
from layouts.hdf5 import HType
from layouts.model import ObjectRef

#: HSDS limits one variable-length element to this many bytes (array_util.MAX_VLEN_ELEMENT);
#: we accept more but not absurd counts.
MAX_VLEN_BYTES = 1 << 30

_FLOAT_WORDS = {"nan": math.nan, "inf": math.inf, "infinity": math.inf,
                "-inf": -math.inf, "-infinity": -math.inf}
_COUNT = struct.Struct("<i")


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
