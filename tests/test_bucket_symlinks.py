"""No symlink inside a local bucket is followed (docs/CONTRACT.md, "Errors").

A copy of the bundled sample bucket gets one symlink of each kind (``LINKS``):
a chunk file to a secret file of exactly a chunk's size (followed, its bytes
would be served verbatim) and one to ``/etc/passwd``, an object's JSON and a
dataset's whole directory to intact copies outside (followed, they would read
fine), a folder and a domain directory to copies outside, and a domain
directory to its sibling inside the bucket (refused all the same). Checked on
the opening primitive (``mountd.io.beneath``: ``openat2`` and the walk that
stands in for it), on ``LocalStore`` and the HSDS catalog over it (the walk
as well), and through real FUSE mounts of the planted copy against a mount
of an untouched copy: the secret is never served, each link's entry gives
EIO (or, for a folder or domain, is absent), the rest reads identically, and
each link is logged once however often it is met. Two neighbours of the
rule: ``hsload --link`` files below ROOT_DIR are read beneath it as well,
while a reference file's local refs follow symlinks as ``open`` does.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from layouts import errors
from layouts.formats.hsds._catalog import HsdsCatalog
from layouts.formats.hsds._domains import DomainIndex
from layouts.model import Dataset, Domain
from layouts.storage import ByteRange, Fetched
from mountd.errors import StorageError
from mountd.io import beneath
from mountd.io.local import NOT_FOLLOWED, LocalStore
from mountd.sources import _posix_opener
from tests.mounting import daemon_pids, fuse_available, mounted

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "examples" / "sample-bucket"
DOMAIN = "home/admin/sample.h5"
UUID1 = "1963c813-a83f18f0"
ROOT = f"db/{UUID1}"
#: float64 (24, 8) in two unfiltered 12x8 chunks: a chunk file is its bytes as stored.
PRESSURE = f"{ROOT}/d/87fb-22d7b3-913738"
HOUR = f"{ROOT}/d/7ab8-bb3adf-6343ea"
NAMES = f"{ROOT}/d/0f2c-71b1d9-db5835"
TABLE = f"{ROOT}/d/c470-1e5fff-ecc904"
SECRET = b"TOP-SECRET-BYTES" * 48  # 768 bytes: one pressure chunk
PASSWD = Path("/etc/passwd")

#: Each planted symlink (a key of the bucket) and what it points at: a name in
#: the ``outside`` directory, an absolute path, or a sibling inside the bucket.
LINKS = {
    f"{PRESSURE}/1_0": "secret",
    f"{HOUR}/0": str(PASSWD),
    f"{NAMES}/.dataset.json": "names.json",
    TABLE: "table",
    "home/evil": "folder",
    "home/admin/twin.h5": "domain",
    "home/admin/alias.h5": "=sample.h5",
}
#: Keys read through the links, and the link each one's error names.
THROUGH = {
    **{key: key for key in LINKS},
    f"{TABLE}/.dataset.json": TABLE,
    f"{TABLE}/0": TABLE,
    "home/evil/.domain.json": "home/evil",
    "home/evil/sample.h5/.domain.json": "home/evil",
    "home/admin/twin.h5/.domain.json": "home/admin/twin.h5",
    "home/admin/alias.h5/.domain.json": "home/admin/alias.h5",
}
#: Mount paths whose entries may differ from the untouched copy's: the objects
#: the links break (their directories, sidecars and views), the group listing
#: them, and the domain's HDF5 file, made from every object.
BROKEN = tuple(f"{DOMAIN}/{path}" for path in ("measurements/pressure", "measurements/hour",
                                               "stations/names", "stations/table"))
LISTING_BROKEN = (f"{DOMAIN}/stations", f"{DOMAIN}.h5")

needs_fuse = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))


@dataclass(frozen=True)
class Copies:
    """An untouched copy of the sample bucket, a copy with ``LINKS`` planted, and
    the directory outside both that the links point into."""

    pristine: Path
    planted: Path
    outside: Path


def make_copies(base: Path) -> Copies:
    pristine, planted, outside = base / "pristine", base / "planted", base / "outside"
    shutil.copytree(SAMPLE, pristine)
    shutil.copytree(SAMPLE, planted)
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    shutil.copy(planted / NAMES / ".dataset.json", outside / "names.json")
    shutil.copytree(planted / TABLE, outside / "table")
    shutil.copytree(planted / "home/admin", outside / "folder")
    shutil.copytree(planted / DOMAIN, outside / "domain")
    for key, target in LINKS.items():
        link = planted / key
        if link.is_dir():
            shutil.rmtree(link)
        else:
            link.unlink(missing_ok=True)
        if target.startswith("="):
            link.symlink_to(target[1:])
        elif target.startswith("/"):
            link.symlink_to(target)
        else:  # relative, climbing out of the bucket
            link.symlink_to(os.path.relpath(outside / target, link.parent))
    return Copies(pristine, planted, outside)


@pytest.fixture
def copies(tmp_path: Path) -> Copies:
    return make_copies(tmp_path)


def openat2_works() -> bool:
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        os.close(beneath.openat2_beneath(fd, ".", os.O_PATH))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


@pytest.fixture(params=["openat2", "walk"])
def opener(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which way ``open_beneath`` opens: ``openat2``, or the walk without it."""
    if request.param == "openat2" and not openat2_works():
        pytest.skip("this kernel has no openat2")
    monkeypatch.setattr(beneath, "_openat2_works", request.param == "openat2")
    return str(request.param)


@pytest.fixture
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the keys earlier tests of this process logged (``report_once``)."""
    monkeypatch.setattr(errors, "_reported", OrderedDict())


def refused_lines(text: str, link: str) -> int:
    return text.count(f"{link}: {NOT_FOLLOWED}")


# --------------------------------------------------------------------------- the primitive


def test_open_beneath_refuses_every_symlink(opener: str, tmp_path: Path) -> None:
    """A symlink at any depth, to anywhere (inside too), is refused and named;
    everything else opens as ``open`` would."""
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "d" / "e").mkdir(parents=True)
    out.mkdir()
    (root / "d" / "f").write_bytes(b"inside")
    (out / "secret").write_bytes(SECRET)
    (root / "lf").symlink_to(out / "secret")
    (root / "ld").symlink_to("../out")
    (root / "d" / "inner").symlink_to("f")
    (root / "d" / "e" / "up").symlink_to("..")
    (root / "abs").symlink_to(PASSWD)
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for rel, link in (("lf", "lf"), ("ld/secret", "ld"), ("ld", "ld"), ("d/inner", "d/inner"),
                          ("d/e/up/f", "d/e/up"), ("abs", "abs")):
            for flags in (os.O_RDONLY, os.O_RDONLY | os.O_DIRECTORY, os.O_PATH):
                with pytest.raises(beneath.SymlinkFound) as found:
                    os.close(beneath.open_beneath(fd, rel, flags))
                assert found.value.where == link, (rel, flags)
        opened = beneath.open_beneath(fd, "d/f", os.O_RDONLY)
        with os.fdopen(opened, "rb") as f:
            assert f.read() == b"inside"
        for rel in (".", "d", "d/e"):
            dir_fd = beneath.open_beneath(fd, rel, os.O_RDONLY | os.O_DIRECTORY)
            assert stat.S_ISDIR(os.fstat(dir_fd).st_mode)
            os.close(dir_fd)
        with pytest.raises(FileNotFoundError):
            beneath.open_beneath(fd, "d/missing", os.O_RDONLY)
        with pytest.raises(NotADirectoryError):
            beneath.open_beneath(fd, "d/f/x", os.O_RDONLY)
    finally:
        os.close(fd)
    assert beneath._openat2_works is (opener == "openat2")


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EPERM])
def test_open_beneath_walks_where_openat2_is_missing(code: int, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSYS from ``openat2`` (or EPERM, from a seccomp filter that does not know
    it) switches to the walk for good: ``openat2`` is not tried again, and
    symlinks are still refused."""
    calls: list[str] = []

    def missing(dir_fd: int, rel: str, flags: int) -> int:
        calls.append(rel)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(beneath, "_openat2_works", True)
    monkeypatch.setattr(beneath, "openat2_beneath", missing)
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "l").symlink_to("f")
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        os.close(beneath.open_beneath(fd, "f", os.O_RDONLY))
        with pytest.raises(beneath.SymlinkFound):
            beneath.open_beneath(fd, "l", os.O_RDONLY)
        os.close(beneath.open_beneath(fd, "f", os.O_RDONLY))
    finally:
        os.close(fd)
    assert calls == ["f"] and beneath._openat2_works is False


# --------------------------------------------------------------------------- the store


def test_store_reads_nothing_through_a_symlink(opener: str, copies: Copies, fresh_log: None,
                                               caplog: pytest.LogCaptureFixture) -> None:
    planted = LocalStore(copies.planted)
    pristine = LocalStore(copies.pristine)
    readers: dict[str, Callable[[str], Any]] = {
        "get": planted.get, "fetch": planted.fetch, "head": planted.head,
        "exists": planted.exists,
        "range": lambda key: planted.get(key, ByteRange(0, 16)),
        "many": lambda key: one_of_many(planted, key),
    }

    async def main() -> None:
        for key, link in THROUGH.items():
            for name, read in readers.items():
                with pytest.raises(StorageError) as refused:
                    await read(key)
                assert (refused.value.key, refused.value.reason) == (link, NOT_FOLLOWED), name
        # Folders and domains that are symlinks are left out; the rest lists as before.
        for prefix in ("", "home/", "home/admin/"):
            assert await planted.list_dir(prefix) == await pristine.list_dir(prefix), prefix
        datasets = await pristine.list_dir(f"{ROOT}/d/")
        datasets.prefixes.remove(f"{TABLE}/")
        assert await planted.list_dir(f"{ROOT}/d/") == datasets
        # A dataset's chunk listing, and a domain's, fail rather than leave a chunk out.
        for prefix, link in ((f"{PRESSURE}/", f"{PRESSURE}/1_0"), (f"{HOUR}/", f"{HOUR}/0"),
                             (f"{TABLE}/", TABLE)):
            with pytest.raises(StorageError, match=NOT_FOLLOWED) as refused:
                [name async for name in planted.iter_dir(prefix)]
            assert refused.value.key == link
        with pytest.raises(StorageError, match=NOT_FOLLOWED):
            await planted.list_tree(f"{ROOT}/", lambda key: True, 1000)
        assert await pristine.list_tree(f"{ROOT}/", lambda key: True, 1000)
        # Every other file reads as in the untouched copy.
        for key in untouched_keys(copies):
            assert await planted.get(key) == await pristine.get(key), key

    with caplog.at_level(logging.ERROR):
        trio.run(main)
        trio.run(main)
    text = caplog.text
    assert SECRET.decode() not in text
    for link in LINKS:
        assert refused_lines(text, link) == 1, (link, text)


async def one_of_many(store: LocalStore, key: str) -> Fetched:
    """``key`` read in a ``fetch_many`` batch between two good keys: its error raised."""
    good = f"{PRESSURE}/0_0"
    first, got, last = await store.fetch_many([good, key, good], 1 << 20)
    assert isinstance(first, Fetched) and isinstance(last, Fetched)
    if isinstance(got, Exception):
        raise got
    return got


def untouched_keys(copies: Copies) -> list[str]:
    """The keys of the untouched copy's files that no link replaces or hides."""
    keys = []
    for top, _, files in os.walk(copies.pristine):
        for name in files:
            key = str(Path(top, name).relative_to(copies.pristine))
            if not any(key == link or key.startswith(link + "/") for link in LINKS):
                keys.append(key)
    assert len(keys) > 20
    return keys


def test_bucket_path_may_itself_be_a_symlink(opener: str, copies: Copies) -> None:
    """The SOURCE is the user's choice: a symlink to the bucket reads like the bucket."""
    alias = copies.outside / "alias"
    alias.symlink_to(copies.pristine)

    async def main() -> None:
        store = LocalStore(alias)
        chunk = (copies.pristine / PRESSURE / "1_0").read_bytes()
        assert await store.get(f"{PRESSURE}/1_0") == chunk
        assert (await store.list_dir("home/")).prefixes == ["home/admin/"]

    trio.run(main)


def test_catalog_takes_no_symlinked_chunk_for_an_unstored_one(copies: Copies) -> None:
    """Through the HSDS format, with the domain index that lists a domain at once:
    the listing fails, so nothing is taken as unstored; the chunk behind a
    link fails (never its fill value), the objects behind links fail, and the
    rest of the domain reads as before."""

    async def objects(bucket: Path) -> tuple[DomainIndex, HsdsCatalog, Domain]:
        store = LocalStore(bucket)
        index = DomainIndex(store, 60, eager=True)
        catalog = HsdsCatalog(store, domain_index=index)
        domain = await catalog.domain(DOMAIN)
        assert domain is not None
        return index, catalog, domain

    def dataset_id(key: str) -> str:
        return f"d-{UUID1}-{key.rpartition('/')[2]}"

    async def main() -> None:
        index, planted, domain = await objects(copies.planted)
        _, pristine, clean = await objects(copies.pristine)
        pressure = await planted.get_object(domain, dataset_id(PRESSURE))
        assert isinstance(pressure, Dataset)
        with pytest.raises(StorageError):
            [i async for i in pressure.store.iter_stored()]
        assert index.listings == 1 and index.fresh(UUID1) is None
        good = await pristine.get_object(clean, dataset_id(PRESSURE))
        assert isinstance(good, Dataset)
        assert await pressure.read_chunk((0, 0)) == await good.read_chunk((0, 0))
        with pytest.raises(StorageError):
            await pressure.read_chunk((1, 0))
        hour = await planted.get_object(domain, dataset_id(HOUR))
        assert isinstance(hour, Dataset)
        with pytest.raises(StorageError):
            await hour.read_chunk((0,))
        for key in (NAMES, TABLE):
            with pytest.raises(StorageError):
                await planted.get_object(domain, dataset_id(key))
        assert await planted.list_folder("home") == ["admin"]
        assert await planted.list_folder("home/admin") == ["sample.h5"]

    trio.run(main)


def test_linked_files_are_read_beneath_root_dir(tmp_path: Path) -> None:
    """``hsload --link`` files are read below HSDS's ROOT_DIR (the bucket's parent)
    with no symlink followed either; a file reached without one reads."""
    bucket = tmp_path / "root" / "bucket"
    (bucket / "files").mkdir(parents=True)
    (bucket / "files" / "real.h5").write_bytes(b"real")
    (tmp_path / "secret").write_bytes(SECRET)
    (bucket / "files" / "linked.h5").symlink_to(tmp_path / "secret")
    (tmp_path / "root" / "other").symlink_to(tmp_path)
    open_uri = _posix_opener(str(bucket))

    async def main() -> None:
        for uri, link in (("file:///bucket/files/linked.h5", "bucket/files/linked.h5"),
                          ("other/secret", "other")):
            store, key = open_uri(uri)
            with pytest.raises(StorageError) as refused:
                await store.get(key)
            assert (refused.value.key, refused.value.reason) == (link, NOT_FOLLOWED)
        store, key = open_uri("bucket/files/real.h5")
        assert await store.get(key) == b"real"

    trio.run(main)


# --------------------------------------------------------------------------- real mounts


Snapshot = dict[str, tuple[str, Any]]


def snapshot(top: Path) -> Snapshot:
    """Every entry under ``top`` as the mount shows it (symlinks not followed):
    a directory's names, a file's bytes, a symlink's text, or the errno."""
    out: Snapshot = {}

    def visit(rel: str) -> None:
        try:
            names = sorted(os.listdir(top / rel))
        except OSError as exc:
            out[rel] = ("error", exc.errno)
            return
        out[rel] = ("dir", names)
        for name in names:
            child = f"{rel}/{name}" if rel else name
            try:
                mode = os.lstat(top / child).st_mode
                if stat.S_ISLNK(mode):
                    out[child] = ("link", os.readlink(top / child))
                elif stat.S_ISDIR(mode):
                    visit(child)
                else:
                    out[child] = ("file", (top / child).read_bytes())
            except OSError as exc:
                out[child] = ("error", exc.errno)

    visit("")
    return out


def broken(path: str) -> bool:
    """True for a mount path whose entry the links may change (``BROKEN``)."""
    return path in LISTING_BROKEN or any(
        path == obj or path.startswith((obj + "/", obj + ".")) for obj in BROKEN)


def errno_of(fn: Callable[[], Any]) -> int:
    with pytest.raises(OSError) as info:
        fn()
    return info.value.errno or 0


@pytest.fixture(scope="module")
def module_copies(tmp_path_factory: pytest.TempPathFactory) -> Copies:
    return make_copies(tmp_path_factory.mktemp("symlinked"))


@pytest.fixture(scope="module")
def pristine_snapshot(module_copies: Copies,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[Snapshot]:
    with mounted(module_copies.pristine, tmp_path_factory.mktemp("pristine-mnt")) as mp:
        yield snapshot(mp)


@needs_fuse
@pytest.mark.mount
@pytest.mark.parametrize("ttl", ["60", "0"])
def test_mount_serves_nothing_through_a_symlink(
        ttl: str, module_copies: Copies, pristine_snapshot: Snapshot, tmp_path: Path) -> None:
    """With the default ``metadata_ttl`` and with 0 (every request reads storage
    again): the planted mount, walked twice, differs from the untouched one
    only at the broken objects, which give EIO; the folder and domains that
    are links are absent; neither the secret nor ``/etc/passwd`` is served;
    each link is logged once."""
    log = tmp_path / "h5mount.log"
    passwd = PASSWD.read_bytes()[:32]
    with mounted(module_copies.planted, tmp_path / "mp", "--log-file", str(log),
                 "-o", f"metadata_ttl={ttl}") as mp:
        walks = [snapshot(mp), snapshot(mp)]
        for walk in walks:
            for kind, value in walk.values():
                if kind == "file":
                    assert SECRET[:16] not in value and passwd not in value
        dom = mp / DOMAIN
        pressure = dom / "measurements/pressure"
        assert errno_of(lambda: os.listdir(pressure)) == errno.EIO
        for name in ("0.0", ".zarray", ".zattrs"):
            assert (pressure / name).read_bytes() == \
                pristine_snapshot[f"{DOMAIN}/measurements/pressure/{name}"][1]
        assert errno_of(lambda: os.stat(pressure / "1.0")) == errno.EIO
        assert errno_of(lambda: os.stat(dom / "measurements/hour/0")) == errno.EIO
        for path in ("measurements/pressure.npy", "measurements/hour.npy",
                     "stations/names.json", "stations/table.json"):
            assert errno_of(lambda path=path: (dom / path).read_bytes()) == errno.EIO
        for path in ("stations/names", "stations/table", "measurements/hour"):
            assert errno_of(lambda path=path: os.listdir(dom / path)) == errno.EIO
        for path in ("home/evil", "home/admin/twin.h5", "home/admin/alias.h5"):
            assert errno_of(lambda path=path: os.stat(mp / path)) == errno.ENOENT
        assert daemon_pids(mp)
    for walk in walks:
        differ = {path for path in pristine_snapshot.keys() | walk.keys()
                  if pristine_snapshot.get(path) != walk.get(path)}
        assert differ and all(broken(path) for path in differ), sorted(differ)
        assert walk[f"{DOMAIN}/measurements/pressure"] == ("error", errno.EIO)
        assert walk[f"{DOMAIN}/measurements/pressure.json"] == \
            pristine_snapshot[f"{DOMAIN}/measurements/pressure.json"]
    text = log.read_text()
    for link in LINKS:
        assert refused_lines(text, link) == 1, (link, text[-3000:])


@needs_fuse
@pytest.mark.mount
def test_reference_file_refs_follow_symlinks(tmp_path: Path) -> None:
    """A reference file's local refs name host paths: a symlink on the way is
    followed, as ``open`` would (only buckets are read beneath their directory)."""
    data = np.arange(4, dtype="<i4").tobytes()
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "data.bin").write_bytes(data)
    (tmp_path / "via").symlink_to("real")
    zarray = {"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<i4",
              "compressor": None, "filters": None, "fill_value": 0, "order": "C"}
    refs = {".zgroup": {"zarr_format": 2}, "x/.zarray": zarray,
            "x/0": [str(tmp_path / "via" / "data.bin"), 0, len(data)]}
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({"version": 1, "refs": refs}))
    with mounted(source, tmp_path / "mp") as mp:
        assert (mp / "x" / "0").read_bytes() == data
