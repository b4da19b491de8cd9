"""Which kind of source a SOURCE argument is, and the catalog that reads it.

Owns source detection (by content, not only by name) and the construction of
the store and layout for it. Called once before mounting, so an unknown or
unreadable source is refused with one clear message (``SourceError``).
"""

from __future__ import annotations

import logging
import os

from layouts.hsds import HsdsCatalog, probe
from layouts.model import Catalog
from mountd.errors import MountError, NotFound, SourceError
from mountd.io.local import LocalStore

log = logging.getLogger(__name__)


def _domain_path(domain: str) -> str:
    path = domain.strip("/")
    if not path:
        raise SourceError("--domain needs a domain path such as /home/user/file.h5")
    return path


async def open_source(source: str, domain: str | None = None) -> Catalog:
    """The catalog for ``source``; raises SourceError if it cannot be mounted."""
    if "://" in source:
        scheme = source.split("://", 1)[0]
        raise SourceError(f"{source}: {scheme}:// sources are not supported yet")
    if not os.path.exists(source):
        raise SourceError(f"{source}: no such file or directory")
    if not os.path.isdir(source):
        raise SourceError(f"{source}: not an HSDS bucket directory")
    store = LocalStore(source)
    try:
        is_bucket = await probe(store)
    except MountError as exc:
        raise SourceError(f"{source}: cannot read: {exc}") from exc
    if not is_bucket:
        raise SourceError(f"{source}: not an HSDS bucket (no db/ and no domain folders)")
    catalog = HsdsCatalog(store, single_domain=None if domain is None else _domain_path(domain))
    if domain is not None:
        try:
            found = await catalog.domain(_domain_path(domain))
        except NotFound:
            raise SourceError(f"{source}: no such domain {domain}") from None
        except MountError as exc:
            raise SourceError(f"{source}: domain {domain}: {exc}") from exc
        if found is None or found.root_id is None:
            raise SourceError(f"{source}: {domain} is a folder, not a domain with a root group")
    return catalog
