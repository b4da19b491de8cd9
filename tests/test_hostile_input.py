"""Hostile and broken input from a bucket or reference file someone else controls.

Each object here breaks one rule on purpose: link names no file name can show
(``/``, empty, not valid Unicode) and names that must be escaped or cut (NUL,
``..``, 10 KB); dims whose product overflows, negative or zero chunk dims,
chunk shapes of another rank, huge ranks and element sizes; JSON nested past
any stack; 1 GiB metadata objects (sparse files, nothing written); a million
links in one group; hard-link cycles. Each must give EIO (``Corrupt``) for
itself alone, or be left out of its group with one log line, while a good
sibling still reads; nothing may crash, hang, or take memory in proportion to
what the object claims.

The HSDS bucket is written straight in schema v2 (``bench.scaledata``'s
writer and ``h5json`` ids, as HSDS 1.0.2 lays it out), the LINDI file as
plain JSON. Both are checked through their catalogs and through a real FUSE
mount of the ``h5mount`` command.
"""

from __future__ import annotations

import base64
import errno
import json
import logging
import os
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from h5json import objid

from bench.scaledata import BucketWriter
from layouts.formats.hsds._catalog import HsdsCatalog
from layouts.formats.refs import _catalog as lindi
from layouts.formats.refs._catalog import KeyIndex, RefCatalog
from layouts.formats.refs._table import MAX_JSON_BYTES, RefFormatError, load_reference
from layouts.model import AnyObject, Dataset, Domain, Group
from layouts.storage import (
    CAPPED_FIRST_READ,
    DEFAULT_MAX_METADATA,
    ByteRange,
    Fetched,
    Store,
    fetch_capped,
    fetch_each,
)
from mountd.config import MountConfig, OptionError, apply_options
from mountd.errors import Corrupt, MountError, NotFound, StorageError
from mountd.io.blockcache import BlockCache
from mountd.io.cached import CachedStore
from mountd.io.local import LocalStore
from mountd.tree.names import display_name
from tests.mounting import daemon_pids, fuse_available, mounted, run_h5mount

GIB = 1 << 30
INT32 = {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"}
GOOD = np.arange(4, dtype="<i4") * 7 + 1
LONG = "n" * 10_000
#: Names the mount shows, escaped or cut, and those it must leave out.
SHOWN = {"x\0y": "x%00y", "..": "%2E%2E", ".": "%2E", "50%": "50%25",
         LONG: display_name(LONG)}
LEFT_OUT = ("a/b", "", "\ud800")
#: Nesting that orjson takes (under its 1024 limit) but no sidecar may recurse into.
DEEP = 500
#: Nesting past every parser's limit.
DEEPER = 100_000
#: Peak memory a refused 1 GiB or million-link object may cost, in bytes.
SMALL_PEAK = 8 << 20
#: Peak resident memory of a daemon that met every hostile object here.
DAEMON_PEAK = 200 << 20


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def sparse(path: Path, head: bytes, size: int) -> Path:
    """A file of ``size`` bytes that starts with ``head`` and takes no disk space."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def eio(fn: Callable[[], Any]) -> None:
    with pytest.raises(OSError) as info:
        fn()
    assert info.value.errno == errno.EIO


def vm_hwm(pid: int) -> int:
    """Peak resident memory of process ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def peak_memory(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the most memory Python allocated while it ran."""
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------- the HSDS bucket

HSDS_DOMAIN = "home/hostile.h5"
BAD_DOMAINS = ("home/deep_domain.h5", "home/huge_domain.h5")


def dataset_doc(did: str, root: str, dims: Any = (4,), chunks: Any = (4,),
                dtype: Any = INT32) -> dict[str, Any]:
    return {"id": did, "root": root, "created": 1.7e9, "lastModified": 1.7e9, "type": dtype,
            "shape": {"class": "H5S_SIMPLE", "dims": list(dims)},
            "creationProperties": {"layout": {"class": "H5D_CHUNKED", "dims": list(chunks)},
                                   "fillValue": 0},
            "attributes": {}}


#: Datasets whose JSON breaks one rule: link name -> what the rule is about.
BAD_DATASETS: dict[str, Callable[[str, str], dict[str, Any]]] = {
    "dims_overflow": lambda d, r: dataset_doc(d, r, [2**62, 2**62], [1, 1]),
    "dims_bytes": lambda d, r: dataset_doc(d, r, [2**31, 2**31], [1, 1]),
    "dims_negative": lambda d, r: dataset_doc(d, r, [-4], [4]),
    "chunk_zero": lambda d, r: dataset_doc(d, r, [4], [0]),
    "chunk_negative": lambda d, r: dataset_doc(d, r, [4], [-4]),
    "chunk_rank": lambda d, r: dataset_doc(d, r, [4, 4], [4]),
    "rank_33": lambda d, r: dataset_doc(d, r, [1] * 33, [1] * 33),
    "rank_huge": lambda d, r: dataset_doc(d, r, [1] * 100_000, [1] * 100_000),
    "type_array_huge": lambda d, r: dataset_doc(
        d, r, dtype={"class": "H5T_ARRAY", "dims": [1 << 20, 1 << 20], "base": INT32}),
    "type_array_rank": lambda d, r: dataset_doc(
        d, r, dtype={"class": "H5T_ARRAY", "dims": [1] * 40, "base": INT32}),
    "type_string_huge": lambda d, r: dataset_doc(
        d, r, dtype={"class": "H5T_STRING", "length": 1 << 40, "charSet": "H5T_CSET_ASCII"}),
    "type_opaque_huge": lambda d, r: dataset_doc(
        d, r, dtype={"class": "H5T_OPAQUE", "size": (1 << 31) - 1}),
    "attr_surrogate": lambda d, r: {**dataset_doc(d, r), "attributes": {"a": {
        "type": {"class": "H5T_STRING", "length": "H5T_VARIABLE",
                 "charSet": "H5T_CSET_UTF8"},
        "shape": {"class": "H5S_SCALAR"}, "value": "\ud800"}}},
}
#: Datasets whose JSON text is written as is: link name -> the text.
RAW_DATASETS: dict[str, Callable[[str, str], str]] = {
    "deep_doc": lambda d, r: nested(DEEPER),
    "deep_filters": lambda d, r: json.dumps(dataset_doc(d, r)).replace(
        '"fillValue": 0', f'"fillValue": 0, "filters": {nested(DEEP)}'),
    "deep_type": lambda d, r: json.dumps(dataset_doc(d, r)).replace(
        '"base": "H5T_STD_I32LE"', f'"base": "H5T_STD_I32LE", "x": {nested(DEEP)}'),
    "not_utf8": lambda d, r: json.dumps(dataset_doc(d, r)).replace('"attributes"',
                                                                   '"\udcff"'),
}
#: Objects whose JSON is a sparse 1 GiB file.
HUGE = ("huge_dataset", "huge_group")
MILLION = 1_000_000


@dataclass(frozen=True)
class HostileBucket:
    bucket_dir: Path
    root: str
    #: link name in the root group -> object id
    ids: dict[str, str]

    def key(self, name: str) -> str:
        return objid.getS3Key(self.ids[name])

    def path(self, name: str) -> Path:
        return self.bucket_dir / self.key(name)


def write_bucket(bucket_dir: Path) -> HostileBucket:
    writer = BucketWriter(bucket_dir)
    root = objid.createObjId("groups")
    ids: dict[str, str] = {}

    def new(kind: str, name: str) -> str:
        ids[name] = objid.createObjId(kind, root_id=root)
        return ids[name]

    good = new("datasets", "good")
    writer.put_json(objid.getS3Key(good), dataset_doc(good, root))
    writer.put(objid.getS3Key(good).rsplit("/", 1)[0] + "/0", GOOD.tobytes())
    for name, make in BAD_DATASETS.items():
        did = new("datasets", name)
        writer.put(objid.getS3Key(did), json.dumps(make(did, root)).encode())
    for name, text in RAW_DATASETS.items():
        did = new("datasets", name)
        writer.put(objid.getS3Key(did), text(did, root).encode("utf-8", "surrogateescape"))
    sparse(bucket_dir / objid.getS3Key(new("datasets", "huge_dataset")), b'{"id": "', GIB)
    sparse(bucket_dir / objid.getS3Key(new("groups", "huge_group")), b'{"links": {', GIB)
    target = ids["good"].encode()
    writer.put(objid.getS3Key(new("groups", "million")), b'{"links": {%s}}' % b",".join(
        b'"%d": {"class": "H5L_TYPE_HARD", "id": "%s"}' % (i, target) for i in range(MILLION)))
    # a hard-link cycle: /cycle/self -> /cycle, /cycle/up -> /, /cycle/down/back -> /cycle
    cycle, down = new("groups", "cycle"), objid.createObjId("groups", root_id=root)
    writer.group(cycle, root, {"self": cycle, "up": root, "down": down, "good": good})
    writer.group(down, root, {"back": cycle, "top": root})
    # times no clock can show, and an attribute name that is not Unicode
    odd = new("groups", "odd_times")
    writer.put(objid.getS3Key(odd), b'{"created": 1e999, "lastModified": NaN, "links": {}, '
                                    b'"attributes": {}, "x": 1%s}' % (b"0" * 400))
    bad_attr = new("groups", "attr_name")
    writer.put_json(objid.getS3Key(bad_attr), {"links": {}, "attributes": {"\ud800": {
        "type": INT32, "shape": {"class": "H5S_SCALAR"}, "value": 1}}})
    links = {name: {"class": "H5L_TYPE_HARD", "id": oid} for name, oid in ids.items()}
    for name in (*SHOWN, *LEFT_OUT):
        links[name] = {"class": "H5L_TYPE_HARD", "id": good}
    links["deep_link"] = "@DEEP@"
    links["soft_surrogate"] = {"class": "H5L_TYPE_SOFT", "h5path": "/\ud800"}
    doc = json.dumps({"id": root, "root": root, "links": links, "attributes": {}})
    writer.put(objid.getS3Key(root), doc.replace('"@DEEP@"', nested(DEEP)).encode())
    writer.domain(HSDS_DOMAIN, root)
    # domains: one whose JSON nests too deep, one of 1 GiB
    writer.put(f"{BAD_DOMAINS[0]}/.domain.json",
               f'{{"root": "{root}", "acls": {nested(DEEP)}}}'.encode())
    sparse(bucket_dir / BAD_DOMAINS[1] / ".domain.json", b'{"root": "', GIB)
    return HostileBucket(bucket_dir, root, ids)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> HostileBucket:
    return write_bucket(tmp_path_factory.mktemp("hostile") / "bucket")


async def domain_of(catalog: HsdsCatalog) -> Domain:
    found = await catalog.domain(HSDS_DOMAIN)
    assert found is not None
    return found


@pytest.mark.slow
def test_catalog_leaves_out_unshowable_links(bucket: HostileBucket,
                                             caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> Group:
        catalog = HsdsCatalog(LocalStore(bucket.bucket_dir))
        domain = await domain_of(catalog)
        assert domain.root_id == bucket.root
        for _ in range(2):
            root = await catalog.get_object(domain, bucket.root)
        assert isinstance(root, Group)
        return root

    with caplog.at_level(logging.ERROR):
        root = trio.run(main)
    assert set(SHOWN) | set(bucket.ids) <= set(root.links)
    assert not set(LEFT_OUT) & set(root.links)
    assert "deep_link" not in root.links and "soft_surrogate" not in root.links
    logged = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(logged) == 1, logged  # once, though the group was read twice
    assert "5 of the links" in logged[0] and objid.getS3Key(bucket.root) in logged[0]


@pytest.mark.slow
def test_catalog_refuses_each_bad_object_alone(bucket: HostileBucket) -> None:
    why = {"dims_overflow": "too many elements", "dims_bytes": "too large",
           "dims_negative": "bad dims", "chunk_zero": "do not fit",
           "chunk_negative": "bad layout dims", "chunk_rank": "do not fit",
           "rank_33": "more than 32", "rank_huge": "more than 32",
           "type_array_huge": "items", "type_array_rank": "dims",
           "type_string_huge": "bytes", "type_opaque_huge": "bytes",
           "attr_surrogate": "Unicode", "deep_doc": "not valid JSON",
           "deep_filters": "nested more than", "deep_type": "nested more than",
           "not_utf8": "not valid JSON", "huge_dataset": "max_metadata",
           "huge_group": "max_metadata", "million": "max_metadata",
           "attr_name": "Unicode"}

    async def main() -> None:
        catalog = HsdsCatalog(LocalStore(bucket.bucket_dir))
        domain = await domain_of(catalog)
        names = list(why)
        batch = await catalog.get_objects(domain, [bucket.ids[n] for n in ["good", *names]])
        good = batch[0]
        assert isinstance(good, Dataset) and good.shape == (4,)
        assert await good.read_chunk((0,)) == GOOD.tobytes()
        for name, found in zip(names, batch[1:], strict=True):
            assert isinstance(found, Corrupt), (name, found)
            assert found.key == bucket.key(name) and why[name] in found.reason, (name, found)
            started = time.monotonic()
            with pytest.raises(Corrupt) as info:
                await catalog.get_object(domain, bucket.ids[name])
            assert str(info.value) == str(found)
            assert time.monotonic() - started < 5, name
        odd = await catalog.get_object(domain, bucket.ids["odd_times"])
        # the times it holds are no times, and none is used: its JSON's storage time is
        assert isinstance(odd, Group)
        assert odd.modified == bucket.path("odd_times").stat().st_mtime
        for path in BAD_DOMAINS:
            with pytest.raises(Corrupt) as info:
                await catalog.domain(path)
            assert path in info.value.key

    trio.run(main)


@pytest.mark.parametrize("name", [*HUGE, "million"])
def test_huge_metadata_is_refused_before_it_is_read(bucket: HostileBucket, name: str) -> None:
    async def one() -> None:
        catalog = HsdsCatalog(LocalStore(bucket.bucket_dir))
        with pytest.raises(Corrupt, match="max_metadata"):
            await catalog.get_object(await domain_of(catalog), bucket.ids[name])

    async def batch() -> list[AnyObject | MountError]:
        catalog = HsdsCatalog(LocalStore(bucket.bucket_dir))
        return await catalog.get_objects(await domain_of(catalog), [bucket.ids[name]])

    assert bucket.path(name).stat().st_size > DEFAULT_MAX_METADATA
    assert peak_memory(lambda: trio.run(one))[1] < SMALL_PEAK
    found, peak = peak_memory(lambda: trio.run(batch))
    assert isinstance(found[0], Corrupt) and peak < SMALL_PEAK


def test_max_metadata_is_the_limit(bucket: HostileBucket) -> None:
    size = bucket.path("good").stat().st_size

    async def main() -> None:
        for limit, ok in ((size, True), (size - 1, False)):
            catalog = HsdsCatalog(LocalStore(bucket.bucket_dir), max_metadata=limit)
            domain = Domain(path=HSDS_DOMAIN, root_id=bucket.root)
            found = (await catalog.get_objects(domain, [bucket.ids["good"]]))[0]
            assert isinstance(found, Dataset) is ok, found
            if not ok:
                with pytest.raises(Corrupt, match=f"more than max_metadata \\({limit} bytes"):
                    await catalog.get_object(domain, bucket.ids["good"])

    trio.run(main)


@pytest.mark.slow
def test_a_big_group_parses_in_proportion(tmp_path: Path) -> None:
    """30,000 links: memory grows with the links (about 1.6 KB each, the JSON
    document included), not faster; the million-link group above is refused
    by the default max_metadata instead."""
    links = 30_000
    root = objid.createObjId("groups")
    target = objid.createObjId("datasets", root_id=root)
    body = b",".join(b'"%d": {"class": "H5L_TYPE_HARD", "id": "%s"}' % (i, target.encode())
                     for i in range(links))
    BucketWriter(tmp_path).put(objid.getS3Key(root), b'{"links": {%s}}' % body)
    catalog = HsdsCatalog(LocalStore(tmp_path))

    async def main() -> Group:
        found = await catalog.get_object(Domain(path="", root_id=root), root)
        assert isinstance(found, Group)
        return found

    started = time.monotonic()
    group, peak = peak_memory(lambda: trio.run(main))
    assert len(group.links) == links and group.links[str(links - 1)].target == target
    assert time.monotonic() - started < 60
    assert peak < 2500 * links, peak


# --------------------------------------------------------------------------- store reads


class FetchOnlyStore:
    """A store with only the calls of the protocol ``fetch_capped`` uses (no batch read)."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner = inner
        self.reads: list[ByteRange | None] = []

    @property
    def url(self) -> str:
        return self.inner.url

    async def fetch(self, key: str, byte_range: ByteRange | None = None) -> Fetched:
        self.reads.append(byte_range)
        return await self.inner.fetch(key, byte_range)

    async def get(self, key: str, byte_range: ByteRange | None = None) -> bytes:
        self.reads.append(byte_range)
        return await self.inner.get(key, byte_range)


def test_capped_reads_on_every_store(tmp_path: Path) -> None:
    sizes = {"empty": 0, "small": 100, "block": CAPPED_FIRST_READ,
             "mid": CAPPED_FIRST_READ + 5, "big": 3 * CAPPED_FIRST_READ}
    data = {name: os.urandom(size) for name, size in sizes.items()}
    for name, raw in data.items():
        (tmp_path / name).write_bytes(raw)
    sparse(tmp_path / "sparse", b"{", GIB)
    limit = 2 * CAPPED_FIRST_READ

    async def main() -> None:
        local = LocalStore(tmp_path)
        cache = BlockCache(64 << 20, validate_ttl=60)
        fetch_only = FetchOnlyStore(local)
        stores: list[Any] = [local, CachedStore(local, cache), fetch_only]
        for store in stores:
            for name, raw in data.items():
                if len(raw) <= limit:
                    assert (await fetch_capped(store, name, limit)).data == raw
                else:
                    with pytest.raises(Corrupt, match="max_metadata"):
                        await fetch_capped(store, name, limit)
            with pytest.raises(Corrupt, match=f"{GIB} bytes"):
                await fetch_capped(store, "sparse", limit)
            assert (await fetch_capped(store, "small", 100)).data == data["small"]
            with pytest.raises(Corrupt):
                await fetch_capped(store, "small", 99)
            names = [*data, "sparse", "missing"]
            found = await (fetch_each(store, names, limit) if store is fetch_only
                           else store.fetch_many(names, limit))
            for name, got in zip(names, found, strict=True):
                raw = data.get(name)
                if raw is not None and len(raw) <= limit:
                    assert isinstance(got, Fetched) and got.data == raw, name
                    assert got.info.size == len(raw), name
                else:
                    assert isinstance(got, MountError), name
        # a small object is one read of CAPPED_FIRST_READ; only a full one costs more
        fetch_only.reads.clear()
        await fetch_capped(fetch_only, "small", limit)
        assert fetch_only.reads == [ByteRange(0, CAPPED_FIRST_READ)]
        # through the block cache, the sparse file cost one block, and no HEAD request
        requests, heads = cache.stats.requests, cache.stats.heads
        fresh = CachedStore(local, BlockCache(64 << 20, validate_ttl=60))
        with pytest.raises(Corrupt):
            await fetch_capped(fresh, "sparse", limit)
        assert (fresh.cache.stats.requests, fresh.cache.stats.heads) == (1, 0)
        assert fresh.cache.stats.bytes_fetched == CAPPED_FIRST_READ
        assert requests and heads == 0

    trio.run(main)


def test_local_store_reads_only_regular_files(tmp_path: Path) -> None:
    """A FIFO would block the open, a device never end: both are refused at once.
    The device is reached by a symlink, so only a store that follows symlinks
    (a reference file's local refs) gets as far as the device; a bucket's store
    refuses the link itself (``tests/test_bucket_symlinks.py``)."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_bytes(b"12345")

    async def main() -> None:
        store = LocalStore(tmp_path, follow_symlinks=True)
        with trio.fail_after(10):
            for key in ("fifo", "zero"):
                for read in (store.get, store.fetch, lambda k: fetch_capped(store, k, 100)):
                    with pytest.raises(StorageError, match="not a regular file"):
                        await read(key)
            with pytest.raises(StorageError, match="symbolic link, not followed"):
                await LocalStore(tmp_path).get("zero")
            found = await store.fetch_many(["fifo", "zero", "dir", "file"], 100)
            assert [type(f) for f in found[:3]] == [StorageError, StorageError, NotFound]
            last = found[3]
            assert isinstance(last, Fetched)
            assert last.data == b"12345" == await store.get("file", ByteRange(0, 1 << 40))
            assert await store.get("file", ByteRange(3, 1 << 40)) == b"45"
            assert await store.get("file", ByteRange(9, 2)) == b""

    trio.run(main)


@pytest.mark.parametrize(("text", "value"), [("64M", 64 << 20), ("1k", 1024), ("2G", 2 << 30),
                                             ("100", 100)])
def test_max_metadata_option(text: str, value: int) -> None:
    config = MountConfig(source="s", mountpoint="m")
    assert config.max_metadata == DEFAULT_MAX_METADATA == 64 << 20
    apply_options(config, [f"ro,max_metadata={text}"])
    assert config.max_metadata == value


@pytest.mark.parametrize("text", ["max_metadata", "max_metadata=", "max_metadata=0",
                                  "max_metadata=lots", "max_metadata=-1"])
def test_bad_max_metadata_option(text: str) -> None:
    with pytest.raises(OptionError, match="max_metadata"):
        apply_options(MountConfig(source="s", mountpoint="m"), [text])


# --------------------------------------------------------------------------- the LINDI file


def zarray(shape: Any = (4,), chunks: Any = (4,), dtype: Any = "<i4") -> dict[str, Any]:
    return {"zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": dtype,
            "compressor": None, "filters": None, "fill_value": 0, "order": "C"}


LINDI_BAD = {
    "bad_rank": zarray([1] * 33, [1] * 33),
    "bad_rank_huge": zarray([1] * 100_000, [1] * 100_000),
    "bad_overflow": zarray([2**62, 2**62], [1, 1]),
    "bad_bytes": zarray([2**31, 2**31], [1, 1]),
    "bad_negative": zarray([-1], [1]),
    "bad_zero_chunk": zarray([4], [0]),
    "bad_mismatch": zarray([4, 4], [4]),
    "bad_itemsize": zarray(dtype="|S2000000000"),
    "bad_field_shape": zarray(dtype=[["a", "<i4", [5, "x"]]]),
}


def write_lindi_file(base: Path) -> Path:
    """A hostile ``.lindi.json``: good datasets beside every broken form."""
    huge = sparse(base / "huge.json", b'{"', GIB)
    good_chunk = "base64:" + base64.b64encode(GOOD.tobytes()).decode()
    refs: dict[str, Any] = {".zgroup": {"zarr_format": 2}, ".zattrs": {}}
    for name in ("good", *SHOWN, *LEFT_OUT[1:]):
        prefix = "a//b" if name == "" else name
        refs[f"{prefix}/.zarray"] = zarray()
        refs[f"{prefix}/0"] = good_chunk
    for name, doc in LINDI_BAD.items():
        refs[f"{name}/.zarray"] = doc
        refs[f"{name}/0"] = good_chunk
    extra = {"bad_deep_zarray": {"zarr_format": 2, "x": "@DEEP@"},
             "bad_deep_string": "@DEEPER@", "bad_surrogate_attr": {"a": "\ud800"},
             "bad_huge_attrs": [str(huge), 0, GIB], "bad_whole_attrs": [str(huge)]}
    for name, attrs in extra.items():
        key = ".zarray" if name == "bad_deep_zarray" else ".zattrs"
        refs[f"{name}/{key}"] = attrs
        if key == ".zattrs":
            refs[f"{name}/.zarray"] = zarray()
    refs["deep/" + "d/" * 300 + ".zgroup"] = {"zarr_format": 2}
    text = json.dumps({"version": 1, "refs": refs})
    text = text.replace('"@DEEP@"', nested(DEEP)).replace('"@DEEPER@"',
                                                          json.dumps(nested(DEEPER)))
    path = base / "hostile.lindi.json"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def lindi_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lindi_file(tmp_path_factory.mktemp("hostile-lindi"))


def local_open(uri: str) -> tuple[Store, str]:
    return LocalStore("/"), uri.lstrip("/")


@pytest.mark.slow
def test_lindi_catalog_refuses_each_bad_object_alone(lindi_file: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    why = {"bad_rank": "more than 32", "bad_rank_huge": "more than 32",
           "bad_overflow": "too many elements", "bad_bytes": "too large",
           "bad_negative": "bad shape", "bad_zero_chunk": "bad chunks",
           "bad_mismatch": "do not fit", "bad_itemsize": "bytes",
           "bad_field_shape": "field shape", "bad_deep_zarray": "nested more than",
           "bad_deep_string": "not valid JSON", "bad_surrogate_attr": "Unicode",
           "bad_huge_attrs": "max_metadata", "bad_whole_attrs": "max_metadata"}

    async def main() -> None:
        table = await load_reference(str(lindi_file), local_open, is_dir=False)
        catalog = RefCatalog(table, local_open)
        domain = await catalog.domain("")
        assert domain is not None
        root = await catalog.get_object(domain, "/")
        assert isinstance(root, Group)
        assert {"good", *SHOWN, *why, "deep", "a"} <= set(root.links)
        assert "\ud800" not in root.links
        inner = await catalog.get_object(domain, "/a")
        assert isinstance(inner, Group) and not inner.links  # "a//b": the "" child is left out
        for name in ("good", *SHOWN):
            found = await catalog.get_object(domain, "/" + name)
            assert isinstance(found, Dataset), name
            assert await found.read_chunk((0,)) == GOOD.tobytes()
        for name, reason in why.items():
            with pytest.raises(Corrupt) as info:
                await catalog.get_object(domain, "/" + name)
            assert info.value.key.startswith(name + "/") and reason in info.value.reason, \
                (name, info.value)

    with caplog.at_level(logging.ERROR):
        _, peak = peak_memory(lambda: trio.run(main))
    assert peak < 64 << 20  # the 1 GiB .zattrs refs were not read
    logged = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(logged) == 2 and any("/a are left out" in m for m in logged), logged


def test_key_index_of_deep_keys_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Implicit groups nested thousands deep: no recursion, and their paths stop
    at ``MAX_IMPLICIT_BYTES`` (here 16 MiB) instead of growing with depth squared."""
    budget = 16 << 20
    monkeypatch.setattr(lindi, "MAX_IMPLICIT_BYTES", budget)
    index = KeyIndex(["x/" * 3000 + ".zarray", "y/" * 20_000 + ".zarray", "ok/.zgroup",
                      "ok/y/" + "0/" * 5000 + "0"])
    assert index.cut == 1  # the y chain, past the budget
    assert "x" in index.implicit and "x/" * 2998 + "x" in index.implicit
    assert "y" not in index.implicit and sum(len(p) for p in index.implicit) <= budget
    assert index.children[""] == ["x", "ok"] and "ok" in index.groups
    assert "ok/y" not in index.chunks


def test_oversized_reference_files_are_refused(tmp_path: Path) -> None:
    files = {"big.json": sparse(tmp_path / "big.json", b'{"refs": {', MAX_JSON_BYTES + 1)}
    sparse(tmp_path / "big.lindi.d" / "lindi.json", b'{"refs": {', MAX_JSON_BYTES + 1)
    files["big.lindi.d"] = tmp_path / "big.lindi.d"
    (tmp_path / "deep.json").write_text('{"refs": ' + nested(DEEPER) + "}")
    (tmp_path / "latin1.json").write_bytes(b'{"refs": {"\xe9/.zgroup": {}}}')
    files["deep.json"], files["latin1.json"] = tmp_path / "deep.json", tmp_path / "latin1.json"
    expected = {"big.json": "more than the", "big.lindi.d": "more than the",
                "deep.json": "invalid JSON", "latin1.json": "invalid JSON"}

    async def main() -> None:
        for name, path in files.items():
            with pytest.raises(RefFormatError, match=expected[name]):
                await load_reference(str(path), local_open, is_dir=path.is_dir())

    _, peak = peak_memory(lambda: trio.run(main))
    assert peak < SMALL_PEAK


# --------------------------------------------------------------------------- real mounts

needs_fuse = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))


@pytest.fixture(scope="module")
def hsds_mount(bucket: HostileBucket,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("hostile-mount")
    log = base / "h5mount.log"
    with mounted(bucket.bucket_dir, base / "mp", "--log-file", str(log)) as mp:
        yield mp, log


@needs_fuse
@pytest.mark.mount
def test_mount_shows_good_objects_and_eio_for_each_bad_one(
        bucket: HostileBucket, hsds_mount: tuple[Path, Path]) -> None:
    mp, log = hsds_mount
    for path in BAD_DOMAINS:  # looked up before their folder is listed: see below
        eio(lambda path=path: os.listdir(mp / path))
        eio(lambda path=path: os.stat(mp / path))
    assert {"hostile.h5", "deep_domain.h5", "huge_domain.h5"} <= set(os.listdir(mp / "home"))
    root = mp / HSDS_DOMAIN
    names = set(os.listdir(root))
    assert {"good", "good.json", "good.npy", *SHOWN.values()} <= names
    assert not {"a", "", "deep_link", "soft_surrogate"} & names
    assert np.array_equal(np.load(root / "good.npy"), GOOD)
    for shown in SHOWN.values():
        assert (root / shown / "0").read_bytes() == GOOD.tobytes()
    sidecar = json.loads((mp / f"{HSDS_DOMAIN}.json").read_text())
    assert sidecar["kind"] == "group"
    for name in [*BAD_DATASETS, *RAW_DATASETS, "huge_dataset"]:
        assert name in names
        eio(lambda name=name: (root / f"{name}.json").read_bytes())
        eio(lambda name=name: os.listdir(root / name))
    for name in ("huge_group", "million", "attr_name"):
        eio(lambda name=name: os.listdir(root / name))
    assert os.listdir(root / "odd_times") == [".zattrs", ".zgroup"]
    os.stat(root / "odd_times")
    assert np.array_equal(np.load(root / "good.npy"), GOOD)  # still served
    pids = daemon_pids(mp)
    assert pids, "the daemon must keep running"
    assert vm_hwm(pids[0]) < DAEMON_PEAK
    text = log.read_text()
    for name in (*BAD_DATASETS, *RAW_DATASETS, *HUGE, "million", "attr_name"):
        assert text.count(bucket.key(name)) == 1, (name, text[-2000:])
    assert text.count("of the links of") == 1


@needs_fuse
@pytest.mark.mount
def test_mount_bad_domain_met_in_a_listing_gives_eio(hsds_mount: tuple[Path, Path]) -> None:
    mp, _ = hsds_mount
    assert set(BAD_DOMAINS) <= {f"home/{name}" for name in os.listdir(mp / "home")}
    for path in BAD_DOMAINS:
        eio(lambda path=path: os.listdir(mp / path))


@needs_fuse
@pytest.mark.mount
def test_mount_hard_link_cycles_end(hsds_mount: tuple[Path, Path]) -> None:
    mp, _ = hsds_mount
    cycle = mp / HSDS_DOMAIN / "cycle"
    assert os.path.islink(cycle / "self") and os.path.islink(cycle / "up")
    assert os.path.islink(cycle / "down" / "back") and os.path.islink(cycle / "down" / "top")
    assert os.path.realpath(cycle / "down" / "back") == str(cycle)
    walked = [top for top, _, _ in os.walk(cycle)]
    assert len(walked) < 20, walked
    assert (cycle / "good" / "0").read_bytes() == GOOD.tobytes()


@needs_fuse
@pytest.mark.mount
def test_mount_of_hostile_lindi_file(lindi_file: Path, tmp_path: Path) -> None:
    log = tmp_path / "h5mount.log"
    with mounted(lindi_file, tmp_path / "mp", "--log-file", str(log)) as mp:
        names = set(os.listdir(mp))
        assert {"good", "good.npy", *SHOWN.values(), "a"} <= names
        assert os.listdir(mp / "a") == [".zattrs", ".zgroup"]
        for shown in ("good", *SHOWN.values()):
            assert (mp / shown / "0").read_bytes() == GOOD.tobytes()
        for name in (*LINDI_BAD, "bad_deep_zarray", "bad_deep_string", "bad_surrogate_attr",
                     "bad_huge_attrs", "bad_whole_attrs"):
            eio(lambda name=name: (mp / f"{name}.json").read_bytes())
        assert np.array_equal(np.load(mp / "good.npy"), GOOD)
        pids = daemon_pids(mp)
        assert pids and vm_hwm(pids[0]) < DAEMON_PEAK
    assert "max_metadata" in log.read_text()


@needs_fuse
@pytest.mark.mount
def test_oversized_reference_file_mount_is_refused(tmp_path: Path) -> None:
    source = sparse(tmp_path / "big.json", b'{"refs": {', MAX_JSON_BYTES + 1)
    mp = tmp_path / "mp"
    mp.mkdir()
    started = time.monotonic()
    out = run_h5mount(str(source), str(mp), "-o", "max_metadata=1M")
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "more than the" in out.stderr, out.stderr
    assert time.monotonic() - started < 30
    assert not daemon_pids(mp)


@pytest.mark.slow
def test_help_names_max_metadata() -> None:
    out = run_h5mount("--help")
    assert out.returncode == 0 and "max_metadata=SIZE" in out.stdout
