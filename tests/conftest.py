"""Shared pytest fixtures; this module owns the session-wide real-HSDS bucket.

``hsds_bucket`` writes the files of ``tests/h5files.py``, hsloads each into a
real HSDS 1.0.2 (``tests/hsds_server.py``) with POSIX storage, flushes every
domain, checks that every object and data chunk is on disk, waits for the
background scan's ``.info.json``/``.summary.json`` of each domain, stops HSDS and
yields the bucket directory. Nothing runs HSDS after that: tests read (or
mount) the directory only and must not change it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import h5files
from tests.hsds_server import HsdsServer, hsds_node_available, missing_objects
from tests.mounting import mounted

log = logging.getLogger(__name__)

HSDS_BUCKET = "h5mtest"


@dataclass(frozen=True)
class HsdsBucket:
    """A finished HSDS bucket on disk.

    ``bucket_dir`` is ``root_dir/bucket``, the directory h5mount mounts (it
    holds ``home/`` and ``db/``). ``files`` maps each domain key
    (``home/admin/types.h5``, no leading slash) to the local HDF5 file it was
    loaded from; ``args`` maps it to the extra hsload options used.
    """

    root_dir: Path
    bucket: str
    source_dir: Path
    log_dir: Path
    files: dict[str, Path] = field(default_factory=dict)
    args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def bucket_dir(self) -> Path:
        return self.root_dir / self.bucket

    def domains(self) -> list[tuple[str, Path]]:
        """(domain key, local .h5) pairs, sorted by domain."""
        return sorted(self.files.items())


@pytest.fixture(scope="session")
def hsds_bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HsdsBucket]:
    """The test files loaded into a real HSDS bucket, flushed and verified; HSDS stopped."""
    if not hsds_node_available():
        pytest.skip("hsds-node/hsload/hstouch not installed (pip install 'hsds==1.0.2' h5pyd)")
    started = time.monotonic()
    base = tmp_path_factory.mktemp("hsds")
    sources = h5files.write_all(base / "src")
    root_dir = base / "root"
    files: dict[str, Path] = {}
    args: dict[str, tuple[str, ...]] = {}
    server = HsdsServer(root_dir, HSDS_BUCKET, log_dir=base / "logs")
    with server:
        for load in h5files.LOADS:
            server.load(sources[load.source], load.domain, args=load.args)
            files[load.domain] = sources[load.source]
            args[load.domain] = load.args
        # Flushing after all loads: each flush waits ~1-2 s for HSDS's write-back
        # loop, and by the time the first returns the others have little left.
        for domain, source in files.items():
            server.flush_and_verify(domain, source)
        # Make the optional summaries (.info.json, .summary.json) always present.
        for domain in files:
            server.wait_for_scan(domain)
    # Check again with HSDS stopped: what a mount sees.
    for domain, source in files.items():
        missing = missing_objects(server.bucket_dir, domain, source)
        if missing:
            raise AssertionError(f"{domain}: missing after HSDS stopped: {missing[:10]}")
    bucket = HsdsBucket(
        root_dir=root_dir,
        bucket=HSDS_BUCKET,
        source_dir=base / "src",
        log_dir=base / "logs",
        files=files,
        args=args,
        seconds=time.monotonic() - started,
    )
    log.info("hsds_bucket ready in %.1fs at %s", bucket.seconds, bucket.bucket_dir)
    yield bucket


@pytest.fixture(scope="module")
def mnt(hsds_bucket: HsdsBucket, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session bucket mounted with the real daemon, once per test module."""
    mp = tmp_path_factory.mktemp("mnt")
    with mounted(hsds_bucket.bucket_dir, mp):
        yield mp
