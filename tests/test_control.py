"""The control directory ``MOUNTPOINT/.h5mount/`` and ``h5mount stats``, on real mounts.

The figures are checked against what the test itself did and against the
bucket on disk: reading every chunk file of a dataset must count exactly
the bytes of its stored chunk objects, one chunk-cache miss per chunk and
one latency sample per FUSE read. ``metrics`` is parsed with
prometheus_client's own parser, and ``cp``, ``tar`` and ``find`` are run on
the directory. The measuring pieces (log-scale latencies, URL redaction)
are checked without a mount.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mountd.cache.chunkcache import ENTRY_OVERHEAD
from mountd.control import REUSE
from mountd.io.meter import STEPS, Latencies
from mountd.logsafe import MASK, add_secret, redact
from tests.mounting import H5MOUNT, REPO, fuse_available, mounted

SAMPLE = REPO / "examples" / "sample-bucket"
DATASET = "home/admin/sample.h5/measurements/temperature"
CONTROL_FILES = {"stats.json", "config.json", "metrics"}

needs_fuse = pytest.mark.skipif(fuse_available() is not None,
                                reason=f"no FUSE: {fuse_available()}")


# -- without a mount -------------------------------------------------------------------------

def test_latency_percentiles_bound_the_true_ones() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(-7, 2) for _ in range(5000)]
    hist = Latencies()
    for s in samples:
        hist.add(s)
    ordered = sorted(samples)
    for pct in (50, 90, 99, 100):
        true = ordered[math.ceil(len(ordered) * pct / 100) - 1]
        got = hist.percentile(pct)
        assert true <= got <= max(true * 2 ** (1 / STEPS), 1e-6) * 1.000001, (pct, true, got)
    figures = hist.figures()
    assert figures["count"] == 5000
    assert figures["max_ms"] == pytest.approx(1e3 * max(samples))
    assert figures["mean_ms"] == pytest.approx(1e3 * sum(samples) / 5000)
    assert Latencies().figures()["p99_ms"] == 0.0


@pytest.mark.parametrize(("text", "shown"), [
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("https://u:pa55w0rd@example.org/r.json", f"https://u:{MASK}@example.org/r.json"),
    ("https://example.org/r.json?X-Amz-Signature=abc&X-Amz-Credential=k&X-Amz-Date=1",
     f"https://example.org/r.json?X-Amz-Signature={MASK}&X-Amz-Credential={MASK}&X-Amz-Date=1"),
    ("/srv/bucket", "/srv/bucket"),
])
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_redact_masks_known_secrets() -> None:
    secret = "SeCrEt-" + os.urandom(6).hex()
    add_secret(secret)
    assert secret not in redact(f"http://127.0.0.1:9/{secret}/x")


# -- on a mount ------------------------------------------------------------------------------

def fresh(path: Path) -> bytes:
    """The content of a control file rendered after everything done so far."""
    time.sleep(REUSE + 0.1)
    return path.read_bytes()


def stats(mp: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(fresh(mp / ".h5mount" / "stats.json"))
    return doc


def stored_chunks(bucket: Path, dataset_id: str) -> dict[str, int]:
    """Sizes of the stored chunk objects of the dataset ``dataset_id``, by chunk file name."""
    for meta in bucket.glob("db/*/d/*/.dataset.json"):
        if json.loads(meta.read_text())["id"] == dataset_id:
            return {p.name.replace("_", "."): p.stat().st_size
                    for p in meta.parent.iterdir() if not p.name.startswith(".")}
    raise AssertionError(f"dataset {dataset_id} is not in {bucket}")


@pytest.mark.mount
@needs_fuse
def test_control_directory_counts_what_a_reader_did(tmp_path: Path) -> None:
    with mounted(SAMPLE, tmp_path / "mnt", "-o",
                 "metadata_ttl=600,chunk_cache=64M,meta_cache=48M") as mp:
        control = mp / ".h5mount"
        # Hidden: in no listing, found by name.
        assert ".h5mount" not in os.listdir(mp)
        found = subprocess.run(["find", str(mp)], capture_output=True, text=True, check=True)
        assert ".h5mount" not in found.stdout and str(mp / "home") in found.stdout
        assert set(os.listdir(control)) == CONTROL_FILES

        ds = mp / DATASET
        dataset_id = os.getxattr(ds, "user.h5.id").decode()
        sizes = stored_chunks(SAMPLE, dataset_id)
        names = sorted(n for n in os.listdir(ds) if not n.startswith("."))
        assert names == sorted(sizes) and len(names) >= 2
        for name in names:  # metadata read now, not during the reads below
            (ds / name).stat()

        before = stats(mp)
        copied = subprocess.run(["cat", *[str(ds / n) for n in names]], capture_output=True,
                                check=True).stdout
        after = stats(mp)

        assert len(copied) == sum((ds / n).stat().st_size for n in names)
        local = after["storage"]["local"]["bytes"] - before["storage"]["local"]["bytes"]
        assert local == sum(sizes.values())
        chunks = after["caches"]["chunks"]
        assert chunks["misses"] - before["caches"]["chunks"]["misses"] == len(names)
        assert chunks["bytes"] == len(copied) + len(names) * ENTRY_OVERHEAD  # what it charges
        reads = after["requests"]["read"] - before["requests"].get("read", 0)
        assert reads >= len(names)
        assert after["latency"]["read"]["count"] - before["latency"]["read"]["count"] == reads
        assert after["latency"]["read"]["p50_ms"] > 0
        assert after["open"]["files"] == 0  # cat closed them all (rendered at the stat)
        assert after["h5mount"]["source"] == str(SAMPLE)
        assert after["h5mount"]["uptime_seconds"] > before["h5mount"]["uptime_seconds"]
        assert after["memory"]["rss_bytes"] > 0
        memo = after["caches"]["memo"]
        assert memo["budget_bytes"] == 48 << 20 and 0 < memo["bytes"] <= memo["budget_bytes"]

        # An error reply is counted by errno.
        with pytest.raises(FileNotFoundError):
            (ds / "99.99").stat()
        assert stats(mp)["errors"].get("ENOENT", 0) > after["errors"].get("ENOENT", 0)

        config = json.loads(fresh(control / "config.json"))
        assert config["metadata_ttl"] == 600 and config["chunk_cache"] == 64 << 20
        assert config["meta_cache"] == 48 << 20
        assert config["source"] == str(SAMPLE) and "ro" in config["fuse_options"]

        families = {f.name: f for f in
                    text_string_to_metric_families(fresh(control / "metrics").decode())}
        reads_metric = {s.labels["op"]: s.value
                        for s in families["h5mount_fuse_requests"].samples
                        if s.name == "h5mount_fuse_requests_total"}
        assert reads_metric["read"] >= after["requests"]["read"]
        assert "h5mount_storage_latency_seconds" in families
        assert any(s.labels.get("cache") == "chunks"
                   for s in families["h5mount_cache_misses"].samples)


@pytest.mark.mount
@needs_fuse
def test_control_files_sizes_are_exact_for_copying_tools(tmp_path: Path) -> None:
    with mounted(SAMPLE, tmp_path / "mnt") as mp:
        control = mp / ".h5mount"
        out = tmp_path / "copy"
        subprocess.run(["cp", "-r", str(control), str(out)], check=True)
        for name in CONTROL_FILES:
            assert (out / name).stat().st_size > 0
        json.loads((out / "stats.json").read_text())
        archive = tmp_path / "control.tar"
        made = subprocess.run(["tar", "-cf", str(archive), "-C", str(mp), ".h5mount"],
                              capture_output=True, text=True, check=False)
        assert made.returncode == 0, made.stderr  # tar warns when st_size was wrong
        with tarfile.open(archive) as tar:
            member = tar.extractfile(".h5mount/config.json")
            assert member is not None
            assert json.loads(member.read())["mountpoint"] == str(mp)
        with pytest.raises(OSError) as err:
            (control / "new").write_text("x")
        assert err.value.errno in (30, 13)  # EROFS (or EACCES from the mode)


@pytest.mark.mount
@needs_fuse
def test_stats_command(tmp_path: Path) -> None:
    with mounted(SAMPLE, tmp_path / "mnt") as mp:
        (mp / DATASET / "0.0").read_bytes()
        time.sleep(REUSE + 0.1)
        table = subprocess.run([*H5MOUNT, "stats", str(mp)], capture_output=True, text=True,
                               cwd=REPO, check=True).stdout
        assert "FUSE requests" in table and "chunks" in table and "local" in table
        doc = json.loads(subprocess.run([*H5MOUNT, "stats", "--json", str(mp)],
                                        capture_output=True, text=True, cwd=REPO,
                                        check=True).stdout)
        assert doc["requests"]["read"] >= 1
        watch = subprocess.Popen([*H5MOUNT, "stats", "--watch", "--json", "--interval", "0.2",
                                  str(mp)], stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            assert watch.stdout is not None
            lines = [json.loads(watch.stdout.readline()) for _ in range(2)]
        finally:
            watch.terminate()
            watch.wait(timeout=10)
        assert all("requests" in line for line in lines)
    refused = subprocess.run([*H5MOUNT, "stats", str(tmp_path)], capture_output=True,
                             text=True, cwd=REPO, check=False)
    assert refused.returncode == 1
    assert "not an h5mount mount" in refused.stderr
