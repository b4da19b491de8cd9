"""``h5mount warm PATH...``: read files of a mount so that its caches are full.

Owns the ``warm`` command: it checks that every PATH is inside an h5mount
mount (``fuse.h5mount`` in ``/proc/self/mountinfo``), walks the directories
without following symlinks (the tree has cycles through them), and reads
every regular file to its end with a pool of threads, discarding the bytes.
The daemon's chunk cache and block cache (and ``-o cache_dir``) then hold
what was read, for example before going offline. Files of one directory are
read in name order, chunk files in grid order, so the daemon's chunk
readahead sees a sequential reader.

Concurrency: one daemon thread walks and queues files (a bounded queue, so
a huge directory is never held whole); ``--jobs`` daemon threads read them.
The counters and the progress bar are changed under one lock. The main
thread only waits, so Ctrl-C is handled at once: it sets the stop flag and
leaves the threads behind (the process exits without waiting for a read
the mount is still answering).
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import stat
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from tqdm import tqdm

#: The file system type of h5mount mounts (``subtype=h5mount``).
FSTYPE = "fuse.h5mount"
DEFAULT_JOBS = 8
#: Bytes asked for per read call.
BLOCK = 1 << 20
#: Directory entries sorted together; a larger directory is sorted in runs of this many.
SORT_RUN = 65536

DESCRIPTION = """\
Read every file under each PATH of an h5mount mount and throw the bytes
away, so that the mount's caches (the chunk cache, the block cache and a
persistent -o cache_dir) hold them, for example before going offline.

Directories are walked without following symlinks. While walking, *.npy
files and the *.h5 files of domains (D.h5) are skipped: they are views over
the same chunks as the datasets' chunk files, so reading them too would
decode everything twice. A file named as a PATH is read whatever it is (or
use --npy and --h5 to read them all).
"""

EPILOG = """\
The progress bar (bytes, from the files' sizes) is shown on stderr when it
is a terminal; a summary line is printed at the end. Files that cannot be
read are reported once each.

exit status: 0 if every file was read; 1 if some could not be read (or on
Ctrl-C); 2 for usage errors, such as a PATH outside an h5mount mount.
"""


class UsageError(Exception):
    """A PATH that cannot be warmed (missing, or not in an h5mount mount)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="h5mount warm", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", metavar="PATH", nargs="+",
                        help="a file or directory inside an h5mount mount")
    parser.add_argument("-j", "--jobs", type=int, default=DEFAULT_JOBS, metavar="N",
                        help=f"files read at once (default: {DEFAULT_JOBS})")
    parser.add_argument("--npy", action="store_true",
                        help="also read the *.npy files found while walking")
    parser.add_argument("--h5", action="store_true",
                        help="also read the D.h5 files (the domains as HDF5 files) found "
                             "while walking")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return parser


# -- where the mounts are --------------------------------------------------


def _unescape(field_text: str) -> str:
    """A mountinfo path field: spaces and the like are written as ``\\ooo``."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)


def mounts(mountinfo: str = "/proc/self/mountinfo") -> dict[str, str]:
    """Mount point -> file system type, for every mount this process sees."""
    found: dict[str, str] = {}
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if "-" not in fields[5:]:
                continue
            sep = fields.index("-", 5)
            found[_unescape(fields[4])] = fields[sep + 1]
    return found


def check_inside_mount(path: str, table: dict[str, str]) -> None:
    """Raise UsageError unless ``path`` exists on an h5mount mount."""
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or directory")
    real = os.path.realpath(path)
    best = max((point for point in table
                if real == point or real.startswith(point.rstrip("/") + "/")),
               key=len, default=None)
    if best is None:
        raise UsageError(f"{path}: not inside an h5mount mount")
    if table[best] != FSTYPE:
        raise UsageError(f"{path}: not inside an h5mount mount ({best} is {table[best]})")


# -- walking -----------------------------------------------------------------


def _order(name: str) -> tuple[int, tuple[int, ...], str]:
    """Sort key: other names first, then chunk names (``3.1``) in grid order."""
    parts = name.split(".")
    if all(p.isdigit() for p in parts):
        return 1, tuple(int(p) for p in parts), name
    return 0, (), name


def _runs(entries: Iterator[os.DirEntry[str]]) -> Iterator[list[os.DirEntry[str]]]:
    """The entries of one directory in sorted runs of at most ``SORT_RUN``."""
    run: list[os.DirEntry[str]] = []
    for entry in entries:
        run.append(entry)
        if len(run) == SORT_RUN:
            yield sorted(run, key=lambda e: _order(e.name))
            run = []
    if run:
        yield sorted(run, key=lambda e: _order(e.name))


@dataclass(frozen=True, slots=True)
class Job:
    path: str
    size: int


def skipped(include_npy: bool, include_h5: bool) -> tuple[str, ...]:
    """The suffixes of the view files a walk skips (``--npy``, ``--h5``)."""
    return (*(() if include_npy else (".npy",)), *(() if include_h5 else (".h5",)))


def walk(top: str, skip: tuple[str, ...], failed: list[tuple[str, str]]) -> Iterator[Job]:
    """Regular files under directory ``top`` but those whose names end in one
    of ``skip``, depth first; symlinks are not followed. Directories that
    cannot be listed are added to ``failed``."""
    stack = [top]
    while stack:
        here = stack.pop()
        subdirs: list[str] = []
        try:
            with os.scandir(here) as it:
                for run in _runs(it):
                    for entry in run:
                        if entry.is_dir(follow_symlinks=False):
                            subdirs.append(entry.path)
                        elif entry.is_file(follow_symlinks=False) and (
                                not entry.name.endswith(skip)):
                            try:
                                size = entry.stat(follow_symlinks=False).st_size
                            except OSError as exc:
                                failed.append((entry.path, exc.strerror or str(exc)))
                                continue
                            yield Job(entry.path, size)
        except OSError as exc:
            failed.append((here, exc.strerror or str(exc)))
        stack.extend(reversed(subdirs))


def jobs_for(paths: Iterable[str], skip: tuple[str, ...],
             failed: list[tuple[str, str]]) -> Iterator[Job]:
    """The files to read for the PATH arguments (a file named is read whatever it is)."""
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as exc:
            failed.append((path, exc.strerror or str(exc)))
            continue
        if stat.S_ISDIR(st.st_mode):
            yield from walk(path, skip, failed)
        elif stat.S_ISREG(st.st_mode):
            yield Job(path, st.st_size)


# -- reading -----------------------------------------------------------------


@dataclass
class Progress:
    """Counters shared by the reader threads, and the bar they move."""

    bar: tqdm
    files: int = 0
    bytes: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def expect(self, size: int) -> None:
        """A file of ``size`` bytes (by ``st_size``) is to be read."""
        with self.lock:
            self.bar.total += size

    def advance(self, done: int, more_expected: int = 0) -> None:
        """``done`` bytes were read; the total changes by ``more_expected``."""
        with self.lock:
            self.bytes += done
            self.bar.total += more_expected
            self.bar.update(done)

    def fail(self, path: str, reason: str) -> None:
        with self.lock:
            self.failed.append((path, reason))
            self.bar.write(f"h5mount warm: {path}: {reason}", file=sys.stderr)


def read_file(job: Job, progress: Progress) -> None:
    """Read ``job.path`` to its end. The total follows the bytes really there:
    it grows as a file reads past its ``st_size`` (one that changed in storage
    since it was listed) and shrinks by what a short or failed file did not give."""
    buf = bytearray(BLOCK)
    done, counted = 0, job.size
    try:
        with open(job.path, "rb", buffering=0) as f:
            while not progress.stop.is_set():
                n = f.readinto(buf)
                if not n:
                    break
                done += n
                progress.advance(n, max(0, done - counted))
                counted = max(counted, done)
    except OSError as exc:
        progress.advance(0, done - counted)
        progress.fail(job.path, exc.strerror or str(exc))
        return
    progress.advance(0, done - counted)
    with progress.lock:
        progress.files += 1


def _reader(jobs: queue.Queue[Job | None], progress: Progress) -> None:
    while (job := jobs.get()) is not None:
        if not progress.stop.is_set():
            read_file(job, progress)


def _walker(paths: list[str], skip: tuple[str, ...], jobs: queue.Queue[Job | None],
            readers: int, progress: Progress) -> None:
    """Queue the files to read, then one end marker per reader."""
    failed: list[tuple[str, str]] = []
    for job in jobs_for(paths, skip, failed):
        while failed:
            progress.fail(*failed.pop(0))
        if progress.stop.is_set():
            return
        progress.expect(job.size)
        jobs.put(job)
    for path, reason in failed:
        progress.fail(path, reason)
    for _ in range(readers):
        jobs.put(None)


def warm(paths: list[str], jobs: int, skip: tuple[str, ...], bar: bool
         ) -> tuple[Progress, float]:
    """Read everything but the views whose names end in ``skip``; the
    counters and the seconds it took.

    The walk and the reads run in daemon threads; this thread only waits, so
    Ctrl-C (KeyboardInterrupt, raised again after stopping them) is prompt
    even while a thread waits on the mount.
    """
    progress = Progress(tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024,
                             file=sys.stderr, disable=not bar, dynamic_ncols=True))
    todo: queue.Queue[Job | None] = queue.Queue(maxsize=jobs * 16)
    threads = [threading.Thread(target=_reader, args=(todo, progress), daemon=True)
               for _ in range(jobs)]
    threads.append(threading.Thread(target=_walker, daemon=True,
                                    args=(paths, skip, todo, jobs, progress)))
    started = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.1)
    except KeyboardInterrupt:
        progress.stop.set()
        progress.bar.close()
        raise
    progress.bar.close()
    return progress, time.monotonic() - started


def summary(progress: Progress, seconds: float) -> str:
    mib = progress.bytes / (1 << 20)
    rate = mib / seconds if seconds > 0 else 0.0
    return (f"h5mount warm: {progress.files} files, {progress.bytes} bytes ({mib:.1f} MiB) "
            f"in {seconds:.1f} s, {rate:.1f} MiB/s, {len(progress.failed)} failed")


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        table = mounts()
        for path in args.paths:
            check_inside_mount(path, table)
    except (UsageError, OSError) as exc:
        print(f"h5mount warm: {exc}", file=sys.stderr)
        return 2
    show_bar = not args.quiet and sys.stderr.isatty()
    try:
        progress, seconds = warm(args.paths, args.jobs, skipped(args.npy, args.h5), show_bar)
    except KeyboardInterrupt:
        print("h5mount warm: interrupted", file=sys.stderr)
        return 1
    print(summary(progress, seconds), file=sys.stderr)
    return 1 if progress.failed else 0
