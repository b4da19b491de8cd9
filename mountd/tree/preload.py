"""Background loading: what a walker will list next, fetched before it asks.

Owns the directory readahead of the tree. When a group is listed, the order
of its child directories is remembered (``remember``); when a walker (``ls
-R``, ``find``, ``h5mount warm``) then opens those children in order
(``dir_opened``), the next ones are loaded in the background
(``mountd.cache.dirahead`` decides which), each by its own ``preload``: a group
fetches itself and its children's objects, a dataset lists its chunks. A
listing that comes while its directory is being loaded ahead waits for that
load (``finished``) instead of repeating it. ``fetch_object`` brings one
object into the catalog's cache in the background.

Concurrency: the loads under way are kept by key, registered with no
``await`` between the check and the insert (so a load is never started
twice) and removed when it ends, whatever the outcome. Loads run in the
nursery the daemon gives the chunk cache (none: no background work), at most
``LIST_CONCURRENCY`` fetches at once (``limiter``, shared with the loads'
own fetches). A failed load is logged at debug level and forgotten: the
walker's own listing reports the error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

import trio

from mountd.cache.chunkcache import ChunkCache
from mountd.cache.dirahead import DirReadahead
from mountd.errors import MountError
from mountd.tree.paths import FetchObject, ObjPath

log = logging.getLogger(__name__)

#: Objects fetched at once while listing a group (one remote round trip each).
LIST_CONCURRENCY = 128


class Loadable(Protocol):
    """A directory that can be loaded ahead (an object's directory)."""

    @property
    def op(self) -> ObjPath: ...

    def loaded(self) -> bool:
        """True if listing this directory needs no storage round trip now."""
        ...

    async def preload(self) -> None:
        """Fetch what listing this directory will need."""
        ...


class Preloader:
    """Loads directories and objects ahead of a walker."""

    def __init__(self, obj: FetchObject, chunk_cache: ChunkCache) -> None:
        self._obj = obj
        self._cache = chunk_cache
        self.limiter = trio.CapacityLimiter(LIST_CONCURRENCY)
        self._dirs: DirReadahead[Loadable] = DirReadahead(cap=LIST_CONCURRENCY // 2)
        #: Directories being loaded ahead, by ``ObjPath.key``, from the moment
        #: the load is scheduled; each event is set when its load ends.
        self._loading: dict[Hashable, trio.Event] = {}

    def remember(self, group: Hashable, listing: object,
                 dirs: Callable[[], Sequence[tuple[Hashable, Loadable]]]) -> None:
        """The child directories of the group with key ``group``, in listing
        order, as ``dirs()`` gives them from ``listing`` (made only when the
        listing is not the one remembered last)."""
        self._dirs.remember(group, listing, dirs)

    def dir_opened(self, node: Loadable) -> None:
        """A child directory of a group is being listed: load the next ones in
        the background if the group's children are being walked in order."""
        nursery = self._cache.nursery
        if nursery is None or not node.op.names:
            return
        for child in self._dirs.opened(node.op.parent_key, node.op.key):
            if not child.loaded() and child.op.key not in self._loading:
                # Registered now, not when the task first runs, so a listing
                # that comes before then waits for this load, not repeats it.
                self._loading[child.op.key] = trio.Event()
                nursery.start_soon(self._preload, child)

    async def finished(self, key: Hashable) -> None:
        """Return once no load ahead of the directory ``key`` is under way
        (at once, with no checkpoint, when none is)."""
        loading = self._loading.get(key)
        if loading is not None:
            await loading.wait()

    async def _preload(self, node: Loadable) -> None:
        try:
            await node.preload()
        except MountError as exc:
            log.debug("loading %s ahead failed: %s", node.op.h5path, exc)
        except Exception:
            log.exception("loading %s ahead failed", node.op.h5path)
        finally:
            self._loading.pop(node.op.key).set()

    async def fetch_object(self, op: ObjPath) -> None:
        """Fetch one object into the catalog's cache, in the background."""
        async with self.limiter:
            try:
                await self._obj(op)
            except MountError as exc:
                log.debug("loading %s ahead failed: %s", op.h5path, exc)
