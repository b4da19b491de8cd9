"""What the chunk cache can hold for one reader, and the log line when it cannot.

Owns how the chunk cache's budget splits between the chunks readers use and
their readahead (``readahead_cap``: a quarter of it, at most
``mountd.io.readahead.CAP``), whether a reader's working set of chunks fits
beside that (``holds``), the smallest ``-o chunk_cache`` that would hold it
(``cache_for``), and the warning a mount logs once per dataset when it does
not (``warn_small``). A ``.npy`` reader's working set is one chunk row: each
of its requests is a band of whole rows crossing every chunk of that row.

Concurrency: stateless but for the log's memory of what it said
(``layouts.errors.first_report``), which is atomic.
"""

from __future__ import annotations

import logging

from layouts.errors import first_report
from mountd.config import format_size
from mountd.io import readahead

log = logging.getLogger(__name__)

MIB = 1 << 20


def readahead_cap(budget: int) -> int:
    """The largest readahead of decoded chunks a chunk cache of ``budget`` allows."""
    return min(readahead.CAP, budget // 4)


def holds(budget: int, need: int) -> bool:
    """Whether a chunk cache of ``budget`` holds ``need`` bytes of entries beside its readahead."""
    return need <= budget - readahead_cap(budget)


def cache_for(need: int) -> int:
    """The smallest chunk cache, in whole MiB, that ``holds`` ``need`` bytes."""
    budget = -(-need * 4 // 3 // MIB) * MIB
    if readahead_cap(budget) == readahead.CAP:
        budget = -(-(need + readahead.CAP) // MIB) * MIB
    while not holds(budget, need):
        budget += MIB
    return budget


def warn_small(where: str, configured: int, budget: int, count: int, need: int, *, band: int,
               held_budget: int) -> None:
    """Log, once per ``where`` (a dataset), that a chunk cache of ``budget``
    (``configured`` by the mount, maybe lowered by ``-o memory_limit``) cannot
    hold one chunk row of it: ``count`` chunks, ``need`` bytes in the cache; its
    band of C-order rows is ``band`` bytes, readers may hold ``held_budget``
    bytes of such bands in all."""
    if not first_report(f"chunk row over chunk_cache: {where}"):
        return
    if band <= held_budget:
        then = (f"reads its .npy sequentially by holding each chunk row apart from the cache "
                f"while the mount's {held_budget // MIB} MiB for such rows has room (open "
                f"files share it), and past that decodes each chunk again for every band of "
                f"rows")
    else:
        then = (f"decodes each chunk again for every band of rows a sequential read of its "
                f".npy asks for (a chunk row is more than the mount's {held_budget // MIB} MiB "
                f"for rows held apart from the cache)")
    if budget < configured:
        log.warning("chunk_cache=%s, lowered to %s while the daemon is over -o memory_limit, "
                    "is smaller than one chunk row of %s (%d chunks, %.0f MiB); the mount %s",
                    format_size(configured), format_size(budget), where, count, need / MIB,
                    then)
        return
    log.warning("chunk_cache=%s is smaller than one chunk row of %s (%d chunks, %.0f MiB); "
                "the mount %s; use -o chunk_cache=%s or more",
                format_size(budget), where, count, need / MIB, then,
                format_size(cache_for(need)))
