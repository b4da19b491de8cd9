"""A ``Store`` over S3 or any S3-compatible service: key ``k`` is ``s3://BUCKET/PREFIX/k``.

Owns one aiobotocore client per mount, opened by ``open_s3`` and closed when
its context ends. The client uses aiobotocore's httpx backend, which runs on
trio natively. ``S3Connection`` hands out an ``S3Store`` per (bucket, prefix)
over that one client, so a link into another bucket on the same endpoint
reuses the credentials and the connection pool (``S3Store.for_bucket``).

Credentials come from the usual AWS chain (environment, ``profile``, the
config and credentials files, ...), unless ``anon`` sends unsigned requests.
The region is ``region``, else the chain's, else us-east-1. An explicit
``endpoint_url`` (an S3-compatible store) switches to path-style addressing.

Failures: botocore's own retries are off (their sleeps are asyncio's); every
call goes through ``mountd.io.retry.retrying`` instead, which bounds it to
``timeout`` seconds in all. The httpx connect/read/write timeouts are the
policy's ``stall`` time, so a silent server fails one attempt, not the read.
Each attempt maps whatever it raises: 404 and NoSuchKey to ``NotFound``, 412
to ``Changed``, throttling, 5xx, connection errors, timeouts and short bodies
to ``Transient`` (retried), and everything else (403, NoSuchBucket, 400,
missing credentials) to ``StorageError`` with a reason a user can act on.
A HEAD answer has no body, so HEAD on a missing bucket is ``NotFound``; GET
and listings say the bucket does not exist. No botocore or httpx exception
leaves this module.

Listings use ListObjectsV2 one page (``page_size`` keys) at a time: the next
page is requested only when the caller has consumed the previous one, so a
level of a million chunk keys is never held at once. S3 has no empty
folders, so listing a non-root prefix with nothing under it is ``NotFound``,
as for a missing local directory.

Concurrency: stores hold no per-call state; any number of trio tasks may use
one store, or several stores of one connection, at once. The connection pool
(``max_connections``) bounds the requests actually in flight.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.httpxsession import HttpxSession
from aiobotocore.session import AioSession
from botocore import UNSIGNED
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    SSLError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from mountd.errors import Changed, MountError, NotFound, SourceError, StorageError
from mountd.io.retry import RetryPolicy, Transient, retrying, transient_error, transient_status
from mountd.io.store import ByteRange, Fetched, Listing, ObjectInfo

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Region used when neither the options nor the AWS config name one.
DEFAULT_REGION = "us-east-1"

#: Error codes that mean "not there" (HEAD responses carry only the status).
_NOT_FOUND = frozenset({"NoSuchKey", "NotFound", "404"})
#: Error codes that mean "slow down" or "try again" whatever their status.
_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "EC2ThrottledException",
    "ProvisionedThroughputExceededException", "RequestTimeout", "RequestTimeoutException",
    "InternalError", "ServiceUnavailable", "PriorRequestNotComplete",
})
#: Error codes that mean the credentials are wrong or not allowed.
_DENIED_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "InvalidToken", "ExpiredToken", "TokenRefreshRequired", "AccountProblem",
})
_NO_CREDENTIALS = ("use the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY variables, --profile or "
                   "~/.aws/credentials, or --anon for a public bucket")


@dataclass(frozen=True, slots=True)
class S3Options:
    """How to reach S3. ``timeout`` bounds each request, retries included (seconds);
    ``max_connections`` bounds the pool; ``page_size`` is the keys per listing request."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    anon: bool = False
    timeout: float = 30.0
    max_connections: int = 32
    page_size: int = 1000


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix/")``; prefix may be ``""``."""
    if not url.startswith("s3://"):
        raise SourceError(f"{url}: not an s3:// URL")
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not bucket:
        raise SourceError(f"{url}: no bucket name (s3://BUCKET[/PREFIX])")
    return bucket, _prefix(prefix)


def _prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


@asynccontextmanager
async def open_s3(options: S3Options) -> AsyncIterator[S3Connection]:
    """One S3 client for the life of the context; raises ``SourceError`` if it cannot
    be set up (unknown profile, no credentials)."""
    policy = RetryPolicy(timeout=options.timeout)
    session = AioSession(profile=options.profile)
    async with AsyncExitStack() as stack:
        try:
            region = (options.region or session.get_config_variable("region")
                      or DEFAULT_REGION)
            config = AioConfig(
                http_session_cls=HttpxSession,
                retries={"total_max_attempts": 1},
                connect_timeout=policy.stall,
                read_timeout=policy.stall,
                connector_args={"write_timeout": policy.stall, "pool_timeout": policy.timeout},
                max_pool_connections=options.max_connections,
                signature_version=UNSIGNED if options.anon else None,
                s3={"addressing_style": "path"} if options.endpoint_url else None,
            )
            client = await stack.enter_async_context(session.create_client(
                "s3", region_name=region, endpoint_url=options.endpoint_url, config=config))
            if not options.anon and await session.get_credentials() is None:
                raise SourceError(f"no AWS credentials found: {_NO_CREDENTIALS}")
        except BotoCoreError as exc:
            raise SourceError(f"cannot set up the S3 client: {exc}") from exc
        log.debug("S3 client for %s in %s (%s)", options.endpoint_url or "AWS", region,
                  "unsigned" if options.anon else f"profile {options.profile or 'default'}")
        yield S3Connection(client, options, policy)


class S3Connection:
    """One open client; makes stores for any bucket reachable with it."""

    def __init__(self, client: Any, options: S3Options, policy: RetryPolicy) -> None:
        self.client = client
        self.options = options
        self.policy = policy

    def store(self, bucket: str, prefix: str = "") -> S3Store:
        return S3Store(self, bucket, prefix)

    def store_for_url(self, url: str) -> S3Store:
        """The store for ``s3://BUCKET[/PREFIX]``."""
        return self.store(*parse_s3_url(url))


class S3Store:
    """Objects below ``prefix`` in one bucket; keys are relative to ``prefix``."""

    def __init__(self, connection: S3Connection, bucket: str, prefix: str = "") -> None:
        self._conn = connection
        self._client = connection.client
        self._policy = connection.policy
        self._page_size = connection.options.page_size
        self.bucket = bucket
        self.prefix = _prefix(prefix)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def for_bucket(self, bucket: str, prefix: str = "") -> S3Store:
        """A store for another bucket over the same client and credentials."""
        return self._conn.store(bucket, prefix)

    async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        return (await self.fetch(key, byte_range)).data

    async def fetch(self, key: str, byte_range: ByteRange | None = None,
                    if_match: str | None = None) -> Fetched:
        if byte_range is not None and byte_range.length == 0:
            return Fetched(b"", await self._head(key, if_match))
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + key}
        if byte_range is not None and (byte_range.start or byte_range.length is not None):
            end = "" if byte_range.length is None else byte_range.start + byte_range.length - 1
            params["Range"] = f"bytes={byte_range.start}-{end}"
        if if_match is not None:
            params["IfMatch"] = if_match

        async def attempt() -> Fetched | None:
            try:
                response = await self._client.get_object(**params)
            except ClientError as exc:
                if _status(exc) == 416:
                    return None
                raise
            async with response["Body"] as body:
                data = await body.read()
            return _fetched(key, response, data, byte_range)

        fetched = await self._call(key, attempt)
        if fetched is None:  # the range starts at or past the end
            return Fetched(b"", await self._head(key, if_match))
        return fetched

    async def head(self, key: str) -> ObjectInfo:
        return await self._head(key, None)

    async def _head(self, key: str, if_match: str | None) -> ObjectInfo:
        async def attempt() -> ObjectInfo:
            response = await self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)
            return ObjectInfo(response["ContentLength"], response.get("ETag", ""),
                              _mtime(response))

        info = await self._call(key, attempt)
        if if_match is not None and info.etag != if_match:
            raise Changed(key, f"changed (etag {info.etag}, expected {if_match})")
        return info

    async def exists(self, key: str) -> bool:
        try:
            await self.head(key)
        except NotFound:
            return False
        return True

    async def list_dir(self, prefix: str) -> Listing:
        listing = Listing([], [])
        token: str | None = None
        while True:
            page, token = await self._list_page(prefix, "/", token)
            listing.prefixes.extend(page.prefixes)
            listing.keys.extend(page.keys)
            if token is None:
                return listing

    async def iter_dir(self, prefix: str) -> AsyncIterator[str]:
        token: str | None = None
        while True:
            page, token = await self._list_page(prefix, "/", token)
            for name in page.keys:
                yield name
            for name in page.prefixes:
                yield name
            if token is None:
                return

    async def iter_keys(self, prefix: str) -> AsyncIterator[str]:
        token: str | None = None
        while True:
            page, token = await self._list_page(prefix, None, token)
            for name in page.keys:
                yield name
            if token is None:
                return

    async def _list_page(self, prefix: str, delimiter: str | None,
                         token: str | None) -> tuple[Listing, str | None]:
        """One ListObjectsV2 page below ``prefix``, names relative to the store,
        and the token of the next page (None after the last)."""
        full = self.prefix + prefix
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full,
                                  "MaxKeys": self._page_size}
        if delimiter is not None:
            params["Delimiter"] = delimiter
        if token is not None:
            params["ContinuationToken"] = token

        async def attempt() -> dict[str, Any]:
            return await self._client.list_objects_v2(**params)

        page = await self._call(prefix or "/", attempt)
        contents = page.get("Contents", [])
        common = page.get("CommonPrefixes", [])
        if delimiter is not None and token is None and prefix and not contents and not common:
            raise NotFound(prefix)
        skip = len(self.prefix)
        listing = Listing([p["Prefix"][skip:] for p in common],
                          [o["Key"][skip:] for o in contents if o["Key"] != full])
        next_token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
        return listing, next_token

    async def _call(self, key: str, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation`` with retries, every failure mapped to this package's errors."""
        async def attempt() -> T:
            try:
                return await operation()
            except (MountError, Transient):
                raise
            except ClientError as exc:
                raise self._client_error(key, exc) from exc
            except (NoCredentialsError, PartialCredentialsError,
                    CredentialRetrievalError) as exc:
                raise StorageError(key, f"no usable AWS credentials ({exc}): "
                                        f"{_NO_CREDENTIALS}") from exc
            except SSLError as exc:
                raise StorageError(key, f"TLS failed: {exc}") from exc
            except (BotoConnectionError, HTTPClientError, IncompleteReadError,
                    FlexibleChecksumError) as exc:
                raise Transient(str(exc)) from exc
            except BotoCoreError as exc:
                raise StorageError(key, str(exc)) from exc
            except Exception as exc:
                reason = transient_error(exc)
                if reason is not None:
                    raise Transient(reason) from exc
                log.debug("unexpected error reading %s/%s", self.url, key, exc_info=True)
                raise StorageError(key, f"{type(exc).__name__}: {exc}") from exc

        return await retrying(key, self._policy, attempt)

    def _client_error(self, key: str, exc: ClientError) -> Exception:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = _status(exc)
        said = f"HTTP {status} {code}: {error.get('Message') or 'no message'}"
        if code == "NoSuchBucket":
            return StorageError(key, f"bucket {self.bucket!r} does not exist")
        if code in _NOT_FOUND or status == 404:
            return NotFound(key)
        if code == "PreconditionFailed" or status == 412:
            return Changed(key, "changed since it was first read (etag differs)")
        if code in _TRANSIENT_CODES or transient_status(status):
            return Transient(said)
        if code in _DENIED_CODES or status == 403:
            return StorageError(key, f"access denied to s3://{self.bucket} ({said}); check "
                                     f"the credentials: {_NO_CREDENTIALS}")
        return StorageError(key, said)


def _fetched(key: str, response: dict[str, Any], data: bytes,
             byte_range: ByteRange | None) -> Fetched:
    """A GET's bytes and the whole object's info; a range the server ignored is cut here."""
    content_range = response.get("ContentRange")
    if content_range:
        total = content_range.rpartition("/")[2]
        if not total.isdigit():
            raise StorageError(key, f"unusable Content-Range {content_range!r}")
        size = int(total)
    else:  # a whole object, asked for or not
        size = len(data)
        if byte_range is not None:
            stop = None if byte_range.length is None else byte_range.start + byte_range.length
            data = data[byte_range.start:stop]
    return Fetched(data, ObjectInfo(size, response.get("ETag", ""), _mtime(response)))


def _status(exc: ClientError) -> int:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status)


def _mtime(response: dict[str, Any]) -> float:
    modified = response.get("LastModified")
    return modified.timestamp() if isinstance(modified, datetime) else 0.0
