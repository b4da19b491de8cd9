"""Turning model values into strict JSON (docs/CONTRACT.md, "Sidecars").

Owns one conversion, used by sidecars, ``.zattrs`` and xattrs alike:
NumPy scalars and arrays become numbers and nested lists, NaN and infinities
become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, ``bytes``
(opaque data) become ``{"base64": ...}``, fixed-length byte strings become
text, and ``ObjectRef`` becomes ``{"$ref": path}`` through a lookup table the
caller fills in beforehand (resolving a reference may need I/O; this module
does none). A ``Plain`` mapping is a converted value a caller keeps and
shares. Pure functions; safe anywhere.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from layouts.model import ObjectRef


def _float(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _bytes_text(value: bytes) -> str | dict[str, str]:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode("ascii")}


def _numpy(value: np.ndarray | np.generic, refs: Mapping[ObjectRef, str | None]) -> Any:
    dtype = value.dtype
    if dtype.names is not None:
        if isinstance(value, np.ndarray) and value.ndim > 0:
            return [_numpy(v, refs) for v in value]
        return [jsonable(value[name], refs) for name in dtype.names]
    if dtype.kind == "S":
        if isinstance(value, np.ndarray) and value.ndim > 0:
            return [_numpy(v, refs) for v in value]
        return _bytes_text(bytes(value.item() if isinstance(value, np.ndarray) else value))
    if dtype.kind == "V":
        if isinstance(value, np.ndarray) and value.ndim > 0:
            return [_numpy(v, refs) for v in value]
        return {"base64": base64.b64encode(value.tobytes()).decode("ascii")}
    return jsonable(value.tolist(), refs)


class Plain(dict[str, Any]):
    """A mapping already converted (``jsonable``) and never changed after: kept
    as it is, not walked again, when it is part of a larger value. orjson
    writes it as the dict it is."""


#: Types whose values are already JSON-safe as they are (``bool`` is an ``int``).
_PLAIN = frozenset({str, int, bool, type(None), Plain})
_NO_REFS: Mapping[ObjectRef, str | None] = {}


def jsonable(value: Any, refs: Mapping[ObjectRef, str | None] | None = None) -> Any:
    """``value`` as plain JSON-safe Python (see module docstring)."""
    if refs is None:
        refs = _NO_REFS
    kind = type(value)
    if kind in _PLAIN:
        return value
    # Containers first, without a call per plain member: a walk renders the
    # sidecar and .zattrs of every dataset it lists.
    if kind is dict:
        return {k if type(k) is str else str(k): v if type(v) in _PLAIN else jsonable(v, refs)
                for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _PLAIN else jsonable(v, refs) for v in value]
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, np.ndarray | np.generic):
        return _numpy(value, refs)
    if isinstance(value, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, ObjectRef):
        path = refs.get(value, value.path)
        return {"$ref": path}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, refs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, refs) for v in value]
    if isinstance(value, complex):
        return [_float(value.real), _float(value.imag)]
    raise TypeError(f"cannot represent {type(value).__name__} as JSON")


def dumps(value: Any, refs: Mapping[ObjectRef, str | None] | None = None,
          indent: int | None = 2) -> str:
    """Strict JSON text for ``value``."""
    return json.dumps(jsonable(value, refs), indent=indent, allow_nan=False, ensure_ascii=False)


def encode_indented(plain: Any) -> bytes:
    """A value that is already plain JSON-safe Python (``jsonable``'s output)
    as JSON indented by 2, in UTF-8.

    orjson writes it: the standard library's indenting encoder is pure Python
    and about 10x slower, and the sidecars of a 100,000-link group are all
    rendered when it is listed. Values orjson refuses, integers past 64 bits
    and the lone surrogates of undecodable names, go through ``json``.
    """
    try:
        return orjson.dumps(plain, option=orjson.OPT_INDENT_2)
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(plain, indent=2, allow_nan=False, ensure_ascii=False)
        return text.encode("utf-8", "surrogateescape")


def find_refs(value: Any) -> list[ObjectRef]:
    """Every ``ObjectRef`` inside a model value, so a caller can resolve them
    first (a list, not a generator: most values hold none, and this runs for
    the attributes of every object a walk lists)."""
    found: list[ObjectRef] = []
    _add_refs(value, found)
    return found


def _add_refs(value: Any, found: list[ObjectRef]) -> None:
    kind = type(value)
    if kind in _PLAIN or kind is float or kind is bytes:
        return
    if kind is dict or kind is list or kind is tuple:
        for v in value.values() if kind is dict else value:
            if type(v) not in _PLAIN:
                _add_refs(v, found)
    elif isinstance(value, ObjectRef):
        found.append(value)
    elif isinstance(value, Mapping):
        for v in value.values():
            _add_refs(v, found)
    elif isinstance(value, list | tuple):
        for v in value:
            _add_refs(v, found)
    elif isinstance(value, np.ndarray) and value.dtype == object:
        for v in value.flat:
            _add_refs(v, found)
