"""The plan of a ``D.h5`` file, and where its elements go.

Owns what the tree hands the HDF5 writer (``Skeleton``: ``ObjPlan``,
``AttrPlan``, ``LinkPlan``, ``PlanRef``), the types plain attribute values
are written with (``infer``), the layout decisions both the writer
(``layouts.hdf5._image``) and the bound on the file's length
(``layouts.hdf5._bound``) follow (``storage_chunks``: which datasets keep
their chunk shape; ``PAGE``; the limits of the left-out attribute), and
``Bound``, the length promised for a file before it is written.

Concurrency: plans are built once, by the tree, and only read afterwards;
everything here is pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from layouts.model import LinkKind, ObjectKind, chunk_grid

#: The root attribute that lists what the skeleton leaves out, and why.
LEFT_OUT_ATTR = "h5mount_left_out"

#: Bytes one HDF5 chunk must stay under.
MAX_CHUNK_BYTES = (1 << 32) - 1
#: Most chunks a stored dataset keeps as chunks (each a part of the image,
#: about 200 bytes of memory); one with more is contiguous.
MAX_CHUNKS = 65_536
#: The page a reader's page cache reads whole: the file's allocations of a
#: page or more are aligned to it, and its metadata block is whole pages.
PAGE = 4096
#: Most bytes and lines of ``LEFT_OUT_ATTR`` (``FileImage.left_out`` has them all).
LEFT_OUT_BYTES = 8 << 10
LEFT_OUT_LINES = 64


class Unsupported(Exception):
    """A value or type the skeleton cannot hold; the message says why."""


@dataclass(frozen=True, slots=True)
class PlanRef:
    """An object reference in a value: the id of an object of the plan, or
    None for a reference that leads nowhere in it (written as a null reference)."""

    target: str | None


@dataclass(frozen=True, slots=True)
class AttrPlan:
    """One attribute. ``hdf5`` is the type JSON, or None to infer one from
    ``value``; ``shape`` is the dataspace (``()`` scalar, None ``H5S_NULL``).
    Object references in ``value`` are ``PlanRef``s."""

    name: str
    value: Any
    hdf5: Any = None
    shape: tuple[int, ...] | None = ()


@dataclass(slots=True)
class ObjPlan:
    """One object, created as ``name`` in group ``parent`` (None: the root group).

    Datasets and datatypes have ``hdf5`` (type JSON). A dataset has ``shape``
    (None: ``H5S_NULL``), ``fill`` (one element's bytes, or None for the
    library's default) and either ``stored``, the bytes of its elements the
    file keeps (their C-order raw bytes, which the file's server provides),
    or ``data`` to embed (its elements in C order, as model values; neither:
    no elements to store). ``chunks`` is its chunk shape as stored: a stored
    dataset keeps it where HDF5 allows it (``chunked``), its places then
    whole chunks; an extendible one that is empty or embedded keeps it too
    (readers such as PyTables check it).
    """

    id: str
    kind: ObjectKind
    parent: str | None
    name: str
    path: str
    attrs: list[AttrPlan] = field(default_factory=list)
    hdf5: Any = None
    shape: tuple[int, ...] | None = ()
    #: Largest shape, None for an unlimited dimension (None: the shape).
    maxshape: tuple[int | None, ...] | None = None
    fill: bytes | None = None
    stored: int | None = None
    chunks: tuple[int, ...] | None = None
    data: list[Any] | None = None


@dataclass(frozen=True, slots=True)
class LinkPlan:
    """A link that is not the first path to an object. HARD: ``target`` is an
    object id; SOFT: an HDF5 path; EXTERNAL: the object's path in ``file``."""

    group: str
    name: str
    kind: LinkKind
    target: str
    file: str | None = None



@dataclass(slots=True)
class Skeleton:
    """A domain's skeleton: ``objects`` in creation order (the root first,
    every group before what it holds), the other ``links``, and ``left_out``."""

    objects: list[ObjPlan] = field(default_factory=list)
    links: list[LinkPlan] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)



# --------------------------------------------------------------------------- inferred types

_VSTR = {"class": "H5T_STRING", "charSet": "H5T_CSET_UTF8", "length": "H5T_VARIABLE"}
_BOOL = {"class": "H5T_ENUM", "base": "H5T_STD_I8LE",
         "members": [{"name": "FALSE", "value": 0}, {"name": "TRUE", "value": 1}]}
_OBJREF = {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_OBJ"}


def infer(value: Any) -> tuple[Any, tuple[int, ...]]:
    """The type JSON and shape h5py would store a plain value with: a string
    as a variable-length UTF-8 string, an int as int64, a float as float64,
    a bool as h5py's boolean enum, a reference as an object reference, and
    nested lists of one kind as an array of it."""
    shape: list[int] = []
    level: Any = value
    while isinstance(level, list):
        shape.append(len(level))
        if not level:
            break
        level = level[0]
    leaves: list[Any] = []
    _leaves(value, len(shape), leaves)
    if len(leaves) != math.prod(shape):
        raise Unsupported("a ragged list has no HDF5 type")
    kinds = {_kind(v) for v in leaves} or {"float"}
    if kinds == {"int", "float"}:
        kinds = {"float"}
    if len(kinds) != 1:
        raise Unsupported(f"a list mixing {', '.join(sorted(kinds))} has no HDF5 type")
    tj = {"str": _VSTR, "int": "H5T_STD_I64LE", "float": "H5T_IEEE_F64LE", "bool": _BOOL,
          "ref": _OBJREF}[kinds.pop()]
    return tj, tuple(shape)


def _leaves(value: Any, depth: int, out: list[Any]) -> None:
    if depth == 0:
        out.append(value)
        return
    if not isinstance(value, list):
        raise Unsupported("a ragged list has no HDF5 type")
    for item in value:
        _leaves(item, depth - 1, out)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, PlanRef):
        return "ref"
    raise Unsupported(f"a {type(value).__name__} value has no HDF5 type")


# --------------------------------------------------------------------------- values


def flatten(value: Any, shape: tuple[int, ...]) -> list[Any]:
    """The elements of a value nested as ``shape`` (a scalar for ``()``), in C order."""
    out: list[Any] = []
    try:
        _leaves(value, len(shape), out)
    except Unsupported:
        raise Unsupported(f"value is not nested as {list(shape)}") from None
    if len(out) != math.prod(shape):
        raise Unsupported(f"value does not have the shape {list(shape)}")
    return out


# --------------------------------------------------------------------------- layout


def storage_chunks(plan: ObjPlan) -> tuple[int, ...] | None:
    """The chunk shape the file gives a dataset of rank one or more (None:
    contiguous); ``layouts.hdf5._image`` says why (``_Writer.space``)."""
    shape = plan.shape
    if not shape:
        return None
    if chunked(plan):
        assert plan.chunks is not None
        return tuple(plan.chunks)
    maxshape = plan.maxshape or shape
    if tuple(maxshape) == tuple(shape):
        return None
    if plan.stored is None and _takes_chunks(plan):
        assert plan.chunks is not None
        return tuple(plan.chunks)
    if (plan.stored or 0) < MAX_CHUNK_BYTES:
        return tuple(max(1, n) for n in shape)
    return None


def _takes_chunks(plan: ObjPlan) -> bool:
    """True if HDF5 takes the dataset's ``chunks``: one per dimension, none
    empty, none larger than a fixed dimension."""
    shape, chunks = plan.shape, plan.chunks
    if not shape or chunks is None or len(chunks) != len(shape) or min(chunks) < 1:
        return False
    maxshape = plan.maxshape or shape
    return all(m is None or c <= m for c, m in zip(chunks, maxshape, strict=True))


def chunked(plan: ObjPlan) -> bool:
    """True if a stored dataset keeps its chunk shape: HDF5 takes it (every
    chunk under 4 GiB, no larger than a fixed dimension), it has at most
    ``MAX_CHUNKS`` chunks (each is a part of the image, kept in memory), and
    it is not one chunk of a fixed shape (what HSDS makes of a contiguous
    dataset: contiguous storage holds the same bytes, and readers such as
    PyTables tell the two apart)."""
    shape, chunks = plan.shape, plan.chunks
    if plan.stored is None or not shape or not math.prod(shape) or not _takes_chunks(plan):
        return False
    assert chunks is not None
    if tuple(chunks) == tuple(shape) and tuple(plan.maxshape or shape) == tuple(shape):
        return False
    itemsize = plan.stored // math.prod(shape)
    count = math.prod(chunk_grid(shape, chunks))
    return count <= MAX_CHUNKS and math.prod(chunks) * itemsize < MAX_CHUNK_BYTES


@dataclass(frozen=True, slots=True)
class Bound:
    """What a skeleton's file is promised to be before it is written: its
    length, and the bytes set aside for its metadata at its start (the
    elements follow them)."""

    size: int
    meta: int
