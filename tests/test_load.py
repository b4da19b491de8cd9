"""Load: 32 concurrent readers at random offsets of ``.npy`` and chunk files,
with ``ls -lR`` and ``find`` walking the same mount meanwhile, on its own
mount of the session's HSDS bucket with small caches (so entries are evicted
and fetched again while readers run). Every byte is checked against h5py,
and the daemon's peak RSS stays within its cache budgets plus a stated
overhead, which the test reports.

``H5MOUNT_LOAD_SECONDS`` (default 8) sets how long readers run; a soak run
sets it to minutes.
"""

from __future__ import annotations

import io
import logging
import os
import random
import subprocess
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.mounting import daemon_pids, fuse_available, mounted

pytestmark = [pytest.mark.mount, pytest.mark.hsds,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

log = logging.getLogger(__name__)

READERS = 32
SECONDS = float(os.environ.get("H5MOUNT_LOAD_SECONDS", "8"))
CHUNK_CACHE = 4 << 20
BLOCK_CACHE = 8 << 20
#: What the daemon may use beyond its caches: interpreter, libraries, metadata
#: of the test bucket, buffers of 32 readers.
OVERHEAD = 200 << 20


def expected_files(mp: Path, bucket: Path) -> dict[Path, bytes]:
    """The bytes every ``.npy`` of the bucket's datasets of fixed-size type
    must have, built from h5py's values with numpy's own writer, and the
    files' paths in the mount."""
    out: dict[Path, bytes] = {}
    for domain, h5file in bucket:
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


def test_concurrent_readers_and_walkers(hsds_bucket, tmp_path: Path) -> None:
    with mounted(hsds_bucket.bucket_dir, tmp_path / "mnt", "-o",
                 f"chunk_cache={CHUNK_CACHE},cache_size={BLOCK_CACHE}") as mp:
        files = expected_files(mp, hsds_bucket.domains())
        assert len(files) >= 10, len(files)
        # numpy's header layout is h5mount's too (docs/CONTRACT.md, "Views"), so whole
        # files compare
        for path, want in files.items():
            assert path.read_bytes() == want, path
        chunk_files = [p for p in (mp / "home/admin/refs.h5/chunked/many").iterdir()
                       if not p.name.startswith(".")]
        chunk_bytes = {p: p.read_bytes() for p in chunk_files}
        assert len(chunk_bytes) > 100
        targets = [*files.items(), *chunk_bytes.items()]

        failures: list[str] = []
        reads = [0]
        stop = time.monotonic() + SECONDS

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < stop and not failures:
                path, want = rng.choice(targets)
                offset = rng.randrange(len(want))
                size = rng.choice((1, 100, 4096, 65536, 1 << 20))
                try:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        got = os.pread(fd, size, offset)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    failures.append(f"{path}@{offset}: {exc}")
                    return
                if got != want[offset:offset + size]:
                    failures.append(f"{path}@{offset}+{size}: wrong bytes")
                    return
                reads[0] += 1

        def walker(command: list[str]) -> None:
            while time.monotonic() < stop and not failures:
                done = subprocess.run(command, capture_output=True, text=True, check=False,
                                      timeout=120)
                if done.returncode != 0:
                    failures.append(f"{command[0]}: {done.stderr[-500:]}")

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
        threads += [threading.Thread(target=walker, args=(["ls", "-lR", str(mp)],)),
                    threading.Thread(target=walker, args=(["find", str(mp)],))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SECONDS + 180)
        assert not any(t.is_alive() for t in threads), "a reader or walker hung"
        assert not failures, failures[:5]
        assert reads[0] > READERS * 10, reads[0]

        (pid,) = daemon_pids(mp)
        status = Path(f"/proc/{pid}/status").read_text()
        peak = int(next(line.split()[1] for line in status.splitlines()
                        if line.startswith("VmHWM:"))) << 10
        log.warning("load: %d reads by %d readers in %.0f s; daemon peak RSS %.0f MiB "
                    "(caches %.0f MiB + allowed overhead %.0f MiB)", reads[0], READERS,
                    SECONDS, peak / 2**20, (CHUNK_CACHE + BLOCK_CACHE) / 2**20,
                    OVERHEAD / 2**20)
        assert peak <= CHUNK_CACHE + BLOCK_CACHE + OVERHEAD, peak
