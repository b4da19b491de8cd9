"""HTTP-only behaviour of ``HttpStore`` against a real loopback server (``tests/http_server.py``).

Faults are real HTTP events made by ``tests/faultproxy.py`` in front of the
server (503s, resets, short bodies, stalls, 403s); the server's and the
proxy's records show what the store actually sent. The only timing
assertions are upper bounds: an operation ends within its ``timeout`` plus
a little slack.
"""

from __future__ import annotations

import http.client
import os
import random
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio

import mountd
from layouts.storage import ByteRange
from mountd.errors import Changed, NotFound, StorageError
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.http import HttpConnection, HttpOptions, HttpStore, open_http
from tests.faultproxy import FaultProxy
from tests.http_server import RangeHttpServer

DATA = random.Random(5).randbytes(300_000)
BIG = random.Random(6).randbytes(4 << 20)
OTHER = b"another object on the same server"
#: Seconds of budget for tests that fail on purpose; the slack allowed past it.
#: Every test here talks to a real Range HTTP server on loopback.
pytestmark = pytest.mark.server

SHORT = 3.0
SLACK = 2.0


def write_files(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "dir").mkdir()
    (root / "data" / "obj").write_bytes(DATA)
    (root / "data" / "big").write_bytes(BIG)
    (root / "data" / "other").write_bytes(OTHER)
    (root / "empty").write_bytes(b"")
    (root / "dir" / "x").write_bytes(b"x")
    (root / "a b.bin").write_bytes(b"spaced")
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_files(tmp_path_factory.mktemp("http"))


@pytest.fixture(scope="module")
def server_module(root: Path) -> Iterator[RangeHttpServer]:
    with RangeHttpServer(root) as server:
        yield server


@pytest.fixture
def server(server_module: RangeHttpServer) -> RangeHttpServer:
    server_module.clear()
    return server_module


@pytest.fixture(scope="module")
def proxy_module(server_module: RangeHttpServer) -> Iterator[FaultProxy]:
    with FaultProxy(server_module.url) as proxy:
        yield proxy


@pytest.fixture
def proxy(proxy_module: FaultProxy, server: RangeHttpServer) -> FaultProxy:
    proxy_module.clear()
    return proxy_module


def run(origin: str, test: Callable[[HttpStore], Awaitable[None]], **options: float) -> None:
    """``test(store)`` inside ``trio.run``, with a store for ``origin``."""
    async def main() -> None:
        async with open_http(HttpOptions(**options)) as conn:  # type: ignore[arg-type]
            await test(conn.store(origin))
    trio.run(main)


def run_conn(test: Callable[[HttpConnection], Awaitable[None]], **options: float) -> None:
    async def main() -> None:
        async with open_http(HttpOptions(**options)) as conn:  # type: ignore[arg-type]
            await test(conn)
    trio.run(main)


def statuses(server: RangeHttpServer) -> list[tuple[str, str | None, int]]:
    return [(method, rng, status) for method, _, rng, status in server.requests()]


def test_locate_and_store(server: RangeHttpServer) -> None:
    async def test(conn: HttpConnection) -> None:
        store = conn.store(server.url)
        assert store.url == server.url
        assert conn.store(server.url + "/") is store
        assert conn.store(server.url.upper().replace("HTTP://", "http://")) is store
        assert conn.locate(server.url_for("data/obj")) == (store, "data/obj")
        assert conn.locate(server.url + "/") == (store, "")
        spaced, key = conn.locate(f"{server.url}/a%20b.bin?x=1&y=%2F#frag")
        assert spaced is store and key == "a%20b.bin?x=1&y=%2F"
        assert await store.get(key) == b"spaced"
        other, _ = conn.locate("https://example.org:8443/x")
        assert other.url == "https://example.org:8443" and other is not store
        for bad in ("ftp://h/x", "file:///etc/passwd", "s3://bucket/key", "/local/path",
                    "relative/path", "http:///nohost", "http://h:99999/x",
                    "http://user:secret@h/x"):
            with pytest.raises(StorageError) as info:
                conn.locate(bad)
            assert "secret" not in str(info.value)
        with pytest.raises(StorageError, match="not an origin"):
            conn.store(f"{server.url}/data")
    run_conn(test)
    assert server.requests() == [("GET", "/a%20b.bin?x=1&y=%2F", None, 200)]


def test_ranges_and_info(server: RangeHttpServer, root: Path) -> None:
    size = len(DATA)

    async def test(store: HttpStore) -> None:
        info = await store.head("data/obj")
        st = (root / "data" / "obj").stat()
        assert info.size == size and info.etag == f'"{st.st_mtime_ns:x}-{size:x}"'
        assert info.mtime == int(st.st_mtime)
        assert await store.get("data/obj") == DATA
        assert await store.get("data/obj", ByteRange(0)) == DATA
        assert await store.get("data/obj", ByteRange(100)) == DATA[100:]
        assert await store.get("data/obj", ByteRange(1000, 5000)) == DATA[1000:6000]
        assert await store.get("data/obj", ByteRange(size - 10, 100)) == DATA[-10:]
        for past in (ByteRange(size), ByteRange(size + 10, 5)):
            fetched = await store.fetch("data/obj", past)
            assert fetched.data == b"" and fetched.info == info
        fetched = await store.fetch("data/obj", ByteRange(7, 0))
        assert fetched.data == b"" and fetched.info == info
        empty = await store.fetch("empty", ByteRange(0, 10))
        assert empty.data == b"" and empty.info.size == 0
        assert await store.get("empty") == b""
    run(server.url, test)
    assert statuses(server) == [
        ("HEAD", None, 200), ("GET", None, 200), ("GET", None, 200),
        ("GET", "bytes=100-", 206), ("GET", "bytes=1000-5999", 206),
        ("GET", f"bytes={size - 10}-{size + 89}", 206),
        ("GET", f"bytes={size}-", 416), ("GET", f"bytes={size + 10}-{size + 14}", 416),
        ("HEAD", None, 200),  # the zero-length range: no GET can ask for it
        ("GET", "bytes=0-9", 416), ("GET", None, 200)]


def test_server_speaks_http(server: RangeHttpServer) -> None:
    port = int(server.url.rpartition(":")[2])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def ask(method: str, target: str, **headers: str) -> http.client.HTTPResponse:
        conn.request(method, target, headers=headers)
        response = conn.getresponse()
        response.read()
        return response

    try:
        tail = ask("GET", "/data/obj", Range="bytes=-10")
        assert tail.status == 206
        assert tail.headers["Content-Range"] == f"bytes {len(DATA) - 10}-{len(DATA) - 1}/" \
                                               f"{len(DATA)}"
        assert ask("GET", "/data/obj", Range="bytes=-0").status == 416
        bad = ask("GET", "/data/obj", Range=f"bytes={len(DATA)}-")
        assert bad.status == 416 and bad.headers["Content-Range"] == f"bytes */{len(DATA)}"
        for ignored in ("bytes=0-1,5-6", "bytes=10-5", "items=0-1"):
            whole = ask("GET", "/data/obj", Range=ignored)
            assert whole.status == 200 and whole.headers["Content-Length"] == str(len(DATA))
        head = ask("HEAD", "/data/obj", Range="bytes=0-1")
        assert head.status == 200 and head.headers["Accept-Ranges"] == "bytes"
        assert ask("GET", "/data/obj", **{"If-Match": '"nope"'}).status == 412
        assert ask("GET", "/data/obj", **{"If-Match": "*"}).status == 200
        assert ask("GET", "/data/obj", **{"If-Match": head.headers["ETag"]}).status == 200
        assert ask("GET", "/dir").status == 404
        assert ask("GET", "/../../etc/passwd").status == 403
        assert ask("GET", "/nope").status == 404
    finally:
        conn.close()
    assert len(server.requests()) == 13  # all on one keep-alive connection


def test_server_without_ranges(tmp_path: Path) -> None:
    with RangeHttpServer(write_files(tmp_path), ranges=False) as server:
        async def test(store: HttpStore) -> None:
            info = await store.head("data/big")
            assert await store.get("data/big", ByteRange(10, 20)) == BIG[10:30]
            fetched = await store.fetch("data/big", ByteRange(len(BIG) - 5, 50),
                                        if_match=info.etag)
            assert fetched.data == BIG[-5:] and fetched.info == info
            assert await store.get("data/big", ByteRange(len(BIG) + 1)) == b""
            assert await store.get("data/obj") == DATA
        run(server.url, test)
        assert [status for _, _, _, status in server.requests()] == [200] * 5
        assert [rng for _, _, rng, _ in server.requests()][1] == "bytes=10-29"


def test_server_without_etags(tmp_path: Path) -> None:
    root = write_files(tmp_path)
    path = root / "data" / "obj"
    with RangeHttpServer(root, etags=False) as server:
        async def test(store: HttpStore) -> None:
            old = await store.head("data/obj")
            modified = time.strftime("%a, %d %b %Y %H:%M:%S GMT",
                                     time.gmtime(int(path.stat().st_mtime)))
            assert old.etag == f"{modified}-{len(DATA)}"
            # The server fails any If-Match (it has no ETags): none may be sent.
            fetched = await store.fetch("data/obj", ByteRange(5, 5), if_match=old.etag)
            assert fetched.data == DATA[5:10] and fetched.info == old
            assert (await store.fetch("data/obj", ByteRange(len(DATA)))).info == old

            await trio.to_thread.run_sync(path.write_bytes, DATA + b"longer")
            for byte_range in (ByteRange(0, 5), ByteRange(10**7), ByteRange(3, 0)):
                with pytest.raises(Changed):
                    await store.fetch("data/obj", byte_range, if_match=old.etag)
            new = await store.head("data/obj")

            st = path.stat()  # same size, one second later: Last-Modified differs
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
            with pytest.raises(Changed):
                await store.fetch("data/obj", ByteRange(0, 5), if_match=new.etag)
        run(server.url, test)
        assert all(status != 412 for _, _, _, status in server.requests())


def test_if_match_and_412(tmp_path: Path) -> None:
    root = write_files(tmp_path)
    with RangeHttpServer(root) as server, FaultProxy(server.url) as proxy:
        async def test(store: HttpStore) -> None:
            old = await store.head("data/obj")
            assert (await store.fetch("data/obj", ByteRange(0, 3), if_match=old.etag)).data \
                == DATA[:3]
            await trio.to_thread.run_sync((root / "data" / "obj").write_bytes, b"rewritten")
            with pytest.raises(Changed):
                await store.fetch("data/obj", ByteRange(0, 3), if_match=old.etag)
            with pytest.raises(Changed):
                await store.fetch("data/obj", ByteRange(100), if_match=old.etag)
            with pytest.raises(Changed):  # weak tags are compared here, never sent
                await store.fetch("data/obj", ByteRange(0, 3), if_match='W/"weak"')
        run(proxy.endpoint, test)
        sent = [s.headers.get("If-Match") for s in proxy.requests("GET")]
        assert sent[:3] == [sent[0], sent[0], sent[0]] and sent[0] and sent[0].startswith('"')
        assert sent[3] is None
        assert [status for _, _, _, status in server.requests()] == [200, 206, 412, 412, 206]


def test_request_headers(proxy: FaultProxy) -> None:
    async def test(store: HttpStore) -> None:
        await store.get("data/obj", ByteRange(0, 1))
    run(proxy.endpoint, test)
    (seen,) = proxy.requests("GET")
    assert seen.headers["User-Agent"] == f"h5mount/{mountd.__version__}"
    assert seen.headers["Accept-Encoding"] == "identity"
    assert seen.headers["Range"] == "bytes=0-0"


def test_not_found(server: RangeHttpServer) -> None:
    async def test(store: HttpStore) -> None:
        for key in ("nope", "dir", "dir/", "data/obj/x"):
            with pytest.raises(NotFound):
                await store.get(key)
            with pytest.raises(NotFound):
                await store.fetch(key, ByteRange(0, 10))
            with pytest.raises(NotFound):
                await store.head(key)
            assert not await store.exists(key)
        assert await store.exists("data/obj")
    run(server.url, test)
    assert all(status == 404 for _, _, _, status in server.requests()[:-1])


@pytest.mark.parametrize("status", [401, 403, 400])
def test_client_errors_are_not_retried(proxy: FaultProxy, status: int) -> None:
    proxy.error(status, path="/data/obj")

    async def test(store: HttpStore) -> None:
        with pytest.raises(StorageError) as info:
            await store.get("data/obj", ByteRange(0, 10))
        assert info.value.key == f"{proxy.endpoint}/data/obj"
        expected = "unexpected answer" if status == 400 else "access denied"
        assert expected in info.value.reason and str(status) in info.value.reason
        with pytest.raises(StorageError):
            await store.head("data/obj")
    run(proxy.endpoint, test)
    # A HEAD refused with 403 is asked again as GET (the URL may be presigned for GET).
    assert proxy.count(path="/data/obj") == (3 if status == 403 else 2)


@pytest.mark.parametrize("status", [403, 405])
def test_head_refused_falls_back_to_get(proxy: FaultProxy, status: int) -> None:
    proxy.error(status, method="HEAD")

    async def test(store: HttpStore) -> None:
        info = (await store.fetch("data/obj", ByteRange(0, 1))).info
        assert await store.head("data/obj") == info
        assert (await store.fetch("data/obj", ByteRange(3, 0))).info == info
        assert await store.exists("data/obj") and not await store.exists("nope")
        assert (await store.head("empty")).size == 0
        with pytest.raises(Changed):
            await store.fetch("data/obj", ByteRange(9, 0), if_match='"other"')
    run(proxy.endpoint, test)
    assert proxy.count("HEAD") == 1  # then never again on this origin
    assert [s.headers.get("Range") for s in proxy.requests("GET")] == ["bytes=0-0"] * 7


@pytest.mark.parametrize("fault", ["503", "500-head", "reset", "truncate", "stall"])
def test_transient_faults_are_retried(proxy: FaultProxy, fault: str) -> None:
    if fault == "503":
        proxy.error(503, method="GET", path="/data/obj", times=2)
    elif fault == "500-head":
        proxy.error(500, method="HEAD", path="/data/obj", times=1)
    elif fault == "reset":
        proxy.reset(method="GET", path="/data/obj", times=2)
    elif fault == "truncate":
        proxy.truncate(method="GET", path="/data/obj", times=1)
    else:
        proxy.stall(60, method="GET", path="/data/obj", times=1)

    async def test(store: HttpStore) -> None:
        started = time.monotonic()
        assert (await store.head("data/obj")).size == len(DATA)
        fetched = await store.fetch("data/obj", ByteRange(1000, 50_000))
        assert fetched.data == DATA[1000:51_000] and fetched.info.size == len(DATA)
        assert time.monotonic() - started < 6.0 + SLACK
    run(proxy.endpoint, test, timeout=6.0)  # a stall is given up after timeout / 3
    faults = [s.fault for s in proxy.requests(path="/data/obj")]
    expected = {"503": ["error", "error"], "500-head": ["error"], "reset": ["reset", "reset"],
                "truncate": ["truncate"], "stall": ["stall"]}[fault]
    assert [f for f in faults if f] == expected and faults.count(None) == 2


@pytest.mark.parametrize("fault", ["503", "reset", "stall"])
def test_permanent_fault_fails_within_the_timeout(proxy: FaultProxy, fault: str) -> None:
    if fault == "503":
        proxy.error(503, method="GET", path="/data/obj")
    elif fault == "reset":
        proxy.reset(method="GET", path="/data/obj")
    else:
        proxy.stall(60, method="GET", path="/data/obj")

    async def test(store: HttpStore) -> None:
        started = time.monotonic()
        with pytest.raises(StorageError) as info:
            await store.get("data/obj", ByteRange(0, 100))
        assert time.monotonic() - started < SHORT + SLACK
        assert info.value.key == f"{proxy.endpoint}/data/obj"
        assert "attempts" in info.value.reason
        assert proxy.count("GET", "/data/obj") >= 2
        proxy.clear()  # the same client recovers: no poisoned pooled connection
        assert await store.get("data/obj", ByteRange(7, 3)) == DATA[7:10]
    run(proxy.endpoint, test, timeout=SHORT)


def test_outer_cancel_is_not_swallowed(proxy: FaultProxy) -> None:
    proxy.stall(60, method="GET", path="/data/obj")

    async def test(store: HttpStore) -> None:
        started = time.monotonic()
        with trio.move_on_after(0.5) as scope:
            await store.get("data/obj")
        assert scope.cancelled_caught and time.monotonic() - started < 0.5 + SLACK
    run(proxy.endpoint, test)


def test_concurrency_is_bounded(tmp_path: Path) -> None:
    with RangeHttpServer(write_files(tmp_path)) as server:
        server.delay = 0.2

        async def test(conn: HttpConnection) -> None:
            store = conn.store(server.url)
            async with trio.open_nursery() as nursery:
                for i in range(12):
                    nursery.start_soon(store.get, "data/obj", ByteRange(i, 10))
                    nursery.start_soon(store.head, "data/big")
        run_conn(test, max_connections=3)
        assert len(server.requests()) == 24 and server.peak() == 3


def test_many_parallel_reads(server: RangeHttpServer) -> None:
    rng = random.Random(3)
    spans = [(rng.randrange(len(BIG)), rng.randrange(1, 200_000)) for _ in range(300)]

    async def test(store: HttpStore) -> None:
        results: dict[int, bytes] = {}

        async def read(i: int, start: int, length: int) -> None:
            results[i] = await store.get("data/big", ByteRange(start, length))

        async with trio.open_nursery() as nursery:
            for i, (start, length) in enumerate(spans):
                nursery.start_soon(read, i, start, length)
        assert results == {i: BIG[s:s + n] for i, (s, n) in enumerate(spans)}
    run(server.url, test, max_connections=8)
    assert server.peak() <= 8


def test_cached_store_over_http(server: RangeHttpServer) -> None:
    async def test(conn: HttpConnection) -> None:
        cache = BlockCache(16 << 20, block_size=64 << 10, validate_ttl=60)
        store, obj = conn.locate(server.url_for("data/obj"))
        same, other = conn.locate(server.url_for("data/other"))
        assert same is store
        cached = CachedStore(store, cache)
        assert cached.url == server.url
        assert await cached.get(obj, ByteRange(100, 200_000)) == DATA[100:200_100]
        assert await cached.get(other) == OTHER
        assert cache.stats.requests == 2
        assert await cached.get(obj, ByteRange(1000, 10)) == DATA[1000:1010]
        assert await cached.get(other, ByteRange(8, 6)) == OTHER[8:14]
        assert (await cached.head(obj)).size == len(DATA)
        assert (await cached.head(other)).size == len(OTHER)
        assert cache.stats.requests == 2 and cache.stats.heads == 0
    run_conn(test)
    assert [target for _, target, _, _ in server.requests()] == ["/data/obj", "/data/other"]


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")],
                   check=True, capture_output=True)
    pem = folder / "both.pem"
    pem.write_bytes((folder / "key.pem").read_bytes() + (folder / "cert.pem").read_bytes())
    return pem


def test_https(root: Path, self_signed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with RangeHttpServer(root, certfile=self_signed) as server:
        assert server.url.startswith("https://")

        async def untrusted(store: HttpStore) -> None:
            with pytest.raises(StorageError) as info:
                await store.get("data/obj", ByteRange(0, 10))
            assert "TLS failed" in info.value.reason and "certificate" in info.value.reason
            assert "attempts" not in info.value.reason  # not retried
        run(server.url, untrusted, timeout=SHORT)
        assert server.requests() == []

        async def trusted(store: HttpStore) -> None:
            assert await store.get("data/big", ByteRange(5, 3 << 20)) == BIG[5:5 + (3 << 20)]
            assert (await store.head("data/obj")).size == len(DATA)
        monkeypatch.setenv("SSL_CERT_FILE", str(self_signed))
        run(server.url, trusted)
        assert [status for _, _, _, status in server.requests()] == [206, 200]


def test_listing_is_refused(server: RangeHttpServer) -> None:
    async def test(store: HttpStore) -> None:
        with pytest.raises(StorageError, match="cannot list"):
            await store.list_dir("")
        with pytest.raises(StorageError, match="cannot list"):
            store.iter_dir("data/")
        with pytest.raises(StorageError, match="cannot list"):
            await store.list_tree("", lambda key: True, 10)
    run(server.url, test)
    assert server.requests() == []
