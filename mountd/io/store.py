"""The storage seam: what every backend (local directory, S3, HTTP) offers.

A ``Store`` maps string keys (never starting with ``/``) to byte objects. It
knows nothing about HDF5. Missing keys raise ``NotFound``; an object that no
longer has the validator a caller asked for raises ``Changed``; any other
failure raises ``StorageError`` naming the key. Implementations must be safe
to call from many trio tasks at once; they hold no per-call state.

``fetch`` is the primitive the block cache builds on: one read that also says
what the whole object is (size and validator), so a first read needs no
separate ``head``. Listings come two ways: ``list_dir`` for small levels
(folders, partitions) and ``iter_dir`` for levels that may be huge (the chunk
keys of one dataset), which yields page by page and never holds them all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ByteRange:
    """``length`` bytes starting at ``start``; ``length=None`` reads to the end."""

    start: int
    length: int | None = None


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``head`` returns: size, and a validator that changes when the object does."""

    size: int
    etag: str
    mtime: float


@dataclass(frozen=True, slots=True)
class Fetched:
    """What ``fetch`` returns: the bytes read, and size and validator of the whole object."""

    data: bytes
    info: ObjectInfo


@dataclass(frozen=True, slots=True)
class Listing:
    """One level of a delimited listing: sub-prefixes (ending in ``/``) and keys."""

    prefixes: list[str]
    keys: list[str]


class Store(Protocol):
    """Read-only access to objects by key."""

    @property
    def url(self) -> str:
        """Where this store reads from, for logs and messages."""
        ...

    async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        """The object's bytes, or the requested range of them."""
        ...

    async def fetch(self, key: str, byte_range: ByteRange | None = None,
                    if_match: str | None = None) -> Fetched:
        """Like ``get``, plus the object's ``ObjectInfo``. With ``if_match``, raise
        ``Changed`` unless the object's etag is still ``if_match``. A range
        reaching past the end is cut at the end."""
        ...

    async def head(self, key: str) -> ObjectInfo:
        """Size and validator of one object."""
        ...

    async def exists(self, key: str) -> bool:
        """True if ``key`` names an object."""
        ...

    async def list_dir(self, prefix: str) -> Listing:
        """Immediate children of ``prefix`` (which is ``""`` or ends in ``/``)."""
        ...

    def iter_dir(self, prefix: str) -> AsyncIterator[str]:
        """Immediate children of ``prefix`` as ``list_dir`` gives them (keys, and
        sub-prefixes ending in ``/``), lazily, a page at a time, in no promised order."""
        ...

    def iter_keys(self, prefix: str) -> AsyncIterator[str]:
        """Every key under ``prefix`` at any depth, lazily, in no promised order."""
        ...
