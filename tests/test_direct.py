"""Reads around the page cache (``mountd.io.direct``): any buffer, any length, the
end of the file, and a file system that refuses ``O_DIRECT``."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

import pytest

from mountd.io import direct
from mountd.io.direct import ALIGN, SCRATCH, aligned, open_direct, read_into


def _file(tmp_path: Path, n: int) -> tuple[Path, bytes]:
    data = bytes((i * 7 + i // 251) % 256 for i in range(n))
    path = tmp_path / "f"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("offset", [0, ALIGN, 3 * ALIGN])
@pytest.mark.parametrize("length", [1, ALIGN - 1, ALIGN, 5 * ALIGN + 17, SCRATCH + ALIGN + 3])
def test_any_buffer_gets_the_bytes_at_an_aligned_offset(tmp_path: Path, offset: int,
                                                        length: int) -> None:
    path, data = _file(tmp_path, offset + length + 2 * ALIGN)
    want = data[offset:offset + length]
    page = memoryview(mmap.mmap(-1, aligned(length) + ALIGN))
    fd = open_direct(path)
    try:
        for dest in (page[:length],                # page-aligned: read in place
                     page[1:1 + length],           # unaligned address: through scratch
                     bytearray(length)):
            assert read_into(fd, dest, offset) == length
            assert bytes(dest) == want
    finally:
        os.close(fd)


def test_a_read_past_the_end_stops_at_the_end(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 2 * ALIGN + 100)
    dest = memoryview(mmap.mmap(-1, 4 * ALIGN))
    fd = open_direct(path)
    try:
        assert read_into(fd, dest, 0) == len(data)
        assert bytes(dest[:len(data)]) == data
        assert read_into(fd, bytearray(10), 4 * ALIGN) == 0
    finally:
        os.close(fd)


def test_a_file_system_without_o_direct_gets_an_ordinary_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, data = _file(tmp_path, 3 * ALIGN + 5)
    real_open = os.open
    flags_seen: list[int] = []

    def refusing(p: object, flags: int, *args: object) -> int:
        flags_seen.append(flags)
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "O_DIRECT not supported")
        return real_open(p, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(direct.os, "open", refusing)
    fd = open_direct(path)
    try:
        dest = bytearray(len(data))
        assert read_into(fd, dest, 0) == len(data) and bytes(dest) == data
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)
    assert [bool(f & os.O_DIRECT) for f in flags_seen] == [True, False]


def test_other_errors_are_not_hidden(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_direct(tmp_path / "missing")


def test_a_read_refused_with_o_direct_is_made_again_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some file systems take ``O_DIRECT`` at ``open`` and refuse the read."""
    path, data = _file(tmp_path, 2 * ALIGN + 9)
    real_preadv = os.preadv
    direct_reads: list[bool] = []

    def refusing(fd: int, buffers: list[memoryview], offset: int) -> int:
        is_direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        direct_reads.append(is_direct)
        if is_direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(direct.os, "preadv", refusing)
    fd = open_direct(path)
    try:
        if not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            pytest.skip("this file system refuses O_DIRECT at open already")
        dest = memoryview(mmap.mmap(-1, aligned(len(data))))[:len(data)]
        assert read_into(fd, dest, 0) == len(data) and bytes(dest) == data
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    finally:
        os.close(fd)
    assert direct_reads[0] and not any(direct_reads[1:])
