"""pyfuse3 operations over the tree: the only place errors become errno.

Owns the inode table, the open file and directory handles, and the control
directory (``mountd.control``), made with the operations by a maker the
daemon gives them (it shows their counters). Each handler
looks up a node, awaits it, and maps the outcome to pyfuse3 types: NotFound
becomes ENOENT, Forbidden EACCES, StorageError (logged once per key) EIO,
and anything unexpected EIO with a traceback in the log. Every modifying
call answers EROFS.

Every request is counted by kind in ``Operations.requests`` (one dict
increment), its time in ``latency`` (reads, and the rest as metadata) and
its error reply by errno in ``errors``; the daemon reports them
(``.h5mount/stats.json``, ``-o stats_file``). On shutdown the
daemon calls ``drain``: requests that arrive from then on fail with EIO, and
it waits (bounded) for the ones under way to finish.

Concurrency: pyfuse3 runs handlers as concurrent trio tasks. The inode table
and handle maps are changed only between awaits, so each change is atomic;
nodes and handles are safe to share (see ``mountd.tree.nodes``). ``Operations``
is made inside the trio run that serves the mount (it keeps that run's clock).
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import stat as stat_mod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import pyfuse3
import trio

from mountd.acls import AclPolicy
from mountd.control import CONTROL_DIR
from mountd.errors import (
    Forbidden,
    MountError,
    NotFound,
    StorageError,
    report_once,
    report_unexpected,
)
from mountd.inodes import ROOT_INODE, InodeTable
from mountd.io.meter import Latencies
from mountd.tree.names import from_bytes, to_bytes
from mountd.tree.nodes import (
    DirListing,
    DirNode,
    FileHandle,
    FileNode,
    Node,
    NodeType,
    Stat,
    SymlinkNode,
    listed_stat,
)

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

DIR_MODE = stat_mod.S_IFDIR | 0o555
FILE_MODE = stat_mod.S_IFREG | 0o444
SYMLINK_MODE = stat_mod.S_IFLNK | 0o777
#: ``st_blksize`` of files: the I/O size readers such as ``cp`` then use.
BLOCK_SIZE = 1 << 20
#: ``st_blksize`` of directories and symlinks. glibc's ``opendir`` sizes its
#: buffer, and so each ``getdents64`` and the kernel's buffer for each FUSE
#: readdir, by the directory's ``st_blksize`` (at least 32 KiB, at most
#: 1 MiB). With 1 MiB every readdir of a three-entry directory had the kernel
#: allocate and map 256 pages, and pyfuse3 clear a 1 MiB reply buffer.
DIR_BLOCK_SIZE = 4096
#: Seconds between two looks at the requests under way while draining.
DRAIN_POLL = 0.01
#: Seconds with no request that end a drain (a reader has seen its EIO by then).
DRAIN_QUIET = 0.2
#: The name of the control directory (``mountd.control``) at the root.
CONTROL_NAME = CONTROL_DIR.encode()
#: The only xattr namespace a mount has; every other is unsupported.
XATTR_NAMESPACE = b"user."


@dataclass(frozen=True, slots=True)
class Owner:
    uid: int
    gid: int


def errno_of(exc: BaseException, where: str = "a request") -> int:
    """The errno a failure is reported as (the one mapping of errors to errno);
    ``where`` names the request for the log when ``exc`` is a bug."""
    if isinstance(exc, NotFound):
        return errno.ENOENT
    if isinstance(exc, Forbidden):
        return errno.EACCES
    if isinstance(exc, StorageError):
        report_once(exc)
        return errno.EIO
    if isinstance(exc, MountError):
        log.error("%s", exc)
        return errno.EIO
    report_unexpected(where, exc)
    return errno.EIO


def handler(fn: Callable[Concatenate[Operations, P], Awaitable[R]]
            ) -> Callable[Concatenate[Operations, P], Awaitable[R]]:
    """Count the request, and turn any exception the handler raises into the
    FUSEError for its errno."""
    name = fn.__name__

    latency_kind = "read" if name == "read" else "metadata"

    @functools.wraps(fn)
    async def wrapped(self: Operations, *args: P.args, **kwargs: P.kwargs) -> R:
        self.requests[name] += 1
        now = self.clock
        start = self.last_request = now()
        if self.draining:
            self.errors["EIO"] += 1
            raise pyfuse3.FUSEError(errno.EIO)
        self.in_flight += 1
        try:
            return await fn(self, *args, **kwargs)
        except pyfuse3.FUSEError as exc:
            self.errors[errno.errorcode.get(exc.errno, str(exc.errno))] += 1
            raise
        except Exception as exc:
            where = f"{name} {args[0]!r}" if args else name
            code = errno_of(exc, where)
            self.errors[errno.errorcode[code]] += 1
            self.failures[type(exc).__name__] += 1
            raise pyfuse3.FUSEError(code) from None
        finally:
            self.in_flight -= 1
            self.latency[latency_kind].add(now() - start)

    return wrapped


def _erofs() -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(errno.EROFS)


class Operations(pyfuse3.Operations):
    """The FUSE request handlers for one mount."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, root: DirNode, owner: Owner, ttl: float,
                 acls: AclPolicy | None = None,
                 control: Callable[[Operations], DirNode] | None = None) -> None:
        super().__init__()
        self.inodes = InodeTable(root)
        self.owner = owner
        self.ttl = ttl
        #: ``-o hsds_acls``: who may read each domain, decided per request.
        self.acls = acls
        #: Requests served, by handler name (``lookup``, ``getxattr``...).
        self.requests: collections.Counter[str] = collections.Counter()
        #: Error replies by errno name (``ENOENT``...), and the failures behind
        #: the ones a handler did not raise itself, by exception class. Both
        #: have few keys: errno names, and the error classes of this code.
        self.errors: collections.Counter[str] = collections.Counter()
        self.failures: collections.Counter[str] = collections.Counter()
        #: How long requests took: ``read``, and every other kind as ``metadata``.
        self.latency = {"read": Latencies(), "metadata": Latencies()}
        self._files: dict[int, FileHandle] = {}
        self._dirs: dict[int, DirListing] = {}
        #: The uid that opened each directory (readdir requests carry none).
        self._dir_uids: dict[int, int] = {}
        #: Open listings of the root, where a stored entry named like the
        #: control directory is hidden by it.
        self._root_dirs: set[int] = set()
        self._next_fh = 1
        #: Requests being handled now, and when the last one arrived (trio's clock).
        self.in_flight = 0
        self.last_request = 0.0
        #: The time of the trio run serving the mount (``trio.current_time``, as
        #: one call: it is read twice per request).
        self.clock = trio.lowlevel.current_clock().current_time
        #: Set by ``drain``: new requests fail with EIO.
        self.draining = False
        #: The control directory, found by name at the root and in no listing:
        #: made by ``control`` over these operations, once they are complete.
        self.control = None if control is None else control(self)

    @property
    def open_files(self) -> int:
        """Files open now."""
        return len(self._files)

    @property
    def open_dirs(self) -> int:
        """Directories open now."""
        return len(self._dirs)

    async def drain(self, grace: float) -> None:
        """Fail new requests with EIO, and wait at most ``grace`` seconds for the
        ones under way to finish and the requests to go quiet for ``DRAIN_QUIET``
        seconds, so that a read(2) the kernel split into several requests ends
        whole or with EIO, not with the unmount's ENOTCONN."""
        self.draining = True
        with trio.move_on_after(grace):
            while self.in_flight or self.clock() - self.last_request < DRAIN_QUIET:
                await trio.sleep(DRAIN_POLL)

    # -- helpers --------------------------------------------------------

    def _node(self, ino: int) -> Node:
        node = self.inodes.node(ino)
        if node is None:
            raise NotFound(f"inode {ino}")
        return node

    async def _denied(self, node: Node, uid: int) -> bool | None:
        """None when no ACL applies to ``node``; else whether ``uid`` is refused."""
        if self.acls is None:
            return None
        info = await node.domain_info()
        if info is None:
            return None
        return not self.acls.may_read(info, uid)

    async def _check(self, node: Node, ctx: pyfuse3.RequestContext) -> None:
        """EACCES if the caller may not read the domain ``node`` is in."""
        if self.acls is not None and await self._denied(node, ctx.uid):
            raise pyfuse3.FUSEError(errno.EACCES)

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def _entry(self, ino: int, st: Stat, denied: bool | None = None) -> pyfuse3.EntryAttributes:
        """Attributes of a node; ``denied`` is None when no ACL applies, else
        whether the caller is refused (mode 0) and the attributes are per
        user, so the kernel may not keep them for the next caller."""
        entry = self._blank_entry()
        self._fill_entry(entry, ino, st, denied)
        return entry

    def _blank_entry(self) -> pyfuse3.EntryAttributes:
        """Attributes with the fields every node shares set; ``_fill_entry``
        sets the others."""
        entry = pyfuse3.EntryAttributes()
        entry.generation = 0
        entry.entry_timeout = self.ttl
        entry.st_nlink = 1
        entry.st_uid = self.owner.uid
        entry.st_gid = self.owner.gid
        entry.st_rdev = 0
        return entry

    def _fill_entry(self, entry: pyfuse3.EntryAttributes, ino: int, st: Stat,
                    denied: bool | None) -> None:
        """Set the fields of ``entry`` that are the node's own (see ``_entry``)."""
        entry.st_ino = ino
        # A stand-in size must not be kept: the next stat asks for the real one.
        entry.attr_timeout = self.ttl if st.exact and not st.volatile and denied is None else 0
        # Compared by identity: hashing an Enum member runs Python code, and
        # this runs for every entry of every listing.
        kind = st.type
        mode = (FILE_MODE if kind is NodeType.FILE else DIR_MODE if kind is NodeType.DIR
                else SYMLINK_MODE)
        entry.st_mode = mode & ~0o7777 if denied else mode
        entry.st_blksize = BLOCK_SIZE if kind is NodeType.FILE else DIR_BLOCK_SIZE
        entry.st_size = st.size
        entry.st_blocks = (st.size + 511) // 512
        mtime = int(st.mtime * 1e9)
        entry.st_atime_ns = mtime
        entry.st_mtime_ns = mtime
        entry.st_ctime_ns = int(st.ctime * 1e9)

    # -- lookups and attributes -----------------------------------------

    @handler
    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        node: Node
        if parent_inode == ROOT_INODE and name == CONTROL_NAME and self.control is not None:
            node = self.control
        else:
            parent = self._node(parent_inode)
            if not isinstance(parent, DirNode):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            await self._check(parent, ctx)
            node = await parent.lookup(from_bytes(name))
        st = await node.stat()
        ino = self.inodes.inode_of(node)
        self.inodes.remember(ino)
        return self._entry(ino, st, None if self.acls is None
                           else await self._denied(node, ctx.uid))

    @handler
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        return self._entry(inode, await node.stat(), None if self.acls is None
                           else await self._denied(node, ctx.uid))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        self.requests["forget"] += 1
        for ino, count in inode_list:
            self.inodes.forget(ino, count)

    @handler
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        node = self._node(inode)
        if not isinstance(node, SymlinkNode):
            raise pyfuse3.FUSEError(errno.EINVAL)
        await self._check(node, ctx)
        return to_bytes(await node.target())

    @handler
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if not name.startswith(XATTR_NAMESPACE):
            # ENOTSUP, not ENODATA: ls, cp, tar and rsync stop asking a device
            # for a namespace (security.selinux, system.posix_acl_*) once it
            # answers ENOTSUP, and ask again for every file while it does not.
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        node = self._node(inode)
        await self._check(node, ctx)
        attrs = await node.xattrs()
        value = attrs.get(from_bytes(name))
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @handler
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        node = self._node(inode)
        await self._check(node, ctx)
        return [to_bytes(name) for name in await node.xattrs()]

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        self.requests["statfs"] += 1
        data = pyfuse3.StatvfsData()
        data.f_bsize = BLOCK_SIZE
        data.f_frsize = BLOCK_SIZE
        data.f_blocks = data.f_bfree = data.f_bavail = 0
        data.f_files = len(self.inodes)
        data.f_ffree = data.f_favail = 0
        data.f_namemax = 255
        return data

    # -- directories ----------------------------------------------------

    @handler
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._node(inode)
        if not isinstance(node, DirNode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        await self._check(node, ctx)
        fh = self._new_fh()
        self._dirs[fh] = node.open_listing()
        self._dir_uids[fh] = ctx.uid
        if inode == ROOT_INODE and self.control is not None:
            self._root_dirs.add(fh)
        return fh

    @handler
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        listing = self._dirs[fh]
        uid = self._dir_uids.get(fh, 0)
        hidden = CONTROL_DIR if fh in self._root_dirs else None
        inodes = self.inodes
        acls = self.acls
        reply = pyfuse3.readdir_reply
        # One attributes object for the whole reply (made with the first entry:
        # the kernel's last readdir of a directory gets none): readdir_reply
        # copies it at once, so each entry sets only the node's own fields,
        # and entries sharing one Stat (a dataset's chunk files) only the inode.
        entry: pyfuse3.EntryAttributes | None = None
        last_stat: Stat | None = None
        # Lookups counted for this reply: if the listing fails part way, pyfuse3
        # sends the error alone, the kernel never sees these entries and will
        # never forget them, so the counts are taken back.
        added: list[int] = []
        cookie = start_id
        try:
            while rows := await listing.rows_after(cookie):
                for name, node, known in rows:
                    cookie += 1
                    if name == hidden:
                        continue
                    st = known if known is not None else await listed_stat(node)
                    ino = inodes.inode_of(node)
                    if entry is None:
                        entry = self._blank_entry()
                    if acls is not None:  # attributes per user
                        self._fill_entry(entry, ino, st, await self._denied(node, uid))
                    elif st is last_stat:
                        entry.st_ino = ino
                    else:
                        self._fill_entry(entry, ino, st, None)
                        last_stat = st
                    if not reply(token, to_bytes(name), entry, cookie):
                        inodes.drop_if_unused(ino)
                        return
                    inodes.remember(ino)
                    added.append(ino)
        except BaseException:
            for ino in added:
                inodes.forget(ino, 1)
            raise

    async def releasedir(self, fh: int) -> None:
        self.requests["releasedir"] += 1
        listing = self._dirs.pop(fh, None)
        self._dir_uids.pop(fh, None)
        self._root_dirs.discard(fh)
        if listing is not None:
            await listing.aclose()

    # -- files ----------------------------------------------------------

    @handler
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise _erofs()
        node = self._node(inode)
        if not isinstance(node, FileNode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        await self._check(node, ctx)
        handle = await node.open()
        fh = self._new_fh()
        self._files[fh] = handle
        return pyfuse3.FileInfo(fh=fh, direct_io=handle.direct_io, keep_cache=handle.keep_cache)

    @handler
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        return await self._files[fh].read(off, size)

    async def release(self, fh: int) -> None:
        self.requests["release"] += 1
        handle = self._files.pop(fh, None)
        if handle is not None:
            handle.close()

    # -- everything that would modify: read-only ------------------------

    @handler
    async def setattr(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    @handler
    async def setxattr(self, *args: Any) -> None:
        raise _erofs()

    @handler
    async def removexattr(self, *args: Any) -> None:
        raise _erofs()

    @handler
    async def write(self, *args: Any) -> int:
        raise _erofs()

    @handler
    async def create(self, *args: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise _erofs()

    @handler
    async def mknod(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    @handler
    async def mkdir(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    @handler
    async def unlink(self, *args: Any) -> None:
        raise _erofs()

    @handler
    async def rmdir(self, *args: Any) -> None:
        raise _erofs()

    @handler
    async def symlink(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    @handler
    async def rename(self, *args: Any) -> None:
        raise _erofs()

    @handler
    async def link(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()


__all__ = ["ROOT_INODE", "Operations", "Owner", "errno_of"]
