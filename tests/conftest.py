"""Shared pytest fixtures; this module owns the session-wide real-HSDS bucket.

``hsds_bucket`` writes the files of ``tests/h5files.py``, hsloads each into a
real HSDS 1.0.2 (``tests/hsds_server.py``) with POSIX storage, flushes every
domain, checks that every object and data chunk is on disk, waits for the
background scan's ``.info.json``/``.summary.json`` of each domain, stops HSDS and
yields the bucket directory. Nothing runs HSDS after that: tests read (or
mount) the directory only and must not change it.

The S3 fixtures run one moto S3 server for the session (``moto``):
``s3_bucket`` / ``s3_prefixed_bucket`` hold key-for-key copies of the POSIX
bucket (at the top of a bucket, and under a prefix), so an S3 mount can be
compared byte for byte, ids included, with a local mount; ``hsds_s3_direct`` is
a bucket that a real HSDS wrote onto moto itself (S3 storage mode).
Every test gets back the root logger's level it started with. The options
``--soak`` and ``--load-seconds`` are registered here; ``tests/test_load.py``
reads them.
"""

from __future__ import annotations

import fcntl
import logging
import pickle
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import h5files, tiers
from tests.hsds_server import (
    HsdsServer,
    S3Keys,
    S3Storage,
    hsds_node_available,
    missing_objects,
    tool_path,
)
from tests.moto_server import MotoServer
from tests.mounting import mounted

log = logging.getLogger(__name__)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true",
                     help="run the load tests (tests/test_load.py) for ten minutes each")
    parser.addoption("--load-seconds", type=float, metavar="SECONDS",
                     help="run the load tests for SECONDS each (overrides --soak)")


def pytest_configure(config: pytest.Config) -> None:
    for name, what in tiers.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: needs {what} (tests/tiers.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.check_fixtures(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    tiers.running = item
    try:
        return (yield)
    finally:
        tiers.running = None

HSDS_BUCKET = "h5mtest"
#: moto buckets: the key-for-key copy, the copy under a prefix, the one HSDS writes.
S3_COPY_BUCKET = "h5mtest-copy"
S3_PREFIXED_BUCKET = "h5mtest-prefixed"
S3_PREFIX = "nested/copy"
S3_DIRECT_BUCKET = "h5mtest-direct"
#: Test files the direct S3 bucket is loaded from: types, chunked layouts, filters.
S3_DIRECT_SOURCES = ("layout.h5", "filters.h5")


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


@pytest.fixture(autouse=True)
def _root_log_level() -> Iterator[None]:
    """Give back the root logger's level after each test: opening an
    ``h5pyd.File`` sets it to ERROR for the rest of the process, which hid the
    log lines later tests look for."""
    level = logging.root.level
    yield
    logging.root.setLevel(level)


@pytest.fixture(scope="session")
def hsds_bucket(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> HsdsBucket:
    """The test files loaded into a real HSDS bucket, flushed and verified; HSDS
    stopped. Under pytest-xdist the workers share one: the first to ask builds it
    in the run's directory while the others wait on a lock (it is read-only)."""
    if not hsds_node_available():
        pytest.skip("hsds-node/hsload/hstouch not installed (pip install 'hsds==1.0.2' h5pyd)")
    if worker_id == "master":
        return _build_hsds_bucket(tmp_path_factory.mktemp("hsds"))
    base = tmp_path_factory.getbasetemp().parent / "hsds-shared"
    with open(f"{base}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = base / "bucket.pickle"
        if record.exists():
            bucket: HsdsBucket = pickle.loads(record.read_bytes())
            log.info("hsds_bucket shared from %s", bucket.bucket_dir)
            return bucket
        if base.exists():  # a worker that failed half way: start again
            shutil.rmtree(base)
        base.mkdir()
        bucket = _build_hsds_bucket(base)
        record.write_bytes(pickle.dumps(bucket))
        return bucket


def _build_hsds_bucket(base: Path) -> HsdsBucket:
    started = time.monotonic()
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
    return bucket


@dataclass(frozen=True)
class S3Bucket:
    """A bucket (or a prefix in one) on the session's moto S3 server.

    ``url`` is what ``h5mount`` takes (``s3://bucket[/prefix]``); ``env`` holds
    the ``AWS_*`` credentials and region for any client. ``local_dir`` is the
    POSIX bucket this one is a key-for-key copy of (None for a bucket HSDS wrote
    itself). ``files`` maps domain keys (``home/admin/types.h5``) to the local
    HDF5 files they were loaded from.
    """

    endpoint: str
    bucket: str
    prefix: str
    env: dict[str, str]
    local_dir: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def mount_args(self) -> tuple[str, ...]:
        """h5mount options that point it at this endpoint."""
        return ("--endpoint-url", self.endpoint)

    def key(self, key: str) -> str:
        """The full S3 key of bucket key ``key`` (with the prefix in front)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def keys(self) -> S3Keys:
        """Read access to the objects (full keys, prefix included)."""
        return S3Keys(S3Storage.from_env(self.endpoint, self.env).client(), self.bucket)

    def domains(self) -> list[tuple[str, Path]]:
        """(domain key, local .h5) pairs, sorted by domain."""
        return sorted(self.files.items())


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """One moto S3 server on loopback for the session; always stopped."""
    if shutil.which("moto_server", path=tool_path()) is None:
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    with MotoServer() as server:
        yield server


def _s3_copy(moto: MotoServer, local: HsdsBucket, bucket: str, prefix: str) -> S3Bucket:
    started = time.monotonic()
    moto.create_bucket(bucket)
    count = moto.upload_dir(local.bucket_dir, bucket, f"{prefix}/" if prefix else "")
    copy = S3Bucket(moto.endpoint, bucket, prefix, moto.env(), local.bucket_dir,
                    dict(local.files), time.monotonic() - started)
    log.info("%s: %d keys copied in %.1fs", copy.url, count, copy.seconds)
    return copy


@pytest.fixture(scope="session")
def s3_bucket(moto: MotoServer, hsds_bucket: HsdsBucket) -> S3Bucket:
    """The POSIX ``hsds_bucket`` copied key for key to the top of a moto bucket."""
    return _s3_copy(moto, hsds_bucket, S3_COPY_BUCKET, "")


@pytest.fixture(scope="session")
def s3_prefixed_bucket(moto: MotoServer, hsds_bucket: HsdsBucket) -> S3Bucket:
    """The POSIX ``hsds_bucket`` copied key for key under ``S3_PREFIX/`` of a moto bucket."""
    return _s3_copy(moto, hsds_bucket, S3_PREFIXED_BUCKET, S3_PREFIX)


@pytest.fixture(scope="session")
def hsds_s3_direct(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> S3Bucket:
    """A few test files hsloaded by a real HSDS that stores on moto (S3 mode); HSDS stopped.

    Every domain is flushed and checked on S3 (domain JSON, every object, every
    chunk with data) while HSDS runs and again after it stopped; the background
    scan's ``.info.json``/``.summary.json`` are waited for, as in ``hsds_bucket``.
    """
    if not hsds_node_available():
        pytest.skip("hsds-node/hsload/hstouch not installed (pip install 'hsds==1.0.2' h5pyd)")
    started = time.monotonic()
    base = tmp_path_factory.mktemp("hsds-s3")
    (base / "src").mkdir()
    sources = {name: h5files.WRITERS[name](base / "src") for name in S3_DIRECT_SOURCES}
    moto.create_bucket(S3_DIRECT_BUCKET)
    storage = S3Storage.from_env(moto.endpoint, moto.env())
    files = {f"home/admin/{name}": path for name, path in sources.items()}
    server = HsdsServer(None, S3_DIRECT_BUCKET, s3=storage, log_dir=base / "logs")
    with server:
        # HSDS on S3 spends its time in per-request client set-up: load in parallel.
        server.ensure_folder("/home/")
        server.ensure_folder("/home/admin/", owner="admin")
        with ThreadPoolExecutor(len(files)) as pool:
            list(pool.map(lambda item: server.load(item[1], item[0]), files.items()))
        for domain, source in files.items():
            server.flush_and_verify(domain, source)
        # Deterministic contents: the background scan's summaries always present.
        for domain in files:
            server.wait_for_scan(domain)
    keys = server.keys()
    for domain, source in files.items():
        missing = missing_objects(keys, domain, source)
        if missing:
            raise AssertionError(f"{domain}: missing after HSDS stopped: {missing[:10]}")
    direct = S3Bucket(moto.endpoint, S3_DIRECT_BUCKET, "", moto.env(), None, files,
                      time.monotonic() - started)
    log.info("hsds_s3_direct ready in %.1fs at %s", direct.seconds, direct.url)
    return direct


@pytest.fixture(scope="module")
def mnt(hsds_bucket: HsdsBucket, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session bucket mounted with the real daemon, once per test module."""
    mp = tmp_path_factory.mktemp("mnt")
    with mounted(hsds_bucket.bucket_dir, mp):
        yield mp
