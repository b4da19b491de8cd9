"""Writes LEGEND LH5 files with legend-pydataobj and reads them back, for the tests.

A standalone script: stdlib, numpy, h5py, awkward, ``lgdo`` and ``lh5``
(legend-lh5io) only, no h5mount import, run with the interpreter of
``.venv-conv`` (lgdo's dependencies clash with the main ``.venv``'s pandas)::

    python tests/legend_tool.py write OUT.lh5 [--rows N] [--chunk N]
    python tests/legend_tool.py read LH5 NAME...

``write`` makes, with ``lgdo`` objects and ``lh5.write``:

* ``/events``: a ``Table`` of ``--rows`` rows, each column chunked by
  ``--chunk`` rows: ``energy`` (float64, ``keV``, one NaN), ``channel``
  (uint32), ``flag`` (bool, which lgdo stores as uint8), ``label`` (fixed
  bytes with commas, quotes and a newline), ``hits`` (a vector of vectors of
  float32, ``ns``, empty rows included), ``ids`` (a vector of vectors of
  int32), the vectors' datasets chunked like the rest, ``wf`` (an
  ``ArrayOfEqualSizedArrays`` of 3 float32, ``ADC``),
  ``kind`` (int8 codes) and ``trig`` (a vector of vectors of uint8 codes),
  both enum-like, and ``sub`` (a nested table: ``x`` in ``mm``, ``y``);
* ``/runtime``: a ``Scalar`` (``s``); ``/meta``: a ``Struct`` of a scalar,
  an array and a string scalar; ``/matrix``: a 2-D
  ``ArrayOfEqualSizedArrays``; ``/tracks``: a ``VectorOfVectors`` alone.

lgdo has no enum type, so the enum-like columns get their ``datatype``
(``array<1>{enum{...}}``, ``array<1>{array<1>{enum{...}}}``) written over
with h5py afterwards, as a LEGEND writer of enums would; lgdo still reads
them only with ``enum{...}`` made ``real`` again: ``read`` does that on a
copy, so it returns their integer codes.

``read`` prints, as JSON, ``{"objects": {NAME: ...}, "enums": {PATH:
DATATYPE}}``: what ``lh5.read`` returns for each NAME, a table as
``{"columns": {NAME: {"values": [...], "attrs": {...}}}}`` with nested
tables flattened as ``outer.inner``, vectors of vectors and equal-sized
arrays as nested lists, strings decoded, any other object as
``{"values": ...}`` or ``{"fields": [...]}`` for a struct; and the enum
datatypes it had to make ``real``. NaN is written as Python's ``json``
writes it (``NaN``).

Concurrency: none; one process writes or reads one file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from typing import Any

import awkward as ak
import h5py
import lh5
import numpy as np
from lgdo import (
    Array,
    ArrayOfEqualSizedArrays,
    Scalar,
    Struct,
    Table,
    VectorOfVectors,
)

KIND_ENUM = "enum{ALPHA=0,BETA=1,GAMMA=2}"
TRIG_ENUM = "enum{none=0,low=1,high=2,both=3}"
LABELS = ["plain", "with,comma", 'with "quotes"', "", "two\nlines", "naïve"]


def _chunked(obj: Any, chunk: int, dims: int = 1) -> Any:
    obj.attrs["hdf5_settings"] = {"chunks": (chunk,) + (3,) * (dims - 1)}
    return obj


def _ragged(rng: np.random.Generator, rows: int, dtype: str, top: int,
            chunk: int) -> VectorOfVectors:
    """A vector of vectors of ``rows`` rows of 0-4 values of ``dtype``."""
    lengths = rng.integers(0, 5, rows)
    lengths[:3] = [0, 1, 4]
    ends = np.cumsum(lengths)
    data = np.asarray(rng.integers(0, top, int(ends[-1])), dtype=dtype)
    return VectorOfVectors(flattened_data=_chunked(Array(data), chunk),
                           cumulative_length=_chunked(Array(ends), chunk))


def events(rows: int, chunk: int) -> Table:
    rng = np.random.default_rng(12)
    energy = rng.random(rows) * 100
    energy[1] = np.nan
    hits = _ragged(rng, rows, "f4", 100, chunk)
    hits = VectorOfVectors(flattened_data=_chunked(Array(hits.flattened_data.nda / 8), chunk),
                           cumulative_length=hits.cumulative_length, attrs={"units": "ns"})
    ids = _ragged(rng, rows, "i4", 10**6, chunk)
    trig = _ragged(rng, rows, "u1", 4, chunk)
    sub = Table(size=rows, col_dict={
        "x": _chunked(Array(np.arange(rows) * 0.25, attrs={"units": "mm"}), chunk),
        "y": _chunked(Array(np.arange(rows, dtype="i8") - 7), chunk),
    })
    labels = np.array([LABELS[i % len(LABELS)].encode() for i in range(rows)])
    columns = {
        "energy": _chunked(Array(energy, attrs={"units": "keV"}), chunk),
        "channel": _chunked(Array(np.arange(rows, dtype="u4") * 3), chunk),
        "flag": _chunked(Array(np.arange(rows) % 3 == 0), chunk),
        "label": _chunked(Array(labels), chunk),
        "hits": hits,
        "ids": ids,
        "wf": _chunked(ArrayOfEqualSizedArrays(
            nda=rng.random((rows, 3)).astype("f4"), attrs={"units": "ADC"}), chunk, 2),
        "kind": _chunked(Array(np.asarray(rng.integers(0, 3, rows), "i1")), chunk),
        "trig": trig,
        "sub": sub,
    }
    return Table(size=rows, col_dict=columns)


def write(out: str, rows: int, chunk: int) -> None:
    lh5.write(events(rows, chunk), "events", out, wo_mode="of")
    lh5.write(Scalar(2.5, attrs={"units": "s"}), "runtime", out)
    lh5.write(Struct({"count": Scalar(7), "edges": Array(np.arange(4.0)),
                      "note": Scalar("hello")}), "meta", out)
    lh5.write(ArrayOfEqualSizedArrays(nda=np.arange(12, dtype="i2").reshape(4, 3) - 5,
                                      attrs={"units": "mV"}), "matrix", out)
    lh5.write(VectorOfVectors([[1.5], [], [2.0, -3.25, 4.0]], attrs={"units": "m"}),
              "tracks", out)
    with h5py.File(out, "r+") as f:
        f["events/kind"].attrs["datatype"] = f"array<1>{{{KIND_ENUM}}}"
        f["events/trig"].attrs["datatype"] = f"array<1>{{array<1>{{{TRIG_ENUM}}}}}"
        f["events/trig/flattened_data"].attrs["datatype"] = f"array<1>{{{TRIG_ENUM}}}"


def _values(obj: Any) -> Any:
    if isinstance(obj, VectorOfVectors):
        return ak.to_list(obj.view_as("ak"))
    if isinstance(obj, Scalar):
        value = obj.value
        return value.decode() if isinstance(value, bytes) else value
    nda = obj.nda
    if nda.dtype.kind == "S":
        return [v.decode() for v in nda.tolist()]
    return nda.tolist()


def _columns(table: Table, prefix: str, out: dict[str, Any]) -> None:
    for name, column in table.items():
        if isinstance(column, Table):
            _columns(column, f"{prefix}{name}.", out)
            continue
        attrs = {k: v for k, v in column.attrs.items() if isinstance(v, str)}
        out[prefix + name] = {"values": _values(column), "attrs": attrs}


def without_enums(path: str, copy: str) -> dict[str, str]:
    """Copy the LH5 file with every ``enum{...}`` in a ``datatype`` made
    ``real``, which lgdo reads (as the integer codes); the datatypes changed,
    by object path."""
    shutil.copyfile(path, copy)
    changed: dict[str, str] = {}

    def plain(name: str, obj: Any) -> None:
        text = obj.attrs.get("datatype")
        if isinstance(text, bytes):
            text = text.decode()
        if isinstance(text, str) and "enum{" in text:
            changed[name] = text
            obj.attrs["datatype"] = re.sub(r"enum\{[^{}]*\}", "real", text)

    with h5py.File(copy, "r+") as f:
        f.visititems(plain)
    return changed


def read(path: str, name: str) -> dict[str, Any]:
    obj = lh5.read(name, path)
    if isinstance(obj, Table):
        columns: dict[str, Any] = {}
        _columns(obj, "", columns)
        return {"columns": columns, "datatype": obj.attrs.get("datatype")}
    if isinstance(obj, Struct):
        return {"fields": list(obj.keys()), "datatype": obj.attrs.get("datatype")}
    return {"values": _values(obj), "attrs": dict(obj.attrs)}


def main(argv: list[str]) -> int:
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("write")
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--chunk", type=int, default=128)
    p = sub.add_parser("read")
    p.add_argument("path")
    p.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "write":
        write(args.out, args.rows, args.chunk)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "plain.lh5")
        enums = without_enums(args.path, copy)
        json.dump({"objects": {name: read(copy, name) for name in args.names},
                   "enums": enums}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
