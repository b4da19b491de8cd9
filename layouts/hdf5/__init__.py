"""HDF5's own machinery, shared by every format and by the ``D.h5`` view.

Owns what HDF5 itself defines, independent of where the metadata came from:
type JSON and the model's element types (``_types``), the filter pipeline of
stored chunks (``_filters``) and the bounded decoders it runs (``_inflate``,
with Blosc-zlib frames through libdeflate in ``_blosc``, and LZF in
``_lzf``), chunk stores over data that stays in an HDF5 file, read by byte
range (``_linked``), the plan of a file image and where its elements go
(``_plan``), the writer of HDF5 file images (``_image``) and the bound on
their length known before they are written (``_bound``). Formats
and the tree import the names below; the modules inside are private to this
package.

Concurrency: pure functions and immutable values, except the linked chunk
stores, whose rules are in ``_linked``.
"""

from layouts.hdf5._bound import size_bound
from layouts.hdf5._filters import check_for_hdf5, filter_classes, pipeline, stored_limit
from layouts.hdf5._image import ChunkPart, FileImage, build_image, external_ok
from layouts.hdf5._inflate import (
    MAX_VLEN_CHUNK_BYTES,
    blosc_sizes,
    bunzip2,
    gunzip,
    inflate,
    unblosc,
    unlz4,
    unxz,
    unzstd,
)
from layouts.hdf5._linked import (
    ChunkedRefStore,
    ChunkMap,
    ContiguousRefStore,
    LinkedFiles,
    LinkedSpec,
    Piece,
    location,
)
from layouts.hdf5._plan import AttrPlan, Bound, LinkPlan, ObjPlan, PlanRef, Skeleton
from layouts.hdf5._types import MAX_TYPE_DEPTH, HType, element_type, parse_type, parsed_type

__all__ = [
    "MAX_TYPE_DEPTH",
    "MAX_VLEN_CHUNK_BYTES",
    "AttrPlan",
    "Bound",
    "ChunkMap",
    "ChunkPart",
    "ChunkedRefStore",
    "ContiguousRefStore",
    "FileImage",
    "HType",
    "LinkPlan",
    "LinkedFiles",
    "LinkedSpec",
    "ObjPlan",
    "Piece",
    "PlanRef",
    "Skeleton",
    "blosc_sizes",
    "build_image",
    "bunzip2",
    "check_for_hdf5",
    "element_type",
    "external_ok",
    "filter_classes",
    "gunzip",
    "inflate",
    "location",
    "parse_type",
    "parsed_type",
    "pipeline",
    "size_bound",
    "stored_limit",
    "unblosc",
    "unlz4",
    "unxz",
    "unzstd",
]
