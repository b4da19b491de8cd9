"""What the daemon asked of storage, and how long requests took.

Owns two small measuring tools and the process-wide meters of storage:

- ``Latencies``: durations in a fixed log-scale histogram (``STEPS`` buckets
  per doubling, from 1 µs to about 70 minutes), so that counting one is a
  few arithmetic operations and percentiles are read from at most
  ``BUCKETS`` counters. A percentile is the upper bound of its bucket: at
  most 9% above the true value, never below it.
- ``StoreMeter``: the requests sent to one kind of storage (an S3 GET, HEAD
  or listing page, an HTTP request, a local file read), the bytes of object
  data they returned, the retries and the failures, and their latencies.
- ``measured``: one store operation awaited and counted in a meter (the
  retry loop of remote stores and the local store use it).
- ``STORES``: one meter per kind of storage (``local``, ``s3``, ``http``, and
  ``hsds`` for the requests to an HSDS service).
  They are process-wide, because a daemon serves one mount and every store
  of a kind feeds the same figures; the set of kinds is fixed, so they never
  grow.

Concurrency: counters change with no ``await`` in between; worker threads
never touch them (a local store counts on the trio thread, around its thread
hop). Readers take a snapshot with ``figures`` on the trio thread.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from layouts.storage import Fetched
from mountd.errors import MountError, NotFound

T = TypeVar("T")

#: Buckets per doubling of the duration.
STEPS = 8
#: Buckets in all: durations from 1 µs up to 2**32 µs (about 70 minutes).
BUCKETS = 32 * STEPS + 1
#: Percentiles reported by ``Latencies.figures``.
PERCENTILES = (50, 90, 99)


class Latencies:
    """Durations, counted in log-scale buckets."""

    __slots__ = ("count", "counts", "max", "total")

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        micro = seconds * 1e6
        index = 0 if micro <= 1.0 else min(BUCKETS - 1, math.ceil(math.log2(micro) * STEPS))
        self.counts[index] += 1
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    def percentile(self, pct: float) -> float:
        """Seconds that ``pct`` percent of the durations did not exceed (0 with none)."""
        if not self.count:
            return 0.0
        rank = math.ceil(self.count * pct / 100)
        seen = 0
        for index, n in enumerate(self.counts):
            seen += n
            if seen >= rank:
                return min(2 ** (index / STEPS) / 1e6, self.max)
        return self.max

    def figures(self) -> dict[str, float]:
        """Count, mean, percentiles and maximum, in milliseconds."""
        doc: dict[str, float] = {"count": self.count,
                                 "mean_ms": 1e3 * self.total / self.count if self.count else 0.0}
        for pct in PERCENTILES:
            doc[f"p{pct}_ms"] = 1e3 * self.percentile(pct)
        doc["max_ms"] = 1e3 * self.max
        return doc


@dataclass(slots=True)
class StoreMeter:
    """Requests to one kind of storage. ``requests`` counts operations (a retried
    GET is one), ``retries`` the attempts after the first, ``failures`` the
    operations that ended in an error other than "not found"."""

    requests: int = 0
    bytes: int = 0
    retries: int = 0
    failures: int = 0
    not_found: int = 0
    latency: Latencies = field(default_factory=Latencies)

    def returned(self, result: object) -> None:
        """Count the object data in ``result``, what a store operation returned."""
        if isinstance(result, Fetched):
            self.bytes += len(result.data)
        elif isinstance(result, bytes):
            self.bytes += len(result)

    def figures(self) -> dict[str, Any]:
        return {"requests": self.requests, "bytes": self.bytes, "retries": self.retries,
                "failures": self.failures, "not_found": self.not_found,
                "latency": self.latency.figures()}


async def measured(meter: StoreMeter, operation: Awaitable[T]) -> T:
    """``await operation`` (one store operation), counted in ``meter``: once, with its
    outcome, the object data it returned and its time."""
    meter.requests += 1
    start = trio.current_time()
    try:
        result = await operation
    except NotFound:
        meter.not_found += 1
        raise
    except MountError:
        meter.failures += 1
        raise
    finally:
        meter.latency.add(trio.current_time() - start)
    meter.returned(result)
    return result


#: The meters of the process, by kind of storage.
STORES: dict[str, StoreMeter] = {kind: StoreMeter() for kind in ("local", "s3", "http", "hsds")}
