"""Opening a path beneath a directory without following any symbolic link on the way.

Owns ``open_beneath``: the file descriptor of ``rel`` (a relative path with
no ``..``) below an open directory, refused with ``SymlinkFound`` when any
component of ``rel``, the last included, is a symbolic link. The directory
itself may have been reached through symlinks; only what lies beneath it is
constrained. ``mountd.io.local`` reads a bucket this way, so a symlink a
bucket holds never leads to a file outside it.

Linux 5.6 and later do it in one call: ``openat2`` with ``RESOLVE_BENEATH``
and ``RESOLVE_NO_SYMLINKS`` (Python has no wrapper; it is called through
``ctypes``). Where it is missing (ENOSYS, or EPERM from a seccomp filter that
does not know it), the first such answer switches this process to
``walk_beneath`` for good: one ``openat`` per component, each relative to the
last and with ``O_NOFOLLOW``. An ``openat2`` that meets a symlink is retried
as the walk, which names it (a component refused with ``ELOOP`` or
``ENOTDIR`` is looked at with ``lstat``); so only a refused path costs more
than one call with ``openat2``.

Concurrency: plain blocking calls, for worker threads; the one shared state,
whether ``openat2`` works, is a flag that only ever goes from true to false.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

#: ``openat2``'s number: new system calls share one number on every architecture.
SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
#: How an intermediate component is opened by ``walk_beneath``: it must be a directory.
_STEP = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SymlinkFound(Exception):
    """``where`` (a path relative to the directory opened beneath) is a symbolic link."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where}: a symbolic link")
        self.where = where


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
#: Cleared at the first sign that this kernel (or its seccomp filter) has no ``openat2``.
_openat2_works = True


def open_beneath(dir_fd: int, rel: str, flags: int) -> int:
    """A new descriptor (``O_CLOEXEC`` added to ``flags``) of ``rel`` below ``dir_fd``.

    ``rel`` is ``.`` or names separated by ``/``, none of them ``..``. Raises
    ``SymlinkFound`` naming the first symbolic link on the way (``rel``
    itself when it is the link), else what ``open`` raises."""
    global _openat2_works  # noqa: PLW0603 (the one switch, see the module docstring)
    if _openat2_works:
        try:
            return openat2_beneath(dir_fd, rel, flags)
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM):
                _openat2_works = False
            elif exc.errno != errno.ELOOP:
                raise
    # No openat2, or it met a symlink: the walk opens the path or names the link.
    return walk_beneath(dir_fd, rel, flags)


def openat2_beneath(dir_fd: int, rel: str, flags: int) -> int:
    """``openat2(dir_fd, rel, flags | O_CLOEXEC)`` resolving beneath ``dir_fd`` with
    no symlinks; a symlink anywhere raises ``OSError`` ELOOP, a missing
    ``openat2`` ENOSYS."""
    how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE)
    fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd),
                       ctypes.c_char_p(os.fsencode(rel)), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), rel)
    return int(fd)


def walk_beneath(dir_fd: int, rel: str, flags: int) -> int:
    """``open_beneath`` without ``openat2``: each component opened relative to the
    one before with ``O_NOFOLLOW``, so a symlink is never followed."""
    parts = rel.split("/")
    here = dir_fd
    try:
        for depth, name in enumerate(parts):
            last = depth == len(parts) - 1
            try:
                fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC if last else _STEP,
                             dir_fd=here)
            except OSError as exc:
                # O_NOFOLLOW refuses a symlink with ELOOP, or ENOTDIR along with O_DIRECTORY.
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(here, name):
                    raise SymlinkFound("/".join(parts[:depth + 1])) from None
                raise
            if here != dir_fd:
                os.close(here)
            here = fd
            # O_PATH with O_NOFOLLOW opens a final symlink itself rather than refusing it.
            if last and flags & os.O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):
                raise SymlinkFound(rel)
        return here
    except BaseException:
        if here != dir_fd:
            os.close(here)
        raise


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
