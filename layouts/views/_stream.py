"""View files produced in order by an async generator (CSV, JSON lines...).

Owns ``StreamReader``, a ``Reader`` over a stream of byte pieces that is
never held whole, and ``StreamedFile``, a ``ViewFile`` whose content is such
a stream: its exact size is counted by streaming the content once (the tree
keeps the count with the object), and each open reads from a fresh stream.

A ``StreamReader`` keeps its stream open between reads and the pieces that
hold the last ``keep`` bytes it produced, so a sequential reader (``cat``,
``cp``, the kernel's readahead, whose requests may arrive a little out of
order) costs one pass.
A read that starts before the bytes kept starts the stream again from the
beginning and skips forward; a read far ahead skips forward, holding no
more than ``keep`` bytes besides the pieces being read.

Concurrency: each reader has one lock, held across the stream's awaits, so
the reads of one open file are served one at a time (a stream is
sequential anyway); each open has its own reader and stream.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable

import trio

from layouts.views._api import Reader, ViewContext, ViewFile

#: Bytes a reader keeps behind its position, for requests that come back a little.
KEEP = 4 << 20


async def close_stream(stream: AsyncIterator[object] | None) -> None:
    """Finish a stream left early (an async generator may hold resources)."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


class StreamReader(Reader):
    """A reader over the stream ``open_stream()`` gives, from its beginning.

    The bytes kept are the stream's pieces as it gave them (never copied
    into one buffer): a read copies only the bytes it returns."""

    def __init__(self, open_stream: Callable[[], AsyncIterator[bytes]], keep: int = KEEP) -> None:
        self._open = open_stream
        self._keep = keep
        self._stream: AsyncIterator[bytes] | None = None
        self._ended = False
        #: The pieces kept, which hold bytes ``[_start, _end)`` of the content.
        self._pieces: deque[bytes] = deque()
        self._start = 0
        self._end = 0
        self._lock = trio.Lock()

    async def read(self, offset: int, size: int) -> bytes:
        async with self._lock:
            if self._stream is None or offset < self._start:
                await self._restart()
            end = offset + size
            while self._end < end and await self._pull():
                self._drop_before(min(offset, self._end - self._keep))
            data = self._slice(offset, min(end, self._end))
            self._drop_before(offset + len(data) - self._keep)
            return data

    def _slice(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the content, all of them kept."""
        parts = []
        at = self._start
        for piece in self._pieces:
            lo, hi = max(start - at, 0), min(stop - at, len(piece))
            if lo < hi:
                parts.append(piece if lo == 0 and hi == len(piece) else piece[lo:hi])
            at += len(piece)
            if at >= stop:
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _pull(self) -> bool:
        """Keep the stream's next piece; False at its end."""
        if self._ended or self._stream is None:
            return False
        try:
            piece = await anext(self._stream)
        except StopAsyncIteration:
            self._ended = True
            return False
        except BaseException:
            # The stream is finished by its error (or a cancellation): the
            # next read starts afresh rather than see a short file.
            self._stream = None
            raise
        if piece:
            self._pieces.append(piece)
            self._end += len(piece)
        return True

    def _drop_before(self, position: int) -> None:
        """Forget the pieces that end at or before ``position``."""
        pieces = self._pieces
        while pieces and self._start + len(pieces[0]) <= position:
            self._start += len(pieces.popleft())

    async def _restart(self) -> None:
        stream, self._stream = self._stream, None
        await close_stream(stream)
        self._stream = self._open()
        self._ended = False
        self._pieces.clear()
        self._start = self._end = 0


class StreamedFile(ViewFile):
    """A view file whose content ``pieces`` produces in order."""

    @abstractmethod
    def pieces(self, ctx: ViewContext) -> AsyncIterator[bytes]:
        """The content, in pieces of any size (an async generator)."""

    async def size(self, ctx: ViewContext) -> int:
        """The content's length, streamed once and counted (never held)."""
        total = 0
        stream = self.pieces(ctx)
        try:
            async for piece in stream:
                total += len(piece)
        finally:
            await close_stream(stream)
        return total

    async def open(self, ctx: ViewContext) -> Reader:
        return StreamReader(lambda: self.pieces(ctx))
