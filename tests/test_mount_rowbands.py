"""A ``.npy`` read through a real mount whose chunk cache is smaller than one chunk row.

The bucket is written key by key (no server): ``/home/admin/rows.h5`` holds
``/data``, 1000 x 4096 float32 in 128 x 512 chunks (256 KiB), a grid of 8 x 8
chunks, some not stored; a chunk row is 2 MiB and ``-o chunk_cache=1M`` holds
three chunks. The ``.npy`` is read sequentially with 4 KiB requests (the
kernel's readahead turned off with ``POSIX_FADV_RANDOM``, so the daemon sees
every one), and with ``cat`` and ``cp``: each pass gives numpy's bytes and
decodes each chunk at most once (the chunk cache misses of
``.h5mount/stats.json``), and the daemon's log says once that the cache is
too small. Issue 27; the reader's side is ``layouts.views._rowbands``.
"""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.mounting import fuse_available, mounted
from tests.rawdomain import write_one_dataset
from tests.test_control import stats

pytestmark = [pytest.mark.mount,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

SHAPE = (1000, 4096)
CHUNKS = (128, 512)
GRID = (8, 8)
ROOT = "g-3a3b4c5d-6e7f8091-b2b3-c4d5e6-f70819"  # schema v2: each hex digit + 8
DSET = "d-3a3b4c5d-6e7f8091-0000-000000-000001"
NPY = "home/admin/rows.h5/data.npy"


def stored(index: tuple[int, int]) -> bool:
    return (index[0] * GRID[1] + index[1]) % 11 != 4


def expected() -> np.ndarray:
    data = np.arange(SHAPE[0] * SHAPE[1], dtype="<f4").reshape(SHAPE)
    for index in np.ndindex(*GRID):
        if not stored(index):
            data[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, CHUNKS, strict=True))] = 0
    return data


def npy_bytes(data: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, data)
    return buf.getvalue()


def write_bucket(bucket: Path) -> None:
    """The bucket, in HSDS schema v2, chunks stored raw (no filters)."""
    dset = write_one_dataset(bucket, "home/admin/rows.h5", ROOT, DSET, "data",
                             {"class": "H5T_FLOAT", "base": "H5T_IEEE_F32LE"}, SHAPE, CHUNKS)
    data = np.arange(SHAPE[0] * SHAPE[1], dtype="<f4").reshape(SHAPE)
    for index in np.ndindex(*GRID):
        if stored(index):
            block = np.zeros(CHUNKS, dtype="<f4")
            part = data[tuple(slice(i * c, (i + 1) * c)
                              for i, c in zip(index, CHUNKS, strict=True))]
            block[:part.shape[0], :part.shape[1]] = part
            (dset / f"{index[0]}_{index[1]}").write_bytes(block.tobytes())


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("rows") / "bucket"
    write_bucket(where)
    return where


def small_reads(path: Path) -> bytes:
    """The file in 4 KiB reads, each reaching the daemon (no readahead)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        parts = []
        while piece := os.read(fd, 4096):
            parts.append(piece)
        return b"".join(parts)
    finally:
        os.close(fd)


def cat(path: Path) -> bytes:
    return subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout


def make_cp(tmp: Path) -> Callable[[Path], bytes]:
    def cp(path: Path) -> bytes:
        subprocess.run(["cp", str(path), str(tmp / "copy.npy")], check=True)
        return (tmp / "copy.npy").read_bytes()
    return cp


def drop_pages(path: Path) -> None:
    """Drop the kernel's pages of ``path``, so the next pass reaches the daemon."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def misses(mp: Path) -> int:
    doc: dict[str, Any] = stats(mp)
    return int(doc["caches"]["chunks"]["misses"])


@pytest.fixture
def mount(bucket: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The mount, and its log file. A long ``metadata_ttl``: a pass that crossed
    into a new period would decode the chunk row it is in again."""
    log = tmp_path / "h5mount.log"
    with mounted(bucket, tmp_path / "mp", "--log-file", str(log), "-o",
                 "chunk_cache=1M,metadata_ttl=86400") as mp:
        yield mp, log


@pytest.mark.parametrize("how", ["small reads", "cat", "cp"])
def test_each_pass_decodes_each_chunk_at_most_once(mount: tuple[Path, Path], tmp_path: Path,
                                                   how: str) -> None:
    mp, log = mount
    read = {"small reads": small_reads, "cat": cat, "cp": make_cp(tmp_path)}[how]
    want = npy_bytes(expected())
    npy = mp / NPY
    assert npy.stat().st_size == len(want)
    for _ in range(2):
        drop_pages(npy)
        before = misses(mp)
        assert read(npy) == want
        decoded = misses(mp) - before
        assert 0 < decoded <= GRID[0] * GRID[1], decoded
    said = [line for line in log.read_text().splitlines() if "smaller than one chunk row" in line]
    assert len(said) == 1, said
    assert "chunk_cache=1M is smaller than one chunk row of /data in home/admin/rows.h5 " \
           "(8 chunks, 2 MiB)" in said[0]
    assert "use -o chunk_cache=3M or more" in said[0]
