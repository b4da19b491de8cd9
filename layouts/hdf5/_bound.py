"""The length of a skeleton's HDF5 file, known before the file is written.

Owns ``size_bound``: an upper bound on the bytes ``layouts.hdf5._image``
writes for a ``Skeleton``, computed from the plan alone, so that the size of
a ``D.h5`` view is known from the domain's metadata without running HDF5.
The bound is a ``Bound``: the file's length, and the block at its start set
aside for its metadata. The image is padded with zeros to that length (past
HDF5's end of file, which every HDF5 reader allows), and a file that would
pass it keeps fewer objects (``build_image``), so the length promised is
the length served.

The bound follows the file's layout (``_image._write``: ``libver="earliest"``,
version 1 object headers, symbol-table groups, version 1 chunk B-trees; one
metadata block first, then the elements and the global heap, every
allocation of ``PAGE`` bytes or more aligned to a page):

* metadata (object headers, attribute messages, symbol tables and their
  heaps, chunk indexes) is counted message by message from the format's
  sizes, rounded up, with room for what HDF5 moves (a header's continuation
  chunks, a heap's old blocks), a page for each piece that is aligned, and
  a quarter more: the block must hold it all, or HDF5 starts another one
  after the elements;
* the elements are counted as the library places them: a place of a page
  or more on a page of its own; one under 2 KiB in HDF5's small-data blocks
  (2 KiB each: the equal chunks of one dataset fill blocks in turn; of the
  other places, every block but the last is more than half full unless its
  last request was over half a block); others as they are, with a page of
  alignment for each run of them before an aligned place;
* the global heap (variable-length values) in collections of a page, every
  one but the last more than half full, and one of its own for a value too
  large for one.

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
from layouts.hdf5._plan import (
    LEFT_OUT_BYTES,
    LEFT_OUT_LINES,
    PAGE,
    AttrPlan,
    Bound,
    ObjPlan,
    Skeleton,
    Unsupported,
    infer,
    storage_chunks,
)
from layouts.hdf5._types import HType, parsed_type
from layouts.model import LinkKind, ObjectKind, chunk_grid

#: The superblock and the root group's entry in it, rounded up.
_BASE = 2 * PAGE
#: HDF5's small-data block (``H5Pset_small_data_block_size``'s default).
_SMALL_BLOCK = 2048
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
    """Bytes of a datatype message (its header included) for type JSON ``tj``;
    an opaque type's tag, which ``HType`` does not keep, is counted as the
    whole JSON."""
    t = _parse(tj)
    if t is None:
        return 0  # not written
    tags = 0
    if _has_opaque(t):
        try:
            tags = _pad(len(orjson.dumps(tj)))
        except (orjson.JSONEncodeError, TypeError):
            tags = PAGE
    return _MESSAGE + _htype_bytes(t) + tags


def _has_opaque(t: HType) -> bool:
    return (t.cls == "opaque" or (t.base is not None and _has_opaque(t.base))
            or any(_has_opaque(ft) for _, ft in t.fields))


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


class _Meta:
    """The metadata of a file, piece by piece: pieces of a page or more are
    aligned to a page (a fragment before each)."""

    def __init__(self) -> None:
        self.bytes = 0

    def add(self, nbytes: int, count: int = 1) -> None:
        self.bytes += count * (nbytes + PAGE if nbytes >= PAGE else nbytes)

    def block(self) -> int:
        """The metadata block: what was counted, a quarter more, and the superblock."""
        return _pages(_BASE + self.bytes + self.bytes // 4)


class _Raw:
    """The allocations after the metadata block (elements and global heap
    collections), and how far they reach at most."""

    def __init__(self) -> None:
        #: Aligned allocations (a page or more): their pages, and how many.
        self.pages = 0
        self.aligned = 0
        #: Allocations under ``_SMALL_BLOCK``, from HDF5's small-data blocks:
        #: single ones (their bytes, and how many are over half a block), and
        #: the blocks runs of equal ones (a dataset's chunks) fill in turn.
        self.small = 0
        self.over_half = 0
        self.filled = 0
        #: Allocations from ``_SMALL_BLOCK`` to a page: their bytes, and how many.
        self.middle = 0
        self.middles = 0

    def add(self, nbytes: int, count: int = 1) -> None:
        if nbytes >= PAGE:
            self.pages += count * _pages(nbytes)
            self.aligned += count
        elif nbytes >= _SMALL_BLOCK:
            self.middle += count * nbytes
            self.middles += count
        elif nbytes > 0 and count > 1:
            self.filled += -(-count // (_SMALL_BLOCK // nbytes))
        elif nbytes > 0:
            self.small += nbytes
            if nbytes > _SMALL_BLOCK // 2:
                self.over_half += 1

    def total(self) -> int:
        blocks = self.filled + (1 + -(-2 * self.small // _SMALL_BLOCK) + self.over_half
                                if self.small else 0)
        runs = min(self.aligned + 1, blocks + self.middles)
        return self.pages + self.middle + _SMALL_BLOCK * blocks + PAGE * runs


class _Tally:
    """What a file's space holds: metadata, global heap objects (in
    collections), and the places of elements."""

    def __init__(self) -> None:
        self.meta = _Meta()
        self.heap: list[int] = []
        self.raw = _Raw()

    def chunks(self, count: int, nbytes: int, rank: int) -> None:
        """``count`` equal chunks of ``nbytes``, and their B-tree."""
        self.raw.add(nbytes, count)
        node = 24 + (2 * _CHUNK_NODE_ENTRIES + 1) * (8 + 8 * (rank + 1)) \
            + 2 * _CHUNK_NODE_ENTRIES * 8
        leaves = -(-count // _CHUNK_NODE_ENTRIES)
        self.meta.add(node, 1 if count <= 2 * _CHUNK_NODE_ENTRIES
                      else 1 + leaves + -(-leaves // (_CHUNK_NODE_ENTRIES - 1)))

    def collections(self) -> None:
        """The global heap's collections, as raw allocations: an object too
        large for a collection gets one of its own; the others fill
        collections of a page, every one but the last more than half full."""
        big = [n for n in self.heap if n > _COLLECTION // 2 - _COLLECTION_HEADER]
        for n in big:
            self.raw.add(n + _COLLECTION_HEADER)
        small = sum(self.heap) - sum(big)
        if small:
            self.raw.add(_COLLECTION,
                         1 + -(-2 * small // (_COLLECTION - _COLLECTION_HEADER)))

    def bound(self) -> Bound:
        self.collections()
        meta = self.meta.block()
        return Bound(_pages(meta + self.raw.total()), meta)


def size_bound(skeleton: Skeleton) -> Bound:
    """The length of the file of ``skeleton`` (an upper bound on what HDF5
    writes, a multiple of ``PAGE``) and its metadata block."""
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
    return tally.bound()


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
