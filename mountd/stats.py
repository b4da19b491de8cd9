"""The daemon's figures and settings as documents: JSON, and Prometheus text.

Owns the shape of the three documents an operator reads, in
``MOUNTPOINT/.h5mount/`` (``mountd.control``) and, for ``stats.json``, in
``-o stats_file`` on SIGUSR1 and at unmount:

- ``stats.json``: FUSE requests served by kind, error replies by errno,
  latency percentiles of reads and of metadata requests, open files, storage
  requests and bytes by kind of store with retries and failures, every
  cache's hits, misses, evictions and sizes, memory, uptime;
- ``config.json``: the effective mount settings, every string redacted
  (``mountd.logsafe.redact``: the secrets of URLs, and any string the log
  masks);
- ``metrics``: the counters of ``stats.json`` in the Prometheus text
  exposition format (version 0.0.4), for node_exporter's textfile collector.

Concurrency: a document is built from counters read with no ``await``, so it
is a consistent snapshot taken on the trio thread; ``write`` is a small
synchronous file write, made atomic by a rename so a reader never sees half
a document.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mountd import __version__, logsafe
from mountd.cache.bufpool import BufferPool
from mountd.cache.memlimit import MemoryLimit, resident_bytes
from mountd.cache.metacache import CachedCatalog
from mountd.config import MountConfig
from mountd.control import Control, ControlDir
from mountd.fuse_ops import Operations
from mountd.io.blockcache import BlockCache
from mountd.io.meter import STORES
from mountd.tree import Tree
from mountd.tree.h5view import IMAGE_BUDGET

log = logging.getLogger(__name__)

#: Prefix of every Prometheus metric name.
METRIC_PREFIX = "h5mount_"


@dataclass
class Reporter:
    """Everything the documents are read from, for one mount."""

    config: MountConfig
    ops: Operations
    tree: Tree
    catalog: CachedCatalog
    block_cache: BlockCache | None
    memory_limit: MemoryLimit | None = None
    #: POSIX time and monotonic time the daemon started serving.
    started: float = dataclasses.field(default_factory=time.time)
    started_monotonic: float = dataclasses.field(default_factory=time.monotonic)

    def figures(self) -> dict[str, Any]:
        """The ``stats.json`` document: a snapshot of every counter."""
        ops = self.ops
        return {
            "h5mount": {
                "version": __version__,
                "pid": os.getpid(),
                "source": logsafe.redact(self.config.source),
                "mountpoint": self.config.mountpoint,
                "started": datetime.datetime.fromtimestamp(self.started, datetime.UTC)
                                            .isoformat(timespec="seconds"),
                "uptime_seconds": round(time.monotonic() - self.started_monotonic, 3),
            },
            "requests": dict(sorted(ops.requests.items())),
            "errors": dict(sorted(ops.errors.items())),
            "failures": dict(sorted(ops.failures.items())),
            "latency": {kind: hist.figures() for kind, hist in ops.latency.items()},
            "open": {"files": ops.open_files, "dirs": ops.open_dirs,
                     "inodes": len(ops.inodes), "in_flight": ops.in_flight},
            "storage": {kind: meter.figures() for kind, meter in STORES.items()},
            "caches": self._caches(),
            "memory": _memory(self.memory_limit),
        }

    def _caches(self) -> dict[str, dict[str, int]]:
        catalog, memo, chunks = self.catalog, self.tree.memo, self.tree.chunk_cache
        held = self.tree.held
        caches = {
            "metadata": {"hits": catalog.hits, "misses": catalog.misses,
                         "evictions": catalog.evictions, "rearmed": catalog.rearmed,
                         "entries": len(catalog),
                         "max_entries": catalog.max_entries},
            "memo": {"hits": memo.hits, "misses": memo.misses, "evictions": memo.evictions,
                     "bytes": memo.used, "budget_bytes": memo.budget},
            "chunks": {"hits": chunks.hits, "misses": chunks.misses,
                       "evictions": chunks.evictions, "bytes": chunks.used,
                       "budget_bytes": chunks.budget, **_pool(chunks.pool),
                       "versions": self.tree.data_epochs.learnt,
                       "revalidated": self.tree.data_epochs.kept},
            "pages": {"hits": self.tree.pages_kept, "misses": self.tree.pages_dropped},
            # What open .npy files hold apart from the chunk cache: hits are reads
            # served from it, misses leases refused, evictions leases taken back.
            "row_bands": {"hits": held.hits, "misses": held.refused,
                          "evictions": held.reclaimed, "bytes": held.used,
                          "budget_bytes": held.budget, **_pool(held.pool)},
        }
        views = self.tree.h5views
        if views is not None:
            caches["h5view"] = {"plans": views.plans, "builds": views.builds,
                                "rearmed": views.renewed, "bytes": views.used,
                                "budget_bytes": IMAGE_BUDGET}
        blocks = self.block_cache
        if blocks is not None:
            caches["blocks"] = {**dataclasses.asdict(blocks.stats), "bytes": blocks.used,
                                "budget_bytes": blocks.budget, **_pool(blocks.pool)}
            if blocks.disk is not None:
                caches["disk"] = {**dataclasses.asdict(blocks.disk.stats),
                                  "bytes": blocks.disk.used, "budget_bytes": blocks.disk.size}
        return caches

    def settings(self) -> dict[str, Any]:
        """The ``config.json`` document: the effective settings, secrets redacted."""
        doc: dict[str, Any] = logsafe.redact_strings(dataclasses.asdict(self.config))
        doc["fuse_options"] = sorted(logsafe.redact_strings(list(self.config.fuse_options())))
        doc["version"] = __version__
        return doc

    def metrics(self) -> str:
        """The ``metrics`` document (Prometheus text format)."""
        return "".join(_exposition(self.figures()))

    def control_dir(self, clock: Callable[[], float] = time.monotonic) -> ControlDir:
        """The ``.h5mount/`` directory serving the three documents."""
        return ControlDir(Control({
            "stats.json": lambda: dumps(self.figures()),
            "config.json": lambda: dumps(self.settings()),
            "metrics": lambda: self.metrics().encode(),
        }, clock=clock))


def _pool(pool: BufferPool) -> dict[str, int]:
    """What a cache's buffer pool maps: every slot (``mapped_bytes``), those in use,
    kept by the cache or still held by a reader it let go of (``held_bytes``), and
    the most it mapped beyond the cache's budget at once (``over_budget_peak_bytes``)."""
    return {"mapped_bytes": pool.resident, "held_bytes": pool.in_use,
            "over_budget_peak_bytes": pool.peak_over}


def _memory(limit: MemoryLimit | None) -> dict[str, int]:
    """Resident memory now and at its peak, and what ``-o memory_limit`` lent: the
    limit (without the row bands held now), and the bytes of budgets lowered now
    and at most."""
    doc = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        doc["rss_bytes"] = resident_bytes()
    except (OSError, ValueError, IndexError):
        log.debug("no /proc/self/statm; current RSS not reported")
    if limit is not None:
        doc |= {"limit_bytes": limit.limit, "lent_bytes": limit.lent,
                "lent_peak_bytes": limit.peak_lent}
    return doc


def _exposition(doc: dict[str, Any]) -> Iterator[str]:
    """Prometheus text lines for the counters and gauges of ``doc``."""
    p = METRIC_PREFIX
    yield f"# HELP {p}uptime_seconds Seconds since the mount started serving.\n"
    yield f"# TYPE {p}uptime_seconds gauge\n"
    yield f"{p}uptime_seconds {doc['h5mount']['uptime_seconds']}\n"
    yield from _family(f"{p}fuse_requests_total", "counter", "FUSE requests served.",
                       [({"op": op}, n) for op, n in doc["requests"].items()])
    yield from _family(f"{p}fuse_errors_total", "counter", "FUSE error replies by errno.",
                       [({"errno": name}, n) for name, n in doc["errors"].items()])
    yield from _family(f"{p}fuse_open", "gauge", "Files, directories, inodes and requests "
                       "open now.", [({"what": what}, n) for what, n in doc["open"].items()])
    for kind, figures in doc["latency"].items():
        name = f"{p}fuse_{kind}_latency_seconds"
        yield f"# HELP {name} Time to serve FUSE {kind} requests.\n# TYPE {name} summary\n"
        yield from _latency(name, figures, {})
    storage = doc["storage"]
    for field in ("requests", "bytes", "retries", "failures", "not_found"):
        yield from _family(f"{p}storage_{field}_total", "counter",
                           f"Storage {field.replace('_', ' ')} by kind of store.",
                           [({"store": kind}, figures[field])
                            for kind, figures in storage.items()])
    name = f"{p}storage_latency_seconds"
    yield f"# HELP {name} Time of storage requests.\n# TYPE {name} summary\n"
    for kind, figures in storage.items():
        yield from _latency(name, figures["latency"], {"store": kind})
    caches = doc["caches"]
    names = sorted({field for figures in caches.values() for field in figures})
    for field in names:
        gauge = field in ("bytes", "budget_bytes", "entries", "max_entries", "mapped_bytes",
                          "held_bytes", "over_budget_peak_bytes")
        yield from _family(f"{p}cache_{field}" + ("" if gauge else "_total"),
                           "gauge" if gauge else "counter",
                           f"Cache {field.replace('_', ' ')}.",
                           [({"cache": cache}, figures[field])
                            for cache, figures in caches.items() if field in figures])
    yield from _family(f"{p}memory_bytes", "gauge", "Resident memory of the daemon.",
                       [({"what": what}, n) for what, n in doc["memory"].items()])


def _family(name: str, kind: str, text: str,
            samples: list[tuple[dict[str, str], float]]) -> Iterator[str]:
    if not samples:
        return
    yield f"# HELP {name} {text}\n# TYPE {name} {kind}\n"
    for labels, value in samples:
        yield f"{name}{_labels(labels)} {value}\n"


def _latency(name: str, figures: dict[str, float], labels: dict[str, str]) -> Iterator[str]:
    """The samples of a summary: quantiles in seconds, sum and count."""
    for key, value in figures.items():
        if key.startswith("p") and key.endswith("_ms"):
            quantile = int(key[1:-3]) / 100
            yield f"{name}{_labels({**labels, 'quantile': str(quantile)})} {value / 1e3:.6g}\n"
    yield f"{name}_sum{_labels(labels)} {figures['mean_ms'] * figures['count'] / 1e3:.6g}\n"
    yield f"{name}_count{_labels(labels)} {figures['count']}\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def dumps(doc: dict[str, Any]) -> bytes:
    """A document as the bytes of its JSON file."""
    return (json.dumps(doc, indent=2) + "\n").encode()


def write(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically; a failure is logged, never raised."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(dumps(doc))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write statistics to %s: %s", path, exc)
