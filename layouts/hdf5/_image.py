"""HDF5 file images: the skeleton file the ``D.h5`` view of a domain serves.

Owns ``build_image``, which writes the plan of a skeleton
(``layouts.hdf5._plan.Skeleton``: the objects in creation order, the links
that are not the first path to an object, and what was left out) with h5py
into a scratch file and returns the file as a ``FileImage``: the bytes HDF5 wrote, and the places
of the datasets' elements, which it allocated but never wrote. The plan is
made by the tree (``mountd.tree.h5view``), which serves those places from
the datasets themselves; this module knows HDF5 and nothing of the mount.

What a skeleton holds:

* every group, committed datatype and dataset header, each created at the
  first path it was reached by, with its attributes (HDF5 types as stored,
  or inferred from the value when the format keeps none);
* hard links (cycles too), soft links and external links as links;
* a fixed-size dataset with its elements inside the file (``stored``):
  chunked as stored (``chunks``: each chunk a place of its own, which the
  file's server fills with the decoded chunk), else contiguous, or one chunk
  of its whole shape when it is extendible (so its ``maxshape`` is kept);
  allocated when it is made, never written, never filtered; the file names
  no other file for its data;
* a dataset of variable-length strings or sequences, or of object
  references, embedded with its data;
* object references pointing at the skeleton's own objects, and dimension
  scales attached again through the HDF5 dimension-scale API (so
  ``DIMENSION_LIST`` and ``REFERENCE_LIST`` are right for HDF5's own tools
  and netCDF-4 readers);
* ``LEFT_OUT_ATTR`` on the root group when anything could not be shown:
  one ``"PATH: reason"`` string per object or attribute (at most
  ``LEFT_OUT_LINES`` of them and ``LEFT_OUT_BYTES``; ``FileImage.left_out``
  has them all).

The file is written with ``libver="earliest"`` (so HDF5 1.8 and later
open it), its metadata first, in one block as long as ``_bound`` says
(``_write``), and padded to the length ``_bound`` promised.

Concurrency: ``build_image`` is synchronous and blocks on h5py; the tree
runs it in a worker thread, one at a time (h5py serialises its calls behind
one lock anyway). Plans are built once and only read here.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
import orjson
from h5py import h5a, h5d, h5ds, h5f, h5o, h5p, h5r, h5s, h5t

from layouts.errors import FormatError
from layouts.hdf5._bound import size_bound
from layouts.hdf5._plan import (
    LEFT_OUT_ATTR,
    LEFT_OUT_BYTES,
    LEFT_OUT_LINES,
    PAGE,
    AttrPlan,
    Bound,
    ObjPlan,
    PlanRef,
    Skeleton,
    Unsupported,
    chunked,
    flatten,
    infer,
    storage_chunks,
)
from layouts.hdf5._types import HType, parsed_type
from layouts.model import LinkKind, ObjectKind, chunk_grid

#: Attributes the dimension-scale API writes itself (``attach_scale``, ``set_scale``).
_SCALE_ATTRS = ("DIMENSION_LIST", "REFERENCE_LIST")

_PADS = {
    "H5T_STR_NULLTERM": h5t.STR_NULLTERM,
    "H5T_STR_NULLPAD": h5t.STR_NULLPAD,
    "H5T_STR_SPACEPAD": h5t.STR_SPACEPAD,
}


@dataclass(frozen=True, slots=True)
class ChunkPart:
    """The place of chunk ``index`` (grid coordinates) of dataset ``obj_id``:
    the chunk's decoded bytes, a whole chunk (edge chunks too)."""

    obj_id: str
    index: tuple[int, ...]


#: What one part of a ``FileImage`` is (see there).
Part = bytes | str | ChunkPart | int


@dataclass(frozen=True, slots=True)
class FileImage:
    """An HDF5 file as ``build_image`` wrote it: ``size`` bytes in ``parts``
    that follow each other from offset 0 (part ``i`` begins at ``starts[i]``).
    A part is the bytes HDF5 wrote there, the id of a dataset whose ``stored``
    elements fill it (never written: the file's server reads them from the
    dataset), a ``ChunkPart`` (one whole chunk of such a dataset), or the
    length of a run of zeros (space nothing was written to).
    ``left_out`` says what the file does not hold.

    No page (``PAGE`` bytes) holds both a dataset's elements and metadata: a
    reader of the file through a page cache, which reads whole pages, never
    needs a dataset's elements (which may fail to read) to read metadata.
    Elements of datasets smaller than a page may share pages with each other."""

    size: int
    starts: list[int]
    parts: list[Part]
    left_out: list[str]

    @property
    def written(self) -> int:
        """Bytes of the parts HDF5 wrote (what keeping the image costs)."""
        return sum(len(part) for part in self.parts if isinstance(part, bytes))

    def part_end(self, index: int) -> int:
        """Where part ``index`` ends."""
        return self.starts[index + 1] if index + 1 < len(self.starts) else self.size


# --------------------------------------------------------------------------- types


def _parse(tj: Any) -> HType:
    """The parsed type JSON (kept per distinct JSON by ``layouts.hdf5._types``)."""
    return parsed_type(tj)[0]


def has_ref(t: HType) -> bool:
    """True if the type holds an object or region reference anywhere."""
    if t.cls in ("ref", "regionref"):
        return True
    if t.base is not None and has_ref(t.base):
        return True
    return any(has_ref(ft) for _, ft in t.fields)


def external_ok(tj: Any) -> bool:
    """True if a dataset of this type can be stored as its chunk files' bytes:
    fixed-size and free of references (HSDS keeps a reference as an id string,
    HDF5 as an address)."""
    try:
        t = _parse(tj)
    except FormatError:
        return False
    return t.dtype is not None and not has_ref(t)


def file_type(tj: Any) -> h5t.TypeID:
    """The HDF5 type for type JSON ``tj``, as stored: byte order, string
    padding and character set, enum members, opaque tag, and for a compound
    the packed field offsets its chunk files use."""
    try:
        return _type_id(tj, _parse(tj))
    except FormatError as exc:
        raise Unsupported(str(exc)) from exc


def _sub(tj: Any, key: str) -> Any:
    return tj[key] if isinstance(tj, Mapping) else tj


def _type_id(tj: Any, t: HType) -> h5t.TypeID:
    cls = t.cls
    if cls in ("int", "float"):
        assert t.dtype is not None
        return h5t.py_create(t.dtype)
    if cls == "enum":
        base = _sub(tj, "base")
        enum = h5t.enum_create(_type_id(base, _parse(base)))
        for name, value in t.members.items():
            enum.enum_insert(name.encode("utf-8"), value)
        return enum
    if cls in ("string", "vstr"):
        text = h5t.C_S1.copy()
        if cls == "vstr":
            text.set_size(h5t.VARIABLE)
        else:
            assert t.dtype is not None
            text.set_size(t.dtype.itemsize)
        text.set_cset(h5t.CSET_UTF8 if t.utf8 else h5t.CSET_ASCII)
        default = h5t.STR_NULLTERM if cls == "vstr" else h5t.STR_NULLPAD
        text.set_strpad(_PADS.get(tj.get("strPad"), default) if isinstance(tj, Mapping)
                        else default)
        return text
    if cls == "opaque":
        assert t.dtype is not None
        opaque = h5t.create(h5t.OPAQUE, t.dtype.itemsize)
        tag = tj.get("tag") if isinstance(tj, Mapping) else None
        if isinstance(tag, str) and tag:
            opaque.set_tag(tag.encode("utf-8"))
        return opaque
    if cls == "ref":
        return h5t.STD_REF_OBJ.copy()
    if cls == "regionref":
        raise Unsupported("region references are not copied")
    if cls == "vlen" and t.base is not None:
        return h5t.vlen_create(_type_id(_sub(tj, "base"), t.base))
    if cls == "array" and t.base is not None:
        return h5t.array_create(_type_id(_sub(tj, "base"), t.base), t.dims)
    if cls == "compound":
        if has_ref(t):
            raise Unsupported("compound types with reference fields are not copied")
        if t.dtype is None:  # variable-length fields: h5py's packed layout of them
            return h5t.py_create(mem_dtype(t), logical=True)
        compound = h5t.create(h5t.COMPOUND, t.dtype.itemsize)
        assert t.dtype.fields is not None
        for (name, ft), item in zip(t.fields, tj["fields"], strict=True):
            compound.insert(name.encode("utf-8"), t.dtype.fields[name][1],
                            _type_id(item["type"], ft))
        return compound
    raise Unsupported(f"type class {cls} is not copied")


def mem_dtype(t: HType) -> np.dtype[Any]:
    """The NumPy dtype h5py writes elements of a type with variable-length
    or reference parts from (objects where those parts are)."""
    if t.dtype is not None and not has_ref(t):
        return t.dtype
    if t.cls == "vstr":
        return h5py.string_dtype("utf-8" if t.utf8 else "ascii")
    if t.cls == "ref":
        return h5py.ref_dtype
    if t.cls == "vlen" and t.base is not None and t.base.dtype is not None \
            and not has_ref(t.base):
        return h5py.vlen_dtype(t.base.dtype)
    if t.cls == "compound" and not has_ref(t):
        return np.dtype([(name, mem_dtype(ft)) for name, ft in t.fields])
    raise Unsupported(f"{t.cls} values of this kind are not copied")


class _Writer:
    """Builds one image: objects with their attributes (those that point at
    objects once every object exists), then links and dimension scales."""

    def __init__(self, skeleton: Skeleton, f: h5py.File) -> None:
        self.skeleton = skeleton
        self.file = f
        #: Open groups and datatypes by id. Datasets are closed once made (an
        #: open one holds its object header: 100,000 of them cost gigabytes)
        #: and opened again by path when attributes, links or scales need them.
        self.ids: dict[str, Any] = {}
        self.datasets: set[str] = set()
        #: Where the ``stored`` elements of each dataset made are: (offset, bytes,
        #: id), or one per chunk (offset, bytes, ``ChunkPart``).
        self.regions: list[tuple[int, int, str | ChunkPart]] = []
        self.left_out = list(skeleton.left_out)
        self.types: dict[bytes, h5t.TypeID] = {}
        self.paths = {plan.id: plan.path for plan in skeleton.objects}
        #: Link properties of names that are not ASCII (one list serves every link).
        self.lcpl = h5p.create(h5p.LINK_CREATE)
        self.lcpl.set_char_encoding(h5t.CSET_UTF8)

    def lcpl_for(self, name: bytes) -> Any:
        """Link properties for ``name``: marked UTF-8 unless it is ASCII (the
        mark costs as much as a quarter of making a dataset)."""
        return self.lcpl if not name.isascii() else None

    def type_of(self, tj: Any) -> h5t.TypeID:
        """``file_type(tj)``, made once per distinct type JSON of the build."""
        try:
            key = orjson.dumps(tj)
        except (orjson.JSONEncodeError, TypeError):
            return file_type(tj)
        tid = self.types.get(key)
        if tid is None:
            tid = self.types[key] = file_type(tj)
        return tid

    def ref(self, target: PlanRef | None) -> h5r.Reference:
        oid = None if target is None or target.target is None else self.handle(target.target)
        if oid is None:
            return h5r.Reference()
        return h5r.create(oid, b".", h5r.OBJECT)

    # -- element conversion -------------------------------------------------

    def native(self, t: HType, value: Any) -> Any:
        """A model element as numpy assigns it into ``t.dtype`` (fixed types)."""
        cls = t.cls
        if cls in ("int", "float"):
            return value
        if cls == "enum":
            return bool(value) if t.is_bool else int(value)
        if cls in ("string", "opaque"):
            if isinstance(value, str):
                return _bytes(value)
            return b"" if value is None else bytes(value)
        if cls == "compound":
            items = list(value.values()) if isinstance(value, Mapping) else value
            return tuple(self.native(ft, v) for (_, ft), v in zip(t.fields, items, strict=True))
        if cls == "array" and t.base is not None:
            return [self.native(t.base, v) for v in flatten(value, t.dims)]
        raise Unsupported(f"{cls} values are not copied")

    def array(self, t: HType, shape: tuple[int, ...], elements: list[Any]) -> np.ndarray:
        """``elements`` (C order) for h5py: a fixed-size type without
        references as its raw bytes (``uint8``, written with the file type as
        the memory type, so nothing is converted), others as objects."""
        if len(elements) != math.prod(shape):  # HDF5 would read past the buffer
            raise Unsupported(f"{len(elements)} elements for the shape {list(shape)}")
        if t.dtype is not None and not has_ref(t):
            raw = b"".join(np.array(self.native(t, v), dtype=t.dtype).tobytes()
                           for v in elements)
            return np.frombuffer(raw, dtype=np.uint8)
        out = np.empty(len(elements), dtype=mem_dtype(t))
        for i, v in enumerate(elements):
            out[i] = self.element(t, v)
        return out.reshape(shape)

    def element(self, t: HType, value: Any) -> Any:
        """A model element as h5py assigns it into ``mem_dtype(t)``."""
        if t.dtype is not None and not has_ref(t):
            return self.native(t, value)
        if t.cls == "compound":
            items = list(value.values()) if isinstance(value, Mapping) else value
            return tuple(self.element(ft, v) for (_, ft), v in zip(t.fields, items, strict=True))
        if t.cls == "vstr":
            if isinstance(value, bytes):
                return value
            text = "" if value is None else str(value)
            return _bytes(text) if not t.utf8 else text
        if t.cls == "ref":
            return self.ref(value if isinstance(value, PlanRef) else None)
        assert t.base is not None and t.base.dtype is not None
        items = list(value) if isinstance(value, list | tuple | np.ndarray) else [value]
        return np.array([self.native(t.base, v) for v in items], dtype=t.base.dtype)

    # -- objects ---------------------------------------------------------------

    def create(self, plan: ObjPlan) -> Any:
        """Make the object of ``plan``; its open id (a dataset's is closed
        when the caller drops it)."""
        if plan.parent is None:
            oid = self.ids[plan.id] = self.file["/"].id
            return oid
        parent = self.ids[plan.parent]
        name = _bytes(plan.name)
        lcpl = self.lcpl_for(name)
        if plan.kind is ObjectKind.GROUP:
            gcpl = h5p.create(h5p.GROUP_CREATE)
            gcpl.set_obj_track_times(False)
            oid = self.ids[plan.id] = h5py.h5g.create(parent, name, lcpl=lcpl, gcpl=gcpl)
            return oid
        if plan.kind is ObjectKind.DATATYPE:
            tid = file_type(plan.hdf5)
            tid.commit(parent, name, lcpl=lcpl)
            self.ids[plan.id] = tid
            return tid
        if plan.data is not None:
            dsid = self.embedded(parent, name, lcpl, plan)
        else:
            dsid = self.dataset(parent, name, lcpl, plan)
        self.datasets.add(plan.id)
        return dsid

    def handle(self, obj_id: str) -> Any:
        """The open object ``obj_id`` of the image, or None if it was not made."""
        oid = self.ids.get(obj_id)
        if oid is None and obj_id in self.datasets:
            oid = h5o.open(self.file.id, _bytes(self.paths[obj_id]))
        return oid

    def dataset(self, parent: Any, name: bytes, lcpl: Any, plan: ObjPlan) -> Any:
        tid = self.type_of(plan.hdf5)
        dcpl = h5p.create(h5p.DATASET_CREATE)
        dcpl.set_obj_track_times(False)  # halves the cost of a dataset; no time is real
        space = self.space(plan, dcpl)
        dsid = None
        if plan.fill is not None and any(plan.fill):  # HDF5's default fill is zeros
            filled = dcpl.copy()
            try:
                filled.set_fill_value(_fill_array(_parse(plan.hdf5), plan.fill))
                dsid = h5d.create(parent, name, tid, space, dcpl=filled, lcpl=lcpl)
            except (ValueError, TypeError, RuntimeError, FormatError) as exc:
                self.left_out.append(f"{plan.path}: fill value not kept ({exc})")
        if dsid is None:
            dsid = h5d.create(parent, name, tid, space, dcpl=dcpl, lcpl=lcpl)
        if plan.stored is not None:
            try:
                self.regions.extend(_places(dsid, plan))
            except Unsupported:
                parent.unlink(name)
                raise
        return dsid

    def space(self, plan: ObjPlan, dcpl: Any) -> Any:
        """The dataspace of a dataset, and its storage in ``dcpl``.

        A dataset whose elements the file keeps (``stored``) has its storage
        allocated when it is made and never written, in its own chunk shape
        where ``chunked`` says so. Else it is contiguous unless extendible;
        an extendible dataset is chunked (an empty or embedded one in its own
        chunk shape where HDF5 takes it), else in one chunk of its shape, so
        its ``maxshape`` is kept along every dimension. A chunk must stay
        under 4 GiB: a larger extendible dataset stays contiguous, and its
        ``maxshape`` is noted as not kept.
        """
        if plan.shape is None:
            return h5s.create(h5s.NULL)
        if plan.stored is not None:
            dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5d.FILL_TIME_NEVER)
        if plan.shape == ():
            return h5s.create(h5s.SCALAR)
        shape, maxshape = plan.shape, plan.maxshape or plan.shape
        chunks = storage_chunks(plan)
        if chunks is not None:
            dcpl.set_chunk(chunks)
            return h5s.create_simple(
                shape, tuple(h5s.UNLIMITED if m is None else m for m in maxshape))
        if maxshape != shape:
            self.left_out.append(f"{plan.path}: maxshape {list(maxshape)} not kept (its one "
                                 f"chunk of {plan.stored} bytes would pass HDF5's 4 GiB)")
        return h5s.create_simple(shape)

    def embedded(self, parent: Any, name: bytes, lcpl: Any, plan: ObjPlan) -> Any:
        """A dataset with its elements written, or none at all: the elements
        are converted before it is made, and it is unlinked if writing fails."""
        assert plan.data is not None
        t = _parse(plan.hdf5)
        arr = self.array(t, plan.shape or (), plan.data)
        dsid = self.dataset(parent, name, lcpl, plan)
        try:
            if arr.dtype == np.uint8 and t.dtype is not None and not has_ref(t):
                dsid.write(h5s.ALL, h5s.ALL, arr, mtype=self.type_of(plan.hdf5))
            else:
                h5py.Dataset(dsid)[...] = arr
        except BaseException:
            parent.unlink(name)
            raise
        return dsid

    # -- attributes -------------------------------------------------------------

    def attributes(self, plan: ObjPlan, oid: Any = None) -> None:
        """Write the attributes of ``plan`` on its object (``oid`` if open)."""
        if not plan.attrs:
            return
        if oid is None:
            oid = self.handle(plan.id)
        scale = any(a.name == "CLASS" and _text(a.value) == "DIMENSION_SCALE"
                    for a in plan.attrs) and plan.kind is ObjectKind.DATASET
        for attr in plan.attrs:
            if attr.name in _SCALE_ATTRS or (scale and attr.name in ("CLASS", "NAME")):
                continue
            try:
                self.attribute(oid, attr)
            except (*_FAILURES, OverflowError) as exc:
                self.left_out.append(f"{plan.path}: attribute {attr.name!r} not copied ({exc})")
        if scale:
            name = next((_text(a.value) for a in plan.attrs if a.name == "NAME"), "")
            h5ds.set_scale(oid, _bytes(name))

    def attribute(self, oid: Any, attr: AttrPlan) -> None:
        if attr.hdf5 is None:
            tj, shape = infer(attr.value)
            value: Any = attr.value
        else:
            tj, shape, value = attr.hdf5, attr.shape, attr.value
        tid = self.type_of(tj)
        name = _bytes(attr.name)
        if shape is None:
            h5a.create(oid, name, tid, h5s.create(h5s.NULL))
            return
        t = _parse(tj)
        arr = self.array(t, shape, flatten(value, shape))
        space = h5s.create(h5s.SCALAR) if shape == () else h5s.create_simple(shape)
        made = h5a.create(oid, name, tid, space)
        if arr.dtype == np.uint8 and t.dtype is not None and not has_ref(t):
            made.write(arr, mtype=tid)
        else:
            made.write(arr)

    def scales(self, made: list[ObjPlan]) -> None:
        """Attach the dimension scales the datasets' ``DIMENSION_LIST``s name,
        in the order of the scales' stored ``REFERENCE_LIST``s (which the
        library writes in attaching order), then any others."""
        wanted: dict[tuple[str, str, int], str] = {}  # (dataset, scale, dim) -> path
        for plan in made:
            for attr in plan.attrs:
                if attr.name != "DIMENSION_LIST" or plan.kind is not ObjectKind.DATASET:
                    continue
                for index, refs in enumerate(attr.value if isinstance(attr.value, list) else []):
                    for ref in refs if isinstance(refs, list) else [refs]:
                        scale = ref.target if isinstance(ref, PlanRef) else None
                        if scale is None or (scale not in self.ids
                                             and scale not in self.datasets):
                            self.left_out.append(f"{plan.path}: dimension {index} scale "
                                                 "does not resolve")
                        else:
                            wanted[plan.id, scale, index] = plan.path
        order: list[tuple[str, str, int]] = []
        for plan in made:
            for attr in plan.attrs:
                if attr.name == "REFERENCE_LIST" and isinstance(attr.value, list):
                    order += [(entry[0].target, plan.id, entry[1]) for entry in attr.value
                              if isinstance(entry, list) and len(entry) == 2
                              and isinstance(entry[0], PlanRef)]
        for key in [k for k in order if k in wanted] + list(wanted):
            path = wanted.pop(key, None)
            if path is None:
                continue
            dataset, scale, index = key
            try:
                h5ds.attach_scale(self.handle(dataset), self.handle(scale), index)
            except (ValueError, RuntimeError, KeyError) as exc:
                self.left_out.append(f"{path}: dimension {index} scale not attached ({exc})")

    def links(self) -> None:
        for link in self.skeleton.links:
            group = self.ids.get(link.group)  # groups stay open
            if group is None:
                continue
            name = _bytes(link.name)
            lcpl = self.lcpl_for(name)
            if link.kind is LinkKind.HARD:
                target = self.handle(link.target)
                if target is None:
                    where = self.paths.get(link.group, "?").rstrip("/")
                    self.left_out.append(f"{where}/{link.name}: a hard link to an object "
                                         "left out")
                    continue
                h5o.link(target, group, name, lcpl=lcpl)
            elif link.kind is LinkKind.SOFT:
                group.links.create_soft(name, _bytes(link.target),
                                        lcpl=lcpl)
            else:
                assert link.file is not None
                group.links.create_external(name, _bytes(link.file),
                                            _bytes(link.target),
                                            lcpl=lcpl)


def _places(dsid: Any, plan: ObjPlan) -> list[tuple[int, int, str | ChunkPart]]:
    """Where the library put the stored elements of a dataset just made:
    one place (contiguous, or its one chunk) or one per chunk."""
    assert plan.stored is not None
    allocated = dsid.get_storage_size()
    if dsid.get_create_plist().get_layout() != h5d.CHUNKED:
        offset = dsid.get_offset()
        if offset is None or allocated != plan.stored:
            raise Unsupported(f"HDF5 allocated {allocated} bytes for {plan.stored} bytes "
                              "of elements")
        return [(int(offset), plan.stored, plan.id)]
    found: list[tuple[int, int, tuple[int, ...]]] = []

    def add(info: Any) -> None:
        found.append((int(info.byte_offset), int(info.size), info.chunk_offset))

    dsid.chunk_iter(add)
    if not chunked(plan):  # one chunk of the whole shape
        if len(found) != 1 or found[0][1] != plan.stored:
            raise Unsupported(f"HDF5 allocated {allocated} bytes for {plan.stored} bytes "
                              "of elements")
        return [(found[0][0], plan.stored, plan.id)]
    assert plan.chunks is not None and plan.shape is not None
    chunk_bytes = math.prod(plan.chunks) * (plan.stored // math.prod(plan.shape))
    grid = math.prod(chunk_grid(plan.shape, plan.chunks))
    if len(found) != grid or any(size != chunk_bytes for _, size, _ in found):
        raise Unsupported(f"HDF5 allocated {len(found)} chunks for a grid of {grid}")
    return [(offset, size, ChunkPart(plan.id, tuple(
        o // c for o, c in zip(coords, plan.chunks, strict=True))))
        for offset, size, coords in found]


def _pread(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes of ``fd`` at ``offset`` (a short read is read on)."""
    out = bytearray()
    while len(out) < size:
        got = os.pread(fd, size - len(out), offset + len(out))
        if not got:
            raise Unsupported(f"the scratch file ended at {offset + len(out)}")
        out += got
    return bytes(out)


def _bytes(text: str) -> bytes:
    """A name or path for HDF5: UTF-8, undecodable bytes as they came."""
    return text.encode("utf-8", "surrogateescape")


def _fill_array(t: HType, fill: bytes) -> np.ndarray:
    """One fill element, for h5py's ``set_fill_value``, which converts it to
    the file type. A string goes as a variable-length one (h5py stores the
    address of a fixed-size string given alone, and HDF5 converts no fixed
    string between character sets); others in ``_fill_dtype``."""
    if t.cls == "string":
        return np.array(fill.rstrip(b"\0"), dtype=h5py.string_dtype(
            "utf-8" if t.utf8 else "ascii"))
    return np.frombuffer(fill, dtype=_fill_dtype(t)).reshape(())


def _fill_dtype(t: HType) -> np.dtype[Any]:
    """The dtype to give h5py a fill value of a fixed-size type in: one h5py
    turns into the same HDF5 type, as HDF5 converts no integer to an enum."""
    assert t.dtype is not None
    if t.cls == "enum" and not t.is_bool:
        return h5py.enum_dtype(dict(t.members), basetype=t.dtype)
    if t.cls == "compound":
        assert t.dtype.fields is not None
        return np.dtype({"names": [n for n, _ in t.fields],
                         "formats": [_fill_dtype(ft) for _, ft in t.fields],
                         "offsets": [t.dtype.fields[n][1] for n, _ in t.fields],
                         "itemsize": t.dtype.itemsize})
    if t.cls == "array" and t.base is not None:
        return np.dtype((_fill_dtype(t.base), t.dims))
    return t.dtype


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


_FAILURES = (Unsupported, FormatError, ValueError, TypeError, RuntimeError, KeyError)


def _points(value: Any) -> bool:
    """True if a value holds an object reference (a ``PlanRef``) anywhere."""
    if isinstance(value, PlanRef):
        return True
    if isinstance(value, list | tuple):
        return any(_points(item) for item in value)
    if isinstance(value, Mapping):
        return any(_points(item) for item in value.values())
    return False


def _refers(tj: Any) -> bool:
    try:
        return has_ref(_parse(tj))
    except FormatError:
        return False


def build_image(skeleton: Skeleton, bound: Bound | None = None,
                scratch: str | None = None) -> FileImage:
    """The HDF5 file of ``skeleton`` (``FileImage``), with what it leaves out
    (``skeleton.left_out`` and what could not be written).

    The file is ``bound.size`` bytes long (the skeleton's ``size_bound`` if
    None, which is what the tree promised before the build): zeros follow
    HDF5's end of file. Should HDF5 write more, the file keeps the objects
    made first, as many as fit, and says so in ``left_out``.

    The file is written in a directory of its own under ``scratch`` (the
    system's temporary directory if None) and removed once read back: the
    places of the datasets' elements are allocated but never written, so it
    takes the disk only its written bytes.
    """
    if bound is None:
        bound = size_bound(skeleton)
    plan, meta = skeleton, bound.meta
    while True:
        with tempfile.TemporaryDirectory(prefix="h5mount-view-", dir=scratch) as where:
            path = os.path.join(where, "view.h5")
            regions, left_out = _write(plan, path, meta)
            image = _read_back(path, regions, left_out)
        if image.size <= bound.size:
            break
        if len(plan.objects) <= 1:
            raise Unsupported(f"the file takes {image.size} bytes, over the {bound.size} "
                              "promised")
        keep = min(len(plan.objects) - 1,
                   max(1, int(len(plan.objects) * bound.size / image.size * 0.9)))
        plan = Skeleton(skeleton.objects[:keep], skeleton.links, [
            *skeleton.left_out,
            f"/: the file holds the first {keep} objects found (breadth first): with "
            f"{len(plan.objects)}, HDF5 wrote {image.size} bytes, over the {bound.size} "
            "its length was computed as"])
        meta = min(meta, size_bound(plan).meta)
    if image.size == bound.size:
        return image
    return FileImage(bound.size, [*image.starts, image.size],
                     [*image.parts, bound.size - image.size], image.left_out)


def _notes(lines: list[str]) -> list[str]:
    """``LEFT_OUT_ATTR``'s value: the lines of ``left_out`` that fit in
    ``LEFT_OUT_BYTES`` and ``LEFT_OUT_LINES``, then how many more there are."""
    kept: list[str] = []
    used = 0
    for line in lines:
        used += len(_bytes(line))
        if used > LEFT_OUT_BYTES - 256 or len(kept) == LEFT_OUT_LINES - 1:
            kept.append(f"... and {len(lines) - len(kept)} more (the daemon's log lists "
                        "them all)")
            break
        kept.append(line)
    return kept


def _write(skeleton: Skeleton, path: str, meta: int
           ) -> tuple[list[tuple[int, int, str | ChunkPart]], list[str]]:
    """Write ``skeleton`` as the HDF5 file ``path``; the places of the stored
    elements, and what is left out.

    The file's metadata goes first, in one block of ``meta`` bytes (HDF5's
    metadata aggregator: the superblock, object headers, symbol tables, chunk
    indexes), and the datasets' elements and the global heap follow it,
    every allocation of a page or more on a page. So a reader of the
    metadata alone (h5ls, opening a file) reads the start of the file and
    never a dataset's elements, and no page holds both.
    """
    fapl = h5p.create(h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5f.LIBVER_EARLIEST, h5f.LIBVER_LATEST)
    fapl.set_alignment(PAGE, PAGE)
    fapl.set_meta_block_size(meta)
    fid = h5f.create(os.fsencode(path), h5f.ACC_TRUNC, fapl=fapl)
    with h5py.File(fid) as f:
        writer = _Writer(skeleton, f)
        # Embedded elements that are references are written last, when every
        # object they may point at exists.
        later = [plan for plan in skeleton.objects
                 if plan.data is not None and _refers(plan.hdf5)]
        later_ids = {plan.id for plan in later}
        made: list[ObjPlan] = []
        # Attributes are written while their object is open (opening a
        # dataset again costs a fifth of a build), but those that point at
        # objects only once every object exists.
        pointing: list[ObjPlan] = []
        for plan in [p for p in skeleton.objects if p.id not in later_ids] + later:
            try:
                oid = writer.create(plan)
                made.append(plan)
            except _FAILURES as exc:
                writer.left_out.append(f"{plan.path}: not copied ({exc})")
                continue
            if any(_points(attr.value) for attr in plan.attrs):
                pointing.append(plan)
            else:
                writer.attributes(plan, oid)
        writer.links()
        for plan in pointing:
            writer.attributes(plan)
        writer.scales(made)
        if writer.left_out:
            f.attrs.create(LEFT_OUT_ATTR, _notes(writer.left_out), dtype=h5py.string_dtype())
    return writer.regions, writer.left_out


def _read_back(path: str, regions: list[tuple[int, int, str | ChunkPart]],
               left_out: list[str]) -> FileImage:
    """The file at ``path`` as parts: what HDF5 wrote between the ``regions``,
    with the holes of the file (never written) as runs of zeros."""
    starts: list[int] = []
    parts: list[Part] = []
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        pos = 0
        for offset, length, place in sorted(regions, key=lambda region: region[0]):
            if offset < pos or offset + length > size:
                raise Unsupported(f"HDF5 placed the elements of {place} at {offset}, "
                                  f"over other parts of the file")
            _gap(fd, pos, offset, starts, parts)
            starts.append(offset)
            parts.append(place)
            pos = offset + length
        _gap(fd, pos, size, starts, parts)
    return FileImage(size, starts, parts, left_out)


def _gap(fd: int, start: int, end: int, starts: list[int], parts: list[Part]) -> None:
    """Add the bytes of ``fd`` from ``start`` to ``end`` as parts: data as
    bytes, holes as their length."""
    pos = start
    while pos < end:
        try:
            data = min(os.lseek(fd, pos, os.SEEK_DATA), end)
        except OSError:  # ENXIO: no data past pos
            data = end
        if data > pos:
            starts.append(pos)
            parts.append(data - pos)
            pos = data
        if pos < end:
            stop = min(os.lseek(fd, pos, os.SEEK_HOLE), end)
            starts.append(pos)
            parts.append(_pread(fd, stop - pos, pos))
            pos = stop

