"""The ``layouts.service.Service`` over HTTP: an HSDS service node's REST API.

Owns one ``httpx.AsyncClient`` per mount (HTTP/1.1, no redirects followed:
credentials go to the endpoint and nowhere else), opened by ``open_service``
and closed when its context ends, and the credentials it sends: an API key
as ``Authorization: Bearer KEY`` (what h5pyd sends for ``hs_api_key``), else
the user name and password as HTTP basic auth, else nothing (a server that
allows anonymous reads). ``mountd.hscredentials`` decides which.

Requests: ``GET`` with the API's query parameters. JSON answers are read
capped at ``max_metadata`` bytes; binary ones (``Accept:
application/octet-stream``, a dataset selection's values) at the size the
caller expects, so a server cannot make the daemon hold more than it asked
for. Bodies are asked for as ``identity`` and read raw.

Failures: every request goes through ``mountd.io.retry.retrying``, bounded to
``timeout`` seconds in all, with httpx's connect and read timeouts at the
policy's ``stall``, so a server that goes silent fails one attempt and a
dead one fails the request within ``timeout``, never hangs it. 404 and 410
are ``NotFound``; 401 and 403 ``Forbidden`` (EACCES); 408, 429, 5xx,
resets, timeouts and short bodies are retried; any other answer is a
``StorageError`` naming the request (its message carries the server's reason,
cut short). Requests are counted in ``mountd.io.meter.STORES["hsds"]``.

Concurrency: one ``trio.CapacityLimiter(max_connections)`` bounds the requests
in flight, and the pool is as big. The service holds no per-call state; any
number of trio tasks may call it at once.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlencode, urlsplit

import httpx
import trio

from layouts.storage import DEFAULT_MAX_METADATA, too_large
from mountd.errors import Forbidden, MountError, NotFound, SourceError, StorageError
from mountd.io.http import USER_AGENT, read_bigger, tls_failure
from mountd.io.meter import STORES
from mountd.io.retry import RetryPolicy, Transient, retrying, transient_error, transient_status

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Requests in flight at once by default: a service node answers many in
#: parallel, and its data nodes decode chunks in parallel behind it.
DEFAULT_CONNECTIONS = 32
#: Characters of a refusal's body kept in the error it gives.
REASON_CHARS = 200


@dataclass(frozen=True, slots=True)
class Credentials:
    """Who the mount authenticates as; ``api_key`` wins over user and password."""

    username: str | None = None
    password: str | None = None
    api_key: str | None = None

    def header(self) -> str | None:
        """The ``Authorization`` header these credentials send, or None."""
        if self.api_key:
            return f"Bearer {self.api_key}"
        if self.username and self.password:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return f"Basic {token}"
        return None

    def __repr__(self) -> str:
        # Never shown, wherever an object holding them is printed.
        secret = "set" if self.header() else "none"
        return f"Credentials(username={self.username!r}, secret={secret})"


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    """Where the service is, who the mount is, and the request budget."""

    endpoint: str
    credentials: Credentials
    timeout: float = 30.0
    max_connections: int = DEFAULT_CONNECTIONS
    max_metadata: int = DEFAULT_MAX_METADATA


def endpoint_url(url: str) -> str:
    """``url`` as an endpoint: ``http(s)://host[:port][/path]`` without a trailing
    slash, query or credentials; ``SourceError`` if it is not one."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as exc:
        raise SourceError(f"{url}: not a valid URL ({exc})") from exc
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or not port_ok:
        raise SourceError(f"{url}: an HSDS endpoint is an http(s)://HOST[:PORT] URL")
    if parts.username is not None or parts.password is not None:
        raise SourceError(f"{parts.scheme}://{parts.hostname}: credentials in the endpoint URL "
                          "are not read; use -o hs_username=,hs_password_file= or ~/.hscfg")
    if parts.query or parts.fragment:
        raise SourceError(f"{url}: an HSDS endpoint has no query or fragment")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


@asynccontextmanager
async def open_service(options: ServiceOptions) -> AsyncIterator[HsdsService]:
    """One client of the service for the life of the context."""
    policy = RetryPolicy(timeout=options.timeout)
    read_bigger()
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    authorization = options.credentials.header()
    if authorization is not None:
        headers["Authorization"] = authorization
    client = httpx.AsyncClient(
        http1=True, http2=False, follow_redirects=False, headers=headers,
        timeout=httpx.Timeout(policy.stall, pool=policy.timeout),
        limits=httpx.Limits(max_connections=options.max_connections,
                            max_keepalive_connections=options.max_connections))
    async with client:
        yield HsdsService(client, options, policy)


class HsdsService:
    """The REST reads of one endpoint (``layouts.service.Service``)."""

    def __init__(self, client: httpx.AsyncClient, options: ServiceOptions,
                 policy: RetryPolicy) -> None:
        self._client = client
        self._policy = policy
        self._limiter = trio.CapacityLimiter(options.max_connections)
        self._max_metadata = options.max_metadata
        self.endpoint = endpoint_url(options.endpoint)

    @property
    def url(self) -> str:
        return self.endpoint

    def _where(self, path: str, params: Mapping[str, str]) -> str:
        return f"{self.endpoint}{path}?{urlencode(params)}" if params else self.endpoint + path

    async def get_json(self, path: str, params: Mapping[str, str]) -> bytes:
        where = self._where(path, params)
        return await self._call(where, lambda: self._get(where, {}, self._max_metadata))

    async def get_binary(self, path: str, params: Mapping[str, str], limit: int) -> bytes:
        where = self._where(path, params)
        return await self._call(where, lambda: self._get(
            where, {"Accept": "application/octet-stream"}, limit))

    async def _get(self, where: str, headers: dict[str, str], limit: int) -> bytes:
        started = trio.current_time()
        async with self._client.stream("GET", where, headers=headers) as response:
            status = response.status_code
            if status != 200:
                reason = (await _head_of(response)).decode("utf-8", "replace").strip()
                _refuse(where, status, reason or response.reason_phrase)
            length = response.headers.get("Content-Length", "").strip()
            if length.isdigit() and int(length) > limit:
                raise too_large(where, limit, int(length))
            chunks: list[bytes] = []
            seen = 0
            async with aclosing(response.aiter_raw()) as body:
                async for chunk in body:
                    seen += len(chunk)
                    if seen > limit:
                        raise too_large(where, limit)
                    chunks.append(chunk)
            if length.isdigit() and seen != int(length):
                raise Transient(f"short body: {seen} of {length} bytes")
        log.debug("GET %s -> %d bytes in %.3f s", where, seen, trio.current_time() - started)
        return b"".join(chunks)

    async def _call(self, where: str, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation`` with retries, under the limiter, every failure mapped."""
        async def attempt() -> T:
            try:
                return await operation()
            except (MountError, Transient):
                raise
            except Exception as exc:
                tls = tls_failure(exc)
                if tls is not None:
                    raise StorageError(where, f"TLS failed: {tls}") from exc
                reason = transient_error(exc)
                if reason is not None:
                    raise Transient(reason) from exc
                if not isinstance(exc, httpx.HTTPError):
                    log.debug("unexpected error reading %s", where, exc_info=True)
                raise StorageError(where, f"{type(exc).__name__}: {exc}") from exc

        async with self._limiter:
            return await retrying(where, self._policy, attempt, STORES["hsds"])


async def _head_of(response: httpx.Response) -> bytes:
    """The first ``REASON_CHARS`` bytes of a refusal's body (HSDS puts its reason there)."""
    kept = b""
    async with aclosing(response.aiter_raw()) as body:
        async for chunk in body:
            kept += chunk
            if len(kept) >= REASON_CHARS:
                break
    return kept[:REASON_CHARS]


def _refuse(where: str, status: int, reason: str) -> None:
    """Raise what a non-200 answer means."""
    said = f"HTTP {status} {reason}".rstrip()
    if status in (404, 410):
        raise NotFound(where)
    if status == 401:
        raise Forbidden(f"{where}: the service does not accept the mount's credentials ({said})")
    if status == 403:
        raise Forbidden(f"{where}: the mount's user may not read this ({said})")
    if transient_status(status):
        raise Transient(said)
    raise StorageError(where, f"unexpected answer {said}")
