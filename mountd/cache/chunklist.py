"""The stored chunk indices of one dataset, kept compactly once listed.

Owns ``ChunkList``: the flat grid positions (row-major) of the chunks in
the order storage listed them, plus a sorted copy for lookups, 16 bytes a
chunk (a list of none or one chunk holds no sorted copy, and every empty
one shares one array); a dataset of a million chunks, once listed, is
listed again (in the same order, so a directory stream restarted from a
cookie stays consistent) and answers lookups without storage, in 16 MB
instead of the ~150 MB a set of index tuples would take.
``ChunkListBuilder`` collects the positions while a listing streams by and
gives up past a size limit.

Concurrency: a ``ChunkList`` is immutable once built and may be shared by
any number of trio tasks; a builder belongs to the one task listing.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

from layouts.model import ChunkIndex

#: Indices turned back into tuples at once while iterating.
_BATCH = 4096
#: The positions of every list with no chunk (a walk lists many such datasets).
_NONE = np.empty(0, dtype=np.int64)
_NONE.flags.writeable = False


def _strides(grid: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(grid)
    for axis in range(len(grid) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * grid[axis + 1]
    return tuple(strides)


class ChunkList:
    """The chunk indices of a dataset whose chunk grid is ``grid``, in listing order."""

    __slots__ = ("_grid", "_order", "_sorted", "_strides")

    def __init__(self, grid: tuple[int, ...], order: np.ndarray) -> None:
        self._grid = grid
        self._strides = _strides(grid)
        self._order = order
        self._sorted = order if len(order) < 2 else np.sort(order)

    def __len__(self) -> int:
        return len(self._order)

    @property
    def nbytes(self) -> int:
        """Memory the list holds (for the memo's budget)."""
        return int(self._order.nbytes + self._sorted.nbytes) + 200

    def __contains__(self, index: ChunkIndex) -> bool:
        if len(index) != len(self._grid):
            return False
        if any(not 0 <= i < n for i, n in zip(index, self._grid, strict=True)):
            return False
        pos = sum(i * s for i, s in zip(index, self._strides, strict=True))
        at = int(np.searchsorted(self._sorted, pos))
        return at < len(self._sorted) and int(self._sorted[at]) == pos

    def __iter__(self) -> Iterator[ChunkIndex]:
        order, grid = self._order, self._grid
        for start in range(0, len(order), _BATCH):
            part = order[start:start + _BATCH]
            if len(grid) == 1:
                yield from ((i,) for i in part.tolist())
            else:
                coords = np.unravel_index(part, grid)
                yield from zip(*(c.tolist() for c in coords), strict=True)


class ChunkListBuilder:
    """Collects the indices of a listing as it streams; ``result()`` is None once
    more than ``limit`` were added (the listing is then not kept)."""

    __slots__ = ("_grid", "_limit", "_positions", "_strides")

    def __init__(self, grid: tuple[int, ...], limit: int) -> None:
        self._grid = grid
        self._strides = _strides(grid)
        self._limit = limit
        self._positions: array[int] | None = array("q")

    def add(self, index: ChunkIndex) -> None:
        """Add an index inside the grid (the caller checks)."""
        positions = self._positions
        if positions is None:
            return
        if len(positions) >= self._limit:
            self._positions = None
            return
        if len(index) == 1:
            positions.append(index[0])
        else:
            positions.append(sum(i * s for i, s in zip(index, self._strides, strict=True)))

    @property
    def gave_up(self) -> bool:
        """True once more than ``limit`` indices were added."""
        return self._positions is None

    def result(self) -> ChunkList | None:
        if self._positions is None:
            return None
        if not self._positions:
            return ChunkList(self._grid, _NONE)
        return ChunkList(self._grid, np.frombuffer(self._positions, dtype=np.int64).copy())
