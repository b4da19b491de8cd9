"""Readahead of chunk files in grid order (``cat d/*``, ``h5mount warm``).

Owns the sequential-read state of each dataset whose chunk files are being
read: a ``ReadaheadWindow`` over the dataset's chunks laid end to end in grid
C order (chunk ``k`` in that order starts at byte ``k * unit``, where a
chunk's unit is what its cache entry costs: its decoded size as the buffer
pool charges it, ``mountd.cache.bufpool.charge``, plus ``ENTRY_OVERHEAD``),
and a watermark: the grid position up to which prefetches were accepted.
Each read of a chunk file asks, in one call, for the chunks after it that
fill the window, in grid order, from the watermark on, at most
``AHEAD_CHUNKS`` past the read; so one read costs about one prefetch once
the window is full, and a refused prefetch is asked for again on the next
read. A jump (reading far from the expected chunk) resets the
window. ``AHEAD_CHUNKS`` (the view API's bound, ``layouts.views._api``, which
the ``.npy`` readahead keeps too) bounds a window of tiny chunks by their
count as well as their bytes.

State is kept for the ``max_datasets`` datasets read most recently.

Concurrency: ``on_read`` is synchronous with no ``await``, so each call is
atomic with respect to other trio tasks; it only calls ``start``, which must
not block either.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from layouts.model import ChunkIndex, Dataset
from layouts.views import AHEAD_CHUNKS
from mountd.cache import bufpool
from mountd.cache.chunkbatch import chunk_bytes
from mountd.cache.chunkcache import ENTRY_OVERHEAD
from mountd.io.readahead import START, ReadaheadWindow

#: Datasets whose sequential state is kept.
MAX_DATASETS = 256


def chunk_unit(ds: Dataset) -> int:
    """What one chunk of ``ds`` counts as in a readahead window, in bytes."""
    return bufpool.charge(chunk_bytes(ds)) + ENTRY_OVERHEAD


def ravel(index: ChunkIndex, grid: tuple[int, ...]) -> int:
    """Position of ``index`` in grid C order."""
    pos = 0
    for i, n in zip(index, grid, strict=True):
        pos = pos * n + i
    return pos


def unravel(pos: int, grid: tuple[int, ...]) -> ChunkIndex:
    """The chunk index at position ``pos`` of grid C order."""
    out = []
    for n in reversed(grid):
        pos, i = divmod(pos, n)
        out.append(i)
    return tuple(reversed(out))


@dataclass(slots=True)
class _Stream:
    window: ReadaheadWindow
    mark: int = 0


class GridReadahead:
    """Per-dataset readahead state; ``cap`` is the largest window in bytes (0: off)."""

    def __init__(self, cap: int, start: int = START, max_datasets: int = MAX_DATASETS) -> None:
        self.cap = cap
        self.start = start if cap >= start else 0
        self.max_datasets = max_datasets
        self._streams: OrderedDict[Hashable, _Stream] = OrderedDict()

    def window(self, key: Hashable) -> int:
        """The current window of dataset ``key`` in bytes (0 if none)."""
        stream = self._streams.get(key)
        return 0 if stream is None else stream.window.window

    def on_read(self, key: Hashable, ds: Dataset, index: ChunkIndex,
                start: Callable[[list[ChunkIndex]], int]) -> int:
        """Record a read of chunk ``index`` of ``ds`` (known as ``key``) and call
        ``start`` once with the chunks to read ahead, in grid order; it returns
        how many of them (from the first) it accepted, which this returns."""
        grid = ds.grid or (1,)
        unit = chunk_unit(ds)
        pos = ravel(index, grid)
        stream = self._stream(key)
        ahead = stream.window.observe(pos * unit, unit)
        if not ahead:
            stream.mark = pos + 1
            return 0
        end = min(math.prod(grid), pos + 1 + min(-(-ahead // unit), AHEAD_CHUNKS))
        nxt = max(stream.mark, pos + 1)
        if nxt >= end:
            return 0
        started = start([unravel(p, grid) for p in range(nxt, end)])
        stream.mark = nxt + started
        return started

    def _stream(self, key: Hashable) -> _Stream:
        stream = self._streams.get(key)
        if stream is not None:
            self._streams.move_to_end(key)
            return stream
        stream = _Stream(ReadaheadWindow(self.start, self.cap))
        self._streams[key] = stream
        while len(self._streams) > self.max_datasets:
            self._streams.popitem(last=False)
        return stream
