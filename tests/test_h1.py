"""The hot paths' HTTP/1.1 client against scripted loopback servers in the test's trio run.

Each server answers every request on a connection with the next answer of
its script (raw bytes, so framing, cut bodies, stalls and closes are exactly
as written) and records what it saw, so the tests can count connections and
requests: keep-alive reuse, the connections it must not reuse, timeouts,
cancellation, the idle cap, TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mountd.io import h1
from mountd.io.h1 import Endpoint, H1Client
from mountd.io.http import READ_SIZE, tls_failure

pytestmark = pytest.mark.server

HEADERS = [("Host", "127.0.0.1"), ("User-Agent", "test")]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: \"e\"\r\n\r\nhello"


@dataclass(frozen=True)
class Closing:
    """An answer after which the server closes the connection."""

    answer: bytes


Step = bytes | Closing | float | None


@dataclass
class Server:
    """Answers the n-th request it receives (on any connection) with ``script[n]``, the
    last step repeating: bytes are sent, ``Closing`` bytes are sent and the connection
    closed, ``None`` closes it without an answer, a float stalls that many seconds and
    closes it."""

    script: list[Step]
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def handle(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                self.requests.append(head)
                step = self.script[min(len(self.requests), len(self.script)) - 1]
                if isinstance(step, float):
                    await trio.sleep(step)
                if not isinstance(step, bytes | Closing):
                    return
                await stream.send_all(step if isinstance(step, bytes) else step.answer)
                if isinstance(step, Closing):
                    return
        except trio.BrokenResourceError:
            return
        finally:
            await trio.aclose_forcefully(stream)


Handler = Callable[[trio.abc.Stream], Awaitable[None]]


def _over_tls(handler: Handler, tls: ssl.SSLContext) -> Handler:
    async def wrapped(stream: trio.abc.Stream) -> None:
        secure = trio.SSLStream(stream, tls, server_side=True)
        try:
            await secure.do_handshake()
        except trio.BrokenResourceError:
            await trio.aclose_forcefully(stream)
            return
        await handler(secure)
    return wrapped


def run(handler: Handler, test: Callable[[H1Client, Endpoint], Awaitable[None]], *,
        stall: float = 5.0, max_idle: int = 4, tls: ssl.SSLContext | None = None,
        client_tls: ssl.SSLContext | None = None) -> None:
    """``test`` with a client and the endpoint of a loopback server running ``handler``
    (over TLS with ``tls``)."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            serve = handler if tls is None else _over_tls(handler, tls)
            listeners = await nursery.start(partial(trio.serve_tcp, serve, 0,
                                                    host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            client = H1Client(stall=stall, max_idle=max_idle,
                              ssl_context=client_tls or ssl.create_default_context(),
                              read_size=READ_SIZE)
            try:
                await test(client, Endpoint(tls is not None, "127.0.0.1", port))
            finally:
                client.close()
                nursery.cancel_scope.cancel()
    trio.run(main)


def test_connections_are_kept_and_reused() -> None:
    server = Server([OK])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        for _ in range(3):
            answer = await client.request(endpoint, "GET", "/b/k", HEADERS)
            assert (answer.status, answer.reason, answer.body) == (200, "OK", b"hello")
            assert answer.headers["etag"] == '"e"'
    run(server.handle, test)
    assert server.connections == 1 and len(server.requests) == 3
    assert server.requests[0].startswith(b"GET /b/k HTTP/1.1\r\n")
    assert b"\r\nUser-Agent: test" in server.requests[0]


def test_head_chunked_and_informational_answers() -> None:
    server = Server([
        b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n",  # HEAD: no body follows
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        OK,
    ])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        head = await client.request(endpoint, "HEAD", "/k", HEADERS)
        assert (head.status, head.headers["content-length"], head.body) == (200, "1234", b"")
        missing = await client.request(endpoint, "GET", "/k", HEADERS)
        assert (missing.status, missing.reason, missing.body) == (404, "Not Found", b"abcde")
        assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"hello"
    run(server.handle, test)
    assert server.connections == 1


def test_a_limit_caps_the_body_and_closes_the_connection() -> None:
    """Past ``limit`` a 200 raises ``TooLarge`` (announced or, chunked, once it has
    arrived) and its connection is dropped; an error's body may hold up to
    ``ERROR_BODY`` whatever the limit, so a short reason still reads."""
    reason = b"x" * 100
    server = Server([
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsix!!!",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n"
        b"0\r\n\r\n",
        b"HTTP/1.1 503 Slow Down\r\nContent-Length: 100\r\n\r\n" + reason,
        OK,
    ])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        with pytest.raises(h1.TooLarge) as announced:
            await client.request(endpoint, "GET", "/k", HEADERS, limit=5)
        assert announced.value.size == 6
        with pytest.raises(h1.TooLarge) as arrived:
            await client.request(endpoint, "GET", "/k", HEADERS, limit=5)
        assert arrived.value.size is None
        refused = await client.request(endpoint, "GET", "/k", HEADERS, limit=5)
        assert (refused.status, refused.body) == (503, reason)
        assert (await client.request(endpoint, "GET", "/k", HEADERS, limit=5)).body == b"hello"
    run(server.handle, test)
    assert server.connections == 3


def test_connection_close_and_http10_are_not_reused() -> None:
    server = Server([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
                     b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nho", OK])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"hi"
        assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"ho"
        assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"hello"
    run(server.handle, test)
    assert server.connections == 3


def test_connection_closed_while_idle_is_not_used() -> None:
    server = Server([Closing(OK)])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        for _ in range(3):
            assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"hello"
            await trio.sleep(0.05)  # the close arrives while the connection is idle
    run(server.handle, test)
    assert server.connections == 3


def test_keepalive_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h1, "KEEPALIVE", 0.05)
    server = Server([OK])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        await client.request(endpoint, "GET", "/k", HEADERS)
        await client.request(endpoint, "GET", "/k", HEADERS)
        await trio.sleep(0.1)
        await client.request(endpoint, "GET", "/k", HEADERS)
    run(server.handle, test)
    assert server.connections == 2


def test_broken_answers_are_connection_errors() -> None:
    server = Server([OK, None, Closing(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"),
                     b"NOT HTTP AT ALL\r\n\r\n", OK])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        await client.request(endpoint, "GET", "/k", HEADERS)
        for _ in range(3):  # closed instead of an answer, cut short, not HTTP
            with pytest.raises(ConnectionError, match="RemoteProtocolError"):
                await client.request(endpoint, "GET", "/k", HEADERS)
        assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"hello"
    run(server.handle, test)
    assert server.connections == 4  # no connection is used again after it failed


def test_refused_connection() -> None:
    async def main() -> None:
        unused = trio.socket.socket()
        await unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        unused.close()
        client = H1Client(stall=5.0, max_idle=4, ssl_context=ssl.create_default_context(),
                          read_size=READ_SIZE)
        with pytest.raises(ConnectionError, match=r"127\.0\.0\.1:\d+"):
            await client.request(Endpoint(False, "127.0.0.1", port), "GET", "/k", HEADERS)
    trio.run(main)


def test_stall_times_out_and_closes() -> None:
    server = Server([30.0, OK])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        started = trio.current_time()
        with pytest.raises(TimeoutError, match=r"no progress for 0\.3 s"):
            await client.request(endpoint, "GET", "/k", HEADERS)
        assert trio.current_time() - started < 2.0
        assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"hello"
    run(server.handle, test, stall=0.3)
    assert server.connections == 2


def test_slow_but_steady_body_is_not_a_stall() -> None:
    async def trickle(stream: trio.abc.Stream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n")
        for byte in b"abcdef":  # 0.6 s in all, never 0.3 s without a byte
            await trio.sleep(0.1)
            await stream.send_all(bytes([byte]))
        await trio.aclose_forcefully(stream)

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"abcdef"
    run(trickle, test, stall=0.3)


def test_cancelled_request_closes_its_connection() -> None:
    server = Server([OK, 30.0, OK])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        await client.request(endpoint, "GET", "/k", HEADERS)
        with trio.move_on_after(0.2) as scope:
            await client.request(endpoint, "GET", "/k", HEADERS)
        assert scope.cancelled_caught
        assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"hello"
    run(server.handle, test)
    assert server.connections == 2


def test_idle_connections_are_capped_and_none_kept_after_close() -> None:
    server = Server([OK])

    async def test(client: H1Client, endpoint: Endpoint) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(client.request, endpoint, "GET", "/k", HEADERS)
        assert server.connections == 3
        for _ in range(3):  # two were kept, the third closed
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(client.request, endpoint, "GET", "/k", HEADERS)
        assert server.connections == 3
        client.close()
        await client.request(endpoint, "GET", "/k", HEADERS)
        await client.request(endpoint, "GET", "/k", HEADERS)
        assert server.connections == 5
    run(server.handle, test, max_idle=2)


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "h5mount test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(key.public_key()).serial_number(1)
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.SubjectAlternativeName(
                       [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None),
                                  critical=True)
                   .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    server = Server([OK])

    async def reads(client: H1Client, endpoint: Endpoint) -> None:
        for _ in range(2):
            assert (await client.request(endpoint, "GET", "/k", HEADERS)).body == b"hello"
    run(server.handle, reads, tls=server_tls,
        client_tls=ssl.create_default_context(cafile=cert))
    assert server.connections == 1

    async def untrusted(client: H1Client, endpoint: Endpoint) -> None:
        with pytest.raises(ConnectionError) as failure:
            await client.request(endpoint, "GET", "/k", HEADERS)
        assert "CERTIFICATE_VERIFY_FAILED" in (tls_failure(failure.value) or "")
    run(Server([OK]).handle, untrusted, tls=server_tls)
