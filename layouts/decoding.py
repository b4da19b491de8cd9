"""Where chunk decoding runs: inline, or in a worker thread under one limiter.

Owns ``decode_sized`` and the process-wide ``DECODE_LIMITER``. Every chunk
reader of every format (HSDS chunks, linked HDF5 chunks, reference-file
chunks) decodes through it, so one limit holds for all decoding in the
process: decoding is CPU work, and more threads than cores only add memory.
A decode small enough to cost less than a thread hop (under
``THREAD_THRESHOLD`` bytes read and written) runs right in the calling task.

Concurrency: ``decode_sized`` may be awaited from any number of trio tasks;
at most ``DECODE_LIMITER.total_tokens`` (2) worker threads decode at once,
and the others wait for a token. The functions run in threads must be safe
there (numcodecs, bitshuffle and numpy release the GIL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")

#: Decodes at least this large (stored plus decoded bytes) run in a worker thread.
THREAD_THRESHOLD = 64 * 1024
#: Limits concurrent decoding in worker threads, across all datasets and formats.
DECODE_LIMITER = trio.CapacityLimiter(2)


async def decode_sized(nbytes: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: in a worker thread under ``DECODE_LIMITER`` when ``nbytes`` (the
    bytes it reads and writes) reaches ``THREAD_THRESHOLD``, else right here."""
    if nbytes >= THREAD_THRESHOLD:
        return await trio.to_thread.run_sync(fn, *args, limiter=DECODE_LIMITER)
    return fn(*args)
