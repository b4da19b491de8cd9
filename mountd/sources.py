"""Which kind of place a SOURCE argument names, and the catalog that reads it.

Owns turning SOURCE into a ``layouts.places.Place`` (by its scheme, and for a
local path whether it is a directory; an http(s) URL with no path, or any
SOURCE with ``-o endpoint``, is an HSDS service, read through
``mountd.io.hsservice`` with the credentials ``mountd.hscredentials`` finds),
the stores and openers for it, and
their lifetime: ``open_source`` is an async context manager because an S3 or
HTTP client must stay open while the mount is served. Which format the place
holds is not decided here: ``layouts.formats.FORMATS`` is walked in order and
the first format whose ``probe`` claims the place opens it, given a ``Host``
(``_Host``) that lends it what only the daemon has. It runs once before
mounting, so an unknown or unreadable source is refused with one clear
message (``SourceError``).

Remote objects are read through one ``BlockCache`` shared by every store of
the mount: the bucket itself, the HDF5 files that linked datasets point
into (``file_uri``), and the http(s) URLs a reference file's refs name (one
cache entry per URL, so two reference files into one HDF5 file share
blocks). Local files are read from disk directly; the page cache serves them.
The daemon gives the cache its background nursery. With ``-o cache_decoded``
the formats are also lent a ``DecodedDiskCache`` over that block cache
(``_Host.decoded_cache``), which keeps decoded chunks of its stores in
``cache_dir``, and ``DiskRecords`` (``_Host.records``), where a format keeps
records about its remote stores across mounts (an HSDS domain's listing).

``Source.refresh`` (the daemon's SIGHUP, with the catalog cache's ``drop``)
reads again what the source keeps besides the catalog's answers: an S3
source's AWS credentials (``S3Connection.reread_credentials``), the HSDS
domain key indexes (dropped by the catalog cache's ``drop``), and whether cached
blocks are current (``BlockCache.expire``: the next read that would serve an
object's cached blocks asks storage first, with a ``head``). A LINDI or
kerchunk reference file is not read again: the catalog is made from it
once, at the start.

The security rule for reference files lives here, in their ``OpenUri``: a
reference file fetched over http(s) may only read http(s) URLs; a local path
or ``file://`` ref in it is refused with ``Forbidden`` (EACCES, logged once
per location) unless ``-o allow_local_refs``. Other schemes are refused.

Concurrency: the ``OpenUri`` resolvers only build and memoise store objects
(no ``await``), so tasks may call them freely. A ``_Host`` is used by the one
task opening the source. ``refresh`` awaits only the credentials; everything
else it drops in one section without an ``await`` after them, so later
requests are signed with the new credentials. A block-cache ``head`` under way
at a refresh counts as made after it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from layouts.formats import FORMATS
from layouts.model import Catalog
from layouts.places import Place, PlaceKind
from layouts.storage import OpenUri, Store
from mountd.config import MountConfig
from mountd.errors import Forbidden, MountError, SourceError, StorageError
from mountd.hscredentials import credentials
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.decodedcache import DecodedDiskCache
from mountd.io.diskcache import DiskCache
from mountd.io.hsservice import ServiceOptions, endpoint_url, open_service
from mountd.io.http import HttpConnection, HttpOptions, open_http
from mountd.io.local import LocalStore
from mountd.io.records import DiskRecords

if TYPE_CHECKING:
    from mountd.io.s3 import S3Connection

log = logging.getLogger(__name__)


@dataclass
class Source:
    """An opened source: its catalog, the block cache of its remote reads (if any),
    and the S3 client of an S3 source."""

    catalog: Catalog
    block_cache: BlockCache | None = None
    s3: S3Connection | None = None

    async def refresh(self) -> None:
        """Read again what the source keeps (SIGHUP): the S3 credentials first, then
        expire the block cache's validations. The catalog's own indexes go with the
        catalog cache's ``drop``, which the daemon calls next, with no await between."""
        if self.s3 is not None:
            await self.s3.reread_credentials()
        if self.block_cache is not None:
            self.block_cache.expire()


@asynccontextmanager
async def open_source(config: MountConfig) -> AsyncIterator[Source]:
    """The opened source of ``config``; raises SourceError if it cannot be mounted."""
    source = config.source
    if source.startswith("s3://"):
        async with _open_s3(config) as opened:
            yield opened
        return
    if config.endpoint is not None or is_endpoint(source):
        async with _open_service(config) as opened:
            yield opened
        return
    remote = source.startswith(("http://", "https://"))
    if not remote and "://" in source:
        scheme = source.split("://", 1)[0]
        raise SourceError(f"{source}: {scheme}:// sources are not supported")
    if not remote and not os.path.exists(source):
        raise SourceError(f"{source}: no such file or directory")
    # With cache_dir, the disk cache is there from the start: view sizes are kept
    # in it (mountd.tree.sizerecords) even where no remote block is ever read.
    cache = await _block_cache(config) if config.cache_dir is not None else None
    async with AsyncExitStack() as stack:
        if remote or not os.path.isdir(source):
            host = _Host(config, stack, cache=cache)
            place = Place(source, PlaceKind.FILE)
        else:
            host = _Host(config, stack, storage=_posix_opener(source), cache=cache)
            place = Place(source, PlaceKind.DIRECTORY, LocalStore(source))
        catalog = await _open(place, host)
        yield Source(catalog, host.cache)


@asynccontextmanager
async def _open_s3(config: MountConfig) -> AsyncIterator[Source]:
    # aiobotocore takes a third of a second to import: only S3 mounts pay for it.
    from mountd.io.s3 import S3Options, open_s3, parse_s3_url  # noqa: PLC0415

    bucket, prefix = parse_s3_url(config.source)
    options = S3Options(endpoint_url=config.endpoint_url, region=config.region,
                        profile=config.profile, anon=config.anon, timeout=config.timeout)
    cache = await _block_cache(config)
    async with open_s3(options) as connection, AsyncExitStack() as stack:
        store = CachedStore(connection.store(bucket, prefix), cache)
        host = _Host(config, stack, storage=_s3_opener(connection, cache), cache=cache)
        catalog = await _open(Place(config.source, PlaceKind.BUCKET, store), host)
        log.info("reading %s through a %d MiB block cache", store.url, config.cache_size >> 20)
        yield Source(catalog, cache, connection)


def is_endpoint(source: str) -> bool:
    """True if SOURCE names an HSDS service: an http(s) URL with no path (a
    reference file's URL always has one)."""
    parts = urlsplit(source)
    return parts.scheme.lower() in ("http", "https") and parts.path in ("", "/") \
        and not parts.query


@asynccontextmanager
async def _open_service(config: MountConfig) -> AsyncIterator[Source]:
    """An HSDS service: the endpoint SOURCE names, or ``-o endpoint`` with SOURCE the
    folder or domain path on it."""
    if config.endpoint is not None:
        endpoint, prefix = config.endpoint, config.source
        if "://" in prefix or not prefix.startswith("/"):
            raise SourceError(f"{prefix}: with -o endpoint, SOURCE is a folder or domain path "
                              "on the service, such as / or /home/user/")
    else:
        endpoint, prefix = config.source, ""
    endpoint = endpoint_url(endpoint)
    options = ServiceOptions(endpoint, credentials(config, endpoint), timeout=config.timeout,
                             max_metadata=config.max_metadata)
    async with open_service(options) as service, AsyncExitStack() as stack:
        host = _Host(config, stack)
        place = Place(config.source, PlaceKind.SERVICE, service=service,
                      prefix=prefix.strip("/"))
        catalog = await _open(place, host)
        who = options.credentials.username or ("an API key" if options.credentials.api_key
                                               else "no credentials")
        log.info("reading HSDS service %s as %s", endpoint, who)
        yield Source(catalog)


async def _open(place: Place, host: _Host) -> Catalog:
    """The catalog of the first format of ``FORMATS`` that claims ``place``."""
    formats = [fmt for fmt in FORMATS if place.kind in fmt.kinds]
    for fmt in formats:
        try:
            claimed = await fmt.probe(place)
        except MountError as exc:
            raise SourceError(f"{place.location}: cannot read: {exc}") from exc
        if claimed:
            log.debug("%s holds a %s", place.location, fmt.name)
            return await fmt.open(place, host)
    raise SourceError(f"{place.location}: {formats[-1].refusal}")


class _Host:
    """What a format may ask of the daemon while it opens a place (``layouts.places.Host``).

    ``storage`` opens what a directory's or bucket's objects name in its own
    storage (None for a file or URL, which no format asks it of). The block
    cache is made when the first remote store needs it (S3
    makes it first); the HTTP client ``url_openers`` opens is closed with
    ``stack``. The decoded-chunk cache is made over the block cache when first
    asked for, if ``-o cache_decoded`` and there is a block cache by then; the
    records likewise, if it has a disk cache (``-o cache_dir``).
    """

    def __init__(self, config: MountConfig, stack: AsyncExitStack, *,
                 storage: OpenUri | None = None, cache: BlockCache | None = None) -> None:
        self._config = config
        self._stack = stack
        self._storage = storage
        self.cache = cache
        self._decoded: DecodedDiskCache | None = None
        self._records: DiskRecords | None = None

    @property
    def domain(self) -> str | None:
        return self._config.domain

    @property
    def max_metadata(self) -> int:
        return self._config.max_metadata

    @property
    def metadata_ttl(self) -> float:
        return self._config.metadata_ttl

    @property
    def trust_summaries(self) -> bool:
        return self._config.hs_summaries

    @property
    def records(self) -> DiskRecords | None:
        if self._records is None and self.cache is not None and self.cache.disk is not None:
            self._records = DiskRecords(self.cache)
        return self._records

    @property
    def decoded_cache(self) -> DecodedDiskCache | None:
        if self._decoded is None and self._config.cache_decoded and self.cache is not None:
            self._decoded = DecodedDiskCache(self.cache)
        return self._decoded

    def storage_opener(self) -> OpenUri:
        assert self._storage is not None, "only directories and buckets have storage"
        return self._storage

    async def url_openers(self) -> tuple[OpenUri, OpenUri]:
        config = self._config
        if self.cache is None:
            self.cache = await _block_cache(config)
        cache = self.cache
        http = await self._stack.enter_async_context(
            open_http(HttpOptions(timeout=config.timeout)))
        # The reference file itself may be local; what its refs may read is decided here.
        loader = _ref_opener(http, cache, allow_local=True)
        remote = config.source.startswith(("http://", "https://"))
        if not remote or config.allow_local_refs:
            return loader, loader
        return loader, _ref_opener(http, cache, allow_local=False)


async def _block_cache(config: MountConfig) -> BlockCache:
    cache = BlockCache(config.cache_size, validate_ttl=config.metadata_ttl,
                       disk=_disk_cache(config))
    if cache.disk is not None:
        await cache.disk.load()
    return cache


def _ref_opener(http: HttpConnection, cache: BlockCache, *, allow_local: bool) -> OpenUri:
    """Where a reference file's refs are read: http(s) URLs through the block cache,
    local paths from disk when ``allow_local``, nothing else."""
    # Refs name host paths, so symlinks on the way are theirs to name as well.
    disk = LocalStore("/", follow_symlinks=True)
    stores: dict[str, CachedStore] = {}
    refused: set[str] = set()

    def open_uri(url: str) -> tuple[Store, str]:
        if url.startswith(("http://", "https://")):
            store, key = http.locate(url)
            cached = stores.get(store.url)
            if cached is None:
                cached = stores[store.url] = CachedStore(store, cache)
            return cached, key
        if "://" in url:
            raise StorageError(url, "refs may only name http(s) URLs and local paths")
        if not allow_local:
            if url not in refused:
                refused.add(url)
                log.warning("refused %s: a reference file fetched over http(s) may not read "
                            "local files (mount with -o allow_local_refs to allow it)", url)
            raise Forbidden(f"{url}: local file named by a remote reference file")
        return disk, os.path.normpath(url).lstrip("/")

    return open_uri


def _disk_cache(config: MountConfig) -> DiskCache | None:
    if config.cache_dir is None:
        return None
    try:
        os.makedirs(config.cache_dir, exist_ok=True)
    except OSError as exc:
        raise SourceError(f"cache_dir {config.cache_dir}: {exc.strerror}") from exc
    if not os.access(config.cache_dir, os.W_OK | os.X_OK):
        raise SourceError(f"cache_dir {config.cache_dir}: not writable")
    return DiskCache(config.cache_dir, config.disk_cache_size)


def _posix_opener(bucket_dir: str) -> OpenUri:
    """``file_uri`` of a POSIX bucket: ``BUCKET/path/file.h5`` below HSDS's ROOT_DIR,
    the parent of the mounted bucket directory. Nothing outside ROOT_DIR is read:
    like the bucket, it is read with no symlink followed (``LocalStore``)."""
    root = LocalStore(Path(bucket_dir).resolve().parent)

    def open_uri(uri: str) -> tuple[Store, str]:
        uri = uri.removeprefix("file://")
        if "://" in uri:
            raise StorageError(uri, f"a local bucket can only link to files below {root.root}")
        return root, uri.lstrip("/")

    return open_uri


def _s3_opener(connection: S3Connection, cache: BlockCache) -> OpenUri:
    """``file_uri`` of an S3 bucket: ``s3://bucket/key`` (or ``bucket/key``) on the same
    endpoint and credentials, read through the mount's block cache."""
    stores: dict[str, CachedStore] = {}

    def open_uri(uri: str) -> tuple[Store, str]:
        uri = uri.removeprefix("file://")
        if "://" in uri and not uri.startswith("s3://"):
            raise StorageError(uri, "an S3 bucket can only link to s3:// objects")
        bucket, _, key = uri.removeprefix("s3://").lstrip("/").partition("/")
        if not bucket or not key:
            raise StorageError(uri, "not an s3://BUCKET/KEY location")
        store = stores.get(bucket)
        if store is None:
            store = stores[bucket] = CachedStore(connection.store(bucket), cache)
        return store, key

    return open_uri
