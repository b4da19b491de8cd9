"""The content of anndata's element files: sparse matrices and awkward arrays.

Owns what ``layouts.views.anndata._elements``'s ``.mtx`` and ``.jsonl`` views stream:

* a ``csr_matrix`` / ``csc_matrix`` group (``data``, ``indices``, ``indptr``,
  attribute ``shape``) as the blocks of a Matrix Market coordinate file
  (``mtx_blocks``, for a ``layouts.views._csvblock.BlockedFile``, which
  counts its size from the texts' lengths without making its lines):
  the header, then one ``row col value`` line per stored entry, 1-based, in
  storage order (row by row for CSR, column by column for CSC), read
  ``ENTRY_STEP`` entries and ``MAJOR_STEP`` pointers at a time; values are
  written as ``layouts.views._columns`` writes numbers (bools as 1 and 0, complex
  numbers as their two parts);
* an ``awkward-array`` group (attributes ``form`` and ``length``, one dataset
  per buffer named ``{form_key}-{role}``, as ``awkward.to_buffers`` gives
  them) as Python values by rows (``AwkwardRows.values``): for rows
  ``[start, stop)`` each form node reads only the part of its buffers those
  rows use (a list's offsets, then its content's range), rebases them, and
  ``awkward.from_buffers`` builds just those rows.

Everything is read through the view's context (``layouts.views._arrays``), never
a whole dataset at once; chunks the next piece needs are prefetched.

Concurrency: stateless functions, and ``AwkwardRows``, whose only state is
the buffer datasets it looked up (set with no ``await`` between a lookup's
end and its record); each open file has its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from layouts.model import Dataset
from layouts.views._api import ViewContext
from layouts.views._arrays import prefetch_rows, read_rows
from layouts.views._columns import DatasetColumn
from layouts.views._csvblock import Cells, cells_of_texts
from layouts.views._csvblock import cells as array_cells

#: Stored entries formatted per piece of a ``.mtx``.
ENTRY_STEP = 1 << 16
#: Pointers (``indptr`` items) read at a time.
MAJOR_STEP = 1 << 16
#: Matrix Market field of each NumPy kind of ``data``.
MTX_FIELDS = {"f": "real", "i": "integer", "u": "integer", "b": "integer", "c": "complex"}
#: Deepest awkward form accepted (a hostile one may nest without end).
MAX_FORM_DEPTH = 64
#: NumPy dtypes of awkward's index types.
INDEX_TYPES = {"i8": np.int8, "u8": np.uint8, "i32": np.int32, "u32": np.uint32,
               "i64": np.int64}


def attrs_of(obj: Any) -> dict[str, Any]:
    """An object's attributes by name."""
    return {attr.name: attr.value for attr in obj.attrs}


async def dataset_child(ctx: ViewContext, group: str, name: str) -> Dataset:
    """The 1-D dataset ``name`` of the element at ``group``, or ``ctx.error``."""
    ds = await ctx.child(f"{group}/{name}" if group else name)
    if not isinstance(ds, Dataset) or ds.shape is None or len(ds.shape) != 1:
        raise ctx.error(f"{group or ctx.path}/{name}: not a 1-D dataset")
    return ds


async def rows_of(ctx: ViewContext, ds: Dataset, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of ``ds``, all of them, or ``ctx.error``."""
    rows = await read_rows(ctx, ds, start, stop)
    if len(rows) != max(0, stop - start):
        raise ctx.error(f"a dataset of {(ds.shape or (0,))[0]} rows read at {start}:{stop}")
    return rows


# --------------------------------------------------------------------------- sparse


@dataclass(frozen=True, slots=True)
class Sparse:
    """A CSR or CSC matrix's parts: ``by_row`` for CSR."""

    shape: tuple[int, int]
    by_row: bool
    data: Dataset
    indices: Dataset
    indptr: Dataset

    @property
    def major(self) -> int:
        """Rows of CSR, columns of CSC: what ``indptr`` points into."""
        return self.shape[0] if self.by_row else self.shape[1]

    @property
    def minor(self) -> int:
        return self.shape[1] if self.by_row else self.shape[0]


async def sparse_of(ctx: ViewContext, by_row: bool) -> Sparse:
    """The parts of the context's ``csr_matrix`` (``by_row``) or ``csc_matrix`` group."""
    shape = attrs_of(ctx.obj).get("shape")
    if (not isinstance(shape, list) or len(shape) != 2
            or not all(isinstance(n, int) and n >= 0 for n in shape)):
        raise ctx.error(f"sparse matrix shape {shape!r} is not two sizes")
    sp = Sparse((shape[0], shape[1]), by_row, await dataset_child(ctx, "", "data"),
                await dataset_child(ctx, "", "indices"), await dataset_child(ctx, "", "indptr"))
    if sp.data.type.dtype.kind not in MTX_FIELDS:
        raise ctx.error(f"sparse data of type {sp.data.type.sidecar} is not numeric")
    if sp.indices.type.dtype.kind not in "iu" or sp.indptr.type.dtype.kind not in "iu":
        raise ctx.error("sparse indices or indptr are not integers")
    if (sp.indptr.shape or (0,))[0] != sp.major + 1:
        raise ctx.error(f"indptr has {(sp.indptr.shape or (0,))[0]} items for "
                        f"{sp.major} {'rows' if by_row else 'columns'}")
    return sp


async def stored_entries(ctx: ViewContext, sp: Sparse) -> int:
    """The number of entries the matrix holds: ``indptr``'s last item."""
    nnz = int((await rows_of(ctx, sp.indptr, sp.major, sp.major + 1))[0])
    if not 0 <= nnz <= min((sp.data.shape or (0,))[0], (sp.indices.shape or (0,))[0]):
        raise ctx.error(f"indptr ends at {nnz}, past data or indices")
    return nnz


def mtx_value(kind: str) -> Callable[[Any], str] | None:
    """How ``DatasetColumn`` writes a value of ``kind`` in a ``.mtx`` (None:
    as in a CSV, numbers as the shortest text that reads back the same)."""
    if kind == "b":
        return lambda value: "1" if value else "0"
    if kind == "c":
        return lambda value: f"{value.real!r} {value.imag!r}"
    return None


async def mtx_blocks(ctx: ViewContext, sp: Sparse) -> AsyncIterator[bytes | list[Cells]]:
    """The Matrix Market coordinate file of ``sp``: its header as bytes, then
    the cells of each block of entries (row, column, value), or its lines as
    bytes where the values have no cells."""
    nnz = await stored_entries(ctx, sp)
    kind = sp.data.type.dtype.kind
    values = DatasetColumn(sp.data, "data", format=mtx_value(kind))
    yield (f"%%MatrixMarket matrix coordinate {MTX_FIELDS[kind]} general\n"
           f"{sp.shape[0]} {sp.shape[1]} {nnz}\n").encode()
    for m0 in range(0, sp.major, MAJOR_STEP):
        m1 = min(sp.major, m0 + MAJOR_STEP)
        ptr = (await rows_of(ctx, sp.indptr, m0, m1 + 1)).astype(np.int64)
        if ptr[0] < 0 or ptr[-1] > nnz or np.any(np.diff(ptr) < 0):
            raise ctx.error(f"indptr is not ascending within [0, {nnz}] at {m0}:{m1 + 1}")
        for e0 in range(int(ptr[0]), int(ptr[-1]), ENTRY_STEP):
            e1 = min(int(ptr[-1]), e0 + ENTRY_STEP)
            for ds in (sp.indices, sp.data):
                prefetch_rows(ctx, ds, e1, min(nnz, e1 + ENTRY_STEP))
            minor = (await rows_of(ctx, sp.indices, e0, e1)).astype(np.int64)
            if minor.min() < 0 or minor.max() >= sp.minor:
                raise ctx.error(f"sparse indices out of [0, {sp.minor}) at {e0}:{e1}")
            # 1-based: the pointer after each entry's start, and the index plus one.
            major = m0 + np.searchsorted(ptr, np.arange(e0, e1), side="right")
            rows, cols = (major, minor + 1) if sp.by_row else (minor + 1, major)
            value_cells = await values.cells(ctx, e0, e1)
            texts: list[str] = []
            if value_cells is None:
                texts = await values.texts(ctx, e0, e1)
                value_cells = cells_of_texts(texts)
            row_cells, col_cells = array_cells(rows), array_cells(cols)
            if value_cells is None or row_cells is None or col_cells is None:
                texts = texts or await values.texts(ctx, e0, e1)
                yield "".join(f"{row} {col} {text}\n" for row, col, text in
                              zip(rows.tolist(), cols.tolist(), texts, strict=True)).encode()
            else:
                yield [row_cells, col_cells, value_cells]


# --------------------------------------------------------------------------- awkward


class AwkwardRows:
    """Rows of the context's ``awkward-array`` group as Python values."""

    def __init__(self, form: Any, length: int) -> None:
        self.form = form
        self.length = length
        self._buffers: dict[str, Dataset] = {}

    @classmethod
    def of(cls, ctx: ViewContext) -> AwkwardRows:
        """The form and length from the group's attributes, or ``ctx.error``."""
        import awkward as ak  # noqa: PLC0415  (0.4 s to import: only when an element needs it)

        attrs = attrs_of(ctx.obj)
        length, text = attrs.get("length"), attrs.get("form")
        if not isinstance(length, int) or length < 0 or not isinstance(text, str):
            raise ctx.error("awkward-array without a form and length")
        try:
            parsed = json.loads(text)
            if not isinstance(parsed, dict):
                raise TypeError("not a JSON object")
            form = ak.forms.from_dict(parsed)
        except (ValueError, TypeError, KeyError, AssertionError, RecursionError) as exc:
            raise ctx.error(f"awkward form: {exc!r}") from None
        _check_depth(ctx, form, 0)
        return cls(form, length)

    async def values(self, ctx: ViewContext, start: int, stop: int) -> list[Any]:
        """Rows ``[start, stop)`` (clipped to the length) as awkward's ``to_list``."""
        import awkward as ak  # noqa: PLC0415  (see ``of``)

        start, stop = max(0, start), min(stop, self.length)
        if start >= stop:
            return []
        buffers: dict[str, np.ndarray] = {}
        await self._slice(ctx, self.form, start, stop, buffers)
        try:
            rows = ak.from_buffers(self.form, stop - start, buffers, highlevel=True)
            values: list[Any] = rows.to_list()
            return values
        except (ValueError, TypeError, IndexError, AssertionError) as exc:
            raise ctx.error(f"awkward rows {start}:{stop}: {exc}") from None

    async def _buffer(self, ctx: ViewContext, key: str) -> Dataset:
        ds = self._buffers.get(key)
        if ds is None:
            ds = await ctx.child(key)
            if not isinstance(ds, Dataset) or not ds.shape or not ds.type.fixed_size:
                raise ctx.error(f"awkward buffer {key} is not an array")
            self._buffers[key] = ds
        return ds

    async def _read(self, ctx: ViewContext, key: str, lo: int, hi: int, dtype: Any
                    ) -> np.ndarray:
        """Items ``[lo, hi)`` of the buffer ``key``, as ``dtype``."""
        if hi <= lo:
            return np.empty(0, dtype)
        ds = await self._buffer(ctx, key)
        return (await rows_of(ctx, ds, lo, hi)).astype(dtype, copy=False)

    async def _slice(self, ctx: ViewContext, form: Any, a: int, b: int,
                     out: dict[str, np.ndarray]) -> None:
        """Put in ``out`` the buffers of ``form`` holding only its rows ``[a, b)``,
        rebased so they are rows ``[0, b - a)``."""
        import awkward as ak  # noqa: PLC0415  (see ``of``)

        forms = ak.forms
        key = form.form_key
        if isinstance(form, forms.EmptyForm):
            return
        if key is None and not isinstance(
                form, forms.RegularForm | forms.UnmaskedForm | forms.RecordForm):
            raise ctx.error(f"awkward form {type(form).__name__} without a form_key")
        if isinstance(form, forms.NumpyForm):
            dtype = ak.types.numpytype.primitive_to_dtype(form.primitive)
            inner = tuple(form.inner_shape)
            data_key = f"{key}-data"
            if inner and b > a and len((await self._buffer(ctx, data_key)).shape or ()) == 1:
                # Stored flat: each row is ``prod(inner)`` items.
                width = math.prod(inner)
                data = await self._read(ctx, data_key, a * width, b * width, dtype)
                out[data_key] = data.reshape(-1, *inner)
            else:
                out[data_key] = await self._read(ctx, data_key, a, b, dtype)
        elif isinstance(form, forms.RegularForm):
            await self._slice(ctx, form.content, a * form.size, b * form.size, out)
        elif isinstance(form, forms.ListOffsetForm):
            dtype = _index_type(ctx, form.offsets)
            offsets = (await self._read(ctx, f"{key}-offsets", a, b + 1, np.int64)
                       if b > a else np.zeros(1, np.int64))
            out[f"{key}-offsets"] = (offsets - offsets[0]).astype(dtype)
            await self._slice(ctx, form.content, int(offsets[0]), int(offsets[-1]), out)
        elif isinstance(form, forms.ListForm):
            starts = await self._read(ctx, f"{key}-starts", a, b, np.int64)
            stops = await self._read(ctx, f"{key}-stops", a, b, np.int64)
            filled = stops > starts
            lo, hi = _span(starts, stops, filled)
            dtype = _index_type(ctx, form.starts)
            out[f"{key}-starts"] = np.where(filled, starts - lo, 0).astype(dtype)
            out[f"{key}-stops"] = np.where(filled, stops - lo, 0).astype(dtype)
            await self._slice(ctx, form.content, lo, hi, out)
        elif isinstance(form, forms.IndexedForm | forms.IndexedOptionForm):
            index = await self._read(ctx, f"{key}-index", a, b, np.int64)
            valid = index >= 0
            lo, hi = _span(index, index + 1, valid)
            rebased = np.where(valid, index - lo, -1)
            out[f"{key}-index"] = rebased.astype(_index_type(ctx, form.index))
            await self._slice(ctx, form.content, lo, hi, out)
        elif isinstance(form, forms.ByteMaskedForm):
            out[f"{key}-mask"] = await self._read(ctx, f"{key}-mask", a, b, np.int8)
            await self._slice(ctx, form.content, a, b, out)
        elif isinstance(form, forms.BitMaskedForm):
            order = "little" if form.lsb_order else "big"
            packed = await self._read(ctx, f"{key}-mask", a // 8, -(-b // 8), np.uint8)
            bits = np.unpackbits(packed, bitorder=order)[a % 8:a % 8 + b - a]
            out[f"{key}-mask"] = np.packbits(bits, bitorder=order)
            await self._slice(ctx, form.content, a, b, out)
        elif isinstance(form, forms.UnmaskedForm):
            await self._slice(ctx, form.content, a, b, out)
        elif isinstance(form, forms.RecordForm):
            for content in form.contents:
                await self._slice(ctx, content, a, b, out)
        elif isinstance(form, forms.UnionForm):
            tags = await self._read(ctx, f"{key}-tags", a, b, np.int8)
            index = await self._read(ctx, f"{key}-index", a, b, np.int64)
            rebased = index.copy()
            for tag, content in enumerate(form.contents):
                mine = tags == tag
                lo, hi = _span(index, index + 1, mine)
                rebased[mine] -= lo
                await self._slice(ctx, content, lo, hi, out)
            out[f"{key}-tags"] = tags
            out[f"{key}-index"] = rebased.astype(_index_type(ctx, form.index))
        else:
            raise ctx.error(f"awkward form {type(form).__name__} is not supported")


def _index_type(ctx: ViewContext, name: str) -> type[np.integer[Any]]:
    """The NumPy type of awkward's index type ``name`` (``i64``), or ``ctx.error``."""
    dtype = INDEX_TYPES.get(name)
    if dtype is None:
        raise ctx.error(f"awkward index type {name!r}")
    return dtype


def _span(lo: np.ndarray, hi: np.ndarray, where: np.ndarray) -> tuple[int, int]:
    """The smallest ``[min(lo), max(hi))`` over the items ``where`` holds; (0, 0) if none."""
    if not where.any():
        return 0, 0
    return int(lo[where].min()), int(hi[where].max())


def _check_depth(ctx: ViewContext, form: Any, depth: int) -> None:
    """Refuse forms nested deeper than ``MAX_FORM_DEPTH``."""
    if depth > MAX_FORM_DEPTH:
        raise ctx.error(f"awkward form nested deeper than {MAX_FORM_DEPTH}")
    children = getattr(form, "contents", None) or (
        [form.content] if hasattr(form, "content") else [])
    for child in children:
        _check_depth(ctx, child, depth + 1)
