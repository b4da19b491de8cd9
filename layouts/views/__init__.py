"""Views: the files and directories conventions show beside HDF5 objects.

Owns the view API (``_api``: ``View``, ``FileView``, ``Reader``
and the ``ViewContext`` a view sees), files streamed from an async generator
(``_stream``), array reads through a view's context (``_arrays``), tables as
text (``_columns``), and the generic views: a dataset's whole-array ``.npy``
(``_npy``) and a plain HDF5 table's CSV (``_table``). Conventions are
subpackages (``anndata``, ``legend``); ``VIEWS`` (``_registry``) lists every
view the mount shows. The tree imports the names below; nothing in this
package imports ``mountd``.

Concurrency: views are stateless; each module says what it shares.
"""

from layouts.views._api import (
    AHEAD_CHUNKS,
    BlockCounts,
    FileView,
    Lease,
    Readahead,
    Reader,
    View,
    ViewContext,
    ViewFile,
)
from layouts.views._arrays import decode_chunk, read_array, row_chunks
from layouts.views._npy import NpyView, npy_header
from layouts.views._registry import VIEWS

__all__ = [
    "AHEAD_CHUNKS",
    "VIEWS",
    "BlockCounts",
    "FileView",
    "Lease",
    "NpyView",
    "Readahead",
    "Reader",
    "View",
    "ViewContext",
    "ViewFile",
    "decode_chunk",
    "npy_header",
    "read_array",
    "row_chunks",
]
