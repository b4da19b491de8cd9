"""The HSDS format: a bucket of the HDF Group's object-storage schema, as a ``Catalog``.

Owns everything that knows HSDS's keys and JSON: the catalog (``_catalog``),
object ids and keys (``_ids``), values (``_values``), chunks (``_chunks``,
``_linked``, ``_locations``), a domain's listing (``_listing``), its summaries
(``_summary``) and the index that loads a domain at a time (``_domains``);
the JSON-to-model builder both sources share (``_objects``), and the catalog
of an HSDS service endpoint, read over its REST API (``_service``).
The registry (``layouts.formats``) calls ``probe_place`` and ``open_place``
for a bucket, and ``service.probe_place`` and ``service.open_place`` for an endpoint;
nothing outside this package imports its modules.

Concurrency: see ``_catalog`` and ``_domains``.
"""

from layouts.formats.hsds import _service as service
from layouts.formats.hsds._catalog import open_place, probe_place

__all__ = ["open_place", "probe_place", "service"]
