"""``P.csv`` of a plain HDF5 table: a 1-D dataset of compound type.

A view on the view API (``layouts.views._api``), registered in
``layouts.views._registry``. PyTables tables, h5py record arrays and any other 1-D
compound dataset that no convention claims get ``P.csv``: one column per
field in the type's order (``layouts.views._columns.field_columns``), nested
compounds flattened as ``outer.inner``, sub-array and variable-length
fields as JSON arrays, values as ``layouts.views._columns`` writes them. The
conventions with views of their own claim a dataset by an attribute:
anndata's ``encoding-type``, LEGEND's ``datatype``; such datasets are left to
them.

The CSV is streamed block of rows by block of rows, each block reading only
the chunks it touches (once for all the fields); its size is counted the
same way, from the lengths of the fields' texts, on the first ``stat`` or
``open`` (``layouts.views._csvblock``).

Stateless; the one view object is shared by every task.
"""

from __future__ import annotations

from typing import TypeGuard

from layouts.hdf5 import parsed_type
from layouts.model import Dataset
from layouts.views._api import ViewContext, ViewFile
from layouts.views._columns import BuiltFileView, csv_file, field_columns

#: Attributes by which a convention with views of its own claims a dataset.
CLAIMING_ATTRIBUTES = frozenset({"encoding-type", "datatype"})


def is_plain_table(ds: object) -> TypeGuard[Dataset]:
    """True for a 1-D compound dataset that no convention claims."""
    if not isinstance(ds, Dataset) or ds.shape is None or len(ds.shape) != 1:
        return False
    if any(attr.name in CLAIMING_ATTRIBUTES for attr in ds.attrs):
        return False
    if ds.type.fixed_size:
        return ds.type.dtype.names is not None
    try:  # compound types with variable-length fields
        return parsed_type(ds.type.hdf5)[0].cls == "compound"
    except (ValueError, TypeError):
        return False


class H5TableCsv(BuiltFileView):
    """``P.csv`` of every plain HDF5 table."""

    suffix = ".csv"

    async def applies(self, ctx: ViewContext) -> bool:
        return is_plain_table(ctx.obj)

    async def build(self, ctx: ViewContext) -> ViewFile:
        ds = ctx.obj
        if not is_plain_table(ds):
            raise ctx.error("not a plain HDF5 table")
        try:
            return csv_file(field_columns(ds))
        except ValueError as exc:
            raise ctx.error(f"table columns: {exc}") from exc
