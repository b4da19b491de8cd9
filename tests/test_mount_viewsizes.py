"""A table's ``P.csv`` keeps an exact size when its chunks are rewritten in storage.

The view's size is counted once and kept; its description (the dataset's
JSON) does not change when only its chunks are rewritten, so the size must
be kept with the data it was counted from, not only with the objects. Real
FUSE mount of a local bucket written key by key (``tests.rawdomain``), with
enough objects in the domain that the mount proves them unchanged from one
listing (the same instances are served on, as on a real HSDS bucket), and
``metadata_ttl`` of 1 s. Each case compares ``st_size`` with the bytes a
read returns and with pandas' own CSV of the stored rows.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.faultproxy import FaultProxy
from tests.moto_server import MotoServer
from tests.mounting import daemon_pids, fuse_available, mounted
from tests.rawdomain import write_one_dataset
from tests.test_control import stats

pytestmark = [pytest.mark.mount,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

ROOT = "g-3a3b4c5d-6e7f8091-b2b3-c4d5e6-f70819"
DSET = "d-3a3b4c5d-6e7f8091-0000-000000-000001"
ROW = np.dtype([("a", "<i4"), ("b", "<f8")])
TYPE = {"class": "H5T_COMPOUND", "fields": [
    {"name": "a", "type": {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"}},
    {"name": "b", "type": {"class": "H5T_FLOAT", "base": "H5T_IEEE_F64LE"}}]}
#: Objects besides the table, so the domain is listed and proven unchanged whole.
OTHERS = 40
TTL = 1.0
CSV = "home/admin/t.h5/tab.csv"


def rows(first: int, count: int, scale: float) -> np.ndarray:
    out = np.zeros(count, ROW)
    out["a"] = np.arange(first, first + count) * scale
    out["b"] = out["a"] / 3
    return out


def write_bucket(bucket: Path, shape: int, chunk: int) -> Path:
    """The domain, its table of ``shape`` rows in chunks of ``chunk`` and
    ``OTHERS`` small datasets; the table's chunk directory is returned."""
    table = write_one_dataset(bucket, "home/admin/t.h5", ROOT, DSET, "tab", TYPE, (shape,),
                              (chunk,))
    for i in range(-(-shape // chunk)):
        (table / str(i)).write_bytes(rows(i * chunk, chunk, 1).tobytes())
    db = table.parent.parent
    group = json.loads((db / ".group.json").read_text())
    for k in range(OTHERS):
        other = f"d-3a3b4c5d-6e7f8091-0000-000000-{k + 100:06d}"
        where = db / "d" / other[20:]
        where.mkdir(parents=True)
        (where / ".dataset.json").write_text(json.dumps(
            {"id": other, "root": ROOT, "created": 1.0, "lastModified": 2.0,
             "type": {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"},
             "shape": {"class": "H5S_SIMPLE", "dims": [4], "maxdims": [4]}, "attributes": {},
             "creationProperties": {"layout": {"class": "H5D_CHUNKED", "dims": [4]}}}))
        group["links"][f"x{k}"] = {"class": "H5L_TYPE_HARD", "created": 1.0, "id": other}
    (db / ".group.json").write_text(json.dumps(group))
    return table


def pandas_csv(table: Path, shape: int, chunk: int) -> bytes:
    data = np.concatenate([np.frombuffer((table / str(i)).read_bytes(), ROW)
                           for i in range(-(-shape // chunk))])[:shape]
    out = io.StringIO()
    pd.DataFrame(data).to_csv(out, index=False, lineterminator="\n")
    return out.getvalue().encode()


def shown(mp: Path) -> tuple[int, bytes]:
    """``st_size`` of the CSV, then its bytes (the stat comes first, as for ``cp``)."""
    size = (mp / CSV).stat().st_size
    return size, (mp / CSV).read_bytes()


def list_domain(mp: Path) -> None:
    """List the domain's root group: its objects are read from one listing of
    the domain, and a later listing that shows them unchanged serves the same
    instances on."""
    assert len(list((mp / "home/admin/t.h5").iterdir())) > OTHERS


def after_ttl(mp: Path) -> None:
    """Wait out ``metadata_ttl``, then list the domain again."""
    time.sleep(TTL + 1.2)
    list_domain(mp)


@pytest.mark.parametrize("shape,chunk", [(1000, 500), (90_000, 30_000)],
                         ids=["small", "versioned"])
def test_a_rewritten_chunk_changes_the_size_with_the_bytes(tmp_path: Path, shape: int,
                                                           chunk: int) -> None:
    """Rewritten with longer values, a chunk makes the CSV longer: once
    ``metadata_ttl`` has run out, size and bytes both show the new rows (the
    small table is counted again every period; the versioned one, of more
    than 1 MiB, when its chunk listing shows the change)."""
    table = write_bucket(tmp_path / "bucket", shape, chunk)
    with mounted(tmp_path / "bucket", tmp_path / "mnt", "-o", f"metadata_ttl={TTL}") as mp:
        list_domain(mp)
        size, data = shown(mp)
        assert (size, data) == (len(data), pandas_csv(table, shape, chunk))
        # A new mtime and size for the chunk, as a rewrite gives.
        (table / "0").write_bytes(rows(0, chunk, 10_007).tobytes())
        after_ttl(mp)
        size, data = shown(mp)
        assert data == pandas_csv(table, shape, chunk)
        assert size == len(data)


def test_an_unchanged_table_keeps_its_size_across_periods(tmp_path: Path) -> None:
    """A table of more than 1 MiB whose chunks stay the same is not counted
    again when ``metadata_ttl`` runs out: its size is kept with its data
    epoch, learnt from one listing of its chunks (no chunk is decoded)."""
    shape, chunk = 90_000, 30_000
    table = write_bucket(tmp_path / "bucket", shape, chunk)
    # The chunk cache holds one chunk, so a second count would decode again.
    with mounted(tmp_path / "bucket", tmp_path / "mnt", "-o",
                 f"metadata_ttl={TTL},chunk_cache=1M") as mp:
        list_domain(mp)
        size = (mp / CSV).stat().st_size
        assert size == len(pandas_csv(table, shape, chunk))
        decoded = stats(mp)["caches"]["chunks"]["misses"]
        assert decoded >= -(-shape // chunk)
        after_ttl(mp)
        assert (mp / CSV).stat().st_size == size
        chunks = stats(mp)["caches"]["chunks"]
        assert chunks["misses"] == decoded
        assert chunks["versions"] >= 2


def test_new_instances_of_an_unchanged_table_keep_its_size(tmp_path: Path) -> None:
    """After a ``SIGHUP`` every object is read again: the table is a new
    instance. Its CSV's size is taken from the record of its version, not
    counted again (sizes kept with the instance alone were counted again
    whenever storage was not listed in time to prove the old one current;
    on a 10 GB table, a count longer than ``metadata_ttl``, at every ``stat``)."""
    shape, chunk = 90_000, 30_000
    table = write_bucket(tmp_path / "bucket", shape, chunk)
    with mounted(tmp_path / "bucket", tmp_path / "mnt", "-o", "chunk_cache=1M") as mp:
        size = (mp / CSV).stat().st_size
        assert size == len(pandas_csv(table, shape, chunk))
        decoded = stats(mp)["caches"]["chunks"]["misses"]
        before = stats(mp)["caches"]["chunks"]["versions"]
        (pid,) = daemon_pids(mp)
        os.kill(pid, signal.SIGHUP)
        # Until the daemon has dropped what it held and the kernel its attributes
        # (after the SIGHUP's log line), a stat may be answered from before.
        deadline = time.monotonic() + 10
        while True:
            assert (mp / CSV).stat().st_size == size
            chunks = stats(mp)["caches"]["chunks"]
            if chunks["versions"] > before:  # the table's version learnt again
                break
            assert time.monotonic() < deadline, "no stat reached the daemon after SIGHUP"
            time.sleep(0.05)
        assert chunks["misses"] == decoded


@pytest.mark.server
def test_a_count_longer_than_metadata_ttl_is_kept(moto: MotoServer, tmp_path: Path) -> None:
    """On slow storage (S3 on loopback, every request for the table's keys held
    back 1 s by a proxy) the CSV's count outlasts ``metadata_ttl``. It is
    kept all the same, under the table's version: the next ``stat`` decodes
    no chunk (it was thrown away and made again at every ``stat``: a 10 GB
    table over a 60 s ``metadata_ttl`` never got a size it kept)."""
    shape, chunk = 90_000, 30_000
    table = write_bucket(tmp_path / "bucket", shape, chunk)
    moto.create_bucket("viewsizes-slow")
    moto.upload_dir(tmp_path / "bucket", "viewsizes-slow")
    with FaultProxy(moto.endpoint) as proxy:
        proxy.latency(1.0, method="GET", path=f"/d/{DSET[20:]}/")
        with mounted("s3://viewsizes-slow", tmp_path / "mnt", "--endpoint-url", proxy.endpoint,
                     "-o", f"metadata_ttl={TTL},chunk_cache=1M", env=moto.env()) as mp:
            started = time.monotonic()
            size = (mp / CSV).stat().st_size
            assert time.monotonic() - started > 2 * TTL
            assert size == len(pandas_csv(table, shape, chunk))
            decoded = stats(mp)["caches"]["chunks"]["misses"]
            assert (mp / CSV).stat().st_size == size
            assert stats(mp)["caches"]["chunks"]["misses"] == decoded


def test_a_remount_with_cache_dir_takes_the_size_kept_on_disk(tmp_path: Path) -> None:
    """With ``cache_dir``, a remount learns the table's version (one listing of
    its chunks) and reads its CSV's size back from disk, decoding no chunk; a
    chunk rewritten since makes another version, and the size is counted again."""
    shape, chunk = 90_000, 30_000
    table = write_bucket(tmp_path / "bucket", shape, chunk)
    options = ("-o", f"cache_dir={tmp_path / 'cache'}")
    expected = pandas_csv(table, shape, chunk)
    with mounted(tmp_path / "bucket", tmp_path / "mnt", *options) as mp:
        assert (mp / CSV).stat().st_size == len(expected)
        assert stats(mp)["caches"]["chunks"]["misses"] >= -(-shape // chunk)
    with mounted(tmp_path / "bucket", tmp_path / "mnt", *options) as mp:
        assert (mp / CSV).stat().st_size == len(expected)
        assert stats(mp)["caches"]["chunks"]["misses"] == 0
        assert (mp / CSV).read_bytes() == expected
    (table / "1").write_bytes(rows(chunk, chunk, 10_007).tobytes())
    changed = pandas_csv(table, shape, chunk)
    assert len(changed) != len(expected)
    with mounted(tmp_path / "bucket", tmp_path / "mnt", *options) as mp:
        size, data = shown(mp)
        assert data == changed and size == len(data)


def test_a_remount_with_cache_dir_counts_only_the_blocks_whose_chunks_changed(
        tmp_path: Path) -> None:
    """With ``cache_dir``, the counts of the CSV's blocks are kept with the
    validators of the chunks they came from: after one chunk is rewritten, a
    remount's ``stat`` decodes that chunk alone; after rows are appended (a
    larger shape, a new chunk), the new chunk alone. Size and bytes agree
    with pandas' CSV of the stored rows each time."""
    shape, chunk = 90_000, 30_000
    table = write_bucket(tmp_path / "bucket", shape, chunk)
    options = ("-o", f"cache_dir={tmp_path / 'cache'}")

    def stat_then_read(shape: int) -> int:
        """The chunks decoded by the ``stat``, after checking size and bytes."""
        with mounted(tmp_path / "bucket", tmp_path / "mnt", *options) as mp:
            size = (mp / CSV).stat().st_size
            decoded = stats(mp)["caches"]["chunks"]["misses"]
            data = (mp / CSV).read_bytes()
        assert data == pandas_csv(table, shape, chunk)
        assert size == len(data)
        return int(decoded)

    assert stat_then_read(shape) == 3
    (table / "1").write_bytes(rows(chunk, chunk, 10_007).tobytes())
    assert stat_then_read(shape) == 1
    description = table / ".dataset.json"
    described = json.loads(description.read_text())
    grown = shape + chunk // 2
    described["shape"] = {"class": "H5S_SIMPLE", "dims": [grown], "maxdims": [grown]}
    description.write_text(json.dumps(described))
    (table / "3").write_bytes(rows(3 * chunk, chunk, 1).tobytes())
    assert stat_then_read(grown) == 1
