"""anndata's on-disk format (``.h5ad``): what its elements are, shown as files.

Views on the view API (``layouts.views._api``), registered in ``layouts.views._registry``.
anndata (0.8 to 0.12) marks every element with the attributes
``encoding-type`` and ``encoding-version``; this module owns recognising
them and what the mount shows for each:

* every recognised object's sidecar gets ``"anndata"``: its encoding and
  what was found (``AnndataKeys``); the ``anndata`` root group's holds
  ``n_obs``, ``n_vars`` and the encoding of each element of ``X``,
  ``layers``, ``obsm``, ``varm``, ``obsp``, ``varp`` and ``uns`` (``raw``
  the same for its ``X``, ``var`` and ``varm``). ``numeric-scalar`` and
  ``string`` elements are scalar datasets, whose sidecar ``value`` already
  holds the value;
* a ``dataframe`` group: ``NAME.csv`` (``DataFrameCsv``), the index first
  (headed by its name, or empty for anndata's unnamed ``_index``) then the
  columns in ``column-order``: numbers, bools and strings (``array``,
  ``string-array``), ``categorical`` as its labels (code -1: empty),
  ``nullable-integer``, ``nullable-boolean`` and ``nullable-string-array``
  empty where masked. ``pandas.read_csv(path, index_col=0)`` reads it back;
* a ``csr_matrix`` / ``csc_matrix`` group: ``NAME.mtx``, Matrix Market
  coordinates (``SparseMtx``; content in ``layouts.views.anndata._files``);
* a ``categorical``, ``string-array`` or ``nullable-*`` element that is not
  part of a dataframe, categorical or nullable element: ``NAME.txt``, one
  value per line (``ElementTxt``);
* an ``awkward-array`` group: ``NAME.jsonl``, one JSON value per row
  (``AwkwardJsonl``).

The text of values is ``layouts.views._columns``'; this module adds the columns of
composite elements (``CategoricalColumn``, ``NullableColumn``). Files are
streamed in blocks of rows and sized by streaming them once.

Concurrency: the views and columns are stateless (a column is built for
one size or open, with the file); safe from any number of tasks.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from layouts.model import AnyObject, Dataset, Group
from layouts.views._api import FileView, View, ViewContext, ViewFile
from layouts.views._arrays import read_rows
from layouts.views._columns import (
    BuiltFileView,
    Column,
    DatasetColumn,
    csv_file,
    jsonl_file,
    lines_file,
)
from layouts.views._csvblock import BlockedFile, Cells
from layouts.views.anndata._files import (
    AwkwardRows,
    attrs_of,
    dataset_child,
    mtx_blocks,
    sparse_of,
)

#: Elements with parts of their own (a group of datasets) that make one column.
NULLABLE = frozenset({"nullable-integer", "nullable-boolean", "nullable-string-array"})
COMPOSITE = NULLABLE | {"categorical"}
#: Every encoding-type recognised.
ENCODINGS = COMPOSITE | {
    "anndata", "raw", "dataframe", "dict", "array", "string-array", "numeric-scalar",
    "string", "csr_matrix", "csc_matrix", "awkward-array", "rec-array",
}
#: The anndata object's mappings of elements, whose kinds its sidecar lists.
MAPPINGS = ("layers", "obsm", "varm", "obsp", "varp", "uns")
#: Categories between two used by a block of rows that are read rather than
#: start another read.
LABEL_GAP = 1024


def encoding(obj: AnyObject | None) -> str | None:
    """The object's ``encoding-type``, if it has one."""
    if obj is None:
        return None
    kind = attrs_of(obj).get("encoding-type")
    return kind if isinstance(kind, str) else None


def _rows(ds: Dataset) -> int:
    return (ds.shape or (0,))[0]


# --------------------------------------------------------------------------- columns


class CategoricalColumn(Column):
    """A ``categorical``: each code's label (``categories[code]``), code -1 empty.

    For a block of rows only the labels its codes use are read: the runs of
    categories they fall in (codes less than ``LABEL_GAP`` apart share one).
    """

    def __init__(self, codes: Dataset, categories: Dataset, header: str) -> None:
        self.codes = codes
        self.labels = DatasetColumn(categories, header)
        self.header = header
        self.rows = _rows(codes)

    def block_rows(self, ctx: ViewContext) -> int:
        return DatasetColumn(self.codes, self.header).block_rows(ctx)

    async def texts(self, ctx: ViewContext, start: int, stop: int) -> list[str]:
        codes = (await read_rows(ctx, self.codes, start, stop)).astype(np.int64)
        count = self.labels.rows
        if codes.size and (codes.min() < -1 or codes.max() >= count):
            raise ctx.error(f"{self.header}: a code outside [-1, {count})")
        used = np.unique(codes[codes >= 0])
        labels: dict[int, str] = {-1: ""}
        for run in np.split(used, np.flatnonzero(np.diff(used) > LABEL_GAP) + 1):
            if run.size:
                first = int(run[0])
                texts = await self.labels.texts(ctx, first, int(run[-1]) + 1)
                labels.update((code, texts[code - first]) for code in run.tolist())
        return [labels[code] for code in codes.tolist()]


class NullableColumn(Column):
    """A ``nullable-*`` element: its ``values``, empty where ``mask`` is true."""

    def __init__(self, values: Dataset, mask: Dataset, header: str) -> None:
        self.values = DatasetColumn(values, header)
        self.mask = mask
        self.header = header
        self.rows = self.values.rows
        self.plain = self.values.plain

    def block_rows(self, ctx: ViewContext) -> int:
        return self.values.block_rows(ctx)

    async def texts(self, ctx: ViewContext, start: int, stop: int) -> list[str]:
        texts = await self.values.texts(ctx, start, stop)
        for i in np.flatnonzero(await read_rows(ctx, self.mask, start, stop)).tolist():
            texts[i] = ""
        return texts


async def element_column(ctx: ViewContext, path: str, header: str) -> Column:
    """The one-dimensional element at ``path`` (from the context's object; ""
    for itself) as a column headed ``header``, or ``ctx.error``."""
    obj = ctx.obj if not path else await ctx.child(path)
    kind = encoding(obj)
    if isinstance(obj, Dataset) and obj.shape is not None and len(obj.shape) == 1:
        return DatasetColumn(obj, header)
    if isinstance(obj, Group) and kind == "categorical":
        codes = await dataset_child(ctx, path, "codes")
        if codes.type.dtype.kind not in "iu":
            raise ctx.error(f"{path or ctx.path}: categorical codes are not integers")
        return CategoricalColumn(codes, await dataset_child(ctx, path, "categories"), header)
    if isinstance(obj, Group) and kind in NULLABLE:
        values = await dataset_child(ctx, path, "values")
        mask = await dataset_child(ctx, path, "mask")
        if _rows(mask) != _rows(values):
            raise ctx.error(f"{path}: mask and values of different lengths")
        return NullableColumn(values, mask, header)
    raise ctx.error(f"{path or ctx.path}: {kind or 'an element'} is not one column")


def frame_layout(ctx: ViewContext) -> tuple[str, list[str]]:
    """The context's dataframe's index name and column names, in order."""
    attrs = attrs_of(ctx.obj)
    index, order = attrs.get("_index"), attrs.get("column-order", [])
    order = [order] if isinstance(order, str) else order
    if not isinstance(index, str) or not isinstance(order, list) or not all(
            isinstance(name, str) for name in order):
        raise ctx.error("dataframe without an _index name and a column-order")
    return index, order


async def frame_columns(ctx: ViewContext) -> list[Column]:
    """The context's dataframe as columns: the index, then ``column-order``."""
    index, order = frame_layout(ctx)
    columns = [await element_column(ctx, index, "" if index == "_index" else index)]
    columns += [await element_column(ctx, name, name) for name in order]
    return columns


async def element_rows(ctx: ViewContext, path: str) -> int | None:
    """The length of the element at ``path`` (its first dimension), if it has one."""
    obj = await ctx.child(path)
    kind = encoding(obj)
    if isinstance(obj, Dataset):
        return obj.shape[0] if obj.shape else None
    if kind == "categorical":
        return await element_rows(ctx, f"{path}/codes")
    if kind in NULLABLE:
        return await element_rows(ctx, f"{path}/values")
    if kind == "dataframe" and obj is not None:
        index = attrs_of(obj).get("_index")
        return await element_rows(ctx, f"{path}/{index}") if isinstance(index, str) else None
    return None


# --------------------------------------------------------------------------- sidecar


async def _kinds(ctx: ViewContext, path: str) -> dict[str, str | None] | None:
    """The encoding of each element of the mapping at ``path``; None if absent."""
    group = await ctx.child(path)
    if not isinstance(group, Group):
        return None
    return {name: encoding(await ctx.child(f"{path}/{name}")) for name in group.links}


async def _object_info(ctx: ViewContext, parts: tuple[str, ...]) -> dict[str, Any]:
    """``n_obs``, ``n_vars`` and the element kinds of an anndata (or raw) group."""
    info: dict[str, Any] = {}
    if "obs" in parts:
        info["n_obs"] = await element_rows(ctx, "obs")
    info["n_vars"] = await element_rows(ctx, "var")
    info["X"] = encoding(await ctx.child("X"))
    for name in MAPPINGS:
        if name in parts:
            info[name] = await _kinds(ctx, name)
    return info


async def describe(ctx: ViewContext, kind: str) -> dict[str, Any]:
    """The sidecar's ``"anndata"`` value of the context's object of ``kind``."""
    attrs = attrs_of(ctx.obj)
    info: dict[str, Any] = {"encoding-type": kind,
                            "encoding-version": attrs.get("encoding-version")}
    if kind == "anndata":
        info |= await _object_info(ctx, ("obs", *MAPPINGS))
    elif kind == "raw":
        info |= await _object_info(ctx, ("varm",))
    elif kind == "dataframe":
        index, order = frame_layout(ctx)
        info |= {"index": index, "rows": await element_rows(ctx, index),
                 "columns": {name: encoding(await ctx.child(name)) for name in order}}
    elif kind in {"csr_matrix", "csc_matrix"}:
        data = await ctx.child("data")
        info |= {"shape": attrs.get("shape"),
                 "stored": _rows(data) if isinstance(data, Dataset) else None}
    elif kind == "categorical":
        ordered = attrs.get("ordered")
        info |= {"rows": await element_rows(ctx, ctx.path),
                 "categories": await element_rows(ctx, f"{ctx.path}/categories"),
                 "ordered": bool(ordered) if isinstance(ordered, bool | int) else None}
    elif kind in NULLABLE:
        info["rows"] = await element_rows(ctx, ctx.path)
    elif kind == "awkward-array":
        text = attrs.get("form")
        try:
            form = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            form = None
        info |= {"length": attrs.get("length"), "form": form}
    return info


class AnndataKeys(View):
    """The ``"anndata"`` sidecar key of every object with a known encoding."""

    sidecar_key = "anndata"

    async def applies(self, ctx: ViewContext) -> bool:
        return encoding(ctx.obj) in ENCODINGS

    async def sidecar(self, ctx: ViewContext) -> Any:
        kind = encoding(ctx.obj)
        return None if kind is None else await describe(ctx, kind)


# --------------------------------------------------------------------------- files


class DataFrameCsv(BuiltFileView):
    """``NAME.csv`` of a ``dataframe`` group."""

    suffix = ".csv"

    async def applies(self, ctx: ViewContext) -> bool:
        return isinstance(ctx.obj, Group) and encoding(ctx.obj) == "dataframe"

    async def build(self, ctx: ViewContext) -> ViewFile:
        return csv_file(await frame_columns(ctx))


class ElementTxt(BuiltFileView):
    """``NAME.txt`` of a categorical, string or nullable element on its own."""

    suffix = ".txt"

    async def applies(self, ctx: ViewContext) -> bool:
        kind = encoding(ctx.obj)
        if kind not in COMPOSITE and kind != "string-array":
            return False
        if isinstance(ctx.obj, Dataset) and len(ctx.obj.shape or ()) != 1:
            return False
        parent = posixpath.dirname(ctx.path)
        if parent == ctx.path:
            return True
        return encoding(await ctx.child(parent)) not in COMPOSITE | {"dataframe"}

    async def build(self, ctx: ViewContext) -> ViewFile:
        return lines_file(await element_column(ctx, "", ctx.name))


class SparseMtx(FileView, BlockedFile):
    """``NAME.mtx`` of a ``csr_matrix`` or ``csc_matrix`` group."""

    suffix = ".mtx"
    sep = b" "
    kind = "Matrix Market"

    async def applies(self, ctx: ViewContext) -> bool:
        return isinstance(ctx.obj, Group) and encoding(ctx.obj) in {"csr_matrix", "csc_matrix"}

    async def blocks(self, ctx: ViewContext) -> AsyncIterator[bytes | list[Cells]]:
        sparse = await sparse_of(ctx, by_row=encoding(ctx.obj) == "csr_matrix")
        async for block in mtx_blocks(ctx, sparse):
            yield block


class AwkwardJsonl(BuiltFileView):
    """``NAME.jsonl`` of an ``awkward-array`` group."""

    suffix = ".jsonl"

    async def applies(self, ctx: ViewContext) -> bool:
        return isinstance(ctx.obj, Group) and encoding(ctx.obj) == "awkward-array"

    async def build(self, ctx: ViewContext) -> ViewFile:
        rows = AwkwardRows.of(ctx)
        return jsonl_file(rows.length, rows.values)
