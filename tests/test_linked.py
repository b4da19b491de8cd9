"""Linked datasets (``hsload --link``): chunks read from the original HDF5 file.

The ``linked_bucket`` fixture runs a real HSDS 1.0.2 with POSIX storage and
keeps the HDF5 files inside the bucket directory (``ROOT/linktest/files``), so
their ``file_uri`` is ``linktest/files/NAME.h5`` as HSDS expects. It loads:

* ``linked.h5`` with ``hsload --link`` (``HSLOAD_LINK``: the real hsload of
  h5pyd 1.0.0 with the one h5json check fixed that stops it for every dataset
  over 512 elements; see ``HSLOAD_FIX``): H5D_CONTIGUOUS_REF, H5D_CHUNKED_REF
  and H5D_CHUNKED_REF_INDIRECT, 1-D to 3-D, compound and big-endian types,
  gzip+shuffle, Fletcher32, missing chunks and edge chunks;
* the same file with a plain ``hsload`` (``plain.h5``), to compare with;
* ``image.h5`` with ``hsload --link --h5image`` (a byte image of a whole
  HDF5 file as an H5D_CONTIGUOUS_REF uint8 dataset; also ``HSLOAD_LINK``, as
  the unpatched hsload sends nothing in that mode);
* ``rest.h5``: what hsload cannot make here, through HSDS's REST API with
  locations taken from h5py: chunk tables with ``hyper_dims`` (h5pyd only
  writes those for HSDS 0.9 servers), chunk tables with a ``file_uri`` per row
  (only h5pyd's --append mode, which the h5json check also stops), Blosc,
  Zstandard and LZ4 chunks (hsload cannot load hdf5plugin filters at all), a
  listed Fletcher32 filter and a filter nothing can undo.

Then it stops HSDS. The tests read the bucket with ``HsdsCatalog`` over a
``LocalStore`` and a POSIX ``file_uri`` resolver, and through a real mount.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numcodecs
import numpy as np
import pytest
import trio

from layouts.errors import FormatError
from layouts.formats.hsds import _linked as hsds_linked
from layouts.formats.hsds._catalog import HsdsCatalog
from layouts.hdf5 import _linked as h5linked
from layouts.hdf5._filters import Pipeline, decode, pipeline
from layouts.model import Dataset, Domain, Group, LinkKind
from layouts.storage import OpenUri, Store
from mountd.errors import Corrupt, StorageError
from mountd.io.local import LocalStore
from tests.h5compare import expected_chunk, mount_file
from tests.hsds_server import ADMIN_PASSWORD, ADMIN_USER, HsdsServer, hsds_node_available
from tests.mounting import fuse_available, mounted

BUCKET = "linktest"
LINKED = "home/admin/linked.h5"
PLAIN = "home/admin/plain.h5"
IMAGE = "home/admin/image.h5"
REST = "home/admin/rest.h5"

#: Two fixes for hsload of h5pyd 1.0.0, everything else is the real hsload:
#:
#: * ``make_new_dset`` passes ``maxshape`` for every dataset (h5py reports
#:   maxshape == shape for fixed-size ones), and h5json 2.0.1's
#:   ``Hdf5db.createDataset`` refuses any maxdims unless the layout is
#:   H5D_CHUNKED, so ``--link`` fails for every dataset it would link. A
#:   maxshape equal to the shape means "not resizable" and is dropped; HSDS
#:   then gets the layouts hsload computed, unchanged.
#: * ``--h5image`` never closes the output file, so h5pyd's buffered writes
#:   never reach HSDS (the domain stays empty); it is closed afterwards.
HSLOAD_FIX = """
import sys
from h5json import hdf5db
from h5pyd._apps import hsload
_create = hdf5db.Hdf5db.createDataset
def createDataset(self, shape=None, maxdims=None, **kwargs):
    if maxdims is not None and shape not in (None, "H5S_NULL") and list(maxdims) == list(shape):
        maxdims = None
    return _create(self, shape=shape, maxdims=maxdims, **kwargs)
hdf5db.Hdf5db.createDataset = createDataset
_image = hsload.load_h5image
def load_h5image(fin, fout, **kwargs):
    _image(fin, fout, **kwargs)
    fout.close()
hsload.load_h5image = load_h5image
sys.argv[0] = "hsload"
hsload.main()
"""
HSLOAD_LINK = (sys.executable, "-c", HSLOAD_FIX)

#: Layout class hsload --link gives each dataset of ``linked.h5`` (None: copied).
LINKED_CLASSES = {
    "/contig_1d": "H5D_CONTIGUOUS_REF",
    "/contig_3d_be": "H5D_CONTIGUOUS_REF",
    "/g/contig_2d": "H5D_CONTIGUOUS_REF",
    "/gzip_shuffle": "H5D_CHUNKED_REF",
    "/fletcher": "H5D_CHUNKED_REF",
    "/fletcher_gzip": "H5D_CHUNKED_REF",
    "/compound": "H5D_CHUNKED_REF",
    "/many_3d": "H5D_CHUNKED_REF_INDIRECT",
    "/many_1d": "H5D_CHUNKED_REF_INDIRECT",
    "/edges_2d": "H5D_CHUNKED_REF_INDIRECT",
    "/small": None,
    "/strings": None,
}
DEFLATE = {"class": "H5Z_FILTER_DEFLATE", "id": 1, "name": "deflate", "level": 4}
SHUFFLE = {"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "shuffle"}
FLETCHER32 = {"class": "H5Z_FILTER_FLETCHER32", "id": 3, "name": "fletcher32"}
PLUGIN_FILTERS = {
    "zstd": ({"class": "H5Z_FILTER_ZSTD", "id": 32015, "name": "zstd"}, hdf5plugin.Zstd()),
    "lz4": ({"class": "H5Z_FILTER_LZ4", "id": 32004, "name": "lz4"}, hdf5plugin.LZ4(nbytes=1000)),
    "blosc": ({"class": "H5Z_FILTER_BLOSC", "id": 32001, "name": "blosclz"},
              hdf5plugin.Blosc(cname="zstd")),
}


# --------------------------------------------------------------------------- test files


def write_linked(path: Path) -> None:
    rng = np.random.default_rng(5)
    with h5py.File(path, "w") as f:
        f["contig_1d"] = np.arange(5000, dtype="<f8") / 3
        # Over 8096 KiB: HSDS's grid is [1, 1001, 1100], so 2 x 2 chunks, the last short.
        f["contig_3d_be"] = rng.random((2, 2001, 1100), dtype="<f4").astype(">f4")
        f.create_group("g")["contig_2d"] = np.arange(1200, dtype="<i8").reshape(30, 40)
        d = f.create_dataset("gzip_shuffle", (300, 400), "<i4", chunks=(100, 200),
                             compression="gzip", shuffle=True, fillvalue=-7)
        d[:200] = np.arange(200 * 400).reshape(200, 400)  # rows 200-299: two missing chunks
        f.create_dataset("fletcher", data=rng.random((50, 60), dtype="<f4"), chunks=(20, 30),
                         fletcher32=True)
        f.create_dataset("fletcher_gzip", data=np.arange(3000, dtype="<i8").reshape(50, 60) ** 2,
                         chunks=(20, 30), fletcher32=True, compression="gzip", shuffle=True)
        comp = np.zeros(2000, dtype=[("a", "<i4"), ("b", "<f8"), ("c", "S3")])
        comp["a"] = np.arange(2000)
        comp["b"] = np.arange(2000) / 7
        comp["c"] = [str(i % 1000).encode() for i in range(2000)]
        f.create_dataset("compound", data=comp, chunks=(300,), compression="gzip")
        d = f.create_dataset("many_3d", (40, 50, 60), "<i2", chunks=(10, 10, 10),
                             compression="gzip", fillvalue=-1)
        d[:30] = np.arange(30 * 50 * 60).reshape(30, 50, 60) % 30000
        d = f.create_dataset("many_1d", (100000,), "<u4", chunks=(1000,), compression="gzip",
                             shuffle=True, fillvalue=9)
        d[:5000] = np.arange(5000)
        d[6000:] = np.arange(6000, 100000)  # chunk 5 is never written
        f.create_dataset("edges_2d", data=np.arange(95 * 130, dtype="<u2").reshape(95, 130),
                         chunks=(20, 50))
        f["small"] = np.arange(100, dtype="<i4")
        f.create_dataset("strings", data=["a", "bc", "def"] * 300, dtype=h5py.string_dtype())


def write_extra(files: Path) -> None:
    """The HDF5 files behind the REST-made datasets."""
    with h5py.File(files / "hyper.h5", "w") as f:
        d = f.create_dataset("grid", (100, 120), "<i4", chunks=(20, 40), compression="gzip",
                             fillvalue=3)
        data = np.arange(12000).reshape(100, 120)
        for i, j in itertools.product(range(5), range(3)):
            if (i, j) != (2, 1):  # one HDF5 chunk inside a hyper chunk stays missing
                d[i * 20:(i + 1) * 20, j * 40:(j + 1) * 40] = data[i * 20:(i + 1) * 20,
                                                                   j * 40:(j + 1) * 40]
    for name, scale in (("part_a.h5", 1), ("part_b.h5", -1)):
        with h5py.File(files / name, "w") as f:
            f.create_dataset("part", data=(np.arange(3000, dtype="<i2") * scale).reshape(60, 50),
                             chunks=(20, 25), compression="gzip", shuffle=True)
    with h5py.File(files / "plugins.h5", "w") as f:
        for name, (_, plugin) in PLUGIN_FILTERS.items():
            f.create_dataset(name, data=np.arange(6000, dtype="<i4").reshape(60, 100) * 3,
                             chunks=(20, 50), **plugin)


def write_image(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(1000, dtype="<i4")


def h5_chunks(ds: h5py.Dataset) -> dict[tuple[int, ...], tuple[int, int]]:
    """HDF5 chunk index -> (byte offset, size) of every stored chunk."""
    out = {}
    for i in range(ds.id.get_num_chunks()):
        info = ds.id.get_chunk_info(i)
        out[tuple(o // c for o, c in zip(info.chunk_offset, ds.chunks, strict=True))] = \
            (info.byte_offset, info.size)
    return out


# --------------------------------------------------------------------------- the bucket


@dataclass
class RestLinked:
    """A REST-made linked dataset and what a reader must find."""

    file: str  # under files/
    path: str  # dataset in that file
    expect: np.ndarray
    fill: Any = 0


@dataclass
class LinkedBucket:
    root_dir: Path
    files: Path
    rest: dict[str, RestLinked] = field(default_factory=dict)

    @property
    def bucket_dir(self) -> Path:
        return self.root_dir / BUCKET


def _rest_call(server: HsdsServer) -> Callable[..., Any]:
    import requests  # noqa: PLC0415  (comes with h5pyd; only this fixture needs it)

    session = requests.Session()
    session.auth = (ADMIN_USER, ADMIN_PASSWORD)
    session.trust_env = False

    def call(method: str, path: str, want: int, *, raw: bool = False, **kwargs: Any) -> Any:
        params = {"domain": "/" + REST, **kwargs.pop("params", {})}
        rsp = session.request(method, server.endpoint + path, params=params, timeout=60,
                              **kwargs)
        assert rsp.status_code == want, (method, path, rsp.status_code, rsp.text[:300])
        if raw:
            return rsp.content
        return rsp.json() if rsp.content else None

    return call


def _make_rest(server: HsdsServer, files: Path) -> dict[str, RestLinked]:
    call = _rest_call(server)
    call("PUT", "/", 201)
    root = call("GET", "/", 200)["root"]
    uri = f"{BUCKET}/files"
    out: dict[str, RestLinked] = {}
    ids: dict[str, str] = {}

    def dataset(name: str, dtype: Any, shape: list[int], cprops: dict[str, Any]) -> None:
        body = {"type": dtype, "shape": shape, "creationProperties": cprops,
                "link": {"id": root, "name": name}}
        ids[name] = call("POST", "/datasets", 201, json=body)["id"]

    def table(dtype: Any, shape: list[int], **value: Any) -> str:
        tid = call("POST", "/datasets", 201, json={"type": dtype, "shape": shape})["id"]
        if "binary" in value:
            call("PUT", f"/datasets/{tid}/value", 200, data=value["binary"].tobytes(),
                 headers={"Content-Type": "application/octet-stream"})
        else:
            # One element per request: HSDS 1.0.2 stored only the last row (as row 0)
            # of a whole 2-D JSON write of this variable-length compound.
            for i, row in enumerate(value["json"]):
                for j, item in enumerate(row):
                    call("PUT", f"/datasets/{tid}/value", 200, json={"value": [[item]]},
                         params={"select": f"[{i}:{i + 1},{j}:{j + 1}]"})
        return str(tid)

    loc = [{"name": "offset", "type": "H5T_STD_I64LE"}, {"name": "size", "type": "H5T_STD_I32LE"}]
    with h5py.File(files / "hyper.h5") as f:
        ds = f["grid"]
        rows = np.zeros((5, 3), dtype=[("offset", "<i8"), ("size", "<i4")])
        for index, (offset, size) in h5_chunks(ds).items():
            rows[index] = (offset, size)
        tid = table({"class": "H5T_COMPOUND", "fields": loc}, [5, 3], binary=rows)
        dataset("hyper", "H5T_STD_I32LE", [100, 120], {"layout": {
            "class": "H5D_CHUNKED_REF_INDIRECT", "dims": [40, 120], "hyper_dims": [20, 40],
            "file_uri": f"{uri}/hyper.h5", "chunk_table": tid},
            "filters": [DEFLATE], "fillValue": 3})
        out["hyper"] = RestLinked("hyper.h5", "grid", ds[...], 3)
    vstr = {"class": "H5T_STRING", "charSet": "H5T_CSET_ASCII", "length": "H5T_VARIABLE",
            "strPad": "H5T_STR_NULLTERM"}
    with h5py.File(files / "part_a.h5") as fa, h5py.File(files / "part_b.h5") as fb:
        a, b = h5_chunks(fa["part"]), h5_chunks(fb["part"])
        expect = np.zeros((60, 50), dtype="<i2")
        value = []
        for i in range(3):
            row = []
            for j in range(2):
                region = (slice(i * 20, i * 20 + 20), slice(j * 25, j * 25 + 25))
                if (i, j) == (1, 1):
                    row.append([0, 0, ""])  # missing: reads as the fill value
                elif (i + j) % 2:
                    row.append([*b[i, j], f"{uri}/part_b.h5"])
                    expect[region] = fb["part"][region]
                else:
                    row.append([*a[i, j], f"{uri}/part_a.h5"])
                    expect[region] = fa["part"][region]
            value.append(row)
        tid = table({"class": "H5T_COMPOUND", "fields": [*loc, {"name": "file_uri",
                                                                "type": vstr}]},
                    [3, 2], json=value)
        dataset("row_uris", "H5T_STD_I16LE", [60, 50], {"layout": {
            "class": "H5D_CHUNKED_REF_INDIRECT", "dims": [20, 25], "chunk_table": tid},
            "filters": [SHUFFLE, DEFLATE]})
        out["row_uris"] = RestLinked("part_a.h5", "part", expect)
    with h5py.File(files / "plugins.h5") as f:
        for name, (filt, _) in PLUGIN_FILTERS.items():
            chunks = {"_".join(map(str, k)): list(v) for k, v in h5_chunks(f[name]).items()}
            dataset(name, "H5T_STD_I32LE", [60, 100], {"layout": {
                "class": "H5D_CHUNKED_REF", "file_uri": f"{uri}/plugins.h5", "dims": [20, 50],
                "chunks": chunks}, "filters": [filt]})
            out[name] = RestLinked("plugins.h5", name, f[name][...])
    with h5py.File(files / "linked.h5") as f:
        for name, source, filters in (("fletcher_listed", "fletcher", [FLETCHER32]),
                                      ("unknown_filter", "gzip_shuffle", [
                                          {"class": "H5Z_FILTER_SCALEOFFSET", "id": 6,
                                           "name": "scaleoffset"}])):
            ds = f[source]
            chunks = {"_".join(map(str, k)): list(v) for k, v in h5_chunks(ds).items()}
            dataset(name, "H5T_IEEE_F32LE" if ds.dtype.kind == "f" else "H5T_STD_I32LE",
                    list(ds.shape), {"layout": {
                        "class": "H5D_CHUNKED_REF", "file_uri": f"{uri}/linked.h5",
                        "dims": list(ds.chunks), "chunks": chunks}, "filters": filters})
            out[name] = RestLinked("linked.h5", source, ds[...])
    server.flush("/" + REST)
    # HSDS reads the hyper-chunked and per-row-file tables as h5py does: the
    # layouts mean what this test says they mean.
    for name in ("hyper", "row_uris"):
        raw = call("GET", f"/datasets/{ids[name]}/value", 200, raw=True,
                   headers={"Accept": "application/octet-stream"})
        assert raw == out[name].expect.tobytes(), name
    return out


@pytest.fixture(scope="module")
def linked_bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinkedBucket]:
    """The linked and REST-made domains in a real HSDS bucket, flushed; HSDS stopped."""
    if not hsds_node_available():
        pytest.skip("hsds-node/hsload/hstouch not installed")
    base = tmp_path_factory.mktemp("linked")
    root = base / "root"
    files = root / BUCKET / "files"
    files.mkdir(parents=True)
    write_linked(files / "linked.h5")
    write_extra(files)
    write_image(files / "image.h5")
    with HsdsServer(root, BUCKET, log_dir=base / "logs") as server:
        server.load(files / "linked.h5", "/" + LINKED, link=True, hsload=HSLOAD_LINK)
        server.load(files / "linked.h5", "/" + PLAIN)
        server.load(files / "image.h5", "/" + IMAGE, link=True, args=("--h5image",),
                    hsload=HSLOAD_LINK)
        rest = _make_rest(server, files)
        for domain in (LINKED, IMAGE):
            server.flush("/" + domain)
        server.flush_and_verify("/" + PLAIN, files / "linked.h5")
    yield LinkedBucket(root, files, rest)


# --------------------------------------------------------------------------- helpers


def posix_opener(root_dir: Path) -> OpenUri:
    """The POSIX ``file_uri`` rule: ``BUCKET/path`` below ROOT_DIR, nothing else."""
    root = LocalStore(root_dir)

    def open_uri(uri: str) -> tuple[Store, str]:
        if "://" in uri:
            raise StorageError(uri, "not a POSIX file_uri")
        return root, uri

    return open_uri


async def objects(cat: HsdsCatalog, domain: str) -> dict[str, Any]:
    """HDF5 path -> object of every hard-linked object in ``domain``."""
    dom = await cat.domain(domain)
    assert dom is not None and dom.root_id
    out: dict[str, Any] = {}
    pending = [("/", dom.root_id)]
    while pending:
        path, obj_id = pending.pop()
        obj = await cat.get_object(dom, obj_id)
        out[path] = obj
        if isinstance(obj, Group):
            for name, link in obj.links.items():
                if link.kind is LinkKind.HARD:
                    pending.append((path.rstrip("/") + "/" + name, link.target))
    return out


def fill_block(ds: Dataset) -> bytes:
    return ds.fill_bytes() * math.prod(ds.chunks)


async def read_all(ds: Dataset) -> np.ndarray:
    """The whole dataset assembled from its chunks (fill where none is stored)."""
    assert ds.shape is not None
    out = np.empty(tuple(g * c for g, c in zip(ds.grid, ds.chunks, strict=True)),
                   dtype=ds.type.dtype)
    for index in np.ndindex(*ds.grid):
        data = await ds.read_chunk(index)
        block = np.frombuffer(data or fill_block(ds), dtype=ds.type.dtype).reshape(ds.chunks)
        out[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, ds.chunks, strict=True))] = block
    return out[tuple(slice(0, n) for n in ds.shape)]


# --------------------------------------------------------------------------- catalog tests


@pytest.mark.hsds
def test_hsload_made_linked_layouts(linked_bucket: LinkedBucket) -> None:
    """The data really is linked, and the sidecar keeps HSDS's original layout."""
    async def main() -> None:
        objs = await objects(HsdsCatalog(LocalStore(linked_bucket.bucket_dir)), LINKED)
        for path, cls in LINKED_CLASSES.items():
            ds = objs[path]
            assert isinstance(ds, Dataset)
            layout = ds.hdf5["layout"]
            assert layout.get("class") == cls or (cls is None and "REF" not in layout["class"])
            if cls:
                stored = json.loads((linked_bucket.bucket_dir / "db").joinpath(
                    *_json_path(ds.id)).read_text())
                assert layout == stored["creationProperties"]["layout"], path
                assert ds.hdf5["filters"] == stored["creationProperties"].get("filters", [])
        assert objs["/contig_3d_be"].chunks == (1, 1001, 1100)
        assert objs["/fletcher"].hdf5["filters"] == []  # hsload drops fletcher32
        image = (await objects(HsdsCatalog(LocalStore(linked_bucket.bucket_dir)), IMAGE))
        assert image["/h5image"].hdf5["layout"]["class"] == "H5D_CONTIGUOUS_REF"

    trio.run(main)


def _json_path(obj_id: str) -> tuple[str, ...]:
    rest = obj_id[2:]
    return rest[:17], "d", rest[18:], ".dataset.json"


@pytest.mark.hsds
def test_linked_chunks_match_h5py(linked_bucket: LinkedBucket) -> None:
    async def main() -> None:
        cat = HsdsCatalog(LocalStore(linked_bucket.bucket_dir),
                          open_uri=posix_opener(linked_bucket.root_dir))
        objs = await objects(cat, LINKED)
        with h5py.File(linked_bucket.files / "linked.h5") as f:
            for path, cls in LINKED_CLASSES.items():
                if cls is not None:
                    await check_linked(objs[path], f[path])

    trio.run(main)


async def check_linked(ds: Dataset, h5ds: h5py.Dataset) -> None:
    where = h5ds.name
    assert ds.shape == h5ds.shape and ds.maxshape == h5ds.maxshape, where
    assert ds.type.dtype == h5ds.dtype, where
    assert ds.fill_bytes() == np.asarray(h5ds.fillvalue, dtype=h5ds.dtype).tobytes(), where
    stored = [index async for index in ds.store.iter_stored()]
    assert len(stored) == len(set(stored)), where
    grid = list(np.ndindex(*ds.grid))
    for index in grid:
        data = await ds.read_chunk(index)
        expected = expected_chunk(h5ds, index, list(ds.chunks), h5ds.dtype)
        if data is None:
            assert index not in stored and not await ds.store.exists(index), (where, index)
            assert (expected == np.asarray(h5ds.fillvalue, dtype=h5ds.dtype)).all(), where
            continue
        assert index in stored and await ds.store.exists(index), (where, index)
        assert data == expected.tobytes(), (where, index)
    if "CHUNKED_REF" in ds.hdf5["layout"]["class"]:
        assert len(stored) == len(h5_chunks(h5ds)), where
    assert await ds.read_chunk(ds.grid) is None and not await ds.store.exists(ds.grid)


@pytest.mark.hsds
def test_linked_equals_plain_load(linked_bucket: LinkedBucket) -> None:
    """A linked dataset reads like the same dataset hsloaded without --link."""
    async def main() -> None:
        cat = HsdsCatalog(LocalStore(linked_bucket.bucket_dir),
                          open_uri=posix_opener(linked_bucket.root_dir))
        linked, plain = await objects(cat, LINKED), await objects(cat, PLAIN)
        assert set(linked) == set(plain)
        same_grid = 0
        for path, ours in linked.items():
            theirs = plain[path]
            if not isinstance(ours, Dataset):
                continue
            assert isinstance(theirs, Dataset)
            assert (ours.shape, ours.type.dtype, ours.type.sidecar) == \
                (theirs.shape, theirs.type.dtype, theirs.type.sidecar), path
            if not ours.type.fixed_size:
                continue
            assert ours.fill_bytes() == theirs.fill_bytes(), path
            if ours.chunks == theirs.chunks:
                same_grid += 1
                for index in np.ndindex(*ours.grid):
                    a, b = await ours.read_chunk(index), await theirs.read_chunk(index)
                    assert (a or fill_block(ours)) == (b or fill_block(theirs)), (path, index)
            else:
                assert (await read_all(ours)).tobytes() == (await read_all(theirs)).tobytes()
        assert same_grid >= 5

    trio.run(main)


@pytest.mark.hsds
def test_h5image(linked_bucket: LinkedBucket) -> None:
    """``hsload --link --h5image``: the file's own bytes, as one linked uint8 dataset."""
    async def main() -> None:
        cat = HsdsCatalog(LocalStore(linked_bucket.bucket_dir),
                          open_uri=posix_opener(linked_bucket.root_dir))
        ds = (await objects(cat, IMAGE))["/h5image"]
        raw = (linked_bucket.files / "image.h5").read_bytes()
        assert ds.shape == (len(raw),) and ds.type.dtype == np.uint8
        assert (await read_all(ds)).tobytes() == raw

    trio.run(main)


@pytest.mark.hsds
def test_rest_made_linked(linked_bucket: LinkedBucket) -> None:
    async def main() -> None:
        cat = HsdsCatalog(LocalStore(linked_bucket.bucket_dir),
                          open_uri=posix_opener(linked_bucket.root_dir))
        objs = await objects(cat, REST)
        for name, spec in linked_bucket.rest.items():
            ds = objs["/" + name]
            assert isinstance(ds, Dataset)
            if name == "unknown_filter":
                with pytest.raises(Corrupt, match="unsupported filter"):
                    await ds.read_chunk((0, 0))
                continue
            assert ds.shape == spec.expect.shape
            assert (await read_all(ds)).tobytes() == spec.expect.astype(ds.type.dtype).tobytes()
        hyper = objs["/hyper"]
        assert hyper.chunks == (40, 120) and hyper.grid == (3, 1)
        assert sorted([i async for i in hyper.store.iter_stored()]) == [(0, 0), (1, 0), (2, 0)]
        # The HDF5 chunk (2, 1) is missing: fill inside the hyper chunk (1, 0).
        block = np.frombuffer(await hyper.read_chunk((1, 0)) or b"", "<i4").reshape(40, 120)
        assert (block[0:20, 40:80] == 3).all() and block[20, 40] == 60 * 120 + 40
        # The last hyper chunk reaches past the table and the dataset: fill.
        last = np.frombuffer(await hyper.read_chunk((2, 0)) or b"", "<i4").reshape(40, 120)
        assert (last[20:] == 3).all()
        rows = objs["/row_uris"]
        assert sorted([i async for i in rows.store.iter_stored()]) == [
            (0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]
        assert await rows.read_chunk((1, 1)) is None

    trio.run(main)


@pytest.mark.hsds
def test_file_uri_errors(linked_bucket: LinkedBucket, tmp_path: Path) -> None:
    """Metadata never needs the linked file; chunk reads fail naming the uri."""
    uri = f"{BUCKET}/files/linked.h5"

    async def first_chunk(open_uri: OpenUri | None, path: str) -> None:
        cat = HsdsCatalog(LocalStore(linked_bucket.bucket_dir), open_uri=open_uri)
        ds = (await objects(cat, LINKED))[path]
        assert ds.shape and ds.hdf5["layout"]["file_uri"] == uri
        await ds.read_chunk((0,) * len(ds.shape))

    def refuse(value: str) -> tuple[Store, str]:
        raise StorageError(value, "refused")

    with pytest.raises(StorageError, match=f"{uri}: linked data file"):
        trio.run(first_chunk, None, "/gzip_shuffle")
    with pytest.raises(StorageError, match=f"{uri}: refused"):
        trio.run(first_chunk, refuse, "/contig_1d")
    with pytest.raises(StorageError, match="not found"):
        trio.run(first_chunk, posix_opener(tmp_path), "/many_3d")
    short = tmp_path / BUCKET / "files"
    short.mkdir(parents=True)
    (short / "linked.h5").write_bytes((linked_bucket.files / "linked.h5").read_bytes()[:4096])
    with pytest.raises(Corrupt, match="file ends"):
        trio.run(first_chunk, posix_opener(tmp_path), "/contig_1d")
    flipped = bytearray((linked_bucket.files / "linked.h5").read_bytes())
    with h5py.File(linked_bucket.files / "linked.h5") as f:
        offset, _ = h5_chunks(f["fletcher"])[0, 0]
    flipped[offset + 10] ^= 0xFF
    (short / "linked.h5").write_bytes(bytes(flipped))
    with pytest.raises(Corrupt, match=f"{uri}@{offset}"):
        trio.run(first_chunk, posix_opener(tmp_path), "/fletcher")


@pytest.mark.hsds
def test_damaged_linked_metadata(linked_bucket: LinkedBucket, tmp_path: Path) -> None:
    """Bad layout JSON makes that dataset Corrupt; a bad chunk table fails its reads."""
    bucket = tmp_path / BUCKET
    shutil.copytree(linked_bucket.bucket_dir, bucket, ignore=shutil.ignore_patterns("files"))
    (bucket / "files").symlink_to(linked_bucket.files)

    async def main() -> None:
        cat = HsdsCatalog(LocalStore(bucket), open_uri=posix_opener(linked_bucket.root_dir))
        objs = await objects(cat, LINKED)
        dom = await cat.domain(LINKED)
        assert isinstance(dom, Domain)
        for path, change in (("/gzip_shuffle", {"chunks": {"0_x": [1, 2]}}),
                             ("/contig_1d", {"offset": -1}),
                             ("/many_1d", {"hyper_dims": [3]})):
            key = bucket.joinpath("db", *_json_path(objs[path].id))
            doc = json.loads(key.read_text())
            doc["creationProperties"]["layout"].update(change)
            key.write_text(json.dumps(doc))
            with pytest.raises(Corrupt):
                await cat.get_object(dom, objs[path].id)
        table_id = objs["/many_3d"].hdf5["layout"]["chunk_table"]
        shutil.rmtree(bucket.joinpath("db", *_json_path(table_id)[:-1]))
        ds = await cat.get_object(dom, objs["/many_3d"].id)
        assert isinstance(ds, Dataset) and ds.shape == (40, 50, 60)
        with pytest.raises(Corrupt, match="chunk table is missing"):
            await ds.read_chunk((0, 0, 0))

    trio.run(main)


@pytest.mark.hsds
def test_large_chunks_decode_in_worker_threads(linked_bucket: LinkedBucket,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    in_thread: dict[str, bool] = {}

    def recording(name: str, fn: Callable[..., bytes]) -> Callable[..., bytes]:
        def wrapper(*args: Any) -> bytes:
            in_thread[name] = threading.current_thread() is not threading.main_thread()
            return fn(*args)
        return wrapper

    monkeypatch.setattr(h5linked, "_cut", recording("cut", h5linked._cut))
    monkeypatch.setattr(h5linked, "_assemble", recording("assemble", h5linked._assemble))

    async def main() -> None:
        cat = HsdsCatalog(LocalStore(linked_bucket.bucket_dir),
                          open_uri=posix_opener(linked_bucket.root_dir))
        objs = await objects(cat, LINKED)
        for path, big in (("/contig_3d_be", True), ("/gzip_shuffle", True),
                          ("/g/contig_2d", False), ("/fletcher", False)):
            in_thread.clear()
            assert await objs[path].read_chunk((0,) * len(objs[path].shape)) is not None
            assert list(in_thread.values()) == [big], path

    trio.run(main)


# --------------------------------------------------------------------------- mount


needs_fuse = pytest.mark.skipif(fuse_available() is not None,
                                reason=f"no FUSE: {fuse_available()}")


def check_linked_mount(mp: Path, linked_bucket: LinkedBucket) -> None:
    """Every linked ``.npy`` on the mount equals h5py; the sidecars keep the layouts."""
    with h5py.File(linked_bucket.files / "linked.h5") as f:
        for path, cls in LINKED_CLASSES.items():
            if cls is None:
                continue
            got = np.load(mp / LINKED / mount_file(path, ".npy"))
            assert got.dtype == f[path].dtype and got.tobytes() == f[path][...].tobytes(), path
            side = json.loads((mp / LINKED / mount_file(path, ".json")).read_text())
            assert side["hdf5"]["layout"]["class"] == cls, path
    image = np.load(mp / IMAGE / "h5image.npy")
    assert image.tobytes() == (linked_bucket.files / "image.h5").read_bytes()
    for name, spec in linked_bucket.rest.items():
        npy = mp / REST / f"{name}.npy"
        if name == "unknown_filter":
            with pytest.raises(OSError):
                np.load(npy)
            assert json.loads((mp / REST / f"{name}.json").read_text())["shape"] == [300, 400]
            continue
        assert np.load(npy).tobytes() == spec.expect.tobytes(), name


@pytest.mark.hsds
@pytest.mark.mount
@needs_fuse
def test_mounted_linked_npy(linked_bucket: LinkedBucket, tmp_path: Path) -> None:
    """Through a real mount (POSIX ``file_uri`` resolver of ``mountd.sources``)."""
    with mounted(linked_bucket.bucket_dir, tmp_path / "mnt") as mp:
        check_linked_mount(mp, linked_bucket)


@pytest.mark.hsds
@pytest.mark.mount
@pytest.mark.server
@needs_fuse
def test_mounted_linked_npy_on_s3(linked_bucket: LinkedBucket, moto, tmp_path: Path) -> None:
    """The same bucket copied key for key onto S3 (the HDF5 files too): ``file_uri``
    ``linktest/files/...`` is read from that bucket through the block cache."""
    moto.create_bucket(BUCKET)
    moto.upload_dir(linked_bucket.bucket_dir, BUCKET)
    with mounted(f"s3://{BUCKET}", tmp_path / "mnt", "--endpoint-url", moto.endpoint,
                 env=moto.env()) as mp:
        check_linked_mount(mp, linked_bucket)


# --------------------------------------------------------------------------- units


def test_contiguous_grid_matches_hsds() -> None:
    from h5json.dset_util import CHUNK_MAX, CHUNK_MIN, getContiguousLayout  # noqa: PLC0415

    assert hsds_linked.CONTIGUOUS_CHUNK_MAX == CHUNK_MAX
    shapes = [(5000,), (3001, 1000), (2, 2001, 1100), (10, 3000, 1000), (1 << 24,), (7, 0, 3),
              (3, 5_000_000), (40, 50, 60), (1,)]
    for shape, itemsize in itertools.product(shapes, (1, 2, 4, 8, 24)):
        expected = getContiguousLayout({"class": "H5S_SIMPLE", "dims": list(shape)}, itemsize,
                                       chunk_min=CHUNK_MIN, chunk_max=CHUNK_MAX)
        assert hsds_linked.contiguous_ref_chunks(shape, itemsize) == tuple(expected), shape


def test_h5_filter_pipelines(tmp_path: Path) -> None:
    """``decode`` against chunks HDF5 itself wrote (read_direct_chunk)."""
    data = (np.arange(6000, dtype="<i4").reshape(60, 100) * 7)
    cases: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
        "plain": ({}, []),
        "gzip_shuffle": ({"compression": "gzip", "shuffle": True}, [SHUFFLE, DEFLATE]),
        "fletcher": ({"fletcher32": True}, [FLETCHER32]),
        "fletcher_unlisted": ({"fletcher32": True}, []),
        "all": ({"fletcher32": True, "compression": "gzip", "shuffle": True},
                [DEFLATE, FLETCHER32, SHUFFLE]),
        "all_unlisted_checksum": ({"fletcher32": True, "compression": "gzip", "shuffle": True},
                                  [SHUFFLE, DEFLATE]),
        "lzf_shuffle": ({"compression": "lzf", "shuffle": True},
                        [SHUFFLE, {"class": "H5Z_FILTER_LZF", "id": 32000, "name": "lzf"}]),
        **{name: (dict(plugin), [filt]) for name, (filt, plugin) in PLUGIN_FILTERS.items()},
    }
    with h5py.File(tmp_path / "f.h5", "w") as f:
        for name, (kwargs, _) in cases.items():
            f.create_dataset(name, data=data, chunks=(20, 50), **kwargs)
    with h5py.File(tmp_path / "f.h5") as f:
        for name, (_, filters) in cases.items():
            pipe = pipeline(filters)
            assert pipe.unknown is None, name
            _, raw = f[name].id.read_direct_chunk((20, 50))
            assert decode(raw, pipe, 4, 4000, name) == data[20:40, 50:100].tobytes(), name
            if name.startswith(("fletcher", "all")):
                bad = bytearray(raw)
                bad[5] ^= 1
                with pytest.raises(Corrupt):
                    decode(bytes(bad), pipe, 4, 4000, name)
    with pytest.raises(Corrupt, match="after the zlib stream"):
        decode(zlib.compress(b"") + b"junk", Pipeline(compressor="deflate"), 1, 0, "k")
    with pytest.raises(Corrupt, match="expected 8"):
        decode(bytes(4), Pipeline(), 1, 8, "k")
    big = bytes(1 << 20)
    with pytest.raises(Corrupt, match="more than"):  # a zlib bomb stops at the chunk size
        decode(zlib.compress(big), Pipeline(compressor="deflate"), 1, 100, "k")
    with pytest.raises(Corrupt, match="zstd frame of 100 bytes"):
        decode(bytes(numcodecs.Zstd().encode(big)), Pipeline(compressor="zstd"), 1, 100, "k")
    with pytest.raises(Corrupt, match="LZ4 header"):
        decode(bytes(16), Pipeline(compressor="lz4"), 1, 100, "k")
    assert pipeline([{"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "bitshuffle"}]).unknown
    assert pipeline([{"class": "H5Z_FILTER_LZF", "id": 32000, "name": "lzf"}]).compressor == "lzf"
    assert pipeline([{"class": "H5Z_FILTER_SZIP", "id": 4, "name": "szip"}]).unknown
    assert pipeline([{"class": "x", "id": 1, "name": "gzip"}]).compressor == "deflate"
    with pytest.raises(FormatError):
        pipeline({"class": "H5Z_FILTER_DEFLATE"})
