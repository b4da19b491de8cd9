"""LINDI and kerchunk reference files: JSON that maps Zarr keys to inline data
or to byte ranges of HDF5 files, as a ``Catalog``.

Owns reading the file into a table of refs (``_table``), the catalog over its
keys (``_catalog``), Zarr metadata as model types (``_types``), decoding
chunks (``_codecs``), LINDI's external array links (``_external``), and the
source entry points (``_source``). The registry (``layouts.formats``) calls
``probe_place`` and ``open_place``; nothing outside this package imports its
modules.

Concurrency: see ``_source`` and ``_catalog``.
"""

from layouts.formats.refs._source import open_place, probe_place

__all__ = ["open_place", "probe_place"]
