"""What the daemon's SIGHUP drops, without a mount: every cached answer goes stale at once.

``CachedCatalog.drop``: a small in-memory catalog counts the fetches that
reach it and can hold one open, so a fetch under way at the drop is seen to
answer the task that started it with its own outcome, while the task waiting
on it fetches again. The other caches SIGHUP reaches: the HSDS domain states
(``DomainIndex.drop``, reached through ``CachedCatalog.drop``, a listing
under way at the drop included), the reference index (keyed by ``Tree.epoch``, which
``Tree.refresh`` moves on) and the block cache's validations
(``Source.refresh`` calls ``BlockCache.expire``).

Concurrency: each test is one ``trio.run``; held fetches and listings wait on
a ``trio.Event`` the test sets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import trio
import trio.testing

from layouts.formats.hsds._catalog import HsdsCatalog
from layouts.formats.hsds._domains import DomainIndex
from layouts.model import Domain, Group, Link, LinkKind, ObjectKind, ObjectRef, get_each
from mountd.cache.metacache import CachedCatalog
from mountd.io.blockcache import BlockCache
from mountd.sources import Source
from mountd.tree import make_tree
from tests.test_blockcache import MemoryStore


class Versions:
    """A catalog whose answer for every name is its current ``version``."""

    single_domain = None
    supports_proof_ages = False

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

    async def get_objects(self, domain: Domain, obj_ids: Sequence[str]) -> list[Any]:
        raise AssertionError("not used")

    def drop(self) -> None:
        """Nothing is kept besides the answers."""


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


U1 = "00000001-00000000"
D2 = "0000-000000-000002"


class Keys:
    """A store of one domain's chunk keys (``list_tree`` only); a listing may be held."""

    url = "mem://keys/"

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.gate: trio.Event | None = None

    async def list_tree(self, prefix: str, info_for: Any,
                        limit: int) -> list[tuple[str, Any]]:
        names = list(self.names)
        if self.gate is not None:
            await self.gate.wait()
        return [(f"{prefix}d/{D2}/{name}", None) for name in names]


async def chunk_names(index: DomainIndex) -> list[str]:
    state = await index.state(U1, 0, chunks=True)
    assert state is not None
    return state.listing.chunks.get(D2, [])


def test_domain_index_drop_lists_again() -> None:
    async def main() -> None:
        store = Keys(["0_0"])
        index = DomainIndex(store, ttl=3600, eager=True)  # type: ignore[arg-type]
        assert await chunk_names(index) == ["0_0"]
        store.names = ["0_0", "0_1"]
        assert await chunk_names(index) == ["0_0"]
        assert index.listings == 1
        index.drop()
        assert await chunk_names(index) == ["0_0", "0_1"]
        store.names = ["0_0", "0_1", "1_0"]
        # SIGHUP's path: the metadata cache's drop reaches the catalog's index.
        catalog = HsdsCatalog(store, domain_index=index)  # type: ignore[arg-type]
        CachedCatalog(catalog, ttl=3600).drop()
        assert await chunk_names(index) == ["0_0", "0_1", "1_0"]
        assert index.listings == 3

    trio.run(main)


def test_listing_under_way_at_drop_answers_its_waiters_and_is_not_kept() -> None:
    async def main() -> None:
        store = Keys(["0_0"])
        index = DomainIndex(store, ttl=3600, eager=True)  # type: ignore[arg-type]
        store.gate = trio.Event()
        answers: list[list[str] | None] = []

        async def ask() -> None:
            state = await index.state(U1, 0, chunks=True)
            answers.append(None if state is None else state.listing.chunks.get(D2, []))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            index.drop()
            store.names = ["0_0", "0_1"]
            store.gate.set()
        assert answers == [["0_0"], ["0_0"]]
        assert index.listings == 1
        assert await chunk_names(index) == ["0_0", "0_1"]
        assert index.listings == 2

    trio.run(main)


class Linked:
    """A domain whose root group links to one object, by a name the test changes."""

    single_domain = "d"
    supports_proof_ages = False

    def __init__(self) -> None:
        self.name = "first"
        self.fetches = 0

    async def list_folder(self, path: str) -> list[str]:
        raise AssertionError("not used")

    async def domain(self, path: str) -> Domain | None:
        return Domain(path, "g-root")

    async def get_object(self, domain: Domain, obj_id: str) -> Any:
        self.fetches += 1
        assert obj_id == "g-root"
        link = Link(LinkKind.HARD, "d-target", target_kind=ObjectKind.DATASET)
        return Group(id="g-root", links={self.name: link})

    async def get_objects(self, domain: Domain, obj_ids: Sequence[str]) -> list[Any]:
        return await get_each(self, domain, obj_ids)

    def drop(self) -> None:
        """Nothing is kept besides the answers."""


def test_tree_refresh_drops_the_reference_index() -> None:
    async def main() -> None:
        inner = Linked()
        tree = make_tree(CachedCatalog(inner, ttl=3600), ttl=3600)
        domain = Domain("d", "g-root")
        ref = ObjectRef(obj_id="d-target")
        assert await tree.refs.ref_path(domain, ref) == "/first"
        inner.name = "second"
        tree.catalog.drop()  # type: ignore[attr-defined]
        assert await tree.refs.ref_path(domain, ref) == "/first"
        assert inner.fetches == 1
        tree.refresh()
        assert await tree.refs.ref_path(domain, ref) == "/second"
        assert inner.fetches == 2

    trio.run(main)


def test_source_refresh_revalidates_cached_blocks() -> None:
    async def main() -> None:
        store = MemoryStore()
        store.put("k", b"old")
        cache = BlockCache(1 << 20, validate_ttl=3600, block_size=1024)
        source = Source(Versions(), cache)  # type: ignore[arg-type]
        assert (await cache.read(store, "k")).data == b"old"
        store.put("k", b"new")
        assert (await cache.read(store, "k")).data == b"old"
        assert store.heads() == 0
        await source.refresh()
        assert (await cache.read(store, "k")).data == b"new"
        assert store.heads() == 1
        assert (await cache.read(store, "k")).data == b"new"
        assert store.heads() == 1

    trio.run(main)
