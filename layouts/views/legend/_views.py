"""LEGEND HDF5 objects: the ``"legend"`` sidecar key, table CSV and vector-of-vectors JSON lines.

Three views on the view API (``layouts.views._api``), registered in
``layouts.views._registry``, for objects whose ``datatype`` attribute is in the
LEGEND grammar (``layouts.views.legend._types``):

* ``LegendView`` adds ``"legend"`` to the sidecar of every object whose
  ``datatype`` names a LEGEND type: the text, its parsed form (``type``),
  the object's ``units``, and what the views found: a table's CSV
  ``columns`` (and the fields ``left_out`` of it, with why), a struct's
  ``fields`` with their datatypes and units, a vector of vectors' ``layout``
  and ``rows``. A ``datatype`` that does not parse gives ``error`` instead.
* ``LegendCsvView``, ``P.csv``: a table (a group with ``table{...}``), one
  column per field in the order of ``table{...}``, nested tables flattened
  as ``outer.inner``, units in the header as ``name[unit]``, a vector of
  vectors or an array of equal-sized arrays as a JSON array in one field,
  enum values by name; or a 2-D array of equal-sized arrays, one column
  ``NAME.J[unit]`` per element of a row (its ``.npy`` is there already).
* ``LegendJsonlView``, ``P.jsonl``: a vector of vectors, in either layout,
  one JSON array per row.

What is read and how is in ``layouts.views.legend._columns``; the files are
``layouts.views._columns``' CSV and JSON-lines files, streamed by blocks of rows
and sized by streaming once (``BuiltFileView``). ``applies`` decides from
the object's attributes, except that ``P.jsonl`` also checks the vector of
vectors' parts are there (two children, or the referenced dataset).

Stateless views: safe from any number of tasks.
"""

from __future__ import annotations

import re
from typing import Any

from layouts.errors import LayoutError
from layouts.model import AnyObject, Dataset, Group
from layouts.views._api import View, ViewContext, ViewFile
from layouts.views._columns import BuiltFileView, csv_file, jsonl_file, number_rows_file
from layouts.views.legend._columns import (
    find_vectors,
    legend_attrs,
    matrix_columns,
    parsed,
    table_columns,
)
from layouts.views.legend._types import (
    ARRAY_KINDS,
    FIELD_KINDS,
    ArrayOf,
    DatatypeError,
    Fields,
    LegendType,
    is_vector_of_vectors,
    parse_datatype,
    type_json,
)

#: The first names of LEGEND datatypes: an object whose ``datatype`` starts
#: with one is LEGEND's, even when the rest does not parse.
LEGEND_NAMES = frozenset({"real", "string", "symbol", "bool", "complex", "enum",
                          *ARRAY_KINDS, *FIELD_KINDS})
_HEAD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)")


def claimed(obj: AnyObject) -> bool:
    """Whether the object's ``datatype`` names a LEGEND type."""
    text, _ = legend_attrs(obj)
    match = None if text is None else _HEAD.match(text)
    return match is not None and match.group(1) in LEGEND_NAMES


def claimed_type(obj: AnyObject) -> LegendType | None:
    """The parsed ``datatype`` of an object LEGEND claims; None otherwise, or if it
    does not parse."""
    return parsed(obj) if claimed(obj) else None


def is_table(obj: AnyObject, t: LegendType | None) -> bool:
    return isinstance(obj, Group) and isinstance(t, Fields) and t.kind == "table"


def is_matrix(obj: AnyObject, t: LegendType | None) -> bool:
    """A 2-D array of equal-sized arrays."""
    return (isinstance(obj, Dataset) and obj.shape is not None and len(obj.shape) == 2
            and isinstance(t, ArrayOf) and t.kind == "array_of_equalsized_arrays")


def _attrs_json(obj: AnyObject) -> dict[str, str]:
    """The object's ``datatype`` and ``units``, those it has."""
    datatype, units = legend_attrs(obj)
    return {k: v for k, v in (("datatype", datatype), ("units", units)) if v is not None}


async def _description(ctx: ViewContext, t: LegendType) -> dict[str, Any]:
    """What the views found in the context's object of type ``t``."""
    obj = ctx.obj
    if is_table(obj, t):
        assert isinstance(t, Fields)
        table = await table_columns(ctx, t)
        out: dict[str, Any] = {"columns": [column.header for column in table.columns]}
        if table.columns:
            out["rows"] = table.columns[0].rows
        if table.left_out:
            out["left_out"] = table.left_out
        return out
    if isinstance(t, Fields):
        fields: dict[str, Any] = {}
        for name in t.names:
            child = await ctx.child(name)
            fields[name] = None if child is None else _attrs_json(child)
        return {"fields": fields}
    if is_vector_of_vectors(t):
        vectors = await find_vectors(ctx, "", obj, t)
        if vectors is None:
            return {"error": "no cumulative lengths and values to go with them"}
        return {"layout": vectors.layout, "rows": vectors.rows}
    return {}


class LegendView(View):
    """The ``"legend"`` sidecar key of every LEGEND object."""

    sidecar_key = "legend"

    async def applies(self, ctx: ViewContext) -> bool:
        return claimed(ctx.obj)

    async def sidecar(self, ctx: ViewContext) -> Any:
        text, units = legend_attrs(ctx.obj)
        if text is None:
            return None
        out: dict[str, Any] = {"datatype": text}
        if units is not None:
            out["units"] = units
        try:
            t = parse_datatype(text)
        except DatatypeError as exc:
            out["error"] = str(exc)
            return out
        out["type"] = type_json(t)
        try:
            out.update(await _description(ctx, t))
        except LayoutError as exc:
            out["error"] = str(exc)
        return out


class LegendCsvView(BuiltFileView):
    """``P.csv`` of a LEGEND table or 2-D array of equal-sized arrays."""

    suffix = ".csv"

    async def applies(self, ctx: ViewContext) -> bool:
        obj = ctx.obj
        t = claimed_type(obj)
        return is_table(obj, t) or is_matrix(obj, t)

    async def build(self, ctx: ViewContext) -> ViewFile:
        obj = ctx.obj
        t = parsed(obj)
        if is_table(obj, t):
            assert isinstance(t, Fields)
            return csv_file((await table_columns(ctx, t)).columns)
        if is_matrix(obj, t):
            assert isinstance(obj, Dataset) and isinstance(t, ArrayOf)
            return csv_file(matrix_columns(ctx, obj, t, ctx.name, legend_attrs(obj)[1]))
        raise ctx.error("no longer a LEGEND table or 2-D array")


class LegendJsonlView(BuiltFileView):
    """``P.jsonl`` of a LEGEND vector of vectors: one JSON array per row."""

    suffix = ".jsonl"

    async def applies(self, ctx: ViewContext) -> bool:
        obj = ctx.obj
        t = claimed_type(obj)
        return (t is not None and is_vector_of_vectors(t)
                and await find_vectors(ctx, "", obj, t) is not None)

    async def build(self, ctx: ViewContext) -> ViewFile:
        t = parsed(ctx.obj)
        vectors = None if t is None else await find_vectors(ctx, "", ctx.obj, t)
        if vectors is None:
            raise ctx.error("no longer a LEGEND vector of vectors")
        if vectors.of_numbers:
            return number_rows_file(vectors.rows, vectors.numbers_between,
                                    block_rows=vectors.block_rows())
        return jsonl_file(vectors.rows, vectors.rows_between, block_rows=vectors.block_rows())
