"""The ``layouts.service.Service`` over HTTP: an HSDS service node's REST API.

Owns the connections of one mount to the endpoint, opened by
``open_service`` and closed when its context ends, and the credentials it
sends: an API key as ``Authorization: Bearer KEY`` (what h5pyd sends for
``hs_api_key``), else the user name and password as HTTP basic auth, else
nothing (a server that allows anonymous reads); ``mountd.hscredentials``
decides which. The connections are a ``mountd.io.h1.H1Client`` (HTTP/1.1
keep-alive, no redirects followed, so credentials go to the endpoint and
nowhere else): through httpx, whose pool polls every connection each time a
request starts and ends, a walk cost the daemon about 6 ms of CPU per
request with 32 connections.

Requests: ``GET`` with the API's query parameters. JSON answers are read
capped at ``max_metadata`` bytes; binary ones (``Accept:
application/octet-stream``, a dataset selection's values) at the size the
caller expects, so a server cannot make the daemon hold more than it asked
for. Bodies are asked for as ``identity`` and read raw.

Failures: every request goes through ``mountd.io.retry.retrying``, bounded to
``timeout`` seconds in all, and a connection that makes no progress for the
policy's ``stall`` fails that attempt, so a server that goes silent fails one
attempt and a dead one fails the request within ``timeout``, never hangs it.
TLS is ``mountd.io.h1.hot_client``'s; a TLS failure is not retried. 404 and 410
are ``NotFound``; 401 and 403 ``Forbidden`` (EACCES); 408, 429, 5xx,
resets, timeouts and short bodies are retried; any other answer is a
``StorageError`` naming the request (its message carries the server's reason,
cut short). Requests are counted in ``mountd.io.meter.STORES["hsds"]``.

Concurrency: one ``trio.CapacityLimiter(max_connections)`` bounds the requests
in flight, and at most as many connections are kept. The service holds no
per-call state; any number of trio tasks may call it at once.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import trio

from layouts.storage import DEFAULT_MAX_METADATA, too_large
from mountd.errors import Corrupt, Forbidden, NotFound, SourceError, StorageError
from mountd.io.h1 import Endpoint, H1Client, TooLarge, hot_client
from mountd.io.http import USER_AGENT, tls_failure
from mountd.io.meter import STORES
from mountd.io.retry import RetryPolicy, Transient, retrying, transient_status

log = logging.getLogger(__name__)

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
    client = hot_client(stall=policy.stall, max_idle=options.max_connections)
    try:
        yield HsdsService(client, options, policy)
    finally:
        client.close()


class HsdsService:
    """The REST reads of one endpoint (``layouts.service.Service``)."""

    def __init__(self, client: H1Client, options: ServiceOptions,
                 policy: RetryPolicy) -> None:
        self._client = client
        self._policy = policy
        self._limiter = trio.CapacityLimiter(options.max_connections)
        self._max_metadata = options.max_metadata
        self.endpoint = endpoint_url(options.endpoint)
        parts = urlsplit(self.endpoint)
        tls = parts.scheme == "https"
        assert parts.hostname is not None
        self._route = Endpoint(tls, parts.hostname, parts.port or (443 if tls else 80))
        self._prefix = parts.path
        self._headers = [("Host", parts.netloc), ("User-Agent", USER_AGENT),
                         ("Accept-Encoding", "identity")]
        authorization = options.credentials.header()
        if authorization is not None:
            self._headers.append(("Authorization", authorization))

    @property
    def url(self) -> str:
        return self.endpoint

    async def get_json(self, path: str, params: Mapping[str, str],
                       limit: int | None = None) -> bytes:
        return await self._get(path, params, [], self._max_metadata if limit is None else limit,
                               binary=False)

    async def get_binary(self, path: str, params: Mapping[str, str], limit: int) -> bytes:
        return await self._get(path, params, [("Accept", "application/octet-stream")], limit,
                               binary=True)

    async def _get(self, path: str, params: Mapping[str, str],
                   extra: list[tuple[str, str]], limit: int, *, binary: bool) -> bytes:
        """The body of ``GET path?params``, with retries, under the limiter."""
        target = f"{self._prefix}{path}?{urlencode(params)}" if params else self._prefix + path
        where = self.endpoint + target[len(self._prefix):]
        headers = self._headers + extra

        async def attempt() -> bytes:
            started = trio.current_time()
            try:
                answer = await self._client.request(self._route, "GET", target, headers,
                                                    limit=limit)
            except TooLarge as exc:
                if binary:
                    raise Corrupt(where, f"the answer holds more than the {limit} bytes "
                                         "of the selection") from exc
                raise too_large(where, limit, exc.size) from exc
            except (ConnectionError, TimeoutError) as exc:
                tls = tls_failure(exc)
                if tls is not None:
                    raise StorageError(where, f"TLS failed: {tls}") from exc
                raise Transient(f"{type(exc).__name__}: {exc}") from exc
            if answer.status != 200:
                reason = answer.body[:REASON_CHARS].decode("utf-8", "replace").strip()
                _refuse(where, answer.status, reason or answer.reason)
            log.debug("GET %s -> %d bytes in %.3f s", where, len(answer.body),
                      trio.current_time() - started)
            return answer.body

        async with self._limiter:
            return await retrying(where, self._policy, attempt, STORES["hsds"])


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
