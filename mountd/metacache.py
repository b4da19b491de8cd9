"""A time-limited cache in front of a ``Catalog`` (``-o metadata_ttl``).

Owns the cached answers of ``list_folder``, ``domain`` and ``get_object``.
Each answer, including a failure, is kept for ``ttl`` seconds, so a corrupt
object is read (and logged) once per TTL, not once per kernel request.

Concurrency: one fetch per key at a time. The first task to miss starts the
fetch and stores a ``trio.Event``; tasks that arrive meanwhile wait on that
event and then read the stored outcome. Between the check for an entry and
the insertion of the pending marker there is no ``await``, which is what makes
the single-flight rule hold on one trio thread.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import trio

from layouts.model import AnyObject, Catalog, Domain
from mountd.errors import MountError


@dataclass(slots=True)
class _Entry:
    expires: float
    value: Any = None
    error: MountError | None = None
    pending: trio.Event | None = None


class CachedCatalog:
    """A ``Catalog`` that remembers answers of the one it wraps for ``ttl`` seconds."""

    def __init__(self, inner: Catalog, ttl: float, max_entries: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[Hashable, _Entry] = {}

    @property
    def single_domain(self) -> str | None:
        return self.inner.single_domain

    async def _cached(self, key: Hashable, fetch: Callable[[], Awaitable[Any]]) -> Any:
        now = self._clock()
        entry = self._entries.get(key)
        while entry is not None and entry.pending is not None:
            await entry.pending.wait()
            entry = self._entries.get(key)
        if entry is not None and entry.expires > now:
            if entry.error is not None:
                raise entry.error
            return entry.value
        entry = _Entry(expires=now + self.ttl, pending=trio.Event())
        self._entries[key] = entry
        event = entry.pending
        try:
            entry.value = await fetch()
        except MountError as exc:
            entry.error = exc
            raise
        except BaseException:
            del self._entries[key]
            raise
        finally:
            entry.pending = None
            event.set()
            self._trim()
        return entry.value

    def _trim(self) -> None:
        if len(self._entries) <= self.max_entries:
            return
        now = self._clock()
        for key in [k for k, e in self._entries.items() if e.pending is None and e.expires <= now]:
            del self._entries[key]
        while len(self._entries) > self.max_entries:
            oldest = next(k for k, e in self._entries.items() if e.pending is None)
            del self._entries[oldest]

    async def list_folder(self, path: str) -> list[str]:
        result: list[str] = await self._cached(("folder", path),
                                               lambda: self.inner.list_folder(path))
        return result

    async def domain(self, path: str) -> Domain | None:
        result: Domain | None = await self._cached(("domain", path),
                                                   lambda: self.inner.domain(path))
        return result

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        result: AnyObject = await self._cached(("obj", domain.path, obj_id),
                                               lambda: self.inner.get_object(domain, obj_id))
        return result
