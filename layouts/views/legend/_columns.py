"""LEGEND objects as columns: recognising them, vectors of vectors, tables.

Owns what the LEGEND views (``layouts.views.legend._views``) read: an object's
``datatype`` and ``units`` attributes (``legend_attrs``, ``parsed``); a
vector of vectors in either layout (``find_vectors``: a group holding
``flattened_data`` and ``cumulative_length``, as legend-pydataobj writes
it, or a flat dataset whose ``cumsum_length`` attribute refers to the
cumulative lengths, as the format document has it: by object reference,
by name, or by the object id ``hsload`` leaves of a reference), read a
range of rows at a time (``Vectors.rows_between``); and the
``layouts.views._columns.Column`` s of a table (``table_columns``: one per field
in the order of ``table{...}``, nested tables flattened as
``outer.inner``, units in the header as ``name[unit]``) and of a 2-D array
of equal-sized arrays (``matrix_columns``). Enum values are shown by name
and ``bool`` arrays (stored as integers) as bools.

Every read goes through the view context (``layouts.views._arrays.read_rows``), a
block of rows at a time: a vector-of-vectors block reads the cumulative
lengths of its rows and then only the values they span. Data that breaks
the format (lengths that go down or past the values, a missing child, a
table nested too deep) raises ``ctx.error``: EIO for that file only.

Concurrency: columns and ``Vectors`` are immutable once built and shared by
the tasks of one stream; the block a matrix's columns share is replaced
with no ``await`` in between, so concurrent streams only miss it.
"""

from __future__ import annotations

import itertools
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from layouts.model import AnyObject, Dataset, Group, ObjectRef
from layouts.views._api import ViewContext
from layouts.views._arrays import read_rows
from layouts.views._columns import Column, DatasetColumn, json_text, value_text
from layouts.views.legend._types import (
    ArrayOf,
    DatatypeError,
    Enum,
    Fields,
    LegendType,
    Scalar,
    innermost,
    is_vector_of_vectors,
    parse_datatype,
)

#: Values a vector-of-vectors block aims at (rows are as long as they are).
BLOCK_VALUES = 1 << 16
#: Most rows per vector-of-vectors block.
MAX_BLOCK_ROWS = 4096
#: Deepest nesting of tables in a table that is flattened into one CSV.
MAX_TABLE_DEPTH = 16

#: Turns one value, as Python data, into what is shown (an enum's name...).
Mapper = Callable[[Any], Any]


# --------------------------------------------------------------------------- attributes


def _text_attr(obj: AnyObject, name: str) -> str | None:
    for attr in obj.attrs:
        if attr.name == name:
            value = attr.value
            if isinstance(value, bytes):
                return value.decode("utf-8", "replace")
            return value if isinstance(value, str) else None
    return None


def legend_attrs(obj: AnyObject) -> tuple[str | None, str | None]:
    """The object's ``datatype`` and ``units`` texts, when they are text."""
    return _text_attr(obj, "datatype"), _text_attr(obj, "units")


def parsed(obj: AnyObject) -> LegendType | None:
    """The object's parsed ``datatype``; None if it has none or it does not parse."""
    text = _text_attr(obj, "datatype")
    if text is None:
        return None
    try:
        return parse_datatype(text)
    except DatatypeError:
        return None


async def _cumsum_lengths(ctx: ViewContext, path: str, obj: AnyObject) -> AnyObject | None:
    """The object the ``cumsum_length`` attribute of ``obj`` (at ``path``
    from the context's object) names: an object reference; or text, the
    dataset's name beside ``obj`` or HDF5 path (what the format document
    had before references), else an object id (``hsload`` stores a
    reference attribute as its target's id)."""
    value = next((a.value for a in obj.attrs if a.name == "cumsum_length"), None)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, ObjectRef):
        return await ctx.deref(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or not value or "\x00" in value:
        return None
    here = posixpath.dirname(posixpath.join(ctx.path or "/", path) if path else ctx.path)
    found = await ctx.child(posixpath.join(here, value))
    return found if found is not None else await ctx.deref(ObjectRef(obj_id=value))


def join(path: str, name: str) -> str:
    """``name`` under the relative path ``path`` (``""``: the context's object)."""
    return f"{path}/{name}" if path else name


def header(name: str, units: str | None) -> str:
    """A column header: ``name[unit]``, or the name alone."""
    return f"{name}[{units}]" if units else name


# --------------------------------------------------------------------------- values


def mapper(element: LegendType) -> Mapper | None:
    """How a value of ``element`` is shown: an enum's name (an unknown code as
    itself), a bool; None when as it is read."""
    if isinstance(element, Enum):
        names = element.names()
        return lambda value: names.get(value, value)
    if isinstance(element, Scalar) and element.name == "bool":
        return bool
    return None


def _prepared(values: np.ndarray, convert: Mapper | None) -> np.ndarray | list[Any]:
    """Values ready for ``json_text``: mapped, or numbers in native byte order."""
    if convert is not None:
        return [convert(v) for v in values.tolist()]
    if values.dtype.kind in "biuf":
        return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    return values


def element_texts(values: np.ndarray, convert: Mapper | None) -> list[str]:
    """The CSV texts of a flat array of values (numbers as ``json_text``
    writes them, NaN and infinities and everything else as ``value_text``)."""
    if convert is None and values.dtype.kind in "iuf" and values.size:
        texts = json_text(_prepared(values, None))[1:-1].split(",")
        if values.dtype.kind == "f":
            for i in np.flatnonzero(~np.isfinite(values)).tolist():
                texts[i] = value_text(float(values[i]))
        return texts
    items = values.tolist() if convert is None else [convert(v) for v in values.tolist()]
    return [value_text(v) for v in items]


# --------------------------------------------------------------------------- vectors of vectors


@dataclass(frozen=True, slots=True)
class Vectors:
    """A vector of vectors: ``lengths[i]`` is where row ``i``'s values end in
    ``values`` (a 1-D dataset, or the rows of a nested vector of vectors)."""

    values: Dataset | Vectors
    lengths: Dataset
    #: What each value is: ``T`` of ``array<1>{array<1>{T}}``.
    element: LegendType
    #: ``flattened_data`` (legend-pydataobj) or ``cumsum_length`` (the format document).
    layout: str

    @property
    def rows(self) -> int:
        return (self.lengths.shape or (0,))[0]

    @property
    def size(self) -> int:
        """How many values (or nested rows) the rows hold between them."""
        if isinstance(self.values, Vectors):
            return self.values.rows
        return (self.values.shape or (0,))[0]

    def block_rows(self) -> int:
        """Rows per block: about ``BLOCK_VALUES`` values' worth."""
        per_row = max(1, self.size // max(1, self.rows))
        return max(1, min(MAX_BLOCK_ROWS, BLOCK_VALUES // per_row))

    async def _spans(self, ctx: ViewContext, start: int, stop: int) -> np.ndarray:
        """Where rows ``[start, stop)`` (clipped, not empty) start and end among
        the values: ``stop - start + 1`` ascending bounds, checked."""
        first = max(0, start - 1)
        ends = (await read_rows(ctx, self.lengths, first, stop)).astype(np.int64, copy=False)
        begin = 0
        if start > 0:
            begin, ends = int(ends[0]), ends[1:]
        if len(ends) != stop - start:
            raise ctx.error(f"cumulative lengths end before row {stop}")
        end = int(ends[-1])
        if begin < 0 or end > self.size or np.any(np.diff(ends, prepend=begin) < 0):
            raise ctx.error(f"cumulative lengths of rows {start}:{stop} go down or past "
                            f"the {self.size} values")
        return np.concatenate([[begin], ends])

    async def rows_between(self, ctx: ViewContext, start: int, stop: int) -> list[Any]:
        """Rows ``[start, stop)``, each a sequence of values (enum names, bools,
        nested rows) ``layouts.views._columns.json_text`` writes as a JSON array."""
        stop = min(stop, self.rows)
        if start >= stop:
            return []
        bounds = await self._spans(ctx, start, stop)
        begin, end = int(bounds[0]), int(bounds[-1])
        if isinstance(self.values, Vectors):
            values: np.ndarray | list[Any] = await self.values.rows_between(ctx, begin, end)
        else:
            raw = await read_rows(ctx, self.values, begin, end)
            values = _prepared(raw, mapper(self.element))
        return [values[a - begin:b - begin] for a, b in itertools.pairwise(bounds.tolist())]

    @property
    def of_numbers(self) -> bool:
        """True if each row is an array of numbers or bools (``numbers_between``)."""
        values = self.values
        if isinstance(values, Vectors) or len(values.shape or ()) != 1:
            return False
        dtype = values.type.dtype
        if dtype.kind not in "biu" and not (dtype.kind == "f" and dtype.itemsize in {4, 8}):
            return False
        convert = mapper(self.element)
        return convert is None or convert is bool

    async def numbers_between(self, ctx: ViewContext, start: int, stop: int
                              ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``[start, stop)`` of a vector ``of_numbers``: their values as one
        array (bools as bools) and their bounds in it
        (``layouts.views._columns.RowNumbers``)."""
        stop = min(stop, self.rows)
        if start >= stop:
            return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
        bounds = await self._spans(ctx, start, stop)
        assert isinstance(self.values, Dataset)
        values = await read_rows(ctx, self.values, int(bounds[0]), int(bounds[-1]))
        if mapper(self.element) is bool:
            values = values.astype(bool)
        return values, bounds - bounds[0]


def _lengths_dataset(obj: AnyObject | None) -> Dataset | None:
    if (isinstance(obj, Dataset) and obj.shape is not None and len(obj.shape) == 1
            and obj.type.fixed_size and obj.type.dtype.kind in "iu"):
        return obj
    return None


def _flat_dataset(obj: AnyObject | None) -> Dataset | None:
    if isinstance(obj, Dataset) and obj.shape is not None and len(obj.shape) == 1:
        return obj
    return None


async def find_vectors(ctx: ViewContext, path: str, obj: AnyObject,
                       t: LegendType) -> Vectors | None:
    """The vector of vectors ``obj`` (at ``path`` from the context's object)
    is, if its type ``t`` says it is one and its parts are there; else None."""
    if not is_vector_of_vectors(t):
        return None
    assert isinstance(t, ArrayOf) and isinstance(t.element, ArrayOf)
    element = t.element.element
    if isinstance(obj, Dataset):
        lengths = _lengths_dataset(await _cumsum_lengths(ctx, path, obj))
        values = _flat_dataset(obj)
        if lengths is None or values is None:
            return None
        return Vectors(values, lengths, element, "cumsum_length")
    lengths = _lengths_dataset(await ctx.child(join(path, "cumulative_length")))
    if lengths is None:
        return None
    flat_path = join(path, "flattened_data")
    flat = await ctx.child(flat_path)
    if isinstance(flat, Group):
        inner_t = parsed(flat)
        inner = None if inner_t is None else await find_vectors(ctx, flat_path, flat, inner_t)
        return None if inner is None else Vectors(inner, lengths, element, "flattened_data")
    values = _flat_dataset(flat)
    return None if values is None else Vectors(values, lengths, element, "flattened_data")


class VectorColumn(Column):
    """A vector-of-vectors column: each row's values as one JSON array."""

    def __init__(self, vectors: Vectors, header: str) -> None:
        self.vectors = vectors
        self.header = header
        self.rows = vectors.rows

    def block_rows(self, ctx: ViewContext) -> int:
        return self.vectors.block_rows()

    async def texts(self, ctx: ViewContext, start: int, stop: int) -> list[str]:
        return [json_text(row) for row in await self.vectors.rows_between(ctx, start, stop)]


# --------------------------------------------------------------------------- tables


@dataclass(frozen=True, slots=True)
class TableColumns:
    """A table's columns in CSV order, and the fields left out, with why."""

    columns: list[Column]
    left_out: dict[str, str]


def dataset_column(ds: Dataset, head: str, t: LegendType | None) -> Column:
    """A column of an array dataset: a value per row of a 1-D one, a JSON
    array per row of an N-D one (an array of equal-sized arrays)."""
    convert = None if t is None else mapper(innermost(t))
    if convert is None:
        return DatasetColumn(ds, head)
    if len(ds.shape or ()) == 1:
        return DatasetColumn(ds, head, format=lambda value: value_text(convert(value)))
    return DatasetColumn(ds, head, format=lambda row: json_text(_mapped(row, convert)))


def _mapped(value: Any, convert: Mapper) -> Any:
    """Nested lists of values, each mapped."""
    if isinstance(value, list):
        return [_mapped(v, convert) for v in value]
    return convert(value)


async def table_columns(ctx: ViewContext, t: Fields) -> TableColumns:
    """The columns of the context's table (``t`` is its parsed type)."""
    out = TableColumns([], {})
    await _add_table(ctx, "", "", t, out=out, depth=0)
    return out


async def _add_table(ctx: ViewContext, path: str, prefix: str, t: Fields, *,
                     out: TableColumns, depth: int) -> None:
    if depth >= MAX_TABLE_DEPTH:
        raise ctx.error(f"tables nested deeper than {MAX_TABLE_DEPTH}")
    for name in t.names:
        child_path = join(path, name)
        obj = await ctx.child(child_path)
        if obj is None:
            raise ctx.error(f"table column {child_path} is missing")
        datatype, units = legend_attrs(obj)
        try:
            ct = None if datatype is None else parse_datatype(datatype)
        except DatatypeError as exc:
            out.left_out[prefix + name] = str(exc)
            continue
        if isinstance(ct, Fields) and ct.kind == "table" and isinstance(obj, Group):
            await _add_table(ctx, child_path, f"{prefix}{name}.", ct, out=out, depth=depth + 1)
            continue
        head = header(prefix + name, units)
        vectors = None if ct is None else await find_vectors(ctx, child_path, obj, ct)
        if vectors is not None:
            out.columns.append(VectorColumn(vectors, head))
        elif (isinstance(obj, Dataset) and obj.shape
              and (ct is None or (isinstance(ct, ArrayOf) and "encoded" not in ct.kind
                                  and not is_vector_of_vectors(ct)))):
            out.columns.append(dataset_column(obj, head, ct))
        else:
            out.left_out[prefix + name] = f"not an array column ({datatype or obj.kind.value})"


# --------------------------------------------------------------------------- matrices


class _SharedBlock:
    """The last block of rows read from a dataset, shared by its element columns."""

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds
        self._last: tuple[int, int, np.ndarray] | None = None

    async def rows(self, ctx: ViewContext, start: int, stop: int) -> np.ndarray:
        last = self._last
        if last is not None and last[:2] == (start, stop):
            return last[2]
        values = await read_rows(ctx, self.ds, start, stop)
        self._last = (start, stop, values)
        return values


class ElementColumn(Column):
    """Element ``index`` of each row of a 2-D dataset."""

    def __init__(self, block: _SharedBlock, index: int, header: str, convert: Mapper | None,
                 block_rows: int) -> None:
        self.block = block
        self.index = index
        self.header = header
        self.rows = (block.ds.shape or (0,))[0]
        self.convert = convert
        self._block_rows = block_rows

    def block_rows(self, ctx: ViewContext) -> int:
        return self._block_rows

    async def texts(self, ctx: ViewContext, start: int, stop: int) -> list[str]:
        values = await self.block.rows(ctx, start, stop)
        return element_texts(values[:, self.index], self.convert)


def matrix_columns(ctx: ViewContext, ds: Dataset, t: ArrayOf, name: str,
                   units: str | None) -> list[Column]:
    """One column per element of the rows of a 2-D dataset, headed ``name.J[unit]``."""
    block = _SharedBlock(ds)
    rows = DatasetColumn(ds, name).block_rows(ctx)
    convert = mapper(innermost(t))
    width = (ds.shape or (0, 0))[1]
    return [ElementColumn(block, j, header(f"{name}.{j}", units), convert, rows)
            for j in range(width)]
