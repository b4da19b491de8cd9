"""The control directory ``MOUNTPOINT/.h5mount/``: the daemon's figures as files.

Owns the nodes of that directory. It is found by name at the mount root
only (``Operations.lookup``) and is in no listing, so ``ls -a``, ``find``
and ``du`` of the mount never see it. It holds read-only files whose
content is made by the daemon when they are read (``mountd.stats``):
``stats.json``, ``config.json`` and ``metrics``. The name is reserved: a
root entry of the same name in storage is hidden by it.

Each file's ``st_size`` is the exact length of the content a read gets: a
document is rendered at most once per ``REUSE`` seconds, and every ``stat``
and ``open`` within that time gets the same bytes, so ``cat``, ``cp`` and
``rsync`` (which stat, open, stat again and read) see one consistent
document. The kernel keeps neither the attributes nor the pages
(``Stat.volatile`` and ``direct_io``), so a read a moment later shows fresh
figures.

Concurrency: rendering is synchronous (no ``await``), so a document is one
snapshot of the trio thread's counters; the kept renderings are replaced
whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence

from mountd.errors import NotFound
from mountd.tree.nodes import (
    BytesHandle,
    DirListing,
    DirNode,
    FileHandle,
    FileNode,
    Row,
    SnapshotListing,
    Stat,
)

#: The control directory's name at the mount root.
CONTROL_DIR = ".h5mount"
#: Seconds a rendering made for a ``stat`` is served to the ``open`` that follows.
REUSE = 1.0


class Control:
    """The control files' renderers, and the latest rendering of each."""

    def __init__(self, renderers: Mapping[str, Callable[[], bytes]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._renderers = dict(renderers)
        self._clock = clock
        #: The latest rendering of each file: monotonic time, POSIX time, content.
        self._kept: dict[str, tuple[float, float, bytes]] = {}
        self.started = time.time()

    @property
    def names(self) -> Sequence[str]:
        return list(self._renderers)

    def render(self, name: str) -> tuple[float, bytes]:
        """When (POSIX time) the content of ``name`` was made, and the content:
        the one made within ``REUSE`` seconds, else a fresh one."""
        now = self._clock()
        kept = self._kept.get(name)
        if kept is None or now - kept[0] > REUSE:
            kept = (now, time.time(), self._renderers[name]())
            self._kept[name] = kept
        return kept[1], kept[2]


class ControlDir(DirNode):
    """``.h5mount/`` itself."""

    def __init__(self, control: Control) -> None:
        self.control = control

    @property
    def key(self) -> Hashable:
        return ("control",)

    async def stat(self) -> Stat:
        return Stat(self.type, mtime=self.control.started, ctime=self.control.started)

    def open_listing(self) -> DirListing:
        async def rows() -> list[Row]:
            return [Row(name, ControlFile(self.control, name)) for name in self.control.names]
        return SnapshotListing(rows)

    async def lookup(self, name: str) -> ControlFile:
        if name not in self.control.names:
            raise NotFound(f"{CONTROL_DIR}/{name}")
        return ControlFile(self.control, name)


class ControlFile(FileNode):
    """One control file: a document rendered when it is read."""

    def __init__(self, control: Control, name: str) -> None:
        self.control = control
        self.name = name

    @property
    def key(self) -> Hashable:
        return ("control", self.name)

    async def stat(self) -> Stat:
        made, data = self.control.render(self.name)
        return Stat(self.type, size=len(data), mtime=made, ctime=made, volatile=True)

    async def open(self) -> FileHandle:
        _, data = self.control.render(self.name)

        async def load() -> bytes:
            return data
        return BytesHandle(load, direct_io=True)
