"""A domain's metadata a domain at a time (``layouts.formats.hsds._domains``), without a mount.

Over a copy of the session bucket (real HSDS domains, with the summaries
HSDS's own scan wrote), the catalog built from one listing and the summary
must give exactly what reading every object one by one gives: the same
sidecar documents (times included) and the same chunk listings, with no
request per object. Damaged, foreign, incomplete and stale summaries, and
objects written after the scan, must fall back to reading the objects
themselves, with one log line, and still give the same tree. Answers built
from a listing expire ``metadata_ttl`` after that listing, not after they
were handed out.

The copy's object files are dated a minute before their domain's scan
(``aged_bucket``): the session's loads are flushed moments before the scan,
so most objects would otherwise fall inside the summaries' margin and be
read one by one, which these tests check elsewhere. Faults are injected by
rewriting the copy's summary files.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from layouts.errors import Corrupt
from layouts.formats.hsds import _domains as hsds_domains
from layouts.formats.hsds import _ids as hsds_ids
from layouts.formats.hsds import _summary as hsds_summary
from layouts.formats.hsds._catalog import HsdsCatalog
from layouts.formats.hsds._domains import DomainIndex
from layouts.formats.hsds._listing import DomainListing, sort_keys
from layouts.model import AnyObject, Dataset, Domain, Group, LinkKind
from layouts.storage import Fetched, ObjectInfo
from mountd.cache.metacache import CachedCatalog
from mountd.io.local import LocalStore
from mountd.tree.sidecar import sidecar_document
from tests.test_metacache import Clock, CountingStore

pytestmark = pytest.mark.hsds

#: Seconds the copy's objects are dated before their domain's scan began.
AGE = 60.0


# --------------------------------------------------------------------------- pure rules


U1 = "0123abcd-4567ef01"


def test_listing_sorts_objects_chunks_and_summaries() -> None:
    info = ObjectInfo(10, "e", 5.0)
    d2 = "0000-000000-000001"
    listing = sort_keys(U1, [
        (f"db/{U1}/.group.json", info), (f"db/{U1}/.info.json", info),
        (f"db/{U1}/.summary.json", info), (f"db/{U1}/g/{d2}/.group.json", info),
        (f"db/{U1}/d/{d2}/.dataset.json", info), (f"db/{U1}/d/{d2}/0_1", None),
        (f"db/{U1}/d/{d2}/p3/2_2", None), (f"db/{U1}/t/{d2}/.datatype.json", info),
        (f"db/{U1}/d/not-an-id/.dataset.json", info), (f"db/{U1}/x/{d2}/.group.json", info),
        (f"db/{U1}/stray", info), ("db/other/.group.json", info),
    ])
    assert set(listing.objects) == {hsds_ids.root_id(U1), f"g-{U1}-{d2}", f"d-{U1}-{d2}",
                                    f"t-{U1}-{d2}"}
    assert listing.chunks == {d2: ["0_1", "p3/2_2"]}
    assert listing.info is info and listing.summary is info and listing.keys == 12


def _listing(mtimes: dict[str, float]) -> DomainListing:
    return DomainListing({k: ObjectInfo(1, k, t) for k, t in mtimes.items()}, {}, None, None, 0)


def test_summary_rules() -> None:
    a, b = f"g-{U1}-0000-000000-000001", f"d-{U1}-0000-000000-000002"
    info = Fetched(b'{"scan_start": 100, "scan_complete": 110}', ObjectInfo(1, "i", 111.0))
    assert hsds_summary.scan_cutoff("k", info) == 100 - hsds_summary.MARGIN
    # HSDS's clock 30 s ahead of storage's: the cutoff moves back by as much
    ahead = Fetched(info.data, ObjectInfo(1, "i", 80.0))
    assert hsds_summary.scan_cutoff("k", ahead) == 100 - 30 - hsds_summary.MARGIN
    # HSDS's own .info.json: a figure per dataset before the scan times; a time
    # nested in one of those is not the scan's
    nested = Fetched(b'{"datasets": {"d-1": {"scan_start": 1, "scan_complete": 2}, '
                     b'"d-2": {"num_chunks": 0}}, "scan_start": 100, "scan_complete": 110}',
                     ObjectInfo(1, "i", 111.0))
    assert hsds_summary.scan_cutoff("k", nested) == 100 - hsds_summary.MARGIN
    for bad in (b"[]", b"{}", b'{"scan_start": 5, "scan_complete": 4}', b"nope",
                b'{"scan_start": true, "scan_complete": 4}',
                b'{"datasets": {"d-1": {"scan_start": 1, "scan_complete": 2}}}'):
        with pytest.raises(Corrupt):
            hsds_summary.scan_cutoff("k", Fetched(bad, ObjectInfo(1, "i", 1.0)))

    entries = {a: {"links": {}}, b: {"creationProperties": {"layout": {"class": "x"}}}}

    def summary(doc: Any, mtime: float = 120.0) -> Fetched:
        return Fetched(json.dumps(doc).encode(), ObjectInfo(1, "s", mtime))

    texts = hsds_summary.parse_summary(U1, "k", summary(entries), 111.0)
    assert {k: json.loads(v) for k, v in texts.items() if v is not None} == entries
    # a dataset entry without its layout is named, never to stand in
    assert hsds_summary.parse_summary(U1, "k", summary({b: {}}), 111.0) == {b: None}
    spaced = b'\n { "%s" :\t{ "links" : {} } , "%s":{"creationProperties": ' \
             b'{"layout": {"class": "x"}}}}  \n' % (a.encode(), b.encode())
    assert hsds_summary.parse_summary(U1, "k", Fetched(spaced, ObjectInfo(1, "s", 120.0)),
                                      111.0) == texts | {a: '{ "links" : {} }'}
    assert hsds_summary.parse_summary(U1, "k", summary({}), 111.0) == {}
    for bad, why in ((summary(entries, 100.0), "older than"),
                     (Fetched(b"{", ObjectInfo(1, "s", 120.0)), "not valid JSON"),
                     (Fetched(b'{"%s": {}} x' % a.encode(), ObjectInfo(1, "s", 120.0)),
                      "not valid JSON"),
                     (Fetched(b'{"%s": {} "%s": {}}' % (a.encode(), b.encode()),
                              ObjectInfo(1, "s", 120.0)), "not valid JSON"),
                     (Fetched(b'{"%s" {}}' % a.encode(), ObjectInfo(1, "s", 120.0)),
                      "not valid JSON"),
                     (Fetched(b'{1: {}}', ObjectInfo(1, "s", 120.0)), "not valid JSON"),
                     (Fetched(b"\xff", ObjectInfo(1, "s", 120.0)), "not valid JSON"),
                     (summary({"g-00000000-00000000-0000-000000-000000": {}}), "not objects"),
                     (summary({a: []}), "not objects"), (summary([]), "not a JSON object")):
        with pytest.raises(Corrupt, match=why):
            hsds_summary.parse_summary(U1, "k", bad, 111.0)

    hsds_summary.check_cover("k", _listing({a: 50.0, b: 200.0}), entries, 95.0)
    with pytest.raises(Corrupt, match="does not have"):
        hsds_summary.check_cover("k", _listing({a: 50.0}), entries, 95.0)
    with pytest.raises(Corrupt, match="misses 1"):
        hsds_summary.check_cover("k", _listing({a: 50.0, b: 60.0}), {a: {}}, 95.0)
    # only objects from before the cutoff, and datasets that hold their layout
    assert list(hsds_summary.trusted(_listing({a: 50.0, b: 60.0}), texts, 95.0)) == [a, b]
    assert list(hsds_summary.trusted(_listing({a: 50.0, b: 96.0}), texts, 95.0)) == [a]
    assert list(hsds_summary.trusted(_listing({a: 50.0, b: 60.0}), {a: "{}", b: None},
                                     95.0)) == [a]


# --------------------------------------------------------------------------- the bucket


def _roots(bucket_dir: Path) -> Iterator[Path]:
    """The root prefix directories of the bucket's domains that have summaries."""
    for info in sorted((bucket_dir / "db").glob("*/.info.json")):
        if (info.parent / ".summary.json").exists():
            yield info.parent


@pytest.fixture
def aged_bucket(hsds_bucket: Any, tmp_path: Path) -> Path:
    """A copy of the session bucket whose object files are dated ``AGE`` seconds
    before their domain's scan, and whose summaries after it."""
    copy = tmp_path / "bucket"
    shutil.copytree(hsds_bucket.bucket_dir, copy)
    for root in _roots(copy):
        info = json.loads((root / ".info.json").read_text())
        old = info["scan_start"] - AGE
        for here, _, files in os.walk(root):
            for name in files:
                os.utime(Path(here) / name, (old, old))
        after = info["scan_complete"] + 1
        os.utime(root / ".info.json", (after, after))
        os.utime(root / ".summary.json", (after + 1, after + 1))
    return copy


async def _walk(catalog: Any, domain: Domain) -> dict[str, tuple[Any, list[Any] | None]]:
    """Every object reached by hard links, by path: its sidecar document and, for a
    dataset, its sorted chunk indices."""
    assert domain.root_id is not None
    out: dict[str, tuple[Any, list[Any] | None]] = {}
    todo: list[tuple[str, str]] = [("/", domain.root_id)]
    seen: set[str] = set()

    async def no_refs(ref: Any) -> None:
        return None

    while todo:
        batch, todo = todo, []
        objects = await catalog.get_objects(domain, [obj_id for _, obj_id in batch])
        for (path, obj_id), obj in zip(batch, objects, strict=True):
            if not isinstance(obj, AnyObject):
                out[path] = (type(obj).__name__, None)
                continue
            chunks = None
            if isinstance(obj, Dataset):
                chunks = sorted([index async for index in obj.store.iter_stored()])
            doc = await sidecar_document(obj, path, domain if path == "/" else None, no_refs)
            out[path] = (doc, chunks)
            if isinstance(obj, Group) and obj_id not in seen:
                seen.add(obj_id)
                todo += [(f"{path.rstrip('/')}/{name}", link.target)
                         for name, link in sorted(obj.links.items())
                         if link.kind is LinkKind.HARD]
    return out


def _domains(bucket_dir: Path) -> list[str]:
    found = []
    for path in sorted(bucket_dir.glob("home/admin/*/.domain.json")):
        if "root" in json.loads(path.read_text()):
            found.append(str(path.parent.relative_to(bucket_dir)))
    return found


async def _both(bucket_dir: Path, domain_path: str) -> tuple[Any, Any, CountingStore,
                                                             DomainIndex]:
    """The domain walked object by object, and walked with a domain index."""
    plain = HsdsCatalog(LocalStore(bucket_dir))
    domain = await plain.domain(domain_path)
    assert domain is not None
    expected = await _walk(plain, domain)
    store = CountingStore(LocalStore(bucket_dir))
    index = DomainIndex(store, 3600, eager=False)  # type: ignore[arg-type]
    found = await _walk(HsdsCatalog(store, domain_index=index), domain)  # type: ignore[arg-type]
    return expected, found, store, index


def _object_reads(store: CountingStore) -> int:
    """Object JSON read one by one (chunks, which scalar values are read from, and
    the summaries are not)."""
    return sum(n for (method, key), n in store.calls.items() if method == "get"
               and key.startswith("db/") and key.endswith(".json")
               and not key.endswith((".info.json", ".summary.json")))


def test_summaries_give_the_tree_per_object_reads_give(aged_bucket: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hsds_domains, "LIST_AFTER", 1)  # every domain, however small

    async def main() -> None:
        domains = _domains(aged_bucket)
        assert len(domains) >= 10
        for domain_path in domains:
            expected, found, store, index = await _both(aged_bucket, domain_path)
            assert found == expected, domain_path
            assert _object_reads(store) == 0, domain_path
            assert index.listings == 1 and index.summaries == 1, domain_path
    trio.run(main)


def _rewrite(path: Path, change: Any) -> None:
    """Rewrite a JSON file with ``change(doc)``, keeping its time."""
    st = path.stat()
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    os.utime(path, (st.st_atime, st.st_mtime))


def _domain_root(bucket_dir: Path, domain_path: str) -> Path:
    root_id = json.loads((bucket_dir / domain_path / ".domain.json").read_text())["root"]
    return bucket_dir / "db" / hsds_ids.parse_id(root_id).uuid1  # type: ignore[operator]


def _other(doc: dict[str, Any]) -> dict[str, Any]:
    return {key.replace(key[2:19], "00000000-11111111"): value for key, value in doc.items()}


FAULTS = {
    "damaged": (lambda root: (root / ".summary.json").write_bytes(b'{"g-'), "not valid JSON"),
    "foreign": (lambda root: _rewrite(root / ".summary.json", _other), "not objects of"),
    "incomplete": (lambda root: _rewrite(root / ".summary.json",
                                         lambda doc: dict(list(doc.items())[1:])), "misses 1"),
    "extra": (lambda root: _rewrite(root / ".summary.json", lambda doc: {
        **doc, f"d-{root.name}-0000-000000-000000": {}}), "does not have"),
    "stale": (lambda root: os.utime(root / ".summary.json", (1.0, 1.0)), "older than"),
    "no scan": (lambda root: _rewrite(root / ".info.json", lambda doc: {
        k: v for k, v in doc.items() if k != "scan_start"}), "scan_start"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_unusable_summaries_fall_back_to_the_objects(aged_bucket: Path, fault: str,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(hsds_domains, "LIST_AFTER", 1)
    domain_path = "home/admin/links.h5"
    root = _domain_root(aged_bucket, domain_path)
    damage, why = FAULTS[fault]
    damage(root)

    async def main() -> None:
        with caplog.at_level(logging.WARNING, logger="layouts.formats.hsds._domains"):
            expected, found, store, _ = await _both(aged_bucket, domain_path)
        assert found == expected
        assert _object_reads(store) == len({doc["id"] for doc, _ in expected.values()
                                            if isinstance(doc, dict)})
        lines = [r.getMessage() for r in caplog.records
                 if r.name == "layouts.formats.hsds._domains"]
        assert (len(lines) == 1 and why in lines[0] and ".summary.json" in lines[0]) \
            or ".info.json" in lines[0], lines
    trio.run(main)


def test_objects_written_since_the_scan_are_read_on_their_own(
        aged_bucket: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hsds_domains, "LIST_AFTER", 1)
    domain_path = "home/admin/links.h5"
    root = _domain_root(aged_bucket, domain_path)
    group = root / ".group.json"
    doc = json.loads(group.read_text())
    doc["attributes"]["written_later"] = {"type": {"class": "H5T_INTEGER",
                                                   "base": "H5T_STD_I32LE"},
                                          "shape": {"class": "H5S_SCALAR"}, "value": 7}
    group.write_text(json.dumps(doc))  # dated now: after the scan

    async def main() -> None:
        expected, found, store, _ = await _both(aged_bucket, domain_path)
        assert found == expected
        assert found["/"][0]["attributes"]["written_later"] == 7
        assert _object_reads(store) == 1  # that group alone
    trio.run(main)


def test_a_copy_newer_than_its_scan_does_not_fetch_the_summary(
        aged_bucket: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every object dated after the scan (a domain copied since, as onto another
    store): ``.info.json`` says the summary could stand in for none of them, so
    it is not fetched, and every object is read on its own."""
    monkeypatch.setattr(hsds_domains, "LIST_AFTER", 1)
    domain_path = "home/admin/links.h5"
    root = _domain_root(aged_bucket, domain_path)
    later = json.loads((root / ".info.json").read_text())["scan_complete"] + 60
    for here, _, files in os.walk(root):
        for name in files:
            if name not in (".info.json", ".summary.json"):
                os.utime(Path(here) / name, (later, later))

    async def main() -> None:
        expected, found, store, index = await _both(aged_bucket, domain_path)
        assert found == expected
        prefix = f"db/{root.name}/"
        assert store.calls["get", prefix + ".info.json"] == 1
        assert store.calls["get", prefix + ".summary.json"] == 0
        assert index.summaries == 1
        assert _object_reads(store) == len({doc["id"] for doc, _ in expected.values()
                                            if isinstance(doc, dict)})

    async def relisted() -> None:
        """Listed again past the TTL with only the root built: the unchanged
        ``.info.json`` is not fetched again, nor the summary."""
        clock = Clock()
        store = CountingStore(LocalStore(aged_bucket))
        index = DomainIndex(store, 60, eager=False, clock=clock)  # type: ignore[arg-type]
        cached = CachedCatalog(HsdsCatalog(store, domain_index=index),  # type: ignore[arg-type]
                               ttl=60, clock=clock)
        domain = await cached.domain(domain_path)
        assert domain is not None and domain.root_id is not None
        for _ in range(2):
            assert isinstance(await cached.get_object(domain, domain.root_id), Group)
            clock.now += 61
        assert index.listings == 2 and index.summaries == 1
        assert store.calls["get", f"db/{root.name}/.info.json"] == 1
        assert store.calls["get", f"db/{root.name}/.summary.json"] == 0
    trio.run(main)
    trio.run(relisted)


def test_a_bad_summary_entry_reads_the_object(aged_bucket: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hsds_domains, "LIST_AFTER", 1)
    domain_path = "home/admin/links.h5"
    root = _domain_root(aged_bucket, domain_path)
    root_id = hsds_ids.root_id(root.name)
    _rewrite(root / ".summary.json", lambda doc: {**doc, root_id: {"links": "broken"}})

    async def main() -> None:
        expected, found, store, _ = await _both(aged_bucket, domain_path)
        assert found == expected and _object_reads(store) == 1
    trio.run(main)


def test_answers_from_a_listing_expire_with_it(aged_bucket: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An object built from a listing made at t=0 and handed out at t=50 is kept
    until t=60, not t=110; the next listing hands out the same instances of
    what did not change, without fetching the summary again, and proves the
    expired entries of those instances current for another period."""
    monkeypatch.setattr(hsds_domains, "LIST_AFTER", 1)

    async def main() -> None:
        clock = Clock()
        store = CountingStore(LocalStore(aged_bucket))
        index = DomainIndex(store, 60, eager=False, clock=clock)  # type: ignore[arg-type]
        cached = CachedCatalog(HsdsCatalog(store, domain_index=index),  # type: ignore[arg-type]
                               ttl=60, clock=clock)
        domain = await cached.domain("home/admin/links.h5")
        assert domain is not None and domain.root_id is not None
        root = await cached.get_object(domain, domain.root_id)
        assert isinstance(root, Group)
        child = next(link.target for link in root.links.values()
                     if link.kind is LinkKind.HARD)
        clock.now += 50
        first = await cached.get_object(domain, child)
        assert index.listings == 1
        clock.now += 11
        assert cached.peek_object(domain, child) is None  # 61 s after the listing
        again = await cached.get_object(domain, root.id)
        assert again is root and index.listings == 2 and index.summaries == 1
        # the new listing proves the child unchanged: kept on, with no fetch
        assert cached.peek_object(domain, child) is first and cached.rearmed == 1
        clock.now += 60
        assert cached.peek_object(domain, child) is None  # not past that listing's TTL
        assert _object_reads(store) == 0
    trio.run(main)


class MemoryRecords:
    """Records kept in a dict (``layouts.places.Records``), as a cache_dir would."""

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}
        self.vouched: list[tuple[int, float]] = []

    def keeps(self, store: Any) -> bool:
        return True

    async def load(self, store: Any, name: str) -> bytes | None:
        return self.kept.get(name)

    async def save(self, store: Any, name: str, data: bytes) -> None:
        self.kept[name] = data

    async def vouch(self, store: Any, listed: Any, age: float) -> None:
        self.vouched.append((len(listed), age))


def test_a_kept_listing_serves_a_remount_until_the_ttl(aged_bucket: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A second mount finds the first one's listing: younger than the TTL it is the
    state, with its validators vouched for (no listing); older, the domain is
    listed at its first use, however few objects are asked for; a broken
    record is no record."""
    monkeypatch.setattr(hsds_domains, "LIST_AFTER", 1)
    domain_path = "home/admin/links.h5"
    records = MemoryRecords()
    now = [1_000_000.0]

    def mount() -> tuple[HsdsCatalog, DomainIndex]:
        index = DomainIndex(LocalStore(aged_bucket), 60, eager=False,  # type: ignore[arg-type]
                            records=records, wall=lambda: now[0])
        return HsdsCatalog(LocalStore(aged_bucket), domain_index=index), index

    async def main() -> None:
        catalog, index = mount()
        domain = await catalog.domain(domain_path)
        assert domain is not None and domain.root_id is not None
        expected = await _walk(catalog, domain)
        assert index.listings == 1 and len(records.kept) == 1
        now[0] += 10
        catalog, index = mount()
        assert await _walk(catalog, domain) == expected
        assert index.listings == 0 and index.summaries == 1
        assert len(records.vouched) == 1 and records.vouched[0][1] == 10
        now[0] += 100
        catalog, index = mount()
        await catalog.get_object(domain, domain.root_id)  # one object: still listed
        assert index.listings == 1
        [name] = records.kept
        records.kept[name] = b"not a record"
        monkeypatch.setattr(hsds_domains, "LIST_AFTER", 32)
        catalog, index = mount()
        await catalog.get_object(domain, domain.root_id)
        assert index.listings == 0
    trio.run(main)
