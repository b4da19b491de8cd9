"""The garbage collector's policy for a daemon whose heap is mostly its caches.

Owns ``tune_gc`` and ``Freezer``. Nearly every object the daemon keeps is
held by a cache (model objects, nodes, memoised rows and sizes) until it is
evicted, and is freed then by its reference count: a full collection after
a walk of a 10,000-object domain found no cyclic garbage among the 600,000
objects it scanned. Yet CPython's generational collector scans each of them
again in every collection of an older generation; a walk of 100,000 objects
spent 21 of its 60 CPU-seconds in the collector, 17 of them in collections
of the middle and oldest generations.

So every object that survives a collection is moved to the permanent
generation (``gc.freeze``, which splices lists: no object is visited), and
later collections scan only what was allocated since. Cyclic garbage among
frozen objects is still collected: once the daemon has frozen as many
collections' survivors as it had when the last full collection ran (so
roughly whenever its heap may have doubled), it unfreezes everything and
freezes nothing more until CPython's own rule has run a full collection.
The cost of full collections stays proportional to the heap's growth, as
CPython's own 25% rule keeps it, without the repeated middle-generation
scans.

Concurrency: the collector calls ``Freezer.__call__`` in whichever thread
triggered a collection, with the GIL held and no collection under way; its
state is plain integers changed only there.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

log = logging.getLogger(__name__)

#: Container allocations between young-generation collections (CPython's default
#: is 700). The daemon allocates tens of thousands of objects per group it
#: lists, nearly all of them kept in caches; at the default, collecting them
#: again and again cost a fifth of a wide listing's CPU.
GC_YOUNG_THRESHOLD = 50_000
#: Collections whose survivors are frozen before the first full collection.
FIRST_THAW = 32


class Freezer:
    """A ``gc.callbacks`` entry: freeze the survivors of each collection, and
    thaw everything after ``FIRST_THAW`` frozen collections, then after twice
    as many as the time before, and so on (as many as all before it)."""

    def __init__(self) -> None:
        #: Collections whose survivors were frozen since the last full collection.
        self.frozen = 0
        #: How many more before the next thaw.
        self.thaw_after = FIRST_THAW
        #: Whether everything is unfrozen, waiting for a full collection.
        self.thawed = False
        #: Thaws so far (for tests and logs).
        self.thaws = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop":
            return
        if self.thawed:
            if info["generation"] == 2:
                self.thawed = False
                gc.freeze()
            return
        gc.freeze()
        self.frozen += 1
        if self.frozen >= self.thaw_after:
            gc.unfreeze()
            self.thawed = True
            self.thaws += 1
            self.thaw_after *= 2
            self.frozen = 0
            log.debug("unfrozen for a full collection (%d so far)", self.thaws)


def tune_gc() -> None:
    """Collect young objects less often, and freeze what survives (``Freezer``)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    gc.callbacks.append(Freezer())
