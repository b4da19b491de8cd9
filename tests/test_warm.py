"""``h5mount warm``: reading a real mount of the session bucket to fill its caches.

The command runs as a user runs it (``python -m mountd.cli warm ...``) against
the module's real FUSE mount, and against a mount of a copy of the bucket
with one damaged chunk (as in ``tests/test_corruption.py``).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mounting import H5MOUNT, REPO, fuse_available, mounted, run_h5mount
from tests.test_corruption import obj_dir

pytestmark = [pytest.mark.mount, pytest.mark.hsds,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

SUMMARY = re.compile(r"h5mount warm: (\d+) files, (\d+) bytes .* (\d+) failed$")
FILTERS = "home/admin/filters.h5"


def summary(stderr: str) -> tuple[int, int, int]:
    """(files, bytes, failed) from the summary line, which is the last line."""
    match = SUMMARY.match(stderr.strip().splitlines()[-1])
    assert match, stderr
    files, nbytes, failed = match.groups()
    return int(files), int(nbytes), int(failed)


def expected_reads(top: Path, skip: Path | None = None,
                   views: tuple[str, ...] = (".npy", ".h5")) -> tuple[int, int]:
    """(files, bytes) warm should read below ``top``: regular files that are not
    views (``.npy``, ``D.h5``) nor ``skip``, reached without following symlinks."""
    files = nbytes = 0
    for here, _, names in os.walk(top):  # does not descend into symlinks
        for name in names:
            path = Path(here) / name
            if name.endswith(views) or path.is_symlink() or path == skip:
                continue
            files += 1
            nbytes += path.stat().st_size
    return files, nbytes


def test_warm_reads_every_file_but_views(mnt: Path) -> None:
    proc = run_h5mount("warm", "-j", "4", str(mnt / "home/admin"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("\n") == 1  # no bar without a terminal: one summary line
    files, nbytes, failed = summary(proc.stderr)
    want_files, want_bytes = expected_reads(mnt / "home/admin")
    assert (files, nbytes, failed) == (want_files, want_bytes, 0)
    vlen = [p for p in (mnt / "home/admin/types.h5").rglob("[0-9]*")
            if p.is_file() and not p.is_symlink()
            and json.loads((p.parent / ".zarray").read_text()).get("filters")]
    assert vlen, "no variable-length chunk file seen"
    # their sizes are exact (docs/CONTRACT.md, "File attributes"), so warm's byte count
    # is theirs too
    assert all(os.lstat(p).st_size == len(p.read_bytes()) > 0 for p in vlen)


def test_warm_reads_a_named_npy(mnt: Path) -> None:
    npy = mnt / f"{FILTERS}/gzip.npy"
    proc = run_h5mount("warm", "--quiet", str(npy))
    assert proc.returncode == 0, proc.stderr
    assert summary(proc.stderr) == (1, npy.stat().st_size, 0)


def test_warm_reads_domain_files_named_or_asked_for(mnt: Path) -> None:
    """A domain's ``D.h5`` holds its elements: a walk skips it unless named or
    ``--h5`` is given."""
    view = mnt / f"{FILTERS}.h5"
    proc = run_h5mount("warm", "--quiet", str(view))
    assert proc.returncode == 0, proc.stderr
    assert summary(proc.stderr) == (1, view.stat().st_size, 0)
    folder = mnt / "home/admin"
    proc = run_h5mount("warm", "--quiet", "--h5", str(folder), timeout=300)
    assert proc.returncode == 0, proc.stderr
    want = expected_reads(folder, views=(".npy",))
    assert summary(proc.stderr) == (*want, 0)
    assert want[0] > expected_reads(folder)[0]


def test_warm_shows_a_progress_bar_on_a_terminal(mnt: Path) -> None:
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    out: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:
                return
            if not chunk:
                return
            out.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.run([*H5MOUNT, "warm", str(mnt / FILTERS)], stderr=secondary,
                          stdout=subprocess.DEVNULL, cwd=REPO, timeout=120, check=False)
    os.close(secondary)
    reader.join(10)
    os.close(primary)
    text = b"".join(out).decode(errors="replace")
    assert proc.returncode == 0, text
    assert "100%" in text and "h5mount warm:" in text


@pytest.mark.parametrize("where", ["/tmp", "/nonexistent/path"])
def test_warm_refuses_paths_outside_a_mount(where: str, mnt: Path) -> None:
    proc = run_h5mount("warm", str(mnt / FILTERS), where)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and where in proc.stderr, proc.stderr


def test_warm_help() -> None:
    proc = run_h5mount("warm", "--help")
    assert proc.returncode == 0
    assert "--jobs" in proc.stdout and ".npy" in proc.stdout
    assert "warm" in run_h5mount("--help").stdout


@pytest.fixture(scope="module")
def damaged_mnt(mnt: Path, hsds_bucket, tmp_path_factory) -> Iterator[tuple[Path, Path]]:
    """A mount of a copy of the bucket whose ``gzip_shuffle`` chunk 0_0 is truncated."""
    base = tmp_path_factory.mktemp("warm-damaged")
    obj_id = json.loads((mnt / f"{FILTERS}/gzip_shuffle.json").read_text())["id"]
    shutil.copytree(hsds_bucket.bucket_dir, base / "bucket")
    chunk = obj_dir(base / "bucket", obj_id) / "0_0"
    chunk.write_bytes(chunk.read_bytes()[:7])
    with mounted(base / "bucket", base / "mp") as mp:
        yield mp, mp / f"{FILTERS}/gzip_shuffle/0.0"


def test_warm_reports_an_unreadable_file_once(damaged_mnt: tuple[Path, Path]) -> None:
    mp, broken = damaged_mnt
    proc = run_h5mount("warm", str(mp / FILTERS))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count(str(broken)) == 1, proc.stderr
    assert f"{broken}: Input/output error" in proc.stderr
    files, nbytes, failed = summary(proc.stderr)
    want_files, want_bytes = expected_reads(mp / FILTERS, skip=broken)
    assert (files, nbytes, failed) == (want_files, want_bytes, 1)
