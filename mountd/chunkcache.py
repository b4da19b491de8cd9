"""The decoded-chunk cache (``-o chunk_cache=SIZE``).

Owns decoded chunk bytes, keyed by (domain, dataset id, chunk index), in an
LRU under a byte budget. A sequential read of a ``.npy`` arrives as many
small kernel requests that touch the same chunks; with this cache each chunk
is fetched and decoded once.

Concurrency: one fetch per key. The first task to miss inserts a pending
``trio.Event`` with no ``await`` between the check and the insert, then
fetches; tasks that want the same key meanwhile wait on the event and read
the outcome. A failed fetch is not cached for long: its waiters, and readers
within ``error_ttl`` seconds after it, see the same error, and the next reader
after that tries again. (The kernel retries a failed readahead at once with
a single-page read; without this, a stalled store would hold that reader for
the whole timeout twice.) ``prefetch`` starts fetches in the cache's
``nursery`` (set by whoever owns the background work, None until then: no
prefetching), so background work always has an owner; it never raises. At
most ``prefetch_limit`` prefetches run at once; a refused one returns False
so the reader's readahead asks again on its next read.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

import trio

from mountd.errors import MountError

log = logging.getLogger(__name__)

Fetch = Callable[[], Awaitable[bytes | None]]


#: Prefetches running at once, by default: enough to keep a remote store busy.
PREFETCH_LIMIT = 64
#: How long a failed fetch's error is given to new readers before a retry.
ERROR_TTL = 2.0
#: Failures remembered at most (expired ones are dropped when it is reached).
_MAX_FAILED = 1024
#: What a "not stored" answer counts against the budget.
_NONE_SIZE = 64


def _size(value: bytes | None) -> int:
    return _NONE_SIZE if value is None else len(value)


@dataclass(slots=True)
class _Pending:
    done: trio.Event
    value: bytes | None = None
    error: BaseException | None = None


class ChunkCache:
    """An LRU of decoded chunks, at most ``budget`` bytes (0 disables keeping them)."""

    def __init__(self, budget: int, nursery: trio.Nursery | None = None,
                 prefetch_limit: int = PREFETCH_LIMIT, error_ttl: float = ERROR_TTL) -> None:
        self.budget = budget
        self.error_ttl = error_ttl
        self._failed: dict[Hashable, tuple[float, MountError]] = {}
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[Hashable, bytes | None] = OrderedDict()
        self._pending: dict[Hashable, _Pending] = {}
        self.nursery = nursery
        self._prefetch_limit = prefetch_limit
        self._prefetching: set[Hashable] = set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items or key in self._pending

    def peek(self, key: Hashable) -> tuple[bool, bytes | None]:
        """``(True, chunk)`` if ``key`` is cached now (counted as a hit), else ``(False, None)``.

        Lets a reader skip starting a task for every chunk that is already here.
        """
        if key not in self._items:
            return False, None
        self._items.move_to_end(key)
        self.hits += 1
        return True, self._items[key]

    async def get(self, key: Hashable, fetch: Fetch) -> bytes | None:
        """The chunk for ``key``: from the cache, from a fetch under way, or fetched now."""
        if key in self._items:
            self._items.move_to_end(key)
            self.hits += 1
            return self._items[key]
        failed = self._failed.get(key)
        if failed is not None:
            if trio.current_time() - failed[0] < self.error_ttl:
                raise failed[1]
            del self._failed[key]
        pending = self._pending.get(key)
        if pending is not None:
            self.hits += 1
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            return pending.value
        self.misses += 1
        pending = _Pending(trio.Event())
        self._pending[key] = pending
        try:
            pending.value = await fetch()
        except BaseException as exc:
            pending.error = exc
            if isinstance(exc, MountError):
                self._remember_failure(key, exc)
            raise
        else:
            self._store(key, pending.value)
        finally:
            del self._pending[key]
            pending.done.set()
        return pending.value

    def _remember_failure(self, key: Hashable, exc: MountError) -> None:
        now = trio.current_time()
        if len(self._failed) >= _MAX_FAILED:
            self._failed = {k: v for k, v in self._failed.items()
                            if now - v[0] < self.error_ttl}
        self._failed[key] = (now, exc)

    def _store(self, key: Hashable, value: bytes | None) -> None:
        size = _size(value)
        if size > self.budget:
            return
        self._items[key] = value
        self.used += size
        while self.used > self.budget and self._items:
            _, old = self._items.popitem(last=False)
            self.used -= _size(old)

    def prefetch(self, key: Hashable, fetch: Fetch) -> bool:
        """Start fetching ``key`` in the background unless it is cached or under way.

        True if the chunk is cached, under way or now started; False if it
        was refused (no nursery, or ``prefetch_limit`` prefetches running).
        """
        if key in self or key in self._prefetching:
            return True
        if self.nursery is None or len(self._prefetching) >= self._prefetch_limit:
            return False
        self._prefetching.add(key)
        self.nursery.start_soon(self._prefetch_one, key, fetch)
        return True

    async def _prefetch_one(self, key: Hashable, fetch: Fetch) -> None:
        try:
            await self.get(key, fetch)
        except MountError as exc:
            log.debug("prefetch of %s failed: %s", key, exc)
        except Exception:
            log.exception("prefetch of %s failed", key)
        finally:
            self._prefetching.discard(key)
