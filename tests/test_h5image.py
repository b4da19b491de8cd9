"""``layouts.hdf5._image``: skeleton plans written as HDF5 files, read back with h5py.

No mount: each test builds a plan by hand (as ``mountd.tree.h5view`` would),
writes it with ``build_image``, fills the places of the datasets' stored
elements as the mount would, and opens the bytes with h5py, checking what a
user of the ``D.h5`` view relies on: types as stored, elements inside the
file, embedded variable-length data, references, links of every kind,
dimension scales, fill values, and that whatever cannot be written is named
in the root attribute, never written half.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np
import pytest

from layouts.hdf5._bound import size_bound
from layouts.hdf5._image import ChunkPart, FileImage, build_image
from layouts.hdf5._plan import (
    LEFT_OUT_ATTR,
    PAGE,
    AttrPlan,
    LinkPlan,
    ObjPlan,
    PlanRef,
    Skeleton,
    Unsupported,
    infer,
)
from layouts.model import LinkKind, ObjectKind

I4 = {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"}
F8BE = {"class": "H5T_FLOAT", "base": "H5T_IEEE_F64BE"}
VSTR = {"class": "H5T_STRING", "charSet": "H5T_CSET_UTF8", "length": "H5T_VARIABLE"}
REF = {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_OBJ"}
ENUM = {"class": "H5T_ENUM", "base": {"class": "H5T_INTEGER", "base": "H5T_STD_I16LE"},
        "members": [{"name": "RED", "value": 3}, {"name": "BLUE", "value": 7}]}


def _root(*attrs: AttrPlan) -> ObjPlan:
    return ObjPlan(id="g-root", kind=ObjectKind.GROUP, parent=None, name="", path="/",
                   attrs=list(attrs))


def _file(image: FileImage, elements: Mapping[str | ChunkPart, bytes]) -> h5py.File:
    """The file as the mount serves it: the parts HDF5 wrote, and each place's
    ``elements`` (by dataset id, or by ``ChunkPart``) at its start (the rest of
    a place reads as zeros: the file is written sparse, so a place of
    gigabytes costs nothing)."""
    assert image.starts == sorted(image.starts) and image.starts[0] == 0
    ends = [*image.starts[1:], image.size]
    out = tempfile.TemporaryFile()  # noqa: SIM115 - the h5py.File returned owns it
    for start, end, part in zip(image.starts, ends, image.parts, strict=True):
        if isinstance(part, int):
            assert part == end - start
        elif isinstance(part, bytes):
            assert len(part) == end - start
            out.seek(start)
            out.write(part)
        elif part in elements:
            assert len(elements[part]) <= end - start
            out.seek(start)
            out.write(elements[part])
    out.truncate(image.size)
    return h5py.File(out, "r")


def _open(skeleton: Skeleton, elements: Mapping[str | ChunkPart, bytes] | None = None
          ) -> tuple[h5py.File, list[str]]:
    """The file of ``skeleton`` as the mount serves it: as long as its
    ``size_bound`` (so each test's ``left_out`` also says the bound held)."""
    bound = size_bound(skeleton)
    image = build_image(skeleton, bound)
    assert image.size == bound.size
    return _file(image, elements or {}), image.left_out


def test_infer_gives_h5py_types() -> None:
    assert infer("text") == (infer("x")[0], ())
    assert infer(3) == ("H5T_STD_I64LE", ())
    assert infer([[1, 2.5], [3, 4]]) == ("H5T_IEEE_F64LE", (2, 2))
    assert infer([True, False])[1] == (2,)
    assert infer(PlanRef("g-1"))[0]["class"] == "H5T_REFERENCE"
    with pytest.raises(Unsupported):
        infer([[1, 2], [3]])
    with pytest.raises(Unsupported):
        infer([1, "a"])
    with pytest.raises(Unsupported):
        infer({"a": 1})


def test_stored_elements_are_inside_the_file() -> None:
    """A dataset's elements are a place of the file that the library allocated
    and never wrote: the image has no bytes for it (whatever its size), and
    elements served there read back as the dataset, with no external file."""
    array = np.arange(60, dtype=">f8").reshape(3, 20)
    big = 1 << 30  # never written, nor held: only its place is planned
    skeleton = Skeleton([
        _root(),
        ObjPlan(id="d-1", kind=ObjectKind.DATASET, parent="g-root", name="d", path="/d",
                hdf5=F8BE, shape=(3, 20), fill=np.array(-1.5, ">f8").tobytes(),
                stored=array.nbytes),
        ObjPlan(id="d-2", kind=ObjectKind.DATASET, parent="g-root", name="s", path="/s",
                hdf5=I4, shape=(), stored=4),
        ObjPlan(id="d-3", kind=ObjectKind.DATASET, parent="g-root", name="null", path="/null",
                hdf5=I4, shape=None),
        ObjPlan(id="d-4", kind=ObjectKind.DATASET, parent="g-root", name="big", path="/big",
                hdf5=I4, shape=(big // 4,), stored=big),
    ])
    image = build_image(skeleton)
    assert image.left_out == []
    assert [part for part in image.parts if isinstance(part, str)] == ["d-1", "d-2", "d-4"]
    assert image.size > big > 100 * image.written
    elements = {"d-1": array.tobytes(), "d-2": np.array(7, "<i4").tobytes(),
                "d-4": np.arange(3, dtype="<i4").tobytes()}
    f = _file(image, elements)
    assert f["d"].dtype == np.dtype(">f8") and f["d"].fillvalue == -1.5
    np.testing.assert_array_equal(f["d"][1:3, 5:9], array[1:3, 5:9])
    assert f["s"][()] == 7
    assert f["null"].shape is None
    assert f["big"][:4].tolist() == [0, 1, 2, 0] and f["big"][-1] == 0
    assert not any(f[name].external for name in ("d", "s", "big"))


def test_types_attributes_and_fill_values_as_stored() -> None:
    fixed = {"class": "H5T_STRING", "charSet": "H5T_CSET_UTF8", "length": 6,
             "strPad": "H5T_STR_NULLTERM"}
    compound = {"class": "H5T_COMPOUND", "fields": [
        {"name": "a", "type": I4}, {"name": "b", "type": fixed},
        {"name": "c", "type": {"class": "H5T_ARRAY", "dims": [2], "base": F8BE}}]}
    skeleton = Skeleton([
        _root(AttrPlan("fixed", "héllo", fixed, ()),
              AttrPlan("compound", [[1, "x", [0.5, 1.5]], [2, "yz", [2.5, 3.5]]], compound, (2,)),
              AttrPlan("enum", [3, 7, 7], ENUM, (3,)),
              AttrPlan("inferred", [[1.0, 2.0]]),
              AttrPlan("null", None, I4, None),
              AttrPlan("region", None, {"class": "H5T_REFERENCE",
                                        "base": "H5T_STD_REF_DSETREG"}, ())),
        ObjPlan(id="t-1", kind=ObjectKind.DATATYPE, parent="g-root", name="colour",
                path="/colour", hdf5=ENUM),
        ObjPlan(id="d-1", kind=ObjectKind.DATASET, parent="g-root", name="e", path="/e",
                hdf5=ENUM, shape=(0,), fill=np.array(7, "<i2").tobytes()),
        ObjPlan(id="d-2", kind=ObjectKind.DATASET, parent="g-root", name="s", path="/s",
                hdf5=fixed, shape=(0,), fill=b"ab\0\0\0\0"),
    ])
    f, left_out = _open(skeleton)
    assert f.attrs["fixed"] == "héllo".encode()
    tid = f.attrs.get_id("fixed").get_type()
    assert tid.get_strpad() == h5py.h5t.STR_NULLTERM and tid.get_cset() == h5py.h5t.CSET_UTF8
    got = f.attrs["compound"]
    assert got.dtype.names == ("a", "b", "c") and got["a"].tolist() == [1, 2]
    assert got["b"].tolist() == [b"x", b"yz"] and got["c"].tolist() == [[0.5, 1.5], [2.5, 3.5]]
    assert h5py.check_enum_dtype(f.attrs.get_id("enum").dtype) == {"RED": 3, "BLUE": 7}
    assert f.attrs["enum"].tolist() == [3, 7, 7]
    assert f.attrs["inferred"].dtype == np.float64 and f.attrs["inferred"].shape == (1, 2)
    assert isinstance(f.attrs["null"], h5py.Empty)
    assert h5py.check_enum_dtype(f["colour"].dtype) == {"RED": 3, "BLUE": 7}
    assert f["e"].fillvalue == 7
    assert f["s"].fillvalue == b"ab" and f["s"].dtype == h5py.string_dtype("utf-8", 6)
    assert left_out == ["/: attribute 'region' not copied (region references are not copied)"]
    assert list(f.attrs[LEFT_OUT_ATTR]) == left_out


def test_embedded_data_references_and_links() -> None:
    vlen_compound = {"class": "H5T_COMPOUND", "fields": [
        {"name": "n", "type": I4}, {"name": "s", "type": VSTR}]}
    skeleton = Skeleton(
        objects=[
            _root(AttrPlan("refs", [PlanRef("d-s"), PlanRef(None), PlanRef("g-sub")], REF, (3,))),
            ObjPlan(id="g-sub", kind=ObjectKind.GROUP, parent="g-root", name="sub", path="/sub"),
            ObjPlan(id="d-s", kind=ObjectKind.DATASET, parent="g-sub", name="s", path="/sub/s",
                    hdf5=VSTR, shape=(2,), data=["\u03b1", ""]),
            ObjPlan(id="d-r", kind=ObjectKind.DATASET, parent="g-root", name="r", path="/r",
                    hdf5=REF, shape=(2,), data=[PlanRef("g-sub"), None]),
            ObjPlan(id="d-c", kind=ObjectKind.DATASET, parent="g-root", name="c", path="/c",
                    hdf5=vlen_compound, shape=(2,), data=[[1, "one"], [2, "two"]]),
            ObjPlan(id="d-v", kind=ObjectKind.DATASET, parent="g-root", name="v", path="/v",
                    hdf5={"class": "H5T_VLEN", "base": I4}, shape=(2,),
                    data=[np.array([1, 2, 3]), np.array([], dtype="<i4")]),
        ],
        links=[
            LinkPlan("g-sub", "up", LinkKind.HARD, "g-root"),
            LinkPlan("g-root", "alias", LinkKind.HARD, "d-s"),
            LinkPlan("g-root", "soft", LinkKind.SOFT, "/sub/s"),
            LinkPlan("g-root", "ext", LinkKind.EXTERNAL, "/x", "/mnt/other.h5.h5"),
        ])
    f, left_out = _open(skeleton)
    assert left_out == []
    assert f["sub/s"].asstr()[()].tolist() == ["\u03b1", ""]
    refs = f.attrs["refs"]
    assert f[refs[0]] == f["sub/s"] and not refs[1] and f[refs[2]] == f["sub"]
    assert f[f["r"][0]] == f["sub"] and not f["r"][1]
    assert [(int(n), s) for n, s in f["c"][()].tolist()] == [(1, b"one"), (2, b"two")]
    assert [v.tolist() for v in f["v"][()]] == [[1, 2, 3], []]
    assert f["sub/up"] == f["/"] and f["alias"] == f["sub/s"]
    assert f.get("soft", getlink=True).path == "/sub/s"
    ext = f.get("ext", getlink=True)
    assert (ext.filename, ext.path) == ("/mnt/other.h5.h5", "/x")


def test_dimension_scales_are_attached_again() -> None:
    scale_attrs = [AttrPlan("CLASS", "DIMENSION_SCALE"), AttrPlan("NAME", "x"),
                   AttrPlan("REFERENCE_LIST", "stale, rewritten by the library")]
    skeleton = Skeleton([
        _root(),
        ObjPlan(id="d-x", kind=ObjectKind.DATASET, parent="g-root", name="x", path="/x",
                hdf5=I4, shape=(4,), stored=16, attrs=scale_attrs),
        ObjPlan(id="d-t", kind=ObjectKind.DATASET, parent="g-root", name="t", path="/t",
                hdf5=I4, shape=(4,), stored=16,
                attrs=[AttrPlan("DIMENSION_LIST", [[PlanRef("d-x")]])]),
    ])
    elements = np.arange(4, dtype="<i4").tobytes()
    f, left_out = _open(skeleton, {"d-x": elements, "d-t": elements})
    assert left_out == []
    assert f["x"].is_scale
    assert [s.name for s in f["t"].dims[0].values()] == ["/x"]
    assert list(f["t"].dims[0].keys()) == ["x"]


def test_what_cannot_be_written_is_left_out_whole() -> None:
    region = {"class": "H5T_REFERENCE", "base": "H5T_STD_REF_DSETREG"}
    skeleton = Skeleton(
        objects=[
            _root(),
            ObjPlan(id="d-bad", kind=ObjectKind.DATASET, parent="g-root", name="bad",
                    path="/bad", hdf5=VSTR, shape=(3,), data=["only", "two"]),
            ObjPlan(id="d-reg", kind=ObjectKind.DATASET, parent="g-root", name="reg",
                    path="/reg", hdf5=region, shape=(1,), data=[None]),
        ],
        links=[LinkPlan("g-root", "to_bad", LinkKind.HARD, "d-bad")],
        left_out=["/planned: said by the planner"])
    f, left_out = _open(skeleton)
    assert "bad" not in f and "reg" not in f and "to_bad" not in f
    paths = [line.split(":", 1)[0] for line in left_out]
    assert paths == ["/planned", "/bad", "/reg", "/to_bad"]
    assert [str(v) for v in f.attrs[LEFT_OUT_ATTR]] == left_out


def test_extendible_datasets_keep_maxshape() -> None:
    """An extendible dataset keeps its maxshape along every dimension: its
    elements are one chunk of its shape; an empty one keeps its own chunk
    shape where HDF5 takes it, embedded ones are chunked. Only a dataset
    whose one chunk would pass 4 GiB is noted."""
    def dataset(name: str, **kw: Any) -> ObjPlan:
        return ObjPlan(id=f"d-{name}", kind=ObjectKind.DATASET, parent="g-root", name=name,
                       path=f"/{name}", hdf5=kw.pop("hdf5", I4), **kw)

    huge = 1 << 32
    skeleton = Skeleton([
        _root(),
        dataset("rows", shape=(2, 3), maxshape=(None, 3), stored=24),
        dataset("cols", shape=(2, 3), maxshape=(2, None), stored=24),
        dataset("huge", shape=(huge // 4,), maxshape=(None,), stored=huge),
        dataset("empty", shape=(0, 3), maxshape=(None, None), chunks=(4, 2)),
        dataset("bare", shape=(0, 3), maxshape=(None, 3), chunks=(4, 8)),
        dataset("text", hdf5=VSTR, shape=(2,), maxshape=(10,), data=["a", "b"]),
    ])
    elements = np.arange(6, dtype="<i4").tobytes()
    image = build_image(skeleton)
    f = _file(image, {"d-rows": elements, "d-cols": elements})
    assert f["rows"].maxshape == (None, 3) and f["rows"][1].tolist() == [3, 4, 5]
    assert f["rows"].chunks == (2, 3)
    assert f["cols"].maxshape == (2, None) and f["cols"][()].sum() == 15
    assert f["huge"].maxshape == f["huge"].shape and f["huge"][-1] == 0
    assert f["empty"].maxshape == (None, None) and f["empty"].shape == (0, 3)
    assert f["empty"].chunks == (4, 2)  # as stored
    assert f["bare"].chunks == (1, 3)  # its chunk passes a fixed dimension: one of its shape
    assert f["text"].maxshape == (10,) and f["text"].asstr()[()].tolist() == ["a", "b"]
    assert [line.split(" (")[0] for line in image.left_out] == [
        "/huge: maxshape [None] not kept"]


def test_no_page_holds_both_elements_and_metadata() -> None:
    """A page cache reads whole pages: a page that held metadata and a
    dataset's elements would make the metadata unreadable whenever those
    elements cannot be read. Elements of small datasets may share pages only
    with each other; the space padding them apart costs the image nothing."""
    objects = [_root(AttrPlan("note", ["text"] * 50, VSTR, (50,)))]
    for i in range(300):
        size = [4, 600, 2048, 5000, 70_000][i % 5]
        objects.append(ObjPlan(id=f"d-{i}", kind=ObjectKind.DATASET, parent="g-root",
                               name=f"d{i}", path=f"/d{i}", hdf5=I4, shape=(size // 4,),
                               stored=size, attrs=[AttrPlan("i", i)]))
    image = build_image(Skeleton(objects))
    assert image.left_out == []
    page = PAGE
    kinds: dict[int, set[str]] = {}
    for index, (start, part) in enumerate(zip(image.starts, image.parts, strict=True)):
        if isinstance(part, int):
            continue
        kind = "elements" if isinstance(part, str) else "written"
        for number in range(start // page, (image.part_end(index) - 1) // page + 1):
            kinds.setdefault(number, set()).add(kind)
    assert {"elements", "written"} not in [k for k in kinds.values()]
    assert sum(k == {"elements"} for k in kinds.values()) > 300
    stored = sum(plan.stored or 0 for plan in objects)
    assert image.written < 0.2 * stored
    f = _file(image, {f"d-{i}": np.full(([4, 600, 2048, 5000, 70_000][i % 5]) // 4, i,
                                        "<i4").tobytes() for i in range(300)})
    assert all(f[f"d{i}"][-1] == i and f[f"d{i}"].attrs["i"] == i for i in range(300))


def test_stored_chunks_are_places_of_their_own() -> None:
    """A dataset keeps its chunk shape: each chunk is a place of the file that
    the mount fills with the decoded chunk (a whole chunk, edges padded), and
    h5py reads the elements back from them. A chunk shape HDF5 refuses (past
    a fixed dimension) leaves the dataset contiguous."""
    array = np.arange(35, dtype="<i4").reshape(5, 7)

    def chunk(i: int, j: int) -> bytes:
        padded = np.full((2, 3), -1, "<i4")
        block = array[2 * i:2 * i + 2, 3 * j:3 * j + 3]
        padded[:block.shape[0], :block.shape[1]] = block
        return padded.tobytes()

    skeleton = Skeleton([
        _root(),
        ObjPlan(id="d-c", kind=ObjectKind.DATASET, parent="g-root", name="c", path="/c",
                hdf5=I4, shape=(5, 7), maxshape=(None, 7), stored=array.nbytes,
                chunks=(2, 3)),
        ObjPlan(id="d-w", kind=ObjectKind.DATASET, parent="g-root", name="w", path="/w",
                hdf5=I4, shape=(5, 7), stored=array.nbytes, chunks=(8, 8)),
    ])
    image = build_image(skeleton)
    chunks = [part for part in image.parts if isinstance(part, ChunkPart)]
    assert sorted(part.index for part in chunks) == [(i, j) for i in range(3) for j in range(3)]
    assert {part.obj_id for part in chunks} == {"d-c"} and "d-w" in image.parts
    f = _file(image, {**{part: chunk(*part.index) for part in chunks},
                      "d-w": array.tobytes()})
    assert f["c"].chunks == (2, 3) and f["c"].maxshape == (None, 7)
    np.testing.assert_array_equal(f["c"][()], array)
    np.testing.assert_array_equal(f["c"][:, 4:6], array[:, 4:6])
    assert f["w"].chunks is None
    np.testing.assert_array_equal(f["w"][()], array)
