"""Random HDF5 files, the HSDS buckets and LINDI files made from them, and damage.

The generator side of ``tests/test_fuzz.py``:

* ``file_specs()`` is a hypothesis strategy for a small HDF5 file: groups
  nested a few levels; datasets of random shapes (scalars, empty dimensions),
  chunk shapes, integer/unsigned/float types of both byte orders, booleans
  (h5py's enum), fixed and variable-length strings, gzip/shuffle/fletcher32,
  fill values, partly or never written data; attributes of several types;
  soft links (absolute and relative) and hard-link aliases; odd link names
  (spaces, ``%``, unicode, dots, digits, names that collide with the mount's
  generated ``.json``/``.npy`` names, names longer than 255 bytes).
  ``write_h5`` writes one with h5py; the file, read back with h5py, is the
  reference every check compares with.
* ``write_hsds_domain`` writes an HDF5 file as an HSDS schema-v2 domain straight
  into a bucket directory: type JSON from ``h5json.hdf5dtype.getTypeItem``
  (what hsload uses), object and domain JSON in the shapes HSDS 1.0.2 writes
  (``examples/sample-bucket``), chunk bytes through HSDS's own
  ``hsds.util.storUtil._compress`` with the filter operations HSDS's
  ``datanode_lib.getFilterOps`` derives (Blosc frames for every compressor,
  bitshuffle only for a SHUFFLE-class filter named ``bitshuffle``),
  variable-length chunks through ``h5json.array_util.arrayToBytes``. What HSDS
  leaves free is drawn per dataset (``HsdsChoice``): the chunk shape
  (independent of HDF5's), compressor and shuffle, ``partition_count``, where the
  layout is stored, how the fill value is encoded, whether all-fill chunks are
  written. Ids are deterministic (a hash of the domain name and a counter).
* ``LindiConverter`` keeps one process of ``.venv-lindi`` (lindi 0.4.6 needs
  zarr 2) converting files on request, so each example pays about 0.1 s, not
  the second of importing lindi.
* ``json_mutations``/``chunk_mutations``/``lindi_mutations`` draw damage to
  object JSON, chunk objects and reference files: wrong types, missing keys,
  negative or huge dimensions, unknown type classes and filter ids, NaN where
  integers belong, nesting deeper than any parser's stack, truncated or
  garbage bytes.

Everything is plain synchronous file writing; no servers. Not thread-safe
(``LindiConverter`` serves one caller at a time).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import select
import subprocess
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numcodecs
import numpy as np
from hypothesis import strategies as st

from tests import tiers

ROOT = Path(__file__).resolve().parents[1]
LINDI_PYTHON = ROOT / ".venv-lindi" / "bin" / "python"

#: Fixed time stamps, so buckets differ only where the draw differs.
STAMP = 1_790_000_000.0
#: Largest number of elements of a generated dataset.
MAX_ELEMENTS = 3000
#: Most HDF5 chunks of one dataset (LINDI lists more than 1000 as an external array).
MAX_H5_CHUNKS = 1200
#: Most HSDS chunks of one dataset.
MAX_HSDS_CHUNKS = 400
#: Most datasets in one file.
MAX_DATASETS = 7
#: Deepest group nesting below the root.
MAX_DEPTH = 3

_ACLS = {"admin": {"create": True, "read": True, "update": True, "delete": True,
                   "readACL": True, "updateACL": True}}

#: Link and attribute names worth trying on every run: spaces, escapes the mount
#: applies (``%``), names that look like generated entries, chunk names, unicode
#: of 2 to 4 UTF-8 bytes, control characters, dots, a name over 255 bytes.
ODD_NAMES = (
    "x", "x.json", "x.npy", "x.json.json", "a b", " lead", "trail ", "50%", "%25", "%2E",
    "%2E%2E", "%00", "a.b", ".hidden", "...", "..", "..x", "0", "1.2", "0_0", "é", "日本語", "✓ ok",
    "🙂", "tab\tname", "new\nline", 'quo"te', "back\\slash", "colon:x", "st*r", "q?",
    "#hash", "~", "-", "a" * 300, "é" * 140,
)

INT_DTYPES = ("|i1", "<i2", ">i2", "<i4", ">i4", "<i8", ">i8",
              "|u1", "<u2", ">u2", "<u4", ">u4", "<u8", ">u8")
FLOAT_DTYPES = ("<f2", ">f2", "<f4", ">f4", "<f8", ">f8")
#: Text (no NUL: HDF5 strings end at one) for variable-length strings.
TEXTS = ("", "a", "héllo", "✓", "🙂 ok", "NaN", "null", "x" * 40, "tab\tand\nnewline",
         '{"json": 1}', "日本語テキスト", " ")
#: Scalar string attributes lindi refuses (it spells float NaN and infinities so).
LINDI_SPECIAL = ("NaN", "Infinity", "-Infinity")
_PRINTABLE = np.frombuffer(bytes(range(32, 127)), dtype=np.uint8)


def _usable_name(name: str) -> bool:
    """A name h5py and lindi can both hold as a link or attribute name."""
    return (bool(name) and "/" not in name and "\0" not in name and name != "."
            and not name.startswith((".z", "_")) and len(name.encode()) < 1000)


def link_names() -> st.SearchStrategy[str]:
    """Link names: mostly the odd ones above, else random unicode text."""
    text = st.text(st.characters(exclude_categories=("Cs", "Cc"), exclude_characters="/"),
                   min_size=1, max_size=8)
    return st.one_of(st.sampled_from(ODD_NAMES), text).filter(_usable_name)


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: ``value`` is a ``str`` (variable-length UTF-8), or an array
    (0-d for a scalar) written with its own dtype (``object``: UTF-8 strings)."""

    name: str
    value: Any


@dataclass(frozen=True)
class HsdsChoice:
    """What the HSDS writer picks for one dataset (HDF5 does not fix it).

    ``layout`` is ``cprops`` (HSDS 1.0.2: ``creationProperties.layout``),
    ``top`` (older servers: a top-level ``layout``) or ``contiguous`` (one
    chunk of the whole shape, no dims). ``shuffle`` is ``none``, ``shuffle``,
    ``bitshuffle`` (a SHUFFLE-class filter named bitshuffle, which HSDS
    applies) or ``bitshuffle_class`` (an H5Z_FILTER_BITSHUFFLE filter, which
    HSDS 1.0.2 ignores). ``fill`` is ``json``, ``base64`` or ``omit`` (only
    used when the fill value is all zero bytes).
    """

    chunks: tuple[int, ...]
    compressor: str | None
    level: int
    shuffle: str
    partitions: int
    layout: str
    fill: str
    skip_fill_chunks: bool
    unlimited_word: bool


@dataclass(frozen=True)
class DsetSpec:
    """One dataset. ``dtype`` is a NumPy dtype string, or ``vlen`` for UTF-8
    variable-length strings. ``chunks`` is HDF5's (None: contiguous).
    ``written`` is ``all``, ``part`` (a slab chosen from ``seed``) or ``none``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...] | None
    maxshape: tuple[int | None, ...] | None
    gzip: int | None
    shuffle: bool
    fletcher32: bool
    fill: Any
    seed: int
    written: str
    attrs: tuple[AttrSpec, ...]
    hsds: HsdsChoice


@dataclass(frozen=True)
class GroupSpec:
    name: str
    attrs: tuple[AttrSpec, ...]
    children: tuple[GroupSpec | DsetSpec, ...]


@dataclass(frozen=True)
class LinkSpec:
    """A soft link (``soft``: ``target`` is the HDF5 path text) or a hard-link
    alias of a dataset (``target`` is the absolute path) placed in ``group``."""

    group: str
    name: str
    target: str
    soft: bool


@dataclass(frozen=True)
class FileSpec:
    root: GroupSpec
    links: tuple[LinkSpec, ...]
    #: The domain's file name in the bucket (``home/fuzz/<domain>``).
    domain: str
    #: Mount the HSDS bucket with ``--domain`` (True) or as the whole bucket.
    single_domain: bool
    #: ``json`` (a .lindi.json) or ``tar`` (a .lindi.tar).
    lindi_format: str
    #: Hash salt for the HSDS ids.
    salt: int

    def paths(self) -> dict[str, GroupSpec | DsetSpec]:
        """Every object by its (first) HDF5 path."""
        out: dict[str, GroupSpec | DsetSpec] = {}

        def visit(node: GroupSpec | DsetSpec, path: str) -> None:
            out[path] = node
            if isinstance(node, GroupSpec):
                for child in node.children:
                    visit(child, _join(path, child.name))

        visit(self.root, "/")
        return out

    def datasets(self) -> Iterator[tuple[str, DsetSpec]]:
        for path, node in self.paths().items():
            if isinstance(node, DsetSpec):
                yield path, node


def _join(group: str, name: str) -> str:
    return f"{group.rstrip('/')}/{name}"


# --------------------------------------------------------------------------- strategies


def _int_value(dtype: np.dtype[Any]) -> st.SearchStrategy[int]:
    info = np.iinfo(dtype)
    return st.integers(int(info.min), int(info.max))


def _float_value(dtype: np.dtype[Any]) -> st.SearchStrategy[float]:
    # NaN apart: hypothesis rejects many NaN payloads it cannot narrow to 16 bits.
    return st.one_of(st.floats(width=dtype.itemsize * 8, allow_nan=False),
                     st.sampled_from((math.nan, math.inf, -math.inf, -0.0)))


def _ascii(max_size: int) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max_size).map(
        lambda raw: bytes(b % 95 + 32 for b in raw))


@st.composite
def attr_values(draw: st.DrawFn) -> Any:
    """An attribute value of one of several kinds (see ``AttrSpec``)."""
    kind = draw(st.sampled_from(("int", "float", "str", "bytes", "bool", "int_array",
                                 "float_array", "str_array")))
    if kind == "str":
        return draw(st.one_of(st.sampled_from(TEXTS), st.text(
            st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=12))
            .filter(lambda t: t not in LINDI_SPECIAL))
    if kind == "bytes":
        return np.array(draw(_ascii(10).filter(lambda b: b.decode() not in LINDI_SPECIAL)))
    if kind == "bool":
        return np.array(draw(st.booleans()))
    if kind == "str_array":
        items = draw(st.lists(st.sampled_from(TEXTS), min_size=1, max_size=4))
        return np.array(items, dtype=h5py.string_dtype())
    shape: tuple[int, ...] = ()
    if kind.endswith("_array"):
        shape = draw(st.sampled_from(((1,), (3,), (2, 2), (1, 4), (5,))))
    if kind.startswith("int"):
        dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
        items: list[Any] = draw(st.lists(_int_value(dtype), min_size=math.prod(shape),
                                         max_size=math.prod(shape)))
    else:
        dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
        items = draw(st.lists(_float_value(dtype), min_size=math.prod(shape),
                              max_size=math.prod(shape)))
    return np.array(items, dtype=dtype).reshape(shape)


@st.composite
def attr_specs(draw: st.DrawFn) -> tuple[AttrSpec, ...]:
    names = draw(st.lists(link_names(), max_size=3, unique=True))
    return tuple(AttrSpec(name, draw(attr_values())) for name in names)


def _cap_grid(shape: tuple[int, ...], chunks: list[int], cap: int) -> tuple[int, ...]:
    """``chunks`` grown (the smallest first) until the grid has at most ``cap`` chunks."""
    while math.prod(-(-max(n, 1) // c) for n, c in zip(shape, chunks, strict=True)) > cap:
        i = min(range(len(chunks)), key=lambda k: chunks[k] / max(shape[k], 1))
        chunks[i] *= 2
    return tuple(chunks)


@st.composite
def _shape(draw: st.DrawFn) -> tuple[int, ...]:
    rank = draw(st.sampled_from((0, 1, 1, 2, 2, 3)))
    top = {0: 0, 1: 2500, 2: 60, 3: 14}[rank]
    dims: list[int] = []
    for _ in range(rank):
        room = MAX_ELEMENTS // max(math.prod(d for d in dims if d), 1)
        dims.append(draw(st.integers(0, max(1, min(top, room)))))
    return tuple(dims)


@st.composite
def hsds_choices(draw: st.DrawFn, shape: tuple[int, ...], vlen: bool) -> HsdsChoice:
    chunks = [draw(st.integers(1, max(1, n + 3))) for n in shape]
    contiguous_ok = bool(shape) and 0 not in shape and not vlen
    layout = draw(st.sampled_from(("cprops", "top", "contiguous") if contiguous_ok
                                  else ("cprops", "top")))
    return HsdsChoice(
        chunks=_cap_grid(shape, chunks, MAX_HSDS_CHUNKS) if shape else (),
        compressor=draw(st.sampled_from((None, "deflate", "lz4", "lz4hc", "zstd", "blosclz"))),
        level=draw(st.integers(1, 9)),
        shuffle=draw(st.sampled_from(("none", "shuffle", "bitshuffle", "bitshuffle_class"))),
        partitions=draw(st.sampled_from((0, 0, 2, 3, 7))),
        layout=layout,
        fill=draw(st.sampled_from(("json", "base64", "omit"))),
        skip_fill_chunks=draw(st.booleans()),
        unlimited_word=draw(st.booleans()),
    )


@st.composite
def dataset_specs(draw: st.DrawFn, name: str) -> DsetSpec:
    kind = draw(st.sampled_from(("int", "int", "float", "float", "bool", "fixed", "vlen")))
    if kind == "int":
        dtype = draw(st.sampled_from(INT_DTYPES))
    elif kind == "float":
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
    elif kind == "bool":
        dtype = "|b1"
    elif kind == "fixed":
        dtype = f"|S{draw(st.integers(1, 12))}"
    else:
        dtype = "vlen"
    shape = draw(_shape())
    if kind not in ("int", "float") and 0 in shape:
        # lindi 0.4.6 divides by zero inlining an empty boolean or string dataset.
        shape = tuple(max(n, 1) for n in shape)
    chunked = bool(shape) and (0 in shape or draw(st.booleans()))
    chunks: tuple[int, ...] | None = None
    maxshape: tuple[int | None, ...] | None = None
    gzip = None
    shuffle = fletcher32 = False
    if chunked:
        maxshape = tuple(None if n == 0 or draw(st.booleans()) else n for n in shape)
        raw = [draw(st.integers(1, max(1, n) if m is not None else max(n, 1) + 4))
               for n, m in zip(shape, maxshape, strict=True)]
        chunks = _cap_grid(shape, raw, MAX_H5_CHUNKS)
        chunks = tuple(min(c, n) if m is not None else c
                       for c, n, m in zip(chunks, shape, maxshape, strict=True))
        gzip = draw(st.one_of(st.none(), st.integers(0, 9)))
        if dtype != "vlen":
            shuffle = draw(st.booleans())
            fletcher32 = draw(st.booleans())
    fill: Any = None
    if dtype != "vlen" and draw(st.booleans()):
        np_dtype = np.dtype(dtype)
        if kind == "int":
            fill = draw(_int_value(np_dtype))
        elif kind == "float":
            # One NaN only: JSON (HSDS fillValue, a .zarray fill_value) keeps no payload.
            fill = draw(_float_value(np_dtype))
        elif kind == "bool":
            fill = draw(st.booleans())
        else:
            fill = draw(_ascii(np_dtype.itemsize))
    # lindi 0.4.6 fails on a contiguous dataset with no storage allocated (never written).
    written = "all" if dtype == "vlen" else draw(st.sampled_from(
        ("all", "all", "part", "none") if chunked else ("all", "part")))
    return DsetSpec(
        name=name, dtype=dtype, shape=shape, chunks=chunks, maxshape=maxshape, gzip=gzip,
        shuffle=shuffle, fletcher32=fletcher32, fill=fill,
        seed=draw(st.integers(0, 2**32 - 1)), written=written, attrs=draw(attr_specs()),
        hsds=draw(hsds_choices(shape, dtype == "vlen")))


@st.composite
def group_specs(draw: st.DrawFn, name: str, depth: int, budget: list[int]) -> GroupSpec:
    """A group and what is below it; ``budget`` counts the datasets still allowed."""
    names = draw(st.lists(link_names(), max_size=4 if depth < MAX_DEPTH else 2, unique=True))
    children: list[GroupSpec | DsetSpec] = []
    for child in names:
        # lindi 0.4.6 never ends converting a file with a group named "..": only a
        # dataset may have that name.
        if child == "..":
            if budget[0] > 0:
                budget[0] -= 1
                children.append(draw(dataset_specs(child)))
            continue
        if depth < MAX_DEPTH and (budget[0] <= 0 or draw(st.integers(0, 2)) == 0):
            children.append(draw(group_specs(child, depth + 1, budget)))
        elif budget[0] > 0:
            budget[0] -= 1
            children.append(draw(dataset_specs(child)))
    return GroupSpec(name, draw(attr_specs()), tuple(children))


def _taken(spec_paths: dict[str, Any], links: list[LinkSpec], group: str) -> set[str]:
    names = {p.rsplit("/", 1)[1] for p in spec_paths if p != "/" and p.rsplit("/", 1)[0] ==
             group.rstrip("/")}
    return names | {link.name for link in links if link.group == group}


@st.composite
def file_specs(draw: st.DrawFn) -> FileSpec:
    """A whole file: tree, then soft links and dataset aliases placed in its groups."""
    root = draw(group_specs("", 0, [draw(st.integers(1, MAX_DATASETS))]))
    paths = FileSpec(root, (), "f.h5", False, "json", 0).paths()
    groups = sorted(p for p, n in paths.items() if isinstance(n, GroupSpec))
    dsets = sorted(p for p, n in paths.items() if isinstance(n, DsetSpec))
    links: list[LinkSpec] = []
    for _ in range(draw(st.integers(0, 3))):
        group = draw(st.sampled_from(groups))
        taken = _taken(paths, links, group)
        taken.add("..")  # see group_specs
        name = draw(link_names().filter(lambda n, t=taken: n not in t))  # type: ignore[misc]
        # HDF5 reads ".." in a path as a name; the mount normalises it (docs/CONTRACT.md,
        # "Links").
        plain = [p for p in dsets if ".." not in p.split("/")]
        soft = not plain or draw(st.integers(0, 2)) > 0
        target = draw(st.sampled_from(
            [p for p in sorted(paths) if ".." not in p.split("/")] if soft else plain))
        below = group.rstrip("/") + "/"
        if soft and target.startswith(below) and target != below and draw(st.booleans()):
            target = target[len(below):]  # relative, downwards (HDF5 has no "..")
        links.append(LinkSpec(group, name, target, soft))
    domain = draw(st.sampled_from(("f.h5", "odd name %.h5", "é.h5", "a.b.h5")))
    return FileSpec(root, tuple(links), domain, draw(st.booleans()),
                    draw(st.sampled_from(("json", "json", "tar"))),
                    draw(st.integers(0, 2**31)))


# --------------------------------------------------------------------------- HDF5 writer


def _dataset_values(spec: DsetSpec) -> np.ndarray:
    """The data of ``spec``, from its seed: extremes, NaN/inf and -0.0 sprinkled in."""
    rng = np.random.default_rng(spec.seed)
    n = math.prod(spec.shape)
    if spec.dtype == "vlen":
        flat = np.array([TEXTS[i] for i in rng.integers(0, len(TEXTS), n)], dtype=object)
        return flat.reshape(spec.shape)
    dtype = np.dtype(spec.dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(int(info.min), int(info.max), n, endpoint=True,
                            dtype=dtype.newbyteorder("=")).astype(dtype)
        specials: list[Any] = [info.min, info.max, 0, 1]
    elif dtype.kind == "f":
        scale = 10.0 ** rng.integers(-4, 6)
        with np.errstate(over="ignore"):
            flat = (rng.standard_normal(n) * scale).astype(dtype)
        specials = [np.nan, np.inf, -np.inf, -0.0, np.finfo(dtype).max, np.finfo(dtype).tiny]
    elif dtype.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
        specials = [True, False]
    else:
        lengths = rng.integers(0, dtype.itemsize + 1, n)
        chars = _PRINTABLE[rng.integers(0, len(_PRINTABLE), (n, dtype.itemsize))]
        flat = np.array([bytes(chars[i, :lengths[i]]) for i in range(n)], dtype=dtype)
        specials = [b"", b"\x7e" * dtype.itemsize]
    for pos in rng.integers(0, max(n, 1), min(n, 4)):
        flat[pos] = specials[int(pos) % len(specials)]
    return flat.reshape(spec.shape)


def _write_attrs(obj: h5py.Group | h5py.Dataset, attrs: tuple[AttrSpec, ...]) -> None:
    for attr in attrs:
        if isinstance(attr.value, str):
            obj.attrs[attr.name] = attr.value
        else:
            obj.attrs.create(attr.name, attr.value, dtype=attr.value.dtype)


def _write_dataset(group: h5py.Group, spec: DsetSpec) -> None:
    kwargs: dict[str, Any] = {}
    if spec.chunks is not None:
        kwargs.update(chunks=spec.chunks, maxshape=spec.maxshape, shuffle=spec.shuffle,
                      fletcher32=spec.fletcher32)
        if spec.gzip is not None:
            kwargs.update(compression="gzip", compression_opts=spec.gzip)
    dtype: Any = h5py.string_dtype() if spec.dtype == "vlen" else np.dtype(spec.dtype)
    if spec.fill is not None:
        kwargs["fillvalue"] = np.array(spec.fill, dtype=dtype)
    ds = group.create_dataset(spec.name, shape=spec.shape, dtype=dtype, **kwargs)
    values = _dataset_values(spec)
    if spec.written == "all" and values.size:
        ds[...] = values
    elif spec.written == "part" and values.size:
        rng = np.random.default_rng(spec.seed + 1)
        box = []
        for n in spec.shape:
            lo = int(rng.integers(0, n))
            box.append(slice(lo, int(rng.integers(lo + 1, n + 1))))
        ds[tuple(box)] = values[tuple(box)]
    elif spec.written == "all" and spec.shape == ():
        ds[()] = values[()]
    _write_attrs(ds, spec.attrs)


def _write_group(group: h5py.Group, spec: GroupSpec) -> None:
    _write_attrs(group, spec.attrs)
    for child in spec.children:
        if isinstance(child, GroupSpec):
            _write_group(group.create_group(child.name), child)
        else:
            _write_dataset(group, child)


def write_h5(spec: FileSpec, path: Path) -> Path:
    """Write ``spec`` as an HDF5 file with h5py."""
    with h5py.File(path, "w") as f:
        _write_group(f, spec.root)
        for link in spec.links:
            group = f[link.group]
            group[link.name] = h5py.SoftLink(link.target) if link.soft else f[link.target]
    return path


# --------------------------------------------------------------------------- HSDS writer


def _hsds_compress() -> Callable[..., bytes]:
    """HSDS 1.0.2's own chunk writer (``storUtil._compress``), its logging muted."""
    from hsds import hsds_logger  # noqa: PLC0415  (slow import, only when writing buckets)
    from hsds.util.storUtil import _compress  # noqa: PLC0415

    hsds_logger.config["log_level"] = hsds_logger.ERROR
    return _compress  # type: ignore[no-any-return]


def _type_item(dtype: np.dtype[Any]) -> dict[str, Any]:
    from h5json.hdf5dtype import getTypeItem  # noqa: PLC0415

    return getTypeItem(dtype)  # type: ignore[no-any-return]


def _json_value(value: Any) -> Any:
    """An h5py value as HSDS stores it in JSON (bytes as text, NaN kept)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_json_value(v) for v in value]
    if isinstance(value, np.generic):
        return _json_value(value.item())
    return value


def _shape_json(shape: tuple[int, ...] | None, maxshape: tuple[int | None, ...] | None,
                unlimited_word: bool = False) -> dict[str, Any]:
    if shape is None:
        return {"class": "H5S_NULL"}
    if shape == ():
        return {"class": "H5S_SCALAR"}
    doc: dict[str, Any] = {"class": "H5S_SIMPLE", "dims": list(shape)}
    if maxshape is not None:
        doc["maxdims"] = [("H5S_UNLIMITED" if unlimited_word else 0) if m is None else m
                          for m in maxshape]
    return doc


def _attrs_json(obj: h5py.HLObject) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in obj.attrs:
        aid = obj.attrs.get_id(name)
        value = obj.attrs[name]
        out[name] = {"type": _type_item(aid.dtype), "shape": _shape_json(aid.shape, aid.shape),
                     "value": _json_value(value), "created": STAMP}
    return out


def _filters(choice: HsdsChoice) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if choice.shuffle == "shuffle":
        out.append({"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "shuffle"})
    elif choice.shuffle == "bitshuffle":
        out.append({"class": "H5Z_FILTER_SHUFFLE", "id": 2, "name": "bitshuffle"})
    elif choice.shuffle == "bitshuffle_class":
        out.append({"class": "H5Z_FILTER_BITSHUFFLE", "id": 32008, "name": "bitshuffle"})
    compressor = {"deflate": ("H5Z_FILTER_DEFLATE", 1), "lz4": ("H5Z_FILTER_LZ4", 32004),
                  "lz4hc": ("H5Z_FILTER_LZ4HC", 32005), "zstd": ("H5Z_FILTER_ZSTD", 32015),
                  "blosclz": ("H5Z_FILTER_BLOSC", 32001)}.get(choice.compressor or "")
    if compressor is not None:
        out.append({"class": compressor[0], "id": compressor[1], "name": choice.compressor,
                    "level": choice.level})
    return out


def _filter_ops(choice: HsdsChoice, vlen: bool) -> dict[str, Any]:
    """``datanode_lib.getFilterOps`` for these filters (a copy: that module is slow to
    import): shuffle only from a SHUFFLE-class filter and never for vlen types; the
    Blosc codec name is ``zlib`` for deflate, else the filter's name."""
    ops: dict[str, Any] = {"shuffle": 0, "compressor": None, "level": 5}
    if not vlen and choice.shuffle == "shuffle":
        ops["shuffle"] = 1
    elif not vlen and choice.shuffle == "bitshuffle":
        ops["shuffle"] = 2
    if choice.compressor is not None:
        ops["compressor"] = "zlib" if choice.compressor == "deflate" else choice.compressor
        ops["level"] = choice.level
    return ops


class IdMaker:
    """Deterministic schema-v2 ids (the shape of ``h5json.objid.createObjId``)."""

    def __init__(self, seed: str) -> None:
        self.seed = seed
        self.count = 0
        token = hashlib.sha256(seed.encode()).hexdigest()[:16]
        rotated = "".join(f"{(int(c, 16) + 8) % 16:x}" for c in token)
        self.root = self._format("g", token + rotated)

    @staticmethod
    def _format(prefix: str, token: str) -> str:
        return (f"{prefix}-{token[0:8]}-{token[8:16]}-{token[16:20]}-{token[20:26]}-"
                f"{token[26:32]}")

    def new(self, prefix: str) -> str:
        self.count += 1
        tail = hashlib.sha256(f"{self.seed}:{self.count}".encode()).hexdigest()
        return self._format(prefix, self.root[2:19].replace("-", "") + tail[16:32])


def obj_key(obj_id: str, root_id: str) -> str:
    """The key of an object's JSON (schema v2)."""
    kind, rest = obj_id[0], obj_id[2:]
    uuid1 = rest[:17]
    if obj_id == root_id:
        return f"db/{uuid1}/.group.json"
    name = {"g": ".group.json", "d": ".dataset.json", "t": ".datatype.json"}[kind]
    return f"db/{uuid1}/{kind}/{rest[18:]}/{name}"


def chunk_key(dset_id: str, index: tuple[int, ...], partitions: int) -> str:
    rest = dset_id[2:]
    prefix = f"db/{rest[:17]}/d/{rest[18:]}/"
    if partitions >= 2:
        primes = (29, 31, 37, 41, 43, 47, 53, 59, 61, 67)
        total = sum(i * primes[d % 10] for d, i in enumerate(index))
        prefix += f"p{total % partitions}/"
    return prefix + "_".join(str(i) for i in index)


@dataclass
class HsdsDomain:
    """What ``write_hsds_domain`` wrote: ids by HDF5 path (every path of an
    object), the chunk shape and stored chunk bytes (decoded) of each dataset id,
    and every key written (object JSON, chunks) with the id it belongs to."""

    domain: str
    root_id: str
    ids: dict[str, str] = field(default_factory=dict)
    chunks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    stored: dict[str, dict[tuple[int, ...], bytes]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    chunk_keys: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    #: Chunks whose bitshuffled stream is exactly as long as the chunk (the reader
    #: once took them for unshuffled data: ``test_bitshuffle_stream_of_chunk_size``).
    bitshuffle_exact: set[tuple[str, tuple[int, ...]]] = field(default_factory=set)


class BucketWriter:
    """Writes HSDS keys under a bucket directory (files, as HSDS's POSIX driver does)."""

    def __init__(self, bucket: Path) -> None:
        self.bucket = bucket

    def put(self, key: str, data: bytes) -> None:
        path = self.bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def put_json(self, key: str, doc: Any) -> None:
        self.put(key, json.dumps(doc).encode())

    def folder(self, path: str) -> None:
        key = f"{path}/.domain.json"
        if not (self.bucket / key).exists():
            self.put_json(key, {"owner": "admin", "acls": _ACLS, "created": STAMP,
                                "lastModified": STAMP})


def _dataset_json(ds: h5py.Dataset, did: str, root_id: str, choice: HsdsChoice
                  ) -> tuple[dict[str, Any], tuple[int, ...]]:
    """The dataset's JSON and its HSDS chunk shape."""
    shape = ds.shape
    layout: dict[str, Any]
    if shape == ():
        chunks: tuple[int, ...] = ()
        layout = {"class": "H5D_CONTIGUOUS"}
    elif choice.layout == "contiguous":
        chunks = shape
        layout = {"class": "H5D_CONTIGUOUS"}
    else:
        chunks = choice.chunks
        layout = {"class": "H5D_CHUNKED", "dims": list(chunks)}
    if choice.partitions >= 2 and shape:
        layout["partition_count"] = choice.partitions
    cprops: dict[str, Any] = {}
    if choice.layout == "top" and shape:
        top = layout
        cprops["layout"] = {"class": "H5D_CHUNKED"}
    else:
        top = None
        cprops["layout"] = layout
    filters = _filters(choice)
    if filters:
        cprops["filters"] = filters
    if ds.dtype.kind != "O":
        fill = np.asarray(ds.fillvalue, dtype=ds.dtype)
        raw = fill.tobytes()
        if choice.fill == "base64":
            cprops["fillValue"] = base64.b64encode(raw).decode()
            cprops["fillValue_encoding"] = "base64"
        elif choice.fill == "json" or any(raw):
            cprops["fillValue"] = _json_value(fill[()])
    doc: dict[str, Any] = {
        "id": did, "root": root_id, "created": STAMP, "lastModified": STAMP,
        "type": _type_item(ds.dtype),
        "shape": _shape_json(shape, ds.maxshape, choice.unlimited_word),
        "attributes": _attrs_json(ds), "creationProperties": cprops,
    }
    if top is not None:
        doc["layout"] = top
    return doc, chunks


def _chunk_blocks(ds: h5py.Dataset, chunks: tuple[int, ...]
                  ) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """Each HSDS chunk of ``ds``: the full chunk, padded with the fill value."""
    data = ds[()] if ds.dtype.kind != "O" else ds.asstr()[()]
    if ds.shape == ():
        yield (0,), np.asarray(data, dtype=h5py.string_dtype() if ds.dtype.kind == "O"
                               else ds.dtype).reshape(1)
        return
    fill: Any = "" if ds.dtype.kind == "O" else ds.fillvalue
    grid = [-(-n // c) for n, c in zip(ds.shape, chunks, strict=True)]
    for index in np.ndindex(*grid):
        region = tuple(slice(i * c, min((i + 1) * c, n))
                       for i, c, n in zip(index, chunks, ds.shape, strict=True))
        block = np.full(chunks, fill, dtype=h5py.string_dtype() if ds.dtype.kind == "O"
                        else ds.dtype)
        block[tuple(slice(0, r.stop - r.start) for r in region)] = data[region]
        yield tuple(index), block


def write_hsds_domain(h5: Path, writer: BucketWriter, domain: str,
                      choices: Callable[[str], HsdsChoice | None], salt: str) -> HsdsDomain:
    """Write ``h5`` as domain ``domain`` (``home/fuzz/f.h5``) of the bucket.

    ``choices(h5path)`` gives the HSDS choices for the dataset at that path (None:
    plain defaults). Hard links to one object share its JSON and id.
    """
    from h5json.array_util import arrayToBytes  # noqa: PLC0415

    compress = _hsds_compress()
    ids = IdMaker(f"{salt}:{domain}")
    out = HsdsDomain(domain, ids.root)
    seen: dict[Any, str] = {}

    def dataset(ds: h5py.Dataset, path: str) -> str:
        did = ids.new("d")
        choice = choices(path) or HsdsChoice(
            chunks=tuple(max(n, 1) for n in ds.shape), compressor=None, level=5, shuffle="none",
            partitions=0, layout="cprops", fill="json", skip_fill_chunks=False,
            unlimited_word=False)
        doc, chunks = _dataset_json(ds, did, ids.root, choice)
        key = obj_key(did, ids.root)
        writer.put_json(key, doc)
        out.keys[key] = did
        out.chunks[did] = chunks
        stored: dict[tuple[int, ...], bytes] = {}
        vlen = ds.dtype.kind == "O"
        ops = _filter_ops(choice, vlen)
        fill_block: bytes | None = None
        for index, block in _chunk_blocks(ds, chunks):
            if vlen:
                raw = bytes(arrayToBytes(block))
                chunk_file = bytes(numcodecs.VLenUTF8().encode(block.reshape(-1)))
            else:
                raw = block.tobytes()
                if fill_block is None:
                    fill_block = np.full(block.shape, ds.fillvalue, dtype=ds.dtype).tobytes()
                if choice.skip_fill_chunks and raw == fill_block:
                    continue
                chunk_file = raw
            data = compress(raw, compressor=ops["compressor"], level=ops["level"],
                            shuffle=ops["shuffle"], dtype=ds.dtype, chunk_shape=block.shape)
            if ops["shuffle"] == 2 and len(compress(
                    raw, compressor=None, shuffle=2, dtype=ds.dtype,
                    chunk_shape=block.shape)) == len(raw):
                out.bitshuffle_exact.add((did, index))
            ckey = chunk_key(did, index, choice.partitions if ds.shape else 0)
            writer.put(ckey, bytes(data))
            out.chunk_keys[ckey] = (did, index)
            stored[index] = chunk_file
        out.stored[did] = stored
        return did

    def group(grp: h5py.Group, path: str, gid: str) -> None:
        links: dict[str, Any] = {}
        for name in grp:
            link = grp.get(name, getlink=True)
            child_path = _join(path, name)
            if isinstance(link, h5py.SoftLink):
                links[name] = {"class": "H5L_TYPE_SOFT", "h5path": link.path, "created": STAMP}
                continue
            obj = grp[name]
            if obj.id in seen:
                child = seen[obj.id]
            elif isinstance(obj, h5py.Group):
                child = seen[obj.id] = ids.new("g")
                group(obj, child_path, child)
            else:
                child = seen[obj.id] = dataset(obj, child_path)
            out.ids[child_path] = child
            links[name] = {"class": "H5L_TYPE_HARD", "id": child, "created": STAMP}
        key = obj_key(gid, ids.root)
        writer.put_json(key, {"id": gid, "root": ids.root, "created": STAMP,
                              "lastModified": STAMP, "links": links,
                              "attributes": _attrs_json(grp)})
        out.keys[key] = gid

    with h5py.File(h5, "r") as f:
        seen[f.id] = ids.root
        out.ids["/"] = ids.root
        group(f, "/", ids.root)
    parts = domain.split("/")
    for depth in range(1, len(parts)):
        writer.folder("/".join(parts[:depth]))
    writer.put_json(f"{domain}/.domain.json", {"root": ids.root, "owner": "admin",
                                               "acls": _ACLS, "created": STAMP,
                                               "lastModified": STAMP})
    return out


# --------------------------------------------------------------------------- LINDI


_LINDI_SERVER = r"""
import json, os, sys, traceback
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # whatever lindi prints must not reach the replies
import lindi
for line in sys.stdin:
    job = json.loads(line)
    try:
        if job["format"] == "json":
            store = lindi.LindiH5ZarrStore.from_file(job["h5"], url=job["h5"])
            try:
                store.write_reference_file_system(job["out"])
            finally:
                store.close()
        else:
            source = lindi.LindiH5pyFile.from_hdf5_file(job["h5"], url=job["h5"])
            source.write_lindi_file(job["out"])
            source.close()
        reply = {"id": job["id"], "ok": True}
    except Exception as exc:
        reply = {"id": job["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc()}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


class LindiError(RuntimeError):
    """lindi refused or failed to convert a file."""


class LindiConverter:
    """One lindi 0.4.6 process (``.venv-lindi``) converting HDF5 files on request.

    Each request carries an id that its reply echoes. A conversion that takes
    longer than ``TIMEOUT`` kills the process (the next request starts another),
    so a late reply can never be taken for the answer to a later request.
    """

    #: Longest wait for one conversion, in seconds.
    TIMEOUT = 300.0

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._next = 0

    def _process(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            tiers.uses("tools")
            self._proc = subprocess.Popen(
                [str(LINDI_PYTHON), "-c", _LINDI_SERVER], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        return self._proc

    def convert(self, h5: Path, out: Path, fmt: str = "json") -> Path:
        """Write ``out`` (a ``.lindi.json`` or ``.lindi.tar``) from ``h5``; raise
        ``LindiError`` with lindi's traceback if it fails."""
        proc = self._process()
        assert proc.stdin is not None and proc.stdout is not None
        self._next += 1
        job = {"id": self._next, "h5": str(h5), "out": str(out), "format": fmt}
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], self.TIMEOUT)
        if not ready:
            self.close()
            raise LindiError(f"lindi took more than {self.TIMEOUT} s to convert {h5}")
        line = proc.stdout.readline()
        if not line:
            self.close()
            raise LindiError(f"the lindi process ended (exit {proc.poll()})")
        reply = json.loads(line)
        if reply["id"] != job["id"]:
            self.close()
            raise LindiError(f"reply {reply['id']} to request {job['id']}")
        if not reply["ok"]:
            raise LindiError(reply["traceback"])
        return out

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def lindi_available() -> bool:
    return LINDI_PYTHON.exists()


# --------------------------------------------------------------------------- damage


class Deep:
    """A placeholder for JSON nested ``depth`` lists deep (written by ``dump_json``)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth


def dump_json(doc: Any) -> bytes:
    """``doc`` as JSON (NaN and Infinity as Python writes them), ``Deep`` expanded."""
    deep: list[Deep] = []

    def default(value: Any) -> Any:
        if isinstance(value, Deep):
            deep.append(value)
            return f"\0deep{len(deep) - 1}\0"
        raise TypeError(type(value))

    text = json.dumps(doc, default=default)
    for i, item in enumerate(deep):
        text = text.replace(f'"\\u0000deep{i}\\u0000"', "[" * item.depth + "]" * item.depth)
    return text.encode("utf-8", "surrogatepass")


#: Values put where metadata expects something else.
HOSTILE: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 3, 2**31, 2**32 + 1, 2**53 + 1, 2**63, 2**64 + 7, -(2**63) - 1,
    10**40, 1.5, -0.0, float("nan"), float("inf"), float("-inf"), 1e308, "", "x", "0",
    "-1", "NaN", "H5T_BOGUS", "H5S_SIMPLE", "H5T_STD_I128LE", "H5T_VARIABLE",
    "g-00000000-00000000-0000-000000-000000", "d-ffffffff-ffffffff-ffff-ffffff-ffffff",
    "\ud800", "é" * 50, "/", "../../..", [], {}, [[]], [0], [-1], [2**62, 2**62], [1, 2, 3],
    [None], {"class": "H5T_COMPOUND", "fields": []}, {"class": "H5S_SIMPLE", "dims": [-5]},
    {"class": "H5T_ARRAY", "dims": [0], "base": "H5T_STD_I8LE"},
    {"class": "H5T_STRING", "length": 2**40}, Deep(100_000), Deep(200),
)


def _json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every location inside a JSON document (keys and indices), depth first."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _json_paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:8]):
            yield from _json_paths(value, (*prefix, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    elif delete:
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return doc


@dataclass(frozen=True)
class Damage:
    """What was done to one stored object, for the failure report."""

    key: str
    what: str


@st.composite
def damaged_json(draw: st.DrawFn, raw: bytes) -> tuple[bytes, str]:
    """``raw`` (a JSON object) damaged: one location replaced, deleted or wrapped,
    or the whole text replaced by garbage. Returns the new bytes and a description."""
    how = draw(st.sampled_from(("replace", "replace", "replace", "delete", "wrap", "text",
                                "bytes")))
    if how == "bytes":
        choice = draw(st.sampled_from((b"", b"{", b"null", b"[]", b"\xff\xfe{}", b"1e99999",
                                       b'{"a": NaN}', raw[:len(raw) // 2], raw + b"}",
                                       b"\xef\xbb\xbf" + raw, raw.replace(b'"', b"'", 1))))
        return choice, f"bytes {choice[:40]!r}"
    doc = json.loads(raw)
    paths = list(_json_paths(doc))
    path = draw(st.sampled_from(paths))
    if how == "delete" and path:
        return dump_json(_set(doc, path, None, delete=True)), f"delete {list(path)}"
    if how == "wrap":
        old = doc
        for step in path:
            old = old[step]
        return dump_json(_set(doc, path, [old])), f"wrap {list(path)} in a list"
    if how == "text":
        old = doc
        for step in path:
            old = old[step]
        return dump_json(_set(doc, path, json.dumps(old))), f"stringify {list(path)}"
    value = draw(st.sampled_from(HOSTILE))
    shown = f"Deep({value.depth})" if isinstance(value, Deep) else repr(value)[:60]
    return dump_json(_set(doc, path, value)), f"set {list(path)} = {shown}"


@st.composite
def damaged_bytes(draw: st.DrawFn, raw: bytes) -> tuple[bytes, str]:
    """A stored chunk damaged: truncated, extended, overwritten or replaced."""
    how = draw(st.sampled_from(("truncate", "extend", "flip", "garbage", "empty", "blosc",
                                "zlib")))
    if how == "truncate" and raw:
        n = draw(st.integers(0, len(raw) - 1))
        return raw[:n], f"truncate to {n} of {len(raw)} bytes"
    if how == "extend":
        extra = draw(st.binary(min_size=1, max_size=64))
        return raw + extra, f"append {len(extra)} bytes"
    if how == "flip" and raw:
        pos = draw(st.integers(0, len(raw) - 1))
        out = bytearray(raw)
        out[pos] ^= 0xFF
        return bytes(out), f"flip byte {pos} of {len(raw)}"
    if how == "garbage":
        data = draw(st.binary(min_size=1, max_size=max(1, len(raw) + 16)))
        return data, f"replace with {len(data)} random bytes"
    if how == "blosc":
        # A Blosc header that claims a huge decoded size but holds nothing.
        nbytes = draw(st.sampled_from((2**31 - 1, 2**31 + 5, 2**32 - 1, len(raw) + 1)))
        header = bytes([2, 1, 1, 4]) + nbytes.to_bytes(4, "little") + \
            (0).to_bytes(4, "little") + (16).to_bytes(4, "little")
        return header, f"Blosc header claiming {nbytes} bytes"
    if how == "zlib":
        data = zlib.compress(raw + raw[:7])
        return data, "raw zlib of the wrong size"
    return b"", "empty"


#: Byte ranges and inline values put into a LINDI chunk reference.
HOSTILE_REFS: tuple[Any, ...] = (
    ["{{u1}}", -1, 10], ["{{u1}}", 0, -5], ["{{u1}}", 2**62, 100], ["{{u1}}", 0, 2**40],
    ["{{u1}}", float("nan"), 4], ["{{u1}}", "0", "8"], ["/nonexistent/file.h5", 0, 8],
    ["{{nope}}", 0, 8], ["{{u1}}"], [], [1, 2, 3], "base64:!!!", "base64:", "base64:AAAA",
    "", "plain text chunk", 7, None, {"x": 1},
)


@dataclass(frozen=True)
class RefDamage:
    """Damage done to a reference file: the new bytes, what was done, the HDF5
    path of the object it spoils (None: the whole file) and, for one chunk of a
    dataset, that chunk's name."""

    data: bytes
    what: str
    owner: str | None
    chunk: str | None = None


def _owner(key: str) -> str:
    return "/" + key.rpartition("/")[0]


@st.composite
def damaged_refs(draw: st.DrawFn, raw: bytes) -> RefDamage:
    """A ``.lindi.json`` damaged: one ref's JSON, one chunk ref, a new ref, or the
    whole file."""
    doc = json.loads(raw)
    refs = doc.get("refs", doc)
    how = draw(st.sampled_from(("meta", "meta", "chunk", "chunk", "top", "add")))
    keys = sorted(refs)
    meta = [k for k in keys if k.rsplit("/", 1)[-1].startswith(".z")]
    chunks = [k for k in keys if k not in meta]
    if how == "chunk" and chunks:
        key = draw(st.sampled_from(chunks))
        value = draw(st.sampled_from(HOSTILE_REFS))
        refs[key] = value
        return RefDamage(dump_json(doc), f"refs[{key!r}] = {value!r}", _owner(key),
                         key.rpartition("/")[2])
    if how == "meta" and meta:
        key = draw(st.sampled_from(meta))
        old = refs[key]
        text = json.dumps(old) if not isinstance(old, str) else old
        new, what = draw(damaged_json(text.encode()))
        as_string = draw(st.booleans())
        try:
            value: Any = new.decode("utf-8") if as_string else json.loads(new)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            value = new.decode("utf-8", "replace")
        refs[key] = value
        return RefDamage(dump_json(doc), f"refs[{key!r}]: {what}", _owner(key))
    if how == "add" and keys:
        picked = draw(st.sampled_from(keys))
        base = picked.rsplit("/", 1)[0] if "/" in picked else ""
        name = draw(st.sampled_from(("99.99", "0.0.0", "-1", "a", ".zarray", ".zgroup",
                                     "x/.zarray", "01")))
        key = f"{base}/{name}" if base else name
        refs[key] = draw(st.sampled_from((*HOSTILE_REFS, {"zarr_format": 2})))
        return RefDamage(dump_json(doc), f"add refs[{key!r}] = {refs[key]!r}", "/" + base)
    top = draw(st.sampled_from(("refs_list", "version", "templates", "truncate", "empty",
                                "not_object")))
    if top == "refs_list" and "refs" in doc:
        doc["refs"] = list(doc["refs"])
    elif top == "version":
        doc["version"] = draw(st.sampled_from(HOSTILE[:20]))
    elif top == "templates":
        doc["templates"] = draw(st.sampled_from(({"u1": 5}, [], {"u1": "{{u1}}"}, "x")))
    elif top == "truncate":
        return RefDamage(raw[:len(raw) // 2], "truncate the file", None)
    elif top == "empty":
        return RefDamage(b"", "empty file", None)
    else:
        return RefDamage(b"[1, 2]", "a JSON list", None)
    return RefDamage(dump_json(doc), f"top level: {top}", None)


def damage_file(path: Path, data: bytes) -> None:
    """Replace ``path``'s bytes (the HSDS POSIX driver writes files in place)."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, 0o644)
    path.write_bytes(data)
