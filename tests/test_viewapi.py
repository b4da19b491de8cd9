"""The view API (``layouts.views._api``) through a real ``Tree``, without FUSE.

Toy conventions, written as a convention module would be (they see only
the ``ViewContext``), are registered with a tree over an in-memory catalog:

* ``LinesView``: ``P.txt`` for a group with a 1-D ``values`` child (its
  ``applies`` looks at the child), one line per value, streamed chunk by
  chunk (``StreamedFile``), with no known size: a listing gives a stand-in,
  the first ``stat`` streams the content once to count it, and the count is
  kept until the group or the child changes. It adds ``"toy"`` to the
  group's sidecar.
* ``RowsView``: ``P.rows`` for a 2-D dataset, its rows as lines, with the
  default size (read through once).

Also ``layouts.views._arrays`` reads, ``StreamReader``'s restarts, a view that
fails in ``applies``, and the registry the daemon uses.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numcodecs
import numpy as np
import trio

from layouts.model import (
    Dataset,
    Domain,
    ElementType,
    Link,
    LinkKind,
    ObjectKind,
    VlenKind,
)
from layouts.views import VIEWS
from layouts.views import _arrays as arrays
from layouts.views._api import FileView, Reader, ViewContext
from layouts.views._npy import NpyView
from layouts.views._stream import StreamedFile, StreamReader
from mountd.cache.metacache import CachedCatalog
from mountd.tree import Tree, build
from mountd.tree.nodes import DirNode, FileNode, Node, SymlinkNode, listed_stat
from tests.modelcat import MemoryCatalog, MemoryChunks, dataset, group

VALUES = np.arange(23, dtype="<f4") * 1.5
GRID = np.arange(7 * 6, dtype="<f4").reshape(7, 6)


def hard(obj_id: str) -> Link:
    kind = {"g": ObjectKind.GROUP, "d": ObjectKind.DATASET}[obj_id[0]]
    return Link(LinkKind.HARD, obj_id, target_kind=kind)


def lines_of(values: np.ndarray) -> bytes:
    return "".join(f"{i}\t{v:g}\n" for i, v in enumerate(values)).encode()


class Counters:
    """How often the toy views did their costly work."""

    sized = 0
    streams = 0


class LinesView(FileView, StreamedFile):
    """``P.txt``: the ``values`` child of a group, one ``index<TAB>value`` line each."""

    suffix = ".txt"
    sidecar_key = "toy"

    async def _values(self, ctx: ViewContext) -> Dataset | None:
        if ctx.obj.kind is not ObjectKind.GROUP:
            return None
        values = await ctx.child("values")
        if isinstance(values, Dataset) and values.shape is not None and len(values.shape) == 1:
            return values
        return None

    async def applies(self, ctx: ViewContext) -> bool:
        return await self._values(ctx) is not None

    async def pieces(self, ctx: ViewContext) -> AsyncIterator[bytes]:
        Counters.streams += 1
        ds = await self._values(ctx)
        if ds is None or ds.shape is None:
            raise ctx.error("no values")
        step = ds.chunks[0]
        for start in range(0, ds.shape[0], step):
            rows = await arrays.read_rows(ctx, ds, start, start + step)
            await trio.sleep(0)  # a real view awaits I/O between pieces
            yield "".join(f"{start + i}\t{v:g}\n" for i, v in enumerate(rows)).encode()

    async def size(self, ctx: ViewContext) -> int:
        Counters.sized += 1
        return await super().size(ctx)

    async def sidecar(self, ctx: ViewContext) -> Any:
        ds = await self._values(ctx)
        return None if ds is None or ds.shape is None else {"rows": ds.shape[0]}


class BytesReader(Reader):
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self, offset: int, size: int) -> bytes:
        return self.data[offset:offset + size]


class RowsView(FileView):
    """``P.rows``: a 2-D dataset's rows, one line each, with the default size."""

    suffix = ".rows"

    async def applies(self, ctx: ViewContext) -> bool:
        obj = ctx.obj
        return isinstance(obj, Dataset) and obj.shape is not None and len(obj.shape) == 2

    async def open(self, ctx: ViewContext) -> Reader:
        assert isinstance(ctx.obj, Dataset) and ctx.obj.shape
        rows = await arrays.read_rows(ctx, ctx.obj, 0, ctx.obj.shape[0])
        return BytesReader(b"".join(" ".join(f"{v:g}" for v in row).encode() + b"\n"
                                    for row in rows))


class FailingView(FileView):
    """A buggy convention: ``applies`` raises for every group."""

    suffix = ".bad"

    async def applies(self, ctx: ViewContext) -> bool:
        if ctx.obj.kind is ObjectKind.GROUP:
            raise RuntimeError("a bug in a view")
        return False

    async def open(self, ctx: ViewContext) -> Reader:
        raise AssertionError("never shown")


def make_catalog() -> MemoryCatalog:
    objects = {
        "g-root": group(
            "g-root",
            table=hard("g-table"),
            plain=hard("g-plain"),
            wide=hard("g-wide"),
            grid=hard("d-grid"),
            taken=hard("g-taken"),
            **{"taken.txt": hard("g-plain")},
            alias=Link(LinkKind.SOFT, "/table"),
        ),
        "g-table": group("g-table", values=hard("d-values")),
        "g-plain": group("g-plain", other=hard("d-values")),
        "g-wide": group("g-wide", values=hard("d-grid")),
        "g-taken": group("g-taken", values=hard("d-values")),
        "d-values": dataset("d-values", VALUES, (5,), stored=[(0,), (1,), (3,), (4,)], fill=-1),
        "d-grid": dataset("d-grid", GRID, (3, 4), stored=[(0, 0), (1, 1), (2, 0)], fill=-2),
    }
    domain = Domain("f.h5", "g-root", 2.0, {})
    return MemoryCatalog({"f.h5": domain}, objects, {"": ["f.h5"]}, single_domain="f.h5")


def expected_values() -> np.ndarray:
    out = VALUES.copy()
    out[10:15] = -1  # chunk 2 is not stored
    return out


def expected_grid() -> np.ndarray:
    out = np.full(GRID.shape, -2, dtype="<f4")
    for i, j in [(0, 0), (1, 1), (2, 0)]:
        region = (slice(i * 3, (i + 1) * 3), slice(j * 4, (j + 1) * 4))
        out[region] = GRID[region]
    return out


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_tree(clock: Clock, catalog: MemoryCatalog | None = None) -> Tree:
    cached = CachedCatalog(catalog or make_catalog(), ttl=60, clock=clock)
    return build.make_tree(cached, views=[LinesView(), RowsView(), FailingView()])


async def walk(tree: Tree, path: str) -> Node:
    node: Node = await tree.root()
    for part in filter(None, path.split("/")):
        assert isinstance(node, DirNode)
        node = await node.lookup(part)
    return node


async def listing(node: Node) -> dict[str, Node]:
    assert isinstance(node, DirNode)
    return {name: child async for _, name, child, _ in node.open_listing().entries(0)}


async def read_all(node: Node) -> bytes:
    assert isinstance(node, FileNode)
    handle = await node.open()
    return bytes(await handle.read(0, 1 << 30))


def test_file_view_listed_read_and_sized_lazily() -> None:
    async def main() -> None:
        Counters.sized = 0
        tree = make_tree(Clock())
        root = await listing(await tree.root())
        # applies() looked at each group's children: only a 1-D ``values`` qualifies
        assert "table.txt" in root and "plain.txt" not in root and "wide.txt" not in root
        assert isinstance(root["table.txt"], FileNode)
        # a real link of the same name wins over the view of ``taken``
        assert isinstance(root["taken.txt"], DirNode)
        # a listing gives a stand-in (the kernel does not keep it) and sizes nothing
        stand_in = await listed_stat(root["table.txt"])
        assert not stand_in.exact and Counters.sized == 0
        want = lines_of(expected_values())
        node = await walk(tree, "table.txt")
        st = await node.stat()
        assert st.exact and st.size == len(want) and Counters.sized == 1
        assert (await node.stat()).size == len(want) and Counters.sized == 1  # kept
        # later listings show the kept size, still as a stand-in
        listed = await listed_stat(root["table.txt"])
        assert (listed.size, listed.exact) == (len(want), False)
        assert await read_all(node) == want
        # any range, in any order, from one open file
        assert isinstance(node, FileNode)
        handle = await node.open()
        assert not handle.direct_io  # sized before this open
        rng = np.random.default_rng(5)
        for _ in range(60):
            off = int(rng.integers(0, len(want) + 5))
            size = int(rng.integers(1, 40))
            assert await handle.read(off, size) == want[off:off + size], (off, size)
        # a soft link to the group links to the view too
        alias = await walk(tree, "alias.txt")
        assert isinstance(alias, SymlinkNode) and await alias.target() == "table.txt"
        # the sidecar key the view adds
        doc = json.loads(await read_all(await walk(tree, "table.json")))
        assert doc["toy"] == {"rows": 23}
        assert "toy" not in json.loads(await read_all(await walk(tree, "plain.json")))
    trio.run(main)


def test_kept_size_follows_the_child_object() -> None:
    """The size is kept while the group and the child it was computed from are
    the ones the catalog hands out; a changed child is sized again."""
    async def main() -> None:
        Counters.sized = 0
        clock = Clock()
        catalog = make_catalog()
        tree = make_tree(clock, catalog)
        node = await walk(tree, "table.txt")
        assert (await node.stat()).size == len(lines_of(expected_values()))
        shorter = VALUES[:7]
        catalog.objects["d-values"] = dataset("d-values", shorter, (5,))
        clock.now += 30  # within the TTL: the old child is still served
        assert (await node.stat()).size == len(lines_of(expected_values()))
        assert Counters.sized == 1
        clock.now += 31  # past it: the group is the same object, the child is new
        assert (await node.stat()).size == len(lines_of(shorter))
        assert Counters.sized == 2
        # an open that had to size the file bypasses the page cache
        catalog.objects["d-values"] = dataset("d-values", VALUES[:3], (5,))
        clock.now += 61
        assert isinstance(node, FileNode)
        handle = await node.open()
        assert handle.direct_io and Counters.sized == 3
        assert await handle.read(0, 1000) == lines_of(VALUES[:3])
    trio.run(main)


def test_size_is_computed_once_for_concurrent_stats() -> None:
    async def main() -> None:
        Counters.sized = 0
        tree = make_tree(Clock())
        node = await walk(tree, "table.txt")
        sizes: list[int] = []

        async def stat() -> None:
            sizes.append((await node.stat()).size)

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(stat)
        assert sizes == [len(lines_of(expected_values()))] * 5
        assert Counters.sized == 1
    trio.run(main)


def test_default_size_reads_the_file_through() -> None:
    async def main() -> None:
        tree = make_tree(Clock())
        root = await listing(await tree.root())
        assert isinstance(root["grid.rows"], FileNode)
        assert "table.rows" not in root  # a group, not a 2-D dataset
        want = b"".join(" ".join(f"{v:g}" for v in row).encode() + b"\n"
                        for row in expected_grid())
        node = await walk(tree, "grid.rows")
        st = await node.stat()  # the default size: read through once
        assert st.exact and st.size == len(want)
        assert await read_all(node) == want
    trio.run(main)


def test_a_failing_view_leaves_the_rest_shown() -> None:
    async def main() -> None:
        tree = make_tree(Clock())
        root = await listing(await tree.root())
        assert not any(name.endswith(".bad") for name in root)
        assert {"table", "table.json", "table.txt", "grid.rows"} <= set(root)
    trio.run(main)


class ArrayContext:
    """The part of a context ``layouts.views._arrays`` uses, over chunks in memory."""

    def __init__(self, obj: Dataset) -> None:
        self.obj = obj

    async def chunk(self, ds: Dataset, index: tuple[int, ...]) -> bytes | None:
        return await ds.read_chunk(index)

    async def chunks(self, ds: Dataset, indices: list[tuple[int, ...]]) -> list[bytes | None]:
        return [await ds.read_chunk(index) for index in indices]

    def error(self, reason: str) -> Exception:
        return ValueError(reason)


def test_array_reads_fixed_and_variable_length() -> None:
    async def main() -> None:
        grid = dataset("d-grid", GRID, (3, 4), stored=[(0, 0), (1, 1), (2, 0)], fill=-2)
        ctx: Any = ArrayContext(grid)
        np.testing.assert_array_equal(await arrays.read_array(ctx, grid), expected_grid())
        np.testing.assert_array_equal(await arrays.read_rows(ctx, grid, 2, 5),
                                      expected_grid()[2:5])
        assert (await arrays.read_rows(ctx, grid, 6, 99)).shape == (1, 6)
        assert (await arrays.read_rows(ctx, grid, 9, 12)).shape == (0, 6)
        codec = numcodecs.VLenUTF8()
        words = Dataset(
            id="d-words", shape=(5,), maxshape=(5,), chunks=(2,), fill_value="?",
            type=ElementType(np.dtype(object), "vlen-utf8", {}, vlen=VlenKind.UTF8),
            store=MemoryChunks({(0,): codec.encode(np.array(["a", "bb"], dtype=object)),
                                (2,): codec.encode(np.array(["e", ""], dtype=object))}))
        got = await arrays.read_rows(ctx, words, 1, 5)
        assert got.dtype == object and got.tolist() == ["bb", "?", "?", "e"]
        scalar = Dataset(
            id="d-s", shape=(), maxshape=(), chunks=(), fill_value="?",
            type=ElementType(np.dtype(object), "vlen-utf8", {}, vlen=VlenKind.UTF8),
            store=MemoryChunks({(0,): codec.encode(np.array(["héllo"], dtype=object))}))
        assert (await arrays.read_array(ctx, scalar))[()] == "héllo"
    trio.run(main)


def test_stream_reader_restarts_only_when_behind_what_it_keeps() -> None:
    content = bytes(range(256)) * 4
    opened = []

    async def stream() -> AsyncIterator[bytes]:
        opened.append(1)
        for pos in range(0, len(content), 10):
            yield content[pos:pos + 10]

    async def main() -> None:
        reader = StreamReader(stream, keep=64)
        assert await reader.read(0, 100) == content[:100]
        assert await reader.read(50, 100) == content[50:150]  # a little back: kept
        assert await reader.read(900, 50) == content[900:950]  # a jump ahead: skipped to
        assert len(opened) == 1
        assert await reader.read(10, 20) == content[10:30]  # far back: the stream again
        assert len(opened) == 2
        assert await reader.read(1000, 100) == content[1000:]
        assert await reader.read(2000, 10) == b""
    trio.run(main)


def test_registry_is_what_the_daemon_shows() -> None:
    """``layouts.views.VIEWS`` holds the ``.npy`` view; a tree built with it
    shows ``P.npy`` with its size known at once (exact in listings)."""
    assert any(isinstance(view, NpyView) for view in VIEWS)

    async def main() -> None:
        tree = build.make_tree(CachedCatalog(make_catalog(), ttl=60), views=VIEWS)
        root = await listing(await tree.root())
        assert "grid.npy" in root and "table.npy" not in root
        st = await listed_stat(root["grid.npy"])
        data = await read_all(root["grid.npy"])
        assert st.exact and st.size == len(data)
        np.testing.assert_array_equal(np.frombuffer(data[-GRID.nbytes:], "<f4").reshape(7, 6),
                                      expected_grid())
    trio.run(main)
