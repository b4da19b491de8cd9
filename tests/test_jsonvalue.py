"""Storage JSON parsing (layouts.formats.hsds._json) and indented JSON writing
(mountd.tree.jsonvalue)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from layouts.formats.hsds import _json as storedjson
from layouts.hdf5._types import parsed_type
from layouts.model import ObjectRef
from mountd.tree import jsonvalue


def test_loads_takes_what_python_json_takes() -> None:
    """HSDS writes fill values with Python's json, which spells NaN and
    Infinity bare and keeps integers past 64 bits; orjson refuses both."""
    doc = storedjson.loads(b'{"fill": NaN, "big": 18446744073709551616, "inf": -Infinity}')
    assert math.isnan(doc["fill"])
    assert doc["big"] == 2 ** 64
    assert doc["inf"] == -math.inf
    assert storedjson.loads('{"name": "caf\u00e9"}'.encode()) == {"name": "caf\u00e9"}


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b'{"a": 1,}'])
def test_loads_refuses_what_is_not_json(raw: bytes) -> None:
    with pytest.raises(ValueError):
        storedjson.loads(raw)


def test_encode_indented_matches_python_json() -> None:
    plain = {"a": [1, 2.5, None, True], "b": {}, "c": [], "d": "\u00e9", "e": 2 ** 70}
    expected = json.dumps(plain, indent=2, ensure_ascii=False).encode()
    assert jsonvalue.encode_indented(plain) == expected


def test_parsed_type_is_shared_between_equal_type_json() -> None:
    first = parsed_type({"class": "H5T_INTEGER", "base": "H5T_STD_I32BE"})
    again = parsed_type({"class": "H5T_INTEGER", "base": "H5T_STD_I32BE"})
    assert again is first
    assert first[1].dtype.str == ">i4"
    assert parsed_type({"class": "H5T_INTEGER", "base": "H5T_STD_U8LE"})[1].dtype.str == "|u1"


def test_find_refs_finds_references_at_any_depth() -> None:
    a, b, c, d = (ObjectRef(obj_id=f"g-{n}") for n in "abcd")
    objects = np.empty(2, dtype=object)
    objects[:] = [c, "text"]
    value = {"x": [1, "s", {"y": (a, 2.5)}], "z": b, "arr": objects, "deep": [[[d]]]}
    assert sorted(r.obj_id or "" for r in jsonvalue.find_refs(value)) == \
        ["g-a", "g-b", "g-c", "g-d"]
    assert jsonvalue.find_refs({"a": [1, 2.0, None, True, b"x", np.float64(1.5)]}) == []
    refs = {a: "/target"}
    assert jsonvalue.jsonable({"k": [a, 1, np.int64(3), float("nan")]}, refs) == \
        {"k": [{"$ref": "/target"}, 1, 3, "NaN"]}
