"""The walk benchmark's pure parts: memtree snapshots, and proving an HSDS summary current.

``bench.memtree`` must serve the tree it was given (a snapshot round trip,
then lookups, symlinks and xattrs answered from memory); ``bench.walkdata``
must call a summary current only when it holds every object and was
started after every other key was last written.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pyfuse3
import pytest
import trio
from h5json import objid

from bench import memtree, scaledata, walkdata


def _tree(tmp_path: Path) -> Path:
    top = tmp_path / "dom.h5"
    (top / "d000000").mkdir(parents=True)
    (top / "d000000" / "0").write_bytes(b"c" * 16)
    (top / "d000000.json").write_text("{}")
    os.symlink("d000000", top / "latest")
    return top


def test_snapshot_round_trip_keeps_the_tree(tmp_path: Path) -> None:
    top = _tree(tmp_path)
    taken = memtree.take(top)
    memtree.save(taken, tmp_path / "snap.json")
    loaded = memtree.load(tmp_path / "snap.json")

    def rows(snapshot: memtree.Snapshot) -> list[tuple[object, ...]]:
        return [(e.parent, e.name, e.mode, e.size, e.mtime_ns, e.target, e.children)
                for e in snapshot.entries]

    assert rows(loaded) == rows(taken)
    assert loaded.counts() == {"dirs": 2, "files": 2, "symlinks": 1}
    top_entry = loaded.entries[0]
    assert top_entry.name == b"dom.h5"
    assert [loaded.entries[c].name for c in top_entry.children] == [
        os.fsencode(e.name) for e in os.scandir(top)]


def test_memtree_answers_from_the_snapshot(tmp_path: Path) -> None:
    ops = memtree.MemTree(memtree.take(_tree(tmp_path)))

    async def ask() -> None:
        top = await ops.lookup(pyfuse3.ROOT_INODE, b"dom.h5", None)
        sidecar = await ops.lookup(top.st_ino, b"d000000.json", None)
        assert sidecar.st_size == 2 and sidecar.entry_timeout == memtree.TIMEOUT
        link = await ops.lookup(top.st_ino, b"latest", None)
        assert await ops.readlink(link.st_ino, None) == b"d000000"
        for name, code in ((b"security.selinux", errno.ENOTSUP),
                           (b"user.h5.attr.x", pyfuse3.ENOATTR)):
            with pytest.raises(pyfuse3.FUSEError) as raised:
                await ops.getxattr(top.st_ino, name, None)
            assert raised.value.errno == code
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await ops.lookup(top.st_ino, b"missing", None)
        assert raised.value.errno == errno.ENOENT

    trio.run(ask)


def _scanned(tmp_path: Path, scan_start: float) -> tuple[walkdata.LocalBucket, str, str]:
    """A 3-link domain with an .info.json and a .summary.json as HSDS writes them."""
    writer = scaledata.BucketWriter(tmp_path / "bucket")
    root = walkdata.write_domain(writer, "/home/admin/w.h5", 3)
    bucket = walkdata.LocalBucket(tmp_path / "bucket")
    links = json.loads(bucket.get(f"{walkdata.root_prefix(root)}.group.json") or b"")["links"]
    prefix = walkdata.root_prefix(root)
    writer.put_json(prefix + ".info.json", {"scan_start": scan_start,
                                            "scan_complete": scan_start + 1, "datasets": {}})
    writer.put_json(prefix + ".summary.json",
                    {obj: {} for obj in [root, *(link["id"] for link in links.values())]})
    return bucket, root, links["d000001"]["id"]


def test_summary_is_current_only_after_every_write(tmp_path: Path) -> None:
    """Current: every key was written ``MARGIN`` seconds (and the storage's time
    resolution) before the scan began, so h5mount trusts the whole summary."""
    bucket, _root, dataset = _scanned(tmp_path, time.time() + walkdata.MARGIN + 2)
    facts = walkdata.check_scan(bucket, "/home/admin/w.h5")
    assert facts.objects == 4 and facts.chunks == 0
    path = bucket.bucket_dir / objid.getS3Key(dataset)
    later = time.time() + 10
    os.utime(path, (later, later))
    with pytest.raises(walkdata.WalkDataError, match="on its own"):
        walkdata.check_scan(bucket, "/home/admin/w.h5")


def test_summary_missing_an_object_is_not_current(tmp_path: Path) -> None:
    bucket, root, _ = _scanned(tmp_path, time.time() + walkdata.MARGIN + 2)
    summary = bucket.bucket_dir / walkdata.root_prefix(root) / ".summary.json"
    summary.write_text(json.dumps({root: {}}))
    with pytest.raises(walkdata.WalkDataError, match="holds 1 objects"):
        walkdata.check_scan(bucket, "/home/admin/w.h5")
