"""Running one async call per item, a bounded number at a time.

Owns ``for_each``, the shape of every fan-out of the tree (probing a
folder's domains, making a group's entries, loading objects in batches):
``workers`` tasks share one iterator over the items, so a group of 100,000
links costs ``workers`` tasks, not one task per link. An exception ends the
whole fan-out (the nursery cancels the other workers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import trio

T = TypeVar("T")


async def for_each(items: Sequence[T], work: Callable[[T], Awaitable[None]],
                   workers: int) -> None:
    """Run ``work`` on every item, at most ``workers`` at once."""
    todo = iter(items)

    async def worker() -> None:
        for item in todo:
            await work(item)

    async with trio.open_nursery() as nursery:
        for _ in range(min(workers, len(items))):
            nursery.start_soon(worker)
