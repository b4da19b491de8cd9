"""The node kinds of the mounted tree: directories, files and symlinks.

A node is a cheap, immutable description of one entry (it holds where the
entry is, not its content); all content is produced by async methods that may
do I/O. ``key`` identifies the entry so the inode table can give the same
inode to the same entry however it was reached. Nodes know nothing of FUSE.

A directory listing hands out its entries in batches (``rows_after``), so
``readdir`` pays one await per batch rather than one per entry. Listings
are computed whole (``SnapshotListing``), streamed (``StreamListing``), or
whole when small and streamed otherwise (``SmallOrStreamListing``).

Concurrency: nodes keep no mutable state, so any number of tasks may use one
node at once. File handles (``FileHandle``) may also be read concurrently;
each implementation guards its own lazily loaded content. A directory
listing serialises its readers with a lock held only while it computes or
takes a batch of entries (a batch is handed out as a list of its own, so
nothing is held across the reader's awaits); a reader past the end of a
stream already taken needs no lock. That lock (``QuietLock``) does not
yield to trio when it is free: a ``find`` over 10,000 directories takes it
tens of thousands of times, and a ``trio.Lock`` checkpoint costs a
scheduler round each time.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

import trio

from mountd.errors import MountError, StorageError, report_once


class NodeType(enum.Enum):
    DIR = "dir"
    FILE = "file"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class Stat:
    """What ``getattr`` needs of a node. Times are POSIX seconds.

    ``exact`` is False when ``size`` is a stand-in that a listing gives
    because the real size costs work (a variable-length chunk must be
    decoded): the kernel is then told not to keep it, and the node's own
    ``stat`` computes the real one. ``volatile`` is True when the content
    changes on its own (the control files): the kernel keeps no attributes.
    """

    type: NodeType
    size: int = 0
    mtime: float = 0.0
    ctime: float = 0.0
    exact: bool = True
    volatile: bool = False


class Node(ABC):
    """An entry of the tree. Nodes have slots: a walk keeps one for each
    entry the kernel knows, several per object."""

    __slots__ = ()

    type: NodeType

    @property
    @abstractmethod
    def key(self) -> Hashable:
        """Identity of this entry, stable for the life of the mount."""

    @abstractmethod
    async def stat(self) -> Stat:
        """Size and times; may raise MountError."""

    async def listed(self) -> Stat:
        """The stat a directory listing gives: ``stat``, unless the size costs
        work to learn; then a stand-in (``exact`` False) that ``stat`` replaces."""
        return await self.stat()

    async def xattrs(self) -> dict[str, bytes]:
        """Extended attributes, by full name (``user.h5.id``)."""
        return {}

    async def domain_info(self) -> Mapping[str, Any] | None:
        """The metadata (owner, ACLs...) of the HSDS domain or folder this
        entry shows or belongs to, for ``-o hsds_acls``; None outside any."""
        return None


async def listed_stat(node: Node) -> Stat:
    """A node's stat for a directory listing, or a bare one of the right type
    if its metadata is broken: a listing must not fail because one child is
    corrupt; the child then gives EIO when it is opened or looked up."""
    try:
        return await node.listed()
    except StorageError as exc:
        report_once(exc)
    except MountError:
        pass
    return Stat(node.type)


class QuietLock:
    """A mutex for trio tasks that takes no checkpoint when it is free.

    ``trio.Lock`` always passes through the scheduler, even uncontended; a
    holder of this one that never awaits costs no more than a flag. Waiters
    are woken in no promised order. Not reentrant.
    """

    def __init__(self) -> None:
        self._held = False
        self._waiters = trio.lowlevel.ParkingLot()

    async def __aenter__(self) -> None:
        while self._held:
            await self._waiters.park()
        self._held = True

    async def __aexit__(self, *exc_info: object) -> None:
        self._held = False
        if self._waiters:
            self._waiters.unpark()


class Row(NamedTuple):
    """One directory entry. ``stat`` is the node's stat when the listing
    already knows it (then readdir asks the node for nothing more)."""

    name: str
    node: Node
    stat: Stat | None = None


class FlatRows(Sequence[Row]):
    """Rows kept in one flat list (name, node, stat, name, node, stat...),
    with no tuple per row: a group's memoised listing of 100,000 children
    keeps 300,000 rows. Reading a slice makes its ``Row`` tuples then.
    Rows are added (``extend``) only while the listing is being made."""

    __slots__ = ("_flat",)

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        self._flat: list[Any] = []
        self.extend(rows)

    def extend(self, rows: Iterable[Row]) -> None:
        self._flat.extend(field for row in rows for field in row)

    def __len__(self) -> int:
        return len(self._flat) // 3

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        flat = self._flat
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return [Row(flat[i], flat[i + 1], flat[i + 2])
                    for i in range(3 * start, 3 * stop, 3 * step)]
        at = 3 * range(len(self))[index]
        return Row(flat[at], flat[at + 1], flat[at + 2])

    def nodes(self) -> list[Node]:
        """The node of every row, in order."""
        nodes: list[Node] = self._flat[1::3]
        return nodes


class DirListing(ABC):
    """One open directory: its entries, read in pieces by cookie.

    Cookies are entry numbers: cookie ``n`` resumes after the ``n``-th entry,
    and 0 is the start. Entries come in batches (``rows_after``), so a
    ``readdir`` costs one await per batch, not one per entry.
    """

    @abstractmethod
    async def rows_after(self, start: int) -> Sequence[Row]:
        """The entries after cookie ``start``, in order; empty at the end.

        The entry at position ``i`` of the batch has cookie ``start + i + 1``;
        a batch may stop short of the end (ask again from its last cookie).
        ``start`` is 0 or a cookie this listing gave before; cookies are
        stable for the life of the listing.
        """

    async def entries(self, start: int) -> AsyncIterator[tuple[int, str, Node, Stat | None]]:
        """Yield ``(cookie, name, node, stat or None)`` for every entry after
        cookie ``start``, batch by batch: a walk over the tree outside FUSE."""
        pos = start
        while batch := await self.rows_after(pos):
            for name, node, st in batch:
                pos += 1
                yield pos, name, node, st

    @abstractmethod
    async def aclose(self) -> None:
        """Release what the listing holds (at releasedir); never raises."""


#: Most entries one ``SnapshotListing.rows_after`` call gives (bounds its copy):
#: about what one readdir reply holds, as glibc reads a directory 32 KiB at a
#: time (``mountd.fuse_ops.DIR_BLOCK_SIZE``), about 200 entries with attributes.
SNAPSHOT_BATCH = 256


class SnapshotListing(DirListing):
    """A listing computed whole on first use and kept while the directory is open."""

    def __init__(self, compute: Callable[[], Awaitable[Sequence[Row]]]) -> None:
        self._compute = compute
        self._items: Sequence[Row] | None = None
        self._lock = QuietLock()

    async def rows_after(self, start: int) -> Sequence[Row]:
        items = self._items
        if items is None:
            async with self._lock:
                if self._items is None:
                    self._items = await self._compute()
                items = self._items
        return items[start:start + SNAPSHOT_BATCH]

    async def aclose(self) -> None:
        self._items = None


#: Entries a streaming listing keeps, so a reader can resume from a recent cookie.
STREAM_WINDOW = 512
#: Entries a streaming listing takes from its stream per turn of its lock, and
#: the most entries one batch of a stream may hold.
STREAM_BATCH = 64


class StreamListing(DirListing):
    """A listing read lazily from a stream of entries, never held whole.

    The stream gives its entries in batches of at most ``STREAM_BATCH``.
    Cookie ``n`` resumes after the ``n``-th entry of the stream. The last
    ``window`` entries (at least two batches) are kept, which covers the
    kernel re-asking from the last cookie it accepted when its buffer filled.
    A cookie older than that restarts the stream and skips forward to it;
    the stream must give the same entries in the same order each time
    (storage listings do, while nothing is written).
    """

    def __init__(self, open_stream: Callable[[], AsyncIterator[Sequence[Row]]],
                 window: int = STREAM_WINDOW) -> None:
        if window < 2 * STREAM_BATCH:
            raise ValueError(f"a stream window holds at least {2 * STREAM_BATCH} entries")
        self._open = open_stream
        self.window = window
        self.restarts = 0
        self._stream: AsyncIterator[Sequence[Row]] | None = None
        self._taken = 0  # entries taken from the current stream
        self._ended = False
        self._recent: deque[Row] = deque(maxlen=window)
        self._lock = QuietLock()

    @property
    def kept(self) -> int:
        """Entries held now (at most ``window``)."""
        return len(self._recent)

    async def rows_after(self, start: int) -> Sequence[Row]:
        if self._ended and start >= self._taken - len(self._recent):
            # All taken and still kept (a reader at the end): nothing to await.
            return list(itertools.islice(self._recent, start - (self._taken - len(self._recent)),
                                         None))
        async with self._lock:
            return await self._batch_after(start)

    async def _batch_after(self, pos: int) -> list[Row]:
        """The entries kept after cookie ``pos``, once at least ``STREAM_BATCH``
        of them (or the rest of the stream) are taken."""
        if self._stream is None or pos < self._taken - len(self._recent):
            await self._restart()
        while self._taken < pos + STREAM_BATCH and await self._pull():
            pass
        first = self._taken - len(self._recent)  # cookie just before the oldest kept entry
        return list(itertools.islice(self._recent, pos - first, None))

    async def _pull(self) -> bool:
        """Take one more batch from the stream; False at its end."""
        if self._ended or self._stream is None:
            return False
        try:
            batch = await anext(self._stream)
        except StopAsyncIteration:
            self._ended = True
            return False
        except BaseException:
            # The stream is finished by its error; the next reader starts afresh.
            self._stream = None
            raise
        self._recent.extend(batch)
        self._taken += len(batch)
        return True

    async def _restart(self) -> None:
        if self._stream is not None:
            self.restarts += 1
        await self.aclose()
        self._stream = self._open()
        self._taken = 0
        self._ended = False
        self._recent.clear()

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        close = getattr(stream, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()


class SmallOrStreamListing(DirListing):
    """A listing that is whole when its directory can give every row at once
    (a small directory whose rows are at hand), else a ``StreamListing``.

    ``whole`` is asked once, at the first read: the rows, or None to stream
    them from ``open_stream`` (then ``stream`` is that listing). A small
    directory so costs no stream, no window and no lock after its first read.
    """

    def __init__(self, whole: Callable[[], Awaitable[Sequence[Row] | None]],
                 open_stream: Callable[[], AsyncIterator[Sequence[Row]]]) -> None:
        self._whole = whole
        self._open = open_stream
        self._rows: Sequence[Row] | None = None
        self.stream: StreamListing | None = None
        self._lock = QuietLock()

    async def rows_after(self, start: int) -> Sequence[Row]:
        if self._rows is None and self.stream is None:
            async with self._lock:
                if self._rows is None and self.stream is None:
                    rows = await self._whole()
                    if rows is None:
                        self.stream = StreamListing(self._open)
                    else:
                        self._rows = rows
        rows = self._rows
        if rows is not None:
            return rows[start:start + SNAPSHOT_BATCH]
        stream = self.stream
        return [] if stream is None else await stream.rows_after(start)

    async def aclose(self) -> None:
        self._rows = None
        if self.stream is not None:
            await self.stream.aclose()


class DirNode(Node):
    __slots__ = ()

    type = NodeType.DIR

    @abstractmethod
    def open_listing(self) -> DirListing:
        """A listing of this directory, for one opendir .. releasedir."""

    @abstractmethod
    async def lookup(self, name: str) -> Node:
        """The child called ``name``; raises NotFound."""


class FileHandle(ABC):
    """An open file: byte ranges of one file's content.

    ``direct_io`` is True when the file's ``st_size`` is not its real length,
    so the kernel must pass every read through. ``keep_cache`` is True when
    the content cannot change while mounted, so the kernel may keep its pages.
    """

    direct_io: bool = False
    keep_cache: bool = False

    @abstractmethod
    async def read(self, offset: int, size: int) -> bytes | memoryview:
        """Up to ``size`` bytes at ``offset``; fewer only at end of file.

        A memoryview lets a handle give out its own buffer without a copy;
        the FUSE layer reads it before the next await.
        """

    def close(self) -> None:  # noqa: B027 - most handles hold nothing to give back
        """The file is released: give back what the handle holds. No read follows."""


class FileNode(Node):
    __slots__ = ()

    type = NodeType.FILE

    @abstractmethod
    async def open(self) -> FileHandle:
        """A handle to read the file; may raise MountError."""


class SymlinkNode(Node):
    __slots__ = ()

    type = NodeType.SYMLINK

    @abstractmethod
    async def target(self) -> str:
        """The link text."""


class BytesHandle(FileHandle):
    """A handle over content that is computed once, on first read."""

    def __init__(self, load: Callable[[], Awaitable[bytes]], *, direct_io: bool = False,
                 keep_cache: bool = False) -> None:
        self._load = load
        self.direct_io = direct_io
        self.keep_cache = keep_cache
        self._data: bytes | None = None
        self._lock = trio.Lock()

    async def data(self) -> bytes:
        if self._data is None:
            async with self._lock:
                if self._data is None:
                    self._data = await self._load()
        return self._data

    async def read(self, offset: int, size: int) -> memoryview:
        data = await self.data()
        return memoryview(data)[offset:offset + size]  # no copy: a chunk file is megabytes
