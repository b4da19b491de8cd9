"""Mounting LINDI and kerchunk reference files through the real daemon.

The HDF5 files are the session's test files (``tests/h5files.py``), the same
ones the HSDS fixture hsloads, served by a real loopback HTTP server with
Range support (``tests/http_server.py``). Reference files are written by the
real ``lindi`` package (in its own virtualenv, ``tests/lindi_files.py``) and
the real ``kerchunk``, with refs that are remote URLs. Each mount is compared
with h5py (every chunk, sidecar and ``.npy``) and with the HSDS mount of the
same file (``mnt``): the same names, sidecars, xattrs and bytes, except what
a reference file does not record (see ``LEGITIMATE``). With ``-o cache_decoded``
a remount serves chunks decoded from its cache_dir, without a GET of the file.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numcodecs
import numpy as np
import pytest

from tests import h5files
from tests.faultproxy import FaultProxy
from tests.h5compare import (
    expected_chunk,
    expected_json,
    mount_file,
    symlinks_leaving,
    walk_links,
)
from tests.http_server import RangeHttpServer
from tests.lindi_files import lindi_available, write_lindi
from tests.mounting import fuse_available, mounted, run_h5mount
from tests.test_decodedcache import wait_decoded

pytestmark = [pytest.mark.mount, pytest.mark.hsds, pytest.mark.server, pytest.mark.tools,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

#: Test files lindi 0.4.6 can describe (it refuses the others as a whole; see
#: ``h5files.write_refs``).
LINDI_FILES = ("refs.h5", "filters.h5", "layout.h5", "extlink_target.h5")

#: Sidecar keys a reference file cannot reproduce from an HSDS mount, and why:
#: ids and times are HSDS's own (a reference file has neither: ids are paths,
#: times the reference file's), ``hdf5`` is each format's own description,
#: lindi does not record ``maxshape``, and the chunk shape differs where HSDS
#: chose its own grid (contiguous and 1-D datasets; compared by ``.npy`` only).
LEGITIMATE = ("id", "modified", "hdf5", "maxshape", "chunks", "domain")

#: Datasets whose fill value the LINDI file does not keep: lindi inlines a
#: dataset under 1000 elements as one chunk with the fill already applied, and
#: writes zarr's default ``fill_value`` (0) for it. Their data still matches.
LINDI_FILL_LOST = {"fill_int", "fill_nan", "fill_compound"}


@dataclass(frozen=True)
class Served:
    """The HDF5 files and their reference files, on disk and over HTTP."""

    root: Path
    server: RangeHttpServer

    def url(self, name: str) -> str:
        return self.server.url_for(name)


@pytest.fixture(scope="module")
def served(hsds_bucket, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if not lindi_available():
        pytest.skip("lindi is not installed in .venv-lindi (run dev/setup)")
    root = tmp_path_factory.mktemp("served")
    for name in LINDI_FILES:
        shutil.copyfile(hsds_bucket.source_dir / name, root / name)
    with RangeHttpServer(root) as server:
        here = Served(root, server)
        for name in LINDI_FILES:
            write_lindi("json", root / name, root / f"{name}.lindi.json", url=here.url(name))
        yield here


def hsds_domain(hsds_bucket, name: str) -> str:
    """The HSDS domain test file ``name`` was hsloaded to without recompression."""
    return next(domain for domain, src in hsds_bucket.domains()
                if src.name == name and "-z" not in hsds_bucket.args[domain])


@pytest.fixture(scope="module")
def lindi_mounts(served: Served,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Each LINDI file mounted from its URL: refs, and the reference file, are remote."""
    mounts: dict[str, Path] = {}
    with ExitStack() as stack:
        for name in LINDI_FILES:
            mp = tmp_path_factory.mktemp(f"lindi-{name}")
            mounts[name] = stack.enter_context(mounted(served.url(f"{name}.lindi.json"), mp))
        yield mounts


# --------------------------------------------------------------------------- against h5py


def check_against_h5py(root: Path, h5: Path, only: set[str] | None = None) -> int:
    """Every object's attributes, and every dataset's chunks, sidecar and .npy under
    ``root`` equal h5py's (only the datasets at ``only`` paths, if given); returns the
    number of datasets checked."""
    checked = 0
    with h5py.File(h5, "r") as f:
        root_doc = json.loads((root / ".root.json").read_text())
        assert root_doc["attributes"] == {k: expected_json(v, f) for k, v in f.attrs.items()}
        for info in walk_links(f):
            ds = info.obj
            if isinstance(ds, h5py.Group) and info.cycle_to is None:
                side = json.loads((root / mount_file(info.path, ".json")).read_text())
                assert side["attributes"] == {k: expected_json(v, f)
                                              for k, v in ds.attrs.items()}, info.path
            if not isinstance(ds, h5py.Dataset) or (only is not None and info.path not in only):
                continue
            side = json.loads((root / mount_file(info.path, ".json")).read_text())
            assert side["attributes"] == {k: expected_json(v, f) for k, v in ds.attrs.items()}
            assert side["shape"] == list(ds.shape), info.path
            assert side["kind"] == "dataset"
            npy = root / mount_file(info.path, ".npy")
            if ds.dtype.kind not in "OV" or ds.dtype.names:
                got = np.load(npy)
                want = ds[()]
                assert got.dtype == want.dtype, info.path
                np.testing.assert_array_equal(got, want, err_msg=info.path)
            if ds.shape and ds.size:
                zarray = json.loads((root / mount_file(info.path, "") / ".zarray").read_text())
                chunks = zarray["chunks"]
                dtype = np.dtype(side["dtype"]) if isinstance(side["dtype"], str) \
                    and side["dtype"].startswith(("<", ">", "|")) else None
                for entry in os.scandir(root / mount_file(info.path, "")):
                    if entry.name.startswith(".") or dtype is None:
                        continue
                    index = tuple(int(i) for i in entry.name.split("."))
                    want_chunk = expected_chunk(ds, index, chunks, dtype)
                    got_chunk = np.frombuffer(Path(entry.path).read_bytes(), dtype=dtype)
                    np.testing.assert_array_equal(got_chunk.reshape(chunks), want_chunk,
                                                  err_msg=f"{info.path} {entry.name}")
            checked += 1
    return checked


@pytest.mark.parametrize("name", LINDI_FILES)
def test_lindi_mount_equals_h5py(name: str, lindi_mounts: dict[str, Path], served: Served) -> None:
    assert check_against_h5py(lindi_mounts[name], served.root / name) > 0


# --------------------------------------------------------------------------- against HSDS


def sidecar_core(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in LEGITIMATE}


def tree(root: Path) -> dict[str, os.stat_result]:
    out: dict[str, os.stat_result] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            out[str(path.relative_to(root))] = os.lstat(path)
    return out


def same_grid(a: Path, b: Path) -> bool:
    za, zb = (json.loads((p / ".zarray").read_text()) for p in (a, b))
    return za["chunks"] == zb["chunks"]


def compare_with_hsds(lindi_root: Path, hsds_root: Path, hsds_sidecar: Path) -> list[str]:
    """Differences between the LINDI and HSDS views of one file, beyond ``LEGITIMATE``."""
    problems: list[str] = []
    a, b = tree(lindi_root), tree(hsds_root)
    grid_differs = {rel for rel, st in a.items() if stat.S_ISDIR(st.st_mode)
                    and (lindi_root / rel / ".zarray").exists() and rel in b
                    and not same_grid(lindi_root / rel, hsds_root / rel)}

    def chunk_of_other_grid(rel: str) -> bool:
        parent = str(Path(rel).parent)
        return parent in grid_differs and not Path(rel).name.startswith(".")

    names_a = {r for r in a if not chunk_of_other_grid(r)} - {".root.json", ".root.h5"}
    names_b = {r for r in b if not chunk_of_other_grid(r)}
    if names_a != names_b:
        problems.append(f"names only in LINDI {sorted(names_a - names_b)[:10]}, "
                        f"only in HSDS {sorted(names_b - names_a)[:10]}")
    for rel in sorted(names_a & names_b):
        pa, pb = lindi_root / rel, hsds_root / rel
        sa, sb = a[rel], b[rel]
        if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode) or \
                stat.S_IMODE(sa.st_mode) != stat.S_IMODE(sb.st_mode):
            problems.append(f"{rel}: mode {oct(sa.st_mode)} vs {oct(sb.st_mode)}")
            continue
        if stat.S_ISLNK(sa.st_mode):
            if os.readlink(pa) != os.readlink(pb):
                problems.append(f"{rel}: symlink {os.readlink(pa)} vs {os.readlink(pb)}")
            continue
        xa = {n: os.getxattr(pa, n) for n in os.listxattr(pa) if n != "user.h5.id"}
        xb = {n: os.getxattr(pb, n) for n in os.listxattr(pb) if n != "user.h5.id"}
        if xa != xb:
            problems.append(f"{rel}: xattrs {xa} vs {xb}")
        if stat.S_ISDIR(sa.st_mode):
            continue
        problems += compare_files(rel, pa, pb, rel.split("/")[0] in grid_differs or
                                  str(Path(rel).parent) in grid_differs)
    root_a = sidecar_core(json.loads((lindi_root / ".root.json").read_text()))
    root_b = sidecar_core(json.loads(hsds_sidecar.read_text()))
    if root_a != root_b:
        problems.append(f"root sidecar {root_a} vs {root_b}")
    return problems


def compare_files(rel: str, pa: Path, pb: Path, other_grid: bool) -> list[str]:
    """Sidecars and ``.zattrs`` are compared parsed: attribute order is each format's own
    (HSDS keeps HDF5's, a LINDI file has them sorted by name)."""
    da, db = pa.read_bytes(), pb.read_bytes()
    if rel.endswith(".json"):
        ca, cb = sidecar_core(json.loads(da)), sidecar_core(json.loads(db))
        if rel.removesuffix(".json") in LINDI_FILL_LOST:
            ca.pop("fill_value"), cb.pop("fill_value")
        return [] if ca == cb else [f"{rel}: sidecar {ca} vs {cb}"]
    if pa.name == ".zattrs":
        ca, cb = json.loads(da), json.loads(db)
        return [] if ca == cb else [f"{rel}: {ca} vs {cb}"]
    if pa.name == ".zarray":
        ignore = ("chunks",) if other_grid else ()
        if str(Path(rel).parent) in LINDI_FILL_LOST:
            ignore += ("fill_value",)
        ca = {k: v for k, v in json.loads(da).items() if k not in ignore}
        cb = {k: v for k, v in json.loads(db).items() if k not in ignore}
        return [] if ca == cb else [f"{rel}: {ca} vs {cb}"]
    return [] if da == db else [f"{rel}: {len(da)} bytes differ from HSDS's {len(db)}"]


@pytest.mark.parametrize("name", LINDI_FILES)
def test_lindi_mount_equals_hsds_mount(name: str, lindi_mounts: dict[str, Path], mnt: Path,
                                       hsds_bucket) -> None:
    domain = hsds_domain(hsds_bucket, name)
    problems = compare_with_hsds(lindi_mounts[name], mnt / domain, mnt / f"{domain}.json")
    assert not problems, "\n".join(problems[:30])


# --------------------------------------------------------------------------- other forms


@pytest.mark.filterwarnings("ignore:The following exception was caught:UserWarning")
def test_kerchunk_reference_equals_h5py(served: Served, tmp_path: Path) -> None:
    kerchunk_hdf = pytest.importorskip("kerchunk.hdf")
    url = served.url("filters.h5")
    refs = kerchunk_hdf.SingleHdf5ToZarr(url, inline_threshold=100).translate()
    ref_path = tmp_path / "filters.kerchunk.json"
    ref_path.write_text(json.dumps(refs))
    # kerchunk leaves out what it cannot translate (fletcher32 here, with a warning).
    translated = {"/" + key.removesuffix("/.zarray") for key in refs["refs"]
                  if key.endswith("/.zarray")}
    assert len(translated) >= 4
    with mounted(ref_path, tmp_path / "mp") as mp:
        assert check_against_h5py(mp, served.root / "filters.h5", translated) == len(translated)


def test_lindi_tar_local_and_remote(served: Served, tmp_path: Path) -> None:
    tar = served.root / "refs.h5.lindi.tar"
    write_lindi("tar", served.root / "refs.h5", tar, url=served.url("refs.h5"))
    with mounted(tar, tmp_path / "local") as mp:
        assert check_against_h5py(mp, served.root / "refs.h5") > 0
    with mounted(served.url("refs.h5.lindi.tar"), tmp_path / "remote") as mp:
        assert check_against_h5py(mp, served.root / "refs.h5") > 0


def test_local_reference_with_local_refs(served: Served, tmp_path: Path) -> None:
    """A reference file on disk whose refs are local paths reads them from disk."""
    ref = tmp_path / "local.lindi.json"
    write_lindi("json", served.root / "refs.h5", ref)
    served.server.clear()
    with mounted(ref, tmp_path / "mp") as mp:
        assert check_against_h5py(mp, served.root / "refs.h5") > 0
    assert served.server.requests() == []


# --------------------------------------------------------------------------- security


def _rewrite_refs(src: Path, dst: Path, url_from: str, url_to: str) -> None:
    doc = json.loads(src.read_text())
    text = json.dumps(doc).replace(json.dumps(url_from)[1:-1], json.dumps(url_to)[1:-1])
    dst.write_text(text)


def test_remote_reference_may_not_read_local_files(served: Served, tmp_path: Path) -> None:
    """A reference file fetched over HTTP whose refs name local paths gets EACCES, logged;
    with -o allow_local_refs the same refs are read."""
    local_target = str(served.root / "refs.h5")
    for form in (local_target, f"file://{local_target}"):
        evil = served.root / ("evil-file.lindi.json" if form.startswith("file") else
                              "evil.lindi.json")
        _rewrite_refs(served.root / "refs.h5.lindi.json", evil, served.url("refs.h5"), form)
        log = tmp_path / f"{evil.stem}.log"
        with mounted(served.url(evil.name), tmp_path / evil.stem, "--log-file", str(log)) as mp:
            with pytest.raises(OSError) as caught:
                (mp / "contiguous.npy").read_bytes()
            assert caught.value.errno == errno.EACCES
            # Inline data is still readable; only the local refs are refused.
            assert json.loads((mp / "scalars" / "int.json").read_text())["value"] == -42
        assert "allow_local_refs" in log.read_text()
        with mounted(served.url(evil.name), tmp_path / f"{evil.stem}-allowed",
                     "-o", "allow_local_refs") as mp, h5py.File(served.root / "refs.h5") as f:
            np.testing.assert_array_equal(np.load(mp / "contiguous.npy"), f["contiguous"][()])


def test_shadow_ref_in_remote_reference_is_refused(served: Served, tmp_path: Path) -> None:
    doc = json.loads((served.root / "refs.h5.lindi.json").read_text())
    doc["refs"]["contiguous/0.0"] = ["/etc/shadow", 0, 100]
    (served.root / "shadow.lindi.json").write_text(json.dumps(doc))
    with mounted(served.url("shadow.lindi.json"), tmp_path / "mp") as mp:
        with pytest.raises(OSError) as caught:
            (mp / "contiguous" / "0.0").read_bytes()
        assert caught.value.errno == errno.EACCES


def test_hostile_soft_links_stay_inside(served: Served, tmp_path: Path) -> None:
    """A LINDI file whose ``_SOFT_LINK`` paths climb out (``/../../etc/passwd``,
    ``../../..``) shows symlinks that stay inside the mount, and reading
    through them never reaches the host's files."""
    doc = json.loads((served.root / "refs.h5.lindi.json").read_text())
    hostile = {"escape_abs": "/../../../../../../../../etc/passwd",
               "numbers/escape_rel": "../../../../../../etc/passwd",
               "numbers/up": "../../../../../.."}
    for where, path in hostile.items():
        doc["refs"][f"{where}/.zgroup"] = {"zarr_format": 2}
        doc["refs"][f"{where}/.zattrs"] = {"_SOFT_LINK": {"path": path}}
    source = tmp_path / "hostile.lindi.json"
    source.write_text(json.dumps(doc))
    with mounted(source, tmp_path / "mp") as mp:
        seen, bad = symlinks_leaving(mp)
        assert seen >= len(hostile) and not bad, bad
        assert os.readlink(mp / "escape_abs") == "etc/passwd"
        assert os.readlink(mp / "numbers/escape_rel") == "../etc/passwd"
        assert os.readlink(mp / "numbers/up") == ".."  # the root: it resolves
        for where in ("escape_abs", "numbers/escape_rel"):
            with pytest.raises(FileNotFoundError):
                (mp / where).read_bytes()
        links = json.loads((mp / "numbers.json").read_text())["links"]
        assert links["escape_rel"] == {"kind": "soft", "path": hostile["numbers/escape_rel"]}


# --------------------------------------------------------------------------- bad input


def test_bad_reference_files_are_refused(served: Served, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.json").write_text('{"refs": {"a": [1, 2')
    (tmp_path / "mp").mkdir()
    cases = {
        str(tmp_path / "notes.txt"): "not a LINDI or kerchunk reference file",
        str(tmp_path / "broken.json"): "broken.json",
        served.url("missing.lindi.json"): "not found",
        "ftp://127.0.0.1/x.json": "not supported",
    }
    for source, message in cases.items():
        out = run_h5mount(source, str(tmp_path / "mp"))
        assert out.returncode == 1, source
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (source, out.stderr)
    out = run_h5mount(str(served.root / "refs.h5.lindi.json"), str(tmp_path / "mp"),
                      "--domain", "/x")
    assert out.returncode == 1 and "--domain" in out.stderr


# --------------------------------------------------------------------------- remote reads


def hdf5_gets(server: RangeHttpServer, name: str) -> list[str | None]:
    """Range headers of the GETs of HDF5 file ``name`` the server answered."""
    return [rng for method, target, rng, _ in server.requests()
            if method == "GET" and target.lstrip("/") == name]


def test_neighbouring_chunks_are_read_with_few_requests(served: Served, tmp_path: Path) -> None:
    """1,122 small gzip chunks (``_EXTERNAL_ARRAY_LINK``) are fetched, with the HDF5
    metadata h5py needs to find them, in far fewer requests than chunks."""
    grid = [-(-n // c) for n, c in zip(h5files.MANY_CHUNKS_SHAPE, h5files.MANY_CHUNKS_CHUNKS,
                                       strict=True)]
    served.server.clear()
    with mounted(served.url("refs.h5.lindi.json"), tmp_path / "mp") as mp:
        assert "_EXTERNAL_ARRAY_LINK" not in (mp / "chunked" / "many" / ".zattrs").read_text()
        assert len(os.listdir(mp / "chunked" / "many")) - 2 == grid[0] * grid[1]
        got = np.load(mp / "chunked" / "many.npy")
    with h5py.File(served.root / "refs.h5") as f:
        np.testing.assert_array_equal(got, f["chunked/many"][()])
    gets = hdf5_gets(served.server, "refs.h5")
    assert 0 < len(gets) < grid[0] * grid[1] // 20, len(gets)


def test_cache_dir_is_shared_by_url(served: Served, tmp_path: Path) -> None:
    """Two reference files into the same HDF5 URL share cached blocks: after one was read
    with a cache_dir, the other reads the same data without a GET of the HDF5 file."""
    cache = tmp_path / "cache"
    other = served.root / "refs-copy.lindi.json"
    shutil.copyfile(served.root / "refs.h5.lindi.json", other)
    with mounted(served.url("refs.h5.lindi.json"), tmp_path / "first",
                 "-o", f"cache_dir={cache}") as mp:
        first = (mp / "contiguous.npy").read_bytes()
    served.server.clear()
    with mounted(served.url(other.name), tmp_path / "second", "-o", f"cache_dir={cache}") as mp:
        assert (mp / "contiguous.npy").read_bytes() == first
    assert hdf5_gets(served.server, "refs.h5") == []


def test_decoded_chunks_survive_a_remount(served: Served, tmp_path: Path) -> None:
    """With ``cache_decoded``, a remount on the same cache_dir reads a gzip dataset's
    ``.npy`` (byte-range refs) without a GET of the HDF5 file and decodes no chunk."""
    cache = tmp_path / "cache"
    options = ("-o", f"cache_dir={cache},cache_decoded")
    url = served.url("filters.h5.lindi.json")
    with mounted(url, tmp_path / "mp", *options) as mp:
        first = (mp / "gzip.npy").read_bytes()
        chunks = len([n for n in os.listdir(mp / "gzip") if n[0].isdigit()])
        wait_decoded(cache, chunks)
        blocks = figures(mp)["caches"]["blocks"]
    assert chunks > 1 and (blocks["decoded_hits"], blocks["decoded_misses"]) == (0, chunks)
    with h5py.File(served.root / "filters.h5") as f:
        np.testing.assert_array_equal(np.load(io.BytesIO(first)), f["gzip"][()])
    served.server.clear()
    with mounted(url, tmp_path / "mp", *options) as mp:
        assert (mp / "gzip.npy").read_bytes() == first
        blocks = figures(mp)["caches"]["blocks"]
    assert (blocks["decoded_hits"], blocks["decoded_misses"]) == (chunks, 0)
    assert hdf5_gets(served.server, "filters.h5") == []


def figures(mp: Path) -> dict[str, Any]:
    """``.h5mount/stats.json``: the first of a mount is made when it is read."""
    doc: dict[str, Any] = json.loads((mp / ".h5mount" / "stats.json").read_bytes())
    return doc


def test_http_faults_are_retried_or_give_eio(served: Served, tmp_path: Path) -> None:
    """A permanent 503 gives EIO within the timeout; 503s and a reset that stop are retried
    without changing a byte."""
    with FaultProxy(served.server.url) as proxy:
        ref = served.root / "proxied.lindi.json"
        _rewrite_refs(served.root / "refs.h5.lindi.json", ref, served.url("refs.h5"),
                      f"{proxy.endpoint}/refs.h5")
        with mounted(served.url(ref.name), tmp_path / "mp", "-o", "timeout=3") as mp:
            proxy.error(503, path="/refs.h5")
            with pytest.raises(OSError) as caught:
                (mp / "numbers" / "le_f8" / "0.0").read_bytes()
            assert caught.value.errno == errno.EIO
            proxy.clear()
            proxy.error(503, path="/refs.h5", times=2)
            proxy.reset(path="/refs.h5", times=1)
            with h5py.File(served.root / "refs.h5") as f:
                np.testing.assert_array_equal(np.load(mp / "contiguous.npy"), f["contiguous"][()])
            assert sum(1 for seen in proxy.requests(path="/refs.h5") if seen.fault) == 3


def test_lindi_directory(served: Served, tmp_path: Path) -> None:
    directory = write_lindi("dir", served.root / "refs.h5", tmp_path / "refs.lindi.d",
                            url=served.url("refs.h5"))
    with mounted(directory, tmp_path / "mp") as mp:
        assert check_against_h5py(mp, served.root / "refs.h5") > 0


def test_external_arrays_of_strings_and_compounds(tmp_path: Path) -> None:
    """lindi links any dataset of over 1000 HDF5 chunks to the HDF5 file, strings and
    compounds too (on a one-chunk ``.zarray`` grid); h5py reads those, and the chunk files
    are encoded as docs/CONTRACT.md, "Chunk files", says."""
    h5 = tmp_path / "many.h5"
    rows = np.array([(i, i * 0.5) for i in range(1100)], dtype=[("a", "<i4"), ("b", "<f8")])
    with h5py.File(h5, "w") as f:
        f.create_dataset("text", data=np.array([f"item {i}" for i in range(1100)], dtype=object),
                         dtype=h5py.string_dtype(), chunks=(1,))
        f.create_dataset("rows", data=rows, chunks=(1,))
    ref = write_lindi("json", h5, tmp_path / "many.lindi.json")
    assert "_EXTERNAL_ARRAY_LINK" in json.loads(ref.read_text())["refs"]["text/.zattrs"]
    with mounted(ref, tmp_path / "mp") as mp:
        texts = numcodecs.VLenUTF8().decode((mp / "text" / "0").read_bytes())
        assert list(texts) == [f"item {i}" for i in range(1100)]
        np.testing.assert_array_equal(np.load(mp / "rows.npy"), rows)
