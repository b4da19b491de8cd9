"""``P.csv`` of plain HDF5 tables (``layouts.views._table``) on real mounts.

The tables are written by real writers: PyTables (a ``Table`` with integer,
float, string, bool, enum, sub-array and nested columns) and h5py (record
arrays with nested compounds, sub-array, enum, bool, big-endian and
variable-length fields, special floats and strings that need CSV quoting),
plus datasets that must get no CSV: one a LEGEND ``datatype`` attribute
claims, one an anndata ``encoding-type`` attribute claims, a 2-D compound and
a plain 1-D dataset. They are hsloaded into a real HSDS 1.0.2 bucket and
written as LINDI files by real lindi, both mounted with the real daemon.
lindi 0.4.6 stores compound datasets inline as JSON and refuses nested,
sub-array, enum and variable-length fields, so the LINDI files hold the
same tables with their flat fields only (``flat=True``).

Every CSV is read with ``pandas.read_csv(path)`` and compared with h5py's
reading of the same dataset, field by field; ``cp``, ``wc -c``,
``tail -n 2``, ``head -c``, ``rsync`` and ``shutil.copyfile`` must agree
with the file's ``stat`` size and content.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import pytest

from tests.hsds_server import HsdsServer, hsds_node_available
from tests.lindi_files import lindi_available, write_lindi
from tests.mounting import fuse_available, mounted

tables = pytest.importorskip("tables")

pytestmark = [
    pytest.mark.mount,
    pytest.mark.hsds,
    pytest.mark.tools,
    pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available())),
]

BUCKET = "h5tables"
#: Tables of each file (HDF5 path) that get ``P.csv``.
TABLES = {
    "pytables.h5": ("/detector/readout", "/detector/small"),
    "records.h5": ("/records", "/small", "/empty"),
}
#: ... and, in the HSDS bucket only, these (lindi cannot write them).
HSDS_ONLY_TABLES = {"records.h5": ("/with_vlen",)}
#: Datasets that must not get ``P.csv``.
NOT_TABLES = ("/legendish", "/anndataish", "/grid", "/plain")

LABELS = [b"plain", b"with,comma", b'say "hi"', b"line\nbreak", b" lead", b"trail ",
          "\u00e9t\u00e9 \u540d".encode(), b"", b"cr\rlf"]


# --------------------------------------------------------------------------- writers


def write_pytables(path: Path, *, flat: bool) -> Path:
    """A PyTables file: ``/detector/readout`` (5000 rows, zlib, 700-row chunks)
    and ``/detector/small`` (3 rows)."""

    class Pos(tables.IsDescription):
        x = tables.Float32Col(pos=0)
        y = tables.Float64Col(pos=1)

    columns: dict[str, Any] = {
        "id": tables.Int64Col(pos=0),
        "name": tables.StringCol(16, pos=1),
        "energy": tables.Float64Col(pos=2),
        "charge": tables.Int8Col(pos=3),
        "hit": tables.BoolCol(pos=4),
        "weight": tables.Float32Col(pos=5),
    }
    if not flat:
        columns["color"] = tables.EnumCol(tables.Enum({"red": 0, "green": 1, "blue": 2}),
                                          "red", base="uint8", pos=6)
        columns["samples"] = tables.Float32Col(shape=(3,), pos=7)
        columns["pos"] = Pos()
    with tables.open_file(path, "w", title="h5mount test") as f:
        group = f.create_group("/", "detector", title="a detector")
        table = f.create_table(group, "readout", columns, "readout table",
                               filters=tables.Filters(5, "zlib"), chunkshape=(700,))
        row = table.row
        for i in range(5000):
            row["id"] = i * 3 - 10
            row["name"] = f"p{i},x" if i % 5 == 0 else f"p{i}"
            row["energy"] = np.nan if i == 7 else np.inf if i == 8 else i / 7
            row["charge"] = i % 3 - 1
            row["hit"] = i % 2 == 0
            row["weight"] = i / 3
            if not flat:
                row["color"] = i % 3
                row["samples"] = [i, i + 0.5, -i / 9]
                row["pos/x"] = i / 3
                row["pos/y"] = -i * 1e10 / 3
            row.append()
        table.flush()
        small = f.create_table(group, "small", columns, "three rows")
        small.append(table.read(0, 3))
        small.flush()
    return path


def record_dtype(flat: bool) -> np.dtype:
    fields: list[Any] = [("id", "<u4"), ("label", "S24"), ("x", "<f4"), ("y", ">f8"),
                         ("ok", "?"), ("big", ">i8")]
    if not flat:
        point = np.dtype([("x", "<f4"), ("y", ">f8")])
        corner = np.dtype([("lo", "<i2"), ("hi", "<i2")])
        colors = h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 42}, basetype="i1")
        fields += [("pos", point), ("box", [("corner", corner), ("size", "<f4")]),
                   ("v", "<f8", (2, 2)), ("color", colors)]
    return np.dtype(fields)


def records(n: int, flat: bool) -> np.ndarray:
    data = np.zeros(n, record_dtype(flat))
    i = np.arange(n)
    data["id"] = i
    data["label"] = [LABELS[k % len(LABELS)] for k in range(n)]
    data["x"] = i / 3
    data["y"] = i * -1e-5
    data["x"][5] = np.nan
    data["y"][6] = -np.inf
    data["y"][9] = np.finfo("f8").max
    data["ok"] = i % 3 == 0
    data["big"] = i * 2**40 - 2**62
    if not flat:
        data["pos"]["x"] = i / 7
        data["pos"]["y"] = i * 1e300
        data["box"]["corner"]["lo"] = i % 100
        data["box"]["corner"]["hi"] = -(i % 50)
        data["box"]["size"] = i / 8
        data["v"] = np.arange(4 * n).reshape(n, 2, 2) / 4
        data["color"] = np.array([0, 1, 42])[i % 3]
    return data


def write_records(path: Path, *, flat: bool) -> Path:
    """h5py record arrays, and the datasets that must get no CSV."""
    data = records(3000, flat)
    with h5py.File(path, "w") as f:
        f.create_dataset("records", data=data, chunks=(256,), compression="gzip")
        f.create_dataset("small", data=data[:9])
        f.create_dataset("empty", shape=(0,), dtype=data.dtype, maxshape=(None,), chunks=(16,))
        if not flat:
            vlen = np.dtype([("n", "<i4"), ("s", h5py.string_dtype("utf-8"))])
            f.create_dataset("with_vlen", data=np.array(
                [(1, "first"), (2, ""), (3, "drittes ß, x"), (4, 'q"uote\n')], dtype=vlen))
        f.create_dataset("grid", data=data[:6].reshape(2, 3))
        f.create_dataset("plain", data=np.arange(5))
        f.create_dataset("legendish", data=data[:4]).attrs["datatype"] = "table{id,label}"
        f.create_dataset("anndataish", data=data[:4]).attrs["encoding-type"] = "rec-array"
    return path


# --------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Source:
    """A mounted source: ``roots`` maps each file name to its root in the mount."""

    kind: str
    files: dict[str, Path]
    roots: dict[str, Path]

    def tables(self) -> Iterator[tuple[str, str]]:
        for name, paths in TABLES.items():
            for h5path in paths:
                yield name, h5path
            if self.kind == "hsds":
                for h5path in HSDS_ONLY_TABLES.get(name, ()):
                    yield name, h5path


def write_files(directory: Path, flat: bool) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return {"pytables.h5": write_pytables(directory / "pytables.h5", flat=flat),
            "records.h5": write_records(directory / "records.h5", flat=flat)}


@pytest.fixture(scope="module", params=["hsds", "lindi"])
def source(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Source]:
    base = tmp_path_factory.mktemp(f"h5table-{request.param}")
    if request.param == "hsds":
        if not hsds_node_available():
            pytest.skip("hsds-node/hsload not installed")
        files = write_files(base / "src", flat=False)
        root = base / "root"
        with HsdsServer(root, BUCKET, log_dir=base / "logs") as server:
            for name, path in files.items():
                server.load(path, f"/home/admin/{name}")
            for name, path in files.items():
                server.flush_and_verify(f"/home/admin/{name}", path)
        with mounted(root / BUCKET, base / "mnt") as mp:
            yield Source("hsds", files, {name: mp / "home/admin" / name for name in files})
        return
    if not lindi_available():
        pytest.skip("lindi is not installed (.venv-lindi)")
    files = write_files(base / "src", flat=True)
    with mounted(write_lindi("json", files["pytables.h5"], base / "pytables.lindi.json"),
                 base / "mnt-pytables") as mp1, \
            mounted(write_lindi("json", files["records.h5"], base / "records.lindi.json"),
                    base / "mnt-records") as mp2:
        yield Source("lindi", files, {"pytables.h5": mp1, "records.h5": mp2})


# --------------------------------------------------------------------------- expected


def leaves(dtype: np.dtype, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Field paths of a compound dtype, nested compounds walked, in type order."""
    for name in dtype.names or ():
        sub = dtype.fields[name][0]
        if sub.names is not None:
            yield from leaves(sub, (*path, name))
        else:
            yield (*path, name)


def field(values: np.ndarray, path: tuple[str, ...]) -> np.ndarray:
    for name in path:
        values = values[name]
    return values


def field_dtype(dtype: np.dtype, path: tuple[str, ...]) -> np.dtype:
    for name in path:
        dtype = dtype.fields[name][0]
    return dtype


def text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def check_column(got: pd.Series, want: np.ndarray, dtype: np.dtype, where: str,
                 enum_names: bool) -> None:
    enum = h5py.check_enum_dtype(dtype)
    if dtype.subdtype is not None:
        parsed = np.array([json.loads(v) for v in got], dtype=dtype.base)
        np.testing.assert_array_equal(parsed.reshape(want.shape), want, err_msg=where)
    elif enum is not None and enum_names:
        names = {v: k for k, v in enum.items()}
        assert got.tolist() == [names[int(v)] for v in want], where
    elif dtype.kind == "f":
        assert got.dtype == np.float64, where
        np.testing.assert_array_equal(got.to_numpy().astype(dtype), want, err_msg=where)
    elif dtype.kind in "iub":
        assert got.tolist() == want.tolist(), where
    else:  # strings: pandas reads an empty field as NaN
        assert [v if isinstance(v, str) else "" for v in got] == [text(v) for v in want], where


def check_csv(path: Path, ds: h5py.Dataset, enum_names: bool) -> None:
    frame = pd.read_csv(path)
    values = ds[()]
    paths = list(leaves(ds.dtype))
    assert list(frame.columns) == [".".join(p) for p in paths]
    assert len(frame) == ds.shape[0]
    if not len(frame):
        return
    for p in paths:
        check_column(frame[".".join(p)], field(values, p), field_dtype(ds.dtype, p),
                     f"{path}: {'.'.join(p)}", enum_names)


# --------------------------------------------------------------------------- tests


def test_tables_read_back_as_h5py_reads_them(source: Source) -> None:
    for name, h5path in source.tables():
        csv_path = source.roots[name] / (h5path.lstrip("/") + ".csv")
        with h5py.File(source.files[name]) as f:
            # HSDS keeps enum names; lindi does not (the values stay numbers).
            check_csv(csv_path, f[h5path], enum_names=source.kind == "hsds")


def test_only_unclaimed_1d_compounds_get_a_csv(source: Source) -> None:
    root = source.roots["records.h5"]
    listing = set(os.listdir(root))
    for h5path in NOT_TABLES:
        assert h5path[1:] in listing
        assert f"{h5path[1:]}.csv" not in listing
        assert not (root / f"{h5path[1:]}.csv").exists()
    assert "records.csv" in listing


def test_nested_and_special_text(source: Source) -> None:
    lines = (source.roots["records.h5"] / "small.csv").read_bytes().decode().split("\n")
    header = "id,label,x,y,ok,big"
    if source.kind == "hsds":
        header += ",pos.x,pos.y,box.corner.lo,box.corner.hi,box.size,v,color"
    assert lines[0] == header
    assert lines[1].startswith("0,plain,0.0,-0.0,True,-4611686018427387904")
    assert lines[2].startswith('1,"with,comma",0.33333334,-0.00001,False,')
    assert lines[3].startswith('2,"say ""hi""",0.6666667,')
    assert lines[4:6] == ['3,"line', lines[5]] and lines[5].startswith('break",')
    assert lines[6].startswith('4," lead",1.3333334,-0.00004,False,')
    assert lines[7].startswith("5,\"trail \",nan,")
    assert lines[8].startswith("6,été 名,2.0,-inf,True,")
    if source.kind == "hsds":
        assert lines[1].endswith(',"[[0.0,0.25],[0.5,0.75]]",RED')
        assert lines[2].endswith(",GREEN") and lines[3].endswith(",BLUE")
        vlen = (source.roots["records.h5"] / "with_vlen.csv").read_bytes()
        assert vlen == b'n,s\n1,first\n2,\n3,"drittes \xc3\x9f, x"\n4,"q""uote\n"\n'
        readout = (source.roots["pytables.h5"] / "detector/small.csv").read_text()
        assert readout.startswith(
            "id,name,energy,charge,hit,weight,color,samples,pos.x,pos.y\n"
            '-10,"p0,x",0.0,-1,1,0.0,red,"[0.0,0.5,0.0]",0.0,0.0\n')


def test_tools_agree_with_stat(source: Source, tmp_path: Path) -> None:
    csv_path = source.roots["pytables.h5"] / "detector/readout.csv"
    size = csv_path.stat().st_size
    data = csv_path.read_bytes()
    assert size == len(data) > 200_000
    copied = tmp_path / "cp.csv"
    subprocess.run(["cp", str(csv_path), str(copied)], check=True)
    assert copied.read_bytes() == data
    wc = subprocess.run(["wc", "-c", str(csv_path)], check=True, capture_output=True, text=True)
    assert int(wc.stdout.split()[0]) == size
    tail = subprocess.run(["tail", "-n", "2", str(csv_path)], check=True, capture_output=True)
    assert tail.stdout == b"".join(data.splitlines(keepends=True)[-2:])
    assert tail.stdout.startswith(b"14984,p4998,") and b"\n14987,p4999," in tail.stdout
    head = subprocess.run(["head", "-c", "4096", str(csv_path)], check=True, capture_output=True)
    assert head.stdout == data[:4096]
    if shutil.which("rsync"):
        synced = tmp_path / "rsync.csv"
        subprocess.run(["rsync", str(csv_path), str(synced)], check=True)
        assert synced.read_bytes() == data
    shutil.copyfile(csv_path, tmp_path / "copyfile.csv")
    assert (tmp_path / "copyfile.csv").read_bytes() == data
    with open(csv_path, "rb") as f:  # reads at offsets, as a pager would
        for offset in (size - 1, 0, size // 2, 17, size - 4096):
            f.seek(offset)
            assert f.read(3000) == data[offset:offset + 3000]
