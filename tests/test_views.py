"""The generated views of a real mount: ``P.npy`` array files and Zarr v2 metadata.

A real FUSE mount of the session's HSDS bucket is read with the tools a user
would use (``numpy.load``, ``np.fromfile``, ``dd``, ``od``, ``os.pread``,
``zarr``, ``xarray``) and every answer is compared with what h5py reads from the
local HDF5 file the domain was loaded from (docs/CONTRACT.md, "The tree",
"Views" and "Zarr metadata"). Expected ``.npy`` bytes come from ``np.save`` of h5py's
array.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import io
import json
import os
import posixpath
import stat
import struct
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from mountd.tree.names import display_name
from tests.h5compare import (
    descr_fields,
    expected_json,
    json_float,
    mount_file,
    mount_rel,
    walk_links,
)
from tests.mounting import fuse_available, mounted
from tests.rawdomain import write_one_dataset

pytestmark = [pytest.mark.mount, pytest.mark.hsds, pytest.mark.skipif(fuse_available() is not None,
                                                 reason=f"no FUSE: {fuse_available()}")]

#: Link names a Zarr view generates; a real link of such a name wins (docs/CONTRACT.md, "Names").
ZARR_NAMES = frozenset({".zgroup", ".zattrs", ".zarray"})


# --------------------------------------------------------------------------- helpers


def has_npy(ds: h5py.Dataset) -> bool:
    """``P.npy`` for datasets of fixed-size type (references as ``|S48``): docs/CONTRACT.md,
    "Views"."""
    if ds.shape is None:
        return False
    if h5py.check_ref_dtype(ds.dtype) is not None:
        return True
    return not ds.dtype.hasobject


def is_vlen_string(ds: h5py.Dataset) -> bool:
    info = h5py.check_string_dtype(ds.dtype)
    return info is not None and info.length is None


def sidecar(root: Path, h5path: str) -> dict:
    """The sidecar document of the object at ``h5path`` in the domain at ``root``."""
    if h5path == "/":
        return json.loads(root.with_name(root.name + ".json").read_text())
    return json.loads((root / mount_file(h5path, ".json")).read_text())


def h5_array(ds: h5py.Dataset, root: Path, f: h5py.File) -> np.ndarray:
    """h5py's whole array; references become the target ids (``|S48``), as HSDS keeps them."""
    if h5py.check_ref_dtype(ds.dtype) is not None:
        refs = np.asarray(ds[()], dtype=object)
        ids = [sidecar(root, f[r].name)["id"].encode() if r else b"" for r in refs.reshape(-1)]
        return np.array(ids, dtype="S48").reshape(refs.shape)
    return np.asarray(ds[()])


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@dataclass(frozen=True)
class NpyHeader:
    version: tuple[int, int]
    length: int  # bytes before the data
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype


def read_header(fp: io.BufferedIOBase | io.BytesIO) -> NpyHeader:
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
    else:  # 3.0: as 2.0, but the header text is UTF-8
        assert version == (3, 0), version
        (hlen,) = struct.unpack("<I", fp.read(4))
        d = ast.literal_eval(fp.read(hlen).decode("utf-8"))
        shape, fortran = d["shape"], d["fortran_order"]
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    return NpyHeader(version, fp.tell(), tuple(shape), fortran, dtype)


def header_of(path: Path) -> NpyHeader:
    with open(path, "rb") as fp:
        return read_header(fp)


def assert_same(actual: np.ndarray, expected: np.ndarray, where: Any) -> None:
    """Equal values of one dtype: field by field for compounds, NaN == NaN for floats."""
    assert actual.shape == expected.shape, (where, actual.shape, expected.shape)
    if actual.dtype.names:
        assert actual.dtype.names == expected.dtype.names, where
        for name in actual.dtype.names:
            assert_same(actual[name], expected[name], (where, name))
    elif actual.dtype.kind in "fc":
        np.testing.assert_array_equal(actual, expected, err_msg=str(where))
    else:
        assert actual.tobytes() == expected.tobytes(), (where, actual, expected)


@dataclass
class DatasetCase:
    domain: str
    root: Path  # the domain's directory in the mount
    h5path: str
    ds: h5py.Dataset
    f: h5py.File

    @property
    def dir(self) -> Path:
        return self.root / mount_rel(self.h5path)

    @property
    def npy(self) -> Path:
        return self.root / mount_file(self.h5path, ".npy")

    @property
    def npy_shadowed(self) -> bool:
        return shadowed(self.f, self.h5path, ".npy")

    @property
    def sidecar_shadowed(self) -> bool:
        return shadowed(self.f, self.h5path, ".json")


def shadowed(f: h5py.File, h5path: str, suffix: str) -> bool:
    """A real link called ``NAME<suffix>`` beside ``h5path`` wins over the generated file."""
    parent, name = posixpath.split(h5path)
    return h5path != "/" and f"{name}{suffix}" in f[parent or "/"]


def hard_datasets(mnt: Path, hsds_bucket) -> Iterator[DatasetCase]:
    """Every dataset reached by a hard link (no cycle), in every domain, files open."""
    for domain, h5file in hsds_bucket.domains():
        with h5py.File(h5file, "r") as f:
            for info in walk_links(f):
                if info.cycle_to is None and isinstance(info.obj, h5py.Dataset):
                    yield DatasetCase(domain, mnt / domain, info.path, info.obj, f)


@contextlib.contextmanager
def open_case(mnt: Path, hsds_bucket, domain: str, h5path: str) -> Iterator[DatasetCase]:
    """The dataset at ``h5path`` of ``domain``, its local file open."""
    with h5py.File(hsds_bucket.files[domain], "r") as f:
        yield DatasetCase(domain, mnt / domain, h5path, f[h5path], f)


def expected_npy(case: DatasetCase) -> tuple[np.ndarray, bytes]:
    """h5py's array in the ``.npy``'s own dtype, and ``np.save``'s bytes of it."""
    hdr = header_of(case.npy)
    expected = h5_array(case.ds, case.root, case.f)
    h5dtype = np.dtype("S48") if h5py.check_ref_dtype(case.ds.dtype) else case.ds.dtype
    assert hdr.dtype == h5dtype, (case.npy, hdr.dtype, h5dtype)
    expected = expected.astype(hdr.dtype, order="C")
    return expected, npy_bytes(expected)


# --------------------------------------------------------------------------- P.npy


def test_npy_load_matches_h5py(mnt: Path, hsds_bucket) -> None:
    """numpy.load(mmap_mode="r") of every .npy equals h5py; exact st_size; no vlen .npy."""
    checked = absent = 0
    for case in hard_datasets(mnt, hsds_bucket):
        if case.npy_shadowed:
            continue
        listing = os.listdir(case.npy.parent)
        if not has_npy(case.ds):
            assert not os.path.lexists(case.npy), case.npy
            assert case.npy.name not in listing, case.npy
            absent += 1
            continue
        assert case.npy.name in listing, case.npy
        st = os.lstat(case.npy)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444, case.npy
        expected, saved = expected_npy(case)
        arr = np.load(case.npy, mmap_mode="r")
        assert arr.dtype == expected.dtype and arr.shape == expected.shape, \
            (case.npy, arr.dtype, arr.shape, expected.dtype, expected.shape)
        assert_same(np.asarray(arr), expected, case.npy)
        del arr
        data = case.npy.read_bytes()
        hdr = read_header(io.BytesIO(data))
        assert st.st_size == len(data) == hdr.length + expected.nbytes, \
            (case.npy, st.st_size, len(data), hdr.length, expected.nbytes)
        ref = read_header(io.BytesIO(saved))
        assert (hdr.version, hdr.shape, hdr.fortran_order, hdr.dtype) == \
            (ref.version, ref.shape, ref.fortran_order, ref.dtype), (case.npy, hdr, ref)
        # NPY pads the header so the data starts 64-byte aligned, as np.save does.
        assert st.st_size == len(saved), (case.npy, st.st_size, len(saved))
        checked += 1
    assert checked > 80 and absent >= 7, (checked, absent)


def test_npy_fromfile_after_header(mnt: Path, hsds_bucket) -> None:
    """np.fromfile(offset=header length) reads the C-order data that h5py reads."""
    checked = 0
    for case in hard_datasets(mnt, hsds_bucket):
        if case.npy_shadowed or not has_npy(case.ds):
            continue
        expected, _ = expected_npy(case)
        hdr = header_of(case.npy)
        assert not hdr.fortran_order, case.npy
        flat = np.fromfile(case.npy, dtype=hdr.dtype, offset=hdr.length)
        assert flat.size == expected.size, (case.npy, flat.size, expected.size)
        assert_same(flat.reshape(hdr.shape), expected, case.npy)
        checked += 1
    assert checked > 80


def test_npy_soft_and_hard_links(mnt: Path, hsds_bucket) -> None:
    root = mnt / "home/admin/links.h5"
    with h5py.File(hsds_bucket.files["home/admin/links.h5"], "r") as f:
        expected = f["/g1/g2/d"][()]
        for soft in ("g1/soft_abs.npy", "g1/soft_rel.npy"):
            assert (root / soft).is_symlink(), soft
            np.testing.assert_array_equal(np.load(root / soft, mmap_mode="r"), expected)
        np.testing.assert_array_equal(np.load(root / "g1/hard_alias.npy"), expected)
        assert (root / "g1/hard_alias.npy").read_bytes() == (root / "g1/g2/d.npy").read_bytes()
        assert not os.path.lexists(root / "g1/soft_group.npy")  # a group has no .npy
        # the real link x.npy wins; the dataset x.npy has its own x.npy.npy
        assert (root / "names/x.npy").is_dir()
        np.testing.assert_array_equal(np.load(root / "names/x.npy.npy"), f["/names/x.npy"][()])


def test_missing_chunks_read_as_fill(mnt: Path, hsds_bucket) -> None:
    domain = "home/admin/layout.h5"
    for name in ("sparse", "never_written", "fill_int", "fill_compound"):
        with open_case(mnt, hsds_bucket, domain, f"/{name}") as case:
            chunks = case.ds.chunks
            grid = int(np.prod([-(-n // c) for n, c in zip(case.ds.shape, chunks, strict=True)]))
            stored = [n for n in os.listdir(case.dir) if not n.startswith(".")]
            assert len(stored) < grid, (name, stored)  # the case really has missing chunks
            expected, _ = expected_npy(case)
            assert case.npy.read_bytes()[-expected.nbytes:] == expected.tobytes(), name
            assert_same(np.load(case.npy), expected, name)
            if name == "never_written":
                assert stored == []
                fill = np.full(case.ds.shape, case.ds.fillvalue, dtype=case.ds.dtype)
                assert_same(np.load(case.npy), fill, name)


@pytest.mark.parametrize(("domain", "h5path"), [
    ("home/admin/types.h5", "/misc/scalar_int"),
    ("home/admin/types.h5", "/misc/scalar_float"),
    ("home/admin/types.h5", "/misc/scalar_fixed_str"),
    ("home/admin/links.h5", "/g1/g2/g3/deep"),
    ("home/admin/extlink_target.h5", "/grp/inner"),
])
def test_scalar_npy(mnt: Path, hsds_bucket, domain: str, h5path: str) -> None:
    with open_case(mnt, hsds_bucket, domain, h5path) as case:
        assert case.ds.shape == ()
        arr = np.load(case.npy, mmap_mode="r")
        assert arr.shape == () and arr.dtype == case.ds.dtype
        assert arr[()] == case.ds[()]
        assert case.npy.read_bytes() == expected_npy(case)[1]


@pytest.mark.parametrize("h5path", ["/compound/simple", "/compound/nested",
                                    "/compound/mixed_order", "/compound/array_field",
                                    "/misc/uses_committed"])
def test_compound_npy(mnt: Path, hsds_bucket, h5path: str) -> None:
    with open_case(mnt, hsds_bucket, "home/admin/types.h5", h5path) as case:
        arr = np.load(case.npy, mmap_mode="r")
        h5 = case.ds[()]
        assert arr.dtype == h5.dtype, (arr.dtype, h5.dtype)
        assert arr.dtype.names == h5.dtype.names
        for name in h5.dtype.names:
            assert_same(np.asarray(arr[name]), h5[name], (h5path, name))
        assert np.asarray(arr).tobytes() == h5.tobytes()


def test_vlen_datasets_have_no_npy(mnt: Path) -> None:
    root = mnt / "home/admin/types.h5"
    for name in ("strings/vlen_ascii", "strings/vlen_utf8", "strings/vlen_utf8_2d",
                 "compound/vlen_field", "misc/scalar_vlen_str"):
        assert (root / name).is_dir(), name
        assert not os.path.lexists(root / f"{name}.npy"), name
    assert not os.path.lexists(mnt / "home/admin/filters.h5/gzip_vlen_str.npy")


# --------------------------------------------------------------------------- dd, od, pread


def test_dd_slices(mnt: Path, hsds_bucket) -> None:
    with open_case(mnt, hsds_bucket, "home/admin/layout.h5", "/sparse") as case:
        _, saved = expected_npy(case)
        p = str(case.npy)
        for bs, skip, count in ((4096, 0, 1), (4096, 3, 4), (1000, 7, 9), (512, 70, 20),
                                (4096, 9, 5), (65536, 0, 1)):
            out = subprocess.run(["dd", f"if={p}", f"bs={bs}", f"skip={skip}", f"count={count}",
                                  "status=none"], capture_output=True, check=True, timeout=60)
            assert out.stdout == saved[bs * skip: bs * (skip + count)], (bs, skip, count)
        out = subprocess.run(["dd", f"if={p}", "bs=4096", "skip=12345", "count=777",
                              "iflag=skip_bytes,count_bytes", "status=none"],
                             capture_output=True, check=True, timeout=60)
        assert out.stdout == saved[12345:12345 + 777]


def od_values(path: Path, kind: str, offset: int, nbytes: int) -> list[str]:
    out = subprocess.run(["od", "-A", "n", "-t", kind, "-j", str(offset), "-N", str(nbytes),
                          "-v", str(path)], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()


def test_od_values(mnt: Path, hsds_bucket) -> None:
    with open_case(mnt, hsds_bucket, "home/admin/layout.h5", "/edge_2d") as case:
        expected, _ = expected_npy(case)
        flat = expected.reshape(-1)
        hlen = header_of(case.npy).length
        # element 0, across the chunk edge at column 5/10/15, the last full row of chunks, the end
        for i in (0, 3, 8, 14, 17 * 10 - 2, 17 * 20 + 13, flat.size - 4):
            got = od_values(case.npy, "f4", hlen + i * 4, 16)
            np.testing.assert_array_equal(np.array(got, dtype="<f4"), flat[i:i + 4], err_msg=str(i))
    with open_case(mnt, hsds_bucket, "home/admin/layout.h5", "/sparse") as case:
        expected, _ = expected_npy(case)
        flat = expected.reshape(-1)
        hlen = header_of(case.npy).length
        for i in (0, 8, 5018, 5026, 5918, flat.size - 4):
            got = od_values(case.npy, "d4", hlen + i * 4, 16)
            assert [int(v) for v in got] == flat[i:i + 4].tolist(), i
        got = od_values(case.npy, "x1", 0, 200)
        assert bytes(int(v, 16) for v in got) == case.npy.read_bytes()[:200]
        assert bytes(int(v, 16) for v in got)[hlen:] == expected.tobytes()[:200 - hlen]
    with open_case(mnt, hsds_bucket, "home/admin/layout.h5", "/fill_nan") as case:
        expected, _ = expected_npy(case)
        flat = expected.reshape(-1)
        hlen = header_of(case.npy).length
        for i in (0, 2, 14, 28):  # a written chunk, then NaN-filled ones
            got = od_values(case.npy, "f4", hlen + i * 4, 16)
            np.testing.assert_array_equal(np.array([float(v) for v in got], dtype="<f4"),
                                          flat[i:i + 4], err_msg=str(i))


RANDOM_READS = [
    ("home/admin/layout.h5", "/edge_2d"),
    ("home/admin/layout.h5", "/edge_3d"),
    ("home/admin/layout.h5", "/sparse"),
    ("home/admin/layout.h5", "/fill_nan"),
    ("home/admin/layout.h5", "/fill_compound"),
    ("home/admin/filters.h5", "/gzip_shuffle"),
]


def read_plan(rng: np.random.Generator, size: int, hlen: int, itemsize: int,
              shape: tuple[int, ...], chunks: tuple[int, ...], n: int) -> list[tuple[int, int]]:
    """``n`` (offset, length) reads: anywhere, at chunk edges, in the header, at and past EOF."""
    reads = []
    for _ in range(n):
        kind = rng.integers(0, 10)
        if kind < 3:  # anywhere
            off = int(rng.integers(0, size))
            length = int(rng.integers(1, 3 * 4096))
        elif kind < 6:  # around an element at a chunk boundary of some dimension
            index = [int(rng.integers(0, s)) for s in shape]
            d = int(rng.integers(0, len(shape)))
            edges = list(range(0, shape[d], chunks[d]))
            index[d] = int(rng.choice(edges))
            flat = int(np.ravel_multi_index(index, shape))
            off = max(0, hlen + flat * itemsize + int(rng.integers(-3 * itemsize, 3 * itemsize)))
            length = int(rng.integers(1, 2 * itemsize * int(np.prod(chunks)) + 2))
        elif kind == 6:  # the header and the first data bytes
            off = int(rng.integers(0, hlen + 8))
            length = int(rng.integers(1, hlen + 64))
        elif kind == 7:  # runs over the end of file
            off = int(rng.integers(max(0, size - 300), size))
            length = int(rng.integers(1, 1000))
        elif kind == 8:  # past the end of file
            off = int(rng.integers(size, size + 10_000))
            length = int(rng.integers(1, 5000))
        else:  # big reads
            off = int(rng.integers(0, max(1, size // 2)))
            length = int(rng.integers(size // 2, 2 * size + 2))
        reads.append((off, length))
    return reads


@pytest.mark.parametrize(("domain", "h5path"), RANDOM_READS)
def test_random_preads(mnt: Path, hsds_bucket, domain: str, h5path: str) -> None:
    """300 reads at seeded random offsets equal the same slice of np.save's bytes.

    The header is compared by value (any valid padding would do); the data
    bytes exactly. Each read is made through the page cache and with
    ``O_DIRECT``, which passes the offsets and lengths to the daemon as they are.
    """
    with open_case(mnt, hsds_bucket, domain, h5path) as case:
        expected, saved = expected_npy(case)
        head = case.npy.read_bytes()[:4096]
        hdr, ref = read_header(io.BytesIO(head)), read_header(io.BytesIO(saved))
        assert (hdr.shape, hdr.dtype, hdr.fortran_order) == (ref.shape, ref.dtype,
                                                             ref.fortran_order)
        content = head[:hdr.length] + expected.tobytes()
        if hdr.length == ref.length:
            assert content == saved
        size = len(content)
        assert os.stat(case.npy).st_size == size
        seed = sum(map(ord, domain + h5path))
        chunks = tuple(sidecar(case.root, h5path)["chunks"])
        plan = read_plan(np.random.default_rng(seed), size, hdr.length, expected.itemsize,
                         expected.shape, chunks, 300)
        assert sum(off + n > size for off, n in plan) > 10  # some reads do reach EOF
        for flags in (os.O_RDONLY, os.O_RDONLY | os.O_DIRECT):
            fd = os.open(case.npy, flags)
            try:
                for off, n in plan:
                    got = os.pread(fd, n, off)
                    assert got == content[off:off + n], \
                        (h5path, "O_DIRECT" if flags & os.O_DIRECT else "cached", off, n,
                         len(got), len(content[off:off + n]))
            finally:
                os.close(fd)


# --------------------------------------------------------------------------- Zarr


def zarr_module() -> Any:
    return pytest.importorskip("zarr")


def zarr_kwargs(zarr: Any) -> dict[str, Any]:
    return {"zarr_format": 2} if zarr_major(zarr) >= 3 else {}


def zopen_group(zarr: Any, path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "X.json is not a Zarr component"
        return zarr.open_group(str(path), mode="r", **zarr_kwargs(zarr))


def zmembers(group: Any) -> list[tuple[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if hasattr(group, "members"):
            return list(group.members())
        return list(group.items())


def zarr_major(zarr: Any) -> int:
    return int(zarr.__version__.split(".")[0])


def has_structured_field(dtype: np.dtype) -> bool:
    """A compound with a sub-array or compound field."""
    return dtype.names is not None and any(
        dtype[n].subdtype is not None or dtype[n].names is not None for n in dtype.names)


def zarr_readable(zarr: Any, ds: h5py.Dataset) -> bool:
    """Datasets zarr-python can decode: fixed-size types and vlen strings.

    The mount describes the others too (``test_zarray_fields``), as the Zarr v2
    spec allows, but zarr-python 3 cannot read them: it has no data type for a
    structured dtype with a sub-array or nested compound field
    (``compound/array_field``, ``compound/nested``), nor for ``|O`` with the
    ``json2`` codec (a compound with a vlen field).
    """
    if ds.shape is None or not (has_npy(ds) or is_vlen_string(ds)):
        return False
    return zarr_major(zarr) < 3 or not has_structured_field(ds.dtype)


def check_zarr_array(array: Any, case: DatasetCase) -> None:
    actual = np.asarray(array[...])
    if is_vlen_string(case.ds):
        expected = np.asarray(case.ds.asstr()[()], dtype=object)
        assert actual.shape == expected.shape, case.h5path
        assert [str(v) for v in actual.reshape(-1)] == list(expected.reshape(-1)), \
            (case.domain, case.h5path, actual, expected)
        return
    expected = h5_array(case.ds, case.root, case.f)
    assert actual.dtype == expected.dtype or h5py.check_ref_dtype(case.ds.dtype), \
        (case.domain, case.h5path, actual.dtype, expected.dtype)
    assert_same(actual, expected.astype(actual.dtype), (case.domain, case.h5path))


def zarr_groups(f: h5py.File) -> list[str]:
    """Paths of the groups reached by hard links whose Zarr names are not taken by real links."""
    groups = ["/"]
    for info in walk_links(f):
        if info.cycle_to is None and isinstance(info.obj, h5py.Group):
            groups.append(info.path)
    return [g for g in groups if not ZARR_NAMES & set(f[g])]


def group_members(zarr: Any, group: Any, h5group: h5py.Group) -> list[tuple[str, Any]]:
    """``group.members()``; where zarr-python cannot read some array of the group (see
    ``zarr_readable``), which makes ``members()`` fail whole, each readable link by name."""
    unreadable = [name for name, obj in h5group.items()
                  if isinstance(obj, h5py.Dataset) and obj.shape is not None
                  and (has_npy(obj) or obj.dtype.hasobject) and not zarr_readable(zarr, obj)]
    if not unreadable:
        return zmembers(group)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for name in h5group:
            if name not in unreadable and name in group:
                out.append((display_name(name), group[display_name(name)]))
    return out


def test_zarr_open_every_group(mnt: Path, hsds_bucket) -> None:
    """zarr opens every domain root and sub-group; every array it finds equals h5py."""
    zarr = zarr_module()
    arrays_seen: set[tuple[str, str]] = set()
    should_see: set[tuple[str, str]] = set()
    for domain, h5file in hsds_bucket.domains():
        root = mnt / domain
        with h5py.File(h5file, "r") as f:
            groups = zarr_groups(f)
            for gpath in groups:
                group = zopen_group(zarr, root / mount_rel(gpath))
                h5group = f[gpath]
                shown = {display_name(name): name for name in h5group}
                for member, node in group_members(zarr, group, h5group):
                    assert member in shown, (domain, gpath, member)
                    path = posixpath.join(gpath, shown[member])
                    link = h5group.get(shown[member], getlink=True)
                    target = f.get(path)
                    if hasattr(node, "shape"):  # an array
                        assert isinstance(target, h5py.Dataset), (domain, path)
                        check_zarr_array(node, DatasetCase(domain, root, path, target, f))
                        if isinstance(link, h5py.HardLink):
                            arrays_seen.add((domain, path))
                    elif isinstance(link, h5py.HardLink):
                        assert isinstance(target, h5py.Group), (domain, path)
                for name in h5group:
                    path = posixpath.join(gpath, name)
                    obj = h5group.get(name)
                    if (isinstance(h5group.get(name, getlink=True), h5py.HardLink)
                            and isinstance(obj, h5py.Dataset) and zarr_readable(zarr, obj)):
                        should_see.add((domain, path))
    assert should_see - arrays_seen == set()
    assert len(arrays_seen) > 80


def test_zarr_open_every_array(mnt: Path, hsds_bucket) -> None:
    """zarr.open_array on each dataset directory, including those in groups zarr cannot list."""
    zarr = zarr_module()
    checked = 0
    for case in hard_datasets(mnt, hsds_bucket):
        if not zarr_readable(zarr, case.ds):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            array = zarr.open_array(str(case.dir), mode="r", **zarr_kwargs(zarr))
        assert tuple(array.shape) == case.ds.shape, case.h5path
        check_zarr_array(array, case)
        checked += 1
    assert checked > 90


def expected_zarr_fill(case: DatasetCase, dtype: np.dtype) -> Any:
    """h5py's fill value as the Zarr v2 spec encodes it: "NaN", base64 for S, V and structs."""
    if h5py.check_ref_dtype(case.ds.dtype) is not None:
        return base64.b64encode(bytes(dtype.itemsize)).decode()
    fill = np.asarray(case.ds.fillvalue).astype(dtype)
    if dtype.names is not None or dtype.kind in "SV":
        return base64.b64encode(fill.tobytes()).decode()
    if dtype.kind == "f":
        return json_float(float(fill))
    return fill.item()


def test_zarray_fields(mnt: Path, hsds_bucket) -> None:
    checked = 0
    for case in hard_datasets(mnt, hsds_bucket):
        if case.ds.shape is None:
            continue
        zarray = json.loads((case.dir / ".zarray").read_text())
        where = (case.domain, case.h5path)
        assert zarray["zarr_format"] == 2, where
        assert zarray["shape"] == list(case.ds.shape), where
        if not case.sidecar_shadowed:
            assert zarray["chunks"] == sidecar(case.root, case.h5path)["chunks"], where
        assert len(zarray["chunks"]) == case.ds.ndim, where
        assert zarray["compressor"] is None, where
        assert zarray["order"] == "C", where
        assert zarray["dimension_separator"] == ".", where
        if has_npy(case.ds):
            assert zarray.get("filters") is None, where
            dt = zarray["dtype"]
            dtype = np.dtype(descr_fields(dt)) if isinstance(dt, list) else np.dtype(dt)
            expected_dtype = np.dtype("S48") if h5py.check_ref_dtype(case.ds.dtype) \
                else case.ds.dtype
            assert dtype == expected_dtype, (where, dt)
            assert zarray["fill_value"] == expected_zarr_fill(case, dtype), \
                (where, zarray["fill_value"])
        elif is_vlen_string(case.ds):
            assert zarray["dtype"] == "|O", where
            assert zarray["filters"] == [{"id": "vlen-utf8"}], where
        else:  # other variable-length types: an object codec
            assert zarray["dtype"] == "|O", where
            assert zarray["filters"], where
        checked += 1
    assert checked > 100


def test_zarray_fill_encodings(mnt: Path, hsds_bucket) -> None:
    """NaN fill is the string "NaN"; a compound fill is base64 of its bytes (Zarr v2 spec)."""
    with open_case(mnt, hsds_bucket, "home/admin/layout.h5", "/fill_nan") as case:
        assert np.isnan(case.ds.fillvalue)
        assert json.loads((case.dir / ".zarray").read_text())["fill_value"] == "NaN"
    with open_case(mnt, hsds_bucket, "home/admin/layout.h5", "/fill_compound") as case:
        fill = np.asarray(case.ds.fillvalue, dtype=case.ds.dtype).tobytes()
        encoded = json.loads((case.dir / ".zarray").read_text())["fill_value"]
        assert base64.b64decode(encoded) == fill
    with open_case(mnt, hsds_bucket, "home/admin/layout.h5", "/fill_int") as case:
        assert json.loads((case.dir / ".zarray").read_text())["fill_value"] == \
            int(case.ds.fillvalue)


# --------------------------------------------------------------------------- .zattrs


def uses_dimension_scales(f: h5py.File) -> bool:
    found = []
    f.visititems(lambda _, obj: found.append(True) if isinstance(obj, h5py.Dataset)
                 and h5py.h5ds.is_scale(obj.id) else None)
    return bool(found)


def expected_dimensions(ds: h5py.Dataset) -> list[str] | None:
    """Dimension names from HDF5 dimension scales (a scale names its own dimension).

    A scalar in a file with dimension scales (a netCDF scalar variable) has the
    dimensions ``[]``: xarray refuses a Zarr group where any array lacks them.
    """
    if ds.shape is None:
        return None
    if ds.ndim == 0:
        return [] if uses_dimension_scales(ds.file) else None
    if h5py.h5ds.is_scale(ds.id):
        return [posixpath.basename(ds.name)]
    names = [posixpath.basename(dim[0].name) if len(dim) else None for dim in ds.dims]
    return None if all(n is None for n in names) else names


def test_zattrs_equal_sidecar_attributes(mnt: Path, hsds_bucket) -> None:
    checked = dims = 0
    for domain, h5file in hsds_bucket.domains():
        root = mnt / domain
        with h5py.File(h5file, "r") as f:
            objects = [("/", f["/"])] + [(i.path, i.obj) for i in walk_links(f)
                                          if i.cycle_to is None and i.obj is not None]
            for path, obj in objects:
                where = root / mount_rel(path)
                if isinstance(obj, h5py.Group) and ZARR_NAMES & set(obj):
                    assert all((where / n).is_dir() for n in ZARR_NAMES & set(obj)), where
                    continue  # real links called .zattrs etc. win
                if isinstance(obj, h5py.Datatype):
                    continue
                if isinstance(obj, h5py.Group):
                    assert json.loads((where / ".zgroup").read_text()) == {"zarr_format": 2}
                zattrs = json.loads((where / ".zattrs").read_text())
                names = zattrs.pop("_ARRAY_DIMENSIONS", None)
                if not shadowed(f, path, ".json"):
                    assert zattrs == sidecar(root, path)["attributes"], (domain, path)
                assert zattrs == {k: expected_json(obj.attrs[k], f) for k in obj.attrs}, \
                    (domain, path)
                expected_dims = expected_dimensions(obj) if isinstance(obj, h5py.Dataset) \
                    else None
                if expected_dims is None and getattr(obj, "shape", None) == ():
                    assert names in (None, []), (domain, path, names)  # either is right
                elif expected_dims is None:
                    assert names is None, (domain, path, names)
                elif None not in expected_dims:
                    assert names == expected_dims, (domain, path, names, expected_dims)
                    dims += 1
                checked += 1
    assert checked > 120 and dims == 6, (checked, dims)


# --------------------------------------------------------------------------- xarray


NETCDF = "home/admin/netcdf.h5"


def open_mount_xarray(xr: Any, path: Path, **kwargs: Any) -> Any:
    zarr = zarr_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return xr.open_zarr(str(path), consolidated=False, **zarr_kwargs(zarr), **kwargs).load()


def test_xarray_open_zarr_netcdf(mnt: Path, hsds_bucket) -> None:
    xr = pytest.importorskip("xarray")
    view = open_mount_xarray(xr, mnt / NETCDF, decode_times=False)
    with h5py.File(hsds_bucket.files[NETCDF], "r") as f:
        scales = {name: obj for name, obj in f.items()
                  if isinstance(obj, h5py.Dataset) and h5py.h5ds.is_scale(obj.id)}
        assert dict(view.sizes) == {name: len(obj) for name, obj in scales.items()}
        assert set(view.coords) == set(scales)
        assert set(view.data_vars) == set(f) - set(scales)
        for name, obj in f.items():
            var = view[name]
            assert var.dims == tuple(expected_dimensions(obj)), (name, var.dims)
            expected = obj.asstr()[()] if is_vlen_string(obj) else obj[()]
            np.testing.assert_array_equal(var.values, expected, err_msg=name)
            for attr in ("units", "grid_mapping", "grid_mapping_name"):
                if attr in obj.attrs:
                    assert var.attrs[attr] == obj.attrs[attr].decode(), (name, attr)
        assert view["temp"].dims == ("time", "x")
        assert view["crs"].dims == ()
        for name, obj in scales.items():
            np.testing.assert_array_equal(view.coords[name].values, obj[()], err_msg=name)
        assert view.attrs["title"] == f.attrs["title"].decode()


def test_xarray_matches_netcdf4_engine(mnt: Path, hsds_bucket) -> None:
    """The mount read by xarray's zarr backend equals the file read by its netCDF4 backend."""
    xr = pytest.importorskip("xarray")
    pytest.importorskip("netCDF4")
    local = hsds_bucket.files[NETCDF]
    for decode_times in (False, True):
        view = open_mount_xarray(xr, mnt / NETCDF, decode_times=decode_times)
        with xr.open_dataset(local, engine="netcdf4", decode_times=decode_times) as nc:
            ref = nc.load()
            xr.testing.assert_equal(view, ref)
            for name in ref.variables:
                assert view[name].attrs.get("units") == ref[name].attrs.get("units"), name
            if decode_times:
                assert np.issubdtype(view["time"].dtype, np.datetime64)


# --------------------------------------------------------------------------- many chunks

#: The dataset of the hand-written bucket: a 45 x 50 grid of 1 x 1 int32 chunks.
MANY_SHAPE = (45, 50)
#: HSDS ids of the hand-written domain (schema v2; the root's hex is rotated by 8).
MANY_ROOT = "g-2a3b4c5d-6e7f8091-a2b3-c4d5e6-f70819"
MANY_DSET = "d-2a3b4c5d-6e7f8091-0000-000000-000001"


def many_stored(index: tuple[int, int]) -> bool:
    """Which chunks the hand-written dataset stores: all but every seventh."""
    return (index[0] * MANY_SHAPE[1] + index[1]) % 7 != 3


def write_many_chunks_bucket(bucket: Path) -> None:
    """An HSDS bucket written key by key (no server): ``home/admin/many.h5`` whose
    ``/many`` has 2250 chunks, most of them stored, each holding its grid position."""
    dset = write_one_dataset(bucket, "home/admin/many.h5", MANY_ROOT, MANY_DSET, "many",
                             {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"}, MANY_SHAPE,
                             (1, 1))
    for index in np.ndindex(*MANY_SHAPE):
        if many_stored(index):
            value = index[0] * MANY_SHAPE[1] + index[1]
            (dset / f"{index[0]}_{index[1]}").write_bytes(np.int32(value).tobytes())


@pytest.fixture(scope="module")
def many_mnt(tmp_path_factory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("many")
    write_many_chunks_bucket(base / "bucket")
    with mounted(base / "bucket", base / "mp") as mp:
        yield mp / "home/admin/many.h5"


def test_many_chunks_listed_once_each(many_mnt: Path) -> None:
    """A dataset directory longer than one readdir reply (and than the listing's
    window) lists every stored chunk exactly once, and nothing else."""
    names = os.listdir(many_mnt / "many")
    stored = {f"{i}.{j}" for i, j in np.ndindex(*MANY_SHAPE) if many_stored((i, j))}
    assert len(names) == len(set(names)) == len(stored) + 2
    assert set(names) == stored | {".zarray", ".zattrs"}
    # a second reader of the same directory, reading it in small pieces, agrees
    with os.scandir(many_mnt / "many") as it:
        assert sorted(e.name for e in it) == sorted(names)


def test_many_chunks_read_in_grid_order(many_mnt: Path) -> None:
    """Chunk files read one after another in grid order (the daemon reads ahead)
    hold their values, and the .npy shows the unstored ones as the fill value."""
    expected = np.arange(MANY_SHAPE[0] * MANY_SHAPE[1], dtype="<i4").reshape(MANY_SHAPE)
    for index in np.ndindex(*MANY_SHAPE):
        if many_stored(index):
            data = (many_mnt / "many" / f"{index[0]}.{index[1]}").read_bytes()
            assert np.frombuffer(data, "<i4")[0] == expected[index]
        else:
            expected[index] = 0
    np.testing.assert_array_equal(np.load(many_mnt / "many.npy"), expected)
