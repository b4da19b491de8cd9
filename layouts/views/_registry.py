"""The registry of views: every convention the mount shows, in one list.

A convention is a module or subpackage of ``layouts.views`` defining
``layouts.views._api.View``s, and one line here per view. The daemon shows
exactly these views, on every source (HSDS buckets, LINDI and kerchunk
reference files); their order is the order in which they are asked about an
object and, when two contribute the same sidecar key, the first wins.

Immutable after import; shared by every task.
"""

from __future__ import annotations

from layouts.views._api import View
from layouts.views._npy import NpyView
from layouts.views._table import H5TableCsv
from layouts.views.anndata import AnndataKeys, AwkwardJsonl, DataFrameCsv, ElementTxt, SparseMtx
from layouts.views.legend import LegendCsvView, LegendJsonlView, LegendView

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
