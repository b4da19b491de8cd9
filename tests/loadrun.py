"""The load harness of ``tests/test_load.py``: readers and walkers on a live
mount, every byte checked, and the daemon's peak RSS against its budgets.

Owns what every load test does on its mount, whatever the storage behind it:

- ``targets``: the bytes each ``.npy`` of the bucket's datasets of fixed-size
  type must have (h5py's values through numpy's own writer), and the chunk
  files of a dataset with many chunks; each file is first read whole (by
  ``READERS`` threads) and compared;
- ``run``: ``READERS`` threads read at random offsets and sizes of those
  files while ``ls -lR`` and ``find`` walk the whole mount over and over, for
  a given time; no read may fail or return other bytes, no thread may hang,
  and the readers must get through a given number of reads;
- ``peak_rss``: the daemon's VmHWM, which ``check_peak`` logs (a warning, so
  it shows in a test run's summary) and bounds by the cache budgets plus a
  stated overhead.

Concurrency: ``targets`` reads on a pool of ``READERS`` threads and compares
when all are done. ``run`` starts plain threads that share one ``Tally``
under its lock; the first failure stops every thread, and ``run`` joins them
all (waiting past its time by a fixed grace only) before it asserts.
"""

from __future__ import annotations

import io
import logging
import os
import random
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from tests.mounting import daemon_pids

log = logging.getLogger(__name__)

#: Reader threads of ``run``.
READERS = 32
#: Sizes a reader asks for, one drawn per read.
READ_SIZES = (1, 100, 4096, 65536, 1 << 20)
#: A dataset with more than 100 stored chunks, whose chunk files readers read too.
MANY_CHUNKS = "home/admin/refs.h5/chunked/many"
#: How long past its time ``run`` waits for a thread before calling it hung: one
#: walk of a loaded mount takes seconds, a read at worst one storage timeout.
GRACE = 180.0


def expected_files(mp: Path, domains: list[tuple[str, Path]]) -> dict[Path, bytes]:
    """The bytes every ``.npy`` of the domains' datasets of fixed-size type
    must have, built from h5py's values with numpy's own writer, by the files'
    paths in the mount (``domains``: domain key and local HDF5 file)."""
    out: dict[Path, bytes] = {}
    for domain, h5file in domains:
        with h5py.File(h5file, "r") as f:
            found: list[tuple[str, h5py.Dataset]] = []
            f.visititems(lambda name, obj, found=found: found.append((name, obj))
                         if isinstance(obj, h5py.Dataset) else None)
            for name, obj in found:
                if obj.dtype.kind in "OV" or obj.dtype.names or obj.dtype.subdtype or \
                        obj.size < 64:
                    continue
                path = mp / domain / f"{name}.npy"
                if path.exists():
                    buf = io.BytesIO()
                    np.save(buf, obj[()])
                    out[path] = buf.getvalue()
    return out


def targets(mp: Path, domains: list[tuple[str, Path]]) -> list[tuple[Path, bytes]]:
    """Every file the readers read, with its bytes: the ``.npy`` files of
    ``expected_files``, each read whole and compared first, and the chunk files
    of ``MANY_CHUNKS`` as the mount serves them (their bytes are h5py's
    through the ``.npy`` comparison)."""
    started = time.monotonic()
    files = expected_files(mp, domains)
    assert len(files) >= 10, len(files)
    chunk_files = [p for p in (mp / MANY_CHUNKS).iterdir() if not p.name.startswith(".")]
    assert len(chunk_files) > 100, len(chunk_files)
    # READERS at a time: one after another, a slow store's latency adds up
    with ThreadPoolExecutor(READERS) as pool:
        got = dict(zip([*files, *chunk_files],
                       pool.map(Path.read_bytes, [*files, *chunk_files]), strict=True))
    # numpy's header layout is h5mount's too (docs/CONTRACT.md, "Views"), so
    # whole files compare
    assert [p for p, want in files.items() if got[p] != want] == []
    log.info("load: %d files read whole and checked in %.1f s", len(got),
             time.monotonic() - started)
    return [*files.items(), *((p, got[p]) for p in chunk_files)]


@dataclass
class Tally:
    """What the threads of one ``run`` did: reads done, and what went wrong."""

    reads: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)


def run(mp: Path, files: list[tuple[Path, bytes]], seconds: float, min_reads: int) -> int:
    """Run ``READERS`` readers of ``files`` and two walkers of ``mp`` for
    ``seconds``; assert that none hung or failed and that the readers made at
    least ``min_reads`` reads, and return how many they made."""
    tally = Tally()
    stop = time.monotonic() + seconds

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        done = 0
        while time.monotonic() < stop and not tally.failures:
            path, want = rng.choice(files)
            offset = rng.randrange(len(want))
            size = rng.choice(READ_SIZES)
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    got = os.pread(fd, size, offset)
                finally:
                    os.close(fd)
            except OSError as exc:
                tally.fail(f"{path}@{offset}: {exc}")
                break
            if got != want[offset:offset + size]:
                tally.fail(f"{path}@{offset}+{size}: wrong bytes")
                break
            done += 1
        with tally.lock:
            tally.reads += done

    def walker(command: list[str]) -> None:
        while time.monotonic() < stop and not tally.failures:
            try:
                walked = subprocess.run(command, capture_output=True, text=True, check=False,
                                        timeout=GRACE)
            except subprocess.TimeoutExpired:
                tally.fail(f"{command[0]}: hung ({GRACE:g} s)")
                break
            if walked.returncode != 0:
                tally.fail(f"{command[0]}: {walked.stderr[-500:]}")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
    threads += [threading.Thread(target=walker, args=(["ls", "-lR", str(mp)],)),
                threading.Thread(target=walker, args=(["find", str(mp)],))]
    for t in threads:
        t.start()
    deadline = stop + GRACE
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a reader or walker hung"
    log.info("load: the last reader or walker ended %.1f s after the time",
             time.monotonic() - stop)
    assert not tally.failures, tally.failures[:5]
    assert tally.reads >= min_reads, tally.reads
    return tally.reads


def peak_rss(mp: Path) -> int:
    """The peak resident size (VmHWM), in bytes, of the daemon serving ``mp``."""
    (pid,) = daemon_pids(mp)
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM:"))) << 10


def check_peak(mp: Path, what: str, caches: int, overhead: int) -> None:
    """Log the daemon's peak RSS beside its bound, then assert it: at most
    ``caches`` (the budgets it was given) plus ``overhead``."""
    peak = peak_rss(mp)
    log.warning("%s: daemon peak RSS %.0f MiB (caches %.0f MiB + allowed overhead %.0f MiB)",
                what, peak / 2**20, caches / 2**20, overhead / 2**20)
    assert peak <= caches + overhead, peak
