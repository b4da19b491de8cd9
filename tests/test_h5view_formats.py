"""The HDF5 file views (``D.h5``, ``.root.h5``) read by netCDF, HDF5 and h5py tools.

h5mount shows each HSDS domain ``D`` also as one HDF5 file ``D.h5`` beside
its directory, and a mount of one file as ``MOUNTPOINT/.root.h5``
(``mountd/tree/h5view.py``, ``layouts/hdf5/_image.py``). This module opens those
views with real readers, no fakes, and compares them with the original HDF5
files opened the same way:

* netCDF: ``home/admin/netcdf.h5.h5`` of the session's HSDS bucket, read with
  ``netCDF4.Dataset`` and with xarray (engines ``h5netcdf`` and ``netcdf4``,
  decoded and raw), equals the netCDF-4 file that was hsloaded there:
  dimensions (names, sizes, unlimited), variables (names, dimensions, dtypes,
  values, attributes, CF ones included) and global attributes. The session
  file has no unlimited dimension, so a second netCDF-4 file with a record
  dimension (and fixed-length string fill values) is hsloaded into an HSDS of
  this module's own (``write_records_netcdf``);
* LINDI: each test file lindi 0.4.6 can describe (``LINDI_FILES``; why it
  refuses the others is ``LINDI_REFUSES``), written as a LINDI JSON reference
  file by real lindi and mounted by the real daemon: ``.root.h5`` has an exact
  ``st_size``, ``h5dump`` and ``h5ls -r`` (hdf5-tools) read it, and h5py reads
  from it every object, link, dataset (dtype, shape, values, fill value) and
  attribute that h5py reads from the original; ``-o h5view=off`` removes the
  view (also the HSDS one);
* copies: ``cp``, ``tar`` and ``rsync`` of a view, on a fresh mount whose first
  look at it is a directory listing, give exactly the bytes ``open().read()``
  gives (they trust ``st_size``).

A difference that the source format causes, not the view, is a named
exception (``LINDI_*``), each checked against what the mount's own sidecar
says.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401 - registers Blosc, so h5py reads refs.h5's originals
import netCDF4
import numpy as np
import pytest
import xarray as xr

from layouts.formats.hsds._ids import parse_id
from tests import h5files
from tests.conftest import HsdsBucket
from tests.h5compare import LinkInfo, mount_file, walk_links
from tests.hsds_server import HsdsServer, hsds_node_available
from tests.lindi_files import lindi_available, write_lindi
from tests.mounting import fuse_available, mounted

pytestmark = [pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

#: The view of a mount of one file, at the mount's root.
ROOT_H5 = ".root.h5"
#: The suffix of a domain's view: ``D`` shows ``D.h5`` beside it.
VIEW_SUFFIX = ".h5"
#: The root attribute in which a view lists what it left out.
LEFT_OUT_ATTR = "h5mount_left_out"
#: The first 8 bytes of every HDF5 file (at offset 0 when there is no user block).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"

#: The domain the session bucket hsloads ``tests/h5files.write_netcdf``'s file to.
NETCDF_DOMAIN = "home/admin/netcdf.h5"
#: The bucket and domain of this module's own HSDS (``write_records_netcdf``'s file).
RECORDS_BUCKET = "h5viewrec"
RECORDS_DOMAIN = "home/admin/records.nc"

#: Test files (``tests/h5files.py``) that lindi 0.4.6 writes a LINDI file of.
LINDI_FILES = ("extlink_target.h5", "filters.h5", "layout.h5", "refs.h5", "zcompress.h5")
#: The other test files: lindi 0.4.6 refuses each as a whole, for one object
#: (what it says is checked by ``test_lindi_still_refuses_the_other_files``).
LINDI_REFUSES = {
    "types.h5": "Cannot serialize item",  # /compound/array_field: an array-typed field
    "attrs.h5": "Unexpected dtype for attribute",  # the compound attribute "compound"
    "netcdf.h5": "Unexpected dtype for attribute",  # REFERENCE_LIST: compound of ref, uint32
    "links.h5": "component not found",  # the dangling soft link /dangling
    "plugins.h5": "bitshuffle compression - not supported",  # /bitshuffle
}

#: Named exception: lindi writes zarr's default fill value (0) for a dataset it
#: inlines as one chunk with the fill already applied (the same list as
#: ``tests/test_mount_refs.LINDI_FILL_LOST``), so the mount, and with it the
#: view, has 0. The data is unchanged. Checked: the sidecar says 0 too.
LINDI_FILL_LOST = {("layout.h5", "/fill_int"), ("layout.h5", "/fill_nan"),
                   ("layout.h5", "/fill_compound")}
#: Named exception: a LINDI file does not record ``maxshape`` (zarr has none),
#: so an extendible dataset is fixed-size in the mount and in the view.
#: Checked: the sidecar's ``maxshape`` equals the shape.
LINDI_MAXSHAPE_LOST = {("layout.h5", "/resizable"), ("layout.h5", "/unlimited_2d"),
                       ("layout.h5", "/zero_size_unlimited")}
#: Named exception: a LINDI file keeps attributes as JSON values, without
#: their HDF5 type, so the view stores a number as the 64-bit type of its kind
#: (``layouts.hdf5._image.infer``): refs.h5's int32 ``version`` and float32 ``nan``
#: come back as int64 and float64. Checked: the sidecar holds a bare JSON number.
LINDI_ATTR_WIDTH = {("refs.h5", "/", "version"), ("refs.h5", "/", "nan")}


# --------------------------------------------------------------------------- comparing values


def same_value(a: Any, b: Any) -> bool:
    """True if ``a`` and ``b`` are of one type (and dtype and shape) and equal,
    NaNs at the same places counting as equal."""
    if type(a) is not type(b):
        return False
    if isinstance(a, h5py.Empty):
        return a.dtype == b.dtype
    if isinstance(a, np.ndarray | np.generic):
        if a.dtype != b.dtype or np.shape(a) != np.shape(b):
            return False
        if isinstance(a, np.ma.MaskedArray) and \
                not np.array_equal(np.ma.getmaskarray(a), np.ma.getmaskarray(b)):
            return False
        try:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        except AssertionError:
            return False
        return True
    return bool(a == b)


def type_signature(dtype: np.dtype[Any]) -> tuple[Any, ...]:
    """What h5py tells of a dtype: the NumPy type and h5py's string, vlen,
    enum and reference metadata (``np.dtype ==`` ignores the metadata)."""
    string = h5py.check_string_dtype(dtype)
    return (dtype, string and (string.encoding, string.length), h5py.check_vlen_dtype(dtype),
            h5py.check_enum_dtype(dtype), h5py.check_ref_dtype(dtype))


# --------------------------------------------------------------------------- netCDF


def nc_variable(var: netCDF4.Variable) -> dict[str, Any]:
    var.set_auto_maskandscale(True)
    masked = var[...]
    var.set_auto_maskandscale(False)
    raw = var[...]
    return {
        "dimensions": var.dimensions,
        "dtype": var.dtype,
        "shape": var.shape,
        "attributes": [(name, var.getncattr(name)) for name in var.ncattrs()],
        "masked": masked,
        "raw": raw,
    }


def nc_describe(path: Path) -> dict[str, Any]:
    """Everything netCDF4-python tells of a file that the view must keep."""
    with netCDF4.Dataset(path) as nc:
        return {
            "data_model": nc.data_model,
            "groups": list(nc.groups),
            "dimensions": [(name, len(dim), dim.isunlimited())
                           for name, dim in nc.dimensions.items()],
            "attributes": [(name, nc.getncattr(name)) for name in nc.ncattrs()],
            "variable_names": list(nc.variables),
            "variables": {name: nc_variable(var) for name, var in nc.variables.items()},
        }


def nc_differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """What netCDF4 reads differently from the view (``got``) than from the original,
    orders aside (``nc_orders``): the same dimensions, in order, and variables and
    attributes of the same names, types and values."""
    problems = [f"{key}: {want[key]!r} in the original, {got[key]!r} in the view"
                for key in ("data_model", "groups", "dimensions")
                if want[key] != got[key]]
    if set(want["variables"]) != set(got["variables"]):
        problems.append(f"variables {sorted(want['variables'])} vs {sorted(got['variables'])}")
    problems += attribute_differences("global", want["attributes"], got["attributes"])
    for name, var in want["variables"].items():
        other = got["variables"].get(name)
        if other is None:
            continue
        for key in ("dimensions", "dtype", "shape"):
            if var[key] != other[key]:
                problems.append(f"{name}: {key} {var[key]!r} vs {other[key]!r}")
        problems += attribute_differences(name, var["attributes"], other["attributes"])
        for key in ("masked", "raw"):
            if not same_value(var[key], other[key]):
                problems.append(f"{name}: {key} values {var[key]!r} vs {other[key]!r}")
    return problems


def attribute_differences(where: str, want: list[tuple[str, Any]],
                          got: list[tuple[str, Any]]) -> list[str]:
    """Attributes (name, value), in any order: the same names, types and values."""
    a, b = dict(want), dict(got)
    if a.keys() != b.keys():
        return [f"{where}: attributes {sorted(a)} vs {sorted(b)}"]
    return [f"{where}: attribute {name} = {a[name]!r} vs {b[name]!r}"
            for name in a if not same_value(a[name], b[name])]


def nc_orders(desc: dict[str, Any]) -> dict[str, list[str]]:
    """The orders netCDF lists things in: variables (``""``), global attributes
    (``"/"``) and each variable's attributes (by its name)."""
    orders = {"": desc["variable_names"], "/": [n for n, _ in desc["attributes"]]}
    orders |= {name: [n for n, _ in var["attributes"]]
               for name, var in desc["variables"].items()}
    return orders


def domain_sidecar(view: Path, h5path: str) -> dict[str, Any]:
    """The mount's sidecar of ``h5path`` in the domain whose view is ``view``."""
    domain_dir = view.with_name(view.name.removesuffix(VIEW_SUFFIX))
    if h5path == "/":
        return json.loads(domain_dir.with_name(f"{domain_dir.name}.json").read_text())
    return json.loads((domain_dir / mount_file(h5path, ".json")).read_text())


def hsds_link_order(bucket_dir: Path, domain: str) -> list[str]:
    """The links of ``domain``'s root group in the order HSDS made them (their
    ``created`` times in HSDS's own group JSON)."""
    root = json.loads((bucket_dir / domain / ".domain.json").read_text())["root"]
    links = json.loads((bucket_dir / parse_id(root).json_key()).read_text())["links"]
    return sorted(links, key=lambda name: links[name]["created"])


@pytest.fixture(scope="module")
def netcdf_pair(mnt: Path, hsds_bucket: HsdsBucket) -> tuple[Path, Path]:
    """(the netCDF-4 file hsloaded as ``NETCDF_DOMAIN``, its view on the mount)."""
    return hsds_bucket.files[NETCDF_DOMAIN], mnt / f"{NETCDF_DOMAIN}{VIEW_SUFFIX}"


@pytest.mark.mount
@pytest.mark.hsds
def test_netcdf4_reads_view_as_original(netcdf_pair: tuple[Path, Path],
                                        hsds_bucket: HsdsBucket) -> None:
    original, view = netcdf_pair
    want, got = nc_describe(original), nc_describe(view)
    # The comparison is not vacuous: the original is the netCDF file h5files wrote.
    assert [(n, size) for n, size, _ in want["dimensions"]] == list(h5files.NETCDF_DIMS.items())
    assert {n for n, _ in want["variables"]["temp"]["attributes"]} >= \
        {"_FillValue", "units", "long_name", "grid_mapping"}
    assert dict(want["variables"]["crs"]["attributes"]) == \
        {"grid_mapping_name": "latitude_longitude"}
    problems = nc_differences(want, got)
    assert not problems, "\n".join(problems)
    check_hsds_orders(hsds_bucket.bucket_dir, NETCDF_DOMAIN, view, want, got)


def check_hsds_orders(bucket_dir: Path, domain: str, view: Path, want: dict[str, Any],
                      got: dict[str, Any]) -> None:
    """The orders netCDF lists variables and attributes in: the original's where
    HSDS kept it, else the named exceptions, each checked against HSDS's record.

    HSDS_LINK_ORDER: hsload makes a group's links in name order (h5py lists them
    so), so HSDS's ``created`` times, and the view, put the variables in name
    order, not the original's creation order.

    HSDS_ATTRIBUTE_ORDER: HSDS keeps an object's attributes as a JSON object in
    the order their requests arrived (hsload sends them concurrently: the order
    changes from one load to the next; their ``created`` times keep the true
    one). The mount's sidecar lists them in that order, and so does the view.
    """
    want_orders, got_orders = nc_orders(want), nc_orders(got)
    made = [name for name in hsds_link_order(bucket_dir, domain) if name in want["variables"]]
    assert made == sorted(made)
    assert got_orders[""] == made, "variables are not in HSDS's order"
    for key, names in got_orders.items():
        if key == "":
            continue
        side = domain_sidecar(view, "/" + key.strip("/"))["attributes"]
        assert names == [n for n in side if n in names], f"{key or '/'}: not the sidecar's order"
        assert sorted(names) == sorted(want_orders[key])


#: Variable encodings the view must keep (the others, such as ``source``,
#: ``chunksizes``, ``contiguous`` or ``zlib``, describe the storage, which the
#: view changes on purpose: contiguous external storage on the mount's .npy).
XARRAY_ENCODING = ("dtype", "original_shape", "_FillValue", "missing_value", "units",
                   "calendar", "coordinates")


def check_xarray(original: Path, view: Path, engine: str, decode_cf: bool, *,
                 unlimited: bool = True) -> None:
    """xarray opens ``view`` as ``original``: identical, the same encodings (of
    ``XARRAY_ENCODING``) and, if ``unlimited``, the same unlimited dimensions."""
    with xr.open_dataset(original, engine=engine, decode_cf=decode_cf) as a, \
            xr.open_dataset(view, engine=engine, decode_cf=decode_cf) as b:
        a.load()
        b.load()
        xr.testing.assert_identical(b, a)
        for name in a.variables:
            want = {k: v for k, v in a[name].encoding.items() if k in XARRAY_ENCODING}
            got = {k: v for k, v in b[name].encoding.items() if k in XARRAY_ENCODING}
            assert want.keys() == got.keys(), name
            for key, value in want.items():
                assert same_value(value, got[key]), f"{name} encoding {key}"
        if unlimited:
            assert b.encoding.get("unlimited_dims") == a.encoding.get("unlimited_dims")


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.parametrize("decode_cf", [True, False], ids=["decoded", "raw"])
@pytest.mark.parametrize("engine", ["h5netcdf", "netcdf4"])
def test_xarray_reads_view_as_original(netcdf_pair: tuple[Path, Path], engine: str,
                                       decode_cf: bool) -> None:
    original, view = netcdf_pair
    check_xarray(original, view, engine, decode_cf)
    with xr.open_dataset(view, engine=engine, decode_cf=decode_cf) as b:
        # The CF attributes reached xarray (assert_identical compared them all).
        assert b["temp"].attrs["grid_mapping"] == "crs"
        assert b["temp"].attrs["units"] == "K"
        assert b.attrs["title"] == "h5mount netCDF4 test file"
        assert set(b.dims) == set(h5files.NETCDF_DIMS)


# --------------------------------------------------------------------------- LINDI


@dataclass(frozen=True)
class LindiView:
    """One test file, its LINDI JSON reference file, and the mount of that."""

    name: str
    original: Path
    reference: Path
    mount: Path

    @property
    def view(self) -> Path:
        return self.mount / ROOT_H5

    def sidecar(self, h5path: str) -> dict[str, Any]:
        """The mount's sidecar of the object at ``h5path``."""
        rel = ".root.json" if h5path == "/" else mount_file(h5path, ".json")
        return json.loads((self.mount / rel).read_text())


@pytest.fixture(scope="module")
def lindi_views(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LindiView]]:
    """Each of ``LINDI_FILES`` written by h5py, described by real lindi (a LINDI
    JSON file with local refs) and mounted by the daemon, for the module."""
    if not lindi_available():
        pytest.skip("lindi is not installed in .venv-lindi (run dev/setup)")
    base = tmp_path_factory.mktemp("h5view-lindi")
    (base / "src").mkdir()
    views: dict[str, LindiView] = {}
    with ExitStack() as stack:
        for name in LINDI_FILES:
            original = h5files.WRITERS[name](base / "src")
            reference = write_lindi("json", original, base / f"{name}.lindi.json")
            mp = stack.enter_context(mounted(reference, base / f"mnt-{name}"))
            views[name] = LindiView(name, original, reference, mp)
        yield views


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian hdf5-tools; run dev/setup)")
    return path


@pytest.mark.tools
def test_lindi_still_refuses_the_other_files(tmp_path: Path) -> None:
    """``LINDI_REFUSES`` stays true: lindi fails on each other file, for its reason."""
    assert set(LINDI_FILES) | set(LINDI_REFUSES) == set(h5files.WRITERS)
    for name, reason in LINDI_REFUSES.items():
        original = h5files.WRITERS[name](tmp_path)
        with pytest.raises(subprocess.CalledProcessError) as failed:
            write_lindi("json", original, tmp_path / f"{name}.lindi.json")
        assert reason in failed.value.stderr.decode(errors="replace"), name


@pytest.mark.mount
@pytest.mark.tools
@pytest.mark.parametrize("name", LINDI_FILES)
def test_lindi_root_h5_size_is_exact(name: str, lindi_views: dict[str, LindiView]) -> None:
    lv = lindi_views[name]
    listed = {entry.name: entry for entry in os.scandir(lv.mount)}
    assert ROOT_H5 in listed
    st = os.stat(lv.view)
    data = lv.view.read_bytes()
    assert data[:8] == HDF5_SIGNATURE
    assert st.st_size == len(data)
    with open(lv.view, "rb") as fh:
        assert os.fstat(fh.fileno()).st_size == len(data)
        fh.seek(len(data) // 2)
        assert fh.read() == data[len(data) // 2:]
    assert listed[ROOT_H5].stat().st_size == len(data)
    assert ROOT_H5 in os.listdir(lv.mount)


def h5ls_objects(path: Path) -> list[tuple[str, str]]:
    """(path, kind) of each line of ``h5ls -r`` (none of these files has a space in a
    name); a soft link's kind includes its target."""
    done = subprocess.run([need_tool("h5ls"), "-r", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stderr == "", f"h5ls -r {path}: {done.stderr}"
    out = []
    for line in done.stdout.splitlines():
        h5path, rest = line.split(None, 1)
        kind = rest if rest.startswith("Soft Link") else rest.split()[0]
        out.append((h5path, kind))
    return out


@pytest.mark.mount
@pytest.mark.tools
@pytest.mark.parametrize("name", LINDI_FILES)
def test_hdf5_tools_read_lindi_view(name: str, lindi_views: dict[str, LindiView]) -> None:
    lv = lindi_views[name]
    for args in ([], ["-p", "-H"]):
        done = subprocess.run([need_tool("h5dump"), *args, str(lv.view)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0 and done.stderr == "", \
            f"h5dump {args} exited {done.returncode}: {done.stderr[-2000:]}"
        assert "DATASET" in done.stdout
    # Every object and link of the original, of the same kind, and nothing else.
    assert h5ls_objects(lv.view) == h5ls_objects(lv.original)


def attrs_of(obj: h5py.HLObject) -> dict[str, tuple[np.dtype[Any], Any]]:
    return {name: (obj.attrs.get_id(name).dtype, obj.attrs[name]) for name in obj.attrs}


def attr_differences(lv: LindiView, h5path: str, a: h5py.HLObject,
                     b: h5py.HLObject) -> list[str]:
    want, got = attrs_of(a), attrs_of(b)
    if want.keys() != got.keys():
        left = got.get(LEFT_OUT_ATTR, (None, None))[1]
        return [f"{h5path}: attributes {sorted(want)} vs {sorted(got)}"
                + (f" ({LEFT_OUT_ATTR}: {left})" if left is not None else "")]
    problems = []
    for name, (dtype, value) in want.items():
        other_dtype, other = got[name]
        if type_signature(dtype) == type_signature(other_dtype) and same_value(value, other):
            continue
        if (lv.name, h5path, name) in LINDI_ATTR_WIDTH:
            stored = lv.sidecar(h5path)["attributes"][name]
            if isinstance(stored, int | float | str) and dtype.kind == other_dtype.kind \
                    and other_dtype.itemsize == 8 and \
                    same_value(np.asarray(value).astype(other_dtype)[()], other):
                continue
        problems.append(f"{h5path}: attribute {name} {dtype} {value!r} vs "
                        f"{other_dtype} {other!r}")
    return problems


def dataset_differences(lv: LindiView, h5path: str, a: h5py.Dataset,
                        b: h5py.Dataset) -> list[str]:
    problems = []
    if type_signature(a.dtype) != type_signature(b.dtype):
        problems.append(f"{h5path}: dtype {type_signature(a.dtype)} vs "
                        f"{type_signature(b.dtype)}")
    if not b.id.get_type().equal(a.id.get_type()):
        problems.append(f"{h5path}: the HDF5 types differ (H5Tequal)")
    if a.shape != b.shape:
        problems.append(f"{h5path}: shape {a.shape} vs {b.shape}")
        return problems
    if a.maxshape != b.maxshape and not (
            (lv.name, h5path) in LINDI_MAXSHAPE_LOST
            and b.maxshape == b.shape == tuple(lv.sidecar(h5path)["maxshape"])):
        problems.append(f"{h5path}: maxshape {a.maxshape} vs {b.maxshape}")
    if not same_value(a[()], b[()]):
        problems.append(f"{h5path}: values differ:\n{a[()]!r}\nvs\n{b[()]!r}")
    return problems


def link_differences(lv: LindiView, a: LinkInfo, b: LinkInfo) -> list[str]:
    """One link, and what it leads to, as h5py sees it in the original (``a``) and view."""
    if type(a.link) is not type(b.link):
        return [f"{a.path}: {type(a.link).__name__} vs {type(b.link).__name__}"]
    if isinstance(a.link, h5py.SoftLink):
        return [] if a.link.path == b.link.path else \
            [f"{a.path}: soft link to {a.link.path} vs {b.link.path}"]
    if isinstance(a.link, h5py.ExternalLink):
        return [f"{a.path}: an external link; no LINDI file here has one"]
    if type(a.obj) is not type(b.obj) or a.cycle_to != b.cycle_to:
        return [f"{a.path}: {type(a.obj).__name__} (cycle to {a.cycle_to}) vs "
                f"{type(b.obj).__name__} (cycle to {b.cycle_to})"]
    problems = attr_differences(lv, a.path, a.obj, b.obj)
    if isinstance(a.obj, h5py.Dataset):
        problems += dataset_differences(lv, a.path, a.obj, b.obj)
    elif isinstance(a.obj, h5py.Datatype) and \
            type_signature(a.obj.dtype) != type_signature(b.obj.dtype):
        problems.append(f"{a.path}: committed type {a.obj.dtype} vs {b.obj.dtype}")
    return problems


def h5py_differences(lv: LindiView) -> list[str]:
    """What h5py reads differently from the view than from the original."""
    with h5py.File(lv.original, "r") as a, h5py.File(lv.view, "r") as b:
        problems = attr_differences(lv, "/", a, b)
        links_a = {info.path: info for info in walk_links(a)}
        links_b = {info.path: info for info in walk_links(b)}
        if links_a.keys() != links_b.keys():
            problems.append(f"links only in the original {sorted(links_a - links_b.keys())}, "
                            f"only in the view {sorted(links_b - links_a.keys())}")
        for path in sorted(links_a.keys() & links_b.keys()):
            problems += link_differences(lv, links_a[path], links_b[path])
        return problems


@pytest.mark.mount
@pytest.mark.tools
@pytest.mark.parametrize("name", LINDI_FILES)
def test_h5py_reads_lindi_view_as_original(name: str,
                                           lindi_views: dict[str, LindiView]) -> None:
    lv = lindi_views[name]
    problems = h5py_differences(lv)
    assert not problems, "\n".join(problems)
    with h5py.File(lv.view, "r") as f:
        assert LEFT_OUT_ATTR not in f.attrs, list(f.attrs[LEFT_OUT_ATTR])


@pytest.mark.mount
@pytest.mark.tools
def test_named_exceptions_are_needed(lindi_views: dict[str, LindiView]) -> None:
    """Each ``LINDI_*`` exception names a real difference that the mount's sidecar
    (not the view) already shows, so the lists cannot hide a regression of the view."""
    for name, h5path in LINDI_FILL_LOST:
        lv = lindi_views[name]
        with h5py.File(lv.original, "r") as f:
            want = f[h5path].fillvalue
        stored = lv.sidecar(h5path)["fill_value"]
        assert not same_value(sidecar_fill(stored, want.dtype), want), (name, h5path)
    for name, h5path in LINDI_MAXSHAPE_LOST:
        lv = lindi_views[name]
        side = lv.sidecar(h5path)
        with h5py.File(lv.original, "r") as f:
            assert f[h5path].maxshape != tuple(side["maxshape"]) == tuple(side["shape"])
    for name, h5path, attr in LINDI_ATTR_WIDTH:
        lv = lindi_views[name]
        assert isinstance(lv.sidecar(h5path)["attributes"][attr], int | float | str)
        with h5py.File(lv.original, "r") as f:
            assert f[h5path].attrs.get_id(attr).dtype.itemsize < 8


def sidecar_fill(stored: Any, dtype: np.dtype[Any]) -> Any:
    """A sidecar's JSON ``fill_value`` as one element of ``dtype``."""
    if isinstance(stored, list):
        stored = tuple(stored)
    return np.array(stored, dtype=dtype)[()]


# --------------------------------------------------------------------------- -o h5view=off


@pytest.mark.mount
@pytest.mark.tools
def test_h5view_off_hides_root_h5(lindi_views: dict[str, LindiView], tmp_path: Path) -> None:
    lv = lindi_views["refs.h5"]
    with mounted(lv.reference, tmp_path / "off", "-o", "h5view=off") as mp:
        names = os.listdir(mp)
        assert ".root.json" in names
        assert ROOT_H5 not in names
        with pytest.raises(FileNotFoundError) as gone:
            os.stat(mp / ROOT_H5)
        assert gone.value.errno == errno.ENOENT
        assert ROOT_H5 not in {entry.name for entry in os.scandir(mp)}
    with mounted(lv.reference, tmp_path / "on", "-o", "h5view=on") as mp:
        assert ROOT_H5 in os.listdir(mp)


@pytest.mark.mount
@pytest.mark.hsds
def test_h5view_off_hides_domain_views(hsds_bucket: HsdsBucket, tmp_path: Path) -> None:
    folder, domain = NETCDF_DOMAIN.rsplit("/", 1)
    with mounted(hsds_bucket.bucket_dir, tmp_path / "off", "-o", "h5view=off") as mp:
        names = os.listdir(mp / folder)
        assert domain in names and f"{domain}.json" in names
        assert not [n for n in names
                    if n.endswith(VIEW_SUFFIX) and n.removesuffix(VIEW_SUFFIX) in names]
        with pytest.raises(FileNotFoundError) as gone:
            os.stat(mp / folder / f"{domain}{VIEW_SUFFIX}")
        assert gone.value.errno == errno.ENOENT


# --------------------------------------------------------------------------- copies


def copy_cp(src: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["cp", str(src), str(dest / src.name)], capture_output=True,
                          text=True, timeout=60, check=False)


def copy_tar(src: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    archive = dest.parent / f"{dest.name}.tar"
    done = subprocess.run(["tar", "-cf", str(archive), "-C", str(src.parent), src.name],
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 or done.stderr:
        return done
    return subprocess.run(["tar", "-xf", str(archive), "-C", str(dest)], capture_output=True,
                          text=True, timeout=60, check=False)


def copy_rsync(src: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rsync", str(src), str(dest / src.name)], capture_output=True,
                          text=True, timeout=60, check=False)


#: How each copying tool copies file ``src`` into directory ``dest``.
COPIERS: dict[str, Callable[[Path, Path], subprocess.CompletedProcess[str]]] = {
    "cp": copy_cp,
    "tar": copy_tar,
    "rsync": copy_rsync,
}


def check_copy(tool: str, view: Path, dest: Path) -> None:
    """On a fresh mount, list the view's directory first (the kernel may be told a
    stand-in size then), copy the view with ``tool``, and compare with read()."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    assert view.name in os.listdir(view.parent)
    dest.mkdir()
    done = COPIERS[tool](view, dest)
    assert done.returncode == 0 and done.stderr == "", f"{tool}: {done.stderr}"
    data = view.read_bytes()
    copied = (dest / view.name).read_bytes()
    assert data[:8] == HDF5_SIGNATURE
    assert len(copied) == len(data) == os.stat(view).st_size
    assert copied == data
    with h5py.File(dest / view.name, "r") as f:  # the copy is a whole HDF5 file
        assert len(f) > 0


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.parametrize("tool", sorted(COPIERS))
def test_copy_of_domain_view(tool: str, hsds_bucket: HsdsBucket, tmp_path: Path) -> None:
    with mounted(hsds_bucket.bucket_dir, tmp_path / "mp") as mp:
        check_copy(tool, mp / f"{NETCDF_DOMAIN}{VIEW_SUFFIX}", tmp_path / "copy")


@pytest.mark.mount
@pytest.mark.tools
@pytest.mark.parametrize("tool", sorted(COPIERS))
def test_copy_of_root_h5(tool: str, lindi_views: dict[str, LindiView], tmp_path: Path) -> None:
    with mounted(lindi_views["refs.h5"].reference, tmp_path / "mp") as mp:
        check_copy(tool, mp / ROOT_H5, tmp_path / "copy")


# --------------------------------------------------------------------------- fill values


@pytest.mark.mount
@pytest.mark.tools
def test_lindi_view_fill_values(lindi_views: dict[str, LindiView]) -> None:
    """Every dataset's fill value (h5py's ``fillvalue``) is the
    original's, or the sidecar's for ``LINDI_FILL_LOST``."""
    problems = []
    for name, lv in lindi_views.items():
        with h5py.File(lv.original, "r") as a, h5py.File(lv.view, "r") as b:
            for info in walk_links(a):
                if not isinstance(info.obj, h5py.Dataset) or info.path not in b:
                    continue
                want, got = info.obj.fillvalue, b[info.path].fillvalue
                if (name, info.path) in LINDI_FILL_LOST:
                    want = sidecar_fill(lv.sidecar(info.path)["fill_value"], want.dtype)
                if not same_value(want, got):
                    problems.append(f"{name}:{info.path} ({info.obj.dtype}): "
                                    f"{want!r} vs {got!r}")
    assert not problems, "fill values differ:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- record dimension


def write_records_netcdf(directory: Path) -> Path:
    """A netCDF-4 file with an unlimited (record) dimension ``time``, written by
    netCDF4-python: ``time(time)`` and ``v(time, x)`` have 5 records, the char
    variable ``w(time)`` only 2 (netCDF reads the rest as its fill, ``-``), and
    ``c(x)`` is a char variable with the fill value ``x``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "records.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.Conventions = "CF-1.8"
        nc.createDimension("time", None)
        nc.createDimension("x", 3)
        time = nc.createVariable("time", "f8", ("time",))
        time.units = "hours since 2001-02-03 04:00"
        time.calendar = "standard"
        time[:] = np.arange(5, dtype="f8") * 6
        v = nc.createVariable("v", "f4", ("time", "x"), fill_value=np.float32(1e20))
        v.units = "1"
        v[0:5, :] = np.arange(15, dtype="f4").reshape(5, 3) / 4
        w = nc.createVariable("w", "S1", ("time",), fill_value=b"-")
        w[0:2] = np.array([b"p", b"q"])
        c = nc.createVariable("c", "S1", ("x",), fill_value=b"x")
        c[:] = np.array([b"a", b"b", b"c"])
    return path


@pytest.fixture(scope="module")
def records_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(``write_records_netcdf``'s file, its view): hsloaded into an HSDS of this
    module's own (the session bucket's netCDF file has no record dimension),
    stopped again at once, and its bucket mounted."""
    if not hsds_node_available():
        pytest.skip("hsds-node/hsload/hstouch not installed (pip install 'hsds==1.0.2' h5pyd)")
    base = tmp_path_factory.mktemp("h5view-records")
    source = write_records_netcdf(base / "src")
    server = HsdsServer(base / "root", RECORDS_BUCKET, log_dir=base / "logs")
    with server:
        server.load(source, RECORDS_DOMAIN)
        server.flush_and_verify(RECORDS_DOMAIN, source)
    with mounted(server.bucket_dir, base / "mnt") as mp:
        yield source, mp / f"{RECORDS_DOMAIN}{VIEW_SUFFIX}"


@pytest.mark.mount
@pytest.mark.hsds
def test_record_dimension_survives(records_pair: tuple[Path, Path]) -> None:
    original, view = records_pair
    want = nc_describe(original)
    assert ("time", 5, True) in want["dimensions"]
    # HSDS keeps the datasets extendible: the mount's sidecars say maxshape null
    # along time (as h5pyd does), so a difference is the view's own.
    assert domain_sidecar(view, "/v")["maxshape"] == [None, 3]
    assert domain_sidecar(view, "/w")["maxshape"] == [None]
    with h5py.File(original, "r") as a, h5py.File(view, "r") as b:
        lost = {name: (a[name].maxshape, b[name].maxshape) for name in a
                if a[name].maxshape != b[name].maxshape}
    try:
        got, error = nc_describe(view), None
    except RuntimeError as exc:  # netCDF: "Start+count exceeds dimension bound"
        got, error = None, exc
    # A view that made the record dimension a fixed one (maxshape = shape) would
    # leave netCDF unable to read w, a record variable shorter than the dimension.
    assert not lost and error is None, (
        f"the view loses maxshape (original, view): {lost}; netCDF4 then "
        + (f"fails reading it: {error}" if error is not None else
           f"reads the dimensions {got['dimensions'] if got else None}"))
    assert got is not None
    problems = nc_differences(want, got)
    assert not problems, "\n".join(problems)
    for engine in ("h5netcdf", "netcdf4"):
        check_xarray(original, view, engine, decode_cf=True)


@pytest.mark.mount
@pytest.mark.hsds
def test_fixed_string_fill_values_survive(records_pair: tuple[Path, Path]) -> None:
    original, view = records_pair
    # HSDS keeps the fill values: the sidecars have them.
    assert domain_sidecar(view, "/c")["fill_value"] == "x"
    assert domain_sidecar(view, "/w")["fill_value"] == "-"
    with h5py.File(original, "r") as a, h5py.File(view, "r") as b:
        differ = {name: (a[name].fillvalue, b[name].fillvalue) for name in a
                  if not same_value(a[name].fillvalue, b[name].fillvalue)}
    # h5py (3.16) stores the address of a fixed-length string fill given as 'S<n>':
    # the view gives it as a variable-length string (layouts.hdf5._image._fill_array).
    assert not differ, f"fill values (original, view): {differ}"
