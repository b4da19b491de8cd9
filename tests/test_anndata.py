"""anndata's views (``layouts.views.anndata``) on real ``.h5ad`` files, through real mounts.

``tests/anndata_tool.py`` writes the files with anndata itself, in
``.venv-conv`` (anndata pins pandas below 3), and exports what anndata reads
back from each. The files are mounted two ways: hsloaded into a real HSDS
bucket, and as LINDI reference files written by lindi (``.venv-lindi``).
Every view is read with the tools a user would use and compared with
anndata's reading: ``pandas.read_csv(NAME.csv, index_col=0)`` against the
dataframe (categoricals as their labels, missing values as NaN),
``scipy.io.mmread(NAME.mtx)`` against the matrix, ``NAME.txt`` lines and
``NAME.jsonl`` values against the element, the sidecars' ``anndata`` keys
and scalar ``value``s. ``cp``, ``rsync``, ``tar``, ``shutil.copyfile``,
``wc -c`` and ``tail`` on a fresh mount agree with ``stat``. The daemon's
own tree, in this process with tiny blocks, must give the same bytes.

Without a mount, over datasets in memory: every row range of awkward arrays
of every form (anndata's packed ones and the rest) against awkward's own
slicing, ``.mtx`` files of each data type and of CSR and CSC against
``scipy.io.mmread``, and which categories a categorical column reads.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import scipy.io
import scipy.sparse
import trio

from layouts.model import Attribute, Dataset, ElementType, Group, Link, LinkKind
from layouts.views._columns import DatasetColumn
from layouts.views.anndata._elements import CategoricalColumn, SparseMtx
from layouts.views.anndata._files import AwkwardRows, mtx_value, sparse_of
from tests import tiers
from tests.hsds_server import HsdsServer, hsds_node_available
from tests.lindi_files import lindi_available, write_lindi
from tests.modelcat import MemoryChunks
from tests.mounting import REPO, fuse_available, mounted

CONV_PYTHON = REPO / ".venv-conv" / "bin" / "python"
TOOL = Path(__file__).with_name("anndata_tool.py")
NAMES = ("sparse", "strings", "big")
BUCKET = "anndata"
FOLDER = "home/admin"



@dataclass(frozen=True)
class Written:
    """The ``.h5ad`` files, and for each the directory of what anndata reads."""

    files: dict[str, Path]
    expected: dict[str, Path]

    def want(self, name: str) -> dict[str, Any]:
        return json.loads((self.expected[name] / "expected.json").read_text())

    def matrix(self, name: str, key: str) -> Any:
        base = self.expected[name] / key.replace("/", "__")
        if base.with_suffix(".npz").exists():
            return scipy.sparse.load_npz(base.with_suffix(".npz"))
        return np.load(base.with_suffix(".npy"))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    if not CONV_PYTHON.exists():
        pytest.skip(f"anndata is not installed: {CONV_PYTHON} is missing (run dev/setup)")
    tiers.uses("tools")
    base = tmp_path_factory.mktemp("anndata")
    subprocess.run([str(CONV_PYTHON), str(TOOL), "write", str(base / "files")],
                   check=True, capture_output=True)
    files = {name: base / "files" / f"{name}.h5ad" for name in NAMES}
    expected = {name: base / "expected" / name for name in NAMES}
    for name in NAMES:
        subprocess.run([str(CONV_PYTHON), str(TOOL), "read", str(files[name]),
                        str(expected[name])], check=True, capture_output=True)
    return Written(files, expected)


@pytest.fixture(scope="module")
def hsds_bucket_dir(written: Written, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files hsloaded into a real HSDS bucket, flushed and checked; HSDS stopped."""
    if not hsds_node_available():
        pytest.skip("hsds-node/hsload/hstouch not installed")
    base = tmp_path_factory.mktemp("anndata-hsds")
    with HsdsServer(base / "root", BUCKET, log_dir=base / "logs") as server:
        for name, path in written.files.items():
            server.load(path, f"/{FOLDER}/{name}.h5ad")
        for name, path in written.files.items():
            server.flush_and_verify(f"/{FOLDER}/{name}.h5ad", path)
    return base / "root" / BUCKET


@pytest.fixture(scope="module")
def lindi_files(written: Written) -> dict[str, Path]:
    if not lindi_available():
        pytest.skip("lindi is not installed (.venv-lindi)")
    return {name: write_lindi("json", path, path.with_suffix(".lindi.json"))
            for name, path in written.files.items()}


@dataclass(frozen=True)
class Mounted:
    """Where each file's root group is in a mount, and its sidecar."""

    roots: dict[str, Path]
    sidecars: dict[str, Path]


def need_fuse() -> None:
    reason = fuse_available()
    if reason is not None:
        pytest.skip(f"no FUSE: {reason}")


@contextlib.contextmanager
def mount_hsds(bucket_dir: Path, mountpoint: Path) -> Iterator[Mounted]:
    need_fuse()
    with mounted(bucket_dir, mountpoint) as mp:
        folder = mp / FOLDER
        yield Mounted({name: folder / f"{name}.h5ad" for name in NAMES},
                      {name: folder / f"{name}.h5ad.json" for name in NAMES})


@contextlib.contextmanager
def mount_lindi(files: dict[str, Path], base: Path) -> Iterator[Mounted]:
    need_fuse()
    with contextlib.ExitStack() as stack:
        roots = {name: stack.enter_context(mounted(path, base / name))
                 for name, path in files.items()}
        yield Mounted(roots, {name: root / ".root.json" for name, root in roots.items()})


@pytest.fixture(scope="module")
def hsds_mount(hsds_bucket_dir: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Mounted]:
    with mount_hsds(hsds_bucket_dir, tmp_path_factory.mktemp("mnt")) as m:
        yield m


@pytest.fixture(scope="module")
def lindi_mount(lindi_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Mounted]:
    with mount_lindi(lindi_files, tmp_path_factory.mktemp("mnt")) as m:
        yield m


@pytest.fixture(params=["hsds", "lindi"])
def mount(request: pytest.FixtureRequest) -> Mounted:
    return request.getfixturevalue(f"{request.param}_mount")


# --------------------------------------------------------------------------- helpers


def normal(value: Any) -> Any:
    """A value as anndata or pandas gives it, comparable across the two:
    missing (None, NaN, NA) as None, bools, numbers as floats, strings."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    if isinstance(value, bool | np.bool_):
        return ("bool", bool(value))
    if isinstance(value, int | float | np.integer | np.floating):
        return ("number", float(value))
    return ("text", str(value))


def assert_frame(csv: Path, want: dict[str, Any]) -> None:
    """``pandas.read_csv(csv, index_col=0)`` is the frame anndata reads (an
    index of digits, anndata's default ``var_names``, reads back as numbers:
    compared as text)."""
    got = pd.read_csv(csv, index_col=0)
    assert got.index.name == want["index_name"], csv
    assert [str(v) for v in got.index] == want["index"], csv
    assert list(got.columns) == list(want["columns"]), csv
    for name, values in want["columns"].items():
        assert [normal(v) for v in got[name].tolist()] == [normal(v) for v in values], \
            (csv, name)


def assert_matrix(mtx: Path, want: Any) -> None:
    """``scipy.io.mmread(mtx)`` is the matrix anndata reads."""
    got = scipy.io.mmread(mtx)
    assert scipy.sparse.issparse(got), mtx
    assert got.shape == want.shape and got.nnz == want.nnz, (mtx, got.shape, got.nnz)
    np.testing.assert_array_equal(got.toarray().astype(want.dtype), want.toarray(),
                                  err_msg=str(mtx))


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1]


def view_files(root: Path) -> list[Path]:
    """Every view file the anndata views show under ``root``."""
    return sorted(p for p in root.rglob("*")
                  if p.suffix in {".csv", ".mtx", ".txt", ".jsonl"} and p.is_file())


# --------------------------------------------------------------------------- the views


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
def test_dataframes_read_back_with_pandas(mount: Mounted, written: Written) -> None:
    for name in NAMES:
        want = written.want(name)
        assert_frame(mount.roots[name] / "obs.csv", want["obs"])
        assert_frame(mount.roots[name] / "var.csv", want["var"])
    assert_frame(mount.roots["sparse"] / "raw" / "var.csv", written.want("sparse")["raw_var"])


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
def test_dataframe_csv_text(mount: Mounted) -> None:
    """The exact text of a small frame: RFC 4180 quoting, empty fields for
    missing values, the unnamed index headed by an empty field."""
    text = (mount.roots["sparse"] / "obs.csv").read_text().split("\n")
    assert text[0] == ",cat,nint,nbool,s,b,f,i"
    assert text[1] == 'cell0,a,1,True,"s 0, with comma",False,0.1,0'
    assert text[3] == "cell2,,3,False,s2,False,1e+20,2000"
    assert text[6] == 'cell5,"q""x",,True,s5,True,0.3333333333333333,5000'
    assert text[-1] == "" and len(text) == 14
    strings = (mount.roots["strings"] / "obs.csv").read_text()
    assert strings.startswith("cell,name,code,v\nc0,p,x1,0.0\nc1,,x2,1.0\n"), strings


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
def test_sparse_matrices_read_back_with_scipy(mount: Mounted, written: Written) -> None:
    root = mount.roots["sparse"]
    for key in ("X", "layers/csc", "obsp/conn", "varp/corr"):
        assert_matrix(root / f"{key}.mtx", written.matrix("sparse", key))
    assert_matrix(root / "raw" / "X.mtx", written.matrix("sparse", "X"))
    assert (root / "X.mtx").read_text().startswith(
        "%%MatrixMarket matrix coordinate real general\n12 5 ")
    big = mount.roots["big"]
    assert_matrix(big / "X.mtx", written.matrix("big", "X"))
    assert_matrix(big / "layers" / "counts.mtx", written.matrix("big", "layers/counts"))
    assert (big / "layers" / "counts.mtx").read_text().startswith(
        "%%MatrixMarket matrix coordinate integer general\n")
    # dense matrices have their .npy, and no .mtx
    np.testing.assert_array_equal(np.load(root / "layers" / "dense.npy"),
                                  written.matrix("sparse", "layers/dense"))
    np.testing.assert_array_equal(np.load(mount.roots["strings"] / "X.npy"),
                                  written.matrix("strings", "X"))
    assert not (root / "layers" / "dense.mtx").exists()


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
def test_awkward_arrays_as_json_lines(mount: Mounted, written: Written) -> None:
    for name in ("sparse", "big"):
        for key, rows in written.want(name)["awkward"].items():
            path = mount.roots[name] / "obsm" / f"{key}.jsonl"
            assert [json.loads(line) for line in lines(path)] == rows, path


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
def test_elements_as_lines(mount: Mounted) -> None:
    uns = mount.roots["sparse"] / "uns"
    assert lines(uns / "cats.txt") == ["u", "v", "", "u"]
    assert lines(uns / "strs.txt") == ["a", "b b", "c,c"]
    assert lines(uns / "nint.txt") == ["1", "", "3"]
    assert lines(uns / "nbool.txt") == ["", "True", "False"]
    assert lines(uns / "nstr.txt") == ["u", "", "w"]
    # parts of a dataframe, a categorical or a nullable element get no .txt
    for part in ("obs/cat.txt", "obs/_index.txt", "obs/s.txt", "uns/cats/categories.txt",
                 "uns/nstr/values.txt", "var/gene.txt"):
        assert not (mount.roots["sparse"] / part).exists(), part


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
def test_scalars_in_the_sidecar(mount: Mounted, written: Written) -> None:
    uns = written.want("sparse")["uns"]
    root = mount.roots["sparse"] / "uns"
    for path, want in (("scal", uns["scal"]), ("count", uns["count"]), ("str", uns["str"]),
                       ("d/i", uns["d"]["i"]), ("d/inner/s", uns["d"]["inner"]["s"])):
        doc = json.loads((root / f"{path}.json").read_text())
        assert doc["value"] == want, path
        kind = "string" if isinstance(want, str) else "numeric-scalar"
        assert doc["anndata"] == {"encoding-type": kind, "encoding-version": "0.2.0"}, path


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
def test_sidecar_keys(mount: Mounted) -> None:
    root = json.loads(mount.sidecars["sparse"].read_text())["anndata"]
    assert root == {
        "encoding-type": "anndata", "encoding-version": "0.1.0",
        "n_obs": 12, "n_vars": 5, "X": "csr_matrix",
        "layers": {"csc": "csc_matrix", "dense": "array"},
        "obsm": {"awk": "awkward-array", "pca": "array", "records": "awkward-array"},
        "varm": {}, "obsp": {"conn": "csr_matrix"}, "varp": {"corr": "csc_matrix"},
        "uns": {"cats": "categorical", "count": "numeric-scalar", "d": "dict",
                "nbool": "nullable-boolean", "nint": "nullable-integer",
                "nstr": "nullable-string-array", "scal": "numeric-scalar", "str": "string",
                "strs": "string-array"},
    }
    base = mount.roots["sparse"]

    def key(path: str) -> Any:
        return json.loads((base / f"{path}.json").read_text())["anndata"]

    assert key("raw") == {"encoding-type": "raw", "encoding-version": "0.1.0", "n_vars": 5,
                          "X": "csr_matrix", "varm": {}}
    assert key("obs") == {
        "encoding-type": "dataframe", "encoding-version": "0.2.0", "index": "_index", "rows": 12,
        "columns": {"cat": "categorical", "nint": "nullable-integer",
                    "nbool": "nullable-boolean", "s": "string-array", "b": "array",
                    "f": "array", "i": "array"}}
    assert key("X") == {"encoding-type": "csr_matrix", "encoding-version": "0.1.0",
                        "shape": [12, 5], "stored": scipy.io.mmread(base / "X.mtx").nnz}
    assert key("var/g") == {"encoding-type": "categorical", "encoding-version": "0.2.0",
                            "rows": 5, "categories": 2, "ordered": True}
    assert key("obs/cat")["ordered"] is False
    assert key("uns/nint") == {"encoding-type": "nullable-integer", "encoding-version": "0.1.0",
                               "rows": 3}
    awk = key("obsm/awk")
    assert awk["length"] == 12 and awk["form"]["class"] == "ListOffsetArray"
    assert key("obs/_index") == {"encoding-type": "string-array", "encoding-version": "0.2.0"}
    strings = json.loads(mount.sidecars["strings"].read_text())["anndata"]
    assert (strings["n_obs"], strings["n_vars"], strings["X"]) == (5, 3, "array")
    assert json.loads((mount.roots["strings"] / "obs" / "cell.json").read_text()
                      )["anndata"]["encoding-type"] == "nullable-string-array"


# --------------------------------------------------------------------------- sizes and tools


def tool_output(*args: str) -> bytes:
    return subprocess.run(args, check=True, capture_output=True, timeout=120).stdout


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
@pytest.mark.parametrize("source", ["hsds", "lindi"])
def test_tools_agree_with_stat(source: str, request: pytest.FixtureRequest,
                               tmp_path: Path) -> None:
    """On a fresh mount (no size known yet), ``stat`` gives each view file's
    exact size and cp, rsync, tar, shutil.copyfile, wc -c and tail agree."""
    if source == "hsds":
        fresh = mount_hsds(request.getfixturevalue("hsds_bucket_dir"), tmp_path / "mnt")
    else:
        fresh = mount_lindi(request.getfixturevalue("lindi_files"), tmp_path / "mnt")
    with fresh as m:
        root = m.roots["big"]
        listed = {p.name for p in root.iterdir()}
        assert {"obs.csv", "var.csv", "X.mtx"} <= listed
        picks = [root / "obs.csv", root / "X.mtx", root / "layers" / "counts.mtx",
                 root / "obsm" / "lists.jsonl", m.roots["sparse"] / "uns" / "cats.txt"]
        for i, path in enumerate(picks):
            size = os.stat(path).st_size
            out = tmp_path / f"copy{i}"
            out.mkdir()
            subprocess.run(["cp", str(path), str(out / "cp")], check=True)
            data = (out / "cp").read_bytes()
            assert len(data) == size > 0, (path, len(data), size)
            assert path.read_bytes() == data, path
            subprocess.run(["rsync", str(path), str(out / "rsync")], check=True)
            assert (out / "rsync").read_bytes() == data, path
            shutil.copyfile(path, out / "copyfile")
            assert (out / "copyfile").read_bytes() == data, path
            assert tool_output("wc", "-c", str(path)).split()[0] == str(size).encode(), path
            assert tool_output("tail", "-c", "100", str(path)) == data[-100:], path
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(path, arcname="f")
            with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
                member = tar.extractfile("f")
                assert member is not None and member.read() == data, path


# --------------------------------------------------------------------------- blocks


@pytest.mark.mount
@pytest.mark.hsds
@pytest.mark.tools
def test_small_blocks_give_the_same_bytes(lindi_files: dict[str, Path], lindi_mount: Mounted,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's tree in this process, with blocks of a few rows and
    entries (so pieces end mid-chunk, mid-row and mid-list), shows every
    view file with the bytes of the mount's default blocks."""
    from layouts.views import VIEWS  # noqa: PLC0415
    from layouts.views import _columns as columns  # noqa: PLC0415
    from layouts.views.anndata import _files as anndata_files  # noqa: PLC0415
    from mountd.cache.chunkcache import ChunkCache  # noqa: PLC0415
    from mountd.cache.metacache import CachedCatalog  # noqa: PLC0415
    from mountd.config import MountConfig  # noqa: PLC0415
    from mountd.sources import open_source  # noqa: PLC0415
    from mountd.tree import make_tree  # noqa: PLC0415
    from mountd.tree.nodes import DirNode, FileNode  # noqa: PLC0415

    monkeypatch.setattr(anndata_files, "ENTRY_STEP", 1000)
    monkeypatch.setattr(anndata_files, "MAJOR_STEP", 77)
    monkeypatch.setattr(columns, "BLOCK_BYTES", 700)
    monkeypatch.setattr(columns, "FIRST_BLOCK_ROWS", 1)

    async def read_all(source: Path, rels: list[Path]) -> list[bytes]:
        config = MountConfig(source=str(source), mountpoint="/nonexistent")
        got = []
        async with open_source(config) as opened, trio.open_nursery() as nursery:
            tree = make_tree(CachedCatalog(opened.catalog, ttl=60), views=VIEWS,
                             chunk_cache=ChunkCache(64 << 20, nursery))
            for rel in rels:
                node: Any = await tree.root()
                for part in rel.parts:
                    assert isinstance(node, DirNode)
                    node = await node.lookup(part)
                assert isinstance(node, FileNode)
                handle = await node.open()
                out = bytearray()
                while piece := await handle.read(len(out), 1 << 16):
                    out += piece
                got.append(bytes(out))
            nursery.cancel_scope.cancel()
        return got

    checked = 0
    for name in ("sparse", "big"):
        root = lindi_mount.roots[name]
        rels = [path.relative_to(root) for path in view_files(root)]
        for rel, data in zip(rels, trio.run(read_all, lindi_files[name], rels), strict=True):
            assert data == (root / rel).read_bytes(), rel
            checked += 1
    assert checked >= 16


# --------------------------------------------------------------------------- in memory


class MemoryContext:
    """The part of a view context the anndata files use, over an in-memory
    group whose children are datasets."""

    def __init__(self, attrs: dict[str, Any], children: dict[str, np.ndarray],
                 chunk: int = 3) -> None:
        self.children = {name: memory_dataset(name, values, chunk)
                         for name, values in children.items()}
        self.obj = Group(id="g", attrs=tuple(Attribute(k, v) for k, v in attrs.items()),
                         links={name: Link(LinkKind.HARD, name) for name in children})
        self.path = "/g"
        self.block_counts = None

    async def child(self, path: str) -> Dataset | None:
        return self.children.get(path)

    async def chunks(self, ds: Dataset, indices: list[tuple[int, ...]]) -> list[bytes | None]:
        return [await ds.read_chunk(index) for index in indices]

    def prefetch(self, ds: Dataset, indices: list[tuple[int, ...]]) -> int:
        return len(indices)

    def error(self, reason: str) -> Exception:
        return ValueError(reason)


def memory_dataset(name: str, values: np.ndarray, chunk: int) -> Dataset:
    """``values`` as a dataset of ``chunk`` rows a chunk, held in memory."""
    values = np.ascontiguousarray(values)
    chunks = (chunk, *values.shape[1:])
    blocks = {}
    for k in range(-(-values.shape[0] // chunk)):
        block = np.zeros(chunks, values.dtype)
        part = values[k * chunk:(k + 1) * chunk]
        block[:len(part)] = part
        blocks[(k, *(0,) * (values.ndim - 1))] = block.tobytes()
    return Dataset(id=name, shape=values.shape, maxshape=values.shape, chunks=chunks,
                   type=ElementType(values.dtype, values.dtype.str, {}), fill_value=None,
                   store=MemoryChunks(blocks))


def awkward_layouts() -> dict[str, Any]:
    """Arrays of every form awkward writes, anndata's packed ones and others."""
    import awkward as ak  # noqa: PLC0415

    c, index = ak.contents, ak.index
    numbers = c.NumpyArray(np.arange(10, dtype=np.float64))
    bits = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=np.uint8)
    return {
        "lists": ak.Array([[1, 2], [], [3], [4, 5, 6], [7], [], [8, 9]]).layout,
        "strings": ak.Array(["ab", "", "cde", "f", "gh", "ij", ""]).layout,
        "bytes": ak.Array([b"ab", b"", b"c\xff", b"d"]).layout,
        "records": ak.Array([{"x": i, "y": [0.5] * (i % 3), "z": None if i % 4 else "s"}
                             for i in range(9)]).layout,
        "tuples": ak.Array([(i, str(i)) for i in range(6)]).layout,
        "union": ak.Array([1, "a", [2, 3], None, 2.5, "bc", [], 7]).layout,
        "regular": ak.to_regular(ak.Array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 0]])).layout,
        "inner_shape": c.NumpyArray(np.arange(24).reshape(6, 2, 2)),
        "nested": ak.Array([[[1], []], [], [[2, 3], [4]], [[5]]]).layout,
        "listarray": c.ListArray(index.Index64(np.array([4, 0, 7, 7, 2])),
                                 index.Index64(np.array([6, 3, 7, 10, 4])), numbers),
        "indexed": c.IndexedArray(index.Index64(np.array([9, 0, 3, 3, 5])), numbers),
        "bytemasked": c.ByteMaskedArray(index.Index8(bits.astype(np.int8)), numbers,
                                        valid_when=False),
        "bitmasked": c.BitMaskedArray(index.IndexU8(np.packbits(bits, bitorder="little")),
                                      numbers, valid_when=True, length=10, lsb_order=True),
        "bitmasked_msb": c.BitMaskedArray(index.IndexU8(np.packbits(bits, bitorder="big")),
                                          numbers, valid_when=False, length=10,
                                          lsb_order=False),
        "unmasked": c.UnmaskedArray(numbers),
        "empty": ak.Array([[], [], []]).layout,
    }


@pytest.mark.parametrize("kind", list(awkward_layouts()))
def test_awkward_rows_read_only_what_they_need(kind: str) -> None:
    """Every row range of every form reads back as awkward slices it, from
    buffers in chunks of 3 (as anndata writes them: ``to_buffers``)."""
    import awkward as ak  # noqa: PLC0415

    array = ak.Array(awkward_layouts()[kind])
    form, length, buffers = ak.to_buffers(array)
    ctx: Any = MemoryContext({"encoding-type": "awkward-array", "length": length,
                              "form": form.to_json()}, buffers)

    async def main() -> None:
        rows = AwkwardRows.of(ctx)
        assert rows.length == length
        for a in range(length + 1):
            for b in range(a, length + 2):
                assert await rows.values(ctx, a, b) == array[a:b].to_list(), (a, b)
    trio.run(main)


@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<i2", "|u1", "|b1", "<c16"])
@pytest.mark.parametrize("by_row", [True, False])
def test_mtx_of_every_data_type(dtype: str, by_row: bool) -> None:
    """CSR and CSC data of each kind, with empty rows and columns, read back
    with ``scipy.io.mmread``."""
    rng = np.random.default_rng(3)
    dense = (rng.random((7, 5)) < 0.35) * rng.integers(1, 100, (7, 5))
    dense[2] = 0
    dense[:, 3] = 0
    native = np.dtype(dtype).newbyteorder("=")
    values = (dense / 7).astype(native) if native.kind in "fc" else dense.astype(native)
    if native.kind == "c":
        values = values * (1 - 2j)
    matrix = scipy.sparse.csr_matrix(values) if by_row else scipy.sparse.csc_matrix(values)
    ctx: Any = MemoryContext(
        {"encoding-type": "csr_matrix" if by_row else "csc_matrix", "shape": [7, 5]},
        {"data": matrix.data.astype(dtype), "indices": matrix.indices,
         "indptr": matrix.indptr})

    async def main() -> tuple[bytes, int, list[str]]:
        sparse = await sparse_of(ctx, by_row)
        texts = await DatasetColumn(sparse.data, "v", format=mtx_value(native.kind)).texts(
            ctx, 0, matrix.nnz)
        view = SparseMtx()
        return (b"".join([piece async for piece in view.pieces(ctx)]), await view.size(ctx),
                texts)

    text, size, value_texts = trio.run(main)
    got = scipy.io.mmread(io.BytesIO(text))
    assert got.nnz == matrix.nnz
    np.testing.assert_array_equal(got.toarray().astype(values.dtype), values)
    # The lines are the values' texts made one by one, in storage order, and
    # the size counted without making them is their length.
    major = np.repeat(np.arange(len(matrix.indptr) - 1), np.diff(matrix.indptr)) + 1
    pairs = zip(major, matrix.indices + 1, strict=True) if by_row else \
        zip(matrix.indices + 1, major, strict=True)
    lines = [f"{r} {c} {t}\n" for (r, c), t in zip(pairs, value_texts, strict=True)]
    assert text.decode().split("\n", 2)[2] == "".join(lines)
    assert size == len(text)


def test_categorical_reads_the_labels_its_codes_use() -> None:
    """Codes far apart read separate runs of categories; -1 is empty; a code
    past the categories is an error."""
    categories = np.arange(5000, dtype="<i4") * 10
    codes = np.array([-1, 0, 4999, 2000, 2001, -1, 10, 4999], dtype="<i2")
    ctx: Any = MemoryContext({}, {"codes": codes, "categories": categories}, chunk=64)
    column = CategoricalColumn(ctx.children["codes"], ctx.children["categories"], "c")
    read: list[tuple[int, int]] = []
    texts = column.labels.texts

    async def spy(ctx: Any, start: int, stop: int) -> list[str]:
        read.append((start, stop))
        return await texts(ctx, start, stop)

    column.labels.texts = spy  # type: ignore[method-assign]

    async def main() -> None:
        assert await column.texts(ctx, 0, 8) == ["", "0", "49990", "20000", "20010", "", "100",
                                                  "49990"]
        assert sorted(read) == [(0, 11), (2000, 2002), (4999, 5000)]
        bad: Any = MemoryContext({}, {"codes": np.array([5000], "<i2"),
                                      "categories": categories})
        broken = CategoricalColumn(bad.children["codes"], bad.children["categories"], "c")
        with pytest.raises(ValueError, match="outside"):
            await broken.texts(bad, 0, 1)
    trio.run(main)
