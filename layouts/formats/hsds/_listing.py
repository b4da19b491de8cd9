"""One listing of an HSDS domain's keys, read as the domain's objects and chunks.

Owns ``DomainListing``, ``list_domain`` and ``sort_keys``: every key under
``db/<uuid1>/`` (a schema v2 domain's root prefix) listed at once
(``Store.list_tree``), and sorted into

- ``objects``: each object id whose JSON is stored, with that key's
  ``ObjectInfo`` (size, validator, last-modified time): the root group
  (``.group.json`` at the prefix), and ``g/``, ``d/``, ``t/`` objects;
- ``chunks``: the names under each dataset's chunk directory, by ``uuid2``
  (``0_1``, or ``p3/0_1`` for a partitioned dataset), in no order;
- ``info`` and ``summary``: HSDS's own domain summaries (``.info.json``,
  ``.summary.json``), when stored.

Keys of no known shape (an object key whose id is not a valid id, stray
files) are left out: they are nothing a link can reach. Only the object JSON
and summary keys are asked for their info, so a local bucket stats no chunk
file.

A listing is also kept across mounts as a record (``to_record``,
``from_record``: JSON of every key with its info, and when the listing was
made), so a remount can tell whether it is still current.

Pure functions and an immutable result, apart from the one ``list_tree``
call; safe from any task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from layouts.formats.hsds import _ids
from layouts.storage import ObjectInfo, Store

#: The version of ``to_record``'s layout; a record of another is not read.
RECORD_VERSION = 1
INFO_NAME = ".info.json"
SUMMARY_NAME = ".summary.json"
_ROOT_NAME = ".group.json"
_OBJECT_NAMES = {"g": ".group.json", "d": ".dataset.json", "t": ".datatype.json"}


@dataclass(frozen=True, slots=True)
class DomainListing:
    """What one listing of a domain's root prefix found."""

    objects: dict[str, ObjectInfo]
    chunks: dict[str, list[str]]
    info: ObjectInfo | None
    summary: ObjectInfo | None
    #: Keys listed, chunks included.
    keys: int


def root_prefix(uuid1: str) -> str:
    return f"db/{uuid1}/"


def wants_info(key: str) -> bool:
    """True for the keys whose ``ObjectInfo`` a domain listing needs: object JSON
    and summaries, whose names start with a dot; chunk names never do."""
    return key.rpartition("/")[2].startswith(".")


async def list_domain(store: Store, uuid1: str,
                      limit: int) -> list[tuple[str, ObjectInfo | None]] | None:
    """Every key of the domain whose root group's ``uuid1`` is given, with the
    infos a ``DomainListing`` needs (``sort_keys``); None when it holds more
    than ``limit`` keys."""
    return await store.list_tree(root_prefix(uuid1), wants_info, limit)


def sort_keys(uuid1: str, found: Iterable[tuple[str, ObjectInfo | None]]) -> DomainListing:
    """Sort the keys under ``db/<uuid1>/`` (with their infos) into a ``DomainListing``."""
    prefix = root_prefix(uuid1)
    skip = len(prefix)
    objects: dict[str, ObjectInfo] = {}
    chunks: dict[str, list[str]] = {}
    info: ObjectInfo | None = None
    summary: ObjectInfo | None = None
    count = 0
    for key, key_info in found:
        count += 1
        if not key.startswith(prefix):
            continue
        rest = key[skip:]
        if "/" not in rest:
            if key_info is None:
                continue
            if rest == _ROOT_NAME:
                objects[_ids.root_id(uuid1)] = key_info
            elif rest == INFO_NAME:
                info = key_info
            elif rest == SUMMARY_NAME:
                summary = key_info
            continue
        collection, _, tail = rest.partition("/")
        uuid2, sep, name = tail.partition("/")
        json_name = _OBJECT_NAMES.get(collection)
        if json_name is None or not sep or not name:
            continue
        if name == json_name:
            obj_id = f"{collection}-{uuid1}-{uuid2}"
            if key_info is not None and _ids.id_kind(obj_id) is not None:
                objects[obj_id] = key_info
        elif collection == "d" and not name.startswith("."):
            chunks.setdefault(uuid2, []).append(name)
    return DomainListing(objects, chunks, info, summary, count)


def to_record(uuid1: str, found: Sequence[tuple[str, ObjectInfo | None]],
              listed_at: float) -> bytes:
    """A listing of the domain (every key as ``Store.list_tree`` gave it), made at
    ``listed_at`` (seconds since the epoch), as a record."""
    return orjson.dumps({
        "version": RECORD_VERSION, "uuid1": uuid1, "listed_at": listed_at,
        "keys": [[key] if info is None else [key, info.size, info.etag, info.mtime]
                 for key, info in found]})


def from_record(uuid1: str, raw: bytes
                ) -> tuple[list[tuple[str, ObjectInfo | None]], float] | None:
    """The keys a record of the domain's listing holds and when it was made; None
    for a record of another version or domain, or one that does not parse."""
    try:
        doc = orjson.loads(raw)
        if doc["version"] != RECORD_VERSION or doc["uuid1"] != uuid1:
            return None
        found: list[tuple[str, ObjectInfo | None]] = [
            (str(item[0]), None if len(item) == 1 else
             ObjectInfo(int(item[1]), str(item[2]), float(item[3])))
            for item in doc["keys"]]
        return found, float(doc["listed_at"])
    except (ValueError, TypeError, KeyError, IndexError):
        return None
