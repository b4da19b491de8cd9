"""A real HTTP reverse proxy on loopback that injects faults, for testing remote stores.

Runs on ``tests.loopback`` (a threaded server on ``127.0.0.1``, a free port,
stopped at once). Each request is read whole, matched against the registered faults
and, unless a fault answers instead, forwarded unchanged to ``upstream``
(Host and signed headers included, so SigV4 signatures made for the proxy's
address stay as they were; moto does not check them). The upstream answer is
read whole and sent back on a keep-alive connection, with Nagle's algorithm
off (as a real server has it), so the body of an answer is not held back
until the client's delayed ACK of its head, 40 ms later.

Faults match on the method (None: any) and a substring of the request target
(path and query), apply to the next ``times`` matching requests (None: all),
each with ``probability`` (1: every one; below 1, drawn from the proxy's own
``random.Random(seed)``, so a steady mix of faults goes on for as long as a
test runs), and are tried in the order they were added: a fault that matches
but whose draw fails leaves the request to the next one.

- ``error``: answer ``status`` with an S3 XML error body (503 SlowDown, 500, 403 ...).
- ``reset``: send the headers and half the body, then reset the connection (RST).
- ``truncate``: send the headers (full Content-Length) and half the body, then close.
- ``stall``: send nothing for ``seconds`` (cut short by ``stop``), then close.
- ``latency``: wait ``seconds``, then forward as usual (a slow server).

Every request received is recorded (method, target, headers, fault applied);
``count`` and ``hits`` query that record. Concurrency: handler threads share
the fault list, the random draws and the record under one lock; the test
thread may add faults or read counts at any time. ``stop`` ends the serve
loop, wakes stalled handlers and shuts down open client connections, so it
returns promptly.
"""

from __future__ import annotations

import collections
import http.client
import logging
import random
import socket
import struct
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.loopback import LoopbackHandler, LoopbackHttp

log = logging.getLogger(__name__)

#: Headers that belong to one connection, never forwarded.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                         "transfer-encoding", "upgrade"})

_MESSAGES = {
    403: ("AccessDenied", "Access Denied"),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}


@dataclass
class Fault:
    """One registered fault; ``times`` counts down to 0 (None: never); it applies
    to a matching request with ``probability``."""

    kind: str
    method: str | None
    path: str
    times: int | None
    status: int = 503
    code: str = "SlowDown"
    seconds: float = 0.0
    probability: float = 1.0

    def matches(self, method: str, target: str) -> bool:
        return ((self.method is None or self.method == method) and self.path in target
                and (self.times is None or self.times > 0))


@dataclass(frozen=True)
class Seen:
    """One request as the proxy received it."""

    method: str
    target: str
    headers: dict[str, str] = field(default_factory=dict)
    fault: str | None = None


class FaultProxy(LoopbackHttp):
    """Forwards to ``upstream`` (``http://host:port``); use as a context manager."""

    name = "faultproxy"

    def __init__(self, upstream: str, seed: int = 0) -> None:
        super().__init__()
        self._random = random.Random(seed)
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self._faults: list[Fault] = []
        self._seen: list[Seen] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- faults ------------------------------------------------------------

    def error(self, status: int = 503, code: str | None = None, *, method: str | None = None,
              path: str = "", times: int | None = None, probability: float = 1.0) -> None:
        """Answer matching requests with ``status`` and an S3 error body."""
        code = code or _MESSAGES.get(status, ("Error", ""))[0]
        self._add(Fault("error", method, path, times, status=status, code=code,
                        probability=probability))

    def reset(self, *, method: str | None = None, path: str = "",
              times: int | None = None, probability: float = 1.0) -> None:
        """Reset the connection halfway through the body of matching responses."""
        self._add(Fault("reset", method, path, times, probability=probability))

    def truncate(self, *, method: str | None = None, path: str = "",
                 times: int | None = None, probability: float = 1.0) -> None:
        """Send half the body of matching responses, then close the connection."""
        self._add(Fault("truncate", method, path, times, probability=probability))

    def stall(self, seconds: float, *, method: str | None = None, path: str = "",
              times: int | None = None, probability: float = 1.0) -> None:
        """Hold matching requests silently for ``seconds``, then close the connection."""
        self._add(Fault("stall", method, path, times, seconds=seconds,
                        probability=probability))

    def latency(self, seconds: float, *, method: str | None = None, path: str = "",
                times: int | None = None, probability: float = 1.0) -> None:
        """Delay matching requests by ``seconds`` before forwarding them."""
        self._add(Fault("latency", method, path, times, seconds=seconds,
                        probability=probability))

    def clear(self) -> None:
        """Forget every fault and every recorded request."""
        with self.lock:
            self._faults.clear()
            self._seen.clear()

    def _add(self, fault: Fault) -> None:
        with self.lock:
            self._faults.append(fault)

    # -- record ------------------------------------------------------------

    def requests(self, method: str | None = None, path: str = "") -> list[Seen]:
        """Requests received so far whose method and target match."""
        with self.lock:
            return [s for s in self._seen
                    if (method is None or s.method == method) and path in s.target]

    def count(self, method: str | None = None, path: str = "") -> int:
        return len(self.requests(method, path))

    def hits(self) -> collections.Counter[str]:
        """How many requests each kind of fault answered so far."""
        with self.lock:
            return collections.Counter(s.fault for s in self._seen if s.fault is not None)

    def _arrived(self, method: str, target: str, headers: dict[str, str]) -> Fault | None:
        with self.lock:
            fault = next((f for f in self._faults if f.matches(method, target) and
                          (f.probability >= 1 or self._random.random() < f.probability)),
                         None)
            if fault is not None and fault.times is not None:
                fault.times -= 1
            self._seen.append(Seen(method, target, headers, fault.kind if fault else None))
            return fault

    def _wait(self, seconds: float) -> None:
        self.stopping.wait(seconds)


class _Handler(LoopbackHandler):
    timeout = 60
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        proxy: FaultProxy = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = proxy._arrived(self.command, self.path, dict(self.headers.items()))
        try:
            if fault is not None and fault.kind == "error":
                self._send_error(fault.status, fault.code)
                return
            if fault is not None and fault.kind == "stall":
                proxy._wait(fault.seconds)
                self.close_connection = True
                return
            if fault is not None and fault.kind == "latency":
                proxy._wait(fault.seconds)
            status, reason, headers, payload = self._forward(body)
            if fault is not None and fault.kind in ("reset", "truncate"):
                self._send(status, reason, headers, payload, cut=True)
                if fault.kind == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.connection.close()
                self.close_connection = True
                return
            self._send(status, reason, headers, payload, cut=False)
        except OSError as exc:  # the client went away
            log.debug("faultproxy: %s %s: %s", self.command, self.path, exc)
            self.close_connection = True

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        proxy: FaultProxy = self.server.owner
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            return response.status, response.reason, response.getheaders(), payload
        finally:
            conn.close()

    def _send(self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes,
              cut: bool) -> None:
        self.send_response_only(status, reason)
        for name, value in headers:
            lower = name.lower()
            if lower in _HOP_BY_HOP or (lower == "content-length" and self.command != "HEAD"):
                continue
            self.send_header(name, value)
        if self.command == "HEAD":
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload[:len(payload) // 2] if cut else payload)
        self.wfile.flush()

    def _send_error(self, status: int, code: str) -> None:
        message = _MESSAGES.get(status, (code, code))[1]
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message><RequestId>faultproxy</RequestId></Error>"
                ).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()


FaultProxy.handler = _Handler
