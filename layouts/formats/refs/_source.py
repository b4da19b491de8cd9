"""A LINDI or kerchunk reference file as a source: its ``probe`` and ``open``.

Owns joining the reference-file modules into one catalog for
``layouts.formats``: the file is read by ``layouts.formats.refs._table``, its keys
indexed by ``layouts.formats.refs._catalog.RefCatalog``, and its external arrays read by
``layouts.formats.refs._external``. A file is taken whatever it holds, since its
content alone says which kind it is and what is wrong with it (``open`` then
refuses it with one line); a directory is taken when it holds ``lindi.json``
(a ``.lindi.d``). Refs are read through the second opener the ``Host``
gives, which applies the daemon's rule of what a source may read, and
decoded chunks are kept in the host's ``decoded_cache`` (asked for after
``url_openers``, which makes the block cache it keeps them for).

Concurrency: called by the one task that opens the source. Indexing the
keys takes about 0.3 s per million refs, so it runs in a worker thread.
"""

from __future__ import annotations

import logging
from functools import partial

import trio

from layouts.errors import LayoutError, NotFound, SourceError
from layouts.formats.refs._catalog import RefCatalog
from layouts.formats.refs._external import H5ExternalArrays
from layouts.formats.refs._table import LINDI_JSON, RefFormatError, load_reference
from layouts.places import Host, Place, PlaceKind

log = logging.getLogger(__name__)


async def probe_place(place: Place) -> bool:
    """True for a file or URL, and for a directory that holds ``lindi.json``."""
    if place.kind is PlaceKind.FILE:
        return True
    return place.store is not None and await place.store.exists(LINDI_JSON)


async def open_place(place: Place, host: Host) -> RefCatalog:
    """The catalog of the reference file (or ``.lindi.d``) at ``place``; ``SourceError``
    if it is not one, cannot be read, or ``--domain`` was given."""
    source = place.location
    if host.domain is not None:
        raise SourceError(f"{source}: --domain applies to HSDS buckets, not reference files")
    loader, open_uri = await host.url_openers()
    try:
        table = await load_reference(source, loader, is_dir=place.kind is PlaceKind.DIRECTORY)
    except RefFormatError as exc:
        raise SourceError(str(exc)) from exc
    except NotFound:
        raise SourceError(f"{source}: not found") from None
    except LayoutError as exc:
        raise SourceError(f"{source}: cannot read: {exc}") from exc
    catalog = await trio.to_thread.run_sync(partial(
        RefCatalog, table, open_uri, H5ExternalArrays(open_uri), host.max_metadata,
        decoded=host.decoded_cache))
    log.info("mounted %s reference file %s (%d refs)", table.kind, table.location,
             len(table.refs))
    return catalog
