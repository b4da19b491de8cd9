"""Every long-lived table of bookkeeping has a bound (issue 16): the masked secrets,
the uid cache of ACLs, the chunk cache's recent failures, the domain states,
the reference indexes, the resolved URIs of linked files and the chunk-table
cache. Each test makes many more entries than the (shrunk) bound, checks that
the bound holds, and that what was forgotten is only made again. No FUSE, no
servers. (``layouts.errors.report_once``'s bound is tested in test_errors.py.)"""

from __future__ import annotations

import io
import logging
import pwd
from collections import OrderedDict
from typing import Any

import pytest
import trio
import trio.testing

from layouts.formats.hsds import _domains as hsds_domains
from layouts.formats.hsds import _ids as hsds_ids
from layouts.formats.hsds import _locations as hsds_locations
from layouts.formats.hsds._domains import DomainIndex
from layouts.formats.hsds._locations import ChunkTable
from layouts.hdf5 import _linked as h5linked
from layouts.hdf5._linked import LinkedFiles
from layouts.model import Domain, Group
from layouts.storage import ByteRange, ObjectInfo, Store
from mountd import acls, logsafe
from mountd.acls import AclPolicy
from mountd.cache import chunkcache
from mountd.cache.chunkcache import ChunkCache
from mountd.errors import StorageError
from mountd.tree import refindex
from mountd.tree.paths import ObjPath
from mountd.tree.refindex import RefIndex


def test_masked_secrets_are_the_last_ones_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logsafe, "MAX_SECRETS", 3)
    monkeypatch.setattr(logsafe, "_secrets", OrderedDict())
    secrets = [f"bounds-test-secret-{i:04d}" for i in range(10)]
    for secret in secrets[:3]:
        logsafe.add_secret(secret)
    logsafe.add_secret(secrets[0])  # again: the newest now
    for secret in secrets[3:5]:
        logsafe.add_secret(secret)
    assert list(logsafe._secrets) == [secrets[0], secrets[3], secrets[4]]
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logsafe.RedactFilter())
    logger = logging.getLogger("bounds-test.logsafe")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("%s %s %s", secrets[0], secrets[1], secrets[4])
    finally:
        logger.removeHandler(handler)
    assert out.getvalue().split() == [logsafe.MASK, secrets[1], logsafe.MASK]


def test_acl_uid_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acls, "MAX_USERS", 2)
    asked: list[int] = []

    def getpwuid(uid: int) -> Any:
        asked.append(uid)
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    policy = AclPolicy({"7": "seven"})
    assert [policy.hsds_user(uid) for uid in (7, 8, 7, 9)] == ["seven", "8", "seven", "9"]
    assert asked == [7, 8, 9]  # 7 was used again, so 8 is the one that went
    assert policy.hsds_user(7) == "seven" and asked == [7, 8, 9]
    assert policy.hsds_user(8) == "8" and asked == [7, 8, 9, 8]
    assert len(policy._users) == 2


def test_recent_chunk_failures_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunkcache, "MAX_FAILED", 4)

    async def main() -> None:
        cache = ChunkCache(1 << 20, error_ttl=60.0)
        fetches: list[int] = []

        def failing(key: int) -> Any:
            async def fetch() -> bytes | None:
                fetches.append(key)
                raise StorageError(f"chunk {key}", "broken")
            return fetch

        for key in range(100):  # all within error_ttl: none has expired
            with pytest.raises(StorageError):
                await cache.get(key, failing(key))
            assert len(cache._failed) <= 4
        assert list(cache._failed) == [96, 97, 98, 99]
        with pytest.raises(StorageError):
            await cache.get(99, failing(99))  # still remembered: not fetched again
        assert fetches.count(99) == 1
        with pytest.raises(StorageError):
            await cache.get(0, failing(0))  # forgotten: fetched again
        assert fetches.count(0) == 2 and list(cache._failed) == [97, 98, 99, 0]
    trio.run(main)


def test_expired_chunk_failures_go_first() -> None:
    async def main() -> None:
        cache = ChunkCache(1 << 20, error_ttl=0.5)

        async def fetch() -> bytes | None:
            raise StorageError("chunk", "broken")

        for key in range(3):
            with pytest.raises(StorageError):
                await cache.get(key, fetch)
        await trio.sleep(0.6)
        with pytest.raises(StorageError):
            await cache.get(3, fetch)
        assert list(cache._failed) == [3]
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class _Domains:
    """A store of several domains: each root prefix holds its root group and ``n``
    chunks of one dataset."""

    url = "mem://keys/"

    def __init__(self, n: int) -> None:
        self.n = n

    async def list_tree(self, prefix: str, info_for: Any,
                        limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
        keys: list[tuple[str, ObjectInfo | None]] = [
            (f"{prefix}.group.json", ObjectInfo(10, "etag", 1.0))]
        keys += [(f"{prefix}d/0000-000000-000000/0_{i}", None) for i in range(self.n)]
        return keys if len(keys) <= limit else None


def _uuid1(domain: int) -> str:
    return f"{domain:08x}-00000000"


def test_domain_states_are_bounded_by_count_and_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        monkeypatch.setattr(hsds_domains, "MAX_DOMAINS", 3)
        index = DomainIndex(_Domains(2), ttl=3600, eager=True)  # type: ignore[arg-type]
        for domain in range(10):
            state = await index.state(_uuid1(domain), 0, chunks=True)
            assert state is not None
            assert list(state.listing.objects) == [hsds_ids.root_id(_uuid1(domain))]
        assert len(index._slots) == 3 and index.listings == 10
        await index.state(_uuid1(9), 0, chunks=True)  # kept
        await index.state(_uuid1(7), 0, chunks=True)  # kept, used now: 8 goes before it
        assert index.listings == 10
        await index.state(_uuid1(0), 0, chunks=True)  # forgotten: listed again
        assert index.listings == 11
        assert sorted(index._slots) == [_uuid1(0), _uuid1(7), _uuid1(9)]
        monkeypatch.setattr(hsds_domains, "MAX_KEPT_KEYS", 5)
        index = DomainIndex(_Domains(2), ttl=3600, eager=True)  # type: ignore[arg-type]
        for domain in range(10):
            await index.state(_uuid1(domain), 0, chunks=True)
        assert len(index._slots) == 1  # 3 keys each, 5 at most
    trio.run(main)


class _Roots:
    """Domains whose root group links to nothing: an index of one path each."""

    def __init__(self) -> None:
        self.fetches = 0

    async def __call__(self, op: ObjPath) -> Group:
        self.fetches += 1
        return Group(id=op.id, links={})


def test_reference_indexes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        monkeypatch.setattr(refindex, "MAX_DOMAINS", 2)
        epoch = [0]
        fetch = _Roots()
        refs = RefIndex(fetch, lambda: epoch[0])
        domains = [Domain(f"d{i}", f"g-{i}") for i in range(6)]
        for domain in domains:
            assert await refs._domain_index(domain) == {domain.root_id: "/"}
        assert list(refs._index) == ["d4", "d5"] and fetch.fetches == 6
        await refs._domain_index(domains[4])  # kept, used now
        await refs._domain_index(domains[0])  # forgotten: indexed again; d5 goes
        assert fetch.fetches == 7 and list(refs._index) == ["d4", "d0"]
        epoch[0] = 1  # a new period: the old indexes go when the next one is made
        await refs._domain_index(domains[1])
        assert list(refs._index) == ["d1"]
        monkeypatch.setattr(refindex, "MAX_KEPT_PATHS", 3)
        monkeypatch.setattr(refindex, "MAX_DOMAINS", 100)
        for domain in domains:
            await refs._domain_index(domain)
        assert len(refs._index) == 3  # one path each
    trio.run(main)


def test_linked_files_remember_the_last_uris(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h5linked, "MAX_OPENED", 2)
    opened: list[str] = []

    class _Files:
        url = "mem://files/"

        async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
            assert byte_range is not None and byte_range.length is not None
            return bytes(byte_range.length)

    store = _Files()

    def open_uri(uri: str) -> tuple[Store, str]:
        opened.append(uri)
        return store, uri  # type: ignore[return-value]

    async def main() -> None:
        files = LinkedFiles(open_uri)
        for uri in ("a", "b", "a", "c", "a", "b"):
            assert await files.read(uri, 0, 4) == bytes(4)
        assert opened == ["a", "b", "c", "b"]  # "a" stayed in use; "b", then "c", went
        assert len(files._opened) == 2
    trio.run(main)


class _AbsentTable:
    """A chunk table dataset none of whose chunks is stored."""

    async def read_chunk(self, index: tuple[int, ...]) -> bytes | None:
        return None


def test_chunk_table_cache_counts_absent_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hsds_locations, "TABLE_CACHE_BYTES", 10 * hsds_locations.ENTRY_OVERHEAD)

    async def main() -> None:
        table = ChunkTable("d-1", "d-table", lambda _id: None,  # type: ignore[arg-type,return-value]
                           uri="file.h5", chunks=(4,), hyper=None)
        for i in range(1000):
            assert await table._rows(_AbsentTable(), (i,)) is None  # type: ignore[arg-type]
        assert len(table._cache) == 10
    trio.run(main)
