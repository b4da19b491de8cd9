"""Edge chunks of an HSDS service padded to whole chunk files (``layouts.formats.hsds._service``).

A service answers a chunk's selection cut at the dataspace's end; the chunk
file is the whole chunk shape (docs/CONTRACT.md, "Chunk files"). These check
the padding against NumPy: the selection's elements at the start of every
dimension, the fill value (fixed-size types) or empty elements
(variable-length ones, in each numcodecs encoding) elsewhere. The whole
service path runs against a real HSDS in ``tests/test_mount_service.py``.
"""

from __future__ import annotations

from typing import Any

import numcodecs
import numpy as np
import pytest

from layouts.errors import Corrupt
from layouts.formats.hsds._service import _pad_fixed, _pad_vlen
from layouts.hdf5 import parsed_type
from layouts.model import VlenKind

_UTF8 = {"class": "H5T_STRING", "length": "H5T_VARIABLE", "charSet": "H5T_CSET_UTF8",
         "strPad": "H5T_STR_NULLTERM"}
_ASCII = {**_UTF8, "charSet": "H5T_CSET_ASCII"}


def test_fixed_size_edges_take_the_fill_value() -> None:
    _, etype = parsed_type({"class": "H5T_COMPOUND", "fields": [
        {"name": "a", "type": "H5T_STD_I32LE"},
        {"name": "b", "type": {"class": "H5T_ARRAY", "dims": [2], "base": "H5T_IEEE_F64BE"}}]})
    part, full = (2, 3), (4, 5)
    values = np.zeros(part, dtype=etype.dtype)
    values["a"] = np.arange(6).reshape(part)
    values["b"] = np.arange(12, dtype=">f8").reshape((*part, 2))
    fill = np.zeros((), dtype=etype.dtype)
    fill["a"], fill["b"] = -1, (0.5, 1.5)
    got = np.frombuffer(_pad_fixed(values.tobytes(), part, full, etype, fill[()]),
                        dtype=etype.dtype).reshape(full)
    want = np.full(full, fill, dtype=etype.dtype)
    want[:2, :3] = values
    np.testing.assert_array_equal(got, want)


def test_fixed_size_edges_without_a_fill_are_zero() -> None:
    _, etype = parsed_type("H5T_STD_U16BE")
    got = np.frombuffer(_pad_fixed(np.arange(3, dtype=">u2").tobytes(), (3,), (5,), etype,
                                   None), dtype=">u2")
    np.testing.assert_array_equal(got, [0, 1, 2, 0, 0])


@pytest.mark.parametrize(("type_json", "values", "empty"), [
    (_UTF8, ["a", "éé", ""], ""),
    (_ASCII, ["x", "", "yz"], ""),  # HDF5's ASCII strings are text in chunk files too
    ({"class": "H5T_VLEN", "base": "H5T_STD_I16LE"},
     [np.arange(2, dtype="<i2"), np.zeros(0, "<i2"), np.arange(3, dtype="<i2")],
     np.zeros(0, "<i2")),
])
def test_variable_length_edges_hold_empty_elements(type_json: Any, values: list[Any],
                                                    empty: Any) -> None:
    _, etype = parsed_type(type_json)
    codec = numcodecs.VLenUTF8() if etype.vlen is VlenKind.UTF8 else \
        numcodecs.VLenArray(etype.vlen_base)
    part, full = (3, 1), (4, 2)
    arr = np.empty(3, dtype=object)
    arr[:] = values
    got = codec.decode(_pad_vlen(bytes(codec.encode(arr)), part, full, etype, "chunk"))
    assert len(got) == 8
    grid = got.reshape(full)
    for i in range(4):
        for j in range(2):
            want = values[i] if (i < 3 and j == 0) else empty
            np.testing.assert_array_equal(grid[i, j], want)


def test_compound_variable_length_edges_are_null() -> None:
    _, etype = parsed_type({"class": "H5T_COMPOUND", "fields": [
        {"name": "n", "type": "H5T_STD_I32LE"}, {"name": "s", "type": _UTF8}]})
    codec = numcodecs.JSON()
    part = np.empty((1, 2), dtype=object)
    part[0, 0], part[0, 1] = [1, "a"], [2, "b"]
    got = codec.decode(_pad_vlen(bytes(codec.encode(part)), (1, 2), (2, 3), etype, "chunk"))
    assert got.shape == (2, 3)
    assert [list(got[0, 0]), list(got[0, 1])] == [[1, "a"], [2, "b"]]
    assert got[1, 2] is None and got[0, 2] is None


def test_a_malformed_selection_is_corrupt() -> None:
    _, etype = parsed_type(_UTF8)
    with pytest.raises(Corrupt, match="chunk"):
        _pad_vlen(b"\x05\x00", (2,), (4,), etype, "chunk")
