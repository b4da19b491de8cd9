"""Unit tests of the format-free tree over model objects, without a mount."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import io
import json
import math
import tracemalloc
from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest
import trio
import trio.testing

from layouts.model import (
    AnyObject,
    Attribute,
    Dataset,
    Domain,
    Group,
    Link,
    LinkKind,
    ObjectKind,
    ObjectRef,
    no_version,
    read_each,
    same_description,
)
from layouts.views import _npy as npy
from layouts.views._npy import NpyReader, NpyView, flat_boxes
from mountd.cache.chunkahead import GridReadahead, ravel, unravel
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.memo import ENTRY_OVERHEAD
from mountd.cache.metacache import CachedCatalog
from mountd.errors import MountError, NotFound, StorageError
from mountd.tree import Tree, groups, h5view, make_tree, meta
from mountd.tree.datasets import DatasetDir
from mountd.tree.groups import GroupDir
from mountd.tree.names import display_name, escape, unescape
from mountd.tree.nodes import (
    STREAM_BATCH,
    STREAM_WINDOW,
    DirNode,
    FileNode,
    FlatRows,
    Node,
    Row,
    SmallOrStreamListing,
    Stat,
    StreamListing,
    SymlinkNode,
)
from mountd.tree.paths import ObjPath
from mountd.tree.viewnodes import ViewHandle
from tests.modelcat import MemoryCatalog, dataset, float_type, group


def hard(obj_id: str) -> Link:
    kind = {"g": ObjectKind.GROUP, "d": ObjectKind.DATASET}[obj_id[0]]
    return Link(LinkKind.HARD, obj_id, target_kind=kind)


DATA = np.arange(35 * 18, dtype="<f4").reshape(35, 18)


def make_catalog(single: str | None = None) -> MemoryCatalog:
    objects = {
        "g-root": group(
            "g-root",
            g1=hard("g-1"),
            x=hard("d-x"),
            **{"x.json": hard("g-xj")},
            soft=Link(LinkKind.SOFT, "/g1/dset"),
            rel=Link(LinkKind.SOFT, "g1/dset"),
            dangling=Link(LinkKind.SOFT, "/nowhere"),
            ext=Link(LinkKind.EXTERNAL, "/a", domain="/home/u/other.h5"),
            extmissing=Link(LinkKind.EXTERNAL, "/a", domain="/home/u/missing.h5"),
            **{"50%": hard("g-pct"), ".": hard("g-dot"), "a" * 300: hard("g-long")},
        ),
        "g-1": group(
            "g-1",
            dset=hard("d-1"),
            up=hard("g-root"),
            lost=hard("g-lost"),
            me=hard("g-1"),
            back=Link(LinkKind.SOFT, "../x"),
        ),
        "d-1": dataset("d-1", DATA, (10, 8), stored=[(0, 0), (3, 2), (1, 1)], fill=-1.0),
        "d-x": dataset("d-x", DATA[:4, :4], (4, 4)),
        "g-xj": group("g-xj"),
        "g-pct": group("g-pct"),
        "g-dot": group("g-dot"),
        "g-long": group("g-long"),
        "g-oroot": group("g-oroot", a=hard("g-oa")),
        "g-oa": group("g-oa"),
    }
    object.__setattr__(
        objects["d-1"],
        "attrs",
        (
            Attribute("units", "mm"),
            Attribute("scale", float("nan")),
            Attribute("ref", ObjectRef(obj_id="d-x")),
            Attribute("blob", b"\x00\x01"),
        ),
    )
    info = {"owner": "admin", "acls": {}, "created": 1.0, "lastModified": 2.0}
    domains = {
        "home/u/f.h5": Domain("home/u/f.h5", "g-root", 2.0, info),
        "home/u/other.h5": Domain("home/u/other.h5", "g-oroot", 2.0, info),
        "home/u": Domain("home/u", None, 2.0),
    }
    folders = {"": ["home"], "home": ["u"], "home/u": ["f.h5", "other.h5"]}
    return MemoryCatalog(domains, objects, folders, single_domain=single)


async def names(node: Node) -> list[str]:
    assert isinstance(node, DirNode)
    return [name async for _, name, _, _ in node.open_listing().entries(0)]


async def walk(tree: Tree, path: str) -> Node:
    node: Node = await tree.root()
    for part in filter(None, path.split("/")):
        assert isinstance(node, DirNode)
        node = await node.lookup(part)
    return node


async def read_all(node: Node) -> bytes:
    assert isinstance(node, FileNode)
    handle = await node.open()
    return bytes(await handle.read(0, 1 << 30))


async def link_text(tree: Tree, path: str) -> str:
    node = await walk(tree, path)
    assert isinstance(node, SymlinkNode)
    return await node.target()


def test_escape_rules() -> None:
    assert escape(".") == "%2E"
    assert escape("..") == "%2E%2E"
    assert escape("a%b") == "a%25b"
    assert escape("a\0b") == "a%00b"
    long = "é" * 200  # 400 bytes
    shown = display_name(long)
    digest = hashlib.sha1(long.encode()).hexdigest()[:14]
    assert shown.endswith("~" + digest)
    assert len(shown.encode()) <= 255
    assert display_name("b" * 300) == "b" * 240 + "~" + hashlib.sha1(b"b" * 300).hexdigest()[:14]


def test_folders_domains_and_root_sidecar() -> None:
    async def main() -> None:
        tree = make_tree(make_catalog())
        assert await names(await tree.root()) == ["home"]
        assert await names(await walk(tree, "home/u")) == [
            "f.h5",
            "f.h5.json",
            "other.h5",
            "other.h5.json",
        ]
        doc = json.loads(await read_all(await walk(tree, "home/u/f.h5.json")))
        assert doc["kind"] == "group" and doc["path"] == "/" and doc["id"] == "g-root"
        assert doc["domain"]["owner"] == "admin"

    trio.run(main)


def test_group_listing_escapes_and_collisions() -> None:
    async def main() -> None:
        tree = make_tree(make_catalog())
        listing = await names(await walk(tree, "home/u/f.h5"))
        long_name = display_name("a" * 300)
        assert "%2E" in listing and "50%25" in listing and long_name in listing
        # the real link "x.json" wins over x's generated sidecar
        assert listing.count("x.json") == 1
        assert "x.json.json" in listing
        node = await walk(tree, "home/u/f.h5/x.json")
        assert isinstance(node, DirNode)
        # dangling soft links get no sidecar symlink
        assert "dangling" in listing and "dangling.json" not in listing
        with pytest.raises(NotFound):
            await walk(tree, "home/u/f.h5/dangling.json")

    trio.run(main)


def test_links_become_relative_symlinks() -> None:
    async def main() -> None:
        tree = make_tree(make_catalog())
        assert await link_text(tree, "home/u/f.h5/soft") == "g1/dset"
        assert await link_text(tree, "home/u/f.h5/soft.json") == "g1/dset.json"
        assert await link_text(tree, "home/u/f.h5/rel") == "g1/dset"
        assert await link_text(tree, "home/u/f.h5/g1/back") == "../x"
        assert await link_text(tree, "home/u/f.h5/dangling") == "nowhere"
        assert await link_text(tree, "home/u/f.h5/ext") == "../other.h5/a"
        assert await link_text(tree, "home/u/f.h5/extmissing") == "home/u/missing.h5::/a"
        # hard links back to an ancestor become symlinks instead of cycles
        assert await link_text(tree, "home/u/f.h5/g1/up") == ".."
        assert await link_text(tree, "home/u/f.h5/g1/me") == "."
        assert await link_text(tree, "home/u/f.h5/g1/up.json") == "../../f.h5.json"

    trio.run(main)


def test_dataset_chunks_and_sidecar() -> None:
    async def main() -> None:
        tree = make_tree(make_catalog())
        listing = await names(await walk(tree, "home/u/f.h5/g1/dset"))
        assert listing == [".zarray", ".zattrs", "0.0", "1.1", "3.2"]
        with pytest.raises(NotFound):
            await walk(tree, "home/u/f.h5/g1/dset/0.1")  # in range, not stored
        with pytest.raises(NotFound):
            await walk(tree, "home/u/f.h5/g1/dset/9.9")  # out of range
        with pytest.raises(NotFound):
            await walk(tree, "home/u/f.h5/g1/dset/01.1")  # not a canonical name
        chunk = np.frombuffer(
            await read_all(await walk(tree, "home/u/f.h5/g1/dset/3.2")), dtype="<f4"
        ).reshape(10, 8)
        expected = np.full((10, 8), -1.0, dtype="<f4")
        expected[:5, :2] = DATA[30:35, 16:18]
        np.testing.assert_array_equal(chunk, expected)
        doc = json.loads(await read_all(await walk(tree, "home/u/f.h5/g1/dset.json")))
        assert doc["shape"] == [35, 18] and doc["chunks"] == [10, 8]
        assert doc["dtype"] == "<f4" and doc["fill_value"] == -1.0
        assert doc["attributes"] == {
            "units": "mm",
            "scale": "NaN",
            "ref": {"$ref": "/x"},
            "blob": {"base64": "AAE="},
        }
        xattrs = await (await walk(tree, "home/u/f.h5/g1/dset")).xattrs()
        assert xattrs["user.h5.attr.units"] == b"mm"
        assert xattrs["user.h5.attr.scale"] == b'"NaN"'
        assert xattrs["user.h5.shape"] == b"[35, 18]"
        assert xattrs["user.h5.kind"] == b"dataset"

    trio.run(main)


def test_link_to_missing_object_is_an_io_error() -> None:
    async def main() -> None:
        tree = make_tree(make_catalog())
        g1 = await walk(tree, "home/u/f.h5/g1")
        assert "lost" in await names(g1)  # listed, like any link
        lost = await walk(tree, "home/u/f.h5/g1/lost")
        with pytest.raises(StorageError):
            await lost.stat()
    trio.run(main)


def test_single_domain_root() -> None:
    async def main() -> None:
        tree = make_tree(make_catalog(single="home/u/f.h5"))
        listing = await names(await tree.root())
        assert listing[0] == ".root.json" and "g1" in listing
        doc = json.loads(await read_all(await walk(tree, ".root.json")))
        assert doc["path"] == "/"
        assert await link_text(tree, "g1/up.json") == "../.root.json"
        assert await link_text(tree, "ext") == "home/u/other.h5::/a"

    trio.run(main)


def expected_full(fill: float = -1.0) -> np.ndarray:
    """d-1 as a reader should see it: stored chunks hold DATA, the others the fill."""
    full = np.full(DATA.shape, fill, dtype="<f4")
    for i, j in [(0, 0), (3, 2), (1, 1)]:
        region = (slice(i * 10, (i + 1) * 10), slice(j * 8, (j + 1) * 8))
        full[region] = DATA[region]
    return full


def test_npy_view_reads_any_range() -> None:
    async def main() -> None:
        tree = make_tree(make_catalog(), views=[NpyView()])
        listing = await names(await walk(tree, "home/u/f.h5/g1"))
        assert "dset.npy" in listing
        assert await link_text(tree, "home/u/f.h5/soft.npy") == "g1/dset.npy"
        node = await walk(tree, "home/u/f.h5/g1/dset.npy")
        buf = io.BytesIO()
        np.save(buf, expected_full())
        want = buf.getvalue()
        assert (await node.stat()).size == len(want)
        assert isinstance(node, FileNode)
        handle = await node.open()
        assert await handle.read(0, len(want) + 100) == want
        rng = np.random.default_rng(7)
        for _ in range(200):
            off = int(rng.integers(0, len(want) + 10))
            size = int(rng.integers(1, 3000))
            assert await handle.read(off, size) == want[off:off + size], (off, size)
    trio.run(main)


def test_flat_boxes_cover_ranges_in_order() -> None:
    shape = (3, 4, 5)
    flat = np.arange(60).reshape(shape)
    rng = np.random.default_rng(3)
    for _ in range(300):
        lo, hi = sorted(int(x) for x in rng.integers(0, 61, size=2))
        got = [flat[tuple(slice(a, b) for a, b in zip(start, stop, strict=True))].ravel()
               for start, stop in flat_boxes(shape, lo, hi)]
        joined = np.concatenate(got) if got else np.array([], dtype=int)
        np.testing.assert_array_equal(joined, np.arange(lo, hi))
        assert len(got) <= 2 * len(shape) - 1


@pytest.mark.parametrize(("shape", "chunks", "band_row"), [
    ((37, 29), (8, 5), 256 << 10),      # rows gathered in bands, partial chunks at the edges
    ((300, 7, 9), (16, 3, 4), 256 << 10),  # 3-D: a row is a 7 x 9 plane
    ((40, 3000), (7, 512), 1024),       # rows wider than a band row: boxes instead
    ((64, 16), (64, 16), 256 << 10),    # one chunk
])
def test_npy_streaming_reads_match_np_save(shape: tuple[int, ...], chunks: tuple[int, ...],
                                           band_row: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequential reads of mixed sizes (as the kernel's readahead sends them,
    so the reader gathers and keeps bands of rows), with jumps back and ahead,
    return exactly the bytes ``np.save`` writes; some chunks are not stored."""
    monkeypatch.setattr(npy, "BAND_ROW_BYTES", band_row)
    monkeypatch.setattr(npy, "BAND_BYTES", 8 << 10)
    rng = np.random.default_rng(sum(shape))
    data = rng.standard_normal(shape).astype("<f4")
    grid = [-(-n // c) for n, c in zip(shape, chunks, strict=True)]
    stored = [index for index in np.ndindex(*grid) if rng.random() < 0.8]
    ds = dataset("d-s", data, chunks, stored=stored, fill=-3.0)
    want = data.copy()
    for index in np.ndindex(*grid):
        if index not in stored:
            want[tuple(slice(i * c, (i + 1) * c)
                       for i, c in zip(index, chunks, strict=True))] = -3.0
    buf = io.BytesIO()
    np.save(buf, want)
    expected = buf.getvalue()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            tree = make_tree(catalog_with(s=ds), views=[NpyView()],
                             chunk_cache=ChunkCache(64 << 20, nursery))
            node = await walk(tree, "s.npy")
            assert isinstance(node, FileNode)
            handle = await node.open()
            offset = 0
            for _ in range(300):
                if rng.random() < 0.05:  # a jump anywhere
                    offset = int(rng.integers(0, len(expected)))
                size = int(rng.choice([1, 7, 512, 4096, 5000, 20000]))
                got = await handle.read(offset, size)
                assert bytes(got) == expected[offset:offset + size], (offset, size)
                offset = offset + size if offset + size < len(expected) else 0
            nursery.cancel_scope.cancel()
    trio.run(main)


def test_zarr_metadata() -> None:
    async def main() -> None:
        tree = make_tree(make_catalog())
        zarray = json.loads(await read_all(await walk(tree, "home/u/f.h5/g1/dset/.zarray")))
        assert zarray == {"zarr_format": 2, "shape": [35, 18], "chunks": [10, 8],
                          "dtype": "<f4", "compressor": None, "fill_value": -1.0,
                          "order": "C", "filters": None, "dimension_separator": "."}
        zattrs = json.loads(await read_all(await walk(tree, "home/u/f.h5/g1/dset/.zattrs")))
        sidecar = json.loads(await read_all(await walk(tree, "home/u/f.h5/g1/dset.json")))
        assert zattrs == sidecar["attributes"]
        zgroup = json.loads(await read_all(await walk(tree, "home/u/f.h5/g1/.zgroup")))
        assert zgroup == {"zarr_format": 2}
    trio.run(main)


# --------------------------------------------------------------------------- big datasets


class GeneratedChunks:
    """A lazy ChunkStore in which every chunk of ``grid`` is stored.

    Nothing is held: the listing is a fixed permutation of the grid (a storage
    order, not grid order) computed as it goes, and a chunk's bytes are made
    when read (each element is the chunk's grid position, as float32). It
    counts listings, the listings open at once, and the reads in the order
    they start; ``delay`` makes reads slow.
    """

    STRIDE = 7919  # prime: a permutation of any grid whose size it does not divide

    def __init__(self, grid: tuple[int, ...], chunk_elements: int, delay: float = 0.0,
                 list_delay: float = 0.0) -> None:
        self.grid = grid
        self.total = math.prod(grid)
        self.chunk_elements = chunk_elements
        self.delay = delay
        self.list_delay = list_delay
        self.listings = 0
        self.open_listings = 0
        self.max_open = 0
        self.reads: list[tuple[int, ...]] = []

    def storage_order(self) -> list[tuple[int, ...]]:
        return [unravel(k * self.STRIDE % self.total, self.grid) for k in range(self.total)]

    async def read(self, index: tuple[int, ...]) -> bytes:
        self.reads.append(index)
        await trio.sleep(self.delay)
        return np.full(self.chunk_elements, ravel(index, self.grid), dtype="<f4").tobytes()

    async def read_many(self, indices: Sequence[tuple[int, ...]]
                        ) -> list[bytes | MountError | None]:
        return await read_each(self, indices)

    async def exists(self, index: tuple[int, ...]) -> bool:
        return True

    async def iter_stored(self) -> AsyncIterator[tuple[int, ...]]:
        self.listings += 1
        self.open_listings += 1
        self.max_open = max(self.max_open, self.open_listings)
        try:
            await trio.sleep(self.list_delay)  # a round trip to the store
            for k in range(self.total):
                if k % 512 == 0:
                    await trio.sleep(0)
                yield unravel(k * self.STRIDE % self.total, self.grid)
        finally:
            self.open_listings -= 1

    def listing_ready(self) -> bool:
        return False

    version = no_version


def generated_dataset(obj_id: str, grid: tuple[int, ...], chunks: tuple[int, ...],
                      delay: float = 0.0, list_delay: float = 0.0) -> Dataset:
    shape = tuple(g * c for g, c in zip(grid, chunks, strict=True))
    store = GeneratedChunks(grid, math.prod(chunks), delay, list_delay)
    return Dataset(id=obj_id, shape=shape, maxshape=shape, type=float_type(), chunks=chunks,
                   fill_value=np.float32(0), store=store)


def catalog_with(**datasets: Dataset) -> MemoryCatalog:
    objects: dict[str, AnyObject] = {ds.id: ds for ds in datasets.values()}
    objects["g-root"] = group("g-root", **{name: hard(ds.id) for name, ds in datasets.items()})
    domains = {"f.h5": Domain("f.h5", "g-root", 2.0)}
    return MemoryCatalog(domains, objects, {}, single_domain="f.h5")


async def kernel_readdir(listing: SmallOrStreamListing, start: int, rng: np.random.Generator,
                         buffer: int = 40) -> list[str]:
    """Read a streamed listing as the kernel does: fill a buffer, keep only part
    of it (the rest did not fit), and ask again from the last cookie it kept."""
    names: list[str] = []
    cookie = start
    while True:
        got: list[tuple[int, str]] = []
        async for next_id, name, _, _ in listing.entries(cookie):
            got.append((next_id, name))
            if len(got) == buffer:
                break
        if not got:
            return names
        keep = int(rng.integers(1, len(got) + 1))
        names.extend(name for _, name in got[:keep])
        cookie = got[keep - 1][0]
        assert listing.stream is not None and listing.stream.kept <= listing.stream.window


@pytest.mark.slow
def test_dataset_listing_streams_200k_chunks() -> None:
    async def main() -> None:
        ds = generated_dataset("d-big", (500, 400), (1, 1))
        store = ds.store
        assert isinstance(store, GeneratedChunks)
        tree = make_tree(catalog_with(big=ds))
        node = await walk(tree, "big")
        assert isinstance(node, DirNode)
        listing = node.open_listing()
        assert isinstance(listing, SmallOrStreamListing)
        expected = [".zarray", ".zattrs", *(".".join(map(str, i)) for i in store.storage_order())]
        names = await kernel_readdir(listing, 0, np.random.default_rng(1))
        stream = listing.stream
        assert isinstance(stream, StreamListing)
        # every name once, in storage order, from one pass over the store
        assert names == expected
        assert len(set(names)) == 200_002
        assert store.listings == 1 and stream.restarts == 0
        assert stream.kept <= stream.window == STREAM_WINDOW
        # a cookie older than the window restarts the stream and skips to it; the
        # whole listing was kept (compactly), so the restart needs no storage listing
        # and gives the same order
        names = await kernel_readdir(listing, 1000, np.random.default_rng(2))
        assert names == expected[1000:]
        assert stream.restarts == 1 and store.listings == 1 and store.max_open == 1
        # a recent cookie is served from the window, without a restart
        tail = [name async for _, name, _, _ in listing.entries(len(expected) - 10)]
        assert tail == expected[-10:] and stream.restarts == 1
        await listing.aclose()
        assert store.open_listings == 0
    trio.run(main)


def test_stream_window_holds_two_batches() -> None:
    """Batches of up to STREAM_BATCH rows must not push the reader's cookie out."""
    async def nothing() -> AsyncIterator[list[Row]]:
        return
        yield []

    with pytest.raises(ValueError):
        StreamListing(nothing, window=2 * STREAM_BATCH - 1)
    assert StreamListing(nothing, window=2 * STREAM_BATCH).window == 2 * STREAM_BATCH


class SparseChunks(GeneratedChunks):
    """Generated chunks of which only every third is stored; counts ``exists`` calls."""

    def __init__(self, grid: tuple[int, ...]) -> None:
        super().__init__(grid, 1, 0.0, 0.0)
        self.exists_calls = 0

    async def exists(self, index: tuple[int, ...]) -> bool:
        self.exists_calls += 1
        return ravel(index, self.grid) % 3 == 0

    async def iter_stored(self) -> AsyncIterator[tuple[int, ...]]:
        self.listings += 1
        for k in range(0, self.total, 3):
            yield unravel(k, self.grid)


def test_listed_chunks_are_kept_compactly_for_lookups() -> None:
    """Once a dataset of 30,000 chunks is listed, lookups and a second listing are
    answered from the kept list: no ``exists`` and no listing reach storage."""
    async def main() -> None:
        ds = generated_dataset("d-sparse", (300, 300), (1, 1))
        store = SparseChunks((300, 300))
        ds = dataclasses.replace(ds, store=store)
        tree = make_tree(catalog_with(big=ds))
        node = await walk(tree, "big")
        assert isinstance(node, DirNode)
        first = [n async for _, n, _, _ in node.open_listing().entries(0)]
        assert len(first) == 2 + 30_000 and store.listings == 1
        for name in ("0.0", "299.297"):
            await node.lookup(name)
        for name in ("0.1", "299.299", "300.0"):
            with pytest.raises(NotFound):
                await node.lookup(name)
        assert store.exists_calls == 0
        again = [n async for _, n, _, _ in node.open_listing().entries(0)]
        assert again == first and store.listings == 1
    trio.run(main)


class RecordingCache(ChunkCache):
    """The real chunk cache, recording the chunk index of every prefetch asked for."""

    def __init__(self, budget: int, nursery: trio.Nursery, prefetch_limit: int) -> None:
        super().__init__(budget, nursery, prefetch_limit)
        self.asked: list[tuple[int, ...]] = []

    def prefetch_many(self, keys, fetch, batch=1, unit=0) -> int:  # type: ignore[no-untyped-def]
        accepted = super().prefetch_many(keys, fetch, batch, unit)
        self.asked.extend(key[-1] for key in keys[:accepted])
        return accepted


async def read_chunk_file(tree: Tree, path: str) -> bytes:
    data = await read_all(await walk(tree, path))
    await trio.testing.wait_all_tasks_blocked()  # let the prefetches run
    return data


def test_chunk_files_read_in_grid_order_prefetch_ahead() -> None:
    async def main() -> None:
        # 64 chunks of 256 KiB: the first window (1 MiB) is 4 chunks
        ds = generated_dataset("d-row", (64,), (65536,))
        flat = generated_dataset("d-2d", (3, 4), (256, 256))
        async with trio.open_nursery() as nursery:
            cache = RecordingCache(64 << 20, nursery, prefetch_limit=1000)
            tree = make_tree(catalog_with(row=ds, grid=flat), chunk_cache=cache)
            asked = []
            for i in [0, 1, 2, 3, 4, 40, 41]:
                cache.asked.clear()
                data = await read_chunk_file(tree, f"row/{i}")
                assert np.frombuffer(data, "<f4")[0] == i
                asked.append([j for (j,) in cache.asked])
            assert asked == [
                [],  # a first read: not yet sequential
                [2, 3, 4, 5],  # 1 MiB ahead
                list(range(6, 11)),  # 2 MiB ahead of chunk 2: up to 10
                list(range(11, 20)),  # 4 MiB
                list(range(20, 37)),  # 8 MiB
                [],  # a jump: the window starts again
                [42, 43, 44, 45],
            ]
            store = ds.store
            assert isinstance(store, GeneratedChunks)
            assert sorted(store.reads) == [(i,) for i in [*range(37), 40, 41, 42, 43, 44, 45]]
            # a 2-D grid is read ahead in C order, across rows
            cache.asked.clear()
            await read_chunk_file(tree, "grid/0.0")
            await read_chunk_file(tree, "grid/0.1")
            assert cache.asked == [(0, 2), (0, 3), (1, 0), (1, 1)]
            nursery.cancel_scope.cancel()
    trio.run(main)


def test_grid_readahead_resumes_after_a_refusal() -> None:
    ds = generated_dataset("d-row", (64,), (65536,))
    ahead = GridReadahead(cap=16 << 20)
    accepted: list[int] = []
    room = [2]

    def start(indices: list[tuple[int, ...]]) -> int:
        took = indices[:room[0]]
        room[0] -= len(took)
        accepted.extend(index[0] for index in took)
        return len(took)

    assert ahead.on_read("k", ds, (0,), start) == 0
    assert ahead.on_read("k", ds, (1,), start) == 2  # wanted 2..5, room for two
    room[0] = 100
    assert ahead.on_read("k", ds, (2,), start) == 7  # asks again from 4, up to 10
    assert accepted == [2, 3, *range(4, 11)]
    assert ahead.window("k") == 2 << 20
    off = GridReadahead(cap=0)  # no chunk cache to read into: no readahead
    for i in range(5):
        assert off.on_read("k", ds, (i,), start) == 0


def test_npy_prefetches_window_ahead_in_grid_order() -> None:
    async def main() -> None:
        # 64 MiB of float32, chunks of 64 KiB (16 rows x 1024 columns), grid 256 x 4
        ds = generated_dataset("d-npy", (256, 4), (16, 1024))
        store = ds.store
        assert isinstance(store, GeneratedChunks)
        expected = np.repeat(np.arange(1024, dtype="<f4").reshape(256, 4), 16, axis=0)
        expected = np.repeat(expected, 1024, axis=1)
        async with trio.open_nursery() as nursery:
            cache = RecordingCache(256 << 20, nursery, prefetch_limit=10_000)
            tree = make_tree(catalog_with(npy=ds), views=[NpyView()], chunk_cache=cache)
            node = await walk(tree, "npy.npy")
            assert isinstance(node, FileNode)
            opened = await node.open()
            assert isinstance(opened, ViewHandle)
            handle = opened.reader
            assert isinstance(handle, NpyReader)
            hlen = len(handle.header)
            step = 128 << 10
            row = 16 * 4096 * 4  # bytes of one row of chunks
            leads: list[int] = []
            offset = 0
            for _ in range(5):  # windows: none, then 1, 2, 4 and 8 MiB
                cache.asked.clear()
                data = await handle.read(offset, step)
                await trio.testing.wait_all_tasks_blocked()
                got = np.frombuffer(data[max(0, hlen - offset):], "<f4")
                first = max(0, offset - hlen) // 4
                np.testing.assert_array_equal(got, expected.ravel()[first:first + got.size])
                offset += step
                assert cache.asked == sorted(cache.asked)  # grid order
                if cache.asked:
                    # how far past this read the last chunk row asked for ends
                    leads.append((max(i for i, _ in cache.asked) + 1) * row - offset)
            # each chunk was fetched once, whether prefetched or read
            assert len(store.reads) == len(set(store.reads))
            assert len(leads) == 4  # every read but the first asked for more
            assert 1 << 20 <= leads[0] <= (1 << 20) + row
            assert leads == sorted(leads) and leads[-1] >= 6 * leads[0]
            # a jump (farther than the 8 MiB window): nothing asked; then the
            # window starts small again
            cache.asked.clear()
            await handle.read(48 << 20, step)
            assert cache.asked == []
            await handle.read((48 << 20) + step, step)
            rows = sorted({i for i, _ in cache.asked})
            assert rows[0] * row <= (48 << 20) + 2 * step
            assert (rows[-1] + 1) * row <= (48 << 20) + 2 * step + (1 << 20) + row
            assert cache.asked == sorted(cache.asked)
            nursery.cancel_scope.cancel()
    trio.run(main)


def test_meta_files_render_once_per_object_instance() -> None:
    async def main() -> None:
        catalog = make_catalog()
        tree = make_tree(catalog)
        node = await walk(tree, "home/u/f.h5/g1/dset.json")
        size = (await node.stat()).size
        misses = tree.memo.misses
        assert len(await read_all(node)) == size
        await node.stat()
        assert tree.memo.misses == misses  # stat, open and stat again: one render
        # a refreshed object (a new instance from the catalog) renders again
        old = catalog.objects["d-1"]
        catalog.objects["d-1"] = dataclasses.replace(old, attrs=(Attribute("units", "m"),))
        doc = json.loads(await read_all(node))
        assert doc["attributes"] == {"units": "m"}
        assert (await node.stat()).size == len(await read_all(node)) != size
    trio.run(main)


def test_small_dataset_rows_are_kept_with_the_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset whose rows fit one batch is listed whole, with the Zarr files'
    exact sizes; listed again while the catalog hands out the same object, it
    renders nothing (the sizes are kept with the object); a Zarr file whose
    stat failed is left for readdir and nothing is kept."""
    async def rows(node: Node) -> list[tuple[str, Node, Stat | None]]:
        assert isinstance(node, DirNode)
        return [(name, child, st) async for _, name, child, st in node.open_listing().entries(0)]

    async def main() -> None:
        catalog = make_catalog()
        tree = make_tree(catalog)
        node = await walk(tree, "home/u/f.h5/g1/dset")
        await rows(node)  # from storage: the chunk list is learnt
        real = meta._render_zattrs

        async def broken(tree: Tree, op: ObjPath, obj: AnyObject) -> meta.Rendered:
            raise StorageError(op.h5path, "unreadable attributes")

        monkeypatch.setattr(meta, "_render_zattrs", broken)
        failed = await rows(node)
        assert [(name, st is None) for name, _, st in failed] == [
            (".zarray", False), (".zattrs", True), ("0.0", False), ("1.1", False),
            ("3.2", False)]
        monkeypatch.setattr(meta, "_render_zattrs", real)
        first = await rows(node)
        rendered: list[str] = []

        async def counted(tree: Tree, op: ObjPath, obj: AnyObject) -> meta.Rendered:
            rendered.append(op.h5path)
            return await real(tree, op, obj)

        monkeypatch.setattr(meta, "_render_zattrs", counted)
        again = await rows(node)
        assert rendered == []
        listing = node.open_listing()  # whole: no stream behind it
        assert isinstance(listing, SmallOrStreamListing)
        assert [name for name, _, _ in await listing.rows_after(2)] == ["0.0", "1.1", "3.2"]
        assert listing.stream is None
        assert [(name, child.key, st) for name, child, st in again] == \
            [(name, child.key, st) for name, child, st in first]
        monkeypatch.setattr(meta, "_render_zattrs", real)
        for name, child, st in first[:2]:
            assert st is not None and st.size == len(await read_all(child)), name
        # a refreshed object is listed afresh (its chunks from storage again,
        # then from the list learnt), with its new sizes
        old = catalog.objects["d-1"]
        catalog.objects["d-1"] = dataclasses.replace(old, attrs=(Attribute("units", "m"),))
        assert [name for name, _, _ in await rows(node)] == [name for name, _, _ in first]
        fresh = await rows(node)
        assert [name for name, _, _ in fresh] == [name for name, _, _ in first]
        zattrs = fresh[1]
        assert zattrs[2] is not None and zattrs[2] != first[1][2]
        assert zattrs[2].size == len(await read_all(zattrs[1]))
    trio.run(main)


def test_escape_is_inverted_for_lookups() -> None:
    names = ["a", "%", "%25", ".", "..", "%2E", "%2E%2E", "a%00b", "x\0y", "%%", "é%", "",
             "a.json", "b" * 300]
    for name in names:
        assert unescape(escape(name)) == name, name
    for shown in ("%2", "%zz", "a%0", ".", "..", "%2e", "a\0b", "%41"):
        assert unescape(shown) is None, shown


def claimed_names(links: Sequence[str], suffixes: Sequence[str]) -> dict[str, tuple[str, str]]:
    """The (link, suffix) of each name a group's links claim, by the mount's
    rule, built whole here as the oracle: a real link's name wins, then the
    first to claim it in sorted link order and suffix order."""
    names: dict[str, tuple[str, str]] = {}
    for name in sorted(links):
        for suffix in suffixes:
            names.setdefault(display_name(name, suffix), (name, suffix))
    for name in links:
        names[display_name(name)] = (name, "")
    return names


def test_group_lookups_find_what_the_listing_shows_without_an_index() -> None:
    """Every name a group's links claim is found by lookup as its link and
    suffix, among escaped, cut-and-hashed and colliding names (a real
    ``x.json`` wins over ``x``'s sidecar); the listing shows exactly those
    names, sorted, after the group's own files; and a lookup of 10,000 links
    neither builds nor keeps an index of the group (the memo sees only the
    long names' small map)."""
    tricky = ["a", "a.json", "a.npy.json", "%", ".", "..", "x\0y", "b.npy", "é" * 130,
              "é" * 130 + "x", "n" * 250, "n" * 250 + ".json", "q.zattrs", "a-b", "a.npy"]

    async def main() -> None:
        links = {name: hard("d-x") for name in tricky}
        links.update({f"d{i:05d}": hard("d-x") for i in range(10_000)})
        catalog = make_catalog()
        catalog.objects["g-root"] = group("g-root", **links)
        tree = make_tree(catalog, views=[NpyView()])
        root = await walk(tree, "home/u/f.h5")
        assert isinstance(root, GroupDir)
        grp = catalog.objects["g-root"]
        assert isinstance(grp, Group)
        want = claimed_names(list(links), [".json", ".npy"])
        for shown, found in want.items():
            assert root._find(grp, shown) == found, shown
        for absent in ("d99999", "d00001.csv", "%2", "a.jsonx", "é" * 130 + ".npy~0"):
            assert root._find(grp, absent) is None, absent
        assert await names(root) == [".zattrs", ".zgroup", *sorted(want)]
        await root.lookup("d00000")
        entries = len(tree.memo._items)
        for i in range(0, 10_000, 7):
            assert isinstance(await root.lookup(f"d{i:05d}.json"), FileNode)
        with pytest.raises(NotFound):
            await root.lookup("d99999")
        assert len(tree.memo._items) == entries
    trio.run(main)


def test_a_big_group_is_streamed_as_a_small_one_is_listed() -> None:
    """A group of more than ``STREAM_LINKS`` links is listed as a stream that
    keeps no more than its window, and gives the same entries with the same
    types and sizes as a whole listing of the same links (the times are each
    tree's start); a reader resuming from an old cookie gets the same tail.
    Once the stream ends its rows are memoised and the order of its child
    directories reaches the preloader, so listing it again is whole, with no
    stream, and gives the very same rows."""
    count = groups.STREAM_LINKS + 300
    links = {f"k{i:05d}": hard("d-x" if i % 3 else "g-xj") for i in range(count)}
    links["k00007.json"] = hard("g-pct")
    catalog = make_catalog()
    catalog.objects["g-root"] = group("g-root", **links)

    async def listed(stream_links: int, streamed: bool,
                     tree: Tree | None = None) -> tuple[list[tuple[str, Stat | None]], Tree]:
        tree = tree or make_tree(CachedCatalog(catalog, ttl=60), views=[NpyView()])
        root = await walk(tree, "home/u/f.h5")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(groups, "STREAM_LINKS", stream_links)
            listing = root.open_listing()
            rows = [(name, st) async for _, name, _, st in listing.entries(0)]
            assert isinstance(listing, SmallOrStreamListing)
            assert (listing.stream is not None) == streamed
            if listing.stream is not None:
                assert listing.stream.kept <= listing.stream.window
                tail = [name async for _, name, _, _ in listing.entries(len(rows) - 700)]
                assert tail == [name for name, _ in rows[-700:]]
                assert listing.stream.restarts == 1
        return rows, tree

    def shapes(rows: list[tuple[str, Stat | None]]) -> list[tuple[str, object]]:
        return [(name, st and (st.type, st.size, st.exact)) for name, st in rows]

    async def main() -> None:
        streamed, tree = await listed(groups.STREAM_LINKS, streamed=True)
        root = await walk(tree, "home/u/f.h5")
        order = tree.preload._dirs._groups[root.op.key].children
        assert [child.op.names[-1] for child in order] == sorted(links)
        again, _ = await listed(groups.STREAM_LINKS, streamed=False, tree=tree)
        assert again == streamed
        whole, _ = await listed(len(links), streamed=False)
        assert shapes(whole) == shapes(streamed)
        groups_at = {name for name, link in links.items() if link.target.startswith("g-")}
        want = [shown for shown, (name, suffix) in claimed_names(list(links), [".json", ".npy"])
                .items() if not (suffix == ".npy" and name in groups_at)]
        assert [name for name, _ in whole] == [".zattrs", ".zgroup", *sorted(want)]
        assert all(st is not None for _, st in whole)
    trio.run(main)


def test_walking_dataset_dirs_in_order_lists_them_ahead() -> None:
    """ls -R over 200 datasets whose chunk listing takes 50 ms each: the next
    ones are listed in the background, so the walk takes far less than 200
    listings one after another; every dataset is listed from storage once."""
    delay = 0.05
    datasets = {f"d{i:03d}": generated_dataset(f"d-{i}", (2, 3), (4, 4), list_delay=delay)
                for i in range(200)}

    async def walk_all(tree: Tree) -> list[str]:
        root = await tree.root()
        names = []
        async for _, name, node, _ in root.open_listing().entries(0):
            if isinstance(node, DirNode):
                async for _, chunk, _, _ in node.open_listing().entries(0):
                    names.append(f"{name}/{chunk}")
        return names

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            tree = make_tree(catalog_with(**datasets), chunk_cache=ChunkCache(1 << 20, nursery))
            started = trio.current_time()
            names = await walk_all(tree)
            elapsed = trio.current_time() - started
            assert len(names) == 200 * 8
            assert elapsed < 200 * delay / 10, elapsed
            assert all(ds.store.listings == 1 for ds in datasets.values())  # type: ignore[attr-defined]
            # listed again (a second ls -R): from memory, no storage round trip
            started = trio.current_time()
            assert await walk_all(tree) == names
            assert trio.current_time() == started
            nursery.cancel_scope.cancel()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class ListedChunks(GeneratedChunks):
    """Chunks whose listing is at hand (a domain listed whole): listing costs no round trip."""

    def listing_ready(self) -> bool:
        return True


def test_walking_dataset_dirs_in_order_makes_their_rows_ahead() -> None:
    """With every chunk listing at hand, what is left to do before a dataset's
    directory can be listed is making its rows (rendering its Zarr files for
    their sizes): a walker opening datasets in order finds the next ones made
    in the background, and the last ones are not made before the walk nears
    them."""
    datasets = {f"d{i:03d}": generated_dataset(f"d-{i}", (2,), (4,)) for i in range(40)}
    for ds in datasets.values():
        ds.store.__class__ = ListedChunks

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            tree = make_tree(CachedCatalog(catalog_with(**datasets), ttl=3600),
                             chunk_cache=ChunkCache(1 << 20, nursery))
            dirs = [node async for _, _, node, _ in (await tree.root()).open_listing().entries(0)
                    if isinstance(node, DatasetDir)]
            assert len(dirs) == 40
            assert not any(d.loaded() for d in dirs)
            async for _ in dirs[0].open_listing().entries(0):
                pass
            await trio.testing.wait_all_tasks_blocked()
            assert dirs[1].loaded() and dirs[2].loaded()
            assert not dirs[-1].loaded()
            # the rows made ahead are the rows the walker gets, and the memo
            # keeps them no longer once the walker has them
            key, ds = ("rows", dirs[1].op.key), await tree.dataset(dirs[1].op)
            made = tree.memo.get(key, ds, dirs[1].op.domain)
            kept = tree.memo.used
            listed = [row async for row in dirs[1].open_listing().entries(0)]
            assert [node for _, _, node, _ in listed] == [row.node for row in made]
            assert [name for _, name, _, _ in listed] == [".zarray", ".zattrs", "0", "1"]
            assert tree.memo.get(key, ds, dirs[1].op.domain) is None
            assert tree.memo.used < kept
            # listed again: the same names, made anew with no storage round trip
            again = [name async for _, name, _, _ in dirs[1].open_listing().entries(0)]
            assert again == [".zarray", ".zattrs", "0", "1"]
            nursery.cancel_scope.cancel()
    trio.run(main)


class SlowCatalog(MemoryCatalog):
    """Every object takes ``delay`` seconds to fetch (a round trip), counted."""

    def __init__(self, base: MemoryCatalog, delay: float) -> None:
        super().__init__(base.domains, base.objects, base.folders, base.single_domain)
        self.delay = delay
        self.fetches = 0

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        self.fetches += 1
        await trio.sleep(self.delay)
        return await super().get_object(domain, obj_id)


def test_walking_groups_in_order_loads_them_ahead() -> None:
    """ls -R over 60 groups of 5 datasets whose objects take 50 ms each to
    fetch: the next groups' objects are fetched in the background."""
    delay = 0.05
    base = catalog_with()
    groups = {}
    for g in range(60):
        links = {}
        for d in range(5):
            ds = generated_dataset(f"d-{g}-{d}", (1,), (4,))
            base.objects[ds.id] = ds
            links[f"d{d}"] = hard(ds.id)
        base.objects[f"g-{g}"] = group(f"g-{g}", **links)
        groups[f"g{g:02d}"] = hard(f"g-{g}")
    base.objects["g-root"] = group("g-root", **groups)

    async def main() -> None:
        slow = SlowCatalog(base, delay)
        async with trio.open_nursery() as nursery:
            tree = make_tree(CachedCatalog(slow, ttl=3600),
                             chunk_cache=ChunkCache(1 << 20, nursery))
            started = trio.current_time()
            count = 0
            async for _, _, node, _ in (await tree.root()).open_listing().entries(0):
                if isinstance(node, DirNode):
                    async for _, _, child, _ in node.open_listing().entries(0):
                        count += 1
                        await child.stat()
            elapsed = trio.current_time() - started
            # one after another: two round trips per group (itself, then its children)
            assert count == 60 * (5 * 2 + 2)
            assert elapsed < 60 * 2 * delay / 5, elapsed
            assert slow.fetches == 1 + 60 * 6  # each object fetched once
            nursery.cancel_scope.cancel()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_memo_charges_at_least_the_memory_it_keeps() -> None:
    """``-o meta_cache`` bounds what the memo keeps only if its charges are not
    below what its entries hold: after a walk of 2,000 datasets (rows, sizes
    and chunk lists kept), pushing every entry out frees no more traced memory
    than the memo had charged for them. The walk keeps every node it was given,
    as the inode table does while the kernel knows the entries: a row is
    charged beyond its node."""
    datasets = {f"d{i:04d}": generated_dataset(f"d-{i}", (1,), (4,)) for i in range(2000)}
    held: list[Node] = []

    async def walk(tree: Tree) -> None:
        async for _, _, node, _ in (await tree.root()).open_listing().entries(0):
            held.append(node)
            if isinstance(node, DirNode):
                async for _, _, child, st in node.open_listing().entries(0):
                    held.append(child)
                    if st is None:  # a streamed listing: the file's own stat
                        await child.stat()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            tree = make_tree(CachedCatalog(catalog_with(**datasets), ttl=3600),
                             chunk_cache=ChunkCache(1 << 20, nursery))
            await tree.root()
            tracemalloc.start()
            try:
                await walk(tree)
                assert len(held) > 5 * len(datasets)
                await trio.testing.wait_all_tasks_blocked()
                charged = tree.memo.used
                gc.collect()
                before = tracemalloc.get_traced_memory()[0]
                # One value charged the whole budget pushes every other out.
                tree.memo.put(("filler",), 0, tree.memo.budget - ENTRY_OVERHEAD)
                assert tree.memo.used == tree.memo.budget
                gc.collect()
                freed = before - tracemalloc.get_traced_memory()[0]
            finally:
                tracemalloc.stop()
            assert charged > 1000 * len(datasets)
            assert 0.5 * charged < freed <= charged
            nursery.cancel_scope.cancel()
    trio.run(main)


def test_flat_rows_read_as_the_rows_they_keep() -> None:
    """A group's rows kept flat give back the same rows, by slice and by index."""
    async def main() -> None:
        rows = [row async for row in _rows_of(await walk(make_tree(make_catalog()),
                                                         "home/u/f.h5"))]
        assert len(rows) > 3
        flat = FlatRows(rows)
        assert len(flat) == len(rows)
        assert flat[:] == rows and flat[1:3] == rows[1:3] and flat[5:2] == []
        assert flat[-1] == rows[-1] and flat[0] == rows[0]
        assert flat.nodes() == [row.node for row in rows]
        with pytest.raises(IndexError):
            flat[len(rows)]
    trio.run(main)


async def _rows_of(node: Node) -> AsyncIterator[Row]:
    assert isinstance(node, DirNode)
    async for _, name, child, st in node.open_listing().entries(0):
        yield Row(name, child, st)


def test_objects_described_alike_are_the_same_but_for_a_new_chunk_store() -> None:
    data = np.arange(6, dtype="<f4")
    first, again = dataset("d-1", data, (3,)), dataset("d-1", data, (3,))
    assert first.store is not again.store and first != again  # a catalog's new build
    assert same_description(first, again)
    assert not same_description(first, dataset("d-1", data, (2,)))
    assert not same_description(first, dataclasses.replace(first, modified=1.0))
    named = dataclasses.replace(first, attrs=(Attribute("a", [1, 2]),))
    assert same_description(named, dataclasses.replace(again, attrs=(Attribute("a", [1, 2]),)))
    assert not same_description(named, first)
    array = dataclasses.replace(first, attrs=(Attribute("a", np.arange(3)),))
    assert not same_description(  # an array attribute does not compare: count it changed
        array, dataclasses.replace(again, attrs=(Attribute("a", np.arange(3)),)))
    assert same_description(dataset("d-1", data, (3,), fill=math.nan),
                            dataset("d-1", data, (3,), fill=math.nan))
    assert not same_description(group("g-1"), first)
    assert same_description(group("g-1", x=Link(LinkKind.SOFT, "/y")),
                            group("g-1", x=Link(LinkKind.SOFT, "/y")))


class _NoRoom:
    """A memory limit with no room left: the fault a planner must stop at."""

    limit = 1 << 20

    def room(self, *, trim: bool = False) -> int:
        return -1


def test_a_view_out_of_memory_loads_a_wide_group_no_further_than_it_plans() -> None:
    links = 3 * h5view.LOAD_WINDOW
    objects: dict[str, AnyObject] = {f"g-{i}": group(f"g-{i}") for i in range(links)}
    objects["g-root"] = group("g-root", **{f"n{i:05d}": hard(f"g-{i}") for i in range(links)})
    domain = Domain("wide.h5", "g-root", 2.0)
    loaded: list[str] = []

    class Counting(MemoryCatalog):
        async def get_objects(self, domain: Domain,
                              obj_ids: Sequence[str]) -> list[AnyObject | MountError]:
            loaded.extend(obj_ids)
            return await super().get_objects(domain, obj_ids)

    async def main() -> None:
        views = h5view.H5Views()
        inner = Counting({"wide.h5": domain}, objects, {})
        catalog = CachedCatalog(inner, ttl=60.0)
        tree = make_tree(catalog, h5views=views)
        whole = await views.size(tree, domain)
        assert views.plans == 1 and len(loaded) >= links
        # The root changes in storage; the memory limit has no room left.
        inner.objects["g-root"] = dataclasses.replace(objects["g-root"],
                                                      attrs=(Attribute("v", 2),))
        catalog.drop()
        views.memory = _NoRoom()  # type: ignore[assignment]
        loaded.clear()
        cut = await views.size(tree, domain)
        assert views.plans == 2 and views.renewed == 0 and cut < whole
        # Full at its first ask for room (ROOM_EVERY objects), inside the first
        # window: no other window of the group is loaded.
        assert len(loaded) <= h5view.LOAD_WINDOW + 1

    trio.run(main)
