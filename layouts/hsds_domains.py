"""A domain's metadata a domain at a time: one listing per ``ttl``, and HSDS's summaries.

Owns ``DomainIndex``, which keeps for each schema v2 domain (by its root's
``uuid1``) a ``DomainState``: one listing of every key under ``db/<uuid1>/``
(``layouts.hsds_listing``), made when a walk is coming, and what it proves:

- which objects exist, with each JSON key's validator and storage time (an
  object the listing does not hold is not there, with no request);
- every dataset's chunk names, so no dataset directory is listed on its own
  and one with no chunks costs nothing;
- which entries of HSDS's ``.summary.json`` stand for their objects' JSON
  (``layouts.hsds_summary``): those objects are built from the summary with
  no request each; the rest are read one by one by the catalog;
- the objects built from the last state whose validator is unchanged
  (``built``), so when ``ttl`` runs out the next state is one listing, and
  the same object instances are handed out again for what did not change
  (the summary is not even fetched when nothing new needs it).

When a state is made (``state``): a listing is under way (its callers wait
for it), or the caller is about to read ``LIST_AFTER`` objects or more, or
has read that many one by one since the last listing, or (``eager``, object
stores, where each dataset's chunk listing is a round trip) a chunk listing
is asked for. Reading one object of a big domain therefore costs one
request, not a listing of the domain; a walk lists it once.

A state is used for ``ttl`` seconds from the start of its listing
(``metadata_ttl``); what is built from it is as old as it (``age``), so the
metadata cache keeps it no longer than the listing proves it. A domain of
more than ``MAX_KEYS`` keys (chunks included), or whose listing fails, has
no state for ``ttl``: its objects are read and its datasets listed one by
one, as without an index. A summary that cannot be used is logged once, at
WARNING, with the reason, and the domain's objects are read one by one.
At most ``MAX_DOMAINS`` states holding ``MAX_KEPT_KEYS`` keys together are
kept; past either, the one used longest ago goes. ``drop`` (SIGHUP) forgets
every state.

Concurrency: one listing per domain at a time, under a ``trio.Event``; the
dictionaries change only in sections without an ``await``, and a state is
replaced whole. The summary is parsed in a worker thread, so a big one does
not stall the trio loop. A listing under way at a ``drop`` still answers
the tasks waiting on it, but is not kept.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from layouts import hsds_summary
from layouts.errors import Corrupt, LayoutError, NotFound, first_report
from layouts.hsds_listing import INFO_NAME, SUMMARY_NAME, DomainListing, list_domain, root_prefix
from layouts.model import AnyObject
from layouts.storage import Store, fetch_capped

log = logging.getLogger(__name__)

#: Most keys listed for one domain (200 pages of an S3 listing).
MAX_KEYS = 200_000
#: Most domain states kept.
MAX_DOMAINS = 64
#: Most keys in all kept states together (two full listings).
MAX_KEPT_KEYS = 2 * MAX_KEYS
#: Objects about to be read, or read one by one since the last listing, that
#: make a listing of their domain worth it (an S3 listing page is 1,000 keys).
LIST_AFTER = 32
#: Largest ``.summary.json`` read (about 600,000 small objects); a larger one
#: is not used.
MAX_SUMMARY = 512 << 20


@dataclass(slots=True)
class DomainState:
    """What one listing of a domain proves, and what was built from it."""

    #: When the listing began (the index's clock).
    started: float
    listing: DomainListing
    #: Trusted summary entries not built yet, by object id.
    docs: dict[str, dict[str, Any]]
    #: Objects built while this state or one before it was current, by id:
    #: (the validator of the JSON they were built from, the object).
    built: dict[str, tuple[str, AnyObject]] = field(default_factory=dict)
    #: The summary the entries came from: its validator and that of its
    #: ``.info.json``, the ids it holds, and the cutoff it gave.
    summary: tuple[str, str, frozenset[str], float] | None = None


@dataclass(slots=True)
class _Listing:
    """A listing under way: ``done`` is set when it ends, with its ``state``."""

    done: trio.Event = field(default_factory=trio.Event)
    state: DomainState | None = None


@dataclass(slots=True)
class _Slot:
    """One domain's state, the listing under way, and the reads made without one."""

    state: DomainState | None = None
    loading: _Listing | None = None
    #: When the last listing began, and whether it gave no state (too many
    #: keys, or it failed): then none is tried again before ``ttl``.
    tried: float = float("-inf")
    failed: bool = False
    #: Objects read one by one since the last listing.
    reads: int = 0


class DomainIndex:
    """The ``DomainState`` of each domain of one store, one listing per ``ttl``."""

    def __init__(self, store: Store, ttl: float, *, eager: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._ttl = ttl
        self._eager = eager
        self._clock = clock
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        #: Listings made, and summaries fetched (for tests and the log).
        self.listings = 0
        self.summaries = 0

    def drop(self) -> None:
        """Forget every state now: the next walk of a domain lists it again."""
        self._slots.clear()

    def age(self, state: DomainState) -> float:
        """Seconds since ``state``'s listing began."""
        return self._clock() - state.started

    def fresh(self, uuid1: str) -> DomainState | None:
        """The domain's state if it is current (no I/O, no wait)."""
        slot = self._slots.get(uuid1)
        if slot is None or slot.state is None or slot.loading is not None:
            return None
        return slot.state if self.age(slot.state) < self._ttl else None

    async def state(self, uuid1: str, wanted: int, *, chunks: bool = False) -> DomainState | None:
        """The domain's current state, listing it now if worth it (see the module
        docstring): ``wanted`` objects are about to be read, or (``chunks``) a
        dataset's chunks are to be listed. None: read them one by one, and they
        are counted toward a listing."""
        slot = self._slots.get(uuid1)
        if slot is None:
            slot = self._slots[uuid1] = _Slot()
            self._trim()
        self._slots.move_to_end(uuid1)
        state = self.fresh(uuid1)
        if state is not None:
            return state
        if slot.loading is not None:
            loading = slot.loading
            await loading.done.wait()
            return loading.state
        now = self._clock()
        if slot.failed and now - slot.tried < self._ttl:
            return None
        slot.reads += wanted
        if slot.reads < LIST_AFTER and not (chunks and self._eager):
            return None
        return await self._load(uuid1, slot, now)

    async def _load(self, uuid1: str, slot: _Slot, now: float) -> DomainState | None:
        loading = slot.loading = _Listing()
        slot.tried = now
        state = None
        try:
            state = await self._listed(uuid1, slot.state, now)
        except LayoutError as exc:
            log.debug("listing %s failed (%s): its objects are read one by one",
                      root_prefix(uuid1), exc)
        finally:
            slot.loading = None
            loading.state = state
            loading.done.set()
        # No await from here to the end of the trim.
        if self._slots.get(uuid1) is not slot:  # dropped meanwhile: answer, keep nothing
            return state
        slot.state, slot.failed, slot.reads = state, state is None, 0
        self._trim()
        return state

    async def _listed(self, uuid1: str, previous: DomainState | None,
                      now: float) -> DomainState | None:
        """A new state from a listing made now; what ``previous`` built and the
        summary it parsed are kept where the listing shows them unchanged."""
        self.listings += 1
        listing = await list_domain(self._store, uuid1, MAX_KEYS)
        if listing is None:
            log.debug("%s has more than %d keys: its objects are read one by one",
                      root_prefix(uuid1), MAX_KEYS)
            return None
        objects = listing.objects
        built: dict[str, tuple[str, AnyObject]] = {}
        if previous is not None:
            for obj_id, (etag, obj) in previous.built.items():
                found = objects.get(obj_id)
                if found is not None and found.etag == etag:
                    built[obj_id] = (etag, obj)
        state = DomainState(now, listing, {}, built)
        if listing.summary is None or listing.info is None or len(built) == len(objects):
            return state
        kept = previous.summary if previous is not None else None
        if kept is not None and (kept[0], kept[1]) == (listing.summary.etag, listing.info.etag):
            docs: dict[str, dict[str, Any]] | None = previous.docs if previous else {}
            summary = kept
        else:
            docs, summary = await self._summary(uuid1, listing)
        if docs is None or summary is None:
            return state
        key = root_prefix(uuid1) + SUMMARY_NAME
        try:
            hsds_summary.check_cover(key, listing, summary[2], summary[3])
        except Corrupt as exc:
            self._fallback(exc)
            return state
        state.docs = hsds_summary.trusted(listing, docs, summary[3])
        for obj_id in built:
            state.docs.pop(obj_id, None)
        state.summary = summary
        return state

    async def _summary(self, uuid1: str, listing: DomainListing
                       ) -> tuple[dict[str, dict[str, Any]] | None,
                                  tuple[str, str, frozenset[str], float] | None]:
        """The entries of the domain's summary and what identifies it, fetched and
        parsed now; (None, None) when it cannot be used (logged once)."""
        prefix = root_prefix(uuid1)
        self.summaries += 1
        try:
            info = await fetch_capped(self._store, prefix + INFO_NAME, MAX_SUMMARY)
            cutoff = hsds_summary.scan_cutoff(prefix + INFO_NAME, info)
            fetched = await fetch_capped(self._store, prefix + SUMMARY_NAME, MAX_SUMMARY)
            docs = await trio.to_thread.run_sync(
                hsds_summary.parse_summary, uuid1, prefix + SUMMARY_NAME, fetched, info.info.mtime)
        except NotFound:
            return None, None  # removed since the listing: no summary
        except Corrupt as exc:
            self._fallback(exc)
            return None, None
        return docs, (fetched.info.etag, info.info.etag, frozenset(docs), cutoff)

    @staticmethod
    def _fallback(exc: Corrupt) -> None:
        if first_report(f"summary {exc.key}: {exc.reason}"):
            log.warning("not using %s: %s; the domain's objects are read one by one",
                        exc.key, exc.reason)

    def _trim(self) -> None:
        """Drop the domains used longest ago while there are more than ``MAX_DOMAINS``
        or their states hold more than ``MAX_KEPT_KEYS`` keys; never one being
        listed."""
        total = sum(s.state.listing.keys for s in self._slots.values() if s.state is not None)
        for uuid1, slot in list(self._slots.items()):
            if len(self._slots) <= MAX_DOMAINS and total <= MAX_KEPT_KEYS:
                break
            if slot.loading is None:
                del self._slots[uuid1]
                if slot.state is not None:
                    total -= slot.state.listing.keys

