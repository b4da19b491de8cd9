"""LEGEND's HDF5 objects as views: tables as CSV, vectors of vectors as JSON
lines, and the ``"legend"`` sidecar key.

Owns the ``datatype`` attribute grammar (``_types``), LEGEND objects as
columns (``_columns``) and the views (``_views``). ``layouts.views``
registers the views below.

Concurrency: stateless views; safe from any number of tasks.
"""

from layouts.views.legend._views import LegendCsvView, LegendJsonlView, LegendView

__all__ = ["LegendCsvView", "LegendJsonlView", "LegendView"]
