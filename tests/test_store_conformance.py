"""One behaviour for every ``Store``: the same content read through each backend.

``BACKENDS`` names a builder per backend; each builder gets the pytest request
and the directory of reference content and returns a ``Backend``: a way to
open the store (an async context manager, entered inside each test's
``trio.run``) and a way to replace an object behind its back. To run the whole
class over another store (a cache wrapped around S3, say), add a builder.

The HTTP backends serve the same files from ``tests/http_server.py``: as a
full server (ranges, ETags), behind the block cache, and as a plain server
(no Range support, no ETags), so the client's fallbacks give the same answers. HTTP has no
listing, so for them (``lists = False``) the listing tests check that every
listing call fails with ``StorageError`` instead.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Protocol

import pytest
import trio

from layouts.storage import ByteRange, Store
from mountd.errors import Changed, NotFound, StorageError
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.http import HttpOptions, open_http
from mountd.io.local import LocalStore
from mountd.io.s3 import S3Options, open_s3
from tests.http_server import RangeHttpServer
from tests.moto_server import MotoServer

#: More keys than one S3 listing page (1000) under one prefix.
MANY = 1100
MANY_DIRS = 3
BUCKET = "conformance"
#: Everything in the S3 backend lives below this prefix; ``OUTSIDE`` is next to it.
PREFIX = "root/"
OUTSIDE = "outside.bin"

A = random.Random(7).randbytes(5000)
FILES: dict[str, bytes] = {
    "a.bin": A,
    "empty.bin": b"",
    "mutable.bin": b"first version",
    "dir/x.txt": b"x" * 10,
    "dir/sub/y.txt": b"yy",
    "dir/sub/deeper/z.txt": b"zzz",
    **{f"many/k{i:04d}": str(i).encode() for i in range(MANY)},
    **{f"many/d{j}/f": b"f" for j in range(MANY_DIRS)},
}
MANY_NAMES = {f"many/k{i:04d}" for i in range(MANY)} | {f"many/d{j}/" for j in range(MANY_DIRS)}


@contextmanager
def aws_environment(moto: MotoServer, scratch: Path) -> Iterator[None]:
    """AWS variables for ``moto`` only: no user config files, profile or instance metadata."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("AWS_"):
                mp.delenv(name)
        for name, value in moto.env().items():
            mp.setenv(name, value)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv("AWS_CONFIG_FILE", str(scratch / "no-config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(scratch / "no-credentials"))
        yield


class Backend(Protocol):
    """A store over ``FILES``, and a way to overwrite one object behind it;
    ``lists`` says whether the store can list."""

    lists: bool

    def open(self) -> AbstractAsyncContextManager[Store]: ...

    def put(self, key: str, data: bytes) -> None: ...


class LocalBackend:
    lists = True

    def __init__(self, root: Path) -> None:
        self.root = root

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Store]:
        yield LocalStore(self.root)

    def put(self, key: str, data: bytes) -> None:
        (self.root / key).write_bytes(data)


class S3Backend:
    lists = True

    def __init__(self, moto: MotoServer, bucket: str, prefix: str) -> None:
        self.moto = moto
        self.bucket = bucket
        self.prefix = prefix

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Store]:
        async with open_s3(S3Options(endpoint_url=self.moto.endpoint, timeout=20)) as conn:
            yield conn.store(self.bucket, self.prefix)

    def put(self, key: str, data: bytes) -> None:
        self.moto.client().put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)


class HttpBackend:
    lists = False

    def __init__(self, server: RangeHttpServer) -> None:
        self.server = server

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Store]:
        async with open_http(HttpOptions(timeout=20)) as conn:
            yield conn.store(self.server.url)

    def put(self, key: str, data: bytes) -> None:
        (self.server.root / key).write_bytes(data)


def _write(root: Path) -> Path:
    for key, data in FILES.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def local_backend(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    return LocalBackend(_write(tmp / "local"))


def s3_backend(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    moto = request.getfixturevalue("moto")
    request.getfixturevalue("aws_env")
    moto.create_bucket(BUCKET)
    moto.upload_dir(_write(tmp / "s3"), BUCKET, PREFIX)
    moto.client().put_object(Bucket=BUCKET, Key=OUTSIDE, Body=b"not in the store")
    return S3Backend(moto, BUCKET, PREFIX)


class CachedS3Backend(S3Backend):
    """The S3 store behind the block cache, trusting nothing it cached (``validate_ttl=0``):
    every answer must be what S3 holds now, an overwritten object included."""

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Store]:
        async with super().open() as inner:
            yield CachedStore(inner, BlockCache(1 << 20, validate_ttl=0, block_size=16))


def cached_s3_backend(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    plain = s3_backend(request, tmp)
    assert isinstance(plain, S3Backend)
    return CachedS3Backend(plain.moto, plain.bucket, plain.prefix)


class CachedHttpBackend(HttpBackend):
    """The HTTP store behind the block cache, trusting nothing it cached (``validate_ttl=0``)."""

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Store]:
        async with super().open() as inner:
            yield CachedStore(inner, BlockCache(1 << 20, validate_ttl=0, block_size=16))


def http_backend(request: pytest.FixtureRequest, tmp: Path, **options: bool) -> Backend:
    server = RangeHttpServer(_write(tmp / "http"), **options)
    server.start()
    request.addfinalizer(server.stop)
    return HttpBackend(server)


def plain_http_backend(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    return http_backend(request, tmp, etags=False, ranges=False)


def cached_http_backend(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    plain = http_backend(request, tmp)
    assert isinstance(plain, HttpBackend)
    return CachedHttpBackend(plain.server)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "local": local_backend,
    "s3": s3_backend,
    "cached-s3": cached_s3_backend,
    "http": http_backend,
    "http-plain": plain_http_backend,
    "cached-http": cached_http_backend,
}


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="module")
def aws_env(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with aws_environment(moto, tmp_path_factory.mktemp("aws")):
        yield


@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=() if name == "local" else pytest.mark.server)
    for name in sorted(BACKENDS)])
def backend(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Backend:
    return BACKENDS[request.param](request, tmp_path_factory.mktemp(request.param))


def run(backend: Backend, test: Callable[[Store], Awaitable[None]]) -> None:
    async def main() -> None:
        async with backend.open() as store:
            await test(store)
    trio.run(main)


async def collect(items: AsyncIterator[str]) -> list[str]:
    return [item async for item in items]


async def cannot_list(store: Store, prefix: str) -> None:
    """Every listing call on ``prefix`` fails with ``StorageError`` (HTTP cannot list)."""
    with pytest.raises(StorageError, match="cannot list"):
        await store.list_dir(prefix)
    with pytest.raises(StorageError, match="cannot list"):
        await collect(store.iter_dir(prefix))
    with pytest.raises(StorageError, match="cannot list"):
        await store.list_tree(prefix, lambda key: True, 10)


async def take(items: AsyncIterator[str], limit: int) -> list[str]:
    """The first ``limit`` items, reading no further; closes the iterator."""
    taken: list[str] = []
    async with aclosing(items):  # type: ignore[type-var]
        async for item in items:
            taken.append(item)
            if len(taken) == limit:
                break
    return taken


class TestStoreConformance:
    def test_url(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            assert "://" in store.url
        run(backend, test)

    def test_get_whole_and_ranges(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            assert await store.get("a.bin") == A
            assert await store.get("a.bin", ByteRange(0, 10)) == A[:10]
            assert await store.get("a.bin", ByteRange(100)) == A[100:]
            assert await store.get("a.bin", ByteRange(1234, 1000)) == A[1234:2234]
            assert await store.get("a.bin", ByteRange(4990, 100)) == A[4990:]
            assert await store.get("a.bin", ByteRange(5000, 10)) == b""
            assert await store.get("a.bin", ByteRange(6000)) == b""
            assert await store.get("a.bin", ByteRange(10, 0)) == b""
            assert await store.get("empty.bin") == b""
            assert await store.get("empty.bin", ByteRange(0, 10)) == b""
            assert await store.get("dir/sub/deeper/z.txt") == b"zzz"
        run(backend, test)

    def test_fetch_info_equals_head(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            info = await store.head("a.bin")
            assert info.size == len(A) and info.etag
            for byte_range in (None, ByteRange(0), ByteRange(10, 20), ByteRange(4990, 100),
                               ByteRange(5000, 1), ByteRange(9000)):
                fetched = await store.fetch("a.bin", byte_range)
                assert fetched.info == info, byte_range
            fetched = await store.fetch("a.bin", ByteRange(10, 20), if_match=info.etag)
            assert fetched.data == A[10:30] and fetched.info == info
            empty = await store.fetch("empty.bin", ByteRange(0, 5))
            assert empty.data == b"" and empty.info == await store.head("empty.bin")
            assert empty.info.size == 0
        run(backend, test)

    def test_if_match_after_overwrite(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            old = await store.head("mutable.bin")
            assert (await store.fetch("mutable.bin", if_match=old.etag)).data == b"first version"
            await trio.to_thread.run_sync(backend.put, "mutable.bin", b"second, longer version")
            with pytest.raises(Changed):
                await store.fetch("mutable.bin", ByteRange(0, 5), if_match=old.etag)
            with pytest.raises(Changed):
                await store.fetch("mutable.bin", ByteRange(1000), if_match=old.etag)
            new = await store.fetch("mutable.bin")
            assert new.data == b"second, longer version" and new.info.etag != old.etag
            assert new.info == await store.head("mutable.bin")
            again = await store.fetch("mutable.bin", ByteRange(8, 6), if_match=new.info.etag)
            assert again.data == b"longer"
        run(backend, test)

    def test_not_found(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            for key in ("nope", "dir/nope.txt", "dir", "dir/"):
                with pytest.raises(NotFound):
                    await store.get(key)
                with pytest.raises(NotFound):
                    await store.fetch(key, ByteRange(0, 10))
                with pytest.raises(NotFound):
                    await store.head(key)
                assert not await store.exists(key)
            for prefix in ("nope/", "a.bin/", "dir/nope/"):
                if not backend.lists:  # no listing over HTTP: not even of a missing prefix
                    await cannot_list(store, prefix)
                    continue
                with pytest.raises(NotFound):
                    await store.list_dir(prefix)
                with pytest.raises(NotFound):
                    await collect(store.iter_dir(prefix))
                assert await store.list_tree(prefix, lambda key: True, 10) == []
        run(backend, test)

    def test_exists(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            for key in ("a.bin", "empty.bin", "dir/x.txt", "many/k0999", "many/d1/f"):
                assert await store.exists(key), key
        run(backend, test)

    def test_list_dir(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            if not backend.lists:  # HTTP servers have no listing to test
                for prefix in ("", "dir/", "many/"):
                    await cannot_list(store, prefix)
                return
            top = await store.list_dir("")
            assert sorted(top.prefixes) == ["dir/", "many/"]
            assert sorted(top.keys) == ["a.bin", "empty.bin", "mutable.bin"]
            sub = await store.list_dir("dir/")
            assert (sub.prefixes, sub.keys) == (["dir/sub/"], ["dir/x.txt"])
            many = await store.list_dir("many/")
            assert set(many.keys) | set(many.prefixes) == MANY_NAMES
            assert len(many.keys) == MANY and len(many.prefixes) == MANY_DIRS
        run(backend, test)

    def test_iter_dir_pages(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            if not backend.lists:  # HTTP servers have no listing to test
                for prefix in ("", "dir/", "many/"):
                    await cannot_list(store, prefix)
                return
            names = await collect(store.iter_dir("many/"))
            assert len(names) == len(set(names)) == len(MANY_NAMES)
            assert set(names) == MANY_NAMES
            top = await collect(store.iter_dir(""))
            assert sorted(top) == ["a.bin", "dir/", "empty.bin", "many/", "mutable.bin"]
            first = await take(store.iter_dir("many/"), 5)
            assert len(first) == 5 and set(first) <= MANY_NAMES
        run(backend, test)

    def test_list_tree(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            if not backend.lists:  # HTTP servers have no listing to test
                for prefix in ("", "dir/", "many/"):
                    await cannot_list(store, prefix)
                return

            def texts(key: str) -> bool:
                return key.endswith(".txt")

            found = await store.list_tree("", texts, len(FILES))
            assert found is not None
            infos = dict(found)
            assert len(found) == len(infos) and set(infos) == set(FILES)
            for key, info in infos.items():
                if texts(key):  # asked for: as a HEAD gives it, time included
                    assert info == await store.head(key), key
                elif info is not None:  # given anyway (an S3 listing carries it)
                    assert info.size == (await store.head(key)).size, key
            deeper = await store.list_tree("dir/", texts, 10)
            assert deeper is not None and sorted(key for key, _ in deeper) == [
                "dir/sub/deeper/z.txt", "dir/sub/y.txt", "dir/x.txt"]
            many = await store.list_tree("many/", texts, MANY + MANY_DIRS)
            assert many is not None and len({key for key, _ in many}) == MANY + MANY_DIRS
            # more keys than allowed: no listing at all
            assert await store.list_tree("many/", texts, MANY) is None
        run(backend, test)

    def test_concurrent_reads(self, backend: Backend) -> None:
        async def test(store: Store) -> None:
            results: dict[int, bytes] = {}

            async def read(i: int) -> None:
                results[i] = await store.get("a.bin", ByteRange(i * 97, 200))

            async with trio.open_nursery() as nursery:
                for i in range(40):
                    nursery.start_soon(read, i)
            assert results == {i: A[i * 97:i * 97 + 200] for i in range(40)}
        run(backend, test)
