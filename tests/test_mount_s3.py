"""Mounting HSDS buckets on a real S3 endpoint (moto on loopback), through the real daemon.

The S3 buckets are key-for-key copies of the session's POSIX bucket, so the
S3 mount must show exactly the local mount: every name, type, size, mode,
symlink, xattr and byte (each domain's ``D.h5`` as h5dump reads it), but for
times: those are the storage's (docs/CONTRACT.md, "File attributes"), the copy's
S3 LastModified on one side and the files' mtimes on the other, and are
checked against each storage instead (``test_times_are_the_storage_times``).
Faults are injected by a real HTTP proxy in front of moto
(``tests/faultproxy.py``): retried faults must not change a byte, permanent
ones give EIO within ``-o timeout``, and a slow server still gains from
readahead. A bucket HSDS wrote onto S3 itself is compared with
h5py. SIGHUP rereads the credentials of a profile: the proxy's record shows
which access key signed each request (its ``Authorization`` header), and a
credentials file gone at the SIGHUP leaves the old key in use with a warning.
With ``-o cache_decoded`` a remount serves chunks decoded from its cache_dir
(the proxy sees HEADs only), unless the chunk object changed meanwhile.
"""

from __future__ import annotations

import errno
import io
import json
import os
import random
import re
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h5py
import numpy as np
import pytest

from layouts.formats.hsds._ids import parse_id
from mountd.control import REUSE
from tests.faultproxy import FaultProxy, Seen
from tests.h5compare import mount_file, walk_links
from tests.mounting import daemon_pids, fuse_available, mounted
from tests.test_decodedcache import wait_decoded

pytestmark = [pytest.mark.mount, pytest.mark.hsds, pytest.mark.server,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

#: A dataset with a 3x2 grid of gzip chunks, all stored.
GZIP = "home/admin/filters.h5/gzip"
#: A dataset with a 3x3x3 grid of chunks, all stored.
GRID = "home/admin/layout.h5/edge_3d"


def snapshot(root: Path) -> dict[str, tuple]:
    """Everything a user can see below ``root``, by relative path (no symlinks
    followed), but for times: a sidecar's ``modified`` is left out of its
    content (and so its size), and ``st_mtime``/``st_ctime`` out of every stat."""
    seen: dict[str, tuple] = {}
    pending = [root]
    while pending:
        here = pending.pop()
        for entry in sorted(os.scandir(here), key=lambda e: e.name):
            path = Path(entry.path)
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            common = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size,
                      st.st_uid, st.st_gid)
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = (*common, os.readlink(path))
                continue
            xattrs = {name: os.getxattr(path, name) for name in sorted(os.listxattr(path))}
            if stat.S_ISDIR(st.st_mode):
                seen[rel] = (*common, xattrs)
                pending.append(path)
            elif path.name.endswith(".h5.h5") or path.name == ".root.h5":
                # A domain's file view names its .npy files by the mount's own
                # path, so its size and bytes differ between mounts: compare
                # what h5dump reads through it.
                seen[rel] = (*common[:2], *common[3:], xattrs, h5dump(path, root))
            elif (sidecar := timeless_sidecar(path)) is not None:
                seen[rel] = (*common[:2], *common[3:], xattrs, sidecar)
            else:
                seen[rel] = (*common, xattrs, read_file(path))
    return seen


def timeless_sidecar(path: Path) -> dict[str, Any] | None:
    """A sidecar's document without its storage time; None for any other file
    (told by content: a long name is cut and hashed, ``.json`` and all), or
    for a file that cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if not raw.startswith(b"{"):
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not {"kind", "path", "id", "modified"} <= set(doc) \
            or doc["kind"] not in ("group", "dataset", "datatype"):
        return None
    assert isinstance(doc.pop("modified"), float | int), path
    return doc


def h5dump(path: Path, mount: Path) -> str:
    """What h5dump reads through a file view, with what names this mount and
    its file layout in it (external link targets, the file addresses that
    h5dump prints for object references) spelled the same for every mount."""
    done = subprocess.run(["h5dump", path.name], cwd=path.parent, capture_output=True,
                          text=True, errors="replace", check=False, timeout=300)
    text = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    text = text.replace(f'"{mount}/', '"MOUNT/')
    return re.sub(r"\b(DATASET|GROUP|DATATYPE) \d+ ", r"\1 ADDRESS ", text)


def read_file(path: Path) -> bytes | str:
    try:
        return path.read_bytes()
    except OSError as exc:
        return f"errno {exc.errno}"


@pytest.fixture(scope="module")
def local_tree(mnt: Path) -> dict[str, tuple]:
    return snapshot(mnt)


@pytest.fixture(scope="module")
def s3_mnt(s3_bucket, tmp_path_factory) -> Iterator[Path]:
    mp = tmp_path_factory.mktemp("s3mnt")
    with mounted(s3_bucket.url, mp, *s3_bucket.mount_args(), env=s3_bucket.env):
        yield mp


def test_s3_mount_equals_local_mount(s3_mnt: Path, local_tree: dict[str, tuple]) -> None:
    remote = snapshot(s3_mnt)
    assert len(local_tree) > 500
    assert sorted(remote) == sorted(local_tree)
    different = [rel for rel in local_tree if remote[rel] != local_tree[rel]]
    assert different == [], [(rel, local_tree[rel][:7], remote[rel][:7]) for rel in different[:6]]


def test_times_are_the_storage_times(s3_mnt: Path, mnt: Path, s3_bucket) -> None:
    """An object's times and its sidecar's ``modified`` are the last-modified
    time of its stored JSON: S3's LastModified on the S3 mount, the file's
    mtime on the local one (a domain's directory: its ``.domain.json``'s)."""
    domain = "home/admin/links.h5"
    listed = s3_bucket.keys().times()
    local_dir = s3_bucket.local_dir
    assert local_dir is not None
    for top, stored in ((s3_mnt, lambda key: listed[s3_bucket.key(key)]),
                        (mnt, lambda key: (local_dir / key).stat().st_mtime)):
        root = json.loads((local_dir / domain / ".domain.json").read_text())["root"]
        assert os.stat(top / domain).st_mtime == pytest.approx(stored(f"{domain}/.domain.json"))
        checked = 0
        for sidecar in (top / domain).rglob("*.json"):
            if sidecar.is_symlink() or not sidecar.is_file():
                continue
            doc = timeless_sidecar(sidecar)
            if doc is None:
                continue
            with open(sidecar, "rb") as f:
                modified = json.load(f)["modified"]
            key = parse_id(doc["id"]).json_key()
            assert modified == pytest.approx(stored(key)), sidecar
            entry = sidecar.with_suffix("") if doc["path"] != "/" else None
            if entry is not None:
                st = os.stat(entry)
                assert st.st_mtime == st.st_ctime == pytest.approx(modified), entry
            checked += 1
        assert checked >= 5 and root


def test_prefixed_bucket_with_domain(s3_prefixed_bucket, hsds_bucket, tmp_path) -> None:
    domain = "home/admin/types.h5"
    with mounted(hsds_bucket.bucket_dir, tmp_path / "local", "--domain", domain) as local, \
            mounted(s3_prefixed_bucket.url, tmp_path / "s3", "--domain", domain,
                    *s3_prefixed_bucket.mount_args(), env=s3_prefixed_bucket.env) as remote:
        expected = snapshot(local)
        assert ".root.json" in expected
        assert snapshot(remote) == expected


def test_bucket_written_by_hsds_on_s3(hsds_s3_direct, tmp_path) -> None:
    with mounted(hsds_s3_direct.url, tmp_path / "mnt", *hsds_s3_direct.mount_args(),
                 env=hsds_s3_direct.env) as mp:
        checked = 0
        for domain, h5file in hsds_s3_direct.domains():
            with h5py.File(h5file, "r") as f:
                for info in walk_links(f):
                    obj = f.get(info.path)
                    if not isinstance(obj, h5py.Dataset) or obj.dtype.hasobject \
                            or obj.shape is None:
                        continue
                    npy = mp / domain / mount_file(info.path, ".npy")
                    got = np.load(npy)
                    np.testing.assert_array_equal(got, obj[()])
                    assert got.dtype == obj.dtype
                    checked += 1
        assert checked >= 10


def test_unreadable_sources_are_refused(s3_bucket, tmp_path) -> None:
    from tests.mounting import run_h5mount  # noqa: PLC0415

    (tmp_path / "mp").mkdir()
    cases = {
        "s3://no-such-bucket-here": "does not exist",
        f"s3://{s3_bucket.bucket}/home/admin/types.h5/nothing": "not an HSDS bucket",
    }
    for url, message in cases.items():
        proc = run_h5mount(url, str(tmp_path / "mp"), *s3_bucket.mount_args(),
                           "-o", "timeout=5", env=s3_bucket.env)
        assert proc.returncode == 1, proc.stderr
        assert message in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------- faults


def chunk_path(mp: Path, dataset: str) -> str:
    """The S3 key prefix of ``dataset``'s chunk objects, for matching in the proxy."""
    ds_id = parse_id(os.getxattr(mp / dataset, "user.h5.id").decode())
    return f"/d/{ds_id.uuid2}/"


@pytest.fixture
def proxy(moto) -> Iterator[FaultProxy]:
    with FaultProxy(moto.endpoint) as p:
        yield p


def proxied(s3_bucket, proxy: FaultProxy, mp: Path, *options: str):
    return mounted(s3_bucket.url, mp, "--endpoint-url", proxy.endpoint, *options,
                   env=s3_bucket.env)


def test_transient_faults_are_retried(s3_bucket, mnt, proxy, tmp_path) -> None:
    expected = (mnt / f"{GZIP}.npy").read_bytes()
    with proxied(s3_bucket, proxy, tmp_path / "mp", "-o", "timeout=20") as mp:
        where = chunk_path(mp, GZIP)
        proxy.error(503, method="GET", path=where, times=2)
        proxy.reset(method="GET", path=where, times=2)
        proxy.truncate(method="GET", path=where, times=1)
        proxy.error(500, method="GET", path=where, times=1)
        assert (mp / f"{GZIP}.npy").read_bytes() == expected
        faults = [seen for seen in proxy.requests("GET", where) if seen.fault]
        assert len(faults) == 6
        # The daemon's own figures (.h5mount/stats.json) agree with the proxy: every
        # attempt it saw is one storage request or one retry of it, none failed.
        figures = settled_stats(mp)
        s3 = figures["storage"]["s3"]
        assert s3["retries"] >= 6
        assert s3["requests"] + s3["retries"] == proxy.count()
        assert s3["failures"] == 0 and figures["errors"].get("EIO", 0) == 0


def settled_stats(mp: Path) -> dict[str, Any]:
    """``.h5mount/stats.json`` once two renderings a second apart show the same
    storage requests (readahead under way has landed)."""
    previous = None
    for _ in range(20):
        time.sleep(REUSE + 0.05)
        doc: dict[str, Any] = json.loads((mp / ".h5mount" / "stats.json").read_bytes())
        if previous is not None and doc["storage"] == previous["storage"]:
            return doc
        previous = doc
    raise AssertionError("storage requests did not settle")


def test_permanent_failure_gives_eio_within_timeout(s3_bucket, mnt, proxy, tmp_path) -> None:
    with proxied(s3_bucket, proxy, tmp_path / "mp", "-o", "timeout=3") as mp:
        proxy.error(503, method="GET", path=chunk_path(mp, GZIP))
        started = time.monotonic()
        with pytest.raises(OSError) as err:
            (mp / GZIP / "0.0").read_bytes()
        elapsed = time.monotonic() - started
        assert err.value.errno == errno.EIO
        assert elapsed < 3 + 2
        assert proxy.count("GET", chunk_path(mp, GZIP)) >= 2
        # The rest of the mount still reads, and the daemon is alive.
        sibling = "home/admin/filters.h5/gzip_shuffle.npy"
        assert (mp / sibling).read_bytes() == (mnt / sibling).read_bytes()


def test_stalled_server_gives_eio_not_a_hang(s3_bucket, proxy, tmp_path) -> None:
    with proxied(s3_bucket, proxy, tmp_path / "mp", "-o", "timeout=3") as mp:
        proxy.stall(30, method="GET", path=chunk_path(mp, GZIP))
        started = time.monotonic()
        with pytest.raises(OSError) as err:
            (mp / GZIP / "1.1").read_bytes()
        assert err.value.errno == errno.EIO
        # One timeout, twice at most: the kernel retries a failed readahead page at
        # once, and the chunk cache gives that retry the same error (error_ttl).
        # About one run in eight on a loaded machine took 6 s, which looks like a
        # retry that fetched again (one that falls into the next metadata_ttl
        # period has new chunk keys); not a hang, so it is allowed.
        assert time.monotonic() - started < 2 * 3 + 2


def test_server_killed_and_restarted_under_a_reader(s3_bucket, mnt, proxy, tmp_path) -> None:
    """A reader runs while the S3 server goes away (connections cut, port
    closed) and comes back on the same port: every read gives the right
    bytes or EIO, never wrong bytes; afterwards everything reads again, the
    daemon is alive, and the disk cache holds no partial block (a remount on
    it reads right with the server gone)."""
    expected = (mnt / f"{GRID}.npy").read_bytes()
    cache = tmp_path / "cache"
    # metadata_ttl=1: cached chunks and metadata expire while the server is
    # gone, so reads go to it (the dataset is small enough to be cached whole).
    options = ("-o", f"timeout=2,metadata_ttl=1,cache_dir={cache},cache_size=1M,chunk_cache=1M")
    outcomes = {"ok": 0, "eio": 0}
    wrong: list[str] = []
    with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
        stop = threading.Event()

        def reader() -> None:
            rng = random.Random(7)
            while not stop.is_set():
                offset = rng.randrange(len(expected))
                try:
                    with open(mp / f"{GRID}.npy", "rb") as f:
                        f.seek(offset)
                        got = f.read(65536)
                except OSError as exc:
                    if exc.errno != errno.EIO:
                        wrong.append(f"errno {exc.errno}")
                    outcomes["eio"] += 1
                    continue
                if got != expected[offset:offset + 65536]:
                    wrong.append(f"wrong bytes at {offset}")
                outcomes["ok"] += 1

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            time.sleep(1.0)
            port = proxy.port
            proxy.stop()
            time.sleep(4.0)  # longer than the timeout: reads in flight give EIO
            proxy.start(port)
            time.sleep(3.0)
        finally:
            stop.set()
            thread.join(60)
        assert not thread.is_alive() and not wrong, wrong[:5]
        assert outcomes["ok"] > 0 and outcomes["eio"] > 0, outcomes
        assert (mp / f"{GRID}.npy").read_bytes() == expected
    # Remount on the same disk cache with every chunk GET failing: what it
    # serves comes from the cache alone, and must be whole blocks.
    with proxied(s3_bucket, proxy, tmp_path / "mp2", "-o", f"timeout=2,cache_dir={cache}") \
            as mp2:
        proxy.error(500, method="GET", path=chunk_path(mp2, GRID))
        served = 0
        for name in sorted(n for n in os.listdir(mp2 / GRID) if n[0].isdigit()):
            try:
                got = (mp2 / GRID / name).read_bytes()
            except OSError as exc:  # not cached whole: EIO, never wrong bytes
                assert exc.errno == errno.EIO
                continue
            assert got == (mnt / GRID / name).read_bytes(), name
            served += 1
        assert served > 0


def test_credentials_never_leak(s3_bucket, proxy, tmp_path) -> None:
    """The secret key and session token reach nothing the mount or its logs
    produce, at DEBUG level, through errors and retries included: log file,
    stats file, sidecars, xattrs, .zattrs."""
    secret, token = "SeCrEt-" + os.urandom(8).hex(), "ToKeN-" + os.urandom(8).hex()
    env = {**s3_bucket.env, "AWS_SECRET_ACCESS_KEY": secret, "AWS_SESSION_TOKEN": token}
    log_file, stats = tmp_path / "h5mount.log", tmp_path / "stats.json"
    with mounted(s3_bucket.url, tmp_path / "mp", "--endpoint-url", proxy.endpoint,
                 "--log-level", "DEBUG", "--log-file", str(log_file),
                 "-o", f"timeout=2,stats_file={stats}", env=env) as mp:
        proxy.error(503, method="GET", path=chunk_path(mp, GZIP), times=3)
        proxy.error(403, method="GET", path=chunk_path(mp, GRID))
        produced = [(mp / f"{GZIP}.npy").read_bytes()]
        with pytest.raises(OSError):
            (mp / f"{GRID}.npy").read_bytes()
        for here, _, files in os.walk(mp / "home/admin/filters.h5"):
            for name in files:
                path = Path(here) / name
                if name.endswith(".json") or name.startswith(".z"):
                    produced.append(path.read_bytes())
                produced += [os.getxattr(path, x) for x in os.listxattr(path)]
        (pid,) = daemon_pids(mp)
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not stats.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    produced += [log_file.read_bytes(), stats.read_bytes()]
    assert b"503" in produced[-2] or b"SlowDown" in produced[-2]  # the log saw the faults
    for blob in produced:
        assert secret.encode() not in blob and token.encode() not in blob


def test_readahead_overlaps_a_slow_server(s3_bucket, mnt, proxy, tmp_path) -> None:
    delay = 0.4
    with proxied(s3_bucket, proxy, tmp_path / "mp") as mp:
        chunks = sorted((n for n in os.listdir(mp / GRID) if n[0].isdigit()),
                        key=lambda n: tuple(map(int, n.split("."))))
        assert len(chunks) == 27
        proxy.latency(delay, method="GET", path=chunk_path(mp, GRID))
        started = time.monotonic()
        for name in chunks:
            assert (mp / GRID / name).read_bytes() == (mnt / GRID / name).read_bytes()
        elapsed = time.monotonic() - started
        # One request after another would take len(chunks) * delay.
        assert elapsed < 0.5 * len(chunks) * delay, elapsed


def test_disk_cache_survives_a_remount(s3_bucket, mnt, proxy, tmp_path) -> None:
    cache = tmp_path / "cache"
    options = ("-o", f"cache_dir={cache}")
    expected = (mnt / f"{GRID}.npy").read_bytes()
    with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
        where = chunk_path(mp, GRID)
        assert (mp / f"{GRID}.npy").read_bytes() == expected
    assert proxy.count("GET", where) >= 1
    assert sum(1 for p in cache.rglob("*") if p.is_file()) >= 27
    proxy.clear()
    with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
        assert (mp / f"{GRID}.npy").read_bytes() == expected
    assert proxy.count("GET", where) == 0
    # One revalidation per chunk object (the dataset's own JSON shares the prefix).
    heads = [r.target for r in proxy.requests("HEAD", where) if not r.target.endswith(".json")]
    assert len(heads) == 27


def _walk_reading_sidecars(mp: Path) -> int:
    """``find`` over the mount, reading every sidecar: what a walk reads of each
    object's metadata. The number of sidecars read."""
    found = subprocess.run(["find", str(mp), "-name", "*.json", "-type", "f", "-print0"],
                           capture_output=True, check=True).stdout.split(b"\0")[:-1]
    for path in found:
        Path(os.fsdecode(path)).read_bytes()
    return len(found)


def test_remount_walks_from_the_disk_cache(s3_bucket, proxy, tmp_path) -> None:
    """With ``cache_dir``, a remount within ``metadata_ttl`` of the first walk walks
    every domain with no request for any of its objects and no listing (each
    domain's listing is kept as a record, still current); after the TTL, with
    one listing per domain and still no request for an object: the listing
    proves the etags of what the disk cache holds (``BlockCache.vouch``)."""
    cache = tmp_path / "cache"
    options = ("-o", f"cache_dir={cache}")
    sizes = s3_bucket.keys().entries()
    prefix = f"/{s3_bucket.bucket}/"

    def objects_asked() -> list[str]:
        asked = [seen.target.split("?")[0] for seen in proxy.requests(path="/db/")
                 if "list-type=2" not in seen.target]
        # but for empty objects, which leave no block on disk
        return [key for key in asked if sizes.get(key.removeprefix(prefix), (1,))[0] != 0]

    with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
        first = _walk_reading_sidecars(mp)
    assert first > 100 and len(objects_asked()) > 100
    proxy.clear()
    with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
        assert _walk_reading_sidecars(mp) == first
    assert objects_asked() == [] and _domain_listings(proxy) == []
    time.sleep(ttl := 6.0)  # every record older than the next mount's TTL
    proxy.clear()
    with proxied(s3_bucket, proxy, tmp_path / "mp", "-o",
                 f"cache_dir={cache},metadata_ttl={ttl}") as mp:
        assert _walk_reading_sidecars(mp) == first
    assert objects_asked() == []
    listed = _domain_listings(proxy)
    assert len(set(listed)) == len(s3_bucket.domains()) and len(listed) >= len(set(listed))


def figures(mp: Path) -> dict[str, Any]:
    """``.h5mount/stats.json``: the first of a mount is made when it is read."""
    doc: dict[str, Any] = json.loads((mp / ".h5mount" / "stats.json").read_bytes())
    return doc


def test_decoded_chunks_survive_a_remount(s3_bucket, proxy, tmp_path) -> None:
    """With ``cache_decoded``, a remount on the same cache_dir reads a gzip dataset's
    ``.npy`` with no GET of a chunk object and no chunk decoded; and, within
    ``metadata_ttl`` of the first mount's listing of the domain (which it kept
    there), with no HEAD either: the listing vouches for their etags."""
    cache = tmp_path / "cache"
    options = ("-o", f"cache_dir={cache},cache_decoded")
    domain, name = GZIP.rsplit("/", 1)
    with h5py.File(s3_bucket.files[domain]) as f:
        want = f[name][()]
    with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
        where = chunk_path(mp, GZIP)
        first = (mp / f"{GZIP}.npy").read_bytes()
        chunks = len([n for n in os.listdir(mp / GZIP) if n[0].isdigit()])
        wait_decoded(cache, chunks)
        blocks = figures(mp)["caches"]["blocks"]
    assert chunks == 6 and blocks["decoded_misses"] == chunks and blocks["decoded_hits"] == 0
    np.testing.assert_array_equal(np.load(io.BytesIO(first)), want)
    proxy.clear()
    with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
        assert (mp / f"{GZIP}.npy").read_bytes() == first
        blocks = figures(mp)["caches"]["blocks"]
    assert (blocks["decoded_hits"], blocks["decoded_misses"]) == (chunks, 0)
    assert proxy.count("GET", where) == 0 and proxy.count("HEAD", where) == 0


def test_decoded_chunk_of_a_changed_object_is_not_served(s3_bucket, moto, mnt, proxy,
                                                          tmp_path) -> None:
    """A chunk object replaced after it was kept decoded (a new ETag) is read and
    decoded again on the next mount: its new content, never the kept one."""
    cache = tmp_path / "cache"
    options = ("-o", f"cache_dir={cache},cache_decoded")
    with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
        chunk_dir = parse_id(os.getxattr(mp / GZIP, "user.h5.id").decode()).chunk_dir()
        assert (mp / GZIP / "0.0").read_bytes() == (mnt / GZIP / "0.0").read_bytes()
        wait_decoded(cache, 1)
    client = moto.client()
    target, source = s3_bucket.key(f"{chunk_dir}0_0"), s3_bucket.key(f"{chunk_dir}1_1")
    old = client.get_object(Bucket=s3_bucket.bucket, Key=target)["Body"].read()
    new = client.get_object(Bucket=s3_bucket.bucket, Key=source)["Body"].read()
    assert old != new
    client.put_object(Bucket=s3_bucket.bucket, Key=target, Body=new)
    try:
        with proxied(s3_bucket, proxy, tmp_path / "mp", *options) as mp:
            assert (mp / GZIP / "0.0").read_bytes() == (mnt / GZIP / "1.1").read_bytes()
            blocks = figures(mp)["caches"]["blocks"]
        assert (blocks["decoded_hits"], blocks["decoded_misses"]) == (0, 1)
    finally:
        client.put_object(Bucket=s3_bucket.bucket, Key=target, Body=old)


def _list_prefixes(proxy: FaultProxy) -> list[str]:
    """The ``prefix`` of every listing (its first ListObjectsV2 page) the proxy saw."""
    prefixes = []
    for seen in proxy.requests("GET", "list-type=2"):
        query = parse_qs(urlsplit(seen.target).query)
        if "continuation-token" not in query:  # the first page of a listing
            prefixes.append(query.get("prefix", [""])[0])
    return prefixes


def _domain_listings(proxy: FaultProxy) -> list[str]:
    """The prefixes of the listings of whole domains (``db/<uuid1>/``) the proxy saw."""
    return [p for p in _list_prefixes(proxy) if re.fullmatch(r"db/[0-9a-f]{8}-[0-9a-f]{8}/", p)]


def test_walk_lists_each_domain_not_each_dataset(s3_bucket, mnt, proxy, tmp_path) -> None:
    """``find`` over the whole S3 mount lists every domain's keys in one listing
    (``layouts.formats.hsds._domains``) instead of one LIST per dataset, and finds
    exactly what the local mount shows."""
    local = subprocess.run(["find", "."], cwd=mnt, capture_output=True, text=True, check=True)
    with proxied(s3_bucket, proxy, tmp_path / "mp") as mp:
        found = subprocess.run(["find", "."], cwd=mp, capture_output=True, text=True,
                               check=True)
        dirs = [mp / d for d in found.stdout.split("\n")
                if d and (mp / d).is_dir() and not (mp / d).is_symlink()]
        datasets = sum(1 for d in dirs if "user.h5.kind" in os.listxattr(d)
                       and os.getxattr(d, "user.h5.kind") == b"dataset")
    assert sorted(found.stdout.split("\n")) == sorted(local.stdout.split("\n"))
    prefixes = _list_prefixes(proxy)
    domain_level = _domain_listings(proxy)
    per_dataset = [p for p in prefixes if "/d/" in p]
    assert datasets > 20
    assert per_dataset == []
    assert 1 <= len(set(domain_level)) == len(domain_level)


# ------------------------------------------------------------------------- SIGHUP

#: The profile the SIGHUP tests mount with, in a credentials file of their own.
PROFILE = "h5reload"


def write_credentials(path: Path, key: str, profile: str = PROFILE) -> None:
    path.write_text(f"[{profile}]\naws_access_key_id = {key}\n"
                    f"aws_secret_access_key = secret-of-{key}\n")


def signing_key(seen: Seen) -> str | None:
    """The access key of a request's SigV4 ``Authorization`` header (None: unsigned)."""
    auth = next((v for k, v in seen.headers.items() if k.lower() == "authorization"), "")
    match = re.search(r"Credential=([^/]+)/", auth)
    return match[1] if match else None


def by_aiobotocore(seen: Seen) -> bool:
    """Whether aiobotocore sent the request (listings), not the hot path (GET, HEAD)."""
    return any(name.lower() == "amz-sdk-invocation-id" for name in seen.headers)


def sighup(mp: Path, log_file: Path) -> None:
    """Send SIGHUP to the daemon of ``mp`` and wait until it has acted on it."""
    (pid,) = daemon_pids(mp)
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "SIGHUP:" not in log_file.read_text():
        assert time.monotonic() < deadline, "the daemon did not log the SIGHUP"
        time.sleep(0.05)


def profile_mount(s3_bucket, proxy: FaultProxy, mp: Path, credentials: Path, log_file: Path):
    """A mount through ``proxy`` with ``-o profile=PROFILE`` read from ``credentials``
    alone (no AWS_* keys, no config file, no instance metadata)."""
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(credentials),
           "AWS_CONFIG_FILE": str(credentials.parent / "no-config"),
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": "us-east-1"}
    return mounted(s3_bucket.url, mp, "--endpoint-url", proxy.endpoint,
                   "-o", f"profile={PROFILE},metadata_ttl=3600,timeout=10",
                   "--log-level", "INFO", "--log-file", str(log_file), env=env)


def read_some(mp: Path, mnt: Path, dataset: str) -> None:
    """Read a dataset whole and list its chunk files (a listing of its domain's keys)."""
    assert (mp / f"{dataset}.npy").read_bytes() == (mnt / f"{dataset}.npy").read_bytes()
    assert sorted(os.listdir(mp / dataset)) == sorted(os.listdir(mnt / dataset))


def test_sighup_rereads_the_credentials_file(s3_bucket, mnt, proxy, tmp_path) -> None:
    """Requests before the SIGHUP are signed with key A, after it with key B, on both
    paths; the domain's key index is listed again after it."""
    credentials, log_file = tmp_path / "credentials", tmp_path / "h5mount.log"
    key_a, key_b = f"KEYA{os.urandom(4).hex()}", f"KEYB{os.urandom(4).hex()}"
    write_credentials(credentials, key_a)
    with profile_mount(s3_bucket, proxy, tmp_path / "mp", credentials, log_file) as mp:
        read_some(mp, mnt, GZIP)
        before = proxy.requests()
        write_credentials(credentials, key_b)
        sighup(mp, log_file)
        mark = len(proxy.requests())
        read_some(mp, mnt, GZIP)
        read_some(mp, mnt, GRID)
        after = proxy.requests()[mark:]
    assert {signing_key(seen) for seen in before} == {key_a}
    assert {signing_key(seen) for seen in after} == {key_b}
    for seen in (before, after):
        assert any(by_aiobotocore(s) for s in seen) and not all(by_aiobotocore(s) for s in seen)
    filters_keys = _domain_listings(proxy)
    assert len(filters_keys) == 3 and len(set(filters_keys)) == 2  # filters.h5 twice
    log = log_file.read_text()
    assert f"AWS credentials reread (profile {PROFILE}): access key {key_b}" in log
    assert " WARNING " not in log
    assert f"secret-of-{key_a}" not in log and f"secret-of-{key_b}" not in log


@pytest.mark.parametrize("change", ["removed", "profile gone", "not parsable"])
def test_sighup_keeps_the_credentials_it_cannot_reread(change: str, s3_bucket, mnt, proxy,
                                                       tmp_path) -> None:
    """A credentials file that is gone, lost the profile or cannot be parsed at the
    SIGHUP: the mount goes on with the old key, and one WARNING says why."""
    credentials, log_file = tmp_path / "credentials", tmp_path / "h5mount.log"
    key = f"KEYA{os.urandom(4).hex()}"
    write_credentials(credentials, key)
    with profile_mount(s3_bucket, proxy, tmp_path / "mp", credentials, log_file) as mp:
        read_some(mp, mnt, GZIP)
        if change == "removed":
            credentials.unlink()
        elif change == "profile gone":
            write_credentials(credentials, "KEYOTHER", profile="someone-else")
        else:
            credentials.write_text("[h5reload\naws_access_key_id = KEYBROKEN\n")
        sighup(mp, log_file)
        mark = len(proxy.requests())
        read_some(mp, mnt, GRID)
        read_some(mp, mnt, GZIP)
        after = proxy.requests()[mark:]
        assert daemon_pids(mp)
    assert after and {signing_key(seen) for seen in after} == {key}
    warnings = [line for line in log_file.read_text().splitlines() if " WARNING " in line]
    assert len(warnings) == 1, warnings
    assert f"AWS credentials not reread, still signing with access key {key}" in warnings[0]
    reason = {"removed": "could not be found", "profile gone": "could not be found",
              "not parsable": "ConfigParseError"}[change]
    assert reason in warnings[0]
