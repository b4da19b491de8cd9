"""Consistency with storage that changes under the mount (docs/CONTRACT.md,
"Consistency"): a real HSDS rewrites chunks and objects of a mounted bucket
through h5pyd, and after ``metadata_ttl`` every read that starts later sees the
new bytes: chunk files, ``.npy`` (also through the kernel's page cache, which
the mount drops for files whose chunks were read again), sizes of
variable-length chunk files, sidecars, listings and the domain's ``D.h5``.
Before the writes, a later period with storage unchanged keeps the page
cache and the decoded chunks of a dataset (checked, not read again). On a
local bucket and on S3 (HSDS storing on moto).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import h5py
import h5pyd
import numpy as np
import pytest

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

DOMAIN = "/home/admin/live.h5"
TTL = 2.0
#: Longer than ``TTL`` plus the kernel's attribute timeout (also ``TTL``).
SETTLE = 2 * TTL + 1.0
BUCKET = "live-consistency"
#: Elements of /big: 1 MiB of int32 in four chunks.
BIG = 1 << 18


def _open(server: HsdsServer, mode: str) -> Any:
    return h5pyd.File(DOMAIN, mode, endpoint=server.endpoint, username="admin",
                      password="admin")


def _write_first(server: HsdsServer) -> None:
    server.ensure_folder("/home/")
    server.ensure_folder("/home/admin/", owner="admin")
    with _open(server, "w") as f:
        f.create_dataset("d", data=np.arange(100, dtype="<i4"), chunks=(10,))
        # Big enough (1 MiB) to be checked against storage at the end of a period.
        f.create_dataset("big", data=np.arange(BIG, dtype="<i4"), chunks=(BIG // 4,))
        strings = f.create_dataset("s", shape=(20,), chunks=(10,),
                                   dtype=h5pyd.special_dtype(vlen=str))
        strings[...] = [f"v{i}" for i in range(20)]
    server.flush(DOMAIN)


def _rewrite(server: HsdsServer) -> None:
    """New values in chunk 5 of /d, chunk 0 of /big and chunk 0 of /s (longer strings), a new
    attribute and a new dataset: what a writer does to a live domain. (h5pyd
    1.0 re-sends every attribute of an object it wrote to, and HSDS answers
    409 for one that exists, so /d gets its first attribute here.)"""
    with _open(server, "r+") as f:
        f["d"][50:60] = np.arange(1000, 1010, dtype="<i4")
        f["big"][0:10] = -1
        f["s"][0:10] = [f"a much longer value {i}" for i in range(10)]
        f["d"].attrs["version"] = 2
        f.create_dataset("added", data=np.arange(3, dtype="<i4"))
    server.flush(DOMAIN)


def _stats(mp: Path) -> dict[str, Any]:
    """The mount's figures now (a rendering is reused for ``REUSE`` seconds)."""
    time.sleep(REUSE + 0.1)
    doc: dict[str, Any] = json.loads((mp / ".h5mount/stats.json").read_text())
    return doc


def _check_follows_storage(server: HsdsServer, mp: Path) -> None:
    root = mp / DOMAIN.strip("/")
    # Read everything once, so each layer (decoded chunks, page cache,
    # metadata, listings) holds the old state.
    assert np.frombuffer((root / "d/5").read_bytes(), "<i4").tolist() == list(range(50, 60))
    assert np.load(root / "d.npy")[50:60].tolist() == list(range(50, 60))
    assert json.loads((root / "d.json").read_text())["attributes"] == {}
    old_size = os.stat(root / "s/0").st_size
    assert old_size == len((root / "s/0").read_bytes())
    assert "added" not in os.listdir(root)
    view = root.parent / f"{root.name}.h5"
    with h5py.File(view, "r") as f:  # the file view, built and kept now
        assert f["d"][50:60].tolist() == list(range(50, 60))
        assert "added" not in f and "version" not in f["d"].attrs
    view_size = os.stat(view).st_size
    big = np.load(root / "big.npy")
    assert big.tolist() == list(range(BIG))
    big_chunk = (root / "big/1").read_bytes()

    # A later period with nothing written: storage shows /big unchanged, so the
    # kernel keeps the pages of its chunk files and .npy (no read reaches the
    # daemon) and the decoded chunks stay cached.
    time.sleep(SETTLE)
    before = _stats(mp)
    np.testing.assert_array_equal(np.load(root / "big.npy"), big)
    assert (root / "big/1").read_bytes() == big_chunk
    assert os.stat(view).st_size == view_size
    after = _stats(mp)
    # The file view kept is the file: its objects, read again, are unchanged.
    assert after["caches"]["h5view"]["rearmed"] > before["caches"]["h5view"]["rearmed"]
    assert after["caches"]["h5view"]["plans"] == before["caches"]["h5view"]["plans"]
    # No chunk is decoded again, and both opens let the kernel keep the pages
    # (whether the kernel then still holds every page is up to its memory
    # management: this VM pages idle page cache out on its own).
    assert after["caches"]["chunks"]["misses"] == before["caches"]["chunks"]["misses"]
    assert after["caches"]["pages"]["hits"] - before["caches"]["pages"]["hits"] == 2
    assert after["caches"]["chunks"]["revalidated"] > before["caches"]["chunks"]["revalidated"]

    _rewrite(server)
    time.sleep(SETTLE)

    assert np.frombuffer((root / "d/5").read_bytes(), "<i4").tolist() == list(range(1000, 1010))
    changed = np.load(root / "big.npy")  # /big changed: decoded again, not kept
    assert changed[:10].tolist() == [-1] * 10 and changed[10:].tolist() == list(range(10, BIG))
    # Both datasets start a new data epoch, so their chunks are decoded again:
    # chunk 5 of /d and every chunk of /big. (Not "no period kept": a read
    # that spans the end of a 2 s period on a loaded machine rightly keeps
    # the epoch it began in the next one.)
    missed = _stats(mp)["caches"]["chunks"]["misses"] - after["caches"]["chunks"]["misses"]
    assert missed >= 1 + 4, missed
    with open(root / "d.npy", "rb") as npy:  # through the page cache, as numpy reads it
        values = np.load(npy)
    assert values[50:60].tolist() == list(range(1000, 1010))
    assert values[:50].tolist() == list(range(50))
    assert json.loads((root / "d.json").read_text())["attributes"]["version"] == 2
    new = (root / "s/0").read_bytes()
    assert len(new) > old_size and os.stat(root / "s/0").st_size == len(new)
    assert b"a much longer value 9" in new
    assert "added" in os.listdir(root)
    assert np.load(root / "added.npy").tolist() == [0, 1, 2]
    with _open(server, "r") as f:
        np.testing.assert_array_equal(np.load(root / "d.npy"), f["d"][...])
    with h5py.File(view, "r") as f:  # planned and built again from the new metadata
        assert _stats(mp)["caches"]["h5view"]["plans"] > after["caches"]["h5view"]["plans"]
        assert f["d"][50:60].tolist() == list(range(1000, 1010))
        assert f["d"].attrs["version"] == 2 and f["added"][()].tolist() == [0, 1, 2]
        assert f["s"][0].decode() == "a much longer value 0"
    assert os.stat(view).st_size == len(view.read_bytes())


def test_local_bucket_follows_a_live_hsds(tmp_path: Path) -> None:
    server = HsdsServer(tmp_path / "root", BUCKET, log_dir=tmp_path / "logs")
    with server:
        _write_first(server)
        with mounted(server.bucket_dir, tmp_path / "mnt", "-o", f"metadata_ttl={TTL}") as mp:
            _check_follows_storage(server, mp)


@pytest.mark.server
def test_s3_bucket_follows_a_live_hsds(moto: MotoServer, tmp_path: Path) -> None:
    moto.create_bucket(BUCKET)
    storage = S3Storage.from_env(moto.endpoint, moto.env())
    server = HsdsServer(None, BUCKET, s3=storage, log_dir=tmp_path / "logs")
    with server:
        _write_first(server)
        with mounted(f"s3://{BUCKET}", tmp_path / "mnt", "-o", f"metadata_ttl={TTL}",
                     "--endpoint-url", moto.endpoint, env=moto.env()) as mp:
            _check_follows_storage(server, mp)


def test_variable_length_chunk_sizes_are_exact_for_copying_tools(mnt: Path,
                                                                 tmp_path: Path) -> None:
    """rsync, tar and shutil trust st_size: every kind of file the mount serves
    (variable-length chunk files included) copies to exactly what cat reads."""
    source = mnt / "home/admin/types.h5"
    copied = tmp_path / "rsync"
    subprocess.run(["rsync", "-a", f"{source}/", f"{copied}/"], check=True, timeout=300)
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        tar.add(source, arcname="t")
    with tarfile.open(tmp_path / "t.tar") as tar:
        tar.extractall(tmp_path / "tar", filter="tar")
    checked = vlen = 0
    for here, _, files in os.walk(source):
        for name in files:
            path = Path(here) / name
            if path.is_symlink():
                continue
            rel = path.relative_to(source)
            expected = subprocess.run(["cat", str(path)], check=True,
                                      capture_output=True).stdout
            assert os.stat(path).st_size == len(expected), rel
            assert (copied / rel).read_bytes() == expected, rel
            assert (tmp_path / "tar/t" / rel).read_bytes() == expected, rel
            shutil.copyfile(path, tmp_path / "one")
            assert (tmp_path / "one").read_bytes() == expected, rel
            checked += 1
            if (path.parent / ".zarray").exists() and name[0].isdigit() and \
                    json.loads((path.parent / ".zarray").read_text()).get("filters"):
                vlen += 1
    assert checked > 50 and vlen > 0, (checked, vlen)
