"""A time-limited cache in front of a ``Catalog`` (``-o metadata_ttl``).

Owns the cached answers of ``list_folder``, ``domain`` and ``get_object``
(``get_objects`` loads many at once; ``peek_object`` answers from the cache
alone). Entries are evicted oldest fetch first, in O(1).
Each answer, including a failure, is kept for ``ttl`` seconds from when
storage proved it, so a corrupt object is read (and logged) once per TTL,
not once per kernel request: from its fetch, or, for an inner catalog that
says how old each object's proof is (an ``AgedCatalog``, as its
``supports_proof_ages`` declares: an HSDS catalog building a domain's objects
from one listing), from that proof, so nothing is served longer than ``ttl``
after storage last showed it current. An expired object that such a catalog
proves current again with no I/O (the very same instance, shown unchanged by
a newer listing: ``proven``) is kept for another period instead of being
fetched, so everything derived from it (renderings, listings) stays valid.
``drop`` (the daemon's SIGHUP) ends every answer's freshness at once: each
entry belongs to the ``generation`` it was fetched in, and only entries of
the current one are fresh; it also calls the inner catalog's ``drop`` (the
HSDS catalog's domain key indexes).

Concurrency: one fetch per key at a time. The first task to miss starts the
fetch and stores a ``trio.Event``; tasks that arrive meanwhile wait on that
event and then read the stored outcome. Between the check for an entry and
the insertion of the pending marker there is no ``await``, which is what makes
the single-flight rule hold on one trio thread. A fetch under way when
``drop`` is called still answers the task that started it (reads under way
are unaffected), but its outcome is of the old generation: the tasks that
waited on it, and every later one, fetch again.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from layouts.model import AgedCatalog, AnyObject, Catalog, Domain
from mountd.errors import MountError


@dataclass(slots=True)
class _Entry:
    expires: float
    generation: int
    value: Any = None
    error: MountError | None = None
    pending: trio.Event | None = None
    done: bool = False


class CachedCatalog:
    """A ``Catalog`` that remembers answers of the one it wraps for ``ttl`` seconds."""

    #: Not an ``AgedCatalog`` itself: it does not say how old its answers are.
    supports_proof_ages = False

    def __init__(self, inner: Catalog, ttl: float, max_entries: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        #: Whether the inner catalog says how old its answers are.
        self._aged = inner.supports_proof_ages
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[Hashable, _Entry] = {}
        #: Bumped by ``drop``; entries of older generations are stale.
        self.generation = 0
        #: Answers given from the cache, fetched, and dropped for room; and
        #: expired objects kept on for a newer listing's proof (``_rearmed``).
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.rearmed = 0

    def __len__(self) -> int:
        """Answers held, fresh or not."""
        return len(self._entries)

    @property
    def single_domain(self) -> str | None:
        return self.inner.single_domain

    def drop(self) -> None:
        """Make every cached answer stale now: the next request for it reads storage.
        The inner catalog forgets its own indexes too (its ``drop``)."""
        self.generation += 1
        self.inner.drop()

    def _usable(self, entry: _Entry, now: float) -> bool:
        """Whether a settled entry may still be served."""
        return entry.expires > now and entry.generation == self.generation

    def _fresh(self, key: Hashable, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None or entry.pending is not None:
            return None
        if not self._usable(entry, now) and not self._rearmed(key, entry, now):
            return None
        return entry

    def _rearmed(self, key: Hashable, entry: _Entry, now: float) -> bool:
        """Whether an expired object entry was proven current again by the inner
        catalog (``AgedCatalog.proven``: the very same instance, shown unchanged
        by a newer listing), with no I/O; if so it is kept until ``ttl`` after
        that proof."""
        if not self._aged or entry.error is not None or entry.generation != self.generation \
                or not isinstance(key, tuple) or key[0] != "obj":
            return False
        aged: AgedCatalog = self.inner  # type: ignore[assignment]
        proof = aged.proven(key[2])
        if proof is None or proof[0] is not entry.value:
            return False
        entry.expires = now - proof[1] + self.ttl
        self.rearmed += 1
        return entry.expires > now

    def _begin(self, key: Hashable, now: float) -> _Entry:
        """A pending entry for ``key``, newest in the eviction order, kept ``ttl``
        seconds from ``now`` (``get_objects`` may shorten that)."""
        self._entries.pop(key, None)
        entry = self._entries[key] = _Entry(expires=now + self.ttl, generation=self.generation,
                                            pending=trio.Event())
        return entry

    def _end(self, key: Hashable, entry: _Entry) -> None:
        """Finish a fetch: wake its waiters; an entry with no outcome is dropped."""
        if not entry.done and self._entries.get(key) is entry:
            del self._entries[key]
        event, entry.pending = entry.pending, None
        if event is not None:
            event.set()

    async def _cached(self, key: Hashable, fetch: Callable[[], Awaitable[Any]]) -> Any:
        now = self._clock()
        entry = self._entries.get(key)
        while entry is not None and entry.pending is not None:
            await entry.pending.wait()
            entry = self._entries.get(key)
        if entry is not None and self._usable(entry, now):
            self.hits += 1
            if entry.error is not None:
                raise entry.error
            return entry.value
        self.misses += 1
        entry = self._begin(key, now)
        try:
            entry.value = await fetch()
            entry.done = True
        except MountError as exc:
            entry.error = exc
            entry.done = True
            raise
        finally:
            self._end(key, entry)
            self._trim()
        return entry.value

    def _trim(self) -> None:
        """Drop the entries fetched longest ago (dicts keep insertion order, and
        every fetch re-inserts), skipping fetches still under way; O(1) each."""
        while len(self._entries) > self.max_entries:
            oldest = next(iter(self._entries))
            entry = self._entries.pop(oldest)
            if entry.pending is not None:
                self._entries[oldest] = entry  # back at the end; it is newest anyway
                return
            self.evictions += 1

    def peek_object(self, domain: Domain, obj_id: str) -> AnyObject | None:
        """The object if it is cached and fresh now (no I/O, no await)."""
        entry = self._fresh(("obj", domain.path, obj_id), self._clock())
        return None if entry is None else entry.value

    async def get_objects(self, domain: Domain,
                          obj_ids: Sequence[str]) -> list[AnyObject | MountError]:
        """Many objects, each or its error, in order; the ones not cached are
        fetched together (``load_objects`` of an ``AgedCatalog``, else
        ``get_objects`` of the inner catalog)."""
        now = self._clock()
        out: list[AnyObject | MountError] = [MountError("not loaded")] * len(obj_ids)
        fetch: dict[str, _Entry] = {}
        waiting: list[int] = []
        for pos, obj_id in enumerate(obj_ids):
            key = ("obj", domain.path, obj_id)
            entry = self._entries.get(key)
            if entry is not None and entry.pending is None and (
                    self._usable(entry, now) or self._rearmed(key, entry, now)):
                self.hits += 1
                out[pos] = entry.error if entry.error is not None else entry.value
            elif (entry is not None and entry.pending is not None) or obj_id in fetch:
                waiting.append(pos)
            else:
                self.misses += 1
                fetch[obj_id] = self._begin(key, now)
        try:
            if fetch:
                ids = list(fetch)
                for obj_id, (result, age) in zip(ids, await self._fetch_objects(domain, ids),
                                                 strict=True):
                    entry = fetch[obj_id]
                    if isinstance(result, MountError):
                        entry.error = result
                    else:
                        entry.value = result
                    entry.expires = min(entry.expires, now - age + self.ttl)
                    entry.done = True
        finally:
            for obj_id, entry in fetch.items():
                self._end(("obj", domain.path, obj_id), entry)
            self._trim()
        for pos, obj_id in enumerate(obj_ids):
            if obj_id in fetch:
                entry = fetch[obj_id]
                out[pos] = entry.error if entry.error is not None else entry.value
        for pos in waiting:
            out[pos] = await self._settled(domain, obj_ids[pos])
        return out

    async def _settled(self, domain: Domain, obj_id: str) -> AnyObject | MountError:
        """The object once the fetch under way for it has ended: its outcome, or
        (dropped meanwhile) a fetch of its own."""
        key = ("obj", domain.path, obj_id)
        entry = self._entries.get(key)
        while entry is not None and entry.pending is not None:
            await entry.pending.wait()
            entry = self._entries.get(key)
        now = self._clock()
        if entry is not None and (self._usable(entry, now) or self._rearmed(key, entry, now)):
            self.hits += 1
            return entry.error if entry.error is not None else entry.value
        try:
            return await self.get_object(domain, obj_id)
        except MountError as exc:
            return exc

    async def _fetch_objects(self, domain: Domain, obj_ids: list[str]
                             ) -> list[tuple[AnyObject | MountError, float]]:
        """Each object or its error, with the age of its proof (0: fetched now)."""
        if self._aged:
            aged: AgedCatalog = self.inner  # type: ignore[assignment]
            return await aged.load_objects(domain, obj_ids)
        results = await self.inner.get_objects(domain, obj_ids)
        return [(result, 0.0) for result in results]

    async def list_folder(self, path: str) -> list[str]:
        result: list[str] = await self._cached(("folder", path),
                                               lambda: self.inner.list_folder(path))
        return result

    async def domain(self, path: str) -> Domain | None:
        result: Domain | None = await self._cached(("domain", path),
                                                   lambda: self.inner.domain(path))
        return result

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        if self._aged:
            entry = self._fresh(("obj", domain.path, obj_id), self._clock())
            if entry is not None:
                self.hits += 1
                if entry.error is not None:
                    raise entry.error
                return entry.value  # type: ignore[no-any-return]
            found = (await self.get_objects(domain, [obj_id]))[0]
            if isinstance(found, MountError):
                raise found
            return found
        result: AnyObject = await self._cached(("obj", domain.path, obj_id),
                                               lambda: self.inner.get_object(domain, obj_id))
        return result
