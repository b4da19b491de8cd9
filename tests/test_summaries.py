"""HSDS's domain summaries under a live HSDS, through a real mount.

A real HSDS writes a domain (through h5pyd), flushes it and, some seconds
later, scans it (``.info.json`` and ``.summary.json``). Its background scan is
held off (``scan_wait`` of an hour), so every later write leaves the summary
stale, as a live domain's is between scans. On a local bucket and on S3
(HSDS storing on moto):

- a fresh walk of the scanned domain (what ``find`` and ``ls -lR`` ask:
  every listing, stat, sidecar and xattr) shows what HSDS serves, and costs
  at most ``WALK_REQUESTS`` storage requests for its 40-odd objects, by the
  mount's own counters: the summary stands in for reading each object;
- after writes the scan has not seen (a new attribute, a new dataset, a
  changed shape, each through HSDS's REST API), once ``metadata_ttl`` has
  passed, a walk shows every one of them (listing, sidecar, xattrs, ``.npy``
  and the domain's ``D.h5``) and nothing stale.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import h5pyd
import numpy as np
import pytest

from layouts.formats.hsds._summary import MARGIN
from mountd.control import REUSE
from tests.hsds_server import HsdsServer, S3Storage, hsds_node_available
from tests.moto_server import MotoServer
from tests.mounting import fuse_available, mounted

pytestmark = [
    pytest.mark.mount,
    pytest.mark.hsds,
    pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available())),
    pytest.mark.skipif(not hsds_node_available(), reason="hsds-node not installed"),
]

DOMAIN = "/home/admin/scanned.h5"
BUCKET = "scanned-domain"
#: Datasets in ``/many``: more than a walk reads one by one before it lists a domain.
DATASETS = 40
#: Long enough for a walk of the domain on a busy machine (a walk that outlasts
#: it lists the domain again), short enough to wait for.
TTL = 5.0
#: Longer than ``TTL`` plus the kernel's attribute timeout (also ``TTL``).
SETTLE = 2 * TTL + 1.0
#: How long the domain rests between its last write and its scan: objects
#: written within the summaries' margin of a scan are read one by one.
QUIET = MARGIN + 1.5
#: Storage requests a fresh walk of the domain may cost (its folders, domain
#: and root group, one listing of its keys, .info.json and .summary.json...).
WALK_REQUESTS = 16


def _open(server: HsdsServer, mode: str) -> Any:
    return h5pyd.File(DOMAIN, mode, endpoint=server.endpoint, username="admin",
                      password="admin")


def _write_and_scan(server: HsdsServer) -> None:
    server.ensure_folder("/home/")
    server.ensure_folder("/home/admin/", owner="admin")
    with _open(server, "w") as f:
        many = f.create_group("many")
        for i in range(DATASETS):
            many.create_dataset(f"d{i:03d}", data=np.arange(4, dtype="<i4") + i)
        f.create_dataset("ext", data=np.arange(10, dtype="<i4"), maxshape=(None,), chunks=(5,))
    server.flush(DOMAIN)
    time.sleep(QUIET)  # as HSDS's own scan comes a while after the last write
    server.wait_for_scan(DOMAIN)


def _storage_requests(mp: Path) -> int:
    """Storage requests the mount has made, as it counts them (its statistics are
    made anew at most once per ``REUSE`` seconds: wait that long first)."""
    time.sleep(REUSE + 0.1)
    doc = json.loads((mp / ".h5mount/stats.json").read_bytes())
    return sum(figures["requests"] for figures in doc["storage"].values())


def _walk(top: Path) -> dict[str, Any]:
    """What ``find``, ``ls -lR`` and ``getfattr -d`` see below ``top``: every
    entry's stat and xattrs, and every sidecar's document."""
    seen: dict[str, Any] = {}
    for here, dirs, files in os.walk(top):
        for name in sorted(dirs + files):
            path = Path(here) / name
            st = os.lstat(path)
            rel = str(path.relative_to(top))
            xattrs = {} if path.is_symlink() else {
                x: os.getxattr(path, x) for x in os.listxattr(path)}
            seen[rel] = (st.st_mode, st.st_size, st.st_mtime, xattrs)
            if name.endswith(".json") and path.is_file():
                seen[rel + " (doc)"] = json.loads(path.read_bytes())
    return seen


def _matches_hsds(server: HsdsServer, root: Path) -> None:
    """Every dataset's ``.npy`` and sidecar shape are what HSDS's REST API serves.
    (Not h5pyd: it takes a domain's metadata from the summary whenever one
    exists, stale or not, so after unscanned writes it reads ``/ext`` with its
    old shape.)"""
    for name in (*(f"many/d{i:03d}" for i in range(DATASETS)), "ext"):
        doc = json.loads((root / f"{name}.json").read_bytes())
        shape = server.rest("GET", f"/datasets/{doc['id']}", DOMAIN)["shape"]["dims"]
        values = server.rest("GET", f"/datasets/{doc['id']}/value", DOMAIN)["value"]
        assert doc["shape"] == shape, name
        assert np.load(root / f"{name}.npy").tolist() == values, name


def _write_unscanned(server: HsdsServer, root: Path) -> dict[str, str]:
    """An attribute on ``/many/d005``, a new dataset ``/added`` and ``/ext`` grown
    to 15, written through HSDS's REST API and flushed; the ids involved."""
    ids = {name: json.loads((root / f"{name}.json").read_bytes())["id"]
           for name in ("many/d005", "ext")}
    ids["/"] = json.loads((root.parent / f"{root.name}.json").read_bytes())["id"]
    server.rest("PUT", f"/datasets/{ids['many/d005']}/attributes/later", DOMAIN,
                {"type": "H5T_STD_I32LE", "shape": "H5S_SCALAR", "value": 7})
    added = server.rest("POST", "/datasets", DOMAIN,
                        {"type": "H5T_STD_I32LE", "shape": [3],
                         "link": {"id": ids["/"], "name": "added"}})
    ids["added"] = added["id"]
    server.rest("PUT", f"/datasets/{ids['ext']}/shape", DOMAIN, {"shape": [15]})
    server.flush(DOMAIN)
    return ids


def _check_summaries_and_writes(server: HsdsServer, mp: Path) -> None:
    root = mp / DOMAIN.strip("/")
    before = _storage_requests(mp)
    first = _walk(root.parent)
    walked = _storage_requests(mp) - before
    objects = sum(1 for rel in first if rel.endswith(".json (doc)"))
    assert objects > DATASETS
    assert walked <= WALK_REQUESTS < objects, (walked, objects)
    _matches_hsds(server, root)

    ids = _write_unscanned(server, root)
    summary = server.keys().get(f"db/{ids['/'][2:19]}/.summary.json")
    assert summary is not None and ids["added"].encode() not in summary  # it is stale
    time.sleep(SETTLE)

    after = _walk(root.parent)
    assert "scanned.h5/added" in after and "scanned.h5/added.npy" in after
    assert after["scanned.h5/added.json (doc)"]["shape"] == [3]
    assert np.load(root / "added.npy").tolist() == [0, 0, 0]
    attrs = after["scanned.h5/many/d005.json (doc)"]["attributes"]
    assert attrs == {"later": 7}
    assert os.getxattr(root / "many/d005", "user.h5.attr.later") == b"7"
    assert after["scanned.h5/ext.json (doc)"]["shape"] == [15]
    assert np.load(root / "ext.npy").tolist() == [*range(10), 0, 0, 0, 0, 0]
    _matches_hsds(server, root)
    with h5py.File(root.parent / f"{root.name}.h5", "r") as f:
        assert f["many/d005"].attrs["later"] == 7
        assert f["added"].shape == (3,) and f["ext"].shape == (15,)
    # The objects not written are shown as they were, times included.
    untouched = [rel for rel in first if rel.startswith("scanned.h5/many/")
                 and not rel.startswith("scanned.h5/many/d005")]
    assert len(untouched) > 3 * DATASETS
    assert [rel for rel in untouched if after.get(rel) != first[rel]] == []


@contextmanager
def _mounted_with_stats(source: str | Path, mp: Path, *args: str,
                        env: dict[str, str] | None = None) -> Iterator[Path]:
    with mounted(source, mp, "-o", f"metadata_ttl={TTL}", *args, env=env) as root:
        yield root


def test_local_walk_uses_the_summary_and_shows_later_writes(tmp_path: Path) -> None:
    server = HsdsServer(tmp_path / "root", BUCKET, log_dir=tmp_path / "logs", scan_wait=3600)
    with server:
        _write_and_scan(server)
        with _mounted_with_stats(server.bucket_dir, tmp_path / "mnt") as mp:
            _check_summaries_and_writes(server, mp)


@pytest.mark.server
def test_s3_walk_uses_the_summary_and_shows_later_writes(moto: MotoServer,
                                                         tmp_path: Path) -> None:
    moto.create_bucket(BUCKET)
    storage = S3Storage.from_env(moto.endpoint, moto.env())
    server = HsdsServer(None, BUCKET, s3=storage, log_dir=tmp_path / "logs", scan_wait=3600)
    with server:
        _write_and_scan(server)
        with _mounted_with_stats(f"s3://{BUCKET}", tmp_path / "mnt", "--endpoint-url",
                                 moto.endpoint, env=moto.env()) as mp:
            _check_summaries_and_writes(server, mp)
