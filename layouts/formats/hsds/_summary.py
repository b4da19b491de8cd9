"""HSDS's domain summaries, trusted only for the objects a listing proves current.

Owns the rules that decide which entries of ``db/<uuid1>/.summary.json`` may
stand in for reading each object's own JSON. Some seconds after a write, an
HSDS data node scans a domain: it notes ``scan_start`` (its own clock), lists
every key under the root prefix, writes ``.info.json`` (``scan_start``,
``scan_complete``...), then reads every object again and writes
``.summary.json``, mapping each object id to its JSON less ``id``, ``root``
and the times. Nothing stops a write landing during or after the scan, and
HSDS's own service node hands the summary out without checking, so here a
summary is trusted only where storage proves it:

- ``.info.json`` holds numbers ``scan_start <= scan_complete``, and
  ``.summary.json`` was written no earlier than it (storage times: an older
  summary beside a newer ``.info.json`` belongs to an earlier scan), and holds
  only entries of objects of this root (``scan_cutoff``, ``parse_summary``);
  a summary is not fetched at all where no object is older than the cutoff
  (``covers_any``);
- ``cutoff`` is ``scan_start`` in storage's clock, less ``MARGIN`` seconds
  for clock skew and one-second storage times: HSDS writes ``.info.json``
  right after ``scan_complete``, so when its clock runs ahead of storage's,
  ``scan_complete`` minus the file's storage time measures by how much, and
  the cutoff moves back by that;
- every id of the summary is an object of this root (``uuid1``) that the
  listing holds, and every object the listing holds that was written before
  the cutoff is in the summary; a summary that fails either is damaged, from
  another root, or incomplete, and none of it is used (``check_cover``);
- then exactly the entries of objects last written before the cutoff are
  trusted (``trusted``); an object written since (or during) the scan is read
  on its own.
  A dataset entry without ``creationProperties.layout`` is not trusted either
  (older servers kept the layout at the top level, which summaries leave out).

Every refusal is a ``Corrupt`` naming the summary key and saying why, for the
one log line of the fallback. Pure functions; safe in a worker thread.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from layouts.errors import Corrupt
from layouts.formats.hsds import _ids
from layouts.formats.hsds._listing import DomainListing
from layouts.storage import Fetched

#: Seconds allowed for clock skew between HSDS and storage, and for storage
#: times kept to the second: objects written this long before the scan began
#: are read on their own too.
MARGIN = 5.0
#: Ids named in a refusal's message.
_NAMED = 3


#: The members of ``.info.json`` the cutoff is read from.
_SCAN_TIMES = ("scan_start", "scan_complete")


def _scan_times_only(pairs: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """``object_pairs_hook`` for ``.info.json``: an object is kept only if it names
    a scan time. The others (a figure per dataset: 18 MB for 100,000) are dropped
    as each is parsed, where parsing the file whole held 80 MiB at once."""
    for name, _ in pairs:
        if name in _SCAN_TIMES:
            return dict(pairs)
    return None


def scan_cutoff(key: str, info: Fetched) -> float:
    """The storage time before which objects are covered by the scan that wrote
    ``.info.json`` (``info``, fetched with its storage time)."""
    try:
        doc = json.loads(info.data, object_pairs_hook=_scan_times_only)
    except (ValueError, RecursionError) as exc:
        raise Corrupt(key, f"not valid JSON: {exc}") from exc
    if doc is None:
        doc = {}  # an object naming no scan time
    if not isinstance(doc, dict):
        raise Corrupt(key, "not a JSON object")
    start, complete = doc.get("scan_start"), doc.get("scan_complete")
    if not _is_time(start) or not _is_time(complete) or start > complete:
        raise Corrupt(key, f"no usable scan_start and scan_complete ({start!r}, {complete!r})")
    ahead = max(0.0, float(complete) - info.info.mtime)
    return float(start) - ahead - MARGIN


def parse_summary(uuid1: str, key: str, summary: Fetched,
                  info_mtime: float) -> dict[str, str | None]:
    """``.summary.json`` (at ``key``, as fetched) as a dict of object id to the
    JSON text of its entry, or None for a dataset entry that does not hold its
    layout (named by the summary, never to stand in for the object).

    Entries are kept as text, each parsed again when its object is built: a
    summary of 100,000 objects (52 MB) kept as parsed dicts held 255 MiB, as
    text 68 MiB, and parsing one entry again costs about 3 microseconds.

    ``info_mtime`` is the storage time of the ``.info.json`` that gave the
    cutoff. Raises ``Corrupt`` when the summary is older than it, not JSON,
    or holds anything but entries of objects of this root (``uuid1``).
    """
    if summary.info.mtime < info_mtime:
        raise Corrupt(key, "older than .info.json: a scan is writing it")
    try:
        entries = _entry_texts(summary.data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise Corrupt(key, f"not valid JSON: {exc}") from exc
    if entries is None:
        raise Corrupt(key, "not a JSON object")
    foreign = [k for k, entry in entries.items()
               if not _of_root(k, uuid1) or not isinstance(entry, tuple)]
    if foreign:
        raise Corrupt(key, f"holds {len(foreign)} entries that are not objects of this "
                           f"domain: {', '.join(map(repr, foreign[:_NAMED]))}")
    return {k: text if complete else None for k, (text, complete) in entries.items()}


_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(text: str, at: int) -> int:
    """The index of the first character at or after ``at`` that is not JSON space."""
    space = _SPACE.match(text, at)
    return space.end() if space else at


def _entry_texts(text: str) -> dict[str, tuple[str, bool] | None] | None:
    """The members of the JSON object ``text``, each as (its value's text, whether
    it may stand in for its object: ``_complete``), or None where the value is
    not an object; None if ``text`` is not a JSON object. Each value is decoded
    once to be checked and then dropped, so only one entry's objects are alive
    at a time. Raises ``ValueError`` if ``text`` is not JSON."""
    at = _skip(text, 0)
    if not text.startswith("{", at):
        _DECODER.decode(text)  # raises if it is not JSON at all
        return None
    members: dict[str, tuple[str, bool] | None] = {}
    at = _skip(text, at + 1)
    closed = text.startswith("}", at)
    while not closed:
        name, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at)
        if not isinstance(name, str) or not text.startswith(":", at):
            raise ValueError(f"expected a member name and ':' at {at}")
        start = _skip(text, at + 1)
        value, at = _DECODER.raw_decode(text, start)
        members[name] = ((text[start:at], _complete(name, value))
                         if isinstance(value, dict) else None)
        at = _skip(text, at)
        closed = text.startswith("}", at)
        if not closed:
            if not text.startswith(",", at):
                raise ValueError(f"expected ',' or '}}' at {at}")
            at = _skip(text, at + 1)
    at += 1
    if _skip(text, at) != len(text):
        raise ValueError(f"extra data at {at}")
    return members


def covers_any(listing: DomainListing, cutoff: float) -> bool:
    """Whether the listing holds an object written before ``cutoff``: if not, the
    summary can stand in for none, and is not worth fetching (a copy of the
    domain newer than its last scan)."""
    return any(found.mtime < cutoff for found in listing.objects.values())


def check_cover(key: str, listing: DomainListing, ids: Collection[str], cutoff: float) -> None:
    """Raise ``Corrupt`` unless the summary at ``key``, holding ``ids``, names only
    objects the listing holds and every object it holds from before ``cutoff``."""
    objects = listing.objects
    gone = [obj_id for obj_id in ids if obj_id not in objects]
    if gone:
        raise Corrupt(key, f"lists {len(gone)} objects that storage does not have: "
                           f"{', '.join(gone[:_NAMED])}")
    missed = [obj_id for obj_id, found in objects.items()
              if found.mtime < cutoff and obj_id not in ids]
    if missed:
        raise Corrupt(key, f"misses {len(missed)} objects stored before its scan: "
                           f"{', '.join(missed[:_NAMED])}")


def trusted(listing: DomainListing, entries: Mapping[str, str | None],
            cutoff: float) -> dict[str, str]:
    """The entries (of a summary ``check_cover`` accepted) that stand for their
    objects' JSON: those of objects last written before ``cutoff``."""
    objects = listing.objects
    return {obj_id: entry for obj_id, entry in entries.items()
            if entry is not None and obj_id in objects and objects[obj_id].mtime < cutoff}


def _is_time(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value))


def _of_root(obj_id: Any, uuid1: str) -> bool:
    return (isinstance(obj_id, str) and _ids.id_kind(obj_id) is not None
            and obj_id[2:2 + len(uuid1)] == uuid1 and len(obj_id) > 2 + len(uuid1))


def _complete(obj_id: str, entry: Mapping[str, Any]) -> bool:
    """False for a dataset entry that does not hold its layout."""
    if not obj_id.startswith("d"):
        return True
    cprops = entry.get("creationProperties")
    return isinstance(cprops, Mapping) and isinstance(cprops.get("layout"), Mapping)
