"""A ``Store`` over S3 or any S3-compatible service: key ``k`` is ``s3://BUCKET/PREFIX/k``.

Owns, per mount, an aiobotocore client (a new one after each SIGHUP that
rereads the credentials) and one ``mountd.io.h1.H1Client``, opened by
``open_s3`` and closed when its context ends; both run on trio natively
(aiobotocore through its httpx backend, loading its service model in a worker
thread: ``warm_up_loader_caches``). ``S3Connection`` hands out an
``S3Store`` per (bucket, prefix) over them, so a link into another bucket on
the same endpoint reuses the credentials and the connection pools
(``S3Store.for_bucket``).

Two paths:

- The hot path, GetObject and HeadObject (``fetch``, ``get``, ``head``,
  ``exists``), skips botocore's per-call machinery (parameter validation,
  event hooks, ``AWSRequest``, its signer, response parsing), which costs
  several times what sending the request does, and httpx's client and pool,
  which cost several times what the exchange on the socket does. Each is one
  request on the connection's ``H1Client`` (HTTP/1.1 keep-alive connections;
  TLS trusting what httpx trusts: certifi's roots, or ``SSL_CERT_FILE`` /
  ``SSL_CERT_DIR``) to the URL aiobotocore's endpoint resolver gives for the
  bucket (once per bucket: ``endpoint_url``, region, path or virtual-host
  style, as aiobotocore would send it), signed with ``mountd.io.sigv4`` using
  a frozen snapshot of aiobotocore's credentials (re-read every
  ``CREDENTIALS_TTL`` seconds, so refreshable credentials are refreshed by
  aiobotocore long before they expire), or unsigned with ``anon``. Range and
  If-Match are plain headers; bodies are read raw (no Content-Encoding
  decoding), as botocore does.
- Everything else stays on aiobotocore: credential discovery, endpoint
  resolution, listings, and any bucket the resolver gives an unusual endpoint
  for (a signing scheme other than SigV4, extra headers) or that S3 redirects
  (a bucket in another region): that bucket's GETs and HEADs then go through
  aiobotocore, which follows the redirect, for the life of the connection.
  So does a bucket whose endpoint the environment sends through a proxy
  (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``, read as botocore reads them):
  the hot path connects only directly.

Credentials come from the usual AWS chain (environment, ``profile``, the
config and credentials files, ...), unless ``anon`` sends unsigned requests.
``S3Connection.reread_credentials`` (the daemon's SIGHUP) runs the chain
again in a new session, as botocore reads the config and credentials files
once per session: both paths sign with what it finds from their next request
on, the hot path with a new snapshot, aiobotocore's calls through a new
client of that session, made with the region, endpoint and options of the
first (calls under way finish on the old client, which the last of them
closes). If it finds nothing usable, the old credentials stay and one WARNING
says why. Only the credentials are read again: the region, endpoint and bucket
routes stay as they were found at the start (settings that only a config file
gives the client, such as a CA bundle, come with the new session's reading).
The region is ``region``, else the chain's, else us-east-1. An explicit
``endpoint_url`` (an S3-compatible store) switches to path-style addressing.

Failures: botocore's own retries are off (their sleeps are asyncio's); every
call goes through ``mountd.io.retry.retrying`` instead, which bounds it to
``timeout`` seconds in all. The hot path's connect/read/write progress
timeout, and aiobotocore's connect/read/write timeouts, are the policy's
``stall`` time, so a silent server fails one attempt, not the read.
Each attempt maps whatever it raises, on either path alike: 404 and NoSuchKey
to ``NotFound``, 412 to ``Changed``, throttling, 5xx, connection errors,
timeouts and short bodies to ``Transient`` (retried), and everything else
(403, NoSuchBucket, 400, missing credentials, an untrusted TLS certificate)
to ``StorageError`` with a reason a user can act on. A GET whose range starts
at or past the end (416) reads ``b""`` and asks HEAD for the object's info.
A HEAD answer has no body, so HEAD on a missing bucket is ``NotFound``; GET
and listings say the bucket does not exist. No botocore, httpx or
``mountd.io.h1`` exception leaves this module.

Listings use ListObjectsV2 one page (``page_size`` keys) at a time: the next
page is requested only when the caller has consumed the previous one, so a
level of a million chunk keys is never held at once (``list_tree``, which
holds a whole prefix's keys, stops at the number it is given). S3 has no empty
folders, so listing a non-root prefix with nothing under it is ``NotFound``,
as for a missing local directory.

Concurrency: stores hold no per-call state; any number of trio tasks may use
one store, or several stores of one connection, at once. The connection's
per-bucket routes and credential snapshot are replaced whole without an
``await`` in between, and only one task at a time re-reads the credentials
(the others sign with the snapshot they have, which is still valid). A
SIGHUP's new credentials replace the snapshot, its source and the client
in one section without an ``await``, so a request is signed with the old
credentials or the new, never a mix; a periodic re-read of the old source
that ends after it is discarded. An aiobotocore call keeps the client it
started on until it ends (``_Clients.use``); a replaced client is closed by
the last of them, or right after the swap if none uses it. On the hot path one
``trio.CapacityLimiter(max_connections)`` per connection bounds the requests
in flight, hence the hot path's open connections (it keeps as many idle), so
a request never waits for a connection; time spent waiting for the limiter
is not part of an operation's budget. Listings use aiobotocore's own pool of
the same size.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import trio
from aiobotocore.config import AioConfig
from aiobotocore.httpxsession import HttpxSession
from aiobotocore.session import AioSession
from botocore import UNSIGNED
from botocore.credentials import ReadOnlyCredentials
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
from botocore.httpsession import mask_proxy_url
from botocore.utils import get_environ_proxies

from layouts.errors import LayoutError
from layouts.storage import ByteRange, Fetched, Listing, ObjectInfo, fetch_each
from mountd import logsafe
from mountd.errors import Changed, MountError, NotFound, SourceError, StorageError
from mountd.io.h1 import Answer, Endpoint, H1Client, hot_client
from mountd.io.http import USER_AGENT, http_mtime, read_bigger, tls_failure
from mountd.io.meter import STORES
from mountd.io.retry import RetryPolicy, Transient, retrying, transient_error, transient_status
from mountd.io.sigv4 import SigV4Signer

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
#: Error codes of a request sent to the wrong region: S3 names the right one in
#: ``x-amz-bucket-region`` and aiobotocore follows it.
_REDIRECT_CODES = frozenset({"PermanentRedirect", "TemporaryRedirect",
                             "AuthorizationHeaderMalformed",
                             "IllegalLocationConstraintException"})
#: Seconds a credential snapshot is used before aiobotocore is asked again; its
#: refreshable credentials refresh 15 minutes before they expire.
CREDENTIALS_TTL = 60.0
_ERROR_CODE = re.compile(r"<Code>([^<]*)</Code>")
_ERROR_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
#: Headers of every hot-path request besides Host and the signature.
_HOT_HEADERS = (("User-Agent", USER_AGENT), ("Accept-Encoding", "identity"))
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
                warm_up_loader_caches=True,
            )
            connect = partial(_open_client, region=region, endpoint_url=options.endpoint_url,
                              config=config)
            clients = _Clients(await connect(session), connect)
            stack.push_async_callback(clients.aclose)
            credentials = None
            if not options.anon:
                found = await _read_credentials(session)
                if found is None:
                    raise SourceError(f"no AWS credentials found: {_NO_CREDENTIALS}")
                credentials = _Credentials(*found)
                credentials.keep_out_of_logs()
        except BotoCoreError as exc:
            raise SourceError(f"cannot set up the S3 client: {exc}") from exc
        read_bigger()
        hot = hot_client(stall=policy.stall, max_idle=options.max_connections)
        stack.callback(hot.close)
        log.debug("S3 client for %s in %s (%s)", options.endpoint_url or "AWS", region,
                  "unsigned" if options.anon else f"profile {options.profile or 'default'}")
        yield S3Connection(clients, options, policy, hot, credentials)


async def _read_credentials(session: AioSession) -> tuple[Any, ReadOnlyCredentials] | None:
    """The credentials ``session``'s chain finds and a frozen snapshot of them; None if
    it finds none. Raises what the chain raises (``BotoCoreError`` and others)."""
    source = await session.get_credentials()
    if source is None:
        return None
    return source, await source.get_frozen_credentials()


class _Credentials:
    """aiobotocore's credentials as a frozen snapshot, re-read every ``CREDENTIALS_TTL``
    seconds, and one signer per region over that snapshot; ``replace`` swaps in other
    credentials (SIGHUP)."""

    def __init__(self, source: Any, snapshot: ReadOnlyCredentials) -> None:
        self._source = source
        self._snapshot = snapshot
        self._fresh_until = trio.current_time() + CREDENTIALS_TTL
        self._refreshing = False
        self._signers: dict[str, SigV4Signer] = {}

    async def signer(self, region: str) -> SigV4Signer:
        if trio.current_time() >= self._fresh_until and not self._refreshing:
            await self._refresh()
        signer = self._signers.get(region)
        if signer is None:
            access_key, secret_key, token = self._snapshot[:3]
            signer = self._signers[region] = SigV4Signer(access_key, secret_key, token, region)
        return signer

    @property
    def access_key(self) -> str:
        """The access key id requests are signed with now (not a secret)."""
        return str(self._snapshot.access_key)

    def replace(self, source: Any, snapshot: ReadOnlyCredentials) -> None:
        """Sign with ``snapshot`` from now on, and take the periodic snapshots from
        ``source``. No await: a request signs with the old or the new."""
        self._source, self._snapshot, self._signers = source, snapshot, {}
        self._fresh_until = trio.current_time() + CREDENTIALS_TTL
        self.keep_out_of_logs()

    async def _refresh(self) -> None:
        """Ask aiobotocore for the credentials again (it refreshes them if they are due)."""
        source = self._source
        self._refreshing = True
        try:
            snapshot = await source.get_frozen_credentials()
        finally:
            self._refreshing = False
        if source is not self._source:  # replaced meanwhile: the new ones stand
            return
        self._fresh_until = trio.current_time() + CREDENTIALS_TTL
        if snapshot != self._snapshot:
            self._snapshot, self._signers = snapshot, {}
            self.keep_out_of_logs()
            log.debug("AWS credentials changed (access key %s)", snapshot.access_key)

    def keep_out_of_logs(self) -> None:
        """Mask the current secret key and session token in every log record."""
        logsafe.add_secret(self._snapshot.secret_key)
        logsafe.add_secret(self._snapshot.token)


@dataclass(eq=False, slots=True)
class _Client:
    """One open aiobotocore client, what closes it, and the calls using it now."""

    client: Any
    exits: AsyncExitStack
    calls: int = 0


async def _open_client(session: AioSession, *, region: str, endpoint_url: str | None,
                       config: AioConfig) -> _Client:
    """A new S3 client of ``session``: it signs with what the session's credential
    chain finds."""
    exits = AsyncExitStack()
    client = await exits.enter_async_context(session.create_client(
        "s3", region_name=region, endpoint_url=endpoint_url, config=config))
    return _Client(client, exits)


class _Clients:
    """A connection's aiobotocore clients, all made by ``connect``: the one every call
    starts on (``first``, then each one ``swap`` puts in), and those it replaced
    that calls under way still use. A replaced client is closed once no call
    uses it: by the last such call to end, or by ``close_unused``; ``aclose``
    closes every one."""

    def __init__(self, first: _Client,
                 connect: Callable[[AioSession], Awaitable[_Client]]) -> None:
        self._current = first
        self._replaced: set[_Client] = set()
        self._connect = connect

    async def open(self, session: AioSession) -> _Client:
        """A new client of ``session``, made like the first; no call uses it before
        ``swap``."""
        return await self._connect(session)

    def swap(self, new: _Client) -> None:
        """Start every call from now on on ``new`` (no await)."""
        self._replaced.add(self._current)
        self._current = new

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Any]:
        """The client for one call: the current one, kept open until the call ends."""
        held = self._current
        held.calls += 1
        try:
            yield held.client
        finally:
            held.calls -= 1
            if held in self._replaced and not held.calls:
                await self._close(held)

    async def close_unused(self) -> None:
        """Close the replaced clients that no call uses."""
        for held in [held for held in self._replaced if not held.calls]:
            await self._close(held)

    async def aclose(self) -> None:
        """Close every client, in use or not (the connection's end)."""
        for held in [self._current, *self._replaced]:
            await self._close(held)

    async def _close(self, held: _Client) -> None:
        """Close one client (again: nothing), also in a cancelled task: it only
        closes sockets."""
        self._replaced.discard(held)
        with trio.CancelScope(shield=True):
            await held.exits.aclose()


@dataclass(frozen=True, slots=True)
class _Route:
    """Where a bucket's object ``k`` is: ``{path}/{quote(k)}`` at ``endpoint``, with
    ``host`` as the Host header, signed for ``region`` (None: unsigned)."""

    endpoint: Endpoint
    host: str
    path: str
    region: str | None


@dataclass(frozen=True, slots=True)
class _Page:
    """One page of a listing: sub-prefixes, and keys with their info."""

    prefixes: list[str]
    infos: list[tuple[str, ObjectInfo | None]]


class _Redirected(Exception):
    """S3 says the bucket is elsewhere; never escapes this module."""


class S3Connection:
    """One open client; makes stores for any bucket reachable with it."""

    def __init__(self, clients: _Clients, options: S3Options, policy: RetryPolicy,
                 hot: H1Client, credentials: _Credentials | None) -> None:
        self.clients = clients
        self.options = options
        self.policy = policy
        self.hot = hot
        self.limiter = trio.CapacityLimiter(options.max_connections)
        self._credentials = credentials
        self._routes: dict[str, _Route | None] = {}

    def store(self, bucket: str, prefix: str = "") -> S3Store:
        return S3Store(self, bucket, prefix)

    async def reread_credentials(self) -> None:
        """Run the credential chain again in a new session (the daemon's SIGHUP), so
        changed credentials or config files, or a changed profile in them, are read;
        sign with what it finds from the next request on: the hot path with a new
        snapshot, aiobotocore with a new client of that session (calls under way
        end on the old one, closed once none uses it). If it finds nothing usable
        (file gone, no credentials, unknown profile, no answer within ``timeout``),
        keep the old ones and log one WARNING. Nothing to do for ``anon``."""
        credentials = self._credentials
        if credentials is None:
            return
        found = client = None
        try:
            with trio.fail_after(self.policy.timeout):
                session = AioSession(profile=self.options.profile)
                found = await _read_credentials(session)
                if found is not None:
                    client = await self.clients.open(session)
            reason = "no credentials found"
        except trio.TooSlowError:
            reason = f"no answer within {self.policy.timeout:g} s"
        except Exception as exc:  # whatever a provider raises, the old credentials stay
            reason = f"{type(exc).__name__}: {exc}"
        if found is None or client is None:
            log.warning("AWS credentials not reread, still signing with access key %s: %s",
                        credentials.access_key, reason)
            return
        old = credentials.access_key
        # No await until both are swapped: a request starts with the old credentials
        # and client or with the new.
        credentials.replace(*found)
        self.clients.swap(client)
        log.info("AWS credentials reread (profile %s): access key %s%s",
                 self.options.profile or "default", credentials.access_key,
                 "" if credentials.access_key != old else ", unchanged")
        await self.clients.close_unused()

    def store_for_url(self, url: str) -> S3Store:
        """The store for ``s3://BUCKET[/PREFIX]``."""
        return self.store(*parse_s3_url(url))

    async def route(self, bucket: str) -> _Route | None:
        """Where ``bucket``'s objects are, or None to read them through aiobotocore."""
        try:
            return self._routes[bucket]
        except KeyError:
            route = self._routes[bucket] = await self._resolve(bucket)
            return route

    def reroute(self, bucket: str, reason: str) -> None:
        """Read ``bucket`` through aiobotocore from now on."""
        if self._routes.get(bucket) is not None:
            log.info("s3://%s: %s; reading it through aiobotocore", bucket, reason)
        self._routes[bucket] = None

    async def _resolve(self, bucket: str) -> _Route | None:
        """``bucket``'s endpoint as aiobotocore's resolver gives it for GetObject."""
        context: dict[str, Any] = {}
        try:
            async with self.clients.use() as client:
                url, headers, _ = await client._resolve_endpoint_ruleset(
                    client.meta.service_model.operation_model("GetObject"),
                    {"Bucket": bucket, "Key": "k"}, context)
        except BotoCoreError as exc:  # aiobotocore says so again on the call itself
            log.debug("s3://%s: no endpoint (%s)", bucket, exc)
            return None
        parts = urlsplit(url)
        signing = context.get("signing", {})
        region = None if self.options.anon else signing.get("region")
        usual = (not headers and not parts.query and parts.scheme in ("http", "https")
                 and (self.options.anon or (context.get("auth_type") == "v4" and region
                                            and signing.get("signing_name") == "s3")))
        if not usual:
            log.info("s3://%s: endpoint %s (auth %s) needs botocore; reading it through "
                     "aiobotocore", bucket, url, context.get("auth_type"))
            return None
        proxy = get_environ_proxies(url).get(parts.scheme)
        if proxy:
            log.info("s3://%s: reading it through aiobotocore, which goes through the "
                     "proxy %s", bucket, mask_proxy_url(proxy))
            return None
        tls = parts.scheme == "https"
        endpoint = Endpoint(tls, parts.hostname or "", parts.port or (443 if tls else 80))
        host = parts.netloc.lower().removesuffix(":443" if tls else ":80")
        log.debug("s3://%s at %s, %s", bucket, url, f"signed for {region}" if region
                  else "unsigned")
        return _Route(endpoint, host, parts.path.rstrip("/"), region)

    async def send(self, route: _Route, method: str, key: str,
                   headers: Mapping[str, str]) -> Answer:
        """One signed request for the object ``key`` (full key), its answer read whole."""
        path = f"{route.path}/{quote(key, safe='/~')}"
        request_headers = [("Host", route.host), *_HOT_HEADERS]
        if route.region is not None and self._credentials is not None:
            signer = await self._credentials.signer(route.region)
            request_headers += signer.sign(method, route.host, path).items()
        request_headers += headers.items()
        return await self.hot.request(route.endpoint, method, path, request_headers)


class S3Store:
    """Objects below ``prefix`` in one bucket; keys are relative to ``prefix``."""

    def __init__(self, connection: S3Connection, bucket: str, prefix: str = "") -> None:
        self._conn = connection
        self._clients = connection.clients
        self._policy = connection.policy
        self._limiter = connection.limiter
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
        headers: dict[str, str] = {}
        if byte_range is not None and (byte_range.start or byte_range.length is not None):
            end = "" if byte_range.length is None else byte_range.start + byte_range.length - 1
            headers["Range"] = f"bytes={byte_range.start}-{end}"
        if if_match is not None:
            headers["If-Match"] = if_match

        async def attempt() -> Fetched | None:
            route = await self._conn.route(self.bucket)
            if route is not None:
                try:
                    return await self._get_direct(route, key, headers, byte_range)
                except _Redirected as exc:
                    self._conn.reroute(self.bucket, str(exc))
            return await self._get_boto(key, headers, byte_range)

        fetched = await self._call(key, attempt)
        if fetched is None:  # the range starts at or past the end
            return Fetched(b"", await self._head(key, if_match))
        return fetched

    async def _get_direct(self, route: _Route, key: str, headers: dict[str, str],
                          byte_range: ByteRange | None) -> Fetched | None:
        """One GET on the hot path; None for a 416."""
        answer = await self._conn.send(route, "GET", self.prefix + key, headers)
        status = answer.status
        if status in (200, 206):
            found = answer.headers
            return _fetched(key, found.get("content-range"), answer.body, byte_range,
                            etag=found.get("etag", ""),
                            mtime=http_mtime(found.get("last-modified")))
        if status == 416:
            return None
        raise self._http_error(key, answer)

    async def _get_boto(self, key: str, headers: dict[str, str],
                        byte_range: ByteRange | None) -> Fetched | None:
        """One GetObject through aiobotocore; None for a 416."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + key}
        if "Range" in headers:
            params["Range"] = headers["Range"]
        if "If-Match" in headers:
            params["IfMatch"] = headers["If-Match"]
        async with self._clients.use() as client:
            try:
                response = await client.get_object(**params)
            except ClientError as exc:
                if _status(exc) == 416:
                    return None
                raise
            async with response["Body"] as body:
                data = await body.read()
        return _fetched(key, response.get("ContentRange"), data, byte_range,
                        etag=response.get("ETag", ""), mtime=_mtime(response))

    async def head(self, key: str) -> ObjectInfo:
        return await self._head(key, None)

    async def _head(self, key: str, if_match: str | None) -> ObjectInfo:
        async def attempt() -> ObjectInfo:
            route = await self._conn.route(self.bucket)
            if route is not None:
                try:
                    return await self._head_direct(route, key)
                except _Redirected as exc:
                    self._conn.reroute(self.bucket, str(exc))
            async with self._clients.use() as client:
                response = await client.head_object(Bucket=self.bucket, Key=self.prefix + key)
            return ObjectInfo(response["ContentLength"], response.get("ETag", ""),
                              _mtime(response))

        info = await self._call(key, attempt)
        if if_match is not None and info.etag != if_match:
            raise Changed(key, f"changed (etag {info.etag}, expected {if_match})")
        return info

    async def _head_direct(self, route: _Route, key: str) -> ObjectInfo:
        """One HEAD on the hot path."""
        answer = await self._conn.send(route, "HEAD", self.prefix + key, {})
        if answer.status != 200:
            raise self._http_error(key, answer)
        found = answer.headers
        size = found.get("content-length", "")
        if not size.isdigit():
            raise StorageError(key, f"HEAD answer without a usable Content-Length ({size!r})")
        return ObjectInfo(int(size), found.get("etag", ""),
                          http_mtime(found.get("last-modified")))

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
            listing.keys.extend(key for key, _ in page.infos)
            if token is None:
                return listing

    async def iter_dir(self, prefix: str) -> AsyncIterator[str]:
        token: str | None = None
        while True:
            page, token = await self._list_page(prefix, "/", token)
            for name, _ in page.infos:
                yield name
            for name in page.prefixes:
                yield name
            if token is None:
                return

    async def list_tree(self, prefix: str, info_for: Callable[[str], bool],
                        limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
        """Every key under ``prefix`` with its size, ETag and LastModified (whole
        seconds, as GET's Last-Modified header gives it), a page of
        ``page_size`` keys per request; ``info_for`` is not needed: a listing
        carries every key's info."""
        out: list[tuple[str, ObjectInfo | None]] = []
        token: str | None = None
        while True:
            page, token = await self._list_page(prefix, None, token)
            out.extend(page.infos)
            if len(out) > limit:
                return None
            if token is None:
                return out

    async def fetch_many(self, keys: Sequence[str],
                         limit: int | None = None) -> list[Fetched | LayoutError]:
        return await fetch_each(self, keys, limit)

    async def _list_page(self, prefix: str, delimiter: str | None,
                         token: str | None) -> tuple[_Page, str | None]:
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
            async with self._clients.use() as client:
                return await client.list_objects_v2(**params)

        page = await self._call(prefix or "/", attempt)
        contents = page.get("Contents", [])
        common = page.get("CommonPrefixes", [])
        if delimiter is not None and token is None and prefix and not contents and not common:
            raise NotFound(prefix)
        skip = len(self.prefix)
        infos: list[tuple[str, ObjectInfo | None]] = [
            (o["Key"][skip:], ObjectInfo(o.get("Size", 0), o.get("ETag", ""),
                                         float(math.floor(_mtime(o)))))
            for o in contents if o["Key"] != full]
        next_token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
        return _Page([p["Prefix"][skip:] for p in common], infos), next_token

    async def _call(self, key: str, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation`` with retries, under the limiter, every failure mapped to this
        package's errors."""
        async def attempt() -> T:
            try:
                return await operation()
            except (MountError, Transient):
                raise
            except ClientError as exc:
                error = exc.response.get("Error", {})
                raise self._error(key, _status(exc), str(error.get("Code", "")),
                                  error.get("Message")) from exc
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
                tls = tls_failure(exc)
                if tls is not None:
                    raise StorageError(key, f"TLS failed: {tls}") from exc
                reason = transient_error(exc)
                if reason is not None:
                    raise Transient(reason) from exc
                log.debug("unexpected error reading %s/%s", self.url, key, exc_info=True)
                raise StorageError(key, f"{type(exc).__name__}: {exc}") from exc

        async with self._limiter:
            return await retrying(key, self._policy, attempt, STORES["s3"])

    def _http_error(self, key: str, answer: Answer) -> Exception:
        """What a hot-path answer other than 2xx and 416 means; its body is an S3 XML
        error, or nothing for HEAD."""
        status = answer.status
        text = answer.body.decode("utf-8", "replace")
        code = _ERROR_CODE.search(text)
        message = _ERROR_MESSAGE.search(text)
        if (status in (301, 307) or (code is not None and code[1] in _REDIRECT_CODES)
                or (status == 400 and "x-amz-bucket-region" in answer.headers)):
            region = answer.headers.get("x-amz-bucket-region", "not given")
            return _Redirected(f"HTTP {status} {code[1] if code else ''} (bucket region "
                               f"{region})")
        # botocore's codes for bodiless answers: the status, and its reason phrase
        return self._error(key, status, code[1] if code else str(status),
                           message[1] if message else answer.reason)

    def _error(self, key: str, status: int, code: str, message: str | None) -> Exception:
        """What an S3 error answer (``status``, error ``code``, ``message``) means."""
        said = f"HTTP {status} {code}: {message or 'no message'}"
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


def _fetched(key: str, content_range: str | None, data: bytes, byte_range: ByteRange | None,
             *, etag: str, mtime: float) -> Fetched:
    """A GET's bytes and the whole object's info; a range the server ignored is cut here."""
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
    return Fetched(data, ObjectInfo(size, etag, mtime))


def _status(exc: ClientError) -> int:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status)


def _mtime(response: dict[str, Any]) -> float:
    modified = response.get("LastModified")
    return modified.timestamp() if isinstance(modified, datetime) else 0.0
