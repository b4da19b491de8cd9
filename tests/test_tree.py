"""Unit tests of the format-free tree over model objects, without a mount."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
import trio

from layouts.model import Attribute, Domain, Link, LinkKind, ObjectKind, ObjectRef
from mountd.errors import NotFound, StorageError
from mountd.names import display_name, escape
from mountd.nodes import DirNode, FileNode, Node, SymlinkNode
from mountd.npy import NpyView, flat_boxes
from mountd.tree import Tree
from tests.modelcat import MemoryCatalog, dataset, group


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
        "home/u/f.h5": Domain("home/u/f.h5", "g-root", 1.0, 2.0, info),
        "home/u/other.h5": Domain("home/u/other.h5", "g-oroot", 1.0, 2.0, info),
        "home/u": Domain("home/u", None, 1.0, 2.0),
    }
    folders = {"": ["home"], "home": ["u"], "home/u": ["f.h5", "other.h5"]}
    return MemoryCatalog(domains, objects, folders, single_domain=single)


async def names(node: Node) -> list[str]:
    assert isinstance(node, DirNode)
    return [name async for _, name, _ in node.open_listing().entries(0)]


async def walk(tree: Tree, path: str) -> Node:
    node: Node = await tree.root()
    for part in filter(None, path.split("/")):
        assert isinstance(node, DirNode)
        node = await node.lookup(part)
    return node


async def read_all(node: Node) -> bytes:
    assert isinstance(node, FileNode)
    handle = await node.open()
    return await handle.read(0, 1 << 30)


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
        tree = Tree(make_catalog())
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
        tree = Tree(make_catalog())
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
        tree = Tree(make_catalog())
        assert await link_text(tree, "home/u/f.h5/soft") == "g1/dset"
        assert await link_text(tree, "home/u/f.h5/soft.json") == "g1/dset.json"
        assert await link_text(tree, "home/u/f.h5/rel") == "g1/dset"
        assert await link_text(tree, "home/u/f.h5/g1/back") == "../x"
        assert await link_text(tree, "home/u/f.h5/dangling") == "/nowhere"
        assert await link_text(tree, "home/u/f.h5/ext") == "../other.h5/a"
        assert await link_text(tree, "home/u/f.h5/extmissing") == "/home/u/missing.h5::/a"
        # hard links back to an ancestor become symlinks instead of cycles
        assert await link_text(tree, "home/u/f.h5/g1/up") == ".."
        assert await link_text(tree, "home/u/f.h5/g1/me") == "."
        assert await link_text(tree, "home/u/f.h5/g1/up.json") == "../../f.h5.json"

    trio.run(main)


def test_dataset_chunks_and_sidecar() -> None:
    async def main() -> None:
        tree = Tree(make_catalog())
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
        tree = Tree(make_catalog())
        g1 = await walk(tree, "home/u/f.h5/g1")
        assert "lost" in await names(g1)  # listed, like any link
        lost = await walk(tree, "home/u/f.h5/g1/lost")
        with pytest.raises(StorageError):
            await lost.stat()
    trio.run(main)


def test_single_domain_root() -> None:
    async def main() -> None:
        tree = Tree(make_catalog(single="home/u/f.h5"))
        listing = await names(await tree.root())
        assert listing[0] == ".root.json" and "g1" in listing
        doc = json.loads(await read_all(await walk(tree, ".root.json")))
        assert doc["path"] == "/"
        assert await link_text(tree, "g1/up.json") == "../.root.json"
        assert await link_text(tree, "ext") == "/home/u/other.h5::/a"

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
        tree = Tree(make_catalog(), views=[NpyView()])
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


def test_zarr_metadata() -> None:
    async def main() -> None:
        tree = Tree(make_catalog())
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
