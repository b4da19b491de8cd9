"""The storage port of ``layouts/``: what every backend (local directory, S3, HTTP) offers.

A ``Store`` maps string keys (never starting with ``/``) to byte objects. It
knows nothing about HDF5. The formats read through it; ``mountd.io``
implements it (imports run ``mountd`` -> ``layouts`` only). Missing keys
raise ``NotFound``; an object that no longer has the validator a caller
asked for raises ``Changed``; any other failure raises ``StorageError``
naming the key. Implementations must be safe to call from many trio tasks at
once; they hold no per-call state.

``fetch`` is the primitive the block cache builds on: one read that also says
what the whole object is (size, validator and last-modified time), so a first
read needs no separate ``head``. ``fetch_many`` reads many small objects
(metadata JSON) in one call where the backend can do better than one
``fetch`` each (``fetch_each`` is the plain way, for the backends that
cannot). Metadata objects are read capped (``fetch_capped``,
``fetch_many(limit=...)``): an object larger than the mount's
``-o max_metadata`` is refused with ``Corrupt`` before more than that many
bytes are read. Listings come three ways: ``list_dir`` for small levels
(folders, partitions), ``iter_dir`` for levels that may be huge (the chunk
keys of one dataset), which yields page by page and never holds them all,
and ``list_tree`` for every key under a prefix at once, with the
``ObjectInfo`` of the keys a caller asks about (one listing of a whole HSDS
domain, bounded by a number of keys).

``OpenUri`` is how a format reads a file its metadata names by URI (an HSDS
``file_uri``, a reference file's refs): the daemon gives a resolver from URI
to the store and key to read, and decides there what may be read at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from layouts.errors import Corrupt, LayoutError
from layouts.gather import outcomes

#: Keys fetched at once by ``fetch_each``, for a store that has no batch read.
GET_MANY_CONCURRENCY = 64
#: Largest metadata object (HSDS JSON, a reference file's ``.zattrs``) read by
#: default; ``-o max_metadata`` sets it.
DEFAULT_MAX_METADATA = 64 << 20
#: Bytes ``fetch_capped`` asks for first: every metadata object of a normal
#: bucket fits, so it is one read, and it is one block of the block cache.
CAPPED_FIRST_READ = 1 << 20


@dataclass(frozen=True, slots=True)
class ByteRange:
    """``length`` bytes starting at ``start``; ``length=None`` reads to the end."""

    start: int
    length: int | None = None


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``head`` returns: size, a validator that changes when the object
    does, and the time it was last written (seconds since the epoch, as the
    store keeps it: whole seconds on S3 and HTTP, the file's mtime on disk)."""

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

    async def list_tree(self, prefix: str, info_for: Callable[[str], bool],
                        limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
        """Every key under ``prefix`` at any depth, in no promised order, each with
        its ``ObjectInfo`` where ``info_for(key)`` asks for it (a store whose
        listings carry it anyway gives it for every key); None, and no more
        listed, once there are more than ``limit`` keys."""
        ...

    async def fetch_many(self, keys: Sequence[str],
                         limit: int | None = None) -> list[Fetched | LayoutError]:
        """``fetch`` of each whole object (``fetch_capped`` with a ``limit``), or the
        ``LayoutError`` it raised, in order."""
        ...


#: Resolves a URI to (store, key) to read it at. It is called without awaiting, so it
#: must not block, and raises ``StorageError`` (or ``Forbidden``) naming the URI to
#: refuse one.
OpenUri = Callable[[str], tuple[Store, str]]


def too_large(key: str, limit: int, size: int | None = None) -> Corrupt:
    """The error for a metadata object over ``limit`` bytes (of ``size``, if known)."""
    what = f"of {size} bytes, more" if size is not None else "of more"
    return Corrupt(key, f"metadata object {what} than max_metadata ({limit} bytes); not read "
                        "(mount with a larger -o max_metadata to read it)")


async def fetch_capped(store: Store, key: str, limit: int) -> Fetched:
    """The whole object at ``key`` and its info, or ``Corrupt`` if it holds more
    than ``limit`` bytes.

    Never more than ``limit + 1`` bytes are read. The first read asks for
    ``CAPPED_FIRST_READ`` bytes and learns the object's size with them, so
    only an object that fills it costs a second read (of at most the rest of
    ``limit + 1`` bytes), and one known to be too large costs none.
    """
    first = min(limit + 1, CAPPED_FIRST_READ)
    fetched = await store.fetch(key, ByteRange(0, first))
    if len(fetched.data) < first:
        return fetched
    if first > limit:
        raise too_large(key, limit)
    if fetched.info.size > limit:
        raise too_large(key, limit, fetched.info.size)
    rest = await store.get(key, ByteRange(first, limit + 1 - first))
    if first + len(rest) > limit:
        raise too_large(key, limit)
    return Fetched(fetched.data + rest, fetched.info)


async def fetch_each(store: Store, keys: Sequence[str],
                     limit: int | None = None) -> list[Fetched | LayoutError]:
    """``Store.fetch_many`` for a store with no batch read of its own: its keys
    read with ``GET_MANY_CONCURRENCY`` concurrent ``fetch`` (with a ``limit``,
    ``fetch_capped``) calls."""
    read = store.fetch if limit is None else partial(fetch_capped, store, limit=limit)
    return await outcomes(read, keys, GET_MANY_CONCURRENCY)
