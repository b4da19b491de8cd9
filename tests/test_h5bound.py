"""``layouts.hdf5._bound``: the length of a ``D.h5`` known before it is written.

No mount: skeletons made by hand, and made at random (nested groups, every
kind of link, UTF-8 names, datasets of many types, shapes and chunkings,
attributes short and long), are written with ``build_image``. The bound
must hold for each (the file HDF5 writes is never longer), must not be
wasteful (the zeros after HDF5's end of file stay within a few times the
file), and a file that would pass the length it was promised keeps the
objects made first and says so, at exactly that length.
"""

from __future__ import annotations

import random
import string
from typing import Any

import numpy as np
import pytest
from h5py import h5o

from layouts.hdf5._bound import size_bound
from layouts.hdf5._image import ChunkPart, build_image
from layouts.hdf5._plan import (
    LEFT_OUT_ATTR,
    PAGE,
    AttrPlan,
    Bound,
    LinkPlan,
    ObjPlan,
    Skeleton,
)
from layouts.model import LinkKind, ObjectKind
from tests.test_h5image import _file

F8 = "H5T_IEEE_F64LE"
I2BE = {"class": "H5T_INTEGER", "base": "H5T_STD_I16BE"}
VSTR = {"class": "H5T_STRING", "charSet": "H5T_CSET_UTF8", "length": "H5T_VARIABLE"}
FSTR = {"class": "H5T_STRING", "charSet": "H5T_CSET_ASCII", "strPad": "H5T_STR_NULLPAD",
        "length": 12}
ENUM = {"class": "H5T_ENUM", "base": {"class": "H5T_INTEGER", "base": "H5T_STD_I8LE"},
        "members": [{"name": f"member_{i}", "value": i} for i in range(20)]}
COMPOUND = {"class": "H5T_COMPOUND", "fields": [
    {"name": f"field_{i}", "type": "H5T_STD_I32LE" if i % 2 else F8} for i in range(12)]}
OPAQUE = {"class": "H5T_OPAQUE", "size": 6, "tag": "a tag of some length " * 10}
#: Fixed-size types and their element bytes.
FIXED = [(F8, 8), (I2BE, 2), (FSTR, 12), (ENUM, 1), (COMPOUND, 72), (OPAQUE, 6)]
#: Most a bound may pass the file by: a few times the file, and a constant.
WASTE_FACTOR, WASTE_BYTES = 4, 128 << 10


def _name(rng: random.Random) -> str:
    size = rng.choice([1, 6, 12, 40, 200])
    letters = string.ascii_letters + ("é→μ" if rng.random() < 0.1 else "")
    return "".join(rng.choice(letters) for _ in range(size))


def _attrs(rng: random.Random) -> list[AttrPlan]:
    out: list[AttrPlan] = []
    for i in range(rng.choice([0, 0, 1, 3, 12])):
        kind = rng.randrange(5)
        if kind == 0:
            out.append(AttrPlan(f"a{i}", "x" * rng.choice([1, 30, 3000])))
        elif kind == 1:
            out.append(AttrPlan(f"a{i}", [rng.random() for _ in range(rng.choice([1, 50]))]))
        elif kind == 2:
            out.append(AttrPlan(f"a{i}", ["t" * rng.randrange(40) for _ in range(7)]))
        elif kind == 3:
            out.append(AttrPlan(f"a{i}", list(range(4)), hdf5=I2BE, shape=(4,)))
        else:
            out.append(AttrPlan(f"a{i}", None, hdf5=F8, shape=None))
    return out


def _dataset(rng: random.Random, plan: ObjPlan) -> None:
    kind = rng.randrange(4)
    if kind == 3:  # embedded variable-length strings
        count = rng.choice([1, 5, 300])
        plan.hdf5, plan.shape = VSTR, (count,)
        plan.data = ["v" * rng.randrange(60) for _ in range(count)]
        return
    plan.hdf5, itemsize = rng.choice(FIXED)
    rank = rng.choice([0, 1, 2])
    plan.shape = tuple(rng.choice([1, 7, 100, 3000]) for _ in range(rank))
    if rank and rng.random() < 0.6:
        plan.chunks = tuple(max(1, n // rng.choice([1, 3, 10])) for n in plan.shape)
        if rng.random() < 0.3:
            plan.maxshape = (None, *plan.shape[1:])
    if kind == 2:  # embedded fixed-size elements
        plan.data = [0] * int(np.prod(plan.shape)) if plan.hdf5 in (F8, I2BE) else None
    if plan.data is None:
        plan.stored = int(np.prod(plan.shape)) * itemsize


def _random_skeleton(seed: int) -> Skeleton:
    rng = random.Random(seed)
    skeleton = Skeleton([ObjPlan(id="g-0", kind=ObjectKind.GROUP, parent=None, name="",
                                 path="/", attrs=_attrs(rng))])
    groups = [skeleton.objects[0]]
    for number in range(1, rng.choice([5, 60, 400])):
        parent = rng.choice(groups)
        name = f"{_name(rng)}{number}"
        kind = ObjectKind.GROUP if rng.random() < 0.2 else ObjectKind.DATASET
        plan = ObjPlan(id=f"o-{number}", kind=kind, parent=parent.id, name=name,
                       path=f"{parent.path.rstrip('/')}/{name}", attrs=_attrs(rng))
        if kind is ObjectKind.GROUP:
            groups.append(plan)
        else:
            _dataset(rng, plan)
        skeleton.objects.append(plan)
    for number in range(rng.choice([0, 3, 40])):
        group = rng.choice(groups)
        kind = rng.choice(list(LinkKind))
        target = rng.choice(skeleton.objects[1:] or skeleton.objects)
        skeleton.links.append(LinkPlan(
            group.id, f"link{number}", kind,
            target.id if kind is LinkKind.HARD else target.path,
            "/elsewhere/other.h5" if kind is LinkKind.EXTERNAL else None))
    return skeleton


def _many(count: int, **extra: Any) -> Skeleton:
    root = ObjPlan(id="g-0", kind=ObjectKind.GROUP, parent=None, name="", path="/")
    objects = [root] + [ObjPlan(id=f"d-{i}", kind=ObjectKind.DATASET, parent="g-0",
                                name=f"d{i}", path=f"/d{i}", hdf5=F8, **extra)
                        for i in range(count)]
    return Skeleton(objects)


def _holds(skeleton: Skeleton, bound: Bound) -> int:
    """Check ``bound`` against the file HDF5 writes for ``skeleton`` given
    room to pass it; the length written. The file is never longer, not
    wastefully shorter, its metadata (every object header) is in the block
    set aside for it, and every dataset's elements are after that block (so
    a reader of the metadata, and the kernel's readahead around it, reads
    none of them)."""
    image = build_image(skeleton, Bound(WASTE_FACTOR * bound.size + WASTE_BYTES, bound.meta))
    written = image.starts[-1] if isinstance(image.parts[-1], int) else image.size
    assert bound.size % PAGE == 0 and bound.meta % PAGE == 0
    assert written <= bound.size <= WASTE_FACTOR * written + WASTE_BYTES, (written, bound)
    places = [start for start, part in zip(image.starts, image.parts, strict=True)
              if not isinstance(part, bytes | int)]
    assert min(places, default=bound.meta) >= bound.meta  # the elements after the block
    with _file(image, {}) as f:
        headers: list[int] = []
        f.visit(lambda name: headers.append(h5o.get_info(f[name].id).addr) and None)
        assert max(headers, default=0) < bound.meta
    return written


@pytest.mark.parametrize("seed", range(24))
def test_the_bound_holds_for_random_skeletons(seed: int) -> None:
    skeleton = _random_skeleton(seed)
    bound = size_bound(skeleton)
    _holds(skeleton, bound)


@pytest.mark.parametrize(("label", "skeleton"), [
    ("10k scalars", _many(10_000, shape=(), stored=8)),
    ("small chunks", _many(10, shape=(1000, 1000), chunks=(10, 10), stored=8_000_000)),
    ("page chunks", _many(20, shape=(100_000,), chunks=(1000,), stored=800_000)),
    ("a gigabyte", _many(2, shape=(1 << 26,), stored=1 << 29)),
    ("long attributes", _many(50, shape=(), stored=8,
                              attrs=[AttrPlan(f"a{i}", "v" * 20_000) for i in range(3)])),
])
def test_the_bound_holds_at_scale(label: str, skeleton: Skeleton) -> None:
    """Where the elements are most of the file, the bound passes it by less
    than a third of their bytes (chunks of under 2 KiB are counted as HDF5's
    small-data blocks hold them at worst: two of 800 bytes to a block)."""
    bound = size_bound(skeleton)
    written = _holds(skeleton, bound)
    stored = sum(plan.stored or 0 for plan in skeleton.objects)
    if stored > 1 << 20:
        assert bound.size - written < stored // 3 + WASTE_BYTES, (label, written, bound)


def test_a_file_over_its_promised_length_keeps_the_objects_made_first() -> None:
    skeleton = _many(2000, shape=(), stored=8)
    written = build_image(skeleton).size
    promised = written // 2 // PAGE * PAGE
    image = build_image(skeleton, Bound(promised, size_bound(skeleton).meta))
    assert image.size == promised
    assert isinstance(image.parts[-1], int)  # zeros after HDF5's end of file
    note = image.left_out[-1]
    assert note.startswith("/: the file holds the first ") and str(promised) in note
    kept = int(note.split()[6])
    assert 0 < kept < len(skeleton.objects)
    with _file(image, {}) as f:
        assert sorted(f, key=lambda name: int(name[1:])) == [
            plan.name for plan in skeleton.objects[1:kept]]
        assert str(f.attrs[LEFT_OUT_ATTR][-1]) == note


def test_a_padded_file_reads_as_written() -> None:
    skeleton = _many(3, shape=(5,), stored=40, attrs=[AttrPlan("units", "m")])
    image = build_image(skeleton)
    elements: dict[str | ChunkPart, bytes] = {
        f"d-{i}": np.arange(5, dtype="<f8").tobytes() for i in range(3)}
    with _file(image, elements) as f:
        assert f.attrs.get(LEFT_OUT_ATTR) is None
        for i in range(3):
            np.testing.assert_array_equal(f[f"d{i}"][()], np.arange(5, dtype="<f8"))
            assert f[f"d{i}"].attrs["units"] == "m"
    assert isinstance(image.parts[-1], int) and image.starts[-1] < image.size
