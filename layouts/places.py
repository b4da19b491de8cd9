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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from layouts.decoding import DecodedCache
from layouts.service import Service
from layouts.storage import ObjectInfo, OpenUri, Store


class PlaceKind(enum.Enum):
    """What the SOURCE argument names."""

    #: One object: a local file, or an http(s) URL (which cannot be listed).
    FILE = "file"
    #: A local directory, whose files are the keys of ``Place.store``.
    DIRECTORY = "directory"
    #: An object-store bucket or prefix (``s3://``), whose objects are the keys of
    #: ``Place.store``.
    BUCKET = "bucket"
    #: An HSDS service endpoint, read through ``Place.service`` (its REST API).
    SERVICE = "service"


@dataclass(frozen=True, slots=True)
class Place:
    """A source as the formats see it.

    ``location`` is the SOURCE argument as given (a path or a URL), which
    messages name; ``store`` reads what a DIRECTORY or BUCKET holds, by key,
    and is None for a FILE; ``service`` answers the REST requests of a SERVICE,
    and ``prefix`` is the folder or domain path on it that SOURCE names
    (``""``: the whole service).
    """

    location: str
    kind: PlaceKind
    store: Store | None = None
    service: Service | None = None
    prefix: str = ""


class Records(Protocol):
    """Small records a format keeps about the objects of a remote store across
    mounts (in ``cache_dir``), and the validations they carry.

    A record is whatever bytes the format saves under a name of its choosing,
    per store; the format says what they mean and whether they are still
    current. ``vouch`` hands the daemon's caches what a listing made ``age``
    seconds ago showed of each object (size, validator), so cached bytes of
    those objects are served without asking storage until ``metadata_ttl``
    after that listing.
    """

    def keeps(self, store: Store) -> bool:
        """True if records are kept for ``store`` (the remote stores of the mount)."""
        ...

    async def load(self, store: Store, name: str) -> bytes | None:
        """The record ``name`` of ``store`` an earlier mount saved, or None."""
        ...

    async def save(self, store: Store, name: str, data: bytes) -> None:
        """Keep ``data`` as the record ``name`` of ``store``, written behind (it
        may be dropped when the disk is busy or full)."""
        ...

    async def vouch(self, store: Store, listed: Sequence[tuple[str, ObjectInfo | None]],
                    age: float) -> None:
        """Take ``listed`` as what ``store`` held ``age`` seconds ago."""
        ...


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

    @property
    def trust_summaries(self) -> bool:
        """True if a service's domain summaries may stand in for its objects
        although nothing proves them current (``-o hs_summaries``)."""
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
    def records(self) -> Records | None:
        """Where a format keeps records about its remote stores across mounts
        (``-o cache_dir``), or None."""
        ...

    @property
    def decoded_cache(self) -> DecodedCache | None:
        """Where decoded chunks are kept across mounts (``-o cache_decoded``), or None.
        It keeps those of the stores read through the mount's block cache, so a
        format reading URLs asks for it after ``url_openers``."""
        ...
