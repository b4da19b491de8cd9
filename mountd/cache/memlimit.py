"""The mount's memory limit (``-o memory_limit``): resident memory kept under the caches' budgets.

Owns ``MemoryLimit``. Each cache keeps to its own budget, but some memory
grows with what the mount is asked for and no budget can charge it: the
model objects and nodes of the entries the kernel holds, a big group's
listing while it is made, what the allocator keeps after a burst. A
``find`` over 100,000 objects holds some 500 MiB of it. ``MemoryLimit``
samples the daemon's resident memory (``/proc/self/statm``) and, while it is
over ``limit``, lowers the budgets of the caches that lend (``Lender``), in
their order, each down to its floor, by what the process is over. The cut is
taken from what a cache holds, not from a budget it does not use, so it
frees what it says. A cache whose budget falls evicts at once, and its
buffer pool unmaps the slots it frees, so resident memory falls with the
cut. Once resident memory is ``SLACK`` below ``limit`` again, the room is
given back, the last cut first, up to each cache's own budget. Before the
caches lend, the C heap is asked to give its free pages back (``trim``:
glibc's ``malloc_trim``), at most once per ``TRIM_EVERY`` seconds; during a
walk of 100,000 objects one such call gave back 28 MiB in 7 ms.

So the caches give way to memory nothing else bounds, instead of the two
adding up: the data a mount keeps is what is left once its metadata is
held. Readers never fail for it; their chunks and blocks are kept for a
shorter time. When the limit is below what is held outside the caches,
every cache sits at its floor and the log says so once.

Concurrency: one trio task (``run``) samples every ``INTERVAL`` seconds
(every ``IDLE_INTERVAL`` while under half the limit, every ``NEAR_INTERVAL``
within ``SLACK`` of it or over it) and is the only writer
of the budgets it lends; each ``check`` is synchronous (no ``await``), so a
change is atomic with respect to the other trio tasks. Worker threads
(decoders) only take buffers from the pools, which lock for themselves; a
buffer mapped just before a limit falls is unmapped when it is given back.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from mountd.config import format_size

log = logging.getLogger(__name__)

#: How far below the limit resident memory must fall before room is given back:
#: enough that a cache growing into it does not at once cross the limit again.
SLACK = 64 << 20
#: Seconds between two samples of resident memory; between two while it is under
#: half the limit (an idle mount wakes once a second for it); and between two
#: while it is within ``SLACK`` of the limit or over it, where what grows between
#: two samples is what the limit lets past (a sample costs about 40 us of CPU).
INTERVAL = 0.2
IDLE_INTERVAL = 1.0
NEAR_INTERVAL = 0.05
#: Seconds between two tries to give the C heap's free pages back.
TRIM_EVERY = 10.0
#: What a mount may hold besides its caches' budgets before they lend, by default:
#: the interpreter with its libraries (about 90 MiB) and little more. Resident
#: memory rises past the limit between two samples: walk100k's walk during an
#: S3 stream, sampled every 0.2 s, peaked 8 and 33 MiB over a limit of the
#: budgets plus 128 MiB, so one run went past the budgets plus 150 MiB the
#: daemon is held to; with 96 MiB, 46 MiB over, and 18 MiB over once sampled
#: every ``NEAR_INTERVAL`` near the limit.
HEADROOM = 96 << 20


class Elastic(Protocol):
    """A cache whose budget may be lowered and raised while it serves."""

    @property
    def budget(self) -> int: ...

    @budget.setter
    def budget(self, budget: int) -> None: ...

    @property
    def used(self) -> int: ...


@dataclass(slots=True)
class Lender:
    """A cache that lends room: its own budget (``full``), and the least it keeps."""

    name: str
    cache: Elastic
    full: int
    floor: int


def resident_bytes() -> int:
    """The daemon's resident memory now."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class MemoryLimit:
    """Keeps resident memory under ``limit`` by lowering the lenders' budgets."""

    def __init__(self, limit: int, lenders: list[Lender], *,
                 besides: Callable[[], int] = lambda: 0,
                 rss: Callable[[], int] = resident_bytes, interval: float = INTERVAL,
                 trim: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.lenders = lenders
        #: Gives the C heap's free pages back to the system (glibc's ``malloc_trim``),
        #: tried before the caches lend, at most once per ``TRIM_EVERY`` seconds.
        self.trim = trim
        self._trimmed = -math.inf
        #: Bytes held now under budgets that do not lend (the chunk rows of open
        #: ``.npy`` files): the limit is that much higher while they are held.
        self.besides = besides
        self.rss = rss
        self.interval = interval
        #: Resident memory at the last sample.
        self.resident = 0
        #: Bytes the lenders' budgets are lowered by now, and the most at once.
        self.lent = 0
        self.peak_lent = 0
        self._warned = False

    def check(self) -> None:
        """Sample resident memory once and lend or give back room for it."""
        rss = self.resident = self.rss()
        limit = self.limit + self.besides()
        if rss > limit and self._trim_heap():
            before, rss = rss, self.rss()
            self.resident = rss
            log.debug("the C heap gave back %d MiB", (before - rss) >> 20)
        if rss > limit:
            self._lend(rss - limit)
        elif self.lent and rss < limit - SLACK:
            self._give_back(limit - SLACK - rss)

    def room(self, *, trim: bool = False) -> int:
        """Bytes resident memory may still grow by, sampled now: what is left
        under the limit, plus what the lenders hold above their floors (they
        give it up as memory grows). At or below 0, the limit holds no more.
        With ``trim``, the C heap first gives its free pages back (at most once
        per ``TRIM_EVERY`` seconds, as before lending): memory a burst freed (a
        summary parsed in a worker thread's arena) may stay resident until
        then, and is room all the same."""
        if trim:
            self._trim_heap()
        spare = sum(max(0, min(lender.cache.budget, lender.cache.used) - lender.floor)
                    for lender in self.lenders)
        return self.limit + self.besides() - self.rss() + spare

    def _trim_heap(self) -> bool:
        """Give the C heap's free pages back, unless that was done less than
        ``TRIM_EVERY`` seconds ago; True if it was done now."""
        if self.trim is None or time.monotonic() - self._trimmed < TRIM_EVERY:
            return False
        started = time.monotonic()
        self.trim()
        self._trimmed = time.monotonic()
        log.debug("the C heap was trimmed in %.3f s", self._trimmed - started)
        return True

    def _lend(self, over: int) -> None:
        """Lower budgets, in the lenders' order, until ``over`` bytes held are let go."""
        cut = 0
        for lender in self.lenders:
            if over <= 0:
                break
            cache = lender.cache
            held = min(cache.budget, cache.used)
            budget = max(lender.floor, held - over)
            if budget < cache.budget:
                over -= max(0, held - budget)
                cut += cache.budget - budget
                cache.budget = budget
        if not cut:
            if over > 0 and not self._warned:
                self._warned = True
                log.warning("resident memory %d MiB is over -o memory_limit=%s with every "
                            "cache at its floor: what is browsed holds the rest",
                            self.resident >> 20, format_size(self.limit))
            return
        first = not self.lent
        self._count()
        log.log(logging.INFO if first else logging.DEBUG,
                "resident memory %d MiB over -o memory_limit=%s: cache budgets lowered by "
                "%d MiB (%s)", self.resident >> 20, format_size(self.limit), self.lent >> 20,
                self._budgets())

    def _give_back(self, room: int) -> None:
        """Raise budgets, the last lender first, by ``room`` bytes in all."""
        for lender in reversed(self.lenders):
            cache = lender.cache
            more = min(room, lender.full - cache.budget)
            if more > 0:
                cache.budget += more
                room -= more
        self._count()
        log.debug("cache budgets raised: %s", self._budgets())

    def _count(self) -> None:
        self.lent = sum(lender.full - lender.cache.budget for lender in self.lenders)
        self.peak_lent = max(self.peak_lent, self.lent)

    def _budgets(self) -> str:
        return ", ".join(f"{lender.name} {lender.cache.budget >> 20} MiB"
                         for lender in self.lenders)

    async def run(self) -> None:
        """Check, then wait ``pause()`` seconds, until cancelled; where resident
        memory cannot be read, say so and stop (the caches keep their budgets)."""
        while True:
            try:
                self.check()
            except (OSError, ValueError, IndexError) as exc:
                log.warning("-o memory_limit is off: resident memory cannot be read (%s)", exc)
                return
            await trio.sleep(self.pause())

    def pause(self) -> float:
        """Seconds until the next sample, from how near the last one was to the limit."""
        limit = self.limit + self.besides()
        if self.resident < limit // 2:
            return max(self.interval, IDLE_INTERVAL)
        if self.resident > limit - SLACK:
            return min(self.interval, NEAR_INTERVAL)
        return self.interval
