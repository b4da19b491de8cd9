"""Storage formats and conventions: everything that knows HDF5 and its stores,
and nothing of FUSE or of the daemon (``layouts`` never imports ``mountd``).

Owns, at its top level, the ports the daemon and the formats meet at: the
HDF5 object model (``model``), the Store protocol (``storage``), what the
daemon lends a format while it opens a source (``places``), the error types
(``errors``), the masking of secrets in URLs (``redact``), the bounds
hostile metadata is held to (``bounds``), the decode limiter (``decoding``)
and bounded fan-out keeping each outcome (``gather``).
Subpackages: ``hdf5`` (HDF5's own machinery), ``formats`` (HSDS buckets, and
LINDI and kerchunk reference files, each with ``probe_place`` and
``open_place``) and ``views`` (the view API, the generic views and the
anndata and LEGEND conventions).
"""
