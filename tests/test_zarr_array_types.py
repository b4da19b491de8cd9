"""Datasets of HDF5 array element type (``H5T_ARRAY``) read through the mount as Zarr v2.

docs/CONTRACT.md, "Zarr metadata": such a dataset's ``.zarray`` has the
array's dims appended to ``shape`` and ``chunks`` and the base type as dtype,
as h5py and NumPy read it; the chunk bytes are the same.

hsload (h5pyd 1.0.0) cannot load a dataset of array type (it crashes on the
fill value, see ``tests/h5files.py``) and lindi 0.4.6 refuses to write one
("Not yet implemented"), so the ``array_bucket`` fixture writes the HDF5 file
with h5py and makes the same datasets in a real HSDS 1.0.2 through its REST
API, writing h5py's bytes as the dataset values (only part of some, the rest
reading as the fill value, which h5py's file holds written out). The bucket
is then mounted with the real daemon and read with ``zarr``, ``xarray`` and
``numpy.load``; every answer is compared with h5py's reading of the file.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from tests.hsds_server import ADMIN_PASSWORD, ADMIN_USER, HsdsServer, hsds_node_available
from tests.mounting import fuse_available, mounted

pytestmark = [
    pytest.mark.mount,
    pytest.mark.hsds,
    pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available())),
    pytest.mark.skipif(not hsds_node_available(), reason="hsds-node not installed"),
]

DOMAIN = "/home/admin/arrays.h5"
BUCKET = "arraytypes"

#: A compound base type for an array of records.
RECORD = np.dtype([("a", "<i2"), ("b", "S3")])
RECORD_JSON = {"class": "H5T_COMPOUND", "fields": [
    {"name": "a", "type": "H5T_STD_I16LE"},
    {"name": "b", "type": {"class": "H5T_STRING", "charSet": "H5T_CSET_ASCII", "length": 3,
                           "strPad": "H5T_STR_NULLPAD"}}]}


def _array_json(dims: list[int], base: Any) -> dict[str, Any]:
    return {"class": "H5T_ARRAY", "dims": dims, "base": base}


#: ``Case.written`` of a dataset HSDS stores no chunk of.
NOTHING: tuple[slice, ...] = ()


@dataclass(frozen=True)
class Case:
    """One dataset of the file and of the HSDS domain.

    ``values`` is the whole array as h5py reads it (dataspace shape plus the
    array dims, base dtype). HSDS gets only ``written`` of it (a box of the
    dataspace; None: all; ``NOTHING``: none) and ``fill`` (one element,
    stored as ``fill_json`` or base64); h5py's file gets all of ``values``,
    so it reads what HSDS should read where nothing was written. HSDS 1.0.2
    stores no chunk of an array-typed dataset with a fill value (its data
    node fails on ``if fill_value:`` of an array), so only datasets with
    nothing written have one; nor of a nested array type (it cannot shape
    the values, binary or JSON), so that one is all fill.
    """

    path: str
    htype: Any  # HSDS type JSON
    dtype: np.dtype  # the element type as h5py has it
    shape: tuple[int, ...]
    chunks: tuple[int, ...] | None  # None: scalar, no layout
    values: np.ndarray
    written: tuple[slice, ...] | None = None
    fill: np.ndarray | None = None
    fill_json: Any = None
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> np.dtype:
        return self.values.dtype

    @property
    def dims(self) -> tuple[int, ...]:
        return self.values.shape[len(self.shape):]


def _cases() -> list[Case]:
    rng = np.random.default_rng(11)
    vec = np.arange(70, dtype="<f8").reshape(7, 10) / 4 - 3
    vec[2, 5] = np.nan
    grid = np.zeros((5, 4, 2, 3), dtype=">i4")
    grid[0:2, 0:4] = rng.integers(-2**31, 2**31, (2, 4, 2, 3), dtype="<i4")
    strings = np.zeros((6, 3), dtype="S4")
    strings[0:4] = [[b"a", b"bb", b"ccc"], [b"dddd", b"", b"e"], [b"f", b"g", b"h"],
                    [b"i", b"jj", b"kkk"]]
    records = np.array([[(i, b"x%d" % i), (-i, b"y")] for i in range(5)], dtype=RECORD)
    text4 = {"class": "H5T_STRING", "charSet": "H5T_CSET_ASCII", "length": 4,
             "strPad": "H5T_STR_NULLPAD"}
    return [
        Case("/vec", _array_json([10], "H5T_IEEE_F64LE"), np.dtype(("<f8", (10,))), (7,), (3,),
             vec),
        Case("/grid", _array_json([2, 3], "H5T_STD_I32BE"), np.dtype((">i4", (2, 3))), (5, 4),
             (2, 3), grid, written=(slice(0, 2), slice(0, 4))),
        Case("/grid_fill", _array_json([2, 3], "H5T_STD_I32BE"), np.dtype((">i4", (2, 3))),
             (3, 2), (2, 2), np.full((3, 2, 2, 3), -7, ">i4"), written=NOTHING,
             fill=np.full((2, 3), -7, ">i4"), fill_json=[[-7, -7, -7], [-7, -7, -7]]),
        Case("/scalar", _array_json([4], "H5T_IEEE_F32LE"), np.dtype(("<f4", (4,))), (), None,
             np.array([1.5, -2, 3, np.nan], dtype="<f4")),
        Case("/scalar2d", _array_json([2, 3], "H5T_STD_U16BE"), np.dtype((">u2", (2, 3))), (),
             None, (np.arange(6).reshape(2, 3) * 1000).astype(">u2")),
        Case("/strings", _array_json([3], text4), np.dtype(("S4", (3,))), (6,), (4,), strings,
             written=(slice(0, 4),)),
        Case("/strings_fill", _array_json([3], text4), np.dtype(("S4", (3,))), (5,), (2,),
             np.full((5, 3), b"??", "S4"), written=NOTHING, fill=np.full(3, b"??", "S4")),
        Case("/records", _array_json([2], RECORD_JSON), np.dtype((RECORD, (2,))), (5,), (2,),
             records),
        Case("/nested", _array_json([3], _array_json([2], "H5T_IEEE_F64BE")),
             np.dtype((np.dtype((">f8", (2,))), (3,))), (4,), (3,),
             np.full((4, 3, 2), 2.5, ">f8"), written=NOTHING, fill=np.full((3, 2), 2.5, ">f8")),
        Case("/uneven", _array_json([3], "H5T_STD_I16LE"), np.dtype(("<i2", (3,))), (4,), (2,),
             np.tile(np.array([1, 2, 3], "<i2"), (4, 1)), written=NOTHING,
             fill=np.array([1, 2, 3], "<i2")),
        Case("/nc/time", "H5T_STD_I32LE", np.dtype("<i4"), (5,), (5,),
             np.arange(5, dtype="<i4") * 10),
        Case("/nc/wind", _array_json([3], "H5T_IEEE_F32LE"), np.dtype(("<f4", (3,))), (5,),
             (2,), np.arange(15, dtype="<f4").reshape(5, 3) / 2),
        Case("/nc/origin", _array_json([2], "H5T_IEEE_F64LE"), np.dtype(("<f8", (2,))), (),
             None, np.array([52.5, 13.25], dtype="<f8")),
    ]


CASES = _cases()
BY_PATH = {case.path: case for case in CASES}
#: Array-typed datasets (all but the dimension scale).
ARRAY_CASES = [case for case in CASES if case.dims]
#: Their fill value's items are not all the same: no single Zarr fill value.
NO_ZARRAY = {"/uneven"}
#: A compound whose field is an array: Zarr v2 gives the field a shape.
FIELDED = np.dtype([("id", "<u2"), ("v", "<f4", (3,))])


def _write_h5(path: Path) -> None:
    """The reference file: every case's whole ``values``, plus the netCDF-like scales."""
    with h5py.File(path, "w") as f:
        for case in CASES:
            if case.path == "/nested":  # h5py writes nested array types only at low level
                tid = h5py.h5t.array_create(h5py.h5t.array_create(h5py.h5t.IEEE_F64BE, (2,)),
                                            (3,))
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_chunk(case.chunks)
                h5py.h5d.create(f.id, b"nested", tid, h5py.h5s.create_simple(case.shape),
                                dcpl=dcpl)
                f["nested"].id.write(h5py.h5s.ALL, h5py.h5s.ALL, case.values, mtype=tid)
                continue
            ds = f.create_dataset(case.path, shape=case.shape, dtype=case.dtype,
                                  chunks=case.chunks)
            ds[()] = case.values
        f["nc/time"].make_scale("time")
        f["nc/wind"].dims[0].attach_scale(f["nc/time"])
        f.create_dataset("fielded", data=np.array([(1, (1, 2, 3)), (2, (4, 5, 6))],
                                                  dtype=FIELDED))


def _rest(server: HsdsServer) -> Any:
    import requests  # noqa: PLC0415  (comes with h5pyd; only this fixture needs it)

    session = requests.Session()
    session.auth = (ADMIN_USER, ADMIN_PASSWORD)
    session.trust_env = False

    def call(method: str, path: str, want: int, **kwargs: Any) -> Any:
        params = {"domain": DOMAIN, **kwargs.pop("params", {})}
        rsp = session.request(method, server.endpoint + path, params=params, timeout=60,
                              **kwargs)
        assert rsp.status_code == want, (method, path, rsp.status_code, rsp.text[:300])
        return rsp.json() if rsp.content else None

    return call


def _select(box: tuple[slice, ...]) -> str:
    return "[" + ",".join(f"{s.start}:{s.stop}" for s in box) + "]"


def _make_dataset(call: Any, parent: str, name: str, case: Case) -> str:
    """The case's dataset in HSDS, its values (or the written box of them) stored."""
    body: dict[str, Any] = {"type": case.htype, "link": {"id": parent, "name": name}}
    cprops: dict[str, Any] = {}
    if case.shape:
        body["shape"] = list(case.shape)
        cprops["layout"] = {"class": "H5D_CHUNKED", "dims": list(case.chunks or ())}
    if case.fill_json is not None:
        cprops["fillValue"] = case.fill_json
    elif case.fill is not None:
        cprops["fillValue"] = base64.b64encode(case.fill.tobytes()).decode()
        cprops["fillValue_encoding"] = "base64"
    if cprops:
        body["creationProperties"] = cprops
    did = call("POST", "/datasets", 201, json=body)["id"]
    box = case.written
    if box == NOTHING:
        return did
    data = case.values if box is None else case.values[box]
    params = {"select": _select(box)} if box is not None else {}
    call("PUT", f"/datasets/{did}/value", 200, params=params,
         data=np.ascontiguousarray(data).tobytes(),
         headers={"Content-Type": "application/octet-stream"})
    return did


def _load_hsds(server: HsdsServer) -> None:
    """The cases made in HSDS through its REST API, with the scale's attributes."""
    server.ensure_folder("/home/")
    server.ensure_folder("/home/admin/", owner=ADMIN_USER)
    call = _rest(server)
    call("PUT", "/", 201)
    root = call("GET", "/", 200)["root"]
    nc = call("POST", "/groups", 201, json={"link": {"id": root, "name": "nc"}})["id"]
    ids = {}
    for case in CASES:
        parent, name = (nc, case.path[4:]) if case.path.startswith("/nc/") else \
            (root, case.path[1:])
        ids[case.path] = _make_dataset(call, parent, name, case)
    fielded = call("POST", "/datasets", 201, json={
        "type": {"class": "H5T_COMPOUND", "fields": [
            {"name": "id", "type": "H5T_STD_U16LE"},
            {"name": "v", "type": _array_json([3], "H5T_IEEE_F32LE")}]},
        "shape": [2], "link": {"id": root, "name": "fielded"}})["id"]
    call("PUT", f"/datasets/{fielded}/value", 200,
         data=np.array([(1, (1, 2, 3)), (2, (4, 5, 6))], dtype=FIELDED).tobytes(),
         headers={"Content-Type": "application/octet-stream"})
    text = {"class": "H5T_STRING", "charSet": "H5T_CSET_ASCII", "length": 16,
            "strPad": "H5T_STR_NULLTERM"}
    call("PUT", f"/datasets/{ids['/nc/time']}/attributes/CLASS", 201,
         json={"type": text, "shape": "H5S_SCALAR", "value": "DIMENSION_SCALE"})
    call("PUT", f"/datasets/{ids['/nc/time']}/attributes/NAME", 201,
         json={"type": text, "shape": "H5S_SCALAR", "value": "time"})
    call("PUT", f"/datasets/{ids['/nc/wind']}/attributes/DIMENSION_LIST", 201, json={
        "type": {"class": "H5T_VLEN",
                 "base": {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_OBJ"}},
        "shape": [1], "value": [[f"datasets/{ids['/nc/time']}"]]})
    server.flush(DOMAIN)


@dataclass(frozen=True)
class ArrayMount:
    root: Path  # the domain's directory in the mount
    h5file: Path  # the reference file


@pytest.fixture(scope="module")
def array_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArrayMount]:
    """The array-typed datasets in a real HSDS bucket (HSDS stopped), mounted."""
    base = tmp_path_factory.mktemp("arraytypes")
    h5file = base / "arrays.h5"
    _write_h5(h5file)
    with HsdsServer(base / "root", BUCKET, log_dir=base / "logs") as server:
        _load_hsds(server)
    with mounted(base / "root" / BUCKET, base / "mnt") as mp:
        yield ArrayMount(mp / DOMAIN.strip("/"), h5file)


def zarray_of(mount: ArrayMount, case: Case) -> dict[str, Any]:
    return json.loads((mount.root / case.path.lstrip("/") / ".zarray").read_text())


def open_zarr(mount: ArrayMount, case: Case) -> Any:
    zarr = pytest.importorskip("zarr")
    kwargs = {"zarr_format": 2} if int(zarr.__version__.split(".")[0]) >= 3 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "X.json is not a Zarr component"
        return zarr.open_array(str(mount.root / case.path.lstrip("/")), mode="r", **kwargs)


def h5_values(mount: ArrayMount, path: str) -> np.ndarray:
    with h5py.File(mount.h5file, "r") as f:
        return np.asarray(f[path][()])


def assert_same(actual: np.ndarray, expected: np.ndarray, where: Any) -> None:
    """Same shape, dtype (byte order included) and values (NaN equal to NaN)."""
    assert actual.shape == expected.shape, (where, actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (where, actual.dtype, expected.dtype)
    if actual.dtype.names is None:
        np.testing.assert_array_equal(actual, expected, err_msg=str(where))
    assert actual.tobytes() == expected.tobytes(), where


def zarr_dtype(dtype: np.dtype) -> Any:
    """A dtype as the Zarr v2 spec writes it (``descr`` for structured ones)."""
    if dtype.names is not None:
        return [list(item) for item in dtype.descr]
    return dtype.str


# --------------------------------------------------------------------------- tests


def test_reference_file_reads_as_the_cases(array_mount: ArrayMount) -> None:
    """h5py reads each array-typed dataset as the dataspace shape plus the array
    dims, in the base dtype (nested arrays flattened): what the mount must show."""
    for case in CASES:
        assert_same(h5_values(array_mount, case.path), case.values, case.path)


@pytest.mark.parametrize("case", [c for c in ARRAY_CASES if c.path not in NO_ZARRAY],
                         ids=lambda c: c.path)
def test_zarray_appends_array_dims(array_mount: ArrayMount, case: Case) -> None:
    zarray = zarray_of(array_mount, case)
    assert zarray["shape"] == [*case.shape, *case.dims]
    assert zarray["chunks"] == [*(case.chunks or ()), *case.dims]
    assert zarray["dtype"] == zarr_dtype(case.base)
    assert np.dtype(zarray["dtype"] if isinstance(zarray["dtype"], str)
                    else [tuple(f) for f in zarray["dtype"]]) == case.base
    fill = case.fill.reshape(-1)[:1] if case.fill is not None else np.zeros(1, case.base)
    if case.base.kind in "SV":  # strings, opaque and compound: base64 of the bytes
        assert base64.b64decode(zarray["fill_value"]) == fill.tobytes()
    else:
        assert zarray["fill_value"] == fill[0].item()
    assert zarray["compressor"] is None and zarray["filters"] is None
    assert (zarray["order"], zarray["dimension_separator"]) == ("C", ".")


@pytest.mark.parametrize("case", [c for c in ARRAY_CASES if c.path not in NO_ZARRAY],
                         ids=lambda c: c.path)
def test_chunk_files_are_zarr_keys(array_mount: ArrayMount, case: Case) -> None:
    """The chunk files are named by the Zarr v2 grid index (a 0 per array dim)
    and hold prod(chunks) items of the base type, array dims included."""
    directory = array_mount.root / case.path.lstrip("/")
    zarray = zarray_of(array_mount, case)
    names = sorted(n for n in os.listdir(directory) if not n.startswith("."))
    box = tuple(slice(0, n) for n in case.shape) if case.written is None else case.written
    if case.chunks is None:
        stored: list[tuple[int, ...]] = [()]
    elif box == NOTHING:
        stored = []
    else:
        stored = list(itertools.product(*(range(s.start // c, -(-s.stop // c))
                                          for s, c in zip(box, case.chunks, strict=True))))
    expected = {".".join(str(i) for i in (*index, *(0,) * len(case.dims))) for index in stored}
    assert set(names) == expected, (case.path, names)
    size = math.prod(zarray["chunks"]) * case.base.itemsize
    for name in names:
        assert os.stat(directory / name).st_size == size, (case.path, name)
        assert len((directory / name).read_bytes()) == size, (case.path, name)
    for index in stored:  # the stored index is no second name of the chunk
        as_stored = ".".join(str(i) for i in index or (0,))
        if as_stored not in expected:
            assert not (directory / as_stored).exists(), (case.path, as_stored)


@pytest.mark.parametrize("case", [c for c in ARRAY_CASES if c.path not in NO_ZARRAY],
                         ids=lambda c: c.path)
def test_zarr_reads_as_h5py(array_mount: ArrayMount, case: Case) -> None:
    """zarr.open_array of the dataset directory equals h5py: shape, dtype, values;
    unwritten chunks read as the fill value."""
    array = open_zarr(array_mount, case)
    expected = h5_values(array_mount, case.path)
    assert tuple(array.shape) == expected.shape
    assert_same(np.asarray(array[...]), expected, case.path)
    if case.shape and case.shape[0] > 1:
        assert_same(np.asarray(array[1:, ...]), expected[1:], (case.path, "1:"))


#: Known ``.npy`` faults outside this module's reach, by case.
@pytest.mark.parametrize("case", ARRAY_CASES, ids=lambda c: c.path)
def test_npy_matches_zarr_and_h5py(array_mount: ArrayMount, case: Case) -> None:
    """``P.npy`` declares the same dtype and shape as ``.zarray`` and holds h5py's values."""
    loaded = np.load(array_mount.root / f"{case.path.lstrip('/')}.npy", mmap_mode="r")
    assert_same(np.asarray(loaded), h5_values(array_mount, case.path), case.path)
    if case.path not in NO_ZARRAY:
        zarray = zarray_of(array_mount, case)
        assert list(loaded.shape) == zarray["shape"]
        assert zarr_dtype(loaded.dtype) == zarray["dtype"]


def test_uneven_fill_has_no_zarray(array_mount: ArrayMount) -> None:
    """Zarr has one fill value per array: a sub-array fill whose items differ
    cannot be described, so that dataset has no ``.zarray`` (its chunks stay)."""
    directory = array_mount.root / "uneven"
    assert not (directory / ".zarray").exists()
    assert ".zarray" not in os.listdir(directory)
    assert (directory / ".zattrs").exists()
    assert [n for n in os.listdir(directory) if not n.startswith(".")] == []


def test_compound_with_array_field_keeps_the_field_shape(array_mount: ArrayMount) -> None:
    """A compound with an array-typed field is not a sub-array type: the field
    keeps its shape in the structured dtype, as the Zarr v2 spec allows."""
    zarray = json.loads((array_mount.root / "fielded" / ".zarray").read_text())
    assert zarray["shape"] == [2] and zarray["chunks"] == [2]
    assert zarray["dtype"] == [["id", "<u2"], ["v", "<f4", [3]]]
    assert np.dtype([tuple(f) for f in zarray["dtype"]]) == FIELDED
    assert (array_mount.root / "fielded" / "0").stat().st_size == 2 * FIELDED.itemsize


def test_zattrs_name_the_array_dims(array_mount: ArrayMount) -> None:
    """``_ARRAY_DIMENSIONS`` has a name for each Zarr dimension: the scales' names,
    then ``NAME_dim_K`` for the array dims."""
    def dims(path: str) -> Any:
        zattrs = json.loads((array_mount.root / path / ".zattrs").read_text())
        return zattrs.get("_ARRAY_DIMENSIONS")

    assert dims("nc/wind") == ["time", "wind_dim_0"]
    assert dims("nc/origin") == ["origin_dim_0"]
    assert dims("nc/time") == ["time"]
    assert dims("scalar2d") == ["scalar2d_dim_0", "scalar2d_dim_1"]
    assert dims("vec") is None  # no dimension scale names its first dimension


def test_xarray_reads_array_dims(array_mount: ArrayMount) -> None:
    """xarray opens the netCDF-like group: the array dims are dimensions of their own."""
    xr = pytest.importorskip("xarray")
    zarr = pytest.importorskip("zarr")
    kwargs = {"zarr_format": 2} if int(zarr.__version__.split(".")[0]) >= 3 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        # Raw values: xarray would mask the fill value 0 (the zarr fill_value) as NaN.
        view = xr.open_zarr(str(array_mount.root / "nc"), consolidated=False,
                            mask_and_scale=False, **kwargs).load()
    assert dict(view.sizes) == {"time": 5, "wind_dim_0": 3, "origin_dim_0": 2}
    assert view["wind"].dims == ("time", "wind_dim_0")
    assert view["origin"].dims == ("origin_dim_0",)
    for name in ("wind", "origin"):
        expected = h5_values(array_mount, f"/nc/{name}")
        assert_same(view[name].values, expected, name)
    np.testing.assert_array_equal(view.coords["time"].values, BY_PATH["/nc/time"].values)
