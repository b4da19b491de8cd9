"""The storage seam: what every backend (local directory, S3, HTTP) offers.

A ``Store`` maps string keys (never starting with ``/``) to byte objects. It
knows nothing about HDF5. Missing keys raise ``NotFound``; an object that no
longer has the validator a caller asked for raises ``Changed``; any other
failure raises ``StorageError`` naming the key. Implementations must be safe
to call from many trio tasks at once; they hold no per-call state.

``fetch`` is the primitive the block cache builds on: one read that also says
what the whole object is (size and validator), so a first read needs no
separate ``head``. ``get_many`` reads many small objects (metadata JSON) in
one call where the backend can do better than one ``get`` each. Listings
come two ways: ``list_dir`` for small levels (folders, partitions) and
``iter_dir`` for levels that may be huge (the chunk keys of one dataset),
which yields page by page and never holds them all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from mountd.errors import MountError
from mountd.gather import outcomes

#: Keys fetched at once by ``get_many`` over a store that has no batch read.
GET_MANY_CONCURRENCY = 64


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


async def get_many(store: Store, keys: Sequence[str]) -> list[bytes | MountError]:
    """The bytes of each key, or the ``MountError`` reading it raised, in order.

    A store with a ``get_many`` method of its own (the local directory reads a
    whole batch in one worker thread) answers it; any other gets its keys read
    with ``GET_MANY_CONCURRENCY`` concurrent ``get`` calls.
    """
    batch = getattr(store, "get_many", None)
    if batch is not None:
        results: list[bytes | MountError] = await batch(keys)
        return results
    return await outcomes(store.get, keys, GET_MANY_CONCURRENCY)
