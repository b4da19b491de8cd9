"""One listing of a domain's dataset keys, shared by all its datasets' chunk listings.

Owns ``DomainKeys``, used on object stores (S3), where every listing is a
round trip: instead of one LIST per dataset directory (a walk of a domain of
10,000 datasets sends 10,000, most of them to learn that a dataset has no
chunks), the first chunk listing in a domain lists every key under
``db/<uuid>/d/`` in pages of a thousand and files the chunk names by
dataset. Every other dataset of the domain is then listed from memory.

- A domain with more than ``MAX_KEYS`` dataset keys (chunks included) is not
  indexed: the listing stops there and its datasets are listed one by one,
  as without an index, so a domain of a million chunks costs at most
  ``MAX_KEYS / 1000`` extra pages once per ``ttl``.
- The index of a domain is used for ``ttl`` seconds (``-o metadata_ttl``)
  from the start of its listing, then made again: chunks written since show
  up as they would with per-dataset listings (MOUNT-SPEC.md, Consistency).
- A listing that fails (storage error) is not kept as an index: the datasets
  are listed one by one, which reports the error where it belongs.
- At most ``MAX_DOMAINS`` indexes holding at most ``MAX_KEPT_KEYS`` chunk
  names together are kept; past either, the index used longest ago goes
  (expired ones first), and its domain is listed again when next asked.

Local buckets do not use it: a directory listing there is one system call;
nor does a mount with ``metadata_ttl`` 0, where every listing would list the
whole domain again.

``drop`` forgets every index (the daemon's SIGHUP, through the catalog that
owns it, ``HsdsCatalog.drop``), so chunks written since show up at once. The
next chunk listing of a domain lists it again.

Concurrency: one listing per domain at a time; tasks that want the same
domain meanwhile wait for it (a ``trio.Event``). The dictionaries change only
in sections without an ``await``; a listing under way is never dropped for
room. A listing under way at a ``drop`` still answers the tasks already
waiting on it, but is not kept: the next asker lists the domain again.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from layouts.errors import LayoutError
from layouts.hsds_ids import HsdsId
from layouts.storage import Store

log = logging.getLogger(__name__)

#: Most keys listed for one domain's index (200 pages of an S3 listing).
MAX_KEYS = 200_000
#: Most domain indexes kept.
MAX_DOMAINS = 64
#: Most chunk names kept in all indexes together (two full indexes; a few tens of MB).
MAX_KEPT_KEYS = 2 * MAX_KEYS


@dataclass
class _Index:
    """The chunk names of one domain's datasets, by dataset (``uuid2``)."""

    started: float
    done: trio.Event = field(default_factory=trio.Event)
    #: None until done, and when the domain has too many keys or the listing failed.
    names: dict[str, list[str]] | None = None
    #: Chunk names in ``names``.
    count: int = 0


class DomainKeys:
    """The chunk names of every dataset of a domain, from one listing per ``ttl``."""

    def __init__(self, store: Store, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._ttl = ttl
        self._clock = clock
        #: The indexes by domain prefix, the one used longest ago first.
        self._domains: OrderedDict[str, _Index] = OrderedDict()
        #: Listings made (for tests and the log).
        self.listings = 0

    def drop(self) -> None:
        """Forget every index now: the next chunk listing of a domain lists it again."""
        self._domains.clear()

    async def chunk_names(self, dset: HsdsId) -> list[str] | None:
        """The names under the chunk directory of ``dset`` (``0_1``, or ``p3/0_1``
        for partitioned datasets), sub-prefixes left out; None when the domain is
        not indexed (too many keys, or the listing failed): list the dataset."""
        prefix = f"db/{dset.uuid1}/d/"
        index = self._domains.get(prefix)
        if index is None or self._expired(index):
            self._domains.pop(prefix, None)
            index = self._domains[prefix] = _Index(self._clock())
            try:
                index.names = await self._list(prefix)
            except BaseException:  # cancelled: the next asker lists again
                if self._domains.get(prefix) is index:
                    del self._domains[prefix]
                raise
            finally:
                index.done.set()
            # No await from here to the end of the trim.
            if index.names is not None:
                index.count = sum(map(len, index.names.values()))
            self._trim()
        else:
            self._domains.move_to_end(prefix)
            await index.done.wait()
        if index.names is None:
            return None
        return index.names.get(dset.uuid2 or "", [])

    def _expired(self, index: _Index) -> bool:
        return self._clock() - index.started >= self._ttl

    def _trim(self) -> None:
        """Drop expired indexes, then the ones used longest ago while there are more
        than ``MAX_DOMAINS`` or ``MAX_KEPT_KEYS`` names; never one being listed."""
        settled = [(p, i) for p, i in self._domains.items() if i.done.is_set()]
        for prefix, index in settled:
            if self._expired(index):
                del self._domains[prefix]
        total = sum(i.count for i in self._domains.values())
        for prefix, index in settled:
            if len(self._domains) <= MAX_DOMAINS and total <= MAX_KEPT_KEYS:
                break
            if self._domains.get(prefix) is index:
                del self._domains[prefix]
                total -= index.count

    async def _list(self, prefix: str) -> dict[str, list[str]] | None:
        self.listings += 1
        names: dict[str, list[str]] = {}
        count = 0
        keys = self._store.iter_keys(prefix)
        try:
            async for key in keys:
                count += 1
                if count > MAX_KEYS:
                    log.debug("%s has more than %d keys: its datasets are listed one by one",
                              prefix, MAX_KEYS)
                    return None
                dataset, sep, name = key[len(prefix):].partition("/")
                if sep and name and not name.startswith("."):
                    names.setdefault(dataset, []).append(name)
        except LayoutError as exc:
            log.debug("listing %s failed (%s): its datasets are listed one by one", prefix, exc)
            return None
        finally:
            close = getattr(keys, "aclose", None)
            if close is not None:
                await close()
        log.debug("%s: %d keys of %d datasets in one listing", prefix, count, len(names))
        return names
