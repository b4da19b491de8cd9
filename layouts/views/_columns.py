"""Tables as text: columns of values, and CSV, JSON-lines and plain-lines view files.

Owns the text of table values and the streamed files the conventions build
on (anndata, LEGEND, plain HDF5 tables):

* ``Column``: a header and ``rows`` values, whose text ``texts`` gives for
  any row range; ``DatasetColumn`` reads it from a dataset (a 1-D dataset, a
  field of a compound one, an N-D one as a JSON array per row) through
  ``layouts.views._arrays.read_rows``, so a block of rows touches only its chunks;
  ``field_columns`` gives one column per leaf field of a compound dataset,
  nested compounds flattened as ``outer.inner``, all sharing each block read
  (``RowBlocks``).
* ``csv_file``: a header line, then one RFC 4180 line per row; ``jsonl_file``:
  one compact JSON value per row; ``lines_file``: one unquoted value per line.
  Each is a ``layouts.views._stream.StreamedFile``, produced block of rows by
  block of rows: a block is formatted, yielded and dropped, so no file is
  ever held whole (the first blocks are small, so ``head`` of a large table
  formats little). The CSV and lines files are ``BlockedFile``s
  (``layouts.views._csvblock``): where a column's values have array texts
  (numbers, bools, ASCII byte strings) a block is made of those, and the
  exact size is counted from their lengths without making the lines; the
  JSON-lines file's size is counted by streaming it once, except for rows
  of numbers (``number_rows_file``), whose lines are counted from one
  serialisation of a block's values.
* ``BuiltFileView``: a ``FileView`` whose content is such a file built from
  the context (the columns of the object the view applies to).

Value text, the same for every source: integers as integers; floats as the
shortest text that reads back to the same value of their own width, and
``nan``, ``inf``, ``-inf`` (what ``pandas.read_csv`` reads back as floats);
bools as ``True``/``False``; strings and bytes as UTF-8 text (bytes that are
not UTF-8 replaced by U+FFFD); enum values as their names; opaque data as
base64; anything else (variable-length sequences, compounds, sub-arrays) as
compact JSON, where NaN and infinities are ``null``.

Concurrency: columns and files are immutable once built and may be shared
by tasks; a stream holds its own block. A ``RowBlocks`` keeps one block,
replaced with no ``await`` in between, so concurrent streams only miss it.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from layouts.errors import FormatError
from layouts.hdf5 import HType, parsed_type
from layouts.model import Dataset
from layouts.views._api import FileView, Reader, ViewContext, ViewFile
from layouts.views._arrays import prefetch_rows, read_rows
from layouts.views._csvblock import (
    BlockedFile,
    Cells,
    RowPlan,
    cells_of_texts,
    serialised,
    text_spans,
)
from layouts.views._csvblock import cells as array_cells
from layouts.views._stream import StreamedFile, close_stream

#: Rows per block when a column has no better idea.
BLOCK_ROWS = 4096
#: A dataset column's blocks span whole chunks and at least this many rows,
#: or equal parts of a chunk of more than ``MAX_BLOCK_ROWS``...
MIN_BLOCK_ROWS = 1024
#: ...with at most this many rows (a block's texts are Python strings, tens of
#: bytes each)...
MAX_BLOCK_ROWS = 8192
#: ...and at most this many bytes of values (a row of a variable-length type
#: counts ``VLEN_ROW_BYTES``).
BLOCK_BYTES = 4 << 20
VLEN_ROW_BYTES = 64
#: Rows of chunks a table's reads start ahead of the block being read.
AHEAD_CHUNK_ROWS = 4
#: Rows of a file's first block; the next ones double up to the full block.
FIRST_BLOCK_ROWS = 256
#: Rows per block of a JSON-lines file, unless told otherwise.
JSONL_BLOCK_ROWS = 1024

_OPT = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
#: A CSV field holding one of these, or starting or ending with white space, is quoted.
_SPECIAL = (",", '"', "\r", "\n")


# --------------------------------------------------------------------------- columns


class Column(ABC):
    """One column of a table: ``rows`` values under ``header``."""

    #: The header text as shown (``energy[keV]``, ``obs.cell_type``).
    header: str
    #: Number of values.
    rows: int
    #: True when no text of this column ever needs CSV quoting (numbers, bools).
    plain: bool = False

    @abstractmethod
    async def texts(self, ctx: ViewContext, start: int, stop: int) -> list[str]:
        """The text of rows ``[start, stop)`` (``0 <= start <= stop <= rows``),
        unquoted, ``""`` for a missing value: exactly ``stop - start`` items."""

    async def cells(self, ctx: ViewContext, start: int, stop: int) -> Cells | None:
        """The same texts as arrays (``layouts.views._csvblock``), when the column
        can make them without a Python object per value; else None."""
        return None

    def block_rows(self, ctx: ViewContext) -> int:
        """A good number of rows to ask ``texts`` for at a time."""
        return BLOCK_ROWS


class RowBlocks:
    """Block reads of one dataset shared by several of its columns (the
    fields of a compound): the last block read is kept and given again, and
    once the reads in a run span more than one row of chunks, the chunks of
    the next ``AHEAD_CHUNK_ROWS`` rows of chunks after each block are started
    in the background (blocks are read in order, by a count or a stream: on
    S3, as many GETs in flight as that)."""

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds
        self._last: tuple[int, int, np.ndarray] | None = None
        #: The first row of chunks not yet started ahead.
        self._ahead = 0
        #: Where the current run of reads, each from where the last ended, began.
        self._run_start = 0

    async def rows(self, ctx: ViewContext, start: int, stop: int) -> np.ndarray:
        last = self._last
        if last is not None and last[0] == start and last[1] == stop:
            return last[2]
        if last is None or start != last[1]:
            self._run_start = start
        values = await read_rows(ctx, self.ds, start, stop)
        self._last = (start, stop, values)
        self._prefetch(ctx, stop)
        return values

    def _prefetch(self, ctx: ViewContext, stop: int) -> None:
        """Start the next rows of chunks, once the reads in a run (each one
        from where the last ended) span more than one row of chunks: ``head``
        of a view, or a count that reads again only the blocks of a changed
        chunk, starts nothing it will not read."""
        ds = self.ds
        if not ds.chunks or not ds.grid or stop - self._run_start <= ds.chunks[0]:
            return
        step = ds.chunks[0]
        first = max(self._ahead, -(-stop // step))
        last = min(ds.grid[0], -(-stop // step) + AHEAD_CHUNK_ROWS)
        if first >= last:
            return
        accepted = prefetch_rows(ctx, ds, first * step, last * step)
        self._ahead = first + accepted // max(1, math.prod(ds.grid[1:]))


@dataclass(frozen=True, slots=True)
class _Leaf:
    """How values of one element type become text."""

    #: CSV texts of a flat array of values.
    text: Callable[[np.ndarray], list[str]]
    #: JSON texts of a flat array of values.
    json: Callable[[np.ndarray], list[str]]
    #: ``text`` never needs quoting.
    plain: bool = False
    #: The same texts as arrays, for the kinds ``layouts.views._csvblock`` makes.
    cells: Callable[[np.ndarray], Cells | None] | None = None


class DatasetColumn(Column):
    """A column read from a dataset with at least one dimension.

    ``field`` selects a field of a compound type (a sequence of names walks
    nested compounds); what is left must be one value per row (a number,
    bool, string, enum...) or, for an N-D dataset or a sub-array field, an
    array per row, shown as a JSON array. ``format`` replaces the value text:
    it gets each row's value as Python data (``tolist()`` of the row: bytes
    for fixed strings, nested lists for arrays; the decoded object for
    variable-length types). ``rows_from`` shares block reads between columns
    of the same dataset (``field_columns``).
    """

    def __init__(self, ds: Dataset, header: str, *, field: str | Sequence[str] | None = None,
                 format: Callable[[Any], str] | None = None,
                 rows_from: RowBlocks | None = None) -> None:
        if ds.shape is None or not ds.shape:
            raise ValueError("a column needs a dataset with at least one dimension")
        self.ds = ds
        self.header = header
        self.rows = ds.shape[0]
        self._memo = rows_from if rows_from is not None else RowBlocks(ds)
        path = () if field is None else (field,) if isinstance(field, str) else tuple(field)
        htype = _htype(ds)
        self._select, dtype, dims, htype = _selector(ds, path, htype)
        self._format = format
        self._leaf = _leaf(dtype, htype)
        self.plain = format is None and self._leaf.plain and not dims and len(ds.shape) == 1

    def block_rows(self, ctx: ViewContext) -> int:
        shape = self.ds.shape or (1,)
        per = max(1, self.ds.chunks[0] if self.ds.chunks else BLOCK_ROWS)
        if per <= MAX_BLOCK_ROWS:
            rows = per * min(-(-MIN_BLOCK_ROWS // per), MAX_BLOCK_ROWS // per)
        else:
            rows = -(-per // -(-per // MAX_BLOCK_ROWS))
        row_bytes = math.prod(shape[1:]) * (
            self.ds.type.itemsize if self.ds.type.fixed_size else VLEN_ROW_BYTES)
        return max(1, min(rows, BLOCK_BYTES // max(1, row_bytes)))

    async def cells(self, ctx: ViewContext, start: int, stop: int) -> Cells | None:
        if self._format is not None or self._leaf.cells is None:
            return None
        values = self._select(await self._memo.rows(ctx, start, stop))
        return self._leaf.cells(values) if values.ndim == 1 else None

    async def texts(self, ctx: ViewContext, start: int, stop: int) -> list[str]:
        values = self._select(await self._memo.rows(ctx, start, stop))
        if self._format is not None:
            return [self._format(v) for v in values.tolist()]
        if values.ndim == 1:
            return self._leaf.text(values)
        n = values.shape[0]
        flat = self._leaf.json(values.reshape(-1))
        return _nest(flat, n, values.shape[1:])


def field_columns(ds: Dataset, prefix: str = "") -> list[DatasetColumn]:
    """One column per leaf field of a compound dataset (nested compounds
    flattened: header ``prefix + "outer.inner"``), or the dataset itself as
    one column headed ``prefix``. The columns share each block read."""
    memo = RowBlocks(ds)
    htype = _htype(ds)
    if htype is not None and htype.cls == "compound":
        paths = list(_htype_paths(htype, ()))
    elif ds.type.dtype.names is not None:
        paths = list(_dtype_paths(ds.type.dtype, ()))
    else:
        return [DatasetColumn(ds, prefix, rows_from=memo)]
    return [DatasetColumn(ds, prefix + ".".join(path), field=path, rows_from=memo)
            for path in paths]


def _htype_paths(t: HType, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for name, ft in t.fields:
        if ft.cls == "compound":
            yield from _htype_paths(ft, (*path, name))
        else:
            yield (*path, name)


def _dtype_paths(dtype: np.dtype[Any], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    fields = dtype.fields or {}
    for name in dtype.names or ():
        sub = fields[name][0]
        if sub.names is not None:
            yield from _dtype_paths(sub, (*path, name))
        else:
            yield (*path, name)


def _htype(ds: Dataset) -> HType | None:
    """The dataset's parsed HDF5 type (enum names, field classes), if its
    format describes it."""
    try:
        return parsed_type(ds.type.hdf5)[0]
    except (FormatError, TypeError, ValueError):
        return None


def _selector(ds: Dataset, path: tuple[str, ...], htype: HType | None
              ) -> tuple[Callable[[np.ndarray], np.ndarray], np.dtype[Any], tuple[int, ...],
                         HType | None]:
    """How to take field ``path`` out of rows read from ``ds``; the dtype of
    each value left, the dimensions a row has besides them (an N-D dataset's,
    a sub-array type's or field's) and the value's parsed type."""
    if ds.type.fixed_size:
        dtype, dims = ds.type.base_and_dims
        dims = (ds.shape or ())[1:] + dims
        htype = _array_base(htype)
        for name in path:
            if dtype.fields is None or name not in dtype.fields:
                raise ValueError(f"no field {name!r} in {dtype}")
            dtype = dtype.fields[name][0]
            if dtype.subdtype is not None:
                dtype, sub = dtype.subdtype
                dims += sub
            htype = _array_base(_field_htype(htype, name))
        names = list(path)

        def select(values: np.ndarray) -> np.ndarray:
            for name in names:
                values = values[name]
            return values

        return select, dtype, dims, htype
    dims = (ds.shape or ())[1:]
    if not path:
        return (lambda values: values), np.dtype(object), dims, htype
    # Variable-length compounds (json2 chunks): each element is a list in field order.
    indices: list[int] = []
    for name in path:
        names = [n for n, _ in htype.fields] if htype is not None else []
        if name not in names:
            raise ValueError(f"no field {name!r} in a compound of {names}")
        indices.append(names.index(name))
        htype = _field_htype(htype, name)
    take = np.frompyfunc(lambda row: _walk(row, indices), 1, 1)

    def select_json(values: np.ndarray) -> np.ndarray:
        return np.asarray(take(values), dtype=object) if values.size else values

    return select_json, np.dtype(object), dims, _array_base(htype)


def _walk(row: Any, indices: list[int]) -> Any:
    for i in indices:
        row = None if row is None else row[i]
    return row


def _field_htype(htype: HType | None, name: str) -> HType | None:
    if htype is None or htype.cls != "compound":
        return None
    return dict(htype.fields).get(name)


def _array_base(htype: HType | None) -> HType | None:
    while htype is not None and htype.cls == "array":
        htype = htype.base
    return htype


def _nest(flat: list[str], rows: int, dims: tuple[int, ...]) -> list[str]:
    """JSON arrays of shape ``dims``, one per row, from their leaves' texts in C order."""
    if 0 in dims:
        return [_empty_json(dims)] * rows
    texts = flat
    for dim in reversed(dims):
        texts = ["[" + ",".join(texts[i:i + dim]) + "]" for i in range(0, len(texts), dim)]
    return texts


def _empty_json(dims: tuple[int, ...]) -> str:
    """A JSON array of shape ``dims`` (one of them 0)."""
    if not dims[0]:
        return "[]"
    return "[" + ",".join([_empty_json(dims[1:])] * dims[0]) + "]"


# --------------------------------------------------------------------------- value text


def _native(values: np.ndarray) -> np.ndarray:
    """``values`` in native byte order, C-contiguous (what orjson serialises)."""
    return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))


def _number_texts(values: np.ndarray) -> list[str]:
    """orjson's texts of a flat numeric array (floats: shortest round trip of
    their own width; NaN and infinities: ``null``)."""
    if not values.size:
        return []
    if values.dtype.kind == "f" and values.dtype.itemsize not in {4, 8}:
        return [_float_json(x) for x in values]
    return orjson.dumps(_native(values), option=_OPT)[1:-1].decode().split(",")


def _float_json(x: np.floating[Any]) -> str:
    return str(x) if math.isfinite(x) else "null"


def _float_texts(values: np.ndarray) -> list[str]:
    texts = _number_texts(values)
    for i in np.flatnonzero(~np.isfinite(values)).tolist():
        texts[i] = _nonfinite(float(values[i]))
    return texts


def _nonfinite(x: float) -> str:
    return "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"


def _bool_texts(values: np.ndarray) -> list[str]:
    return ["True" if v else "False" for v in values.tolist()]


def _bool_json(values: np.ndarray) -> list[str]:
    return ["true" if v else "false" for v in values.tolist()]


def _string_texts(values: np.ndarray) -> list[str]:
    if values.dtype.kind == "S" and values.size:
        raw = np.ascontiguousarray(values)
        if int(raw.view(np.uint8).max()) < 0x80:  # ASCII: converted in C
            return raw.astype(f"U{raw.dtype.itemsize}").tolist()
    return [_text(v) for v in values.tolist()]


def _string_json(values: np.ndarray) -> list[str]:
    return [json_text(_text(v)) for v in values.tolist()]


def _opaque_texts(values: np.ndarray) -> list[str]:
    return [base64.b64encode(v.tobytes()).decode("ascii") for v in values]


def _opaque_json(values: np.ndarray) -> list[str]:
    return [f'"{t}"' for t in _opaque_texts(values)]


def _object_texts(values: np.ndarray) -> list[str]:
    items = values.tolist()
    try:
        "".join(items)  # all strings (variable-length text): as they are
    except TypeError:
        return [value_text(v) for v in items]
    return items


def _object_json(values: np.ndarray) -> list[str]:
    return [json_text(v) for v in values.tolist()]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def value_text(value: Any) -> str:
    """The text of one value as Python data (see the module docstring)."""
    if value is None:
        return ""
    if isinstance(value, str | bytes):
        return _text(value)
    if isinstance(value, bool | np.bool_):
        return "True" if value else "False"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return _float_texts(np.asarray([value]))[0]
    return json_text(value)


def _enum_leaf(base: _Leaf, members: dict[int, str]) -> _Leaf:
    def names(values: np.ndarray) -> list[str]:
        return [members.get(v, str(v)) for v in values.tolist()]

    def json_names(values: np.ndarray) -> list[str]:
        return [json_text(members[v]) if v in members else str(v) for v in values.tolist()]

    return _Leaf(names, json_names, plain=base.plain and all(
        not _needs_quotes(name) for name in members.values()))


def _leaf(dtype: np.dtype[Any], htype: HType | None) -> _Leaf:
    """How values of ``dtype`` (parsed HDF5 type ``htype``, if known) become text."""
    kind = dtype.kind
    if kind == "b":
        return _Leaf(_bool_texts, _bool_json, plain=True, cells=array_cells)
    if kind in "iu":
        leaf = _Leaf(_number_texts, _number_texts, plain=True, cells=array_cells)
        if htype is not None and htype.cls == "enum" and htype.members:
            return _enum_leaf(leaf, {v: k for k, v in htype.members.items()})
        return leaf
    if kind == "f":
        return _Leaf(_float_texts, _number_texts, plain=True, cells=array_cells)
    if kind == "S":
        return _Leaf(_string_texts, _string_json, cells=array_cells)
    if kind == "U":
        return _Leaf(_string_texts, _string_json)
    if kind == "V" and dtype.names is None:
        return _Leaf(_opaque_texts, _opaque_json)
    return _Leaf(_object_texts, _object_json)


# --------------------------------------------------------------------------- JSON


def _json_default(value: Any) -> Any:
    """What orjson cannot write itself, as something it can."""
    if isinstance(value, bytes):
        return _text(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _plain(value: Any) -> Any:
    """``value`` as data the standard ``json`` writes (NaN and infinities: None)."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | np.ndarray | np.generic):
        return _plain(_json_default(value))
    return value


def json_text(value: Any) -> str:
    """``value`` as compact JSON (UTF-8 text as is; NaN and infinities as ``null``)."""
    try:
        return orjson.dumps(value, default=_json_default, option=_OPT).decode()
    except orjson.JSONEncodeError:
        # Integers past 64 bits, strings with lone surrogates...
        return json.dumps(_plain(value), ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)


# --------------------------------------------------------------------------- files


def _needs_quotes(text: str) -> bool:
    return any(c in text for c in _SPECIAL) or text != text.strip()


def _quoted(text: str) -> str:
    if not _needs_quotes(text):
        return text
    return '"' + text.replace('"', '""') + '"'


def _quoted_all(texts: list[str]) -> list[str]:
    """``texts`` CSV-quoted where needed; the special characters are looked
    for in the whole block at once, field by field only when one is there."""
    joined = "".join(texts)
    if any(c in joined for c in _SPECIAL) or any(t != t.strip() for t in texts):
        return [_quoted(t) for t in texts]
    return texts


def csv_line(fields: Sequence[str]) -> str:
    """One CSV line of unquoted fields (RFC 4180 quoting), ending in ``\\n``."""
    if len(fields) == 1 and not fields[0]:
        return '""\n'  # an empty line would be skipped as blank
    return ",".join(map(_quoted, fields)) + "\n"


def _blocks(rows: int, block: int) -> Iterator[tuple[int, int]]:
    """Row ranges covering ``[0, rows)``: small ones first, doubling, then
    ``block`` rows each, aligned to multiples of ``block``."""
    start, size = 0, min(block, FIRST_BLOCK_ROWS)
    while start < rows:
        stop = start + size if size < block else (start // block + 1) * block
        stop = min(rows, stop)
        yield start, stop
        start, size = stop, size * 2


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def _check_count(ctx: ViewContext, got: Sized, start: int, stop: int, what: str) -> None:
    if len(got) != stop - start:
        raise ctx.error(f"{what} gave {len(got)} values for rows {start}:{stop}")


class _CsvFile(BlockedFile):
    """A header line, then blocks of rows: the columns' cells where a column
    has cells of its own, else the lines joined from their texts."""

    def __init__(self, columns: Sequence[Column]) -> None:
        self.columns = tuple(columns)

    def _header(self, ctx: ViewContext) -> bytes:
        columns = self.columns
        rows = columns[0].rows
        if any(column.rows != rows for column in columns):
            raise ctx.error("table columns of different lengths: "
                            + ", ".join(f"{c.header}={c.rows}" for c in columns))
        return _encode(csv_line([column.header for column in columns]))

    def _ranges(self, ctx: ViewContext) -> Iterator[tuple[int, int]]:
        block = max(1, min(column.block_rows(ctx) for column in self.columns))
        return _blocks(self.columns[0].rows, block)

    async def _block(self, ctx: ViewContext, start: int, stop: int) -> list[Cells] | bytes:
        """The block's cells, one per column, when a column has cells of its own
        (the others' quoted texts then become cells too); else its lines, joined
        from the texts as bytes (as fast for texts alone, and the only way for
        a text holding a NUL, or for empty values of a lone column: ``""``)."""
        native = [await column.cells(ctx, start, stop) for column in self.columns]
        for column, got in zip(self.columns, native, strict=True):
            if got is not None:
                _check_count(ctx, got, start, stop, column.header)
        if any(got is not None and got.plain for got in native):
            out: list[Cells] = []
            for column, got in zip(self.columns, native, strict=True):
                made = got if got is not None and got.plain else \
                    cells_of_texts(await self._texts(ctx, column, start, stop))
                if made is None:
                    break
                out.append(made)
            else:
                if len(out) > 1 or not out[0].empty:
                    return out
        return _encode(_lines([await self._texts(ctx, c, start, stop) for c in self.columns],
                              stop - start))

    @staticmethod
    async def _texts(ctx: ViewContext, column: Column, start: int, stop: int) -> list[str]:
        texts = await column.texts(ctx, start, stop)
        _check_count(ctx, texts, start, stop, column.header)
        return texts if column.plain else _quoted_all(texts)

    async def blocks(self, ctx: ViewContext) -> AsyncIterator[bytes | list[Cells]]:
        if not self.columns:
            return
        yield self._header(ctx)
        for start, stop in self._ranges(ctx):
            yield await self._block(ctx, start, stop)

    def row_plan(self, ctx: ViewContext) -> RowPlan | None:
        """A plan when every column is a field (or the whole) of one dataset."""
        ds = _one_dataset(self.columns)
        if ds is None:
            return None
        return RowPlan(ds, self._header(ctx), self._ranges(ctx),
                       functools.partial(self._block, ctx))


def _one_dataset(columns: Sequence[Column]) -> Dataset | None:
    """The dataset every column reads, if they are all ``DatasetColumn``s of one."""
    datasets = [c.ds for c in columns if isinstance(c, DatasetColumn)]
    if not datasets or len(datasets) != len(columns) or \
            any(ds.id != datasets[0].id for ds in datasets):
        return None
    return datasets[0]


def _lines(fields: list[list[str]], rows: int) -> str:
    """CSV lines of quoted ``fields`` (one list per column), ``\n`` after each:
    separators and fields interleaved into one list, joined once."""
    width = len(fields)
    if width == 1:  # an empty line would be skipped as blank
        return "".join(f"{t}\n" if t else '""\n' for t in fields[0])
    parts = [","] * (2 * width * rows)
    for j, texts in enumerate(fields):
        parts[2 * j::2 * width] = texts
    parts[2 * width - 1::2 * width] = ["\n"] * rows
    return "".join(parts)


def csv_file(columns: Sequence[Column]) -> ViewFile:
    """A CSV file of ``columns`` (same ``rows`` each, else EIO): a header line,
    then one line per row, RFC 4180 quoting, ``\\n`` line ends."""
    return _CsvFile(columns)


class _JsonLinesFile(StreamedFile):
    def __init__(self, rows: int,
                 row_values: Callable[[ViewContext, int, int], Awaitable[list[Any]]],
                 block_rows: int) -> None:
        self.rows = rows
        self.row_values = row_values
        self.block_rows = block_rows

    async def pieces(self, ctx: ViewContext) -> AsyncIterator[bytes]:
        for start, stop in _blocks(self.rows, self.block_rows):
            values = await self.row_values(ctx, start, stop)
            _check_count(ctx, values, start, stop, "row values")
            try:
                lines = [json_text(value) for value in values]
            except (TypeError, ValueError) as exc:
                raise ctx.error(f"row value not JSON: {exc}") from exc
            lines.append("")
            yield _encode("\n".join(lines))


def jsonl_file(rows: int,
               row_values: Callable[[ViewContext, int, int], Awaitable[list[Any]]],
               *, block_rows: int = JSONL_BLOCK_ROWS) -> ViewFile:
    """A JSON-lines file: for each of ``rows`` rows the compact JSON of its
    value (``row_values(ctx, start, stop)`` gives rows ``[start, stop)``;
    NaN and infinities are written ``null``)."""
    return _JsonLinesFile(rows, row_values, max(1, block_rows))


class _NumberRows:
    """A block of rows of numbers as JSON lines (``[v0,v1,...]`` each), from one
    orjson serialisation of all their values: its count from where each row's
    values start and end in it, its bytes by slicing it, so the two agree."""

    def __init__(self, values: np.ndarray, bounds: np.ndarray) -> None:
        self.buf = serialised(values)
        lo, hi = bounds[:-1], bounds[1:]
        full = hi > lo
        #: Where each row's values start and end in ``buf`` (equal for no values).
        self.starts = np.zeros(len(lo), dtype=np.int64)
        self.ends = np.zeros(len(lo), dtype=np.int64)
        if len(values):
            firsts, lasts = text_spans(self.buf)
            self.starts[full] = firsts[lo[full]]
            self.ends[full] = lasts[hi[full] - 1]

    def count(self) -> int:
        """The bytes ``lines`` gives: each row's values, brackets and line end."""
        return int((self.ends - self.starts).sum()) + 3 * len(self.starts)

    def lines(self) -> bytes:
        buf = self.buf
        return b"".join([b"[" + buf[a:b] + b"]\n"
                         for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True)])


class _NumberRowsFile(StreamedFile):
    def __init__(self, rows: int, row_numbers: RowNumbers, block_rows: int) -> None:
        self.rows = rows
        self.row_numbers = row_numbers
        self.block_rows = block_rows

    async def _blocks(self, ctx: ViewContext) -> AsyncIterator[_NumberRows]:
        for start, stop in _blocks(self.rows, self.block_rows):
            values, bounds = await self.row_numbers(ctx, start, stop)
            if len(bounds) != stop - start + 1 or bounds[0] != 0 or \
                    bounds[-1] != len(values) or np.any(np.diff(bounds) < 0):
                raise ctx.error(f"row values do not make rows {start}:{stop}")
            yield _NumberRows(values, bounds)

    async def pieces(self, ctx: ViewContext) -> AsyncIterator[bytes]:
        blocks = self._blocks(ctx)
        try:
            async for block in blocks:
                yield block.lines()
        finally:
            await close_stream(blocks)

    async def size(self, ctx: ViewContext) -> int:
        """Counted block by block, without making the lines."""
        total = 0
        blocks = self._blocks(ctx)
        try:
            async for block in blocks:
                total += block.count()
        finally:
            await close_stream(blocks)
        return total


#: Rows ``[start, stop)`` of numbers: all their values as one flat array of
#: integers, floats or bools, and ``stop - start + 1`` bounds (row ``i`` is
#: ``values[bounds[i]:bounds[i + 1]]``, the first bound 0 and the last the values' count).
RowNumbers = Callable[[ViewContext, int, int], Awaitable[tuple[np.ndarray, np.ndarray]]]


def number_rows_file(rows: int, row_numbers: RowNumbers, *,
                     block_rows: int = JSONL_BLOCK_ROWS) -> ViewFile:
    """``jsonl_file`` of rows that are each an array of numbers (or bools),
    given flat (``RowNumbers``): the bytes ``jsonl_file`` makes of the same
    rows in native byte order, made and counted per block of rows with one
    serialisation of its values, not one per row."""
    return _NumberRowsFile(rows, row_numbers, max(1, block_rows))


class _LinesFile(BlockedFile):
    kind = "lines"

    def __init__(self, column: Column) -> None:
        self.column = column

    def _ranges(self, ctx: ViewContext) -> Iterator[tuple[int, int]]:
        return _blocks(self.column.rows, max(1, self.column.block_rows(ctx)))

    async def blocks(self, ctx: ViewContext) -> AsyncIterator[bytes | list[Cells]]:
        for start, stop in self._ranges(ctx):
            yield await self._block(ctx, start, stop)

    async def _block(self, ctx: ViewContext, start: int, stop: int) -> bytes | list[Cells]:
        """The block's cells, if the column has cells of its own; else its
        lines, joined from its texts as bytes."""
        column = self.column
        got = await column.cells(ctx, start, stop)
        if got is not None:
            _check_count(ctx, got, start, stop, column.header)
            return [got]
        texts = await column.texts(ctx, start, stop)
        _check_count(ctx, texts, start, stop, column.header)
        texts.append("")
        return _encode("\n".join(texts))

    def row_plan(self, ctx: ViewContext) -> RowPlan | None:
        ds = _one_dataset([self.column])
        if ds is None:
            return None
        return RowPlan(ds, b"", self._ranges(ctx), functools.partial(self._block, ctx))


def lines_file(column: Column) -> ViewFile:
    """The column's values, one per line, with no header and no quoting."""
    return _LinesFile(column)


class BuiltFileView(FileView):
    """A file view whose content is a ``ViewFile`` built from the context
    (``csv_file`` of the object's columns, say): sized and opened through it."""

    @abstractmethod
    async def build(self, ctx: ViewContext) -> ViewFile:
        """The file shown for the context's object."""

    async def size(self, ctx: ViewContext) -> int:
        return await (await self.build(ctx)).size(ctx)

    async def open(self, ctx: ViewContext) -> Reader:
        return await (await self.build(ctx)).open(ctx)
