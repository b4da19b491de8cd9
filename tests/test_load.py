"""Load: 32 concurrent readers at random offsets of ``.npy`` and chunk files,
with ``ls -lR`` and ``find`` walking the same mount meanwhile, on a mount of
its own with small caches (so entries are evicted and fetched again while
readers run), every byte checked against h5py and the daemon's peak RSS
bounded by its cache budgets plus a stated overhead, which the test reports
(the harness is ``tests/loadrun.py``). It runs twice:

- on the session's HSDS bucket, a local directory;
- on its key-for-key copy on S3 (moto), through the fault proxy
  (``tests/faultproxy.py``) answering a steady, seeded mix of its requests
  with 503 SlowDown, 500, connections reset or closed halfway through the
  body, stalls shorter than the mount's ``timeout``, and latency: faults the
  daemon must retry through, so readers never see EIO or wrong bytes. The
  proxy's count shows every kind of fault was hit, and the daemon's
  ``stats.json`` shows each fault as a retry and no storage failure.

Each runs its readers for ``SECONDS``; ``pytest --soak`` runs them for ten
minutes each, ``--load-seconds=N`` for N seconds.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from mountd.control import REUSE
from tests import loadrun
from tests.faultproxy import FaultProxy
from tests.mounting import fuse_available, mounted

pytestmark = [pytest.mark.mount, pytest.mark.hsds,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

log = logging.getLogger(__name__)

#: How long readers run: by default, and with ``--soak``.
SECONDS = 8.0
SOAK_SECONDS = 600.0
CHUNK_CACHE = 4 << 20
BLOCK_CACHE = 8 << 20
CACHES = f"chunk_cache={CHUNK_CACHE},cache_size={BLOCK_CACHE}"
#: What the daemon may use beyond its caches: interpreter, libraries, metadata
#: of the test bucket, buffers of 32 readers.
OVERHEAD = 200 << 20
#: Reads the readers make per second at least, all of them together: on the
#: 2-core test VM, with a load average of 10 to 24 from other work, a local
#: mount made 5,000 to 12,000, the faulty S3 mount 130 to 2,700 (5,500 over a
#: ten-minute soak).
MIN_RATE = 40

#: The S3 mount's ``-o timeout``: the longest one storage request may take,
#: retries included, so a stall of ``STALL`` (under the third of it that
#: ends an attempt that hears nothing, ``mountd.io.retry.RetryPolicy.stall``)
#: costs an attempt, never the request.
TIMEOUT = 20.0
STALL = 2.0
LATENCY = 0.2
#: The S3 mount's ``-o metadata_ttl``: metadata, remote blocks and the kernel's
#: pages expire a few times while readers run, so storage is asked again all
#: through the run (with the default, the caches hold the whole test bucket
#: within seconds and faults would meet the first reads only).
METADATA_TTL = 5
#: Seed of the proxy's draws.
SEED = 27


@pytest.fixture
def load_seconds(request: pytest.FixtureRequest) -> float:
    """How long readers run, as ``--load-seconds`` or ``--soak`` say (tests/conftest.py)."""
    seconds: float | None = request.config.getoption("load_seconds")
    if seconds is not None:
        return seconds
    return SOAK_SECONDS if request.config.getoption("soak") else SECONDS


def test_concurrent_readers_and_walkers(hsds_bucket, load_seconds: float,
                                        tmp_path: Path) -> None:
    with mounted(hsds_bucket.bucket_dir, tmp_path / "mnt", "-o", CACHES) as mp:
        files = loadrun.targets(mp, hsds_bucket.domains())
        reads = loadrun.run(mp, files, load_seconds, int(MIN_RATE * load_seconds))
        loadrun.check_peak(mp, f"load, local: {reads} reads by {loadrun.READERS} readers in "
                               f"{load_seconds:.0f} s", CHUNK_CACHE + BLOCK_CACHE, OVERHEAD)


def inject(proxy: FaultProxy) -> None:
    """Have the proxy answer a steady share of its requests with each kind of
    fault, for as long as it runs: about one request in six fails, one in
    twenty is slow. Resets and truncations cut a body, so GETs only."""
    proxy.error(503, probability=0.06)
    proxy.error(500, probability=0.02)
    proxy.reset(method="GET", probability=0.04)
    proxy.truncate(method="GET", probability=0.04)
    proxy.stall(STALL, probability=0.005)
    proxy.latency(LATENCY, probability=0.05)


@pytest.mark.server
def test_concurrent_readers_and_walkers_on_faulty_s3(s3_bucket, load_seconds: float,
                                                     tmp_path: Path) -> None:
    options = f"{CACHES},timeout={TIMEOUT:g},metadata_ttl={METADATA_TTL}"
    with FaultProxy(s3_bucket.endpoint, seed=SEED) as proxy:
        inject(proxy)
        with mounted(s3_bucket.url, tmp_path / "mnt", "--endpoint-url", proxy.endpoint,
                     "-o", options, env=s3_bucket.env) as mp:
            files = loadrun.targets(mp, s3_bucket.domains())
            warm = proxy.hits()
            reads = loadrun.run(mp, files, load_seconds, int(MIN_RATE * load_seconds))
            figures = settled(mp, proxy)
            hits, sent = proxy.hits(), proxy.count()
            s3 = figures["storage"]["s3"]
            log.warning("load, S3: %d requests; faults hit %s, %s while readers ran; the "
                        "daemon counted %d requests, %d retries, %d failures", sent,
                        dict(hits), dict(hits - warm), s3["requests"], s3["retries"],
                        s3["failures"])
            loadrun.check_peak(mp, f"load, S3 with faults: {reads} reads by "
                                   f"{loadrun.READERS} readers in {load_seconds:.0f} s",
                               CHUNK_CACHE + BLOCK_CACHE, OVERHEAD)
            assert set(hits) == {"error", "reset", "truncate", "stall", "latency"}, hits
            assert (hits - warm).total() >= 10, (hits, warm)
            # Every request the proxy saw is one the daemon counted, as a request
            # or as a retry of one, and every fault but latency made it retry.
            assert s3["requests"] + s3["retries"] == sent, (s3, sent)
            assert s3["retries"] >= hits.total() - hits["latency"], (s3, hits)
            assert s3["failures"] == 0 and figures["errors"].get("EIO", 0) == 0, figures


def settled(mp: Path, proxy: FaultProxy) -> dict[str, Any]:
    """``.h5mount/stats.json`` once the daemon has counted every request the proxy
    received (no attempt is under way, no failed one waits to be retried), or
    after one storage timeout and a little more."""
    deadline = time.monotonic() + TIMEOUT + 5
    while True:
        figures: dict[str, Any] = json.loads((mp / ".h5mount/stats.json").read_bytes())
        s3 = figures["storage"]["s3"]
        if s3["requests"] + s3["retries"] == proxy.count() or time.monotonic() > deadline:
            return figures
        time.sleep(REUSE + 0.05)
