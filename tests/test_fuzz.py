"""Hypothesis fuzzing of the whole read path against h5py (issue 11).

Random HDF5 files (``tests/fuzzgen.py``: nested groups, datasets of random
shapes, chunkings, types, filters and fill values, attributes, soft links,
aliases, odd names) are written with h5py, then:

* written as an HSDS bucket straight to disk, with HSDS's own type and
  chunk-compression code, and converted to a LINDI file by the real lindi 0.4.6
  (one ``.venv-lindi`` process for the whole module);
* read back through the daemon's own objects (``open_source``, ``CachedCatalog``,
  ``Tree`` + ``NpyView``) without FUSE: every directory listed, every name
  looked up, every file read, every symlink and xattr (``tests/fuzzcheck.py``);
* compared with h5py's reading of the source file: listings, sidecars, ``.npy``
  bytes, chunk files, ``.zarray``/``.zattrs``, xattrs, soft-link targets
  (``test_valid_sources_match_h5py``), and a couple of them through a real
  FUSE mount, ``numpy.load(mmap_mode="r")`` included, where the mount must show
  exactly what the in-process tree shows (``test_real_mount_matches``).

Damaged sources (``test_damaged_hsds_bucket``, ``test_damaged_lindi_file``):
one object JSON, chunk object, domain or reference file of a valid source is
damaged at random (wrong types, missing keys, negative or huge dimensions,
unknown classes and filter ids, NaN where integers belong, nesting deeper
than any stack, truncated or garbage bytes). Every read must then succeed or
fail with the project's ``MountError`` classes (what becomes EIO/ENOENT),
never another exception, within a time bound (``trio.fail_after``); what the
spec promises of every file still holds (strict JSON, exact sizes, symlinks
inside); and everything the damage does not touch (the other objects, the
other chunks, an undamaged sibling domain of the same bucket) still equals h5py.

Bugs the fuzzer found are kept as regression tests of their minimal examples
(``test_bitshuffle_stream_of_chunk_size``, ``test_one_bad_ref_is_that_object_alone``).

Run: ``.venv/bin/python -m pytest tests/test_fuzz.py`` (about a minute). The
environment variable ``H5MOUNT_FUZZ_EXAMPLES`` sets the examples per fuzz test
(default 25; the real-mount test runs a tenth of that, at least 2), e.g.
``H5MOUNT_FUZZ_EXAMPLES=1000 .venv/bin/python -m pytest tests/test_fuzz.py``
for a long run. Failing examples are kept in hypothesis's ``.hypothesis/``
database and replayed first on the next run.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from mountd.config import MountConfig
from tests import fuzzgen
from tests.fuzzcheck import (
    Snapshot,
    View,
    check_h5,
    check_invariants,
    mount_snapshot,
    snapshot,
)
from tests.fuzzgen import (
    BucketWriter,
    FileSpec,
    HsdsChoice,
    HsdsDomain,
    LindiConverter,
    damage_file,
    damaged_bytes,
    damaged_json,
    damaged_refs,
    file_specs,
    write_h5,
    write_hsds_domain,
)
from tests.mounting import fuse_available, mounted

#: Examples per fuzz test; raise it for a long run (see the module docstring).
EXAMPLES = int(os.environ.get("H5MOUNT_FUZZ_EXAMPLES", "25"))
MOUNT_EXAMPLES = max(2, EXAMPLES // 10)
FOLDER = "home/fuzz"
SIBLING = "sibling.h5"

FUZZ = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

pytestmark = pytest.mark.skipif(not fuzzgen.lindi_available(),
                                reason=f"lindi is not installed ({fuzzgen.LINDI_PYTHON}; "
                                       "run dev/setup)")


@pytest.fixture(scope="module")
def lindi() -> Iterator[LindiConverter]:
    """One lindi process for the module."""
    converter = LindiConverter()
    try:
        yield converter
    finally:
        converter.close()


@pytest.fixture
def workdir() -> Iterator[Callable[[], Path]]:
    """A fresh directory per hypothesis example (a function fixture would be shared)."""
    made: list[tempfile.TemporaryDirectory[str]] = []

    def fresh() -> Path:
        tmp = tempfile.TemporaryDirectory(prefix="h5fuzz-")
        made.append(tmp)
        if len(made) > 1:
            made.pop(0).cleanup()
        return Path(tmp.name)

    yield fresh
    for tmp in made:
        tmp.cleanup()


# --------------------------------------------------------------------------- building


def hsds_choices(spec: FileSpec) -> Callable[[str], HsdsChoice | None]:
    """The drawn HSDS choices by HDF5 path (aliases share their target's)."""
    by_path: dict[str, HsdsChoice] = {p: d.hsds for p, d in spec.datasets()}
    for link in spec.links:
        if not link.soft and link.target in by_path:
            by_path[f"{link.group.rstrip('/')}/{link.name}"] = by_path[link.target]
    return by_path.get


@dataclass
class Built:
    """One generated file in every form: HDF5, HSDS bucket, LINDI file."""

    h5: Path
    bucket: Path
    hsds: HsdsDomain
    sibling: HsdsDomain | None
    lindi: Path | None


def build(spec: FileSpec, base: Path, lindi: LindiConverter | None, *,
          sibling: bool = False, lindi_format: str | None = None) -> Built:
    h5 = write_h5(spec, base / "src.h5")
    bucket = base / "bucket"
    writer = BucketWriter(bucket)
    hsds = write_hsds_domain(h5, writer, f"{FOLDER}/{spec.domain}", hsds_choices(spec),
                             str(spec.salt))
    twin = write_hsds_domain(h5, writer, f"{FOLDER}/{SIBLING}", hsds_choices(spec),
                             f"{spec.salt}-sibling") if sibling else None
    ref = None
    if lindi is not None:
        fmt = lindi_format or spec.lindi_format
        started = time.monotonic()
        ref = lindi.convert(h5, base / f"f.lindi.{fmt}", fmt)
        event(f"lindi took {'>10 s' if time.monotonic() - started > 10 else '<10 s'}")
    return Built(h5, bucket, hsds, twin, ref)


def hsds_config(built: Built, spec: FileSpec | None, mountpoint: str = "/nonexistent"
                ) -> MountConfig:
    domain = f"/{FOLDER}/{spec.domain}" if spec is not None and spec.single_domain else None
    return MountConfig(source=str(built.bucket), mountpoint=mountpoint, domain=domain)


def hsds_view(domain: HsdsDomain, single: bool, **kwargs: Any) -> View:
    """How the HSDS mount shows ``domain``: as the mount root (``--domain``) or in
    its folder."""
    if single:
        return View("hsds", "", ".root.json", hsds=domain, **kwargs)
    return View("hsds", domain.domain, f"{domain.domain}.json", hsds=domain, **kwargs)


def lindi_refs(path: Path) -> dict[str, Any]:
    """The refs of a ``.lindi.json`` or ``.lindi.tar`` (its ``lindi.json`` member)."""
    if path.suffix == ".tar":
        with tarfile.open(path) as tar:
            member = tar.extractfile("lindi.json")
            assert member is not None
            doc = json.loads(member.read())
    else:
        doc = json.loads(path.read_bytes())
    return doc.get("refs", doc)


def inlined(refs: dict[str, Any]) -> frozenset[str]:
    """HDF5 paths of the datasets whose chunks lindi wrote into the file itself."""
    chunks: dict[str, list[Any]] = {}
    arrays = {k[:-len("/.zarray")] if "/" in k else "" for k in refs if k.endswith(".zarray")}
    for key, value in refs.items():
        prefix, _, name = key.rpartition("/")
        if prefix in arrays and not name.startswith("."):
            chunks.setdefault(prefix, []).append(value)
    return frozenset("/" + p for p, values in chunks.items()
                     if all(not isinstance(v, list) for v in values))


def lindi_view(ref: Path, **kwargs: Any) -> View:
    return View("lindi", "", ".root.json", inlined=inlined(lindi_refs(ref)), **kwargs)


def lindi_config(ref: Path, mountpoint: str = "/nonexistent") -> MountConfig:
    return MountConfig(source=str(ref), mountpoint=mountpoint)


def assert_clean(snap: Snapshot, h5: Path, view: View, what: str) -> int:
    """No invariant broken and nothing different from h5py; the entries compared."""
    problems, checked = check_h5(snap, h5, view)
    problems = check_invariants(snap) + problems
    assert not problems, f"{what}:\n" + "\n".join(problems[:40])
    return checked


def errors_of(snap: Snapshot) -> list[str]:
    return [f"{path or '.'}: {e.error}" for path, e in snap.items() if e.kind == "error"]


# --------------------------------------------------------------------------- valid sources


@FUZZ
@given(spec=file_specs())
@pytest.mark.tools
def test_valid_sources_match_h5py(spec: FileSpec, lindi: LindiConverter,
                                  workdir: Callable[[], Path]) -> None:
    built = build(spec, workdir(), lindi)
    snap = snapshot(hsds_config(built, spec))
    assert not errors_of(snap), errors_of(snap)
    assert assert_clean(snap, built.h5, hsds_view(built.hsds, spec.single_domain),
                        "HSDS") > 0
    assert built.lindi is not None
    snap = snapshot(lindi_config(built.lindi))
    assert not errors_of(snap), errors_of(snap)
    assert assert_clean(snap, built.h5, lindi_view(built.lindi), "LINDI") > 0


# --------------------------------------------------------------------------- real mount


pytest_mount = pytest.mark.skipif(fuse_available() is not None,
                                  reason=f"no FUSE: {fuse_available()}")


def check_npy_mmap(mountpoint: Path, snap: Snapshot) -> int:
    """``numpy.load(mmap_mode="r")`` of every ``.npy`` of the mount equals its bytes
    as read; the number of files checked."""
    count = 0
    for path, entry in snap.items():
        if entry.kind != "file" or not path.endswith(".npy"):
            continue
        mapped = np.load(mountpoint / path, mmap_mode="r")
        read = np.load(io.BytesIO(entry.data), allow_pickle=False)
        assert (mapped.dtype, mapped.shape) == (read.dtype, read.shape), path
        assert np.asarray(mapped).tobytes() == read.tobytes(), path
        count += 1
    return count


@pytest.mark.mount
@pytest_mount
@settings(FUZZ, max_examples=MOUNT_EXAMPLES)
@given(spec=file_specs())
def test_real_mount_matches(spec: FileSpec, lindi: LindiConverter,
                            workdir: Callable[[], Path]) -> None:
    base = workdir()
    built = build(spec, base, lindi)
    for what, config, view in (
            ("HSDS", hsds_config(built, spec, str(base / "mnt")),
             hsds_view(built.hsds, spec.single_domain)),
            ("LINDI", lindi_config(built.lindi or Path(), str(base / "mnt")),
             lindi_view(built.lindi or Path()))):
        tree = snapshot(config)
        args = ("--domain", config.domain) if config.domain else ()
        with mounted(config.source, Path(config.mountpoint), *args) as mp:
            real = mount_snapshot(mp)
            npys = check_npy_mmap(mp, real)
        assert set(real) == set(tree), (what, sorted(set(real) ^ set(tree))[:20])
        differ = [p for p in real if not real[p].same_as(tree[p])]
        assert not differ, (what, differ[:20])
        assert_clean(real, built.h5, view, f"{what} mount")
        note(f"{what}: {len(real)} entries, {npys} .npy files")


# --------------------------------------------------------------------------- damaged sources


def _under(path: str, roots: set[str]) -> bool:
    """True if HDF5 ``path`` is one of ``roots`` or below one."""
    return any(path == r or r == "/" or path.startswith(r.rstrip("/") + "/") for r in roots)


def hsds_targets(built: Built) -> list[tuple[str, str, Any]]:
    """(kind, key, what it belongs to) of every key of the target domain to damage."""
    hsds = built.hsds
    targets: list[tuple[str, str, Any]] = [("json", k, i) for k, i in sorted(hsds.keys.items())]
    targets += [("chunk", k, v) for k, v in sorted(hsds.chunk_keys.items())]
    targets += [("domain", f"{hsds.domain}/.domain.json", None),
                ("folder", f"{FOLDER}/.domain.json", None)]
    return targets


@FUZZ
@given(spec=file_specs(), data=st.data())
@pytest.mark.slow
def test_damaged_hsds_bucket(spec: FileSpec, data: st.DataObject,
                             workdir: Callable[[], Path]) -> None:
    built = build(spec, workdir(), None, sibling=True)
    assert built.sibling is not None
    kind, key, owner = data.draw(st.sampled_from(hsds_targets(built)), label="target")
    path = built.bucket / key
    raw = path.read_bytes()
    if kind == "chunk":
        new, what = data.draw(damaged_bytes(raw), label="damage")
    else:
        new, what = data.draw(damaged_json(raw), label="damage")
    note(f"{kind} {key}: {what}")
    damage_file(path, new)
    snap = snapshot(hsds_config(built, None))
    note("errors: " + "; ".join(errors_of(snap)[:10]))
    event(f"{kind} damage: {'errors' if errors_of(snap) else 'no error'}")
    ids = built.hsds.ids
    everything = kind in ("domain", "folder")
    spoiled_ids = {owner} if kind == "json" else set()
    spoiled = {p for p, i in ids.items() if i in spoiled_ids}
    chunk_of: tuple[str, str] | None = None
    if kind == "chunk":
        did, index = owner
        chunk_of = (did, ".".join(map(str, index)))

    def affected(h5path: str) -> bool:
        return everything or _under(h5path, spoiled)

    def chunk_affected(h5path: str, name: str) -> bool:
        return chunk_of is not None and ids.get(h5path) == chunk_of[0] and name == chunk_of[1]

    target = hsds_view(built.hsds, False, affected=affected,
                       chunk_affected=chunk_affected)
    sibling_everything = kind == "folder"
    sibling = hsds_view(built.sibling, False,
                        affected=lambda _p: sibling_everything)
    problems = check_invariants(snap)
    problems += check_h5(snap, built.h5, target)[0]
    sibling_problems, sibling_checked = check_h5(snap, built.h5, sibling)
    problems += sibling_problems
    assert sibling_everything or sibling_checked > 0, "the sibling domain was not compared"
    assert not problems, "\n".join(problems[:40])


@FUZZ
@given(spec=file_specs(), data=st.data())
@pytest.mark.tools
def test_damaged_lindi_file(spec: FileSpec, data: st.DataObject, lindi: LindiConverter,
                            workdir: Callable[[], Path]) -> None:
    base = workdir()
    h5 = write_h5(spec, base / "src.h5")
    ref = lindi.convert(h5, base / "f.lindi.json", "json")
    view_inlined = inlined(lindi_refs(ref))
    damage = data.draw(damaged_refs(ref.read_bytes()), label="damage")
    note(damage.what)
    damage_file(ref, damage.data)
    snap = snapshot(lindi_config(ref))
    note("errors: " + "; ".join(errors_of(snap)[:10]))
    owner, chunk = damage.owner, damage.chunk
    event(f"{'top' if owner is None else 'chunk' if chunk else 'object'} damage: "
          f"{'refused' if snap[''].kind == 'error' else 'errors' if errors_of(snap) else 'none'}")
    spoiled = {"/"} if owner is None else {owner} if chunk is None else set()
    view = View("lindi", "", ".root.json", inlined=view_inlined,
                affected=lambda p: _under(p, spoiled),
                chunk_affected=lambda p, n: p == owner and n == chunk)
    problems = check_invariants(snap)
    if "" in snap and snap[""].kind == "error":
        # The whole mount refused: only damage to the file's own structure or to
        # the root group (the mount's root directory) may do that.
        assert owner in (None, "/"), f"one damaged ref refused the whole file: {snap[''].error}"
    else:
        problems += check_h5(snap, h5, view)[0]
    assert not problems, "\n".join(problems[:40])


# --------------------------------------------------------------------------- found bugs
#
# Minimal examples of bugs the fuzzer found, fixed since.


def _one_dataset_bucket(base: Path, data: np.ndarray, choice: HsdsChoice,
                        **create: Any) -> tuple[Path, HsdsDomain, Path]:
    """An HDF5 file with one dataset ``/d`` and its HSDS bucket (domain
    ``home/fuzz/f.h5``), written with ``choice``."""
    import h5py  # noqa: PLC0415

    h5 = base / "src.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("d", data=data, **create)
    bucket = base / "bucket"
    domain = write_hsds_domain(h5, BucketWriter(bucket), f"{FOLDER}/f.h5",
                               lambda path: choice if path == "/d" else None, "bug")
    return h5, domain, bucket


def test_bitshuffle_stream_of_chunk_size(tmp_path: Path) -> None:
    """HSDS's bitshuffle stream of a chunk can be exactly the chunk's size; the
    reader once took it for unshuffled data and returned the stream itself."""
    data = np.array([5, 1, 19, 16, 9, 11, 29, 7], dtype="<i4")
    choice = HsdsChoice(chunks=(8,), compressor=None, level=5, shuffle="bitshuffle",
                        partitions=0, layout="cprops", fill="json", skip_fill_chunks=False,
                        unlimited_word=False)
    _, domain, bucket = _one_dataset_bucket(tmp_path, data, choice)
    assert domain.bitshuffle_exact, "the stored stream is 32 bytes, the chunk's size"
    snap = snapshot(MountConfig(source=str(bucket), mountpoint="/nonexistent"))
    npy = snap[f"{FOLDER}/f.h5/d.npy"].data
    assert np.load(io.BytesIO(npy)).tolist() == data.tolist()


@pytest.mark.tools
def test_one_bad_ref_is_that_object_alone(tmp_path: Path, lindi: LindiConverter) -> None:
    """One malformed ref (here null) once refused the whole reference file; it now
    gives EIO on its dataset alone (docs/CONTRACT.md, "Errors")."""
    import h5py  # noqa: PLC0415

    h5 = tmp_path / "src.h5"
    with h5py.File(h5, "w") as f:
        f["a"] = np.arange(3, dtype="<i4")
        f["b"] = np.arange(4, dtype="<i4")
    ref = lindi.convert(h5, tmp_path / "f.lindi.json")
    doc = json.loads(ref.read_bytes())
    doc["refs"]["a/0"] = None
    ref.write_text(json.dumps(doc))
    snap = snapshot(lindi_config(ref))
    assert snap[""].kind == "dir", snap[""].error
    assert snap["a.npy"].kind == "error"
    assert np.load(io.BytesIO(snap["b.npy"].data)).tolist() == [0, 1, 2, 3]


def test_json_array_whose_first_chunk_names_a_missing_file(tmp_path: Path) -> None:
    """A json2 object array's first chunk is read to tell whether it holds
    references; when its ref named a file that does not exist, that once made
    the whole dataset (its directory and sidecar) EIO, not its chunk alone."""
    codec = {"id": "json2", "allow_nan": True, "check_circular": True, "encoding": "utf-8",
             "ensure_ascii": True, "indent": None, "separators": [",", ":"],
             "skipkeys": False, "sort_keys": True, "strict": True}
    zarray = {"chunks": [1], "compressor": None, "dtype": "|O", "fill_value": 0,
              "filters": [codec], "order": "C", "shape": [1], "zarr_format": 2}
    doc = {"version": 1, "refs": {
        ".zgroup": {"zarr_format": 2},
        "s/.zarray": zarray, "s/0": [str(tmp_path / "missing.h5"), 0, 8],
        "t/.zarray": zarray, "t/0": json.dumps(["fine", "|O", [1]]),
    }}
    ref = tmp_path / "f.lindi.json"
    ref.write_text(json.dumps(doc))
    snap = snapshot(lindi_config(ref))
    assert snap["s"].kind == "dir", snap["s"].error
    assert snap["s.json"].kind == "file", snap["s.json"].error
    assert snap["s/0"].kind == "error"
    assert snap["t/0"].kind == "file", snap["t/0"].error
