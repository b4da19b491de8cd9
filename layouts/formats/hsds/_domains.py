"""A domain's metadata a domain at a time: one listing per ``ttl``, and HSDS's summaries.

Owns ``DomainIndex``, which keeps for each schema v2 domain (by its root's
``uuid1``) a ``DomainState``: one listing of every key under ``db/<uuid1>/``
(``layouts.formats.hsds._listing``), made when a walk is coming, and what it proves:

- which objects exist, with each JSON key's validator and storage time (an
  object the listing does not hold is not there, with no request);
- every dataset's chunk names, so no dataset directory is listed on its own
  and one with no chunks costs nothing;
- which entries of HSDS's ``.summary.json`` stand for their objects' JSON
  (``layouts.formats.hsds._summary``): those objects are built from the summary with
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
metadata cache keeps it no longer than the listing proves it.

With ``records`` (``-o cache_dir``, remote stores), every listing is kept as
a record (``layouts.formats.hsds._listing.to_record``). The first time a mount needs
a domain, its record is looked up: one made less than ``ttl`` ago is the
state (its validators vouched for to the block cache, so the objects, the
summary and its ``.info.json`` are read from the disk cache with no request
at all); an older one says the domain was walked before, so it is listed
at once, in one listing, and the disk cache serves what did not change.

A domain of more than ``MAX_KEYS`` keys (chunks included), or whose listing
fails, has no state for ``ttl``: its objects are read and its datasets
listed one by one, as without an index. A summary that cannot be used is
logged once, at WARNING, with the reason, and the domain's objects are read
one by one. At most ``MAX_DOMAINS`` states holding ``MAX_KEPT_KEYS`` keys
together are kept; past either, the one used longest ago goes. ``drop``
(SIGHUP) forgets every state.

Concurrency: one listing per domain at a time, under a ``trio.Event``; the
dictionaries change only in sections without an ``await``, and a state is
replaced whole. ``.info.json`` and the summary are parsed and checked in a
worker thread: the checks let the trio loop run between them, though the
parse itself holds the interpreter (about a second for the 50 MB summary of
a 100,000-object domain, half a second for its 18 MB ``.info.json``). The
summary is not fetched where ``.info.json`` shows that no listed object is
older than the scan, and while that ``.info.json`` is unchanged and its scan
still older than every listed object, later listings fetch neither. A
listing under way at a ``drop`` still answers the tasks waiting on it, but
is not kept.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from layouts.errors import Corrupt, LayoutError, NotFound, first_report
from layouts.formats.hsds import _summary
from layouts.formats.hsds._listing import (
    INFO_NAME,
    SUMMARY_NAME,
    DomainListing,
    from_record,
    list_domain,
    root_prefix,
    sort_keys,
    to_record,
)
from layouts.model import AnyObject
from layouts.places import Records
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


@dataclass(frozen=True, slots=True)
class KeptSummary:
    """A summary parsed once: the validators of ``.summary.json`` and of its
    ``.info.json``, the ids it holds, and the cutoff its scan gave."""

    etag: str
    info_etag: str
    ids: frozenset[str]
    cutoff: float


@dataclass(slots=True)
class DomainState:
    """What one listing of a domain proves, and what was built from it."""

    #: When the listing began (the index's clock).
    started: float
    listing: DomainListing
    #: Trusted summary entries not built yet (their JSON text), by object id.
    docs: dict[str, str]
    #: Objects built while this state or one before it was current, by id:
    #: (the validator of the JSON they were built from, the object).
    built: dict[str, tuple[str, AnyObject]] = field(default_factory=dict)
    #: The summary the entries came from.
    summary: KeptSummary | None = None
    #: The validator of the ``.info.json`` read last, and the cutoff it gave,
    #: when its scan is older than every listed object: while it is unchanged and
    #: still older, the next listing has nothing to fetch it or the summary for.
    scanned: tuple[str, float] | None = None


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
    #: Whether the record an earlier mount kept was looked for.
    restored: bool = False


class DomainIndex:
    """The ``DomainState`` of each domain of one store, one listing per ``ttl``."""

    def __init__(self, store: Store, ttl: float, *, eager: bool,
                 records: Records | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._store = store
        self._ttl = ttl
        self._eager = eager
        self._records = records if records is not None and records.keeps(store) else None
        self._clock = clock
        self._wall = wall
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
        if not slot.restored and self._records is not None:
            state = await self._load(uuid1, slot, self._clock(), restore=True)
            if state is not None or slot.failed or self._slots.get(uuid1) is not slot:
                return state
        now = self._clock()
        if slot.failed and now - slot.tried < self._ttl:
            return None
        slot.reads += wanted
        if slot.reads < LIST_AFTER and not (chunks and self._eager):
            return None
        return await self._load(uuid1, slot, now)

    async def _load(self, uuid1: str, slot: _Slot, now: float, *,
                    restore: bool = False) -> DomainState | None:
        """A new state, from a listing made now or (``restore``) from the record an
        earlier mount kept; None when a listing gives none, or there is no record."""
        loading = slot.loading = _Listing()
        state = None
        try:
            if restore:
                slot.restored = True
                state = await self._restored(uuid1, slot, now)
            else:
                state = await self._listed(uuid1, slot, now)
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
        if state is not None or slot.tried == now:
            slot.state, slot.failed, slot.reads = state, state is None, 0
        self._trim()
        return state

    async def _restored(self, uuid1: str, slot: _Slot, now: float) -> DomainState | None:
        """The state an earlier mount's record gives: the record itself while it is
        younger than ``ttl``, else a listing made now; None without a record."""
        assert self._records is not None
        raw = await self._records.load(self._store, _record_name(uuid1))
        found = None if raw is None else from_record(uuid1, raw)
        if found is None:
            return None
        keys, listed_at = found
        age = self._wall() - listed_at
        if not 0 <= age < self._ttl:
            log.debug("%s was listed %.0f s ago by an earlier mount: listing it again",
                      root_prefix(uuid1), age)
            return await self._listed(uuid1, slot, now)
        await self._records.vouch(self._store, keys, age)
        return await self._stated(uuid1, sort_keys(uuid1, keys), None, now - age)

    async def _listed(self, uuid1: str, slot: _Slot, now: float) -> DomainState | None:
        """A new state from a listing made now (kept as a record, with ``records``)."""
        slot.tried = now
        self.listings += 1
        listed_at = self._wall()
        keys = await list_domain(self._store, uuid1, MAX_KEYS)
        if keys is None:
            log.debug("%s has more than %d keys: its objects are read one by one",
                      root_prefix(uuid1), MAX_KEYS)
            return None
        if self._records is not None:
            await self._records.save(self._store, _record_name(uuid1),
                                     to_record(uuid1, keys, listed_at))
        return await self._stated(uuid1, sort_keys(uuid1, keys), slot.state, now)

    async def _stated(self, uuid1: str, listing: DomainListing, previous: DomainState | None,
                      started: float) -> DomainState:
        """The state ``listing`` (begun at ``started``) proves: what ``previous`` built
        and the summary it parsed are kept where the listing shows them unchanged,
        and the summary's entries are trusted where it covers the domain."""
        objects = listing.objects
        built: dict[str, tuple[str, AnyObject]] = {}
        if previous is not None:
            for obj_id, (etag, obj) in previous.built.items():
                found = objects.get(obj_id)
                if found is not None and found.etag == etag:
                    built[obj_id] = (etag, obj)
        state = DomainState(started, listing, {}, built)
        if listing.summary is None or listing.info is None or len(built) == len(objects):
            return state
        kept = previous.summary if previous is not None else None
        scanned = previous.scanned if previous is not None else None
        if kept is not None and (kept.etag, kept.info_etag) == (listing.summary.etag,
                                                                 listing.info.etag):
            docs: Mapping[str, str | None] | None = previous.docs if previous else {}
            summary: KeptSummary | None = kept
        elif scanned is not None and scanned[0] == listing.info.etag and \
                not _summary.covers_any(listing, scanned[1]):
            state.scanned = scanned
            return state
        else:
            docs, summary = await self._summary(uuid1, listing, state)
        if docs is None or summary is None:
            return state
        try:
            _summary.check_cover(root_prefix(uuid1) + SUMMARY_NAME, listing, summary.ids,
                                     summary.cutoff)
        except Corrupt as exc:
            self._fallback(exc)
            return state
        state.docs = _summary.trusted(listing, docs, summary.cutoff)
        for obj_id in built:
            state.docs.pop(obj_id, None)
        state.summary = summary
        return state

    async def _summary(self, uuid1: str, listing: DomainListing, state: DomainState
                       ) -> tuple[dict[str, str | None] | None, KeptSummary | None]:
        """The entries of the domain's summary and what identifies it, fetched and
        parsed now; (None, None) when it cannot be used (logged once). A scan older
        than every listed object is noted in ``state.scanned``."""
        prefix = root_prefix(uuid1)
        self.summaries += 1
        try:
            info = await fetch_capped(self._store, prefix + INFO_NAME, MAX_SUMMARY)
            cutoff = await trio.to_thread.run_sync(_summary.scan_cutoff, prefix + INFO_NAME, info)
            if not _summary.covers_any(listing, cutoff):
                state.scanned = (info.info.etag, cutoff)
                log.debug("%s: every object is newer than the last scan; its objects are "
                          "read one by one", prefix)
                return None, None
            fetched = await fetch_capped(self._store, prefix + SUMMARY_NAME, MAX_SUMMARY)
            docs = await trio.to_thread.run_sync(
                _summary.parse_summary, uuid1, prefix + SUMMARY_NAME, fetched, info.info.mtime)
        except NotFound:
            return None, None  # removed since the listing: no summary
        except Corrupt as exc:
            self._fallback(exc)
            return None, None
        return docs, KeptSummary(fetched.info.etag, info.info.etag, frozenset(docs), cutoff)

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


def _record_name(uuid1: str) -> str:
    """The name of the record of the domain's listing (``Records``)."""
    return f"{root_prefix(uuid1)}.h5mount-listing"
