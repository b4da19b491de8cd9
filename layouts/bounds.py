"""The bounds hostile metadata is held to, shared by every storage layout.

Owns the limits a format checks metadata against before it builds anything
from it, so one hostile object gives ``Corrupt`` for itself alone and nothing
built from it can exhaust memory or the stack, or fail to encode, later:

* shapes and types: ``MAX_RANK`` dimensions, ``MAX_ITEM_BYTES`` per element
  (``layouts.hdf5._types`` parses types within them), and ``check_sizes`` for a
  dataset's element, chunk and byte counts (``MAX_ELEMENTS``,
  ``MAX_CHUNK_ELEMENTS``, ``MAX_DATASET_BYTES``); ``MAX_CHUNK_BYTES`` for one
  stored chunk;
* JSON kept as stored: nested at most ``MAX_JSON_DEPTH`` deep, and text that
  is valid Unicode (``check_json``, ``valid_text``);
* link names that a file name can show (``link_name_problem``).

A violation raises ``FormatError`` (``link_name_problem`` says why instead);
callers turn it into ``Corrupt`` naming the storage key. Pure functions with
no state: safe from any task or thread.
"""

from __future__ import annotations

import math
from typing import Any

from layouts.errors import FormatError
from layouts.model import ElementType

#: Most dimensions of a dataspace or array type (HDF5's H5S_MAX_RANK).
MAX_RANK = 32
#: Largest element of a fixed-size type, in bytes (a fill value is one element).
MAX_ITEM_BYTES = 1 << 24
#: Deepest nesting of metadata JSON that is kept and shown as it is stored
#: (sidecars walk it recursively): room for ``h5types.MAX_TYPE_DEPTH`` levels
#: of types, three JSON levels each.
MAX_JSON_DEPTH = 128
#: Largest number of elements a dataset may declare (fits a signed 64-bit index).
MAX_ELEMENTS = (1 << 63) - 1
#: Largest chunk, in elements, accepted from a layout.
MAX_CHUNK_ELEMENTS = (1 << 31) - 1
#: Largest dataset, in bytes of fixed-size elements: its ``.npy`` file size
#: (header included) must fit a signed 64-bit file offset.
MAX_DATASET_BYTES = 1 << 62
#: Largest stored chunk object (or HDF5 chunk of a linked dataset) accepted, in bytes.
MAX_CHUNK_BYTES = (1 << 31) - 1


def valid_text(text: str) -> bool:
    """True if ``text`` is valid Unicode: JSON's ``\\ud800`` escapes give lone
    surrogates, which no file name, xattr or strict JSON output can hold."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json(value: Any, what: str) -> None:
    """Raise ``FormatError`` if parsed JSON ``value`` nests deeper than
    ``MAX_JSON_DEPTH`` or holds a key or string that is not ``valid_text``.

    Iterative, so a hostile depth cannot exhaust the stack here; callers run
    it on the JSON they keep as stored (sidecar ``hdf5`` and ``domain``
    values, a reference file's ``.zattrs``), which is later walked recursively.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        kind = type(item)
        if kind is str:
            if not valid_text(item):
                raise FormatError(f"{what}: text that is not valid Unicode: {item!r:.80}")
            continue
        if kind is dict:
            children: Any = item.values()
            for key in item:
                if not valid_text(key):
                    raise FormatError(f"{what}: a key that is not valid Unicode: {key!r:.80}")
        elif kind is list:
            children = item
        else:
            continue
        if level >= MAX_JSON_DEPTH:
            raise FormatError(f"{what}: JSON nested more than {MAX_JSON_DEPTH} deep")
        stack.extend((child, level + 1) for child in children
                     if type(child) in (dict, list, str))


def check_sizes(shape: tuple[int, ...] | None, chunks: tuple[int, ...],
                etype: ElementType) -> None:
    """Raise ``FormatError`` for a chunk over ``MAX_CHUNK_ELEMENTS`` elements or
    bytes, or a dataset over ``MAX_DATASET_BYTES`` (``MAX_ELEMENTS`` elements
    of a variable-length type)."""
    elements = math.prod(chunks)
    itemsize = etype.itemsize if etype.fixed_size else 1
    if elements > MAX_CHUNK_ELEMENTS or elements * itemsize > MAX_CHUNK_ELEMENTS:
        raise FormatError(f"chunk shape {list(chunks)} is too large")
    total = math.prod(shape or ())
    if total > MAX_ELEMENTS:
        raise FormatError(f"shape {list(shape or ())} has too many elements")
    if total * itemsize > MAX_DATASET_BYTES:
        raise FormatError(f"shape {list(shape or ())} of {etype.dtype.str} items is too large")


def link_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be shown as a link's file name, or None if it can.

    HDF5 itself allows none of these, but JSON can say them: an empty name
    or one holding ``/`` makes the kernel refuse a whole directory listing,
    and text that is not valid Unicode cannot be a file name at all. Other
    names are shown escaped or cut by ``mountd.tree.names``.
    """
    if not name:
        return "a link name cannot be empty"
    if "/" in name:
        return "a link name cannot hold '/'"
    if not valid_text(name):
        return "a link name must be valid Unicode"
    return None
