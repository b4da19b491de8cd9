"""Reading files around the page cache (``O_DIRECT``) into the caller's buffers.

Owns ``open_direct`` and ``read_into``, which the disk cache
(``mountd.io.diskcache``) reads its block files with. Those bytes go straight
into the memory cache's own buffers, so keeping them in the kernel's page
cache as well would hold every cached byte twice; and on a VM that hands
freed memory back to its host, each page of page cache filled again costs a
fault that the daemon's recycled buffers do not (``docs/benchmarks.md``,
"Warm reads from `cache_dir`").

``O_DIRECT`` wants the file offset, the length and the buffer's address
aligned to the device's logical block; ``ALIGN`` (one page) covers every
device Linux supports. ``read_into`` reads the aligned part of a buffer
directly and the rest (a tail, or a whole buffer at an unaligned address)
through a page-aligned scratch buffer, so any buffer works. A file system
that refuses ``O_DIRECT`` gets an ordinary descriptor, read the same way;
one that takes it at ``open`` but refuses the read (``EINVAL``) has the flag
taken off the descriptor and the read made again.

Concurrency: no shared state but one scratch buffer per thread
(``threading.local``); every function may run in any worker thread.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import threading

from mountd.cache.bufpool import private_map

#: Alignment of offsets, lengths and addresses for ``O_DIRECT``.
ALIGN = mmap.PAGESIZE
#: The scratch buffer of each thread, for parts that are not aligned.
SCRATCH = 256 << 10

_local = threading.local()


def aligned(n: int) -> int:
    """``n`` rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


def open_direct(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path`` that bypasses the page cache where the file
    system allows, else an ordinary one. The caller closes it."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def _scratch() -> memoryview:
    buf = getattr(_local, "scratch", None)
    if buf is None:
        buf = _local.scratch = memoryview(private_map(SCRATCH))
    return buf


def _address(buf: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _pread(fd: int, buf: memoryview, offset: int) -> int:
    """``os.preadv`` of one buffer, made again without ``O_DIRECT`` if the file
    system refuses it for this read."""
    try:
        return os.preadv(fd, [buf], offset)
    except OSError as exc:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if exc.errno != errno.EINVAL or not flags & os.O_DIRECT:
            raise
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
    return os.preadv(fd, [buf], offset)


def read_into(fd: int, dest: bytearray | memoryview, offset: int) -> int:
    """Read up to ``len(dest)`` bytes at ``offset`` (a multiple of ``ALIGN``) into
    ``dest`` (writable); how many were read, fewer only at the end of the file."""
    view = memoryview(dest).cast("B")
    want = len(view)
    got = 0
    if want >= ALIGN and _address(view) % ALIGN == 0:
        whole = want - want % ALIGN
        got = _pread(fd, view[:whole], offset)
        if got < whole:
            return got
    scratch = _scratch()
    while got < want:
        piece = min(len(scratch), aligned(want - got))
        n = _pread(fd, scratch[:piece], offset + got)
        take = min(n, want - got)
        view[got:got + take] = scratch[:take]
        got += take
        if n < piece:
            break
    return got
