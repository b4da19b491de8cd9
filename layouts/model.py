"""The HDF5 object model: the seam between storage formats and the tree.

Storage formats (``layouts.formats.hsds`` for HSDS buckets, ``layouts.formats.refs``
for LINDI and kerchunk reference files) build these objects; ``mountd.tree`` and
the views (``layouts.views._api``) turn them into files. Nothing here does I/O
except through the ``ChunkStore`` and ``Catalog`` protocols, which a layout
implements. The dataclasses are frozen: once a layout has built an object it
is shared read-only between trio tasks.

Conventions every layout keeps:

* Attribute values are plain JSON-like Python values (``None``, ``bool``,
  ``int``, ``float``, ``str``, nested ``list``/``dict``), plus ``ObjectRef``
  for object references and ``bytes`` for opaque data. Floats may be NaN or
  infinite; the tree's JSON encoder spells those as strings.
* ``Dataset.read_chunk`` returns the bytes of the chunk *file* exactly as
  docs/CONTRACT.md, "Chunk files", defines them: decoded, C order, full chunk shape, the
  dataset's byte order; variable-length types encoded with the numcodecs codec
  ``ElementType.vlen`` names (``VlenKind``: ``VLenUTF8``, ``VLenBytes``,
  ``VLenArray`` of ``vlen_base``, or ``JSON``).
* Object ids are opaque strings, unique within a domain.
* What a layout can do is declared, never probed: every ``ChunkStore`` and
  ``Catalog`` implements every member of its protocol (a batch read or load
  of its own, or the plain ``read_each`` / ``get_each``), and a catalog says
  with ``supports_proof_ages`` whether it is an ``AgedCatalog``.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from layouts.gather import outcomes

if TYPE_CHECKING:
    from layouts.errors import LayoutError

ChunkIndex = tuple[int, ...]

#: Chunks read at once by ``read_each``, for a store that has no batch read.
READ_EACH_CONCURRENCY = 16
#: Objects loaded at once by ``get_each``, for a catalog that has no batch load.
GET_EACH_CONCURRENCY = 64
#: Distinct (shape, chunks) pairs whose chunk grid tuple datasets share.
SHARED_GRIDS = 4096

#: JSON-like attribute value (see module docstring).
AttrValue = Any


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """An HDF5 object reference inside an attribute or a sidecar value.

    ``obj_id`` is the target's id when the format knows it (HSDS); ``path`` is
    its HDF5 path when the format stores that instead (LINDI). At least one is set.
    """

    obj_id: str | None = None
    path: str | None = None


class LinkKind(enum.Enum):
    HARD = "hard"
    SOFT = "soft"
    EXTERNAL = "external"


class ObjectKind(enum.Enum):
    GROUP = "group"
    DATASET = "dataset"
    DATATYPE = "datatype"


@dataclass(frozen=True, slots=True)
class Link:
    """One named link in a group.

    HARD: ``target`` is the object id. SOFT: ``target`` is the HDF5 path,
    absolute or relative to the group. EXTERNAL: ``target`` is the HDF5 path
    inside ``domain`` (an HSDS domain path such as ``/home/u/f.h5`` or a file name).
    """

    kind: LinkKind
    target: str
    domain: str | None = None
    #: For HARD links, what the id says the target is, when the format knows it
    #: without reading the object (HSDS ids start with g-, d- or t-).
    target_kind: ObjectKind | None = None


class VlenKind(enum.Enum):
    """How a variable-length element type is encoded in chunk files."""

    UTF8 = "vlen-utf8"  # numcodecs VLenUTF8
    BYTES = "vlen-bytes"  # numcodecs VLenBytes
    ARRAY = "vlen-array"  # numcodecs VLenArray(base)
    JSON = "json2"  # numcodecs JSON: compound types with variable-length fields


@dataclass(frozen=True, slots=True)
class ElementType:
    """The element type of a dataset or attribute.

    ``dtype`` is the NumPy dtype of one element as stored in chunk files for
    fixed-size types (byte order included), or ``object`` for variable-length
    ones. ``vlen`` says how a variable-length type is encoded; ``vlen_base`` is
    the base dtype for ``VlenKind.ARRAY``. ``sidecar`` is the value of the
    sidecar's ``dtype`` key (docs/CONTRACT.md, "Sidecars"). ``hdf5`` is the format's own type
    description, shown under the sidecar's ``hdf5.type``.
    """

    dtype: np.dtype[Any]
    sidecar: Any
    hdf5: Mapping[str, Any]
    vlen: VlenKind | None = None
    vlen_base: np.dtype[Any] | None = None

    @property
    def fixed_size(self) -> bool:
        return self.vlen is None

    @property
    def base_and_dims(self) -> tuple[np.dtype[Any], tuple[int, ...]]:
        """A sub-array element type as its base type and dims (nested ones
        flattened, outer dims first: NumPy keeps an array of arrays nested);
        any other type is itself with no dims."""
        dtype, dims = self.dtype, ()
        while dtype.subdtype is not None:
            dtype, sub = dtype.subdtype
            dims += sub
        return dtype, dims

    @property
    def itemsize(self) -> int:
        """Bytes per element in a chunk file (fixed-size types only)."""
        if self.vlen is not None:
            raise TypeError("variable-length types have no item size")
        return self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Attribute:
    name: str
    value: AttrValue
    #: numpy-style dtype description for xattr ``user.h5.dtype``-like uses; may be None.
    dtype: Any = None
    #: The stored HDF5 type (HDF5/JSON, as ``ElementType.hdf5``) and dataspace
    #: (``()`` scalar, None ``H5S_NULL``), when the format keeps them (HSDS);
    #: ``hdf5`` None: only the value is known (LINDI ``.zattrs``).
    hdf5: Any = None
    shape: tuple[int, ...] | None = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class H5Object:
    """Fields shared by groups, datasets and committed datatypes."""

    id: str
    attrs: tuple[Attribute, ...] = ()
    #: When the object's stored metadata was last written, as storage keeps
    #: it (seconds since the epoch); None where the format has no such time.
    modified: float | None = None

    @property
    def kind(self) -> ObjectKind:
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class Group(H5Object):
    #: Links in the order the format lists them. Names are raw HDF5 link names.
    links: Mapping[str, Link] = field(default_factory=dict)

    @property
    def kind(self) -> ObjectKind:
        return ObjectKind.GROUP


@dataclass(frozen=True, slots=True, kw_only=True)
class Datatype(H5Object):
    """A committed (named) datatype."""

    type: ElementType

    @property
    def kind(self) -> ObjectKind:
        return ObjectKind.DATATYPE


def chunk_grid(shape: Sequence[int], chunks: Sequence[int]) -> tuple[int, ...]:
    """Number of chunks along each dimension (0 where a chunk dimension is 0)."""
    return tuple(-(-n // c) if c else 0 for n, c in zip(shape, chunks, strict=True))


@functools.lru_cache(maxsize=SHARED_GRIDS)
def shared_grid(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[int, ...]:
    """``chunk_grid``, one tuple for every dataset (and chunk store) of the
    same shape and chunks."""
    return chunk_grid(shape, chunks)


def store_grid(shape: tuple[int, ...] | None, chunks: tuple[int, ...]) -> tuple[int, ...] | None:
    """The chunk grid a chunk store indexes: None for an ``H5S_NULL`` dataspace (no
    chunks), ``(1,)`` for a scalar (its one chunk is ``(0,)``), else ``shared_grid``."""
    if shape is None:
        return None
    if shape == ():
        return (1,)
    return shared_grid(shape, chunks)


def in_chunk_grid(index: Sequence[int], grid: Sequence[int]) -> bool:
    """True if ``index`` names a chunk of ``grid``."""
    return len(index) == len(grid) and all(0 <= i < n for i, n in zip(index, grid, strict=True))


class ChunkStore(Protocol):
    """How a dataset's chunks are found and read. Implemented by each layout.

    Every store implements every member; none is optional, so a caller never
    asks whether a store has one. ``read_many`` is where a store says whether it
    reads a batch better than chunk by chunk: a batch read of its own (HSDS:
    one ``Store.fetch_many`` and one decode of the batch), or ``read_each``
    (``read`` of each chunk, ``READ_EACH_CONCURRENCY`` at once) for a store
    that has none.
    """

    async def read(self, index: ChunkIndex) -> bytes | None:
        """The chunk file's bytes (see module docstring), or None if not stored."""
        ...

    async def read_many(self, indices: Sequence[ChunkIndex]
                        ) -> Sequence[bytes | LayoutError | None]:
        """``read`` of every index, in order: each chunk's bytes, None if it is not
        stored, or the ``LayoutError`` reading it raised. An error that fails the
        whole batch (an unsupported filter) may be raised instead."""
        ...

    async def exists(self, index: ChunkIndex) -> bool:
        """True if the chunk at ``index`` is stored."""
        ...

    def iter_stored(self) -> AsyncIterator[ChunkIndex]:
        """Indices of the stored chunks, lazily, in no promised order."""
        ...

    def listing_ready(self) -> bool:
        """True if ``iter_stored`` needs no storage round trip now (the listing is
        at hand), so listing the chunks ahead of a reader would save nothing."""
        ...

    async def version(self) -> Mapping[ChunkIndex, Hashable] | None:
        """Each stored chunk's validator, as a listing of the chunks shows it:
        a value that changes whenever the chunk changes (never repeated), so
        the mapping changes whenever a stored chunk changes, appears or goes.
        Learnt without reading a chunk: what lets a reader keep decoded bytes,
        and counts made of them, past ``metadata_ttl`` while storage is
        unchanged. None when the store cannot tell cheaply (no such listing,
        or too many chunks to list); a chunk's validator is None when the
        listing shows only that it is stored."""
        ...


async def no_version(store: ChunkStore) -> None:
    """``ChunkStore.version`` of a store that cannot tell cheaply (its chunks are
    byte ranges of other files, whose validators it does not list): assigned as
    the method, ``version = no_version``."""
    return None


async def read_each(store: ChunkStore, indices: Sequence[ChunkIndex]
                    ) -> list[bytes | LayoutError | None]:
    """``ChunkStore.read_many`` for a store with no batch read of its own: its chunks
    read with ``READ_EACH_CONCURRENCY`` concurrent ``read`` calls."""
    return await outcomes(store.read, indices, READ_EACH_CONCURRENCY)


def fill_element(etype: ElementType, fill_value: Any) -> bytes:
    """One element of ``fill_value`` (None: zeros) as chunk-file bytes of the
    fixed-size type ``etype``."""
    if fill_value is None:
        return bytes(etype.itemsize)
    base, dims = etype.base_and_dims
    if dims:  # a sub-array fill holds one value per item, not one per element
        return np.broadcast_to(np.asarray(fill_value, dtype=base), dims).tobytes()
    return np.asarray(fill_value, dtype=etype.dtype).tobytes()


@dataclass(frozen=True, slots=True, kw_only=True)
class Dataset(H5Object):
    """A dataset.

    ``shape`` is ``()`` for a scalar and None for an ``H5S_NULL`` dataspace.
    ``maxshape`` uses None for unlimited dimensions. ``chunks`` is the chunk
    shape (``()`` for a scalar; for contiguous data the layout picks a grid).
    ``fill_value`` is a NumPy scalar of ``type.dtype`` for fixed-size types,
    or a Python value (or None) for variable-length ones. ``hdf5`` holds the
    format's own ``filters`` and ``layout`` descriptions for the sidecar; a
    catalog may share one read-only mapping (``types.MappingProxyType``)
    among the datasets described alike, and the sidecar then keeps its shown
    form once.
    """

    shape: tuple[int, ...] | None
    maxshape: tuple[int | None, ...] | None
    type: ElementType
    chunks: tuple[int, ...]
    fill_value: Any
    hdf5: Mapping[str, Any] = field(default_factory=dict)
    store: ChunkStore
    #: For a dataset of object references: the object an element of its chunk
    #: files names, as the format stores it (None: a null or unknown reference).
    #: None when the format keeps no reference in chunk data the tree can follow.
    stored_ref: Callable[[Any], ObjectRef | None] | None = field(
        default=None, repr=False, compare=False)
    #: Number of chunks along each dimension (``()`` for a scalar), computed
    #: once: listings test every stored chunk against it.
    grid: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grid = () if self.shape is None else shared_grid(self.shape, self.chunks)
        object.__setattr__(self, "grid", grid)

    @property
    def kind(self) -> ObjectKind:
        return ObjectKind.DATASET

    @property
    def chunk_elements(self) -> int:
        return math.prod(self.chunks)

    @property
    def chunk_nbytes(self) -> int | None:
        """Size of one chunk file, or None when the type is variable-length."""
        if not self.type.fixed_size:
            return None
        return self.chunk_elements * self.type.itemsize

    def in_grid(self, index: ChunkIndex) -> bool:
        if self.shape is None:
            return False
        if self.shape == ():
            return index == (0,)
        grid = self.grid
        if len(grid) == 1:  # the common case of long listings, without a generator
            return len(index) == 1 and 0 <= index[0] < grid[0]
        return in_chunk_grid(index, grid)

    @property
    def effective_fill(self) -> Any:
        """What unstored elements read as: the fill value, or zero when there is none."""
        if self.fill_value is None and self.type.fixed_size:
            return np.zeros((), dtype=self.type.dtype)[()]
        return self.fill_value

    def fill_bytes(self) -> bytes:
        """One element of the fill value as chunk-file bytes (fixed-size types)."""
        return fill_element(self.type, self.fill_value)

    async def read_chunk(self, index: ChunkIndex) -> bytes | None:
        return await self.store.read(index)


AnyObject = Group | Dataset | Datatype


def same_description(a: AnyObject, b: AnyObject) -> bool:
    """True if ``a`` and ``b`` describe an object alike: the same kind, and
    every compared field equal but the chunk store, which a catalog makes
    anew each time it builds a dataset (two built from the same stored
    description read the same chunks); a NaN fill value equals a NaN.
    Fields that cannot be compared (an attribute holding an array) count as
    different."""
    if type(a) is not type(b):
        return False
    try:
        return all(_equal(getattr(a, f.name), getattr(b, f.name))
                   for f in fields(a) if f.compare and f.name != "store")
    except (ValueError, TypeError):
        return False


def _equal(x: Any, y: Any) -> bool:
    if bool(x == y):
        return True
    return (isinstance(x, float | np.floating) and isinstance(y, float | np.floating)
            and math.isnan(x) and math.isnan(y))


@dataclass(frozen=True, slots=True)
class Domain:
    """An HSDS domain (or the single file behind a reference file).

    ``root_id`` is None for a folder. ``path`` is the domain's path in the
    catalog without leading or trailing slash (``home/u/f.h5``; ``""`` for a
    catalog that is one file). ``info`` is the format's domain metadata shown
    under the root sidecar's ``domain`` key (owner, acls, created, lastModified).
    ``modified`` is when its stored description (an HSDS ``.domain.json``, a
    reference file) was last written, as storage keeps it.
    """

    path: str
    root_id: str | None
    modified: float | None = None
    info: Mapping[str, Any] = field(default_factory=dict)


class Catalog(Protocol):
    """A mountable source: folders of domains, and the objects of each domain.

    ``single_domain`` is the path of the one domain to mount as the mount
    root (reference files, ``--domain``), or None to mount the folder tree.

    Every catalog implements every member; none is optional, so a caller never
    asks whether a catalog has one. ``get_objects`` is a batch load of the
    catalog's own (HSDS: one ``Store.fetch_many``), or ``get_each`` for one
    that has none; ``drop`` forgets what a catalog keeps besides its answers,
    and does nothing in one that keeps nothing. ``supports_proof_ages`` says
    whether the catalog is also an ``AgedCatalog``.
    """

    #: True if the catalog is an ``AgedCatalog``: it says how old the proof of
    #: each object it loads is (``load_objects``, ``proven``).
    supports_proof_ages: bool

    @property
    def single_domain(self) -> str | None: ...

    async def list_folder(self, path: str) -> list[str]:
        """Names of the folders and domains directly inside folder ``path``."""
        ...

    async def domain(self, path: str) -> Domain | None:
        """The domain or folder at ``path``; None if the path is a plain
        directory with no domain object of its own. Raises NotFound if nothing
        is there."""
        ...

    async def get_object(self, domain: Domain, obj_id: str) -> AnyObject:
        """One object of ``domain`` by id."""
        ...

    async def get_objects(self, domain: Domain, obj_ids: Sequence[str]
                          ) -> list[AnyObject | LayoutError]:
        """``get_object`` of each id, in order: each object or the ``LayoutError``
        loading it raised."""
        ...

    def drop(self) -> None:
        """Forget what the catalog keeps besides its answers (the daemon's SIGHUP):
        indexes of storage, such as the HSDS domain listings, so what was
        written since is found."""
        ...


async def get_each(catalog: Catalog, domain: Domain, obj_ids: Sequence[str]
                   ) -> list[AnyObject | LayoutError]:
    """``Catalog.get_objects`` for a catalog with no batch load of its own: its
    objects loaded with ``GET_EACH_CONCURRENCY`` concurrent ``get_object`` calls."""
    return await outcomes(functools.partial(catalog.get_object, domain), obj_ids,
                          GET_EACH_CONCURRENCY)


class AgedCatalog(Catalog, Protocol):
    """A catalog that says, for each object it loads, how old the proof is that
    it is current: an answer built from a listing made a while ago is as old
    as that listing (``layouts.formats.hsds._domains``), and a cache in front of it
    keeps it no longer than ``metadata_ttl`` from then; and once that has
    passed, a newer listing that proves the very same object current keeps
    it for another period (``proven``), so what did not change is not built,
    rendered or listed again. Such a catalog sets ``supports_proof_ages``."""

    async def load_objects(self, domain: Domain, obj_ids: Sequence[str]
                           ) -> list[tuple[AnyObject | LayoutError, float]]:
        """Each object or the error loading it raised, with the age of its proof
        in seconds, in order."""
        ...

    def proven(self, obj_id: str) -> tuple[AnyObject, float] | None:
        """The object of id ``obj_id`` as a current proof shows it, and that
        proof's age, with no I/O; None when no such proof is at hand."""
        ...
