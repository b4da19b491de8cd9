"""Run one async call per item with bounded concurrency, keeping each outcome.

Owns ``outcomes``: the shape every batch path needs, in the layouts and the
daemon alike (read many keys, load many objects), where one item failing with
a ``LayoutError`` must not fail the others. Anything other than a
``LayoutError`` (a bug, a cancellation) propagates and cancels the rest.

Concurrency: ``limit`` worker tasks share one iterator over the items, so a
batch of 100,000 costs ``limit`` tasks, not one per item.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import trio

from layouts.errors import LayoutError

T = TypeVar("T")
R = TypeVar("R")


async def outcomes(work: Callable[[T], Awaitable[R]], items: Sequence[T],
                   limit: int) -> list[R | LayoutError]:
    """``work(item)`` for every item, at most ``limit`` at once: each result or
    the ``LayoutError`` it raised, in the order of ``items``."""
    out: list[R | LayoutError] = [LayoutError("not run")] * len(items)
    todo = iter(enumerate(items))

    async def worker() -> None:
        for pos, item in todo:
            try:
                out[pos] = await work(item)
            except LayoutError as exc:
                out[pos] = exc

    async with trio.open_nursery() as nursery:
        for _ in range(min(limit, len(items))):
            nursery.start_soon(worker)
    return out
