"""Which kind of source a SOURCE argument is, and the catalog that reads it.

Owns source detection (by content, not only by name), the construction of the
stores and layout for it, and their lifetime: ``open_source`` is an async
context manager because an S3 client must stay open while the mount is
served. It runs once before mounting, so an unknown or unreadable source is
refused with one clear message (``SourceError``).

Remote objects are read through one ``BlockCache`` shared by every store of
the mount: the bucket itself, the HDF5 files that linked datasets point
into (``file_uri``), and the http(s) URLs a reference file's refs name (one
cache entry per URL, so two reference files into one HDF5 file share
blocks). Local files are read from disk directly; the page cache serves them.
The daemon gives the cache its background nursery.

The security rule for reference files lives here, in their ``OpenUri``: a
reference file fetched over http(s) may only read http(s) URLs; a local path
or ``file://`` ref in it is refused with ``Forbidden`` (EACCES, logged once
per location) unless ``-o allow_local_refs``. Other schemes are refused.

Concurrency: the ``OpenUri`` resolvers only build and memoise store objects
(no ``await``), so tasks may call them freely.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from layouts.hsds import HsdsCatalog, probe
from layouts.hsds_linked import OpenUri
from layouts.lindi import RefCatalog
from layouts.lindi_external import H5ExternalArrays
from layouts.lindi_refs import RefFormatError, load_reference
from layouts.model import Catalog
from mountd.config import MountConfig
from mountd.errors import Forbidden, MountError, NotFound, SourceError, StorageError
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.diskcache import DiskCache
from mountd.io.http import HttpConnection, HttpOptions, open_http
from mountd.io.local import LocalStore
from mountd.io.s3 import S3Connection, S3Options, open_s3, parse_s3_url
from mountd.io.store import Store

log = logging.getLogger(__name__)


@dataclass
class Source:
    """An opened source: its catalog, and the block cache of its remote reads (if any)."""

    catalog: Catalog
    block_cache: BlockCache | None = None


def _domain_path(domain: str) -> str:
    path = domain.strip("/")
    if not path:
        raise SourceError("--domain needs a domain path such as /home/user/file.h5")
    return path


@asynccontextmanager
async def open_source(config: MountConfig) -> AsyncIterator[Source]:
    """The opened source of ``config``; raises SourceError if it cannot be mounted."""
    source = config.source
    if source.startswith("s3://"):
        async with _open_s3(config) as opened:
            yield opened
        return
    if source.startswith(("http://", "https://")):
        async with _open_reference(config) as opened:
            yield opened
        return
    if "://" in source:
        scheme = source.split("://", 1)[0]
        raise SourceError(f"{source}: {scheme}:// sources are not supported")
    if not os.path.exists(source):
        raise SourceError(f"{source}: no such file or directory")
    if not os.path.isdir(source) or os.path.exists(os.path.join(source, "lindi.json")):
        async with _open_reference(config) as opened:
            yield opened
        return
    store = LocalStore(source)
    catalog = await _bucket_catalog(source, store, config, _posix_opener(source))
    yield Source(catalog)


@asynccontextmanager
async def _open_s3(config: MountConfig) -> AsyncIterator[Source]:
    bucket, prefix = parse_s3_url(config.source)
    options = S3Options(endpoint_url=config.endpoint_url, region=config.region,
                        profile=config.profile, anon=config.anon, timeout=config.timeout)
    cache = _block_cache(config)
    if cache.disk is not None:
        await cache.disk.load()
    async with open_s3(options) as connection:
        store = CachedStore(connection.store(bucket, prefix), cache)
        catalog = await _bucket_catalog(config.source, store, config,
                                        _s3_opener(connection, cache))
        log.info("reading %s through a %d MiB block cache", store.url, config.cache_size >> 20)
        yield Source(catalog, cache)


def _block_cache(config: MountConfig) -> BlockCache:
    return BlockCache(config.cache_size, validate_ttl=config.metadata_ttl,
                      disk=_disk_cache(config))


@asynccontextmanager
async def _open_reference(config: MountConfig) -> AsyncIterator[Source]:
    """A LINDI or kerchunk reference file (path, URL, ``.lindi.tar`` or ``.lindi.d``)."""
    source = config.source
    if config.domain is not None:
        raise SourceError(f"{source}: --domain applies to HSDS buckets, not reference files")
    remote = source.startswith(("http://", "https://"))
    cache = _block_cache(config)
    if cache.disk is not None:
        await cache.disk.load()
    async with open_http(HttpOptions(timeout=config.timeout)) as http:
        # The reference file itself may be local; what its refs may read is decided below.
        loader = _ref_opener(http, cache, allow_local=True)
        try:
            table = await load_reference(source, loader,
                                         is_dir=not remote and os.path.isdir(source))
        except RefFormatError as exc:
            raise SourceError(str(exc)) from exc
        except NotFound:
            raise SourceError(f"{source}: not found") from None
        except MountError as exc:
            raise SourceError(f"{source}: cannot read: {exc}") from exc
        open_uri = loader if not remote or config.allow_local_refs else \
            _ref_opener(http, cache, allow_local=False)
        # Indexing the keys takes about 0.3 s per million refs: off the trio loop.
        catalog = await trio.to_thread.run_sync(RefCatalog, table, open_uri,
                                                H5ExternalArrays(open_uri), config.max_metadata)
        log.info("mounted %s reference file %s (%d refs)", table.kind, table.location,
                 len(table.refs))
        yield Source(catalog, cache)


def _ref_opener(http: HttpConnection, cache: BlockCache, *, allow_local: bool) -> OpenUri:
    """Where a reference file's refs are read: http(s) URLs through the block cache,
    local paths from disk when ``allow_local``, nothing else."""
    disk = LocalStore("/")
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


async def _bucket_catalog(source: str, store: Store, config: MountConfig,
                          opener: OpenUri) -> HsdsCatalog:
    try:
        is_bucket = await probe(store)
    except MountError as exc:
        raise SourceError(f"{source}: cannot read: {exc}") from exc
    if not is_bucket:
        raise SourceError(f"{source}: not an HSDS bucket (no db/ and no domain folders)")
    domain = config.domain
    single = None if domain is None else _domain_path(domain)
    catalog = HsdsCatalog(store, single_domain=single, open_uri=opener,
                          max_metadata=config.max_metadata)
    if single is not None:
        try:
            found = await catalog.domain(single)
        except NotFound:
            raise SourceError(f"{source}: no such domain {domain}") from None
        except MountError as exc:
            raise SourceError(f"{source}: domain {domain}: {exc}") from exc
        if found is None or found.root_id is None:
            raise SourceError(f"{source}: {domain} is a folder, not a domain with a root group")
    return catalog


def _posix_opener(bucket_dir: str) -> OpenUri:
    """``file_uri`` of a POSIX bucket: ``BUCKET/path/file.h5`` below HSDS's ROOT_DIR,
    the parent of the mounted bucket directory. Nothing outside ROOT_DIR is read."""
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
