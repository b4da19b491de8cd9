"""HSDS object ids and the storage keys they map to.

Owns the pure string rules of an HSDS bucket, as ``h5json/objid.py`` in the
installed ``h5json`` package (which HSDS 1.0.2 uses) and, for partitions,
``hsds/util/chunkUtil.py`` define them:

* schema v2 ids ``g-8hex-8hex-4hex-6hex-6hex`` live under ``db/<uuid1>/``; the
  root group of a domain is ``db/<uuid1>/.group.json``, other objects are
  ``db/<uuid1>/g|d|t/<uuid2>/.group.json|.dataset.json|.datatype.json``;
* schema v1 ids (a plain UUID after the ``g-``/``d-``/``t-`` prefix) are the
  key ``md5(id)[:5] + "-" + id`` at the top of the bucket;
* chunk keys, with the optional ``p<P>/`` partition directory.

Everything here is pure and synchronous; no I/O, no shared state.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from layouts.model import ObjectKind, ObjectRef

#: Primes HSDS multiplies chunk indices by to pick a partition (chunkUtil.PRIMES).
PARTITION_PRIMES = (29, 31, 37, 41, 43, 47, 53, 59, 61, 67)

_V2_ID = re.compile(
    r"^([gdt])-([0-9a-f]{8})-([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{6})-([0-9a-f]{6})$")
_V1_ID = re.compile(r"^([gdt])-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_COLLECTIONS = {"groups": "g", "datasets": "d", "datatypes": "t"}
_KINDS = {"g": ObjectKind.GROUP, "d": ObjectKind.DATASET, "t": ObjectKind.DATATYPE}
_JSON_NAMES = {"g": ".group.json", "d": ".dataset.json", "t": ".datatype.json"}


class BadId(ValueError):
    """A string is not an HSDS object id."""


@dataclass(frozen=True, slots=True)
class HsdsId:
    """A parsed object id. ``uuid1``/``uuid2`` are set for schema v2 ids only."""

    id: str
    prefix: str  # "g", "d" or "t"
    uuid1: str | None = None
    uuid2: str | None = None

    @property
    def kind(self) -> ObjectKind:
        return _KINDS[self.prefix]

    @property
    def is_v2(self) -> bool:
        return self.uuid1 is not None

    @property
    def is_root(self) -> bool:
        """True for the root group id of a schema v2 domain (hex rotated by 8)."""
        if self.uuid1 is None or self.uuid2 is None or self.prefix != "g":
            return False
        first = self.uuid1.replace("-", "")
        last = self.uuid2.replace("-", "")
        return all(f"{(int(a, 16) + 8) % 16:x}" == b for a, b in zip(first, last, strict=True))

    def json_key(self) -> str:
        """Key of the object's JSON document."""
        if self.uuid1 is None:
            return v1_key(self.id)
        if self.is_root:
            return f"db/{self.uuid1}/.group.json"
        return f"db/{self.uuid1}/{self.prefix}/{self.uuid2}/{_JSON_NAMES[self.prefix]}"

    def chunk_dir(self) -> str:
        """Prefix (ending in ``/``) under which a v2 dataset's chunks live."""
        if self.uuid1 is None or self.prefix != "d":
            raise BadId(f"{self.id} has no chunk directory")
        return f"db/{self.uuid1}/d/{self.uuid2}/"


def root_id(uuid1: str) -> str:
    """The id of the root group of the schema v2 domain whose objects live
    under ``db/<uuid1>/``: its ``uuid2`` is ``uuid1``'s hex digits each plus 8."""
    digits = "".join(f"{(int(c, 16) + 8) % 16:x}" for c in uuid1.replace("-", ""))
    return f"g-{uuid1}-{digits[:4]}-{digits[4:10]}-{digits[10:]}"


def normalize_id(text: str) -> str:
    """``groups/<uuid>`` and ``datasets/d-...`` (older reference forms) to ``g-...``/``d-...``."""
    if "/" in text:
        collection, _, tail = text.partition("/")
        prefix = _COLLECTIONS.get(collection)
        if prefix is None:
            raise BadId(f"not an object id: {text!r}")
        return tail if tail[:2] == f"{prefix}-" else f"{prefix}-{tail}"
    return text


def stored_ref(value: Any) -> ObjectRef | None:
    """The object an element of a reference dataset's chunk names: HSDS keeps
    the target's id as text, NUL-padded; None if it is empty or not an id."""
    text = bytes(value).rstrip(b"\0").decode("ascii", "replace") \
        if isinstance(value, bytes | np.bytes_) else str(value or "")
    if not text:
        return None
    try:
        return ObjectRef(obj_id=normalize_id(text))
    except BadId:
        return None


def parse_id(text: str) -> HsdsId:
    """Parse a schema v1 or v2 id (after ``normalize_id``); raise BadId otherwise."""
    m = _V2_ID.fullmatch(text)
    if m:
        prefix, a, b, c, d, e = m.groups()
        # The root's uuid is the same for every object of a domain: one string.
        return HsdsId(text, prefix, sys.intern(f"{a}-{b}"), f"{c}-{d}-{e}")
    m = _V1_ID.fullmatch(text)
    if m:
        return HsdsId(text, m.group(1))
    raise BadId(f"not an HSDS object id: {text!r}")


def id_kind(text: str) -> ObjectKind | None:
    """What kind of object the id ``text`` (after ``normalize_id``) names, or None
    if it is not an id: ``parse_id`` without building an ``HsdsId``, for the
    hard links of a group, which may be a million."""
    if _V2_ID.fullmatch(text) or _V1_ID.fullmatch(text):
        return _KINDS[text[0]]
    return None


def v1_key(obj_id: str) -> str:
    """Schema v1 storage key: five hex chars of the id's MD5, a dash, the id."""
    return f"{hashlib.md5(obj_id.encode()).hexdigest()[:5]}-{obj_id}"


def partition_of(index: Sequence[int], partition_count: int) -> int:
    """The ``p<P>`` directory number HSDS uses for a chunk (chunkUtil.getPartitionKey)."""
    total = sum(i * PARTITION_PRIMES[dim % len(PARTITION_PRIMES)] for dim, i in enumerate(index))
    return total % partition_count


def chunk_name(index: Sequence[int]) -> str:
    """``i_j_k`` as HSDS names chunk objects."""
    return "_".join(str(i) for i in index)


def parse_chunk_name(name: str, rank: int) -> tuple[int, ...] | None:
    """The index a chunk object name stands for, or None if it is not one.

    Only the canonical spelling (no signs, no leading zeros) is accepted, so a
    parsed index always maps back to the same key.
    """
    parts = name.split("_")
    if len(parts) != rank:
        return None
    index: list[int] = []
    for part in parts:
        if not part.isascii() or not part.isdigit() or (len(part) > 1 and part[0] == "0"):
            return None
        index.append(int(part))
    return tuple(index)
