"""Sanity checks of the S3 buckets that ``conftest`` builds on moto.

``s3_bucket`` and ``s3_prefixed_bucket`` must be exact key-for-key copies of
the POSIX ``hsds_bucket``; ``hsds_s3_direct`` must hold what a real HSDS wrote
onto S3: every domain's ``.domain.json``, its root group and every chunk with
data.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import S3_DIRECT_SOURCES, S3Bucket
from tests.hsds_server import missing_objects

pytestmark = [pytest.mark.hsds, pytest.mark.server]


def _local_keys(bucket_dir: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root, _dirs, files in os.walk(bucket_dir):
        for name in files:
            path = Path(root) / name
            found[path.relative_to(bucket_dir).as_posix()] = path
    return found


@pytest.mark.parametrize("fixture", ["s3_bucket", "s3_prefixed_bucket"])
def test_copy_is_key_for_key(fixture: str, request: pytest.FixtureRequest) -> None:
    copy: S3Bucket = request.getfixturevalue(fixture)
    assert copy.local_dir is not None
    local = _local_keys(copy.local_dir)
    assert any(key.endswith("/.domain.json") for key in local)
    entries = copy.keys().entries()
    assert set(entries) == {copy.key(key) for key in local}
    for key, path in local.items():
        data = path.read_bytes()
        # One listing instead of a GET per key: moto's ETag is the MD5 of what it stored.
        assert entries[copy.key(key)] == (len(data), hashlib.md5(data).hexdigest()), key


def test_copy_urls(s3_bucket: S3Bucket, s3_prefixed_bucket: S3Bucket) -> None:
    assert s3_bucket.url == f"s3://{s3_bucket.bucket}"
    assert s3_prefixed_bucket.url == f"s3://{s3_prefixed_bucket.bucket}/{s3_prefixed_bucket.prefix}"
    for bucket in (s3_bucket, s3_prefixed_bucket):
        assert bucket.endpoint.startswith("http://127.0.0.1:")
        assert bucket.env["AWS_ACCESS_KEY_ID"] not in ("", "xxx")
        assert bucket.mount_args() == ("--endpoint-url", bucket.endpoint)


def _json(bucket: S3Bucket, key: str) -> dict:
    data = bucket.keys().get(key)
    assert data is not None, f"{key} is not in {bucket.url}"
    return json.loads(data)


def _dataset_prefix(bucket: S3Bucket, domain: str, name: str) -> str:
    root = str(_json(bucket, f"{domain}/.domain.json")["root"])
    group = _json(bucket, f"db/{root[2:19]}/.group.json")
    dset_id = str(group["links"][name]["id"])
    return f"db/{dset_id[2:19]}/d/{dset_id[20:]}/"


def test_direct_bucket_domains(hsds_s3_direct: S3Bucket) -> None:
    assert hsds_s3_direct.local_dir is None
    assert set(hsds_s3_direct.files) == {f"home/admin/{name}" for name in S3_DIRECT_SOURCES}
    assert "root" not in _json(hsds_s3_direct, "home/.domain.json")
    assert "root" not in _json(hsds_s3_direct, "home/admin/.domain.json")
    for domain, source in hsds_s3_direct.domains():
        assert source.is_file()
        root = str(_json(hsds_s3_direct, f"{domain}/.domain.json")["root"])
        assert root.startswith("g-")
        prefix = f"db/{root[2:19]}/"
        assert _json(hsds_s3_direct, prefix + ".group.json")["id"] == root
        assert _json(hsds_s3_direct, prefix + ".info.json")["num_chunks"] >= 1
        assert hsds_s3_direct.keys().size(prefix + ".summary.json")


def test_direct_bucket_has_every_chunk(hsds_s3_direct: S3Bucket) -> None:
    keys = hsds_s3_direct.keys()
    for domain, source in hsds_s3_direct.domains():
        assert missing_objects(keys, domain, source) == []


def test_direct_bucket_sparse_chunks(hsds_s3_direct: S3Bucket) -> None:
    prefix = _dataset_prefix(hsds_s3_direct, "home/admin/layout.h5", "sparse")
    listing = hsds_s3_direct.keys().listing(prefix)
    chunks = sorted(key[len(prefix):] for key in listing if "/." not in key)
    # Only the two chunks h5files wrote; unwritten (all-fill) chunks are absent.
    assert chunks == ["0_0", "5_2"]


def test_direct_bucket_gzip_is_blosc(hsds_s3_direct: S3Bucket) -> None:
    prefix = _dataset_prefix(hsds_s3_direct, "home/admin/filters.h5", "gzip")
    head = hsds_s3_direct.keys().get(prefix + "0_0")
    assert head is not None
    # A Blosc frame (version 2), compressor code 3 (zlib) in the flags byte.
    assert head[0] == 2
    assert head[2] >> 5 == 3
