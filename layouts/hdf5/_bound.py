"""The length of a skeleton's HDF5 file, known before the file is written.

Owns ``size_bound``: an upper bound on the bytes ``layouts.hdf5._image``
writes for a ``Skeleton``, computed from the plan alone, so that the size of
a ``D.h5`` view is known from the domain's metadata without running HDF5.
The image is then padded with zeros to that length (past HDF5's end of
file, which every HDF5 reader allows), and a file that would pass it keeps
fewer objects (``build_image``), so the length promised is the length served.

The bound follows the file's layout (``_image._write``: ``libver="earliest"``,
version 1 object headers, symbol-table groups, version 1 chunk B-trees,
paged file space in ``PAGE``-byte pages):

* the elements are counted as the library places them: a contiguous place
  or chunk of at least a page starts on a page and takes whole pages; the
  equal chunks of one dataset smaller than a page fill pages of their own
  in turn; other places smaller than a page share pages, each page but the
  last one more than ``PAGE - largest`` bytes full and more than half full;
* metadata (object headers, attribute messages, symbol tables and their
  heaps, chunk indexes, global heap collections) is counted message by
  message from the format's sizes, rounded up, and doubled: small metadata
  shares pages and headers grow by continuation, neither wasting more than
  the bytes used.

The tests hold it to the files actually written (``tests/test_h5bound.py``).

Concurrency: pure functions of an immutable plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from layouts.errors import FormatError
from layouts.hdf5._image import (
    LEFT_OUT_BYTES,
    LEFT_OUT_LINES,
    PAGE,
    AttrPlan,
    ObjPlan,
    Skeleton,
    Unsupported,
    infer,
    parsed_type,
    storage_chunks,
)
from layouts.hdf5._types import HType
from layouts.model import LinkKind, ObjectKind, chunk_grid

#: The superblock, its extension, the root group and the file's first pages.
_BASE = 6 * PAGE
#: Bytes of messages an object header holds when made (more need another chunk).
_HEADER = 256
#: One object header's prefix (version 1).
_PREFIX = 16
#: One message's header in a version 1 object header, and its alignment.
_MESSAGE = 8
#: A symbol table node (32 entries of 40 bytes), at least half full, and the
#: group B-tree node (K = 16) that points at up to 32 of them.
_SNOD = 8 + 32 * 40
_SNOD_LINKS = 16
_GROUP_NODE = 544
#: A new-style group (a UTF-8 name or an external link makes one): its fractal
#: heap and name index with no links.
_DENSE_GROUP = 4 * PAGE
#: Entries of a chunk B-tree node (2K, K = 32), kept at least half full.
_CHUNK_NODE_ENTRIES = 32
#: One object's header in a global heap collection; a collection's own header,
#: and the least a collection takes.
_HEAP_OBJECT = 16
_COLLECTION_HEADER = 32
_COLLECTION = PAGE


def _pad(n: int) -> int:
    return -(-n // _MESSAGE) * _MESSAGE


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _name(text: str) -> int:
    """A name with its NUL, padded."""
    return _pad(len(text.encode("utf-8", "surrogateescape")) + 1)


def _type_bytes(tj: Any) -> int:
    """Bytes of a datatype message (its header included) for type JSON ``tj``."""
    t = _parse(tj)
    if t is None:
        return 0  # not written
    opaque_tag = len(orjson.dumps(tj)) if t.cls == "opaque" or "opaque" in str(tj) else 0
    return _MESSAGE + _htype_bytes(t) + _pad(opaque_tag)


def _htype_bytes(t: HType) -> int:
    """Bytes of the datatype description of ``t`` (version 1 or 3 types)."""
    head = 8
    if t.cls in ("int", "float"):
        return head + 16
    if t.cls == "enum":
        base = t.dtype.itemsize if t.dtype is not None else 8
        return (head + 24 + sum(_name(name) + base for name in t.members)
                + 8 * len(t.members))
    if t.cls == "compound":
        return head + sum(_name(name) + 40 + _htype_bytes(ft) for name, ft in t.fields)
    if t.cls == "array" and t.base is not None:
        return head + 8 + 16 * len(t.dims) + _htype_bytes(t.base)
    if t.cls == "vlen" and t.base is not None:
        return head + _htype_bytes(t.base)
    return head + 16


def _parse(tj: Any) -> HType | None:
    try:
        return parsed_type(tj)[0]
    except FormatError:
        return None


def _disk_size(t: HType) -> int:
    """Bytes one element of ``t`` takes in the file (a variable-length part:
    its global heap id)."""
    if t.cls == "ref":
        return 8
    if t.cls in ("vstr", "vlen", "regionref"):
        return 16
    if t.cls == "compound":
        return sum(_disk_size(ft) for _, ft in t.fields)
    if t.cls == "array" and t.base is not None:
        return math.prod(t.dims) * _disk_size(t.base)
    return t.dtype.itemsize if t.dtype is not None else 16


def _heap_objects(value: Any, out: list[int]) -> None:
    """The sizes of the global heap objects the variable-length parts of
    ``value`` may take, at most (every part counted as if variable-length)."""
    if isinstance(value, str):
        out.append(_HEAP_OBJECT + _pad(len(value.encode("utf-8", "surrogateescape"))))
    elif isinstance(value, bytes | bytearray):
        out.append(_HEAP_OBJECT + _pad(len(value)))
    elif isinstance(value, np.ndarray) and value.dtype != object:
        out.append(_HEAP_OBJECT + _pad(value.nbytes))
    elif isinstance(value, Mapping):
        for item in value.values():
            _heap_objects(item, out)
    elif isinstance(value, list | tuple | np.ndarray):
        out.append(_HEAP_OBJECT + _pad(16 * len(value)))
        for item in value:
            _heap_objects(item, out)
    else:
        out.append(_HEAP_OBJECT + 8)


class _Pool:
    """Allocations of one kind of file space, and how many bytes of pages
    they take at most: one of half a page or more starts on a page and
    takes whole pages; smaller ones share pages, every page but the last
    one more than ``PAGE - largest`` bytes full, and more than half full."""

    def __init__(self) -> None:
        self.pages = 0
        self.small = 0
        self.largest = 0

    def add(self, nbytes: int, count: int = 1) -> None:
        if nbytes >= PAGE // 2:
            self.pages += count * _pages(nbytes)
        elif nbytes > 0:
            self.small += count * nbytes
            self.largest = max(self.largest, nbytes)

    def total(self) -> int:
        if not self.small:
            return self.pages
        return self.pages + PAGE * (1 + min(-(-2 * self.small // PAGE),
                                            -(-self.small // (PAGE - self.largest))))


class _Tally:
    """What a file's space holds: metadata, global heap objects (in
    collections), and the places of elements."""

    def __init__(self) -> None:
        self.meta = _Pool()
        self.heap: list[int] = []
        self.raw = _Pool()
        #: Pages filled by the equal chunks (under a page) of one dataset each.
        self.chunk_pages = 0

    def chunks(self, count: int, nbytes: int, rank: int) -> None:
        """``count`` equal chunks of ``nbytes``, and their B-tree."""
        if nbytes >= PAGE:
            self.raw.add(nbytes, count)
        elif nbytes:
            self.chunk_pages += -(-count // (PAGE // nbytes))
        node = 24 + (2 * _CHUNK_NODE_ENTRIES + 1) * (8 + 8 * (rank + 1)) \
            + 2 * _CHUNK_NODE_ENTRIES * 8
        leaves = -(-count // _CHUNK_NODE_ENTRIES)
        self.meta.add(node, 1 if count <= 2 * _CHUNK_NODE_ENTRIES
                      else 1 + leaves + -(-leaves // (_CHUNK_NODE_ENTRIES - 1)))

    def collections(self) -> int:
        """Bytes of the global heap collections: objects too large for a
        collection get one of their own; the others fill collections of a
        page, every one but the last one more than half full."""
        big = [n for n in self.heap if n > _COLLECTION // 2 - _COLLECTION_HEADER]
        small = sum(self.heap) - sum(big)
        pool = sum(_pages(n + _COLLECTION_HEADER) for n in big)
        if small:
            pool += _COLLECTION * (1 + -(-2 * small // (_COLLECTION - _COLLECTION_HEADER)))
        return pool

    def total(self) -> int:
        return _pages(_BASE + self.meta.total() + self.collections() + self.raw.total()
                      + PAGE * self.chunk_pages)


def size_bound(skeleton: Skeleton) -> int:
    """Bytes the file of ``skeleton`` takes at most (a multiple of ``PAGE``)."""
    tally = _Tally()
    links: dict[str, list[tuple[str, LinkKind, str]]] = {}
    for plan in skeleton.objects:
        if plan.parent is not None:
            links.setdefault(plan.parent, []).append((plan.name, LinkKind.HARD, ""))
    for link in skeleton.links:
        links.setdefault(link.group, []).append(
            (link.name, link.kind, link.target + (link.file or "")))
    for plan in skeleton.objects:
        messages = sum(_attribute(tally, attr) for attr in plan.attrs)
        if plan.kind is ObjectKind.GROUP:
            messages += _MESSAGE + 16
            _group(tally, links.get(plan.id, []))
        elif plan.kind is ObjectKind.DATATYPE:
            messages += _type_bytes(plan.hdf5)
        else:
            messages += _dataset(tally, plan)
        # Messages past the first chunk go to continuation chunks, each with
        # its continuation message and the gaps left where messages moved.
        more = messages - _HEADER
        tally.meta.add(_PREFIX + _HEADER + (more + more // 2 + 32 if more > 0 else 0))
    # LEFT_OUT_ATTR, whatever the build leaves out: a continuation of the root's header
    tally.meta.add(2 * _MESSAGE + 64 + 16 * LEFT_OUT_LINES + 32)
    tally.heap += [_HEAP_OBJECT + LEFT_OUT_BYTES // LEFT_OUT_LINES] * LEFT_OUT_LINES
    return tally.total()


def _group(tally: _Tally, links: list[tuple[str, LinkKind, str]]) -> None:
    """A group's symbol table: its nodes at least half full, and its local
    heap of names, grown by doubling (the blocks it left counted too); a
    new-style group's fractal heap and name index where a UTF-8 name or an
    external link makes one."""
    names = sum(_name(name) + _name(target) for name, _, target in links)
    nodes = max(1, -(-len(links) // _SNOD_LINKS))
    tally.meta.add(_SNOD, nodes)
    tally.meta.add(_GROUP_NODE, 1 + -(-nodes // 16))
    tally.meta.add(32)
    tally.meta.add(2 * names + 256, 2)
    if any(kind is LinkKind.EXTERNAL or not name.isascii() for name, kind, _ in links):
        tally.meta.add(_DENSE_GROUP)
        tally.meta.add(2 * (names + 48 * len(links)) + 512, 2)


def _attribute(tally: _Tally, attr: AttrPlan) -> int:
    """An attribute message's bytes; its variable-length values go to the heap."""
    tj, shape, value = attr.hdf5, attr.shape, attr.value
    if tj is None:
        try:
            tj, shape = infer(value)
        except Unsupported:
            return 0  # not written
    t = _parse(tj)
    if t is None:
        return 0
    count = 0 if shape is None else math.prod(shape)
    if t.dtype is None or t.cls == "ref":
        _heap_objects(value, tally.heap)
    return (2 * _MESSAGE + _name(attr.name) + _type_bytes(tj) + 16 + 16 * len(shape or ())
            + _pad(count * _disk_size(t)))


def _dataset(tally: _Tally, plan: ObjPlan) -> int:
    """A dataset's chunk index and elements; the bytes of its header messages."""
    rank = len(plan.shape or ())
    messages = (_type_bytes(plan.hdf5) + 3 * _MESSAGE + 16 + 32 * rank + 16
                + _pad(len(plan.fill or b"")) + 40 + 8 * rank)
    chunks = storage_chunks(plan)
    if plan.shape is None or not math.prod(plan.shape):
        if chunks is not None:  # an empty extendible dataset: its B-tree root
            tally.chunks(0, 0, rank)
        return messages
    if plan.stored is not None:
        itemsize = plan.stored // math.prod(plan.shape)
    elif plan.data is not None:
        t = _parse(plan.hdf5)
        if t is None:
            return messages
        itemsize = _disk_size(t)
        if t.dtype is None or t.cls == "ref":
            for value in plan.data:
                _heap_objects(value, tally.heap)
    else:
        return messages
    if chunks is None:
        tally.raw.add(itemsize * math.prod(plan.shape))
    else:
        tally.chunks(math.prod(chunk_grid(plan.shape, chunks)),
                     itemsize * math.prod(chunks), rank)
    return messages
