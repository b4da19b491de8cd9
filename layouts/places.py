"""How a source reaches the formats: ``Place``, and what the daemon lends (``Host``).

A port of ``layouts/``. ``mountd.sources`` knows the schemes and builds the
stores: it turns the SOURCE argument into a ``Place``, walks
``layouts.formats.FORMATS`` with it, and implements ``Host`` for the format
that opens it. A format never learns which backend it reads, and the daemon
never learns which format a place holds.

Concurrency: a ``Place`` is immutable. A ``Host`` is used by the one task
that opens the source, before the mount is served; the openers it gives are
the ones the catalog keeps (``OpenUri``: safe from any task, never blocking).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from layouts.decoding import DecodedCache
from layouts.storage import OpenUri, Store


class PlaceKind(enum.Enum):
    """What the SOURCE argument names."""

    #: One object: a local file, or an http(s) URL (which cannot be listed).
    FILE = "file"
    #: A local directory, whose files are the keys of ``Place.store``.
    DIRECTORY = "directory"
    #: An object-store bucket or prefix (``s3://``), whose objects are the keys of
    #: ``Place.store``.
    BUCKET = "bucket"


@dataclass(frozen=True, slots=True)
class Place:
    """A source as the formats see it.

    ``location`` is the SOURCE argument as given (a path or a URL), which
    messages name; ``store`` reads what a DIRECTORY or BUCKET holds, by key,
    and is None for a FILE.
    """

    location: str
    kind: PlaceKind
    store: Store | None = None


class Host(Protocol):
    """What the daemon lends a format while it opens a place (``mountd.sources``)."""

    @property
    def domain(self) -> str | None:
        """The one domain to mount (``--domain``, as given), or None for all."""
        ...

    @property
    def max_metadata(self) -> int:
        """The largest metadata object read, in bytes (``-o max_metadata``)."""
        ...

    @property
    def metadata_ttl(self) -> float:
        """Seconds anything read from storage may be served (``-o metadata_ttl``)."""
        ...

    def storage_opener(self) -> OpenUri:
        """Opens the files that the objects of a DIRECTORY or BUCKET place name by
        URI in its own storage (an HSDS ``file_uri``), and nothing outside it."""
        ...

    async def url_openers(self) -> tuple[OpenUri, OpenUri]:
        """Two openers of http(s) URLs (through the mount's block cache) and local
        paths: the first reads the place itself, the second what its content
        names, under the daemon's rule of what a source may read (a remote one
        may not name local files)."""
        ...

    @property
    def decoded_cache(self) -> DecodedCache | None:
        """Where decoded chunks are kept across mounts (``-o cache_decoded``), or None.
        It keeps those of the stores read through the mount's block cache, so a
        format reading URLs asks for it after ``url_openers``."""
        ...
