"""HTTP/1.1 keep-alive connections for the hot paths: bodiless requests, whole answers.

Owns the connections that ``mountd.io.s3`` sends its GetObject and HeadObject
requests on (one ``H1Client`` per S3 connection, closed with it), and those
``mountd.io.hsservice`` sends an HSDS service's reads on. Why not an
``httpx.AsyncClient``, which the store used before: per request, httpx
builds and merges URLs and headers, reads cookies out of every answer, and
httpcore's pool scans all its connections (once per idle one, with a
``poll`` each) when a request starts and again when it ends, so the client
cost about four times what the exchange on the socket does, and more the
bigger the pool. Here a request is one h11 exchange on a connection taken
from a stack.

- Connections: ``trio.open_tcp_stream`` (TCP_NODELAY), then, for https, TLS
  with ``ssl_context``, the host name giving SNI and the certificate check.
  After a whole answer a connection is kept if both sides allow it (h11 says:
  HTTP/1.1 and no ``Connection: close``), at most ``max_idle`` in all, and
  reused most recently used first, for at most ``KEEPALIVE`` seconds; one the
  server has closed meanwhile (its socket is readable while idle) is closed
  when it is taken. A failure, a timeout or a cancellation closes the
  connection it happened on.
- Requests carry no body. The whole answer is read (up to ``read_size``
  bytes per socket read) and returned: status, reason, headers (lower-case
  names, latin-1 values; a repeated header keeps its last value) and the
  body as sent, with no Content-Encoding decoding. h11 frames it
  (Content-Length, chunked, or up to the close; no body for HEAD) and rejects
  a malformed or cut answer. A request may cap the body of its answer
  (``limit`` for a 200, at least ``ERROR_BODY`` for another status): more
  raises ``TooLarge`` and closes the connection.
- Time: a request raises ``TimeoutError`` when connecting, sending or
  reading makes no progress for ``stall`` seconds. Nothing here bounds a
  request in all: the caller's retry deadline does.
- Errors: a connection that cannot be made or breaks, and an answer h11
  rejects, raise ``ConnectionError`` with the cause chained (a TLS failure
  keeps its ``ssl.SSLError`` in the ``__cause__`` chain, where
  ``mountd.io.http.tls_failure`` finds it). Nothing is retried here.

Concurrency: any number of trio tasks may send requests at once; each has a
connection to itself, and the idle stacks change with no ``await`` in
between. The caller bounds the requests in flight (``mountd.io.s3`` holds
its limiter around each), hence the connections open. ``close`` closes the
idle connections and keeps none from then on; a request still in flight
closes its own.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

import h11
import httpx
import trio

from mountd.io.http import READ_SIZE

log = logging.getLogger(__name__)

#: Seconds an idle connection is kept for reuse (httpx's default too).
KEEPALIVE = 5.0
#: Longest answer head (status line and headers), as httpcore allows.
MAX_HEAD = 100 * 1024
#: Most bytes read of an answer other than 200 to a request with a ``limit``.
ERROR_BODY = 64 * 1024

#: What a broken connection raises under trio (``OSError``: a failed connect).
_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
           h11.RemoteProtocolError)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a request goes: TLS or not, host name and port."""

    tls: bool
    hostname: str
    port: int

    def __str__(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.hostname}:{self.port}"


class TooLarge(Exception):
    """An answer's body holds more than the request's ``limit``; ``size`` is its
    announced length, if it had one."""

    def __init__(self, size: int | None) -> None:
        super().__init__(f"an answer of {size if size is not None else 'more'} bytes")
        self.size = size


class Answer:
    """A whole HTTP answer: ``headers`` has lower-case names."""

    __slots__ = ("body", "headers", "reason", "status")

    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body


class _Connection:
    """One open connection and its HTTP/1.1 state."""

    __slots__ = ("idle_since", "protocol", "socket", "stream")

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self.stream = stream
        self.socket = socket
        self.protocol = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        self.idle_since = 0.0


def hot_client(*, stall: float, max_idle: int) -> H1Client:
    """The client a store's hot path uses: TLS as httpx's default context sets it up
    (its CA certificates, ``SSL_CERT_FILE`` too) for HTTP/1.1 only, and socket
    reads of ``READ_SIZE``."""
    tls = httpx.create_ssl_context()
    tls.set_alpn_protocols(["http/1.1"])
    return H1Client(stall=stall, max_idle=max_idle, ssl_context=tls, read_size=READ_SIZE)


class H1Client:
    """Bodiless HTTP/1.1 requests over kept-alive connections to any number of endpoints."""

    def __init__(self, *, stall: float, max_idle: int, ssl_context: ssl.SSLContext,
                 read_size: int) -> None:
        self._stall = stall
        self._max_idle = max_idle
        self._ssl_context = ssl_context
        self._read_size = read_size
        self._idle: dict[Endpoint, list[_Connection]] = {}
        self._idle_count = 0
        self._closed = False

    async def request(self, endpoint: Endpoint, method: str, target: str,
                      headers: list[tuple[str, str]], limit: int | None = None) -> Answer:
        """Send ``method target`` with ``headers`` (Host included) and read the answer;
        with ``limit``, a 200 answer whose body holds more bytes (another answer:
        more than ``ERROR_BODY``, if that is more) raises ``TooLarge`` (and its
        connection is closed) once they have arrived or been announced."""
        connection = self._take(endpoint)
        stall = self._stall
        with trio.CancelScope(deadline=trio.current_time() + stall) as scope:
            try:
                if connection is None:
                    connection = await self._connect(endpoint)
                    scope.deadline = trio.current_time() + stall
                answer = await self._exchange(connection, scope, method, target, headers,
                                              limit=limit)
            except _BROKEN as exc:
                if connection is not None:
                    connection.socket.close()
                raise ConnectionError(f"{endpoint}: {type(exc).__name__}: {exc}") from exc
            except BaseException:
                if connection is not None:
                    connection.socket.close()
                raise
        if scope.cancelled_caught:  # the connection is closed already
            raise TimeoutError(f"{endpoint}: no progress for {stall:g} s")
        protocol = connection.protocol
        if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
            protocol.start_next_cycle()
            self._keep(endpoint, connection)
        else:
            connection.socket.close()
        return answer

    def close(self) -> None:
        """Close the idle connections; keep none from now on."""
        self._closed = True
        for stack in self._idle.values():
            for connection in stack:
                connection.socket.close()
        self._idle.clear()
        self._idle_count = 0

    def _take(self, endpoint: Endpoint) -> _Connection | None:
        """The most recently used idle connection to ``endpoint`` still usable, if any."""
        stack = self._idle.get(endpoint)
        if not stack:
            return None
        oldest = trio.current_time() - KEEPALIVE
        while stack:
            connection = stack.pop()
            self._idle_count -= 1
            if connection.idle_since > oldest and not connection.socket.is_readable():
                return connection
            connection.socket.close()  # expired, or closed by the server
        return None

    def _keep(self, endpoint: Endpoint, connection: _Connection) -> None:
        if self._closed or self._idle_count >= self._max_idle:
            connection.socket.close()
            return
        connection.idle_since = trio.current_time()
        stack = self._idle.get(endpoint)
        if stack is None:
            stack = self._idle[endpoint] = []
        stack.append(connection)
        self._idle_count += 1

    async def _connect(self, endpoint: Endpoint) -> _Connection:
        stream = await trio.open_tcp_stream(endpoint.hostname, endpoint.port)
        socket = stream.socket
        if not endpoint.tls:
            return _Connection(stream, socket)
        tls = trio.SSLStream(stream, self._ssl_context, server_hostname=endpoint.hostname,
                             https_compatible=True)
        try:
            await tls.do_handshake()
        except BaseException:
            socket.close()
            raise
        log.debug("TLS connection to %s", endpoint)
        return _Connection(tls, socket)

    async def _exchange(self, connection: _Connection, scope: trio.CancelScope, method: str,
                        target: str, headers: list[tuple[str, str]], *,
                        limit: int | None) -> Answer:
        """One request and its whole answer on ``connection``; each step that makes
        progress moves ``scope``'s deadline ``stall`` seconds on."""
        protocol = connection.protocol
        stream = connection.stream
        request = h11.Request(method=method, target=target, headers=headers)
        await stream.send_all((protocol.send(request) or b"")
                              + (protocol.send(h11.EndOfMessage()) or b""))
        stall, read_size = self._stall, self._read_size
        scope.deadline = trio.current_time() + stall
        event = protocol.next_event()
        while not isinstance(event, h11.Response):  # the head; 1xx answers are skipped
            if event is h11.NEED_DATA:
                protocol.receive_data(await stream.receive_some(read_size))
                scope.deadline = trio.current_time() + stall
            elif not isinstance(event, h11.InformationalResponse):
                raise h11.RemoteProtocolError(f"{event!r} before the answer's head")
            event = protocol.next_event()
        response = event
        if limit is not None:  # an error's body is capped too, where it is a reason
            limit = limit if response.status_code == 200 else max(limit, ERROR_BODY)
            announced = dict(response.headers).get(b"content-length", b"").strip()
            if announced.isdigit() and int(announced) > limit:
                raise TooLarge(int(announced))
        chunks: list[bytes] = []
        received = 0
        event = protocol.next_event()
        while not isinstance(event, h11.EndOfMessage):
            if event is h11.NEED_DATA:
                protocol.receive_data(await stream.receive_some(read_size))
                scope.deadline = trio.current_time() + stall
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
                received += len(event.data)
                if limit is not None and received > limit:
                    raise TooLarge(None)
            else:
                raise h11.RemoteProtocolError(f"{event!r} in the answer's body")
            event = protocol.next_event()
        found = {name.lower().decode("latin-1"): value.decode("latin-1")
                 for name, value in response.headers.raw_items()}
        return Answer(response.status_code, response.reason.decode("latin-1"), found,
                      b"".join(chunks))
