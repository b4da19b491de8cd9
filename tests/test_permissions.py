"""Who may read a mount: another local user cannot without ``allow_other``
and can with it (the kernel checks modes: ``default_permissions`` is always
on), and ``-o uid=,gid=`` sets the owner shown. Run as root with a real second
user (``h5mount-other``, created if missing)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mounting import fuse_available, mounted

OTHER = "h5mount-other"
FILE = "home/admin/layout.h5/edge_3d.json"

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available())),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None
                       or shutil.which("useradd") is None,
                       reason="needs root, runuser and useradd for a second user"),
]


@pytest.fixture(scope="module")
def other_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(OTHER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", OTHER],
                       check=True, capture_output=True)
        return pwd.getpwnam(OTHER)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may traverse (pytest's own tmp dir is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="h5mount-perm-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_other(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", OTHER, "--", *argv], capture_output=True,
                          text=True, timeout=60, check=False)


def test_other_users_need_allow_other(hsds_bucket, other_user: pwd.struct_passwd,
                                      open_dir: Path) -> None:
    with mounted(hsds_bucket.bucket_dir, open_dir / "private") as mp:
        assert (mp / FILE).read_bytes()  # the mounting user reads
        denied = as_other("cat", str(mp / FILE))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
        assert as_other("ls", str(mp)).returncode != 0
    with mounted(hsds_bucket.bucket_dir, open_dir / "shared", "-o", "allow_other") as mp:
        expected = (mp / FILE).read_text()
        shown = as_other("cat", str(mp / FILE))
        assert shown.returncode == 0 and shown.stdout == expected, shown.stderr
        listed = as_other("ls", str(mp / "home/admin"))
        assert "layout.h5" in listed.stdout.split()
        # read-only for everyone, whatever the modes say
        written = as_other("touch", str(mp / "home/admin/new"))
        assert written.returncode != 0


def test_owner_is_the_mounting_user_or_uid_gid(hsds_bucket, other_user: pwd.struct_passwd,
                                               open_dir: Path) -> None:
    with mounted(hsds_bucket.bucket_dir, open_dir / "mine") as mp:
        st = os.stat(mp / FILE)
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    uid, gid = other_user.pw_uid, other_user.pw_gid
    with mounted(hsds_bucket.bucket_dir, open_dir / "theirs", "-o",
                 f"allow_other,uid={uid},gid={gid}") as mp:
        for path in (mp / FILE, mp / "home/admin/layout.h5", mp / "home/admin/layout.h5/edge_3d"):
            st = os.stat(path)
            assert (st.st_uid, st.st_gid) == (uid, gid), path
        assert as_other("cat", str(mp / FILE)).returncode == 0
