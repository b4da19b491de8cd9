"""Data epochs: how long a dataset's decoded chunks and page caches stay current.

Owns ``DataEpochs``. The tree serves what it read from storage for one
``metadata_ttl`` period at most (docs/CONTRACT.md, "Consistency"); at the end
of a period, what is cached is checked against storage instead of thrown
away. For each dataset whose store can tell its version
(``ChunkStore.version``: its stored chunks' validators, with its shape and
what its bytes are decoded by, ``decoding``), the version is learnt once a period,
*before* any chunk of the dataset is read in that period. A period whose
version equals the one learnt before keeps that period's *data epoch*, the
first period of the run; any change starts a new one. Decoded chunks are
cached by data epoch and a file's pages are kept while its data epoch is
the same (``mountd.tree.core.Tree``), so unchanged data stays warm across
periods and a changed chunk is never served past the period that shows it.

Why learning the version first makes this safe: validators are never reused
(an etag with the storage time, a file's mtime with its size), so two equal
versions mean storage did not change between them, and every byte read in a
period was read after its version was learnt. On S3 the listing behind a
version also revalidates the block cache's copies of the chunks
(``BlockCache.vouch``), so no older copy is read after it. A dataset whose
store cannot tell (None), or whose version could not be learnt (an error), has
a data epoch of one period, as before.

Concurrency: one version is learnt per dataset and period; tasks that need it
meanwhile wait for that one (a ``trio.Event`` registered with no ``await``
between the check and the insert). ``known`` is synchronous. At most
``MAX_DATASETS`` datasets are remembered, the least recently used forgotten
first (a forgotten one starts a new data epoch: its caches go cold once).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass

import trio

from layouts.model import ChunkIndex, Dataset
from mountd.errors import MountError

log = logging.getLogger(__name__)

#: Datasets whose version is remembered.
MAX_DATASETS = 4096


def decoding(ds: Dataset) -> str:
    """What a dataset's stored chunks are decoded by, its shape aside: chunk
    shape, type, fill value and filters, spelt the same whichever JSON
    described them (an object's own JSON and HSDS's domain summary may order
    or annotate the same dataset differently)."""
    filters = json.dumps(ds.hdf5.get("filters"), sort_keys=True, default=repr)
    return repr((ds.chunks, repr(ds.type.sidecar), repr(ds.fill_value), filters))


def version_digest(ds: Dataset, stored: Mapping[ChunkIndex, Hashable]) -> bytes:
    """What ``ds``'s bytes derive from, its stored chunks' validators
    (``ChunkStore.version``) with its shape and ``decoding``, as a 128-bit
    digest (a version may list thousands of chunks; ``DataEpochs`` keeps one
    per dataset)."""
    described = (ds.shape, decoding(ds), sorted(stored.items()))
    return hashlib.blake2b(repr(described).encode("utf-8", "surrogateescape"),
                           digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class _Known:
    period: Hashable
    version: Hashable | None
    data_epoch: Hashable


class DataEpochs:
    """The data epoch of each dataset read lately, by the tree's dataset key."""

    def __init__(self, max_datasets: int = MAX_DATASETS) -> None:
        self.max_datasets = max_datasets
        #: Periods that kept the data epoch of the one before (counted for stats).
        self.kept = 0
        #: Versions learnt.
        self.learnt = 0
        self._known: OrderedDict[Hashable, _Known] = OrderedDict()
        self._learning: dict[tuple[Hashable, Hashable], trio.Event] = {}

    def known(self, key: Hashable, period: Hashable) -> Hashable | None:
        """The data epoch of ``key`` in ``period`` if already learnt, else None."""
        found = self._known.get(key)
        return found.data_epoch if found is not None and found.period == period else None

    def version(self, key: Hashable, period: Hashable) -> Hashable | None:
        """The version of ``key`` learnt in ``period`` (None if it is not learnt
        yet, or the store could not tell it)."""
        found = self._known.get(key)
        return found.version if found is not None and found.period == period else None

    async def data_epoch(self, key: Hashable, period: Hashable,
                         version: Callable[[], Awaitable[Hashable | None]]) -> Hashable:
        """The data epoch of ``key`` in ``period``, learning the period's ``version()``
        first if no task has yet."""
        while True:
            found = self.known(key, period)
            if found is not None:
                self._known.move_to_end(key)
                return found
            learning = self._learning.get((key, period))
            if learning is None:
                break
            await learning.wait()
            if self.known(key, period) is None:  # forgotten meanwhile: this period alone
                return period
        done = self._learning[(key, period)] = trio.Event()
        try:
            try:
                now: Hashable | None = await version()
            except MountError as exc:
                log.debug("version of %s not learnt (%s): its caches last this period", key, exc)
                now = None
            self.learnt += 1
            before = self._known.get(key)
            if now is not None and before is not None and before.version == now:
                data_epoch = before.data_epoch
                self.kept += 1
            else:
                data_epoch = period
            self._known[key] = _Known(period, now, data_epoch)
            self._known.move_to_end(key)
            while len(self._known) > self.max_datasets:
                self._known.popitem(last=False)
            return data_epoch
        finally:
            del self._learning[(key, period)]
            done.set()
