"""The registry of views: every convention the mount shows, in one list.

A convention is one module in ``layouts/`` defining a ``layouts.viewapi.View``
and one line here. The daemon shows exactly these views, on every source
(HSDS buckets, LINDI and kerchunk reference files); their order is the order
in which they are asked about an object and, when two contribute the same
sidecar key, the first wins.

Immutable after import; shared by every task.
"""

from __future__ import annotations

from layouts.anndata import AnndataKeys, AwkwardJsonl, DataFrameCsv, ElementTxt, SparseMtx
from layouts.h5table import H5TableCsv
from layouts.legend import LegendCsvView, LegendJsonlView, LegendView
from layouts.npy import NpyView
from layouts.viewapi import View

VIEWS: tuple[View, ...] = (
    NpyView(),
    AnndataKeys(),
    DataFrameCsv(),
    SparseMtx(),
    ElementTxt(),
    AwkwardJsonl(),
    LegendView(),
    LegendCsvView(),
    LegendJsonlView(),
    H5TableCsv(),
)
