"""The ``D.h5`` view: every domain as one HDF5 file that HDF5's own tools open.

Owns ``H5Views`` (the files of the mount's domains: planned from the tree,
their length bounded by ``layouts.hdf5.size_bound``, built by
``layouts.hdf5.build_image`` in a worker thread, plans and files kept in a
bounded LRU while every object they were made from is current) and
``H5ViewFile``, the node of ``D.h5`` beside a domain's directory, or of
``.root.h5`` at the root of a mount of one file. ``H5Views`` is made before
the tree, which holds it (``Tree.h5views``); it holds no tree itself: each
call is given the tree to check the images against and plan them from.

The plan walks the domain from its root group, breadth first, the way the
tree shows it: each object is created at the first path that reaches it,
and every other link to it becomes a hard link. A dataset of fixed-size type
without references keeps its elements inside the file, chunked as stored
where HDF5 allows it: the library allocates their places and never writes
them, the image keeps only the bytes HDF5 wrote (``FileImage``), and a read
of a place is served from the dataset (``H5ViewHandle``): a chunk's place
as its chunk file (through the chunk cache), a contiguous dataset's as its
``P.npy`` past the NPY header. HDF5 reads a selection's chunks one after
another, in grid order for a band of rows and with a fixed stride for a
band of columns: two chunks one below the other in the grid, or three at
one stride, prefetch the next ones at that stride. So the file names no
other file: a copy of it, or the mount seen at another path (a bind mount,
a container), reads the same.
Variable-length and reference datasets are read and embedded while the
embedded bytes stay under ``-o h5view_inline``; over it, a dataset is left
out and named in the root attribute ``h5mount_left_out``. Memory bounds
how many objects a file holds: every ``ROOM_EVERY`` objects planned, the
planner asks the mount's ``-o memory_limit`` (``H5Views.memory``) for its
room, and stops once that room would not hold building what is planned
(``BUILD_BYTES`` an object); the file then holds the objects found first,
and says so. ``-o h5view_objects`` adds a cap by count. External links
to domains of this mount lead to those domains' ``D.h5`` views, by a path
relative to the file's own directory (HDF5 looks there first), so they hold
wherever the mount is seen; others are left out, so no path a bucket
controls leads an HDF5 tool to the host's files.

Size: ``st_size`` is the file's length, elements included, computed from
the plan before anything is written (``layouts.hdf5.size_bound``, an upper
bound on what HDF5 writes; the file ends in zeros past HDF5's end of file).
So the first ``stat`` plans the file (it reads the domain's metadata) and
keeps the plan; the first ``open`` builds it. A listing gives the kept size,
or a stand-in the kernel does not keep (docs/CONTRACT.md, "File attributes").

Concurrency: one plan or build per domain at a time (others wait for its
event and read what it kept) and one worker thread for all builds; the LRU
of plans and images changes only in synchronous calls. A handle opens a
dataset's reader once, at the first read of its elements, and closes them
all when it is released.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import trio

from layouts.hdf5 import (
    AttrPlan,
    Bound,
    ChunkPart,
    FileImage,
    LinkPlan,
    ObjPlan,
    PlanRef,
    Skeleton,
    build_image,
    external_ok,
    parsed_type,
    size_bound,
)
from layouts.model import (
    AnyObject,
    Dataset,
    Datatype,
    Domain,
    Group,
    Link,
    LinkKind,
    ObjectRef,
)
from layouts.views import NpyView, Reader, npy_header, read_array
from mountd.cache.chunkahead import chunk_unit, ravel, unravel
from mountd.config import format_size
from mountd.errors import MountError, NotFound, StorageError
from mountd.tree.nodes import FileHandle, FileNode, NodeType, Stat
from mountd.tree.paths import InDomain, ObjPath, relative, root_path
from mountd.tree.viewctx import ObjectContext

if TYPE_CHECKING:
    from mountd.cache.memlimit import MemoryLimit
    from mountd.config import MountConfig
    from mountd.tree.core import Tree

log = logging.getLogger(__name__)

#: The suffix of a domain's file view: ``sample.h5`` shows ``sample.h5.h5``.
SUFFIX = ".h5"
#: Default ``-o h5view_inline``: most bytes of variable-length data embedded.
DEFAULT_INLINE = 64 << 20
#: Objects planned between two asks for the memory limit's room; the first
#: ones are planned without asking, so a small domain's file is never cut.
ROOM_EVERY = 256
#: Links of a group whose objects are loaded together before they are
#: planned: a group of a million links is loaded no further than the file
#: will hold.
LOAD_WINDOW = 4096
#: Bytes building one planned object adds to resident memory, rounded up: the
#: bytes HDF5 writes for it, its parts, and what the build leaves in the heap.
#: walk100k (100,000 small datasets): 353 MiB resident once planned, 506 MiB
#: at the peak of its build.
BUILD_BYTES = 2048
#: Most bytes of images (and of the objects they were made from) kept; the
#: newest one is always kept.
IMAGE_BUDGET = 256 << 20
#: Rough bytes one model object kept with an image costs.
_OBJECT_BYTES = 1024
#: Rough bytes one object of a plan costs.
_PLAN_BYTES = 512
#: Rough bytes one part of an image costs besides the bytes it holds.
_PART_BYTES = 160
#: Bytes one embedded reference, or the bookkeeping of one embedded element, counts.
_ELEMENT_BYTES = 8
#: The view whose reads serve a dataset's elements inside the file.
_NPY = NpyView()


@dataclass(frozen=True, slots=True)
class _Plan:
    """A domain's skeleton, planned and not yet built, and its file's length."""

    skeleton: Skeleton
    bound: Bound
    #: The objects it was planned from, as (id, object).
    seen: list[tuple[str, AnyObject]]
    #: Where each dataset whose elements the file keeps was read from, by id.
    sources: dict[str, ObjPath]

    @property
    def size(self) -> int:
        return self.bound.size

    @property
    def cost(self) -> int:
        """Bytes charged to ``IMAGE_BUDGET``: the plan's objects and the
        model objects it keeps alive past the metadata cache's own budget."""
        return (_PLAN_BYTES * len(self.skeleton.objects)
                + _OBJECT_BYTES * len(self.seen))


@dataclass(frozen=True, slots=True)
class _Image:
    """A domain's file, built (``file.size`` is the planned length)."""

    file: FileImage
    seen: list[tuple[str, AnyObject]]
    sources: dict[str, ObjPath]

    @property
    def size(self) -> int:
        return self.file.size

    @property
    def cost(self) -> int:
        """Bytes charged to ``IMAGE_BUDGET``: the bytes HDF5 wrote, its parts,
        and the objects the image keeps alive past the metadata cache's own
        budget."""
        return (self.file.written + _PART_BYTES * len(self.file.parts)
                + _OBJECT_BYTES * len(self.seen))


class H5Views:
    """The ``D.h5`` files of one mount: planned (their length known) or
    built, kept while current."""

    def __init__(self, inline: int = DEFAULT_INLINE, most_objects: int | None = None) -> None:
        self.inline = inline
        self.most_objects = most_objects
        #: The mount's ``-o memory_limit``, set by the daemon once its caches
        #: are made (None: off, and only ``most_objects`` bounds a file).
        self.memory: MemoryLimit | None = None
        #: Files planned, built, and kept ones whose objects, read again after
        #: ``metadata_ttl``, were unchanged (``stats.json``: ``caches.h5view``).
        self.plans = self.builds = self.renewed = 0
        self._kept: OrderedDict[Hashable, _Plan | _Image] = OrderedDict()
        self._used = 0
        self._busy: dict[Hashable, trio.Event] = {}
        self._thread = trio.CapacityLimiter(1)

    @classmethod
    def for_mount(cls, config: MountConfig) -> H5Views | None:
        """The views of a mount as ``config`` says (None: ``-o h5view=off``)."""
        if not config.h5view:
            return None
        return cls(config.h5view_inline, config.h5view_objects)

    def kept(self, tree: Tree, domain: Domain) -> _Plan | _Image | None:
        """The plan or image of ``domain`` if everything it came from is
        current in ``tree``."""
        kept = self._kept.get(domain.path)
        if kept is None or not tree.all_fresh(domain, kept.seen):
            return None
        self._kept.move_to_end(domain.path)
        return kept

    async def size(self, tree: Tree, domain: Domain) -> int:
        """The length of the file of ``domain``: kept, or planned now (the
        file is not written: ``size_bound``)."""
        return (await self._get(tree, domain, build=False)).size

    async def image(self, tree: Tree, domain: Domain) -> _Image:
        """The file of ``domain``: kept, or built now (from its kept plan, or
        from one made now) and kept."""
        image = await self._get(tree, domain, build=True)
        assert isinstance(image, _Image)
        return image

    async def _get(self, tree: Tree, domain: Domain, *, build: bool) -> _Plan | _Image:
        key = domain.path
        while (pending := self._busy.get(key)) is not None:
            await pending.wait()
        kept = self.kept(tree, domain)
        if kept is not None and (isinstance(kept, _Image) or not build):
            return kept
        done = self._busy[key] = trio.Event()
        try:
            if kept is None:
                kept = await self._renewed(tree, domain)
                if kept is not None and (isinstance(kept, _Image) or not build):
                    return kept
            plan = kept if isinstance(kept, _Plan) else await self._plan(tree, domain)
            made = await self._build(domain, plan) if build else plan
            self._keep(key, made)
        finally:
            del self._busy[key]
            done.set()
        return made

    async def _renewed(self, tree: Tree, domain: Domain) -> _Plan | _Image | None:
        """The kept plan or image of ``domain`` whose objects' time ran out,
        if reading them again (one listing of the domain, where the format
        keeps one) hands out the same objects, or ones that describe them
        alike (an object first read before the listing is read again): the
        domain did not change, so the file is the same, and its length too,
        even for a reader that has it open. Else it is dropped before the
        domain is planned anew, so that planning has its memory back."""
        key = domain.path
        old = self._kept.get(key)
        if old is None:
            return None
        if await self._unchanged(tree, domain, old.seen):
            log.debug("the HDF5 view of %s is current again: its %d objects are unchanged",
                      key or "/", len(old.seen))
            self.renewed += 1
            self._kept.move_to_end(key)
            return old
        if self._kept.get(key) is old:
            self._forget(key)
        return None

    @staticmethod
    async def _unchanged(tree: Tree, domain: Domain, seen: list[tuple[str, AnyObject]]) -> bool:
        """Whether ``seen`` (in the order planned, the root first) are all
        unchanged, read again ``LOAD_WINDOW`` at a time, so that a change
        found early (the root's) reads no further; the ones read again take
        the old ones' places."""
        for start in range(0, len(seen), LOAD_WINDOW):
            part = seen[start:start + LOAD_WINDOW]
            await tree.load_objects(domain, [obj_id for obj_id, _ in part])
            if not tree.renewed(domain, part):
                return False
            seen[start:start + len(part)] = part
        return tree.all_fresh(domain, seen)

    async def _plan(self, tree: Tree, domain: Domain) -> _Plan:
        started = time.monotonic()
        self.plans += 1
        planner = _Planner(self, tree, domain)
        skeleton = await planner.plan()
        bound = await trio.to_thread.run_sync(size_bound, skeleton)
        log.info("planned the HDF5 view of %s: %d objects, %d bytes; %.2f s",
                 domain.path or "/", len(skeleton.objects), bound.size,
                 time.monotonic() - started)
        return _Plan(skeleton, bound, planner.seen, planner.sources)

    async def _build(self, domain: Domain, plan: _Plan) -> _Image:
        started = time.monotonic()
        self.builds += 1
        async with self._thread:
            file = await trio.to_thread.run_sync(build_image, plan.skeleton, plan.bound)
        log.info("built the HDF5 view of %s: %d objects, %d bytes (%d written), %d left "
                 "out; %.2f s", domain.path or "/", len(plan.skeleton.objects), file.size,
                 file.written, len(file.left_out), time.monotonic() - started)
        for line in file.left_out:
            log.info("HDF5 view of %s leaves out %s", domain.path or "/", line)
        return _Image(file, plan.seen, plan.sources)

    @property
    def used(self) -> int:
        """Bytes of plans and images kept, as charged to ``IMAGE_BUDGET``."""
        return self._used

    def _forget(self, key: Hashable) -> None:
        """Drop what is kept of ``key``, if anything, and its charge."""
        old = self._kept.pop(key, None)
        if old is not None:
            self._used -= old.cost

    def _keep(self, key: Hashable, kept: _Plan | _Image) -> None:
        self._forget(key)
        self._kept[key] = kept
        self._used += kept.cost
        while self._used > IMAGE_BUDGET and len(self._kept) > 1:
            _, dropped = self._kept.popitem(last=False)
            self._used -= dropped.cost


class _Planner:
    """Plans the skeleton of one domain (see the module docstring)."""

    def __init__(self, views: H5Views, tree: Tree, domain: Domain) -> None:
        self.views = views
        self.tree = tree
        self.domain = domain
        self.skeleton = Skeleton()
        self.first: dict[str, ObjPlan] = {}
        self.seen: list[tuple[str, AnyObject]] = []
        self.inline_left = views.inline
        self._attrs: list[tuple[ObjPlan, AnyObject]] = []
        #: Embedded datasets whose elements may hold references, resolved last.
        self._refs: list[ObjPlan] = []
        #: Datasets left out (over ``h5view_inline``).
        self._dropped: set[str] = set()
        #: Links to objects not planned once the file was full, and why it was.
        self._past_limit = 0
        self._full: str | None = None
        #: Objects planned when the memory limit's room was last asked for.
        self._asked_at = 0
        #: Where each dataset whose elements the file keeps is, by id.
        self.sources: dict[str, ObjPath] = {}

    async def plan(self) -> Skeleton:
        root = root_path(self.domain)
        group = await self.tree.group(root)
        self._add(root, group, None, "")
        queue: deque[tuple[ObjPath, Group]] = deque([(root, group)])
        while queue:
            op, group = queue.popleft()
            links = list(group.links.items())
            for start in range(0, len(links), LOAD_WINDOW):
                window = links[start:start + LOAD_WINDOW]
                if self._full is None:
                    await self.tree.load_objects(
                        self.domain, [link.target for _, link in window
                                      if link.kind is LinkKind.HARD
                                      and link.target not in self.first])
                for name, link in window:
                    child = await self._link(op, group, name, link)
                    if child is not None:
                        queue.append(child)
        for plan, obj in self._attrs:
            plan.attrs = [AttrPlan(a.name, await self._value(a.value), a.hdf5, a.shape)
                          for a in obj.attrs]
        for plan in self._refs:
            plan.data = [await self._value(v) for v in plan.data or ()]
        if self._dropped:
            self.skeleton.objects = [p for p in self.skeleton.objects
                                     if p.id not in self._dropped]
        if self._past_limit:
            self.skeleton.left_out.append(
                f"/: the file holds the first {len(self.first)} objects found (breadth "
                f"first); {self._past_limit} links to further objects are left out "
                f"({self._full})")
        return self.skeleton

    def full(self) -> bool:
        """True once the file takes no more objects: it holds ``most_objects``,
        or the memory limit's room would not hold building what is planned
        (asked every ``ROOM_EVERY`` objects; once full, it stays full)."""
        if self._full is not None:
            return True
        planned = len(self.first)
        most = self.views.most_objects
        if most is not None and planned >= most:
            self._full = f"h5view_objects={most}"
        elif (memory := self.views.memory) is not None and \
                planned - self._asked_at >= ROOM_EVERY:
            self._asked_at = planned
            need = planned * BUILD_BYTES
            room = memory.room()
            if room < need:
                room = memory.room(trim=True)
            if room < need:
                self._full = (f"building more would pass memory_limit="
                              f"{format_size(memory.limit)}")
                log.info("the HDF5 view of %s stops at %d objects: %d MiB of room under "
                         "-o memory_limit, %d MiB to build them", self.domain.path or "/",
                         planned, room >> 20, need >> 20)
        return self._full is not None

    def _add(self, op: ObjPath, obj: AnyObject, parent: str | None, name: str) -> ObjPlan:
        plan = ObjPlan(id=obj.id, kind=obj.kind, parent=parent, name=name, path=op.h5path)
        self.first[obj.id] = plan
        self.seen.append((obj.id, obj))
        self.skeleton.objects.append(plan)
        self._attrs.append((plan, obj))
        return plan

    async def _link(self, op: ObjPath, group: Group, name: str, link: Link
                    ) -> tuple[ObjPath, Group] | None:
        group_id = op.id
        if link.kind is LinkKind.SOFT:
            self.skeleton.links.append(LinkPlan(group_id, name, LinkKind.SOFT, link.target))
            return None
        if link.kind is LinkKind.EXTERNAL:
            await self._external(op, name, link)
            return None
        if link.target in self.first:
            self.skeleton.links.append(LinkPlan(group_id, name, LinkKind.HARD, link.target))
            return None
        if self.full():
            self._past_limit += 1
            return None
        child = op.child(name, link.target)
        try:
            obj = await self.tree.obj(child)
        except MountError as exc:
            self.skeleton.left_out.append(f"{child.h5path}: cannot be read ({exc})")
            return None
        plan = self._add(child, obj, group_id, name)
        if isinstance(obj, Datatype):
            plan.hdf5 = obj.type.hdf5
        elif isinstance(obj, Dataset):
            await self._dataset(child, obj, plan)
        elif isinstance(obj, Group):
            return child, obj
        return None

    async def _external(self, op: ObjPath, name: str, link: Link) -> None:
        where = f"{op.h5path.rstrip('/')}/{name}"
        try:
            domain = await self.tree.links.external_domain(self.domain, link)
        except MountError:
            domain = None
        if domain is None or domain.root_id is None:
            self.skeleton.left_out.append(
                f"{where}: external link to {link.domain}::{link.target} is not in this mount")
            return
        places = self.tree.places
        here = places.file_location(root_path(self.domain), SUFFIX)[:-1]
        self.skeleton.links.append(LinkPlan(
            op.id, name, LinkKind.EXTERNAL, link.target,
            relative(places.file_location(root_path(domain), SUFFIX), here)))

    async def _dataset(self, op: ObjPath, ds: Dataset, plan: ObjPlan) -> None:
        tj = ds.type.hdf5
        plan.hdf5, plan.shape, plan.maxshape = tj, ds.shape, ds.maxshape
        plan.chunks = ds.chunks
        raw = external_ok(tj)  # its chunk files' bytes (and its .npy's) are HDF5's
        if ds.fill_value is not None and raw:
            plan.fill = ds.fill_bytes()
        if ds.shape is None or math.prod(ds.shape) == 0:
            return
        if raw:
            plan.stored = math.prod(ds.shape) * ds.type.itemsize
            self.sources[ds.id] = op
            return
        await self._embed(op, ds, plan)

    async def _embed(self, op: ObjPath, ds: Dataset, plan: ObjPlan) -> None:
        assert ds.shape is not None
        t = parsed_type(ds.type.hdf5)[0]
        count = math.prod(ds.shape)
        least = count * (ds.type.itemsize if ds.type.fixed_size else _ELEMENT_BYTES)
        if least > self.inline_left:
            self._drop(plan, f"{least} bytes would pass h5view_inline={self.views.inline}")
            return
        ctx = ObjectContext(self.tree, op, ds)
        array = await read_array(ctx, ds)  # a sub-array type adds its dims after the shape
        values = array.reshape((count, *array.shape[len(ds.shape):]))
        if t.cls == "ref":
            elements: list[Any] = ([ds.stored_ref(v) for v in values] if ds.stored_ref
                                   else [None] * count)
        elif ds.type.fixed_size:  # e.g. a compound holding references: plain values
            elements = values.tolist()
        else:
            elements = list(values)
        size = least if ds.type.fixed_size else sum(_nbytes(v) for v in elements)
        if size > self.inline_left:
            self._drop(plan, f"{size} bytes would pass h5view_inline={self.views.inline}")
            return
        self.inline_left -= size
        plan.data = elements
        self._refs.append(plan)

    def _drop(self, plan: ObjPlan, reason: str) -> None:
        """Leave a dataset out of the skeleton, saying why."""
        self.skeleton.left_out.append(f"{plan.path}: {reason}")
        self._dropped.add(plan.id)

    async def _value(self, value: Any) -> Any:
        """A model value with its object references as ``PlanRef``s."""
        if isinstance(value, ObjectRef):
            return PlanRef(await self._target(value))
        if isinstance(value, list):
            return [await self._value(v) for v in value]
        return value

    async def _target(self, ref: ObjectRef) -> str | None:
        if ref.obj_id is not None:
            return ref.obj_id if ref.obj_id in self.first else None
        if ref.path is None:
            return None
        try:
            target = await self.tree.links.resolve(root_path(self.domain), ref.path)
        except MountError:
            return None
        return None if target is None or target.id not in self.first else target.id


def _nbytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogateescape")) + _ELEMENT_BYTES
    if isinstance(value, bytes):
        return len(value) + _ELEMENT_BYTES
    if isinstance(value, np.ndarray):
        return value.nbytes + _ELEMENT_BYTES
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value) + _ELEMENT_BYTES
    return _ELEMENT_BYTES


class H5ViewFile(InDomain, FileNode):
    """``D.h5`` (or ``.root.h5``): the HDF5 file view of one domain."""

    def __init__(self, tree: Tree, views: H5Views, domain: Domain) -> None:
        self.tree = tree
        self.views = views
        self.op = root_path(domain)

    @property
    def key(self) -> Hashable:
        return ("h5view", self.op.domain.path)

    async def _domain(self) -> Domain:
        """The domain as the catalog has it now (NotFound once it is gone)."""
        domain = await self.tree.catalog.domain(self.op.domain.path)
        if domain is None or domain.root_id is None:
            raise NotFound(self.op.domain.path)
        return domain

    def _stat(self, domain: Domain, size: int, exact: bool = True) -> Stat:
        mtime, ctime = self.tree.stamps(domain)
        return Stat(NodeType.FILE, size=size, mtime=mtime, ctime=ctime, exact=exact)

    async def stat(self) -> Stat:
        domain = await self._domain()
        return self._stat(domain, await self.views.size(self.tree, domain))

    async def listed(self) -> Stat:
        domain = await self._domain()
        kept = self.views.kept(self.tree, domain)
        if kept is None:
            return self._stat(domain, 0, exact=False)
        return self._stat(domain, kept.size)

    async def open(self) -> FileHandle:
        """A file whose length was not known before is read past the page
        cache: the kernel may hold a stand-in size from a listing."""
        domain = await self._domain()
        kept = self.views.kept(self.tree, domain)
        image = kept if isinstance(kept, _Image) else await self.views.image(self.tree, domain)
        return H5ViewHandle(self.tree, image, direct_io=kept is None,
                            keep_cache=self.tree.keep_pages(self.key))


class H5ViewHandle(FileHandle):
    """An open ``D.h5``: the bytes HDF5 wrote, from the image, and in the
    places of the datasets' elements the elements themselves, read from each
    dataset as its ``P.npy`` reads them past the NPY header."""

    def __init__(self, tree: Tree, image: _Image, *, direct_io: bool,
                 keep_cache: bool) -> None:
        self.tree = tree
        self.image = image
        self.direct_io = direct_io
        self.keep_cache = keep_cache
        #: The reader of each dataset read so far, with its NPY header's length.
        self._readers: dict[str, tuple[Reader, int]] = {}
        #: Per dataset: the grid position of the chunk read last, and the
        #: stride from the one before.
        self._strides: dict[str, tuple[int, int]] = {}

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        file = self.image.file
        end = min(offset + size, file.size)
        index = bisect.bisect_right(file.starts, offset) - 1
        pieces: list[bytes | memoryview] = []
        pos = offset
        while pos < end:
            start, part_end = file.starts[index], file.part_end(index)
            stop = min(end, part_end)
            part = file.parts[index]
            if isinstance(part, bytes):
                piece: bytes | memoryview = memoryview(part)[pos - start:stop - start]
            elif isinstance(part, int):
                piece = bytes(stop - pos)
            elif isinstance(part, ChunkPart):
                piece = memoryview(await self._chunk(part, part_end - start))[
                    pos - start:stop - start]
            else:
                piece = await self._elements(part, part_end - start, pos - start, stop - pos)
            # A reader's buffer is valid until its next await: keep a copy.
            pieces.append(piece if stop == end and not pieces else bytes(piece))
            pos = stop
            index += 1
        if len(pieces) == 1:
            return pieces[0]
        return b"".join(pieces)

    async def _dataset(self, obj_id: str, length: int) -> tuple[ObjPath, Dataset]:
        """Dataset ``obj_id`` as the tree has it now, if it still holds the
        ``length`` bytes of elements the file was built for (else EIO)."""
        op = self.image.sources[obj_id]
        ds = await self.tree.dataset(op)
        if not (ds.type.fixed_size and ds.shape is not None
                and math.prod(ds.shape) * ds.type.itemsize == length):
            raise StorageError(op.h5path, "changed since its HDF5 file view was built")
        return op, ds

    async def _chunk(self, part: ChunkPart, length: int) -> bytes:
        """The decoded bytes of one whole chunk (the fill value where none is
        stored), through the chunk cache (``_read_ahead`` says what is
        prefetched)."""
        op = self.image.sources[part.obj_id]
        ds = await self.tree.dataset(op)
        if ds.chunk_nbytes != length or ds.shape is None or not ds.in_grid(part.index):
            raise StorageError(op.h5path, "changed since its HDF5 file view was built")
        self._read_ahead(part, op, ds)
        data = await self.tree.chunk(op, ds, part.index)
        if data is None:
            data = ds.fill_bytes() * math.prod(ds.chunks)
        if len(data) != length:
            raise StorageError(op.h5path, f"chunk {part.index} has {len(data)} bytes, "
                               f"not {length}")
        return data

    def _read_ahead(self, part: ChunkPart, op: ObjPath, ds: Dataset) -> None:
        """Prefetch what a reader of chunk ``part`` will read next: after two
        steps of one stride forward in grid order, or one step down a column
        of the grid (HDF5's order for a band of columns), the next chunks at
        that stride, as many as the tree's readahead holds. (Not the chunk
        files' readahead: that follows grid order alone, and its state is
        shared with the dataset's other readers.)"""
        grid = ds.grid
        pos = ravel(part.index, grid)
        last, stride = self._strides.get(part.obj_id, (-1, 0))
        step = pos - last
        if step == 0:  # another piece of the chunk read last
            return
        self._strides[part.obj_id] = (pos, step)
        down = len(grid) > 1 and last >= 0 and step == math.prod(grid[1:])
        if step > 0 and (step == stride or down):
            count = max(1, self.tree.readahead_cap // chunk_unit(ds))
            stop = min(math.prod(grid), pos + step * (count + 1))
            self.tree.prefetch_chunks(op, ds, [unravel(p, grid) for p in
                                               range(pos + step, stop, step)])

    async def _elements(self, obj_id: str, length: int, at: int,
                        size: int) -> bytes | memoryview:
        """``size`` bytes at ``at`` of the ``length`` bytes of elements of
        dataset ``obj_id``."""
        opened = self._readers.get(obj_id)
        if opened is None:
            op, ds = await self._dataset(obj_id, length)
            reader = await _NPY.open(ObjectContext(self.tree, op, ds))
            if obj_id in self._readers:  # another read opened it meanwhile
                reader.close()
            else:
                self._readers[obj_id] = (reader, len(npy_header(ds)))
            opened = self._readers[obj_id]
        reader, header = opened
        data = await reader.read(header + at, size)
        if len(data) != size:
            raise StorageError(self.image.sources[obj_id].h5path,
                               f"gave {len(data)} of {size} bytes at {at}")
        return data

    def close(self) -> None:
        for reader, _ in self._readers.values():
            reader.close()
        self._readers.clear()
