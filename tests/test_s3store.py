"""S3-only behaviour: retries through a fault-injecting proxy, time bounds, credentials.

Every test talks to a real moto server through ``tests/faultproxy.py``, so
each fault is a real HTTP event (a 503 with an S3 body, a reset, a stalled or
short response) and the proxy's record shows what the store actually sent:
GETs and HEADs on the hot path carry no ``amz-sdk-invocation-id`` header,
those sent by aiobotocore do. The hot path's SigV4 is checked against
botocore's signer for fixed requests and times, and by a moto server with
authentication switched on, which verifies every signature. That a bucket
behind an HTTP proxy leaves the hot path is checked on its route alone.
The only timing assertions are upper bounds: an operation ends within its
``timeout`` plus a little slack.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from unittest import mock

import boto3
import pytest
import trio
import trio.testing
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials

from layouts.storage import ByteRange
from mountd.errors import Changed, NotFound, SourceError, StorageError
from mountd.io import s3
from mountd.io.s3 import S3Options, S3Store, open_s3, parse_s3_url
from mountd.io.sigv4 import SigV4Signer
from tests.faultproxy import FaultProxy, Seen
from tests.moto_server import MotoServer
from tests.test_store_conformance import aws_environment, take

BUCKET = "s3store"
OTHER = "s3store-other"
PUBLIC = "s3store-public"
DATA = bytes(range(256)) * 64
LAZY = 45
#: Seconds of budget for tests that fail on purpose; the slack allowed past it.
SHORT = 3.0
SLACK = 1.5


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer() as server, aws_environment(server, tmp_path_factory.mktemp("aws")):
        client = server.client()
        server.create_bucket(BUCKET)
        server.create_bucket(OTHER)
        client.create_bucket(Bucket=PUBLIC, ACL="public-read")
        client.put_object(Bucket=BUCKET, Key="data/obj", Body=DATA)
        client.put_object(Bucket=OTHER, Key="linked/obj", Body=b"in the other bucket")
        client.put_object(Bucket=PUBLIC, Key="open", Body=b"public", ACL="public-read")
        for i in range(LAZY):
            client.put_object(Bucket=BUCKET, Key=f"data/lazy/k{i:02d}", Body=b"k")
        yield server


@pytest.fixture(scope="module")
def proxy_server(moto: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto.endpoint) as proxy:
        yield proxy


@pytest.fixture
def proxy(proxy_server: FaultProxy) -> FaultProxy:
    proxy_server.clear()
    return proxy_server


def run(proxy: FaultProxy, test: Callable[[S3Store], Awaitable[None]],
        url: str = f"s3://{BUCKET}/data", **options: object) -> None:
    """``test(store)`` inside ``trio.run``, the store reaching moto through ``proxy``."""
    async def main() -> None:
        settings = S3Options(endpoint_url=proxy.endpoint, **options)  # type: ignore[arg-type]
        async with open_s3(settings) as conn:
            await test(conn.store_for_url(url))
    trio.run(main)


def test_parse_url_and_store_url() -> None:
    assert parse_s3_url("s3://b") == ("b", "")
    assert parse_s3_url("s3://b/") == ("b", "")
    assert parse_s3_url("s3://b/p/q/") == ("b", "p/q/")
    assert parse_s3_url("s3://b/p") == ("b", "p/")
    for bad in ("s3://", "http://b/p", "b/p"):
        with pytest.raises(SourceError):
            parse_s3_url(bad)


@pytest.mark.server
def test_for_bucket_shares_the_client(proxy: FaultProxy) -> None:
    async def test(store: S3Store) -> None:
        assert store.url == f"s3://{BUCKET}/data"
        other = store.for_bucket(OTHER)
        assert other.url == f"s3://{OTHER}"
        assert await other.get("linked/obj") == b"in the other bucket"
        assert await store.for_bucket(OTHER, "linked").get("obj") == b"in the other bucket"
        assert await store.get("obj", ByteRange(256, 4)) == DATA[256:260]
    run(proxy, test)


@pytest.mark.server
def test_503_slowdown_then_success(proxy: FaultProxy) -> None:
    proxy.error(503, method="GET", path="/data/obj", times=2)

    async def test(store: S3Store) -> None:
        fetched = await store.fetch("obj", ByteRange(100, 50))
        assert fetched.data == DATA[100:150] and fetched.info.size == len(DATA)
    run(proxy, test)
    seen = proxy.requests("GET", "/data/obj")
    assert [s.fault for s in seen] == ["error", "error", None]


@pytest.mark.server
def test_resets_then_success(proxy: FaultProxy) -> None:
    proxy.reset(method="GET", path="/data/obj", times=2)

    async def test(store: S3Store) -> None:
        assert await store.get("obj") == DATA
    run(proxy, test)
    assert [s.fault for s in proxy.requests("GET", "/data/obj")] == ["reset", "reset", None]


@pytest.mark.server
def test_truncated_body_is_retried(proxy: FaultProxy) -> None:
    proxy.truncate(method="GET", path="/data/obj", times=1)

    async def test(store: S3Store) -> None:
        assert await store.get("obj", ByteRange(1000, 3000)) == DATA[1000:4000]
    run(proxy, test)
    assert [s.fault for s in proxy.requests("GET", "/data/obj")] == ["truncate", None]


@pytest.mark.server
def test_head_and_list_are_retried(proxy: FaultProxy) -> None:
    proxy.error(500, method="HEAD", times=1)
    proxy.error(503, path="list-type=2", times=1)

    async def test(store: S3Store) -> None:
        assert (await store.head("obj")).size == len(DATA)
        assert (await store.list_dir("")).keys == ["obj"]
    run(proxy, test)
    assert proxy.count("HEAD") == 2
    assert proxy.count("GET", "list-type=2") == 2


@pytest.mark.server
def test_stall_is_detected_and_retried(proxy: FaultProxy) -> None:
    timeout = 6.0  # a stall is given up after timeout / 3
    proxy.stall(60, method="GET", path="/data/obj", times=1)

    async def test(store: S3Store) -> None:
        started = time.monotonic()
        assert await store.get("obj", ByteRange(0, 10)) == DATA[:10]
        assert time.monotonic() - started < timeout + SLACK
    run(proxy, test, timeout=timeout)
    assert [s.fault for s in proxy.requests("GET", "/data/obj")] == ["stall", None]


@pytest.mark.server
def test_slow_server_is_not_an_error(proxy: FaultProxy) -> None:
    proxy.latency(0.3, method="GET", path="/data/obj")

    async def test(store: S3Store) -> None:
        assert await store.get("obj", ByteRange(5, 5)) == DATA[5:10]
    run(proxy, test, timeout=SHORT)
    assert proxy.count("GET", "/data/obj") == 1


@pytest.mark.parametrize("fault", ["500", "503", "reset", "stall"])
@pytest.mark.server
def test_permanent_fault_fails_within_the_timeout(proxy: FaultProxy, fault: str) -> None:
    if fault == "reset":
        proxy.reset(method="GET", path="/data/obj")
    elif fault == "stall":
        proxy.stall(60, method="GET", path="/data/obj")
    else:
        proxy.error(int(fault), method="GET", path="/data/obj")

    async def test(store: S3Store) -> None:
        started = time.monotonic()
        with pytest.raises(StorageError) as info:
            await store.get("obj")
        assert time.monotonic() - started < SHORT + SLACK
        assert info.value.key == "obj" and "attempts" in info.value.reason
        assert proxy.count("GET", "/data/obj") >= 2
        proxy.clear()  # the same client recovers: no poisoned pooled connection
        assert await store.get("obj", ByteRange(7, 3)) == DATA[7:10]
    run(proxy, test, timeout=SHORT)


@pytest.mark.server
def test_outer_cancel_is_not_swallowed(proxy: FaultProxy) -> None:
    proxy.stall(60, method="GET", path="/data/obj")

    async def test(store: S3Store) -> None:
        started = time.monotonic()
        with trio.move_on_after(0.5) as scope:
            await store.get("obj")
        assert scope.cancelled_caught and time.monotonic() - started < 0.5 + SLACK
    run(proxy, test)


@pytest.mark.server
def test_access_denied_is_clear_and_not_retried(proxy: FaultProxy) -> None:
    proxy.error(403, method="GET", path="/data/obj")

    async def test(store: S3Store) -> None:
        with pytest.raises(StorageError) as info:
            await store.get("obj")
        assert "access denied" in info.value.reason and "credentials" in info.value.reason
    run(proxy, test)
    assert proxy.count("GET", "/data/obj") == 1


@pytest.mark.server
def test_missing_bucket_is_clear_and_not_retried(proxy: FaultProxy) -> None:
    async def test(store: S3Store) -> None:
        with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
            await store.get("x", ByteRange(0, 10))
        with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
            await store.list_dir("")
        with pytest.raises(NotFound):  # a HEAD answer has no body to tell why
            await store.head("x")
    run(proxy, test, url="s3://no-such-bucket/p")
    assert proxy.count() == 3


@pytest.mark.server
def test_iter_dir_is_lazy(proxy: FaultProxy) -> None:
    pages = -(-LAZY // 10)

    async def test(store: S3Store) -> None:
        first = await take(store.iter_dir("lazy/"), 3)
        assert first == ["lazy/k00", "lazy/k01", "lazy/k02"]
        assert proxy.count("GET", "list-type=2") == 1
        names = [name async for name in store.iter_dir("lazy/")]
        assert names == [f"lazy/k{i:02d}" for i in range(LAZY)]
        assert proxy.count("GET", "list-type=2") == 1 + pages
        keys = await store.list_tree("", lambda key: False, LAZY + 1)
        assert keys is not None and len(keys) == LAZY + 1
        assert all(info is not None and info.size >= 0 for _, info in keys)
        assert proxy.count("GET", "list-type=2") == 1 + pages + pages
    run(proxy, test, page_size=10)


@pytest.mark.server
def test_anonymous_requests_are_unsigned(proxy: FaultProxy) -> None:
    async def test(store: S3Store) -> None:
        assert await store.get("open") == b"public"
    run(proxy, test, url=f"s3://{PUBLIC}", anon=True)
    seen = proxy.requests("GET", "/open")
    assert seen and all("Authorization" not in s.headers for s in seen)


@pytest.mark.server
def test_profile_from_aws_files(proxy: FaultProxy, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config").write_text("[profile h5test]\nregion = eu-west-2\n")
    (tmp_path / "credentials").write_text(
        "[h5test]\naws_access_key_id = profile-key-id\n"
        "aws_secret_access_key = profile-secret\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)

    async def test(store: S3Store) -> None:
        assert await store.get("obj", ByteRange(0, 4)) == DATA[:4]
    run(proxy, test, profile="h5test")
    (seen,) = proxy.requests("GET", "/data/obj")
    assert "Credential=profile-key-id/" in seen.headers["Authorization"]
    assert "/eu-west-2/s3/" in seen.headers["Authorization"]

    with pytest.raises(SourceError, match="profile"):
        run(proxy, test, profile="no-such-profile")


@pytest.mark.server
def test_no_credentials_fails_before_mounting(proxy: FaultProxy,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")

    async def test(store: S3Store) -> None:
        raise AssertionError("opened without credentials")
    with pytest.raises(SourceError, match="--anon"):
        run(proxy, test)
    assert proxy.count() == 0


def direct(seen: list[Seen]) -> list[bool]:
    """Which of these requests the hot path sent (aiobotocore's carry an invocation id)."""
    return [not any(name.lower() == "amz-sdk-invocation-id" for name in s.headers)
            for s in seen]


@pytest.mark.parametrize("token", [None, "session/token+=="])
@pytest.mark.parametrize(("method", "url"), [
    ("GET", "http://127.0.0.1:9000/bucket/a%20b/c~d%2B%C3%A9"),
    ("HEAD", "https://bucket.s3.eu-west-2.amazonaws.com/k/0.0.1"),
])
def test_sigv4_equals_botocore(token: str | None, method: str, url: str) -> None:
    """One signer, used as the hot path uses it: several requests in one second, the
    next second and the next day (its cached key, scope and stamp renewed), each
    signed as botocore signs it."""
    host, _, path = url.partition("://")[2].partition("/")
    signer = SigV4Signer("AKIDEXAMPLE", "secret", token, "eu-west-2")
    start = 1_700_000_000.5
    signatures = set()
    for now, target in [(start, path), (start, f"{path}/other"), (start + 1, path),
                        (start + 86_400, path), (start + 86_400.2, path)]:
        ours = signer.sign(method, host, f"/{target}", now)
        request = AWSRequest(method=method, url=f"{url.partition(host)[0]}{host}/{target}")
        when = datetime.datetime.fromtimestamp(now, datetime.UTC).replace(tzinfo=None)
        with mock.patch("botocore.auth.get_current_datetime", return_value=when):
            S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret", token), "s3",
                        "eu-west-2").add_auth(request)
        assert set(ours) == {"x-amz-content-sha256", "x-amz-date", "Authorization"} | (
            {"x-amz-security-token"} if token else set())
        for name, value in ours.items():
            assert request.headers[name] == value, (now, target, name)
        signatures.add(ours["Authorization"])
    assert len(signatures) == 4  # the last two differ only in the fraction of a second


@pytest.mark.server
def test_hot_path_ranges_validators_and_errors(proxy: FaultProxy) -> None:
    async def test(store: S3Store) -> None:
        info = await store.head("obj")
        fetched = await store.fetch("obj", ByteRange(100, 50), if_match=info.etag)
        assert fetched.data == DATA[100:150] and fetched.info == info
        assert (await store.fetch("obj")).info == info
        assert await store.get("obj", ByteRange(len(DATA) - 6)) == DATA[-6:]
        past = await store.fetch("obj", ByteRange(len(DATA) + 10, 5))  # 416, then HEAD
        assert past.data == b"" and past.info == info
        with pytest.raises(Changed):
            await store.fetch("obj", ByteRange(0, 5), if_match='"not-the-etag"')
        with pytest.raises(NotFound):
            await store.get("nope", ByteRange(0, 5))
        with pytest.raises(NotFound):
            await store.head("nope")
        assert not await store.exists("nope")
        with pytest.raises(StorageError, match="does not exist"):
            await store.for_bucket("no-such-bucket").get("x")
    run(proxy, test)
    gets = proxy.requests("GET", "/data/obj")
    assert len(gets) == 5 and all(direct(gets))
    assert gets[0].headers.get("Range") == "bytes=100-149"
    assert gets[0].headers.get("If-Match", "").startswith('"')
    assert "SignedHeaders=host;x-amz-content-sha256;x-amz-date," in (
        gets[0].headers["Authorization"])
    assert all(direct(proxy.requests("HEAD")))


@pytest.mark.server
def test_faults_on_the_hot_path(proxy: FaultProxy) -> None:
    proxy.error(503, method="GET", path="/data/obj", times=1)
    proxy.error(500, method="HEAD", path="/data/obj", times=1)

    async def test(store: S3Store) -> None:
        assert await store.get("obj", ByteRange(3, 4)) == DATA[3:7]
        assert (await store.head("obj")).size == len(DATA)
    run(proxy, test)
    gets, heads = proxy.requests("GET", "/data/obj"), proxy.requests("HEAD", "/data/obj")
    assert [s.fault for s in gets] == ["error", None] and all(direct(gets))
    assert [s.fault for s in heads] == ["error", None] and all(direct(heads))


@pytest.mark.server
def test_redirect_moves_the_bucket_to_aiobotocore(proxy: FaultProxy) -> None:
    proxy.error(301, "PermanentRedirect", method="GET", path="/data/obj", times=1)

    async def test(store: S3Store) -> None:
        assert await store.get("obj", ByteRange(0, 8)) == DATA[:8]
        assert await store.get("obj", ByteRange(8, 8)) == DATA[8:16]
        assert await store.for_bucket(OTHER).get("linked/obj") == b"in the other bucket"
    run(proxy, test)
    assert direct(proxy.requests("GET", "/data/obj")) == [True, False, False]
    assert direct(proxy.requests("GET", "/linked/obj")) == [True]


def test_proxied_endpoint_goes_through_aiobotocore(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """The hot path speaks to endpoints directly, so a bucket whose endpoint the
    environment sends through a proxy is read through aiobotocore, which uses it."""
    for name in [name for name in os.environ if name.startswith("AWS_")
                 or name.lower() in ("no_proxy", "http_proxy", "https_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))

    async def main() -> None:
        async with open_s3(S3Options(endpoint_url="http://127.0.0.1:9")) as conn:
            assert await conn._resolve(BUCKET) is not None
            monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
            assert await conn._resolve(BUCKET) is None
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            assert await conn._resolve(BUCKET) is not None
    trio.run(main)


@pytest.mark.server
def test_anonymous_hot_path(proxy: FaultProxy) -> None:
    async def test(store: S3Store) -> None:
        assert await store.get("open", ByteRange(1, 3)) == b"ubl"
        assert (await store.head("open")).size == 6
    run(proxy, test, url=f"s3://{PUBLIC}", anon=True)
    seen = proxy.requests(path="/open")
    assert len(seen) == 2 and all(direct(seen))
    assert not any("Authorization" in s.headers or "x-amz-date" in s.headers for s in seen)


def test_credentials_snapshot_is_reread(monkeypatch: pytest.MonkeyPatch) -> None:
    class Source:
        def __init__(self) -> None:
            self.reads = 0

        async def get_frozen_credentials(self) -> ReadOnlyCredentials:
            self.reads += 1
            return ReadOnlyCredentials(f"key{self.reads}", "secret", "token", None)

    async def main() -> None:
        source = Source()
        credentials = s3._Credentials(source, await source.get_frozen_credentials())
        assert (await credentials.signer("r")).access_key == "key1"
        assert source.reads == 1
        monkeypatch.setattr(s3, "CREDENTIALS_TTL", 0.0)
        credentials._fresh_until = trio.current_time()
        assert (await credentials.signer("r")).access_key == "key2"
    trio.run(main)


def test_a_replaced_client_ends_its_calls_then_closes() -> None:
    """After a swap (SIGHUP) new calls get the new aiobotocore client; a call under
    way ends on the old one, and the last such call closes it."""
    closed: list[str] = []

    def client(name: str) -> s3._Client:
        exits = contextlib.AsyncExitStack()
        exits.callback(closed.append, name)
        return s3._Client(name, exits)

    async def connect(session: object) -> s3._Client:
        return client("new")

    async def main() -> None:
        clients = s3._Clients(client("first"), connect)
        gate = trio.Event()
        used: list[str] = []

        async def call() -> None:
            async with clients.use() as held:
                used.append(held)
                await gate.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            clients.swap(await clients.open(object()))  # type: ignore[arg-type]
            await clients.close_unused()
            async with clients.use() as held:
                assert held == "new"
            assert closed == []
            gate.set()
        assert used == ["first"] and closed == ["first"]
        clients.swap(client("third"))
        await clients.close_unused()
        assert closed == ["first", "new"]
        await clients.aclose()
        assert closed == ["first", "new", "third"]
    trio.run(main)


@pytest.mark.server
def test_moto_verifies_the_signatures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A moto server with authentication on: a signature it does not recompute is refused."""
    with MotoServer() as server, aws_environment(server, tmp_path):
        iam = boto3.client("iam", endpoint_url=server.endpoint, region_name="us-east-1")
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=(
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
            '"Action": "s3:*", "Resource": "*"}]}'))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        client = server.client()
        client.create_bucket(Bucket="signed")
        client.put_object(Bucket="signed", Key="p/obj", Body=DATA)
        urllib.request.urlopen(urllib.request.Request(
            f"{server.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
            headers={"Content-Type": "application/json"})).close()
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])

        async def read() -> None:
            settings = S3Options(endpoint_url=server.endpoint, timeout=SHORT)
            async with open_s3(settings) as conn:
                store = conn.store("signed", "p")
                assert await store.get("obj", ByteRange(10, 20)) == DATA[10:30]
                assert (await store.head("obj")).size == len(DATA)

        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        trio.run(read)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        with pytest.raises(StorageError, match="access denied"):
            trio.run(read)
