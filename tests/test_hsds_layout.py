"""``layouts.formats.hsds._catalog`` (HsdsCatalog) against real HSDS buckets, without FUSE.

Three kinds of test live here:

* every object of every domain of the session bucket (``conftest.hsds_bucket``,
  files from ``tests/h5files.py`` hsloaded into HSDS 1.0.2) compared with h5py:
  links, shapes, types, fill values, attributes and every stored chunk, byte for
  byte for fixed-size types and by decoded value for variable-length ones;
* objects hsload cannot make (bitshuffle, zstd, partitioned chunks, base64 fill
  values, H5S_NULL, sub-array and nested variable-length types, committed types
  by id), created through HSDS's REST API by the ``rest_bucket`` fixture here;
* damaged copies of the bucket (corrupt JSON, truncated chunks, unknown
  filters, ...) and hand-made schema v1 / old-layout objects, plus unit tests
  of the id, type and chunk helpers that need no server.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import shutil
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numcodecs
import numpy as np
import orjson
import pytest
import trio

from layouts import decoding
from layouts.errors import FormatError
from layouts.formats.hsds import _chunks as hsds_chunks
from layouts.formats.hsds import _ids as hsds_ids
from layouts.formats.hsds import _objects as hsds_objects
from layouts.formats.hsds._catalog import HsdsCatalog, probe
from layouts.formats.hsds._chunks import ChunkSpec, FilterPlan, decode_chunk, filter_plan
from layouts.formats.hsds._values import attribute_value, fill_value
from layouts.hdf5._types import element_type, parse_type, sidecar_dtype
from layouts.model import (
    AnyObject,
    Dataset,
    Datatype,
    Domain,
    Group,
    LinkKind,
    ObjectKind,
    ObjectRef,
    VlenKind,
)
from mountd.errors import Corrupt, NotFound, StorageError
from mountd.io.local import LocalStore
from tests.h5compare import chunk_region, walk_links
from tests.hsds_server import ADMIN_PASSWORD, ADMIN_USER, HsdsServer, hsds_node_available

# --------------------------------------------------------------------------- helpers


def catalog_for(bucket_dir: Path, domain: str | None = None) -> HsdsCatalog:
    return HsdsCatalog(LocalStore(bucket_dir), single_domain=domain)


class Tree:
    """Objects of one domain of a catalog, looked up by HDF5 path (hard links only)."""

    def __init__(self, cat: HsdsCatalog, dom: Domain) -> None:
        self.cat = cat
        self.dom = dom
        self.objects: dict[str, AnyObject] = {}

    async def get(self, path: str) -> AnyObject:
        path = "/" + path.strip("/")
        if path in self.objects:
            return self.objects[path]
        if path == "/":
            assert self.dom.root_id is not None
            obj = await self.cat.get_object(self.dom, self.dom.root_id)
        else:
            parent_path, _, name = path.rpartition("/")
            parent = await self.get(parent_path or "/")
            assert isinstance(parent, Group), path
            link = parent.links[name]
            assert link.kind is LinkKind.HARD, path
            obj = await self.cat.get_object(self.dom, link.target)
        self.objects[path] = obj
        return obj


async def open_tree(bucket_dir: Path, domain: str) -> Tree:
    cat = catalog_for(bucket_dir)
    dom = await cat.domain(domain)
    assert dom is not None and dom.root_id, domain
    return Tree(cat, dom)


def storage_dtype(dt: np.dtype) -> np.dtype:
    """What HSDS stores for an h5py dtype: the same, without h5py's metadata (enums)."""
    if dt.names:
        return np.dtype([(name, storage_dtype(dt[name])) for name in dt.names])
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return np.dtype((storage_dtype(base), shape))
    return np.dtype(dt.str)


def json_descr(dt: np.dtype) -> Any:
    """``dtype.descr`` as JSON would hold it (lists, not tuples)."""
    return json.loads(json.dumps(dt.descr if dt.names else dt.str))


def has_vlen(dt: np.dtype) -> bool:
    if dt.names:
        return any(has_vlen(dt[n]) for n in dt.names)
    if dt.subdtype is not None:
        return has_vlen(dt.subdtype[0])
    return dt.kind == "O"


def same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN and compares nested lists."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool | bytes | str) or isinstance(b, bool | bytes | str):
        return type(a) is type(b) and a == b
    return bool(a == b)


def expected_value(value: Any, ref_id: Callable[[Any], str], *, attr: bool = True) -> Any:
    """An h5py value in the model's JSON-like convention (``attr=False``: json2 chunks)."""
    if isinstance(value, h5py.Empty):
        return None
    if isinstance(value, h5py.Reference):
        target = ref_id(value)
        return ObjectRef(obj_id=target) if attr else target
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, np.void):
        if value.dtype.names:
            return [expected_value(value[n], ref_id, attr=attr) for n in value.dtype.names]
        raw = value.tobytes()
        return raw if attr else {"base64": base64.b64encode(raw).decode()}
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "V" and not value.dtype.names and value.ndim == 1:
            return [expected_value(np.void(v.tobytes()), ref_id, attr=attr) for v in value]
        return [expected_value(v, ref_id, attr=attr) for v in value]
    if isinstance(value, np.generic):
        return expected_value(value.item(), ref_id, attr=attr)
    raise TypeError(type(value))


# --------------------------------------------------------------------------- session bucket


def h5_domains(hsds_bucket: Any) -> list[tuple[str, Path]]:
    return sorted(hsds_bucket.files.items())


@pytest.mark.hsds
def test_probe_and_folders(hsds_bucket: Any, tmp_path: Path) -> None:
    async def main() -> None:
        store = LocalStore(hsds_bucket.bucket_dir)
        assert await probe(store)
        assert HsdsCatalog.probe is probe
        (tmp_path / "empty").mkdir()
        assert not await probe(LocalStore(tmp_path / "empty"))
        (tmp_path / "other" / "sub").mkdir(parents=True)
        (tmp_path / "other" / "file.txt").write_text("x")
        assert not await probe(LocalStore(tmp_path / "other"))
        assert not await probe(LocalStore(tmp_path / "missing"))

        cat = HsdsCatalog(store)
        assert cat.single_domain is None
        assert await cat.list_folder("") == ["home"]  # db/ is skipped
        assert await cat.list_folder("/home/") == ["admin"]
        names = await cat.list_folder("home/admin")
        assert {d.rsplit("/", 1)[1] for d in hsds_bucket.files} <= set(names)

        home = await cat.domain("/home/")
        assert home is not None and home.path == "home" and home.root_id is None
        assert home.info["owner"] == "admin" and "acls" in home.info
        dom = await cat.domain("home/admin/types.h5")
        assert dom is not None and dom.root_id is not None and dom.root_id.startswith("g-")
        assert "root" not in dom.info and {"created", "lastModified"} <= set(dom.info)
        # its time is the storage time of its .domain.json, not a time it holds
        assert dom.modified == (hsds_bucket.bucket_dir / "home/admin/types.h5/.domain.json"
                                ).stat().st_mtime
        assert await cat.domain("") is None  # the bucket top: a plain directory
        assert await cat.domain("db") is None
        with pytest.raises(NotFound):
            await cat.domain("home/admin/no_such.h5")
        with pytest.raises(NotFound):
            await cat.list_folder("home/nobody")
        assert HsdsCatalog(store, "/home/admin/types.h5/").single_domain == "home/admin/types.h5"

    trio.run(main)


async def _check_file(bucket_dir: Path, domain: str, h5file: Path) -> int:
    tree = await open_tree(bucket_dir, domain)
    checked = 0
    with h5py.File(h5file, "r") as f:
        infos = list(walk_links(f))
        ids: dict[str, str] = {"/": tree.dom.root_id or ""}
        for info in infos:
            if isinstance(info.link, h5py.HardLink):
                ids[info.path] = (await tree.get(info.path)).id

        def ref_id(ref: h5py.Reference) -> str:
            return ids[f[ref].name]

        for info in infos:
            parent_path, _, name = info.path.rpartition("/")
            parent = await tree.get(parent_path or "/")
            assert isinstance(parent, Group)
            link = parent.links[name]
            if isinstance(info.link, h5py.SoftLink):
                assert (link.kind, link.target) == (LinkKind.SOFT, info.link.path), info.path
                continue
            if isinstance(info.link, h5py.ExternalLink):
                assert link.kind is LinkKind.EXTERNAL, info.path
                assert (link.target, link.domain) == (info.link.path, info.link.filename)
                continue
            assert link.kind is LinkKind.HARD and link.target == ids[info.path]
            obj = await tree.get(info.path)
            expected_kind = {h5py.Group: ObjectKind.GROUP, h5py.Dataset: ObjectKind.DATASET,
                             h5py.Datatype: ObjectKind.DATATYPE}[type(info.obj)]
            assert link.target_kind is expected_kind is obj.kind, info.path
            check_attrs(obj, info.obj, ref_id)
            if isinstance(obj, Group):
                assert set(obj.links) == set(info.obj), info.path
            elif isinstance(obj, Datatype):
                assert obj.type.dtype == storage_dtype(info.obj.dtype), info.path
            else:
                assert isinstance(obj, Dataset)
                await check_dataset(obj, info.obj, ref_id)
            checked += 1
        root = await tree.get("/")
        check_attrs(root, f, ref_id)
        assert set(root.links) == set(f)  # type: ignore[union-attr]
    return checked


def check_attrs(obj: AnyObject, h5obj: Any, ref_id: Callable[[Any], str]) -> None:
    ours = {a.name: a for a in obj.attrs}
    assert set(ours) == set(h5obj.attrs), h5obj.name
    for name, attr in ours.items():
        expected = expected_value(h5obj.attrs[name], ref_id)
        assert same(attr.value, expected), (h5obj.name, name, attr.value, expected)
        assert attr.dtype is not None


async def check_dataset(ds: Dataset, h5ds: h5py.Dataset, ref_id: Callable[[Any], str]) -> None:
    where = h5ds.name
    assert ds.shape == h5ds.shape, where
    assert ds.maxshape is not None and h5ds.maxshape is not None
    for ours, theirs in zip(ds.maxshape, h5ds.maxshape, strict=True):
        # hsload may make a dimension unlimited, never the other way round
        assert ours is None or ours == theirs, where
    assert len(ds.chunks) == len(ds.shape), where
    assert ds.hdf5["type"]["class"].startswith("H5T_") and isinstance(ds.hdf5["filters"], list)
    dt = h5py.check_dtype(ref=h5ds.dtype)
    et = ds.type
    if dt is h5py.Reference:
        assert (et.dtype, et.sidecar, et.vlen) == (np.dtype("S48"), "|S48", None), where
    elif h5py.check_string_dtype(h5ds.dtype) and h5py.check_string_dtype(h5ds.dtype).length is None:
        assert (et.vlen, et.sidecar) == (VlenKind.UTF8, "vlen-utf8"), where
    elif h5py.check_vlen_dtype(h5ds.dtype) is not None:
        assert et.vlen is VlenKind.ARRAY and et.vlen_base == h5py.check_vlen_dtype(h5ds.dtype)
    elif has_vlen(h5ds.dtype):
        assert et.vlen is VlenKind.JSON, where
    else:
        expected_dt = storage_dtype(h5ds.dtype)
        assert et.dtype.descr == expected_dt.descr, (where, et.dtype, expected_dt)
        assert et.sidecar == json_descr(expected_dt), where
        assert ds.fill_bytes() == np.asarray(h5ds.fillvalue, dtype=h5ds.dtype).tobytes(), where

    stored = [index async for index in ds.store.iter_stored()]
    assert len(stored) == len(set(stored)), where
    for index in stored:
        assert ds.in_grid(index) and await ds.store.exists(index), (where, index)
        data = await ds.read_chunk(index)
        assert data is not None
        check_chunk(ds, h5ds, index, data, ref_id)
    if ds.shape and math.prod(ds.grid) <= 400 and et.vlen is None:
        for index in np.ndindex(*ds.grid):
            if index in stored:
                continue
            assert await ds.read_chunk(index) is None and not await ds.store.exists(index)
            region = h5ds[chunk_region(index, list(ds.chunks), h5ds.shape)]
            fill = np.asarray(h5ds.fillvalue, dtype=h5ds.dtype)
            assert np.asarray(region).tobytes() == np.broadcast_to(fill, region.shape).tobytes()
    outside = tuple(n for n in ds.grid) or (1,)
    assert await ds.read_chunk(outside) is None and not await ds.store.exists(outside)


def h5_block(ds: Dataset, h5ds: h5py.Dataset, index: tuple[int, ...]) -> tuple[np.ndarray, Any]:
    """(h5py values of the chunk's region, the index expression of that region in the chunk)."""
    if h5ds.shape == ():
        return np.asarray(h5ds[()]).reshape(1), (slice(0, 1),)
    region = chunk_region(index, list(ds.chunks), h5ds.shape)
    part = h5ds[region]
    return part, tuple(slice(0, s) for s in part.shape)


def check_chunk(ds: Dataset, h5ds: h5py.Dataset, index: tuple[int, ...], data: bytes,
                ref_id: Callable[[Any], str]) -> None:
    where = (h5ds.name, index)
    chunk_shape = ds.chunks or (1,)
    part, inner = h5_block(ds, h5ds, index)
    et = ds.type
    if et.vlen is None:
        assert len(data) == ds.chunk_nbytes, where
        actual = np.frombuffer(data, dtype=et.dtype).reshape(chunk_shape)
        if h5py.check_dtype(ref=h5ds.dtype) is h5py.Reference:
            ids = [ref_id(r) if r else "" for r in part.reshape(-1)]
            assert [bytes(x).decode() for x in actual[inner].reshape(-1)] == ids, where
            return
        block = np.full(chunk_shape, h5ds.fillvalue, dtype=et.dtype)
        block[inner] = part
        assert data == block.tobytes(), where
        return
    if et.vlen is VlenKind.UTF8:
        decoded = numcodecs.VLenUTF8().decode(data).reshape(chunk_shape)
        want = [v.decode() if isinstance(v, bytes) else v for v in part.reshape(-1)]
        assert list(decoded[inner].reshape(-1)) == want, where
        padding = np.ones(chunk_shape, bool)
        padding[inner] = False
        assert all(v == "" for v in decoded[padding]), where
    elif et.vlen is VlenKind.ARRAY:
        decoded = numcodecs.VLenArray(et.vlen_base).decode(data).reshape(chunk_shape)
        for got, want in zip(decoded[inner].reshape(-1), part.reshape(-1), strict=True):
            assert got.dtype == et.vlen_base and got.tobytes() == want.tobytes(), where
    else:
        decoded = numcodecs.JSON().decode(data).reshape(chunk_shape)
        want = [expected_value(v, ref_id, attr=False) for v in part.reshape(-1)]
        assert same(list(decoded[inner].reshape(-1)), want), (where, decoded, want)


@pytest.mark.hsds
def test_every_object_matches_h5py(hsds_bucket: Any) -> None:
    checked = 0
    for domain, h5file in h5_domains(hsds_bucket):
        checked += trio.run(_check_file, hsds_bucket.bucket_dir, domain, h5file)
    assert checked > 100


@pytest.mark.hsds
def test_datasets_described_alike_share_one_read_only_description(hsds_bucket: Any) -> None:
    """A walk keeps every dataset of a domain: equal ``hdf5`` descriptions and
    dimension tuples are one instance, and no caller can change it for the others."""
    async def datasets() -> list[Dataset]:
        found: list[Dataset] = []
        for domain, h5file in h5_domains(hsds_bucket):
            tree = await open_tree(hsds_bucket.bucket_dir, domain)
            with h5py.File(h5file, "r") as f:
                paths = [info.path for info in walk_links(f)
                         if isinstance(info.obj, h5py.Dataset)
                         and isinstance(info.link, h5py.HardLink)]
            found.extend([ds for ds in [await tree.get(p) for p in paths]
                          if isinstance(ds, Dataset)])
        return found

    found = trio.run(datasets)
    by_text: dict[str, set[int]] = {}
    for ds in found:
        by_text.setdefault(orjson.dumps(dict(ds.hdf5)).decode(), set()).add(id(ds.hdf5))
        with pytest.raises(TypeError):
            ds.hdf5["layout"] = {}  # type: ignore[index]
    assert all(len(ids) == 1 for ids in by_text.values())
    assert len(by_text) < len(found)  # some are described alike, and were given one
    pairs = {(ds.shape, ds.chunks): (id(ds.shape), id(ds.chunks), id(ds.grid))
             for ds in found if ds.shape}
    assert all(pairs[(ds.shape, ds.chunks)] == (id(ds.shape), id(ds.chunks), id(ds.grid))
               for ds in found if ds.shape)


def test_a_large_description_is_the_datasets_own() -> None:
    """A linked dataset's layout may list where each of its chunks is: such a
    description is not kept in the shared table, nor made read-only."""
    tj = {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"}
    small = {"class": "H5D_CHUNKED", "dims": [4]}
    large = {"class": "H5D_CHUNKED_REF", "file_uri": "f.h5", "dims": [4],
             "chunks": {str(i): [8 * i, 8] for i in range(1000)}}
    assert hsds_objects._description(tj, [], small) is hsds_objects._description(tj, [], small)
    one, two = (hsds_objects._description(tj, [], dict(large)) for _ in range(2))
    assert one == two == {"type": tj, "filters": [], "layout": large}
    assert one is not two and isinstance(one, dict)


@pytest.mark.hsds
def test_single_domain_catalog(hsds_bucket: Any) -> None:
    async def main() -> None:
        cat = catalog_for(hsds_bucket.bucket_dir, "/home/admin/links.h5")
        assert cat.single_domain == "home/admin/links.h5"
        dom = await cat.domain(cat.single_domain)
        assert dom is not None and dom.root_id
        root = await cat.get_object(dom, dom.root_id)
        assert isinstance(root, Group)
        ext = root.links["ext_data"]
        assert (ext.kind, ext.target, ext.domain) == (LinkKind.EXTERNAL, "/data",
                                                      "extlink_target.h5")
        with pytest.raises(Corrupt):
            await cat.get_object(dom, "g-not-an-id")
        with pytest.raises(Corrupt):
            await cat.get_object(dom, "x-../../etc/passwd")
        missing = dom.root_id[:-6] + ("000000" if dom.root_id[-6:] != "000000" else "111111")
        with pytest.raises(NotFound):
            await cat.get_object(dom, missing)

    trio.run(main)


# --------------------------------------------------------------------------- REST-made objects


VSTR = {"class": "H5T_STRING", "length": "H5T_VARIABLE", "charSet": "H5T_CSET_UTF8",
        "strPad": "H5T_STR_NULLTERM"}
BITSHUFFLE = {"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "bitshuffle"}
DATA_1D = np.arange(10000, dtype="<i4")


def _filtered(*filters: dict[str, Any]) -> dict[str, Any]:
    return {"layout": {"class": "H5D_CHUNKED", "dims": [3000]}, "filters": list(filters)}


@dataclass
class RestSpec:
    """One dataset made through the REST API, and what a reader must find."""

    type: Any
    shape: Any
    cprops: dict[str, Any] = field(default_factory=dict)
    binary: np.ndarray | None = None  # written whole, as raw bytes
    value: Any = None  # written whole, as JSON
    select: str | None = None  # with binary: only this selection is written
    expect: np.ndarray | list[Any] | None = None  # whole dataset as a reader sees it


REST_DATASETS: dict[str, RestSpec] = {
    "bitshuffle": RestSpec("H5T_STD_I32LE", [10000], _filtered(BITSHUFFLE), DATA_1D),
    "bitshuffle_lz4": RestSpec("H5T_STD_I32LE", [10000], _filtered(
        BITSHUFFLE, {"class": "H5Z_FILTER_LZ4", "id": 32004, "name": "lz4"}), DATA_1D),
    "bitshuffle_gzip": RestSpec("H5T_STD_U16BE", [10000], _filtered(
        BITSHUFFLE, {"class": "H5Z_FILTER_DEFLATE", "id": 1, "name": "gzip", "level": 5}),
        DATA_1D.astype(">u2")),
    "bitshuffle_class": RestSpec("H5T_STD_I32LE", [10000], _filtered(
        {"class": "H5Z_FILTER_BITSHUFFLE", "id": 32008, "name": "bitshuffle"}), DATA_1D),
    "zstd": RestSpec("H5T_IEEE_F64LE", [10000], _filtered(
        {"class": "H5Z_FILTER_ZSTD", "id": 32015, "name": "zstd"}), DATA_1D.astype("<f8")),
    "lz4hc_shuffle": RestSpec("H5T_IEEE_F64BE", [10000], _filtered(
        {"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "shuffle"},
        {"class": "H5Z_FILTER_LZ4HC", "id": 32005, "name": "lz4hc"}), DATA_1D.astype(">f8")),
    "deflate_named": RestSpec("H5T_STD_I32LE", [10000], _filtered(
        {"class": "H5Z_FILTER_DEFLATE", "id": 1, "name": "deflate", "level": 1}), DATA_1D),
    "shuffle_only": RestSpec("H5T_STD_I64LE", [10000], _filtered(
        {"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "shuffle"}), DATA_1D.astype("<i8")),
    "partitioned": RestSpec("H5T_STD_I32LE", [100, 100], {"layout": {
        "class": "H5D_CHUNKED", "dims": [10, 10], "partition_count": 4}},
        np.arange(10000, dtype="<i4").reshape(100, 100)),
    "b64_fill": RestSpec("H5T_IEEE_F32LE", [10, 10], {
        "layout": {"class": "H5D_CHUNKED", "dims": [4, 4]},
        "fillValue": base64.b64encode(np.float32(2.5).tobytes()).decode(),
        "fillValue_encoding": "base64"}, np.ones((2, 2), "<f4"), select="[0:2,0:2]"),
    "contiguous": RestSpec("H5T_STD_I64LE", [10, 100], {"layout": {"class": "H5D_CONTIGUOUS"}},
                           np.arange(1000, dtype="<i8").reshape(10, 100)),
    "compact": RestSpec("H5T_STD_I16BE", [10], {"layout": {"class": "H5D_COMPACT"}},
                        np.arange(10, dtype=">i2")),
    "subarray": RestSpec({"class": "H5T_ARRAY", "dims": [3], "base": "H5T_STD_I16LE"}, [6], {
        "layout": {"class": "H5D_CHUNKED", "dims": [4]}}, np.arange(18, dtype="<i2")),
    "vlen_compound": RestSpec({"class": "H5T_VLEN", "base": {"class": "H5T_COMPOUND", "fields": [
        {"name": "x", "type": "H5T_STD_I16LE"}, {"name": "y", "type": "H5T_IEEE_F32LE"}]}},
        [2], value=[[[1, 2.0], [3, 4.0]], []], expect=[[[1, 2.0], [3, 4.0]], []]),
    "compound_vlen": RestSpec({"class": "H5T_COMPOUND", "fields": [
        {"name": "n", "type": "H5T_STD_I32LE"},
        {"name": "v", "type": {"class": "H5T_VLEN", "base": "H5T_IEEE_F64LE"}},
        {"name": "s", "type": VSTR}]}, [3],
        value=[[1, [1.5, 2.5], "ab"], [2, [], ""], [3, [3.0], "xyz é"]],
        expect=[[1, [1.5, 2.5], "ab"], [2, [], ""], [3, [3.0], "xyz é"]]),
    "vlen_int": RestSpec({"class": "H5T_VLEN", "base": "H5T_STD_I16BE"}, [3],
                         value=[[1, 2, 3], [], [-7]], expect=[[1, 2, 3], [], [-7]]),
    "vstr_fill": RestSpec(VSTR, [5], {"layout": {"class": "H5D_CHUNKED", "dims": [2]},
                                      "fillValue": "dflt"}),
    "null": RestSpec("H5T_STD_I32LE", "H5S_NULL"),
    "big": RestSpec("H5T_IEEE_F32LE", [1000, 1000], {
        "layout": {"class": "H5D_CHUNKED", "dims": [500, 500]},
        "filters": [{"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "shuffle"},
                    {"class": "H5Z_FILTER_DEFLATE", "id": 1, "name": "gzip", "level": 1}]},
        np.random.default_rng(7).random((1000, 1000), dtype="<f4")),
}


@dataclass
class RestBucket:
    bucket_dir: Path
    domain: str
    ids: dict[str, str]


def _rest(server: HsdsServer) -> Callable[..., Any]:
    import requests  # noqa: PLC0415  (comes with h5pyd; only this fixture needs it)

    session = requests.Session()
    session.auth = (ADMIN_USER, ADMIN_PASSWORD)
    session.trust_env = False

    def call(method: str, path: str, domain: str, want: int, **kwargs: Any) -> Any:
        params = {"domain": domain, **kwargs.pop("params", {})}
        rsp = session.request(method, server.endpoint + path, params=params, timeout=60,
                              **kwargs)
        assert rsp.status_code == want, (method, path, rsp.status_code, rsp.text[:300])
        return rsp.json() if rsp.content else None

    return call


@pytest.fixture(scope="module")
def rest_bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestBucket]:
    """A real HSDS bucket with objects made through the REST API; HSDS stopped."""
    if not hsds_node_available():
        pytest.skip("hsds-node not installed")
    base = tmp_path_factory.mktemp("hsds-rest")
    domain = "/home/admin/rest.h5"
    ids: dict[str, str] = {}
    with HsdsServer(base / "root", "resttest", log_dir=base / "logs") as server:
        server.ensure_folder("/home/")
        server.ensure_folder("/home/admin/", owner=ADMIN_USER)
        call = _rest(server)
        call("PUT", "/", domain, 201)
        root = call("GET", "/", domain, 200)["root"]
        ids["/"] = root
        for name, spec in REST_DATASETS.items():
            body = {"type": spec.type, "shape": spec.shape, "creationProperties": spec.cprops,
                    "link": {"id": root, "name": name}}
            did = call("POST", "/datasets", domain, 201, json=body)["id"]
            ids[name] = did
            if spec.binary is not None:
                params = {"select": spec.select} if spec.select else {}
                call("PUT", f"/datasets/{did}/value", domain, 200, params=params,
                     data=spec.binary.tobytes(),
                     headers={"Content-Type": "application/octet-stream"})
            elif spec.value is not None:
                call("PUT", f"/datasets/{did}/value", domain, 200, json={"value": spec.value})
        call("PUT", f"/datasets/{ids['vstr_fill']}/value", domain, 200,
             params={"select": "[0:1]"}, json={"value": ["x"]})
        tid = call("POST", "/datatypes", domain, 201,
                   json={"type": "H5T_STD_I16BE", "link": {"id": root, "name": "ctype"}})["id"]
        ids["ctype"] = tid
        did = call("POST", "/datasets", domain, 201, json={
            "type": tid, "shape": [4], "link": {"id": root, "name": "uses_ctype"}})["id"]
        ids["uses_ctype"] = did
        call("PUT", f"/datasets/{did}/value", domain, 200, data=np.arange(4, dtype=">i2").tobytes(),
             headers={"Content-Type": "application/octet-stream"})
        attrs = {
            # HSDS keeps a non-UTF-8 fixed string only as "encoding": "base64"... and drops
            # the value itself; a reader must still read the group.
            "nonutf8": {"type": {"class": "H5T_STRING", "length": 2, "charSet": "H5T_CSET_ASCII",
                                 "strPad": "H5T_STR_NULLPAD"}, "shape": [2],
                        "value": base64.b64encode(b"\xff\xfeok").decode(), "encoding": "base64"},
            "opaque": {"type": {"class": "H5T_OPAQUE", "size": 2}, "shape": [1],
                       "value": base64.b64encode(b"\xff\xfe").decode(), "encoding": "base64"},
            "regref": {"type": {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_DSETREG"},
                       "shape": "H5S_SCALAR", "value": {"id": ids["compact"][2:],
                                                        "select_type": "H5S_SEL_POINTS",
                                                        "selection": [[1]]}},
            "ref": {"type": {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_OBJ"},
                    "shape": "H5S_SCALAR", "value": ids["compact"]},
            "u64": {"type": "H5T_STD_U64LE", "shape": "H5S_SCALAR", "value": 2**64 - 1},
            "f16": {"type": "H5T_IEEE_F16LE", "shape": [2], "value": [1.5, "NaN"]},
        }
        for name, body in attrs.items():
            call("PUT", f"/groups/{root}/attributes/{name}", domain, 201, json=body)
        server.flush(domain)
    yield RestBucket(base / "root" / "resttest", domain.strip("/"), ids)


@pytest.mark.hsds
def test_rest_made_datasets(rest_bucket: RestBucket) -> None:
    async def main() -> None:
        tree = await open_tree(rest_bucket.bucket_dir, rest_bucket.domain)
        for name, spec in REST_DATASETS.items():
            ds = await tree.get(name)
            assert isinstance(ds, Dataset), name
            assert ds.id == rest_bucket.ids[name]
            await check_rest_dataset(name, spec, ds)

    trio.run(main)


async def check_rest_dataset(name: str, spec: RestSpec, ds: Dataset) -> None:
    if spec.shape == "H5S_NULL":
        assert (ds.shape, ds.maxshape, ds.chunks) == (None, None, ())
        assert [i async for i in ds.store.iter_stored()] == []
        assert await ds.read_chunk((0,)) is None
        return
    stored = sorted([i async for i in ds.store.iter_stored()])
    if ds.type.vlen is not None:
        assert stored == [(0,)], name
        data = await ds.read_chunk((0,))
        assert data is not None
        if ds.type.vlen is VlenKind.UTF8:
            assert list(numcodecs.VLenUTF8().decode(data)) == ["x", "dflt"]
            assert ds.fill_value == "dflt"
        elif ds.type.vlen is VlenKind.ARRAY:
            assert ds.type.vlen_base == np.dtype(">i2") and ds.type.sidecar == {"vlen": ">i2"}
            decoded = numcodecs.VLenArray(">i2").decode(data)
            assert [list(map(int, v)) for v in decoded] == spec.expect
        else:
            assert ds.type.vlen is VlenKind.JSON
            assert same(list(numcodecs.JSON().decode(data)), spec.expect), name
        return
    assert spec.binary is not None and ds.shape is not None
    base, sub = ds.type.dtype.base, ds.type.dtype.shape  # sub-array types: base items
    fill = ds.fill_value
    if spec.select:
        expected = np.full(ds.shape, fill, dtype=base)
        expected[0:2, 0:2] = spec.binary
    else:
        expected = spec.binary.view(base).reshape(ds.shape + sub)
    assert len(stored) == (1 if spec.select else math.prod(ds.grid)), name
    for index in stored:
        data = await ds.read_chunk(index)
        assert data is not None and len(data) == ds.chunk_nbytes
        block = np.full(ds.chunks + sub, fill, dtype=base)
        region = chunk_region(index, list(ds.chunks), ds.shape)
        inner = tuple(slice(0, r.stop - r.start) for r in region)
        block[inner] = expected[region]
        assert data == block.tobytes(), (name, index)


@pytest.mark.hsds
def test_rest_made_details(rest_bucket: RestBucket) -> None:
    async def main() -> None:
        tree = await open_tree(rest_bucket.bucket_dir, rest_bucket.domain)
        ids = rest_bucket.ids
        part = await tree.get("partitioned")
        assert isinstance(part, Dataset) and part.hdf5["layout"]["partition_count"] == 4
        prefix = f"{hsds_ids.parse_id(part.id).chunk_dir()}p"
        keys = [part.store.key((i, j)) for i in range(10) for j in range(10)]  # type: ignore[attr-defined]
        assert all(k.startswith(prefix) for k in keys)
        assert all((rest_bucket.bucket_dir / k).is_file() for k in keys)

        contiguous = await tree.get("contiguous")
        assert isinstance(contiguous, Dataset) and contiguous.fill_value == 0
        fill = await tree.get("b64_fill")
        assert isinstance(fill, Dataset) and fill.fill_value == np.float32(2.5)
        assert fill.hdf5["type"] == {"class": "H5T_FLOAT", "base": "H5T_IEEE_F32LE"}

        for name in ("contiguous", "compact"):
            ds = await tree.get(name)
            assert isinstance(ds, Dataset) and ds.chunks == ds.shape
            assert ds.hdf5["layout"]["class"] in ("H5D_CONTIGUOUS", "H5D_COMPACT")

        sub = await tree.get("subarray")
        assert isinstance(sub, Dataset)
        assert sub.type.dtype == np.dtype(("<i2", (3,))) and sub.type.sidecar == ["<i2", [3]]

        vc = await tree.get("vlen_compound")
        assert isinstance(vc, Dataset)
        assert vc.type.sidecar == {"vlen": [["x", "<i2"], ["y", "<f4"]]}
        cv = await tree.get("compound_vlen")
        assert isinstance(cv, Dataset)
        assert cv.type.sidecar == [["n", "<i4"], ["v", {"vlen": "<f8"}], ["s", "vlen-utf8"]]

        ctype = await tree.get("ctype")
        assert isinstance(ctype, Datatype) and ctype.type.dtype == np.dtype(">i2")
        uses = await tree.get("uses_ctype")
        assert isinstance(uses, Dataset) and uses.hdf5["type"]["id"] == ids["ctype"]
        assert await uses.read_chunk((0,)) == np.arange(4, dtype=">i2").tobytes()

        root = await tree.get("/")
        attrs = {a.name: a.value for a in root.attrs}
        assert attrs["nonutf8"] is None  # HSDS dropped the value (see fixture)
        assert attrs["opaque"] == [b"\xff\xfe"]
        assert attrs["ref"] == ObjectRef(obj_id=ids["compact"])
        assert attrs["regref"] == {"ref": ObjectRef(obj_id=ids["compact"]),
                                   "select_type": "H5S_SEL_POINTS", "selection": [[1]]}
        assert attrs["u64"] == 2**64 - 1
        assert same(attrs["f16"], [1.5, math.nan])

    trio.run(main)


@pytest.mark.hsds
def test_large_chunks_decode_in_worker_threads(rest_bucket: RestBucket,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []

    def recording_decode(raw: bytes, spec: ChunkSpec, key: str) -> bytes:
        threads.append(threading.current_thread().name)
        return decode_chunk(raw, spec, key)

    monkeypatch.setattr(hsds_chunks, "decode_chunk", recording_decode)

    async def main() -> None:
        tree = await open_tree(rest_bucket.bucket_dir, rest_bucket.domain)
        big = await tree.get("big")
        small = await tree.get("compact")
        assert isinstance(big, Dataset) and isinstance(small, Dataset)
        expected = REST_DATASETS["big"].binary
        assert expected is not None
        results: dict[tuple[int, ...], bytes | None] = {}

        async def read(index: tuple[int, ...]) -> None:
            results[index] = await big.read_chunk(index)

        async with trio.open_nursery() as nursery:
            for index in [(0, 0), (0, 1), (1, 0), (1, 1)] * 2:
                nursery.start_soon(read, index)
            assert decoding.DECODE_LIMITER.total_tokens == 2
        for (i, j), data in results.items():
            assert data == expected[i * 500:(i + 1) * 500, j * 500:(j + 1) * 500].tobytes()
        assert len(threads) == 8 and threading.main_thread().name not in threads
        assert await small.read_chunk((0,)) == np.arange(10, dtype=">i2").tobytes()
        assert threads[-1] == threading.main_thread().name  # small chunks decode inline

    trio.run(main)


# --------------------------------------------------------------------------- damaged copies


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _root_id(bucket_dir: Path, domain: str) -> str:
    return str(_json(bucket_dir / domain / ".domain.json")["root"])


def _obj_dir(bucket_dir: Path, obj_id: str) -> Path:
    hid = hsds_ids.parse_id(obj_id)
    return bucket_dir / hid.json_key().rsplit("/", 1)[0]


def _link_id(bucket_dir: Path, domain: str, path: str) -> str:
    obj_id = _root_id(bucket_dir, domain)
    for name in path.strip("/").split("/"):
        group = _json(bucket_dir / hsds_ids.parse_id(obj_id).json_key())
        obj_id = group["links"][name]["id"]
    return obj_id


@pytest.fixture(scope="module")
def damaged(hsds_bucket: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session bucket with one kind of damage per victim object."""
    bucket = tmp_path_factory.mktemp("damaged") / "bucket"
    shutil.copytree(hsds_bucket.bucket_dir, bucket)

    def dset_json(domain: str, path: str) -> Path:
        return _obj_dir(bucket, _link_id(bucket, domain, path)) / ".dataset.json"

    dset_json("home/admin/layout.h5", "edge_2d").write_text('{"id": "oops", "shape": ')
    chunk = dset_json("home/admin/filters.h5", "gzip_shuffle").parent / "0_0"
    chunk.write_bytes(chunk.read_bytes()[:40])
    (dset_json("home/admin/layout.h5", "sparse").parent / "5_2").write_bytes(b"")
    key = dset_json("home/admin/filters.h5", "gzip_int64")
    doc = _json(key)
    doc["creationProperties"]["filters"] = [{"class": "H5Z_FILTER_USER", "id": 31999,
                                             "name": "mystery"}]
    key.write_text(json.dumps(doc))
    key = dset_json("home/admin/layout.h5", "contiguous")
    doc = _json(key)
    doc["shape"]["dims"] = doc["shape"]["maxdims"] = [2**62, 2**62]
    key.write_text(json.dumps(doc))
    key = dset_json("home/admin/layout.h5", "one_element")
    doc = _json(key)
    doc["creationProperties"]["layout"] = {"class": "H5D_CHUNKED_REF", "file_uri": "b/f.h5",
                                           "dims": [1], "chunks": {"0": [0, 8]}}
    key.write_text(json.dumps(doc))
    # An older server's top-level layout wins over creationProperties.layout.
    key = dset_json("home/admin/layout.h5", "fill_int")
    doc = _json(key)
    doc["layout"] = doc["creationProperties"]["layout"]
    doc["creationProperties"]["layout"] = {"class": "H5D_CHUNKED", "dims": [1, 1]}
    key.write_text(json.dumps(doc))
    key = dset_json("home/admin/attrs.h5", "dset")
    doc = _json(key)
    doc["attributes"]["units"]["type"] = {"class": "H5T_BITFIELD"}
    key.write_text(json.dumps(doc))
    g3 = _link_id(bucket, "home/admin/links.h5", "g1/g2/g3")
    (bucket / hsds_ids.parse_id(g3).json_key()).write_bytes(b"")
    (bucket / "home/admin/types.h5/.domain.json").write_bytes(b"")
    (bucket / "home/admin/zcompress_lz4.h5/.domain.json").write_bytes(b"\x00garbage")
    _add_schema_v1_dataset(bucket, "home/admin/layout.h5", "edge_3d")
    return bucket


def _add_schema_v1_dataset(bucket: Path, domain: str, source: str) -> None:
    """Copy ``source`` under a schema v1 id (``md5(id)[:5]-id`` keys) and link it as ``v1``."""
    src_id = _link_id(bucket, domain, source)
    v1_id = f"d-{uuid.uuid4()}"
    src_dir = _obj_dir(bucket, src_id)
    doc = _json(src_dir / ".dataset.json")
    doc["id"] = v1_id
    (bucket / hsds_ids.v1_key(v1_id)).write_text(json.dumps(doc))
    for chunk in src_dir.iterdir():
        if not chunk.name.startswith("."):
            chunk_id = f"c-{v1_id[2:]}_{chunk.name}"
            digest = hashlib.md5(chunk_id.encode()).hexdigest()[:5]
            shutil.copy(chunk, bucket / f"{digest}-{chunk_id}")
    root_key = bucket / hsds_ids.parse_id(_root_id(bucket, domain)).json_key()
    root = _json(root_key)
    root["links"]["v1"] = {"class": "H5L_TYPE_HARD", "id": v1_id}
    root_key.write_text(json.dumps(root))


@pytest.mark.hsds
def test_damage_stays_local(damaged: Path, hsds_bucket: Any) -> None:
    async def main() -> None:
        cat = catalog_for(damaged)
        layout = await open_tree(damaged, "home/admin/layout.h5")
        with pytest.raises(Corrupt) as info:
            await layout.get("edge_2d")
        assert info.value.key.endswith(".dataset.json") and "JSON" in info.value.reason
        with pytest.raises(Corrupt, match="too many elements"):
            await layout.get("contiguous")
        one = await layout.get("one_element")
        assert isinstance(one, Dataset) and one.hdf5["layout"]["class"] == "H5D_CHUNKED_REF"
        with pytest.raises(StorageError, match=r"b/f\.h5"):
            await one.read_chunk((0,))
        sparse = await layout.get("sparse")
        assert isinstance(sparse, Dataset)
        with pytest.raises(Corrupt, match="empty"):
            await sparse.read_chunk((5, 2))
        assert await sparse.read_chunk((0, 0)) is not None
        fill_int = await layout.get("fill_int")
        assert isinstance(fill_int, Dataset) and fill_int.chunks == (2, 5)
        with h5py.File(hsds_bucket.files["home/admin/layout.h5"]) as f:
            await check_dataset(fill_int, f["fill_int"], lambda r: "")
            v1 = await layout.get("v1")
            assert isinstance(v1, Dataset) and not hsds_ids.parse_id(v1.id).is_v2
            await check_dataset(v1, f["edge_3d"], lambda r: "")
            assert len([i async for i in v1.store.iter_stored()]) == math.prod(v1.grid)

        filters = await open_tree(damaged, "home/admin/filters.h5")
        gzip_shuffle = await filters.get("gzip_shuffle")
        assert isinstance(gzip_shuffle, Dataset)
        with pytest.raises(Corrupt) as info:
            await gzip_shuffle.read_chunk((0, 0))
        assert info.value.key.endswith("/0_0")
        assert await gzip_shuffle.read_chunk((0, 1)) is not None
        unknown = await filters.get("gzip_int64")
        assert isinstance(unknown, Dataset)
        assert [i async for i in unknown.store.iter_stored()]
        with pytest.raises(Corrupt, match="mystery") as info:
            await unknown.read_chunk((0, 0))
        assert info.value.key == hsds_ids.parse_id(unknown.id).json_key()
        assert await (await filters.get("gzip")).read_chunk((0, 0))  # type: ignore[union-attr]

        attrs = await open_tree(damaged, "home/admin/attrs.h5")
        with pytest.raises(Corrupt, match="units"):
            await attrs.get("dset")
        assert isinstance(await attrs.get("grp"), Group)

        links = await open_tree(damaged, "home/admin/links.h5")
        with pytest.raises(Corrupt, match="empty"):
            await links.get("g1/g2/g3")
        assert isinstance(await links.get("g1/g2/d"), Dataset)

        assert await cat.domain("home/admin/types.h5") is None  # zero-length: a plain folder
        with pytest.raises(Corrupt):
            await cat.domain("home/admin/zcompress_lz4.h5")
        assert (await cat.domain("home/admin/zcompress_gzip.h5")) is not None
        assert "types.h5" in await cat.list_folder("home/admin")

    trio.run(main)


# --------------------------------------------------------------------------- units, no server


def test_ids_and_keys() -> None:
    root = hsds_ids.parse_id("g-02cd0518-2c584e72-8a45-8d90a4-d0c6fa")
    assert root.is_v2 and root.is_root and root.kind is ObjectKind.GROUP
    assert root.json_key() == "db/02cd0518-2c584e72/.group.json"
    grp = hsds_ids.parse_id("g-02cd0518-2c584e72-b483-90f9fd-0dcd89")
    assert not grp.is_root
    assert grp.json_key() == "db/02cd0518-2c584e72/g/b483-90f9fd-0dcd89/.group.json"
    dset = hsds_ids.parse_id(
        hsds_ids.normalize_id("datasets/d-02cd0518-2c584e72-86ef-55279d-623eb6"))
    assert dset.json_key() == "db/02cd0518-2c584e72/d/86ef-55279d-623eb6/.dataset.json"
    assert dset.chunk_dir() == "db/02cd0518-2c584e72/d/86ef-55279d-623eb6/"
    ctype = hsds_ids.parse_id("t-02cd0518-2c584e72-4700-e109ef-4ea2df")
    assert ctype.json_key().endswith("/t/4700-e109ef-4ea2df/.datatype.json")
    v1 = hsds_ids.parse_id("g-0568d8c5-a77e-11e4-9f7a-3c15c2da029e")
    assert not v1.is_v2 and v1.json_key() == (
        hashlib.md5(b"g-0568d8c5-a77e-11e4-9f7a-3c15c2da029e").hexdigest()[:5]
        + "-g-0568d8c5-a77e-11e4-9f7a-3c15c2da029e")
    assert hsds_ids.normalize_id("groups/0568d8c5-a77e-11e4-9f7a-3c15c2da029e")[:2] == "g-"
    for bad in ("", "g-", "x-02cd0518-2c584e72-8a45-8d90a4-d0c6fa", "g-../../etc",
                "G-02CD0518-2c584e72-8a45-8d90a4-d0c6fa", "other/g-1"):
        with pytest.raises(hsds_ids.BadId):
            hsds_ids.parse_id(hsds_ids.normalize_id(bad))
    # HSDS chunkUtil.getPartitionKey: sum(index[d] * PRIMES[d % 10]) % count
    assert hsds_ids.partition_of((1, 2), 4) == (29 + 62) % 4
    assert hsds_ids.partition_of(tuple(range(12)), 7) == sum(
        i * p for i, p in zip(range(12), [29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 29, 31],
                              strict=True)) % 7
    assert hsds_ids.parse_chunk_name("3_0_12", 3) == (3, 0, 12)
    for bad in ("01_2", "1_2", "a_b_c", "1__2", "-1_2_3", "1_2_3_4", "\uff11_2_3", ".dataset.json"):
        assert hsds_ids.parse_chunk_name(bad, 3) is None


TYPE_CASES: list[tuple[Any, np.dtype | None, Any, VlenKind | None]] = [
    ("H5T_STD_I32LE", np.dtype("<i4"), "<i4", None),
    ({"class": "H5T_INTEGER", "base": "H5T_STD_U64BE"}, np.dtype(">u8"), ">u8", None),
    ({"class": "H5T_FLOAT", "base": "H5T_IEEE_F16BE"}, np.dtype(">f2"), ">f2", None),
    ({"class": "H5T_STRING", "length": 7, "charSet": "H5T_CSET_UTF8"}, np.dtype("S7"), "|S7",
     None),
    (VSTR, None, "vlen-utf8", VlenKind.UTF8),
    ({**VSTR, "charSet": "H5T_CSET_ASCII"}, None, "vlen-utf8", VlenKind.UTF8),
    ({"class": "H5T_OPAQUE", "size": 5}, np.dtype("V5"), "|V5", None),
    ({"class": "H5T_REFERENCE", "base": "H5T_STD_REF_OBJ", "length": 48}, np.dtype("S48"),
     "|S48", None),
    ({"class": "H5T_REFERENCE", "base": "H5T_STD_REF_DSETREG"}, None, "vlen-bytes",
     VlenKind.BYTES),
    ({"class": "H5T_ENUM", "base": {"class": "H5T_INTEGER", "base": "H5T_STD_I8LE"},
      "members": [{"name": "FALSE", "value": 0}, {"name": "TRUE", "value": 1}]},
     np.dtype("?"), "|b1", None),
    ({"class": "H5T_ENUM", "base": {"class": "H5T_INTEGER", "base": "H5T_STD_U16BE"},
      "mapping": {"A": 1, "B": 2}}, np.dtype(">u2"), ">u2", None),
    ({"class": "H5T_VLEN", "base": "H5T_STD_I16BE"}, None, {"vlen": ">i2"}, VlenKind.ARRAY),
    ({"class": "H5T_ARRAY", "dims": [2, 3], "base": "H5T_IEEE_F32LE"},
     np.dtype(("<f4", (2, 3))), ["<f4", [2, 3]], None),
    ({"class": "H5T_ARRAY", "dims": [2], "base": VSTR}, None, ["vlen-utf8", [2]], VlenKind.JSON),
    ({"class": "H5T_COMPOUND", "fields": [
        {"name": "a", "type": "H5T_STD_I8LE"},
        {"name": "p", "type": {"class": "H5T_COMPOUND", "fields": [
            {"name": "x", "type": "H5T_IEEE_F64BE"}]}},
        {"name": "v", "type": {"class": "H5T_ARRAY", "dims": [2], "base": "H5T_STD_U16LE"}}]},
     np.dtype([("a", "i1"), ("p", [("x", ">f8")]), ("v", "<u2", (2,))]),
     [["a", "|i1"], ["p", [["x", ">f8"]]], ["v", "<u2", [2]]], None),
    ({"class": "H5T_COMPOUND", "fields": [{"name": "n", "type": "H5T_STD_I32LE"},
                                          {"name": "s", "type": VSTR}]},
     None, [["n", "<i4"], ["s", "vlen-utf8"]], VlenKind.JSON),
    ({"class": "H5T_VLEN", "base": {"class": "H5T_COMPOUND", "fields": [
        {"name": "x", "type": "H5T_STD_I16LE"}]}}, None, {"vlen": [["x", "<i2"]]}, VlenKind.JSON),
]


@pytest.mark.parametrize(("tj", "dtype", "sidecar", "vlen"), TYPE_CASES)
def test_type_parsing(tj: Any, dtype: np.dtype | None, sidecar: Any,
                      vlen: VlenKind | None) -> None:
    t = parse_type(tj)
    et = element_type(tj, t)
    assert et.vlen is vlen
    assert et.sidecar == sidecar == sidecar_dtype(t)
    assert json.loads(json.dumps(et.sidecar)) == sidecar
    if dtype is None:
        assert et.dtype == np.dtype(object)
    else:
        assert et.dtype == dtype
        if dtype.names:
            assert et.sidecar == json_descr(dtype)
    if isinstance(tj, dict):
        assert et.hdf5 == tj
    else:
        assert et.hdf5 == {"class": "H5T_INTEGER", "base": tj}


@pytest.mark.parametrize("tj", [
    None, 5, "H5T_STD_I12LE", {"class": "H5T_BITFIELD"}, {"class": "H5T_STRING", "length": 0},
    {"class": "H5T_OPAQUE"}, {"class": "H5T_COMPOUND", "fields": []},
    {"class": "H5T_COMPOUND", "fields": [{"name": "a", "type": "H5T_STD_I8LE"},
                                         {"name": "a", "type": "H5T_STD_I8LE"}]},
    {"class": "H5T_ENUM", "base": "H5T_IEEE_F32LE", "mapping": {"a": 1}},
    {"class": "H5T_ARRAY", "dims": [0], "base": "H5T_STD_I8LE"},
    {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_WHAT"},
])
def test_bad_types(tj: Any) -> None:
    with pytest.raises(FormatError):
        parse_type(tj)


def test_values() -> None:
    cmp_t = parse_type({"class": "H5T_COMPOUND", "fields": [
        {"name": "a", "type": "H5T_STD_I32LE"}, {"name": "b", "type": "H5T_IEEE_F64BE"},
        {"name": "c", "type": {"class": "H5T_STRING", "length": 3}}]})
    fv = fill_value(cmp_t, [9, 9.5, "f"], None)
    assert fv.tobytes() == np.array((9, 9.5, b"f"), dtype=cmp_t.dtype).tobytes()
    assert fill_value(cmp_t, {"a": 1, "b": 2, "c": "x"}, None)["c"] == b"x"
    f4 = parse_type("H5T_IEEE_F32LE")
    assert math.isnan(fill_value(f4, "NaN", None)) and math.isnan(fill_value(f4, math.nan, None))
    raw = base64.b64encode(np.float32(-3.5).tobytes()).decode()
    assert fill_value(f4, raw, "base64") == np.float32(-3.5)
    assert fill_value(f4, None, None) == 0 and fill_value(f4, None, None).dtype == f4.dtype
    assert fill_value(cmp_t, None, None).tobytes() == bytes(15)
    assert fill_value(parse_type(VSTR), None, None) is None
    with pytest.raises(FormatError):
        fill_value(f4, base64.b64encode(b"abc").decode(), "base64")
    with pytest.raises(FormatError):
        fill_value(parse_type("H5T_STD_U8LE"), 300, None)
    sub = parse_type({"class": "H5T_ARRAY", "dims": [3], "base": "H5T_STD_I16LE"})
    assert fill_value(sub, [4, 4, 4], None) == 4  # broadcasts to one element
    assert list(fill_value(sub, [1, 2, 3], None)) == [1, 2, 3]
    vs = parse_type(VSTR)
    assert fill_value(vs, "dflt", None) == "dflt"
    assert fill_value(vs, base64.b64encode(b"\x02\x00\x00\x00hi").decode(), "base64") == "hi"

    assert attribute_value(f4, None, None, None) is None
    assert attribute_value(f4, (), 1.5, None) == 1.5
    assert same(attribute_value(f4, (2, 2), [[1, "Infinity"], ["-inf", "nan"]], None),
                [[1.0, math.inf], [-math.inf, math.nan]])
    raw = base64.b64encode(np.arange(4, dtype="<f4").tobytes()).decode()
    assert attribute_value(f4, (2, 2), raw, "base64") == [[0.0, 1.0], [2.0, 3.0]]
    assert attribute_value(cmp_t, (), [1, 2.0, "x"], None) == [1, 2.0, "x"]
    vstream = b"".join(struct.pack("<i", len(s)) + s for s in (b"a", "é".encode(), b""))
    assert attribute_value(vs, (3,), base64.b64encode(vstream).decode(), "base64") == [
        "a", "é", ""]
    ref_t = parse_type({"class": "H5T_REFERENCE", "base": "H5T_STD_REF_OBJ"})
    assert attribute_value(ref_t, (2,), ["groups/g-02cd0518-2c584e72-8a45-8d90a4-d0c6fa", ""],
                           None) == [ObjectRef(obj_id="g-02cd0518-2c584e72-8a45-8d90a4-d0c6fa"),
                                     None]
    opaque = parse_type({"class": "H5T_OPAQUE", "size": 3})
    assert attribute_value(opaque, (2,), ["AAH/", ""], None) == [b"\x00\x01\xff", b"\0\0\0"]
    fixed = parse_type({"class": "H5T_STRING", "length": 2})
    raw = base64.b64encode(b"\xff\xfeok").decode()
    assert attribute_value(fixed, (2,), raw, "base64") == [b"\xff\xfe", "ok"]
    for bad in ([1, 2], "x"):
        with pytest.raises(FormatError):
            attribute_value(f4, (3,), bad, None)
    with pytest.raises(FormatError):
        attribute_value(f4, (3,), raw, "rot13")


def _spec(tj: Any, chunks: tuple[int, ...], filters: list[dict[str, Any]] | None = None
          ) -> ChunkSpec:
    t = parse_type(tj)
    return ChunkSpec(htype=t, etype=element_type(tj, t), chunks=chunks,
                     plan=filter_plan(filters))


def test_filter_plan() -> None:
    assert filter_plan(None) == FilterPlan()
    plan = filter_plan([{"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "shuffle"},
                        {"class": "H5Z_FILTER_DEFLATE", "id": 1, "name": "gzip", "level": 4},
                        {"class": "H5Z_FILTER_FLETCHER32", "id": 3}])
    assert plan == FilterPlan(compressed=True, deflate=True, shuffle=True)
    assert filter_plan([BITSHUFFLE]).bitshuffle
    assert filter_plan([{"id": 32008}]).bitshuffle
    assert filter_plan([{"class": "H5Z_FILTER_USER", "id": 32015}]).compressed
    assert "31999" in (filter_plan([{"class": "H5Z_FILTER_USER", "id": 31999}]).unknown or "")
    assert filter_plan([{"class": "H5Z_FILTER_SZIP", "id": 4}]).unknown
    with pytest.raises(FormatError):
        filter_plan({"class": "H5Z_FILTER_DEFLATE"})


def test_decode_chunk_variants() -> None:
    data = np.arange(100, dtype="<i4")
    gzip = [{"class": "H5Z_FILTER_DEFLATE", "id": 1}]
    shuffle = [{"class": "H5Z_FILTER_SHUFFLE", "id": 2}]
    plain = _spec("H5T_STD_I32LE", (100,))
    assert decode_chunk(data.tobytes(), plain, "k") == data.tobytes()
    # HSDS 1.0.2: a Blosc frame (gzip is cname zlib), typesize 1
    frame = numcodecs.Blosc(cname="zlib", clevel=4, shuffle=1).encode(data.tobytes())
    assert decode_chunk(bytes(frame), _spec("H5T_STD_I32LE", (100,), shuffle + gzip), "k") == \
        data.tobytes()
    # older servers: raw zlib of byte-shuffled data
    shuffled = numcodecs.Shuffle(4).encode(data.tobytes())
    assert decode_chunk(zlib.compress(bytes(shuffled)),
                        _spec("H5T_STD_I32LE", (100,), shuffle + gzip), "k") == data.tobytes()
    # shuffle without a compressor: HSDS 1.0.2 stores the bytes as they are
    assert decode_chunk(data.tobytes(), _spec("H5T_STD_I32LE", (100,), shuffle), "k") == \
        data.tobytes()
    with pytest.raises(Corrupt, match="Blosc"):
        decode_chunk(bytes(frame)[:-3], _spec("H5T_STD_I32LE", (100,), gzip), "k")
    with pytest.raises(Corrupt, match="zlib"):
        decode_chunk(b"\x78\x9cgarbage", _spec("H5T_STD_I32LE", (100,), gzip), "k")
    with pytest.raises(Corrupt, match="expected 400"):
        decode_chunk(data.tobytes()[:-4], plain, "k")
    with pytest.raises(Corrupt, match="holds 396"):
        decode_chunk(bytes(numcodecs.Blosc().encode(data.tobytes()[:-4])),
                     _spec("H5T_STD_I32LE", (100,), gzip), "k")


def test_decode_bitshuffle_as_hsds_writes_it() -> None:
    bitshuffle = pytest.importorskip("bitshuffle")
    data = np.arange(3000, dtype="<i4")
    body = bitshuffle.compress_lz4(data, 2048).tobytes()
    stream = (12000).to_bytes(8, "big") + (2048 * 4).to_bytes(4, "big") + body
    spec = _spec("H5T_STD_I32LE", (3000,), [BITSHUFFLE])
    assert decode_chunk(stream, spec, "k") == data.tobytes()
    lz4 = [BITSHUFFLE, {"class": "H5Z_FILTER_LZ4", "id": 32004}]
    framed = bytes(numcodecs.Blosc(cname="lz4").encode(stream))
    assert decode_chunk(framed, _spec("H5T_STD_I32LE", (3000,), lz4), "k") == data.tobytes()
    # not applied (HSDS 1.0.2 with class H5Z_FILTER_BITSHUFFLE): raw bytes
    assert decode_chunk(data.tobytes(), spec, "k") == data.tobytes()
    with pytest.raises(Corrupt, match="bitshuffle"):
        decode_chunk((11996).to_bytes(8, "big") + stream[8:], spec, "k")
    with pytest.raises(Corrupt, match="bitshuffle"):
        decode_chunk(stream[:12] + b"\0" * 40, spec, "k")


def test_decode_vlen_chunks() -> None:
    items = [b"a", "bé".encode(), b"", b"longer"]
    stream = b"".join(struct.pack("<i", len(s)) + s for s in items)
    spec = _spec(VSTR, (2, 2))
    out = decode_chunk(stream, spec, "k")
    assert list(numcodecs.VLenUTF8().decode(out)) == ["a", "bé", "", "longer"]
    gz = _spec(VSTR, (2, 2), [{"class": "H5Z_FILTER_DEFLATE", "id": 1}])
    assert decode_chunk(bytes(numcodecs.Blosc(cname="zlib").encode(stream)), gz, "k") == out
    with pytest.raises(Corrupt, match="variable-length"):
        decode_chunk(stream[:-2], spec, "k")
    with pytest.raises(Corrupt, match="unexpected bytes"):
        decode_chunk(stream + b"\0", spec, "k")
    with pytest.raises(Corrupt):
        decode_chunk(struct.pack("<i", -5) + stream[4:], spec, "k")

    seqs = [np.array([1, 2, 3], ">i2"), np.array([], ">i2")]
    stream = b"".join(struct.pack("<i", s.nbytes) + s.tobytes() for s in seqs)
    spec = _spec({"class": "H5T_VLEN", "base": "H5T_STD_I16BE"}, (2,))
    got = numcodecs.VLenArray(">i2").decode(decode_chunk(stream, spec, "k"))
    assert [list(g) for g in got] == [[1, 2, 3], []]
    with pytest.raises(Corrupt, match="whole"):
        decode_chunk(struct.pack("<i", 3) + b"abc" + struct.pack("<i", 0), spec, "k")

    tj = {"class": "H5T_COMPOUND", "fields": [
        {"name": "n", "type": "H5T_STD_I32LE"},
        {"name": "v", "type": {"class": "H5T_VLEN", "base": "H5T_IEEE_F64LE"}},
        {"name": "r", "type": {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_OBJ"}},
        {"name": "o", "type": {"class": "H5T_OPAQUE", "size": 2}},
        {"name": "s", "type": VSTR}]}
    ref = b"g-02cd0518-2c584e72-8a45-8d90a4-d0c6fa".ljust(48, b"\0")
    stream = (struct.pack("<i", 7) + struct.pack("<i", 16) + np.array([1.5, np.nan]).tobytes()
              + ref + b"\x00\xff" + struct.pack("<i", 2) + b"hi")
    out = decode_chunk(stream, _spec(tj, ()), "k")
    assert same(numcodecs.JSON().decode(out).reshape(-1)[0],
                [7, [1.5, math.nan], "g-02cd0518-2c584e72-8a45-8d90a4-d0c6fa",
                 {"base64": "AP8="}, "hi"])


def test_unknown_filter_and_empty_chunk_rules() -> None:
    spec = _spec("H5T_STD_I32LE", (4,), [{"class": "H5Z_FILTER_USER", "id": 31999,
                                          "name": "mystery"}])
    with pytest.raises(Corrupt, match="mystery"):
        decode_chunk(bytes(16), spec, "some/key")
