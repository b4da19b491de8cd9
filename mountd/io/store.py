"""The storage seam: what every backend (local directory, S3, HTTP) offers.

A ``Store`` maps string keys (never starting with ``/``) to immutable byte
objects. It knows nothing about HDF5. Missing keys raise ``NotFound``; any
other failure raises ``StorageError`` naming the key. Implementations must be
safe to call from many trio tasks at once; they hold no per-call state.
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

    async def head(self, key: str) -> ObjectInfo:
        """Size and validator of one object."""
        ...

    async def exists(self, key: str) -> bool:
        """True if ``key`` names an object."""
        ...

    async def list_dir(self, prefix: str) -> Listing:
        """Immediate children of ``prefix`` (which is ``""`` or ends in ``/``)."""
        ...

    def iter_keys(self, prefix: str) -> AsyncIterator[str]:
        """Every key under ``prefix`` at any depth, lazily, in no promised order."""
        ...
