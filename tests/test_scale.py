"""Wide groups on a real mount: what the kernel asks for, and the bench data's fidelity.

The bucket is written by ``bench.scaledata`` (HSDS schema v2 straight from
``h5json`` ids; ``hsload`` cannot write a group of 100,000 links). The first
tests mount it and count, through the daemon's own counters (``-o
stats_file``, written on SIGUSR1), the FUSE requests that ``ls -l`` and ``ls
-lR`` of a 1,000-link group cost. The last checks a small bucket made by the
same code against h5pyd through a real HSDS, so the benchmark's buckets are
ones HSDS itself reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import h5py
import h5pyd
import numpy as np
import pytest

from bench import scaledata
from mountd.tree.h5view import ROOM_EVERY
from tests.hsds_server import HsdsServer, hsds_node_available
from tests.mounting import daemon_pids, fuse_available, mounted

LINKS = 1000
DOMAIN = "/home/admin/wide1k.h5"
#: FUSE requests ``ls -l`` of the group may cost per entry it lists. A readdir
#: page carries dozens of entries with their attributes, so anything near one
#: request per entry means a per-entry round trip crept back in.
MAX_REQUESTS_PER_ENTRY = 0.1

needs_fuse = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))


@pytest.fixture(scope="module")
def wide_bucket(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bucket = tmp_path_factory.mktemp("scale") / "bucket"
    scaledata.write_wide(scaledata.BucketWriter(bucket), DOMAIN, LINKS)
    return bucket


def requests_after(mountpoint: Path, stats_file: Path, command: list[str]) -> dict[str, int]:
    """The daemon's request counts caused by ``command`` alone."""

    def snapshot() -> dict[str, int]:
        before = stats_file.stat().st_mtime_ns if stats_file.exists() else 0
        (pid,) = daemon_pids(mountpoint)
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not stats_file.exists() or stats_file.stat().st_mtime_ns == before:
            assert time.monotonic() < deadline, "the daemon wrote no statistics"
            time.sleep(0.02)
        counts: dict[str, int] = json.loads(stats_file.read_text())["requests"]
        return counts

    first = snapshot()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    time.sleep(0.01)  # distinct mtime for the next snapshot
    second = snapshot()
    return {op: n - first.get(op, 0) for op, n in second.items() if n != first.get(op, 0)}


@needs_fuse
@pytest.mark.mount
def test_ls_l_of_a_wide_group_costs_a_few_requests(wide_bucket: Path, tmp_path: Path) -> None:
    stats_file = tmp_path / "stats.json"
    with mounted(wide_bucket, tmp_path / "mnt", "-o", f"stats_file={stats_file}") as mp:
        group = mp / DOMAIN.strip("/")
        entries = 3 * LINKS  # P/, P.json, P.npy per link
        for state in ("cold", "warm"):
            counts = requests_after(mp, stats_file, ["ls", "-l", str(group)])
            assert sum(counts.values()) <= MAX_REQUESTS_PER_ENTRY * entries, (state, counts)
            # ls asks for security.selinux and the POSIX ACLs of every entry
            # until the mount says ENOTSUP; after that, never again.
            assert counts.get("getxattr", 0) <= 3, (state, counts)

        listing = subprocess.run(["ls", "-l", str(group)], check=True, capture_output=True,
                                 text=True).stdout.splitlines()
        assert len(listing) == 1 + entries  # "total", then the entries
        # The sizes ls shows (from readdirplus alone) are the files' real lengths.
        sizes = {line.split()[-1]: int(line.split()[4]) for line in listing[1:]}
        name = scaledata.link_name(LINKS - 1)
        assert sizes[f"{name}.json"] == len((group / f"{name}.json").read_bytes())
        assert sizes[f"{name}.npy"] == len((group / f"{name}.npy").read_bytes())
        assert np.load(group / f"{name}.npy").tolist() == [0, 0, 0, 0]

        counts = requests_after(mp, stats_file, ["ls", "-lR", str(group)])
        # Each dataset directory is opened, read to its end and released
        # (its zarr files); anything per entry beyond that is a regression.
        assert counts["opendir"] <= LINKS + 1, counts
        assert sum(counts.values()) <= 4 * LINKS + 50, counts


@needs_fuse
@pytest.mark.mount
def test_security_and_acl_namespaces_are_unsupported(wide_bucket: Path, tmp_path: Path) -> None:
    with mounted(wide_bucket, tmp_path / "mnt") as mp:
        dataset = mp / DOMAIN.strip("/") / scaledata.link_name(7)
        for name in ("security.selinux", "system.posix_acl_access", "trusted.x"):
            with pytest.raises(OSError) as err:
                os.getxattr(dataset, name)
            assert err.value.errno == 95, name  # EOPNOTSUPP
        with pytest.raises(OSError) as err:
            os.getxattr(dataset, "user.h5.attr.nothing")
        assert err.value.errno == 61  # ENODATA: the namespace exists, the name does not
        assert os.getxattr(dataset, "user.h5.attr.index") == b"7"
        assert os.getxattr(dataset, "user.h5.kind") == b"dataset"


@needs_fuse
@pytest.mark.mount
def test_memory_not_a_count_bounds_the_objects_a_view_holds(wide_bucket: Path,
                                                            tmp_path: Path) -> None:
    """With room under ``-o memory_limit`` the domain's ``D.h5`` holds every
    object. With none, it holds those planned before the planner first asks
    for room, each as in the whole file, and names the limit; its size is
    still the bytes it reads."""
    view = DOMAIN.strip("/") + ".h5"
    with mounted(wide_bucket, tmp_path / "whole") as mp, h5py.File(mp / view, "r") as f:
        whole = {name: f[name][()].tolist() for name in f}
        assert len(whole) == LINKS and "h5mount_left_out" not in f.attrs
    with mounted(wide_bucket, tmp_path / "tight", "-o", "memory_limit=1M") as mp:
        size = (mp / view).stat().st_size
        with h5py.File(mp / view, "r") as f:
            kept = {name: f[name][()].tolist() for name in f}
            lines = [str(line) for line in f.attrs["h5mount_left_out"]]
        assert len((mp / view).read_bytes()) == size
    assert len(kept) == ROOM_EVERY - 1  # and the root group
    assert all(whole[name] == value for name, value in kept.items())
    assert lines == [f"/: the file holds the first {ROOM_EVERY} objects found (breadth "
                     f"first); {LINKS - ROOM_EVERY + 1} links to further objects are left "
                     "out (building more would pass memory_limit=1M)"]


def _h5pyd_view(endpoint: str, domain: str) -> dict[str, Any]:
    """Links, values and attributes of ``domain`` as h5pyd reads them through HSDS."""
    view: dict[str, Any] = {}
    with h5pyd.File(domain, "r", endpoint=endpoint, username="admin",
                    password="admin") as f:
        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5pyd.Dataset):
                view[name] = (obj.shape, obj.dtype.str, obj.chunks, obj.maxshape,
                              obj[...].tolist(), dict(obj.attrs))
            else:
                view[name] = sorted(obj)
        view["/"] = sorted(f)
        f.visititems(visit)
    return view


@pytest.mark.hsds
@pytest.mark.skipif(not hsds_node_available(), reason="hsds-node not installed")
def test_scale_buckets_read_back_through_hsds(tmp_path: Path) -> None:
    root = tmp_path / "root"
    writer = scaledata.BucketWriter(root / "scale")
    scaledata.write_wide(writer, "/home/admin/wide.h5", 12)
    scaledata.write_many(writer, "/home/admin/many.h5", groups=3, per_group=4)
    with HsdsServer(root, "scale", log_dir=tmp_path / "logs") as server:
        wide = _h5pyd_view(server.endpoint, "/home/admin/wide.h5")
        many = _h5pyd_view(server.endpoint, "/home/admin/many.h5")
    assert wide["/"] == [scaledata.link_name(i) for i in range(12)]
    shape, dtype, chunks, maxshape, values, attrs = wide[scaledata.link_name(5)]
    assert (shape, dtype, chunks, maxshape, values) == ((4,), "<i4", (4,), (4,), [0, 0, 0, 0])
    assert attrs == {"index": 5}
    assert many["/"] == ["g000", "g001", "g002"]
    assert many["g002"] == [scaledata.link_name(i) for i in range(8, 12)]
    assert many[f"g001/{scaledata.link_name(6)}"][5] == {"index": 6}


@pytest.mark.hsds
@pytest.mark.skipif(not hsds_node_available(), reason="hsds-node not installed")
def test_tiny_chunk_dataset_reads_back_through_hsds(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scaledata, "TINY_CHUNKS", 50)
    root = tmp_path / "root"
    scaledata.write_tiny(scaledata.BucketWriter(root / "scale"), "/home/admin/tiny.h5",
                         million=False)
    with HsdsServer(root, "scale", log_dir=tmp_path / "logs") as server:
        view = _h5pyd_view(server.endpoint, "/home/admin/tiny.h5")
    shape, dtype, chunks, maxshape, values, _ = view["x"]
    assert (shape, dtype, chunks, maxshape) == ((50,), "<i4", (1,), (None,))
    assert values == [scaledata.tiny_value(i) for i in range(50)]
