"""``CachedCatalog.drop`` (the daemon's SIGHUP): every cached answer goes stale at once.

A small in-memory catalog counts the fetches that reach it and can hold one
open, so a fetch under way at the drop is seen to answer the task that
started it with its own outcome, while the task waiting on it fetches again.

Concurrency: each test is one ``trio.run``; the held fetch waits on a
``trio.Event`` the test sets.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio
import trio.testing

from layouts.model import Domain
from mountd.metacache import CachedCatalog


class Versions:
    """A catalog whose answer for every name is its current ``version``."""

    single_domain = None

    def __init__(self) -> None:
        self.version = 1
        self.fetches: Counter[str] = Counter()
        self.gate: trio.Event | None = None

    async def list_folder(self, path: str) -> list[str]:
        self.fetches[path] += 1
        version = self.version
        if self.gate is not None:
            await self.gate.wait()
        return [f"v{version}"]

    async def domain(self, path: str) -> Domain | None:
        return None

    async def get_object(self, domain: Domain, obj_id: str) -> Any:
        raise AssertionError("not used")


def test_drop_makes_every_answer_stale() -> None:
    async def main() -> None:
        inner = Versions()
        cached = CachedCatalog(inner, ttl=3600)
        assert await cached.list_folder("a") == ["v1"]
        inner.version = 2
        assert await cached.list_folder("a") == ["v1"]
        cached.drop()
        assert await cached.list_folder("a") == ["v2"]
        assert await cached.list_folder("a") == ["v2"]
        assert inner.fetches["a"] == 2

    trio.run(main)


def test_fetch_under_way_at_drop_answers_its_task_then_goes_stale() -> None:
    async def main() -> None:
        inner = Versions()
        cached = CachedCatalog(inner, ttl=3600)
        inner.gate = trio.Event()
        answers: list[list[str]] = []

        async def ask() -> None:
            answers.append(await cached.list_folder("a"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            cached.drop()
            inner.version = 2
            inner.gate.set()
        assert answers == [["v1"], ["v2"]]
        assert inner.fetches["a"] == 2
        inner.gate = None
        assert await cached.list_folder("a") == ["v2"]
        assert inner.fetches["a"] == 2

    trio.run(main)
