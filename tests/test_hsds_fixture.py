"""Sanity checks of the real-HSDS bucket that ``conftest.hsds_bucket`` builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import h5files
from tests.conftest import HsdsBucket

pytestmark = pytest.mark.hsds


def _root_id(bucket: HsdsBucket, domain: str) -> str:
    dom = json.loads((bucket.bucket_dir / domain / ".domain.json").read_text())
    assert "root" in dom, f"{domain} is a folder, not a file domain"
    return str(dom["root"])


def _root_group(bucket: HsdsBucket, domain: str) -> dict:
    root = _root_id(bucket, domain)
    assert root.startswith("g-")
    path = bucket.bucket_dir / "db" / root[2:19] / ".group.json"
    assert path.is_file()
    group = json.loads(path.read_text())
    assert group["id"] == root
    return group


def test_every_domain_has_root_group(hsds_bucket: HsdsBucket) -> None:
    assert (hsds_bucket.bucket_dir / "home" / ".domain.json").is_file()
    assert "root" not in json.loads(
        (hsds_bucket.bucket_dir / "home" / "admin" / ".domain.json").read_text()
    )
    assert set(hsds_bucket.files) == {load.domain for load in h5files.LOADS}
    for domain, source in hsds_bucket.files.items():
        assert domain.startswith("home/admin/")
        assert source.is_file()
        _root_group(hsds_bucket, domain)
        prefix = hsds_bucket.bucket_dir / "db" / _root_id(hsds_bucket, domain)[2:19]
        info = json.loads((prefix / ".info.json").read_text())
        assert info["num_chunks"] >= 1
        assert (prefix / ".summary.json").is_file()


def test_chunked_dataset_has_chunk_keys(hsds_bucket: HsdsBucket) -> None:
    domain = "home/admin/layout.h5"
    root = _root_group(hsds_bucket, domain)
    link = root["links"]["sparse"]
    assert link["class"] == "H5L_TYPE_HARD"
    dset_id = link["id"]
    dset_dir: Path = hsds_bucket.bucket_dir / "db" / dset_id[2:19] / "d" / dset_id[20:]
    meta = json.loads((dset_dir / ".dataset.json").read_text())
    assert meta["creationProperties"]["layout"] == {"class": "H5D_CHUNKED", "dims": [10, 10]}
    chunks = sorted(p.name for p in dset_dir.iterdir() if not p.name.startswith("."))
    # Only the two chunks h5files wrote; unwritten (all-fill) chunks are absent.
    assert chunks == ["0_0", "5_2"]


def test_filters_as_stored(hsds_bucket: HsdsBucket) -> None:
    root = _root_group(hsds_bucket, "home/admin/filters.h5")
    dset_id = root["links"]["gzip"]["id"]
    dset_dir = hsds_bucket.bucket_dir / "db" / dset_id[2:19] / "d" / dset_id[20:]
    meta = json.loads((dset_dir / ".dataset.json").read_text())
    assert [f["class"] for f in meta["creationProperties"]["filters"]] == ["H5Z_FILTER_DEFLATE"]
    head = (dset_dir / "0_0").read_bytes()[:4]
    # A Blosc frame (version 2), compressor code 3 (zlib) in the flags byte.
    assert head[0] == 2
    assert head[2] >> 5 == 3
