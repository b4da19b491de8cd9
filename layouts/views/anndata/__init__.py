"""anndata's on-disk format (``.h5ad``) as views: dataframes as CSV, sparse
matrices as Matrix Market, string and nullable elements as text, awkward
arrays as JSON lines, and the ``"anndata"`` sidecar key.

Owns recognising anndata's elements (``_elements``) and the content of their
files (``_files``). ``layouts.views`` registers the views below.

Concurrency: stateless views; safe from any number of tasks.
"""

from layouts.views.anndata._elements import (
    AnndataKeys,
    AwkwardJsonl,
    DataFrameCsv,
    ElementTxt,
    SparseMtx,
)

__all__ = ["AnndataKeys", "AwkwardJsonl", "DataFrameCsv", "ElementTxt", "SparseMtx"]
