"""Values derived from cached model objects, kept while those objects are current.

Owns one bounded LRU. Each value (a rendered sidecar or ``.zattrs``, a
group's name index, an object's xattrs, an NPY header, a small dataset's
chunk names) is stored with the objects it was derived from. The metadata
cache (``mountd.cache.metacache``) returns the same instance of an object while it
is fresh and a new one after a refresh, so a value is valid exactly while
``get`` is asked with the very same objects (compared by identity). Holding
them in the entry also keeps their ids from being reused.

Concurrency: synchronous methods with no ``await``; each call is atomic with
respect to other trio tasks. Two tasks that miss at once both compute the
value and the second ``put`` wins, which is harmless for pure derivations.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

#: Most entries kept, whatever their size (a few per object: sidecar, .zattrs, xattrs...).
MAX_ENTRIES = 500_000
#: Most bytes kept: the callers' estimates plus ``ENTRY_OVERHEAD`` each. A
#: walk keeps about 2 KB for each dataset it shows (the sizes of its sidecar,
#: ``.zarray``, ``.zattrs`` and ``.npy``, its chunk list and its rows in its
#: group's listing): 256 MiB holds a walk of 100,000 datasets, where 128 MiB
#: made the last ones push out the first and a second walk render all again.
MAX_BYTES = 256 << 20
#: What one entry costs besides its value (key, entry, LRU links).
ENTRY_OVERHEAD = 200


class Memo:
    """An LRU of derived values keyed by name and checked by source identity.

    An entry is one tuple ``(value, size, *deps)``: one object for the
    garbage collector to walk, as a mount may hold a few hundred thousand.
    """

    def __init__(self, max_entries: int = MAX_ENTRIES, budget: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self._budget = budget
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._items: OrderedDict[Hashable, tuple[Any, ...]] = OrderedDict()

    @property
    def budget(self) -> int:
        """Bytes the entries may cost at most."""
        return self._budget

    @budget.setter
    def budget(self, budget: int) -> None:
        """A new budget; past it, the least recently used entries go at once."""
        self._budget = budget
        self._fit()

    def get(self, key: Hashable, *deps: object) -> Any:
        """The value stored under ``key`` from exactly ``deps``, or None."""
        entry = self._items.get(key)
        if entry is not None and len(entry) == len(deps) + 2:
            pos = 2
            for dep in deps:  # a loop, not any(): this runs for every entry listed
                if entry[pos] is not dep:
                    break
                pos += 1
            else:
                self._items.move_to_end(key)
                self.hits += 1
                return entry[0]
        self.misses += 1
        return None

    def take(self, key: Hashable, *deps: object) -> Any:
        """``get``, and the entry is dropped: for a value made ahead of the one
        reader that will use it (a dataset's rows made ahead of a walker)."""
        value = self.get(key, *deps)
        if value is not None:
            self.used -= self._items.pop(key)[1]
        return value

    def put(self, key: Hashable, value: Any, size: int, *deps: object) -> None:
        """Keep ``value`` (never None), derived from ``deps``, costing about ``size`` bytes."""
        old = self._items.pop(key, None)
        if old is not None:
            self.used -= old[1]
        size += ENTRY_OVERHEAD
        if size > self._budget:
            return
        self._items[key] = (value, size, *deps)
        self.used += size
        self._fit()

    def _fit(self) -> None:
        while self._items and (self.used > self._budget or len(self._items) > self.max_entries):
            _, evicted = self._items.popitem(last=False)
            self.used -= evicted[1]
            self.evictions += 1
