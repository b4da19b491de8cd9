"""Readahead of directories for a reader walking a group's children in order.

``ls -R``, ``find`` and ``h5mount warm`` open the directories of a group one
after another, in listing order. On a remote store each opening costs a
round trip or more (a chunk listing for a dataset, the objects of a group),
so a walk of 10,000 datasets would wait for 10,000 listings one by one.

This module owns the per-group sequential state: the order of a group's
child directories (remembered when the group is listed, for the
``max_groups`` groups listed last), and a ``ReadaheadWindow`` counting
children instead of bytes. When a reader opens children in order (listing
the group counts as the step before the first child), ``opened`` returns the
next ones to load in the background: ``start`` at first, doubling up to
``cap`` while the walk stays in order, nothing after a jump.
A watermark makes each child come back once. What loading means is the
caller's business.

Concurrency: synchronous methods with no ``await``, so each call is atomic
with respect to other trio tasks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from mountd.io.readahead import ReadaheadWindow

T = TypeVar("T")

#: Groups whose child order is kept.
MAX_GROUPS = 16
#: Children of one group remembered (a bigger group is read ahead in its first part only).
MAX_CHILDREN = 100_000


@dataclass(slots=True)
class _Group(Generic[T]):
    children: list[T]
    position: dict[Hashable, int]
    window: ReadaheadWindow
    mark: int = 0
    #: The listing the order was taken from (compared by identity).
    source: object = None


class DirReadahead(Generic[T]):
    """Which child directories to load ahead of a walker."""

    def __init__(self, start: int = 4, cap: int = 64, max_groups: int = MAX_GROUPS) -> None:
        self.start = start
        self.cap = cap
        self.max_groups = max_groups
        self._groups: OrderedDict[Hashable, _Group[T]] = OrderedDict()

    def remember(self, parent: Hashable, listing: object,
                 children: Callable[[], Sequence[tuple[Hashable, T]]]) -> None:
        """The child directories of ``parent`` in listing order, by key, as
        ``children()`` gives them from ``listing``. Given the very same listing
        again (a memoised one), only the walk's state starts afresh: the
        children are neither made nor indexed a second time."""
        window = ReadaheadWindow(self.start, self.cap)
        window.observe(-1, 1)  # the listing itself: opening the first child next is in order
        known = self._groups.get(parent)
        if known is not None and known.source is listing:
            self._groups[parent] = _Group(known.children, known.position, window, source=listing)
        else:
            kept = children()[:MAX_CHILDREN]
            self._groups[parent] = _Group([item for _, item in kept],
                                          {key: pos for pos, (key, _) in enumerate(kept)},
                                          window, source=listing)
        self._groups.move_to_end(parent)
        while len(self._groups) > self.max_groups:
            self._groups.popitem(last=False)

    def opened(self, parent: Hashable, child: Hashable) -> list[T]:
        """``child`` of ``parent`` is being listed: the children to load ahead now."""
        group = self._groups.get(parent)
        if group is None:
            return []
        pos = group.position.get(child)
        if pos is None:
            return []
        ahead = group.window.observe(pos, 1)
        if not ahead:
            group.mark = pos + 1
            return []
        first = max(group.mark, pos + 1)
        group.mark = max(first, min(len(group.children), pos + 1 + ahead))
        return group.children[first:group.mark]
