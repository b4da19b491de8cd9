"""The caches' budgets kept by a real daemon streaming from S3 (moto on loopback).

The bucket is ``tests.test_mount_rowbands``'s (a 1000 x 4096 float32 dataset
in 256 KiB chunks, 16 MiB decoded), copied key for key onto moto and mounted
with small caches (``cache_size=2M``, ``chunk_cache=4M``). Three readers
stream ``data.npy`` at once, three times, the page cache dropped between
passes; every pass gives numpy's bytes. Then ``.h5mount/stats.json`` shows
each cache within its budget: what it keeps (``bytes``), the buffers in
use (``held_bytes``), the slots its pool maps (``mapped_bytes``) and the
most it mapped beyond the budget (``over_budget_peak_bytes``: buffers reads
under way still held when the cache let them go, ``IN_FLIGHT`` at most);
and the daemon's peak RSS stays within its resident memory at the start
plus the budgets and ``SLACK``. Issue 27.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mountd.cache.memlimit import HEADROOM
from tests.moto_server import MotoServer
from tests.mounting import daemon_pids, fuse_available, mounted
from tests.test_control import stats
from tests.test_mount_rowbands import NPY, cat, drop_pages, expected, npy_bytes, write_bucket

pytestmark = [pytest.mark.mount, pytest.mark.server,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

MIB = 1 << 20
BUCKET = "budget"
#: ``meta_cache`` is not small, so the default memory limit (their sum plus
#: ``HEADROOM``) stays well above the daemon's 110 MiB or so while it streams.
CACHE_SIZE, CHUNK_CACHE, META_CACHE = 2 * MIB, 4 * MIB, 64 * MIB
#: Memory past the budgets a daemon may grow by while it streams: the requests
#: and decodes under way, and what the C library keeps of their buffers.
SLACK = 100 * MIB
READERS = 3
PASSES = 3
#: The most a pool may map past its budget at the worst moment: buffers the cache
#: let go of while reads under way still held them (a few per request).
IN_FLIGHT = 16 * MIB


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


@pytest.fixture(scope="module")
def s3_rows(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("budget") / "bucket"
    write_bucket(where)
    moto.create_bucket(BUCKET)
    moto.upload_dir(where, BUCKET, "")
    return f"s3://{BUCKET}"


@pytest.fixture
def mount(moto: MotoServer, s3_rows: str, tmp_path: Path) -> Iterator[Path]:
    options = (f"cache_size={CACHE_SIZE},chunk_cache={CHUNK_CACHE},meta_cache={META_CACHE},"
               "metadata_ttl=86400")
    with mounted(s3_rows, tmp_path / "mp", "--endpoint-url", moto.endpoint, "-o", options,
                 env=moto.env()) as mp:
        yield mp


def stream(npy: Path, passes: int) -> list[bytes]:
    """What ``READERS`` readers at once got of ``npy``, ``passes`` times, the page
    cache dropped before each pass."""
    got: list[bytes] = []
    for _ in range(passes):
        drop_pages(npy)
        readers = [threading.Thread(target=lambda: got.append(cat(npy)))
                   for _ in range(READERS)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
    return got


def test_streaming_readers_keep_the_budgets(mount: Path) -> None:
    (pid,) = daemon_pids(mount)
    npy = mount / NPY
    want = npy_bytes(expected())
    assert cat(npy) == want  # the metadata and the first pass, before the idle figure
    start_kib = memory_kib(pid, "VmRSS")
    got = stream(npy, PASSES)
    assert len(got) == READERS * PASSES and all(data == want for data in got)

    caches: dict[str, Any] = stats(mount)["caches"]
    for name, budget in (("blocks", CACHE_SIZE), ("chunks", CHUNK_CACHE)):
        figures = caches[name]
        assert figures["budget_bytes"] == budget
        assert figures["held_bytes"] <= figures["bytes"] <= budget, (name, figures)
        assert figures["mapped_bytes"] <= budget, (name, figures)
        assert figures["over_budget_peak_bytes"] <= IN_FLIGHT, (name, figures)
    assert caches["blocks"]["misses"] > 0 and caches["chunks"]["misses"] > 0
    memory = stats(mount)["memory"]  # the default limit, never reached here
    assert memory["limit_bytes"] == CACHE_SIZE + CHUNK_CACHE + META_CACHE + HEADROOM
    assert memory["lent_peak_bytes"] == 0
    peak_kib = memory_kib(pid, "VmHWM")
    assert (peak_kib - start_kib) * 1024 <= CACHE_SIZE + CHUNK_CACHE + SLACK, \
        (start_kib, peak_kib)


def test_under_a_memory_limit_it_cannot_keep_the_caches_give_way_and_reads_stay_right(
        moto: MotoServer, s3_rows: str, tmp_path: Path) -> None:
    """``-o memory_limit`` below what the daemon needs to run at all: every cache
    is lowered to its floor (an eighth of the block cache and the memo, half the
    chunk cache), keeps to it while three readers stream, the log says once that
    the limit cannot be kept and why the chunk cache is short of a chunk row,
    and every byte read is numpy's."""
    log = tmp_path / "daemon.log"
    options = (f"cache_size={CACHE_SIZE},chunk_cache={CHUNK_CACHE},meta_cache={META_CACHE},"
               f"metadata_ttl=86400,memory_limit=1M,log_file={log},log_level=info")
    with mounted(s3_rows, tmp_path / "mp", "--endpoint-url", moto.endpoint, "-o", options,
                 env=moto.env()) as mount:
        npy = mount / NPY
        want = npy_bytes(expected())
        got = stream(npy, 2)
        assert len(got) == 2 * READERS and all(data == want for data in got)
        doc = stats(mount)
    caches, memory = doc["caches"], doc["memory"]
    floors = {"blocks": CACHE_SIZE // 8, "memo": META_CACHE // 8, "chunks": CHUNK_CACHE // 2}
    for name, floor in floors.items():
        assert caches[name]["budget_bytes"] == floor, (name, caches[name])
        assert caches[name]["bytes"] <= floor, (name, caches[name])
    for name in ("blocks", "chunks"):
        assert caches[name]["mapped_bytes"] <= floors[name] + IN_FLIGHT, (name, caches[name])
    assert caches["chunks"]["evictions"] > 0
    assert memory["limit_bytes"] == MIB and memory["rss_bytes"] > MIB
    assert memory["lent_bytes"] == memory["lent_peak_bytes"] == \
        CACHE_SIZE + CHUNK_CACHE + META_CACHE - sum(floors.values())
    text = log.read_text()
    assert "cache budgets lowered" in text
    assert text.count("with every cache at its floor") == 1
    # A chunk row of data.npy (8 chunks, 2 MiB) and the readahead beside it fit the
    # 4M chunk cache, not its floor.
    assert "chunk_cache=4M, lowered to 2M while the daemon is over -o memory_limit" in text
