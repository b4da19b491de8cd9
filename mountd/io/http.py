"""A ``Store`` over plain HTTP(S) byte ranges: key ``k`` of origin ``O`` is the URL ``O/k``.

Owns one ``httpx.AsyncClient`` per mount (HTTP/1.1, redirects followed,
User-Agent ``h5mount/VERSION``), opened by ``open_http`` and closed when its
context ends; httpx runs on trio natively. ``open_http`` also raises
httpcore's socket read size to ``READ_SIZE`` process-wide (see there).
``HttpConnection`` hands out one ``HttpStore`` per origin
(``scheme://host[:port]``), memoised, so all the URLs on one server share
the pool. ``locate(url)`` splits a URL into that store and a key: the path
without its leading ``/`` (percent-encoding as given), plus ``?query`` if any.
Servers cannot list, so the listing calls raise ``StorageError``.

Reads:

- A range is one GET with ``Range: bytes=a-b`` (``bytes=a-`` to the end). A
  206 answer gives the object's size in ``Content-Range`` and must hold
  exactly the bytes it promises. A 200 (a server that ignores Range; logged
  once per origin) is cut here, reading no further than the range's end when
  ``Content-Length`` gives the size. A 416 (the range starts at or past the
  end) is ``b""``, with the size from ``bytes */N`` when the answer also
  carries the ETag, else from a HEAD. HTTP cannot ask for zero bytes, so a
  zero-length range is a HEAD.
- ``head`` is a HEAD. An origin that refuses HEAD (403, 405 or 501: a URL
  presigned for GET gives 403) is asked ``bytes=0-0`` with GET instead, from
  then on (logged once).
- Every request asks for ``Accept-Encoding: identity`` (ranges count stored
  bytes) and bodies are read raw; a compressed answer is refused.
- ``ObjectInfo.etag`` is the ETag header verbatim (strong or weak) or, from a
  server that sends none, ``"{Last-Modified}-{size}"``, so a rewrite still
  shows. ``if_match`` goes out as ``If-Match`` only if it is a strong ETag
  (If-Match compares strongly, so a weak or made-up tag would never match);
  a 412, or an answer whose etag is not ``if_match``, raises ``Changed``.
  ``mtime`` is Last-Modified, else 0.

Failures: every operation goes through ``mountd.io.retry.retrying``, which
bounds it to ``timeout`` seconds in all; the httpx connect/read/write
timeouts are the policy's ``stall``, so a server that goes silent fails one
attempt, not the read. 404/410 are ``NotFound``; 401/403 and other 4xx a
``StorageError`` at once; 408/429/5xx, connection errors, resets, timeouts
and short bodies are retried. A TLS failure (an untrusted certificate) is
not retried. Errors name the full URL (their messages show it with its
secrets masked: ``layouts.errors``). No httpx exception leaves this module.

Concurrency: one ``trio.CapacityLimiter(max_connections)`` per connection
bounds the operations in flight over all its stores, and the pool is as big,
so a request never waits for a connection. Time spent waiting for the limiter
is not part of an operation's budget; its retries keep the slot. Stores hold
no per-call state (only once-per-origin flags, set without an ``await``); any
number of trio tasks may use them at once.

Proxies and CA certificates come from the usual environment variables
(``HTTPS_PROXY``, ``NO_PROXY``, ``SSL_CERT_FILE``, ...), as httpx reads them.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TypeVar
from urllib.parse import SplitResult, urlsplit

import httpcore
import httpx
import trio

import mountd
from layouts.errors import LayoutError
from layouts.storage import ByteRange, Fetched, Listing, ObjectInfo, fetch_each
from mountd.errors import Changed, MountError, NotFound, StorageError
from mountd.io.meter import STORES
from mountd.io.retry import RetryPolicy, Transient, retrying, transient_error, transient_status

log = logging.getLogger(__name__)

T = TypeVar("T")

USER_AGENT = f"h5mount/{getattr(mountd, '__version__', 'unknown')}"

#: Bytes httpcore asks the socket for at a time. Its default, 64 KiB, makes
#: parsing cost as much as copying: measured on loopback, 1 MiB reads take the
#: CPU of reading 8 MiB ranges from 1.25 to 0.62 s per GiB.
READ_SIZE = 1 << 20

_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+)")
#: HEAD answers that may only mean "no HEAD here": a URL presigned for GET gives 403.
_NO_HEAD = frozenset({403, 405, 501})
#: TLS errors that say the connection broke, not that it cannot be trusted.
_TLS_TRANSIENT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """``timeout`` bounds each operation, retries included (seconds);
    ``max_connections`` bounds the requests in flight and the pool."""

    timeout: float = 30.0
    max_connections: int = 16


@asynccontextmanager
async def open_http(options: HttpOptions) -> AsyncIterator[HttpConnection]:
    """One HTTP client for the life of the context."""
    policy = RetryPolicy(timeout=options.timeout)
    read_bigger()
    client = httpx.AsyncClient(
        http1=True, http2=False, follow_redirects=True,
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        timeout=httpx.Timeout(policy.stall, pool=policy.timeout),
        limits=httpx.Limits(max_connections=options.max_connections,
                            max_keepalive_connections=options.max_connections))
    async with client:
        log.debug("HTTP client: %d connections, %g s per operation",
                  options.max_connections, options.timeout)
        yield HttpConnection(client, options, policy)


def read_bigger() -> None:
    """Let httpcore read ``READ_SIZE`` bytes per socket call. This is a class attribute,
    so it holds for every httpx client in the process (the S3 one gains too)."""
    connection = httpcore.AsyncHTTP11Connection
    if getattr(connection, "READ_NUM_BYTES", READ_SIZE) < READ_SIZE:
        connection.READ_NUM_BYTES = READ_SIZE


class HttpConnection:
    """One open client; makes the store of any origin."""

    def __init__(self, client: httpx.AsyncClient, options: HttpOptions,
                 policy: RetryPolicy) -> None:
        self.client = client
        self.options = options
        self.policy = policy
        self.limiter = trio.CapacityLimiter(options.max_connections)
        self._stores: dict[str, HttpStore] = {}

    def store(self, origin: str) -> HttpStore:
        """The store of ``origin`` (``scheme://host[:port]``), one per origin."""
        parts = _split(origin)
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise StorageError(origin, "not an origin (scheme://host[:port], no path)")
        origin = f"{parts.scheme.lower()}://{parts.netloc.lower()}"
        store = self._stores.get(origin)
        if store is None:
            store = self._stores[origin] = HttpStore(self, origin)
        return store

    def locate(self, url: str) -> tuple[HttpStore, str]:
        """The store of ``url``'s origin and the key of ``url`` in it."""
        parts = _split(url)
        key = parts.path.removeprefix("/") + (f"?{parts.query}" if parts.query else "")
        return self.store(f"{parts.scheme}://{parts.netloc}"), key


def _split(url: str) -> SplitResult:
    """``url`` split, if it is an absolute http(s) URL without credentials."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as exc:
        raise StorageError(url, f"not a valid URL ({exc})") from exc
    if parts.scheme.lower() not in ("http", "https"):
        raise StorageError(url, "not an http:// or https:// URL")
    if not parts.hostname or not port_ok:
        raise StorageError(url, "no host or no valid port in the URL")
    if parts.username is not None or parts.password is not None:
        raise StorageError(f"{parts.scheme}://{parts.hostname}",
                           "credentials in URLs are not supported")
    return parts


class HttpStore:
    """The objects of one origin; key ``k`` is the URL ``{origin}/{k}``."""

    def __init__(self, connection: HttpConnection, origin: str) -> None:
        self._client = connection.client
        self._policy = connection.policy
        self._limiter = connection.limiter
        self.origin = origin
        self._said_no_ranges = False
        self._no_head = False

    @property
    def url(self) -> str:
        return self.origin

    def url_for(self, key: str) -> str:
        return f"{self.origin}/{key}"

    async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        return (await self.fetch(key, byte_range)).data

    async def fetch(self, key: str, byte_range: ByteRange | None = None,
                    if_match: str | None = None) -> Fetched:
        url = self.url_for(key)
        if byte_range is not None and byte_range.length == 0:
            return Fetched(b"", await self._head(url, if_match))
        fetched = await self._call(url, lambda: self._get(url, byte_range, if_match))
        if fetched is None:  # 416 without the validators: ask for them
            return Fetched(b"", await self._head(url, if_match))
        _check_match(url, fetched.info, if_match)
        return fetched

    async def head(self, key: str) -> ObjectInfo:
        return await self._head(self.url_for(key), None)

    async def exists(self, key: str) -> bool:
        try:
            await self.head(key)
        except NotFound:
            return False
        return True

    async def list_dir(self, prefix: str) -> Listing:
        raise StorageError(self.url_for(prefix), "HTTP servers cannot list")

    def iter_dir(self, prefix: str) -> AsyncIterator[str]:
        raise StorageError(self.url_for(prefix), "HTTP servers cannot list")

    async def list_tree(self, prefix: str, info_for: Callable[[str], bool],
                        limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
        raise StorageError(self.url_for(prefix), "HTTP servers cannot list")

    async def fetch_many(self, keys: Sequence[str],
                         limit: int | None = None) -> list[Fetched | LayoutError]:
        return await fetch_each(self, keys, limit)

    async def _head(self, url: str, if_match: str | None) -> ObjectInfo:
        info = None if self._no_head else await self._call(url, lambda: self._head_once(url))
        if info is None:  # HEAD refused: the first byte's answer says as much
            fetched = await self._call(url, lambda: self._get(url, ByteRange(0, 1), None,
                                                              need_etag=False))
            if fetched is None:
                raise StorageError(url, "cannot tell the size: HEAD is refused and a 416 "
                                        "answer has no Content-Range")
            info = fetched.info
        _check_match(url, info, if_match)
        return info

    async def _head_once(self, url: str) -> ObjectInfo | None:
        """One HEAD; None if the server refuses HEAD (it is not asked again)."""
        started = trio.current_time()
        async with self._client.stream("HEAD", url) as response:
            refused = response.status_code in _NO_HEAD
            if not refused:
                _raise_for_status(url, response, ok=200)
        log.debug("HEAD %s -> %d in %.3f s", url, response.status_code,
                  trio.current_time() - started)
        if refused:
            if not self._no_head:
                self._no_head = True
                log.debug("%s refuses HEAD (HTTP %d); asking GET for one byte instead",
                          self.origin, response.status_code)
            return None
        size = _content_length(response)
        if size is None:
            raise StorageError(url, "the server gives no size (HEAD without Content-Length)")
        return _info(response.headers, size)

    async def _get(self, url: str, byte_range: ByteRange | None, if_match: str | None,
                   need_etag: bool = True) -> Fetched | None:
        """One GET; None for a 416 that does not say what the object is (with
        ``need_etag``, one without an ETag does not)."""
        headers = _headers(byte_range, if_match)
        started = trio.current_time()
        async with self._client.stream("GET", url, headers=headers) as response:
            if response.status_code == 416:
                fetched = _unsatisfiable(response, need_etag)
            else:
                _raise_for_status(url, response, ok=206 if "Range" in headers else 200)
                fetched = await self._body(url, response, byte_range, "Range" in headers)
        log.debug("GET %s (%s) -> %d, %d bytes in %.3f s", url, headers.get("Range", "all"),
                  response.status_code, len(fetched.data) if fetched else 0,
                  trio.current_time() - started)
        return fetched

    async def _body(self, url: str, response: httpx.Response, byte_range: ByteRange | None,
                    ranged: bool) -> Fetched:
        """The requested bytes of a 200 or 206 answer, and the whole object's info."""
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise StorageError(url, f"the server sent Content-Encoding {encoding}, not the "
                                    "stored bytes, though asked for identity")
        start = byte_range.start if byte_range is not None else 0
        stop = (None if byte_range is None or byte_range.length is None
                else start + byte_range.length)
        if response.status_code == 206:
            first, last, size = _content_range(url, response)
            if first != start or last != (size if stop is None else min(stop, size)) - 1:
                raise StorageError(url, f"asked for {response.request.headers.get('Range')}, "
                                        f"got bytes {first}-{last}/{size}")
            data, count = await _read(response, 0, None, early=False)
            if count != last - first + 1:
                raise Transient(f"short body: {count} of {last - first + 1} bytes")
            return Fetched(data, _info(response.headers, size))
        if ranged and not self._said_no_ranges:
            self._said_no_ranges = True
            log.debug("%s ignores Range requests; reading whole answers and cutting them",
                      self.origin)
        length = _content_length(response)
        data, count = await _read(response, start, stop, early=length is not None)
        return Fetched(data, _info(response.headers, count if length is None else length))

    async def _call(self, url: str, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation`` with retries, under the limiter, every failure mapped to
        this package's errors."""
        async def attempt() -> T:
            try:
                return await operation()
            except (MountError, Transient):
                raise
            except Exception as exc:
                tls = tls_failure(exc)
                if tls is not None:
                    raise StorageError(url, f"TLS failed: {tls}") from exc
                reason = transient_error(exc)
                if reason is not None:
                    raise Transient(reason) from exc
                if not isinstance(exc, httpx.HTTPError):
                    log.debug("unexpected error reading %s", url, exc_info=True)
                raise StorageError(url, f"{type(exc).__name__}: {exc}") from exc

        async with self._limiter:
            return await retrying(url, self._policy, attempt, STORES["http"])


def _headers(byte_range: ByteRange | None, if_match: str | None) -> dict[str, str]:
    headers = {}
    if byte_range is not None and (byte_range.start or byte_range.length is not None):
        end = "" if byte_range.length is None else byte_range.start + byte_range.length - 1
        headers["Range"] = f"bytes={byte_range.start}-{end}"
    if if_match is not None and if_match.startswith('"'):
        headers["If-Match"] = if_match
    return headers


def _raise_for_status(url: str, response: httpx.Response, ok: int) -> None:
    """Return if ``response`` has status 200 or ``ok``; else raise what it means."""
    status = response.status_code
    if status in (200, ok):
        return
    said = f"HTTP {status} {response.reason_phrase}".rstrip()
    if status in (404, 410):
        raise NotFound(url)
    if status == 412:
        raise Changed(url, "changed since it was first read (If-Match failed)")
    if status in (401, 403):
        raise StorageError(url, f"access denied ({said}); h5mount sends no credentials, "
                                "so the URL must be readable without them")
    if transient_status(status):
        raise Transient(said)
    raise StorageError(url, f"unexpected answer {said}")


async def _read(response: httpx.Response, start: int, stop: int | None,
                early: bool) -> tuple[bytes, int]:
    """Bytes ``[start, stop)`` of the body, and how many bytes were read; with
    ``early``, reading stops at ``stop``. Whole chunks are kept without a copy."""
    chunks: list[bytes] = []
    seen = 0
    async with aclosing(response.aiter_raw()) as body:
        async for chunk in body:
            end = seen + len(chunk)
            if end > start and (stop is None or seen < stop):
                chunks.append(chunk[max(start - seen, 0):None if stop is None else stop - seen])
            seen = end
            if early and stop is not None and seen >= stop:
                break
    return b"".join(chunks), seen


def _unsatisfiable(response: httpx.Response, need_etag: bool) -> Fetched | None:
    """A 416 as an empty read, if it carries the size (and the ETag, if needed)."""
    match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
    if match is None or (need_etag and "ETag" not in response.headers):
        return None
    return Fetched(b"", _info(response.headers, int(match[3])))


def _content_range(url: str, response: httpx.Response) -> tuple[int, int, int]:
    """(first, last, size) of a 206 answer's ``Content-Range: bytes first-last/size``."""
    value = response.headers.get("Content-Range", "")
    match = _CONTENT_RANGE.fullmatch(value.strip())
    if match is None or match[1] is None:
        raise StorageError(url, f"unusable Content-Range {value!r} in a 206 answer")
    return int(match[1]), int(match[2]), int(match[3])


def _content_length(response: httpx.Response) -> int | None:
    value = response.headers.get("Content-Length", "").strip()
    return int(value) if value.isdigit() else None


def _info(headers: httpx.Headers, size: int) -> ObjectInfo:
    """Size, validator and mtime; without an ETag the validator is Last-Modified and size."""
    modified = headers.get("Last-Modified")
    etag = headers.get("ETag") or f"{modified or 'no-date'}-{size}"
    return ObjectInfo(size, etag, http_mtime(modified))


def http_mtime(modified: str | None) -> float:
    """A Last-Modified header as seconds since the epoch; 0 if missing or unusable."""
    if not modified:
        return 0.0
    try:
        return parsedate_to_datetime(modified).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0


def _check_match(url: str, info: ObjectInfo, if_match: str | None) -> None:
    if if_match is not None and info.etag != if_match:
        raise Changed(url, f"changed (etag {info.etag}, expected {if_match})")


def tls_failure(exc: BaseException) -> str | None:
    """Why ``exc`` (or what caused it) is a TLS failure no retry can fix, or None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError) and not isinstance(seen, _TLS_TRANSIENT):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return None
