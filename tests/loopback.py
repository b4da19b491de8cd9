"""What every test HTTP server here shares: a threaded server on loopback that stops at once.

Owns the life of one ``ThreadingHTTPServer`` on ``127.0.0.1`` at a free
port: its serve thread, the open client connections (so ``stop`` can shut
them down instead of waiting for keep-alive clients), a ``stopping`` event
that handlers wait on instead of sleeping, and quiet logging. Subclasses
(``tests.http_server.RangeHttpServer``, ``tests.faultproxy.FaultProxy``)
give the handler class; the handler reaches its server object as
``self.server.owner``.

Concurrency: handler threads register connections under ``lock`` (which
subclasses also use for their own records); the test thread starts and
stops the server.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Self

from tests import tiers

log = logging.getLogger(__name__)


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: Any

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        """A connection the client reset or broke: log it quietly, not to stderr."""
        log.debug("%s: connection from %s failed", self.owner.name, client_address,
                  exc_info=True)


class LoopbackHandler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 handler that registers its connection with the server object."""

    protocol_version = "HTTP/1.1"
    server: LoopbackServer

    def setup(self) -> None:
        super().setup()
        self.server.owner.track(self.connection, alive=True)

    def finish(self) -> None:
        self.server.owner.track(self.connection, alive=False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s: " + format, self.server.owner.name, *args)  # noqa: G003 - base format


class LoopbackHttp:
    """Start with ``start()`` or as a context manager; ``stop()`` returns promptly."""

    #: Name of the serve thread and of log lines.
    name = "loopback"
    handler: ClassVar[type[LoopbackHandler]]

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: LoopbackServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{self.name} is not started")
        return int(self._server.server_address[1])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def wrap(self, server: LoopbackServer) -> None:
        """Change the listening server before it serves (TLS, for one)."""

    def start(self, port: int = 0) -> None:
        tiers.uses("server")
        """Serve on ``port`` (0: a free one; a port given again restarts a
        stopped server where its clients look for it)."""
        self.stopping.clear()
        server = LoopbackServer(("127.0.0.1", port), self.handler)
        server.owner = self
        self.wrap(server)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self.stopping.set()
        server.shutdown()
        with self.lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def track(self, conn: socket.socket, alive: bool) -> None:
        with self.lock:
            if alive:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
