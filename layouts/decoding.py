"""Where chunk decoding runs: inline, in a worker thread under one limiter, or not at all.

Owns ``decode_sized`` and the process-wide ``DECODE_LIMITER``. Every chunk
reader of every format (HSDS chunks, linked HDF5 chunks, reference-file
chunks) decodes through it, so one limit holds for all decoding in the
process: decoding is CPU work, and more threads than cores only add memory.
A decode small enough to cost less than a thread hop (under
``THREAD_THRESHOLD`` bytes read and written) runs right in the calling task.

It also owns where a decoder that writes its output in place takes that
output from (``OUTPUT``: ``bytearray`` unless the process's owner of chunk
memory, the daemon, hands it the chunk cache's buffer pool), so that a
decoded chunk is born where the cache keeps it, with no copy.

It also owns the port through which a decode is skipped: ``DecodedCache``
(``-o cache_decoded``, implemented by ``mountd.io.decodedcache``) keeps the
decoded bytes of a chunk, named by the object they were decoded from and a
``token`` (``decoded_token``) that says which bytes of it and how. A reader
asks it before reading the object, and hands it what it decoded after. The
etag ``put`` takes is the one the object's bytes were read at (from
``Store.fetch``), never one looked up later, so bytes decoded from an old
version are never kept as the new one's.

Concurrency: ``OUTPUT.take`` is called from decoding threads, so what it is
set to must be thread-safe; it is set once, before the first decode.
``decode_sized`` may be awaited from any number of trio tasks;
at most ``DECODE_LIMITER.total_tokens`` (2) worker threads decode at once,
and the others wait for a token. The functions run in threads must be safe
there (numcodecs, bitshuffle and numpy release the GIL).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import trio

from layouts.storage import Store

T = TypeVar("T")

#: Decodes at least this large (stored plus decoded bytes) run in a worker thread.
THREAD_THRESHOLD = 64 * 1024
#: Limits concurrent decoding in worker threads, across all datasets and formats.
DECODE_LIMITER = trio.CapacityLimiter(2)
#: Part of every ``decoded_token``: raise it when a decoder's output changes, so that
#: decoded chunks kept by an older h5mount are not served.
DECODED_VERSION = 1


class Output:
    """Where in-place decoders take their output: ``take(nbytes)`` gives a writable
    buffer of exactly ``nbytes``."""

    def __init__(self) -> None:
        self.take: Callable[[int], bytearray | memoryview] = bytearray


#: The process's ``Output``.
OUTPUT = Output()


async def decode_sized(nbytes: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: in a worker thread under ``DECODE_LIMITER`` when ``nbytes`` (the
    bytes it reads and writes) reaches ``THREAD_THRESHOLD``, else right here."""
    if nbytes >= THREAD_THRESHOLD:
        return await trio.to_thread.run_sync(fn, *args, limiter=DECODE_LIMITER)
    return fn(*args)


def decoded_token(*parts: object) -> str:
    """A short name for how chunks are decoded: a hash of ``parts`` (their ``repr``,
    which must be the same in every process: frozen dataclasses, numbers, strings,
    NumPy dtypes) and ``DECODED_VERSION``."""
    text = repr((DECODED_VERSION, parts)).encode()
    return hashlib.sha256(text).hexdigest()[:24]


class DecodedCache(Protocol):
    """Decoded chunks kept across mounts, each valid for one version of its object."""

    def keeps(self, store: Store) -> bool:
        """Whether decoded chunks of the objects of ``store`` are kept (no I/O)."""
        ...

    async def get(self, store: Store, key: str,
                  token: str) -> bytes | bytearray | memoryview | None:
        """What ``put`` kept for ``key`` and ``token``, if the object is still the version
        it was decoded from; else None (also for a missing object, which the read that
        follows reports). Validation errors of the storage propagate."""
        ...

    async def put(self, store: Store, key: str, token: str, etag: str, data: bytes) -> None:
        """Keep ``data``, decoded as ``token`` says from ``key`` at version ``etag``;
        without making the caller wait for a disk. Never raises but Cancelled."""
        ...
