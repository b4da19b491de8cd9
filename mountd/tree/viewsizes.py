"""The sizes of view files: computed once per entry and kept while current.

Owns ``ViewSizes``, which the tree makes over its memo and its freshness
check (``Tree.view_sizes``) and the view file nodes (``mountd.tree.viewnodes``)
ask. A size is kept in the memo with the object and with every object the
view read through the context (``ObjectContext.seen``), and served for as
long as the catalog hands out those same instances.

Concurrency: one size computation per entry runs at a time: ``ViewSizes``
keeps an event per entry being sized, registered with no ``await`` between
the check and the insert; others wait for it and then read the kept size
(or compute it themselves if it failed).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import trio

from layouts.model import AnyObject, Domain
from layouts.views import ViewFile
from mountd.cache.memo import Memo
from mountd.tree.viewctx import ObjectContext

#: Rough bytes one object a kept size depends on costs in the memo.
_SEEN_BYTES = 64

AllFresh = Callable[[Domain, Sequence[tuple[str, AnyObject]] | None], bool]


class ViewSizes:
    """The sizes of view files, computed once and kept while current."""

    def __init__(self, memo: Memo, all_fresh: AllFresh) -> None:
        self._memo = memo
        self._all_fresh = all_fresh
        self._sizing: dict[Hashable, trio.Event] = {}

    def kept(self, key: Hashable, ctx: ObjectContext) -> int | None:
        """The size kept under ``key``, if everything it came from is current."""
        kept: tuple[int, list[tuple[str, AnyObject]]] | None = self._memo.get(key, ctx.obj)
        if kept is None or not self._all_fresh(ctx.op.domain, kept[1]):
            return None
        return kept[0]

    async def size(self, key: Hashable, ctx: ObjectContext, file: ViewFile) -> int:
        """The exact size of ``file``: kept, or computed now and kept."""
        while (pending := self._sizing.get(key)) is not None:
            await pending.wait()
        size = self.kept(key, ctx)
        if size is not None:
            return size
        done = self._sizing[key] = trio.Event()
        try:
            size = await file.size(ctx)
            seen = list(ctx.seen)
            self._memo.put(key, (size, seen), 16 + _SEEN_BYTES * len(seen), ctx.obj)
        finally:
            del self._sizing[key]
            done.set()
        return size
