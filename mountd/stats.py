"""The daemon's figures, written as JSON on request (``-o stats_file``).

Owns the shape of the statistics document and writing it: FUSE requests
served by kind (``Operations.requests``), inodes the kernel holds, the memo,
metadata and chunk caches' counters, the block cache's (remote sources), and
the process's peak resident memory. Benchmarks and tests read it to count
what the kernel asked for; an operator sends SIGUSR1 to get a fresh copy.

Concurrency: ``figures`` reads counters with no ``await`` (a consistent
snapshot on the trio thread); ``write`` is a small synchronous file write,
made atomic by a rename so a reader never sees half a document.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
from typing import Any

from mountd.fuse_ops import Operations
from mountd.io.blockcache import BlockCache
from mountd.tree import Tree

log = logging.getLogger(__name__)


def figures(ops: Operations, tree: Tree, block_cache: BlockCache | None) -> dict[str, Any]:
    """A snapshot of the daemon's counters."""
    doc: dict[str, Any] = {
        "requests": dict(sorted(ops.requests.items())),
        "inodes": len(ops.inodes),
        "memo": {"hits": tree.memo.hits, "misses": tree.memo.misses, "bytes": tree.memo.used},
        "chunk_cache": {"hits": tree.chunk_cache.hits, "misses": tree.chunk_cache.misses,
                        "bytes": tree.chunk_cache.used},
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if block_cache is not None:
        doc["block_cache"] = dataclasses.asdict(block_cache.stats)
    return doc


def write(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically; a failure is logged, never raised."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write statistics to %s: %s", path, exc)
