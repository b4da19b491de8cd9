"""Damaged objects in a copy of a real bucket: EIO for them alone, siblings still read."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mounting import daemon_pids, fuse_available, mounted

pytestmark = [pytest.mark.mount, pytest.mark.hsds, pytest.mark.skipif(fuse_available() is not None,
                                                 reason=f"no FUSE: {fuse_available()}")]


def obj_dir(bucket: Path, obj_id: str) -> Path:
    """Where HSDS keeps an object's keys (schema v2 ids)."""
    kind, rest = obj_id[0], obj_id[2:]
    parts = rest.split("-")
    uuid1, uuid2 = "-".join(parts[:2]), "-".join(parts[2:])
    return bucket / "db" / uuid1 / kind / uuid2


def damaged_copy(src: Path, dst: Path, mnt_ids: dict[str, str]) -> dict[str, Path]:
    shutil.copytree(src, dst)
    damage: dict[str, Path] = {}
    # corrupt dataset JSON
    key = obj_dir(dst, mnt_ids["gzip"]) / ".dataset.json"
    key.write_text('{"id": "oops", "shape": ')
    damage["dataset_json"] = key
    # truncated chunk
    chunk = obj_dir(dst, mnt_ids["gzip_shuffle"]) / "0_0"
    chunk.write_bytes(chunk.read_bytes()[:7])
    damage["chunk"] = chunk
    # an unknown filter
    key = obj_dir(dst, mnt_ids["gzip_int64"]) / ".dataset.json"
    doc = json.loads(key.read_text())
    doc["creationProperties"]["filters"] = [{"class": "H5Z_FILTER_USER", "id": 31999,
                                             "name": "mystery"}]
    key.write_text(json.dumps(doc))
    damage["filter"] = key
    # zero-length group JSON
    key = obj_dir(dst, mnt_ids["grp"]) / ".group.json"
    key.write_bytes(b"")
    damage["group_json"] = key
    # dims that would overflow
    key = obj_dir(dst, mnt_ids["dset"]) / ".dataset.json"
    doc = json.loads(key.read_text())
    doc["shape"]["dims"] = [2**62, 2**62]
    doc["shape"]["maxdims"] = [2**62, 2**62]
    key.write_text(json.dumps(doc))
    damage["dims"] = key
    # corrupt domain JSON
    key = dst / "home/admin/layout.h5/.domain.json"
    key.write_bytes(b"\x00garbage")
    damage["domain_json"] = key
    return damage


@pytest.fixture(scope="module")
def damaged(hsds_bucket, tmp_path_factory) -> Iterator[tuple[Path, dict[str, Path], Path]]:
    base = tmp_path_factory.mktemp("damaged")
    mp = base / "mp"
    # read the ids through a clean mount first
    with mounted(hsds_bucket.bucket_dir, mp):
        ids = {
            "gzip": json.loads((mp / "home/admin/filters.h5/gzip.json").read_text())["id"],
            "gzip_shuffle":
                json.loads((mp / "home/admin/filters.h5/gzip_shuffle.json").read_text())["id"],
            "gzip_int64":
                json.loads((mp / "home/admin/filters.h5/gzip_int64.json").read_text())["id"],
            "grp": json.loads((mp / "home/admin/attrs.h5/grp.json").read_text())["id"],
            "dset": json.loads((mp / "home/admin/attrs.h5/dset.json").read_text())["id"],
        }
    bucket = base / "bucket"
    damage = damaged_copy(hsds_bucket.bucket_dir, bucket, ids)
    log = base / "h5mount.log"
    with mounted(bucket, mp, "--log-file", str(log)):
        yield mp, damage, log


def eio(fn) -> None:
    with pytest.raises(OSError) as info:
        fn()
    assert info.value.errno == errno.EIO


def test_damaged_objects_give_eio_and_siblings_read(damaged) -> None:
    mp, damage, log = damaged
    filters = mp / "home/admin/filters.h5"
    names = os.listdir(filters)
    assert "gzip" in names and "gzip.json" in names  # still listed
    eio((filters / "gzip.json").read_bytes)
    eio(lambda: os.listdir(filters / "gzip"))
    eio((filters / "gzip_shuffle/0.0").read_bytes)
    assert (filters / "gzip_shuffle/1.1").read_bytes()  # sibling chunk
    eio(lambda: os.listdir(filters / "gzip_int64") and (filters / "gzip_int64/0.0").read_bytes())
    assert json.loads((filters / "fletcher32.json").read_text())["kind"] == "dataset"
    attrs = mp / "home/admin/attrs.h5"
    eio(lambda: os.listdir(attrs / "grp"))
    eio((attrs / "dset.json").read_bytes)
    assert json.loads((attrs / "named_type.json").read_text())["kind"] == "datatype"
    eio(lambda: os.listdir(mp / "home/admin/layout.h5"))
    assert os.listdir(mp / "home/admin/types.h5")
    assert daemon_pids(mp), "the daemon must keep running"
    text = log.read_text()
    for path in damage.values():
        key = str(path.relative_to(mp.parent / "bucket"))
        assert text.count(key) == 1, (key, text)
