"""A real static-file HTTP/1.1 server on loopback with byte ranges, for tests and benchmarks.

Runs on ``tests.loopback`` (a threaded server on ``127.0.0.1``, a free port,
one handler thread per connection, stopped at once). It serves the regular files
below ``root`` (the query string is ignored; directories, missing files and
paths escaping ``root`` get 404/403) with GET and HEAD, keep-alive and a
``Content-Length`` on every answer. Bodies go out with ``socket.sendfile``
(``os.sendfile`` underneath), so one connection moves about a GiB/s on loopback.

HTTP behaviour, each part switchable to test a client's fallbacks:

- ``ranges=True``: one ``Range: bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` on a
  GET gets 206 with ``Content-Range``, or 416 with ``bytes */SIZE`` when it
  starts at or past the end. Several ranges or a malformed header are ignored
  (200, the whole file), as RFC 9110 allows. ``ranges=False`` ignores every
  Range header and sends no ``Accept-Ranges``.
- ``etags=True``: a strong ``ETag`` made of ``st_mtime_ns`` and the size, and
  ``If-Match`` answered 412 on a mismatch. ``etags=False`` sends no ETag, so
  any ``If-Match`` but ``*`` fails (412), as RFC 9110 says.
- ``Last-Modified`` is always sent; ``delay`` seconds are waited before each
  answer (to make requests overlap); ``certfile`` (a PEM holding a key and its
  certificate) serves HTTPS instead.

Every answered request is recorded as ``(method, target, range header or None,
status)`` as its answer starts, before the client can see it; ``peak`` is the
most requests handled at once (from arrival to the start of the answer)
since ``clear``.
Concurrency: handler threads share the record and the counters under one
lock; the test thread may read them or change ``delay`` at any time. ``stop``
ends the serve loop, shuts down open connections and joins the serve thread.
"""

from __future__ import annotations

import email.utils
import logging
import os
import re
import ssl
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from tests.loopback import LoopbackHandler, LoopbackHttp, LoopbackServer

log = logging.getLogger(__name__)

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")

#: One recorded request: method, target (path and query), Range header, status.
Request = tuple[str, str, str | None, int]


class RangeHttpServer(LoopbackHttp):
    """Serves the files below ``root``; use as a context manager."""

    name = "rangehttp"

    def __init__(self, root: Path, *, etags: bool = True, ranges: bool = True,
                 certfile: Path | None = None) -> None:
        super().__init__()
        self.root = Path(root).resolve()
        self.etags = etags
        self.ranges = ranges
        self.certfile = certfile
        self.delay = 0.0
        self._log: list[Request] = []
        self._active = 0
        self._peak = 0

    @property
    def url(self) -> str:
        scheme = "https" if self.certfile else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def url_for(self, path: str | os.PathLike[str]) -> str:
        """The URL of ``path``, relative to ``root``."""
        return f"{self.url}/{Path(path).as_posix().lstrip('/')}"

    def wrap(self, server: LoopbackServer) -> None:
        if self.certfile is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.certfile)
            server.socket = context.wrap_socket(server.socket, server_side=True)

    # -- record ------------------------------------------------------------

    def requests(self) -> list[Request]:
        with self.lock:
            return list(self._log)

    def peak(self) -> int:
        """The most requests handled at once since the last ``clear``."""
        with self.lock:
            return self._peak

    def clear(self) -> None:
        with self.lock:
            self._log.clear()
            self._peak = self._active

    def _begin(self) -> None:
        with self.lock:
            self._active += 1
            self._peak = max(self._peak, self._active)

    def _end(self, request: Request | None) -> None:
        """A request has its answer (recorded) or was dropped (None)."""
        with self.lock:
            self._active -= 1
            if request is not None:
                self._log.append(request)

    # -- files -------------------------------------------------------------

    def _resolve(self, target: str) -> Path | None:
        """The file ``target`` names, None if it escapes ``root``."""
        path = (self.root / unquote(urlsplit(target).path).lstrip("/")).resolve()
        return path if path.is_relative_to(self.root) else None


class _Handler(LoopbackHandler):
    disable_nagle_algorithm = True
    _answered: bool

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        files: RangeHttpServer = self.server.owner
        files._begin()
        self._answered = False
        try:
            if files.delay:
                files.stopping.wait(files.delay)
            self._answer(files)
        except OSError as exc:  # the client went away
            log.debug("rangehttp: %s %s: %s", self.command, self.path, exc)
            self.close_connection = True
        finally:
            if not self._answered:
                files._end(None)

    def _answer(self, files: RangeHttpServer) -> None:
        path = files._resolve(self.path)
        if path is None:
            self._empty(403)
            return
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below, after sendfile
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            self._empty(404)
            return
        except PermissionError:
            self._empty(403)
            return
        with f:
            st = os.fstat(f.fileno())
            size = st.st_size
            etag = f'"{st.st_mtime_ns:x}-{size:x}"' if files.etags else None
            headers = {"Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True)}
            if etag is not None:
                headers["ETag"] = etag
            if files.ranges:
                headers["Accept-Ranges"] = "bytes"
            if not _matches(self.headers.get("If-Match"), etag):
                self._empty(412, headers)
                return
            span = (_range(self.headers.get("Range"), size)
                    if files.ranges and self.command == "GET" else None)
            if span == "unsatisfiable":
                headers["Content-Range"] = f"bytes */{size}"
                self._empty(416, headers)
                return
            status, start, count = 200, 0, size
            if isinstance(span, tuple):
                status, (start, count) = 206, span
                headers["Content-Range"] = f"bytes {start}-{start + count - 1}/{size}"
            self._status(status)
            headers["Content-Type"] = "application/octet-stream"
            headers["Content-Length"] = str(count)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command == "GET" and count:
                self.connection.sendfile(f, start, count)

    def _status(self, status: int) -> None:
        """Start the answer; the request counts as handled (and is recorded) from here,
        before the client can see any of it."""
        self._answered = True
        self.server.owner._end((self.command, self.path, self.headers.get("Range"), status))
        self.send_response_only(status)

    def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
        self._status(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()


def _matches(if_match: str | None, etag: str | None) -> bool:
    """RFC 9110 If-Match with strong comparison; no header always matches."""
    if if_match is None:
        return True
    if if_match.strip() == "*":
        return etag is not None
    return etag is not None and etag in (tag.strip() for tag in if_match.split(","))


def _range(header: str | None, size: int) -> tuple[int, int] | Literal["unsatisfiable"] | None:
    """(start, count) of one satisfiable range, "unsatisfiable", or None to send it all."""
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if not first:
        count = min(int(last), size)
        return (size - count, count) if count else "unsatisfiable"
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        return "unsatisfiable"
    end = min(int(last), size - 1) if last else size - 1
    return start, end - start + 1


RangeHttpServer.handler = _Handler
