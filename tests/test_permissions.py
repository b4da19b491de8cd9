"""Who may read a mount: another local user cannot without ``allow_other``
and can with it (the kernel checks modes: ``default_permissions`` is always
on), and ``-o uid=,gid=`` sets the owner shown. Run as root with a real second
user (``h5mount-other``, created if missing)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import scaledata
from tests.mounting import fuse_available, mounted, run_h5mount

OTHER = "h5mount-other"
FILE = "home/admin/layout.h5/edge_3d.json"

pytestmark = [
    pytest.mark.mount,
    pytest.mark.hsds,
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


# --------------------------------------------------------------------------- HSDS ACLs

ALL = {"create": True, "read": True, "update": True, "delete": True, "readACL": True,
       "updateACL": True}


def acl_bucket(root: Path) -> Path:
    """Domains and folders whose ``.domain.json`` ACLs differ by user: team/open.h5
    readable by h5mount-other, team/secret.h5 by admin only, the private folder
    by admin only, the rest by default."""
    bucket = root / "acls"
    writer = scaledata.BucketWriter(bucket)
    for domain in ("/home/team/open.h5", "/home/team/secret.h5", "/home/private/x.h5"):
        scaledata.write_wide(writer, domain, 2)
    acls = {
        "home": {"admin": ALL, "default": {"read": True}},
        "home/team": {"admin": ALL, "default": {"read": True}},
        "home/team/open.h5": {"admin": ALL, OTHER: {"read": True}},
        "home/team/secret.h5": {"admin": ALL},
        "home/private": {"admin": ALL},
        "home/private/x.h5": {"admin": ALL, "default": {"read": True}},
    }
    for key, acl in acls.items():
        path = bucket / key / ".domain.json"
        doc = json.loads(path.read_text())
        doc["acls"] = acl
        path.write_text(json.dumps(doc))
    return bucket


def test_hsds_acls_per_local_user(other_user: pwd.struct_passwd, open_dir: Path) -> None:
    bucket = acl_bucket(open_dir)
    acl_map = open_dir / "acl_map"
    acl_map.write_text("# local user  HSDS user\nroot admin\n")
    with mounted(bucket, open_dir / "mp", "-o", f"allow_other,acl_map={acl_map}") as mp:
        team = mp / "home/team"
        # root acts as admin: everything reads
        for path in (team / "secret.h5/d000000.json", mp / "home/private/x.h5/d000001.json",
                     team / "secret.h5.json"):
            assert json.loads(path.read_text())["kind"] in ("dataset", "group")
        # the other user: their own entry, else default, else nothing
        assert as_other("cat", str(team / "open.h5/d000000.json")).returncode == 0
        for path in (team / "secret.h5/d000000.json", team / "secret.h5.json",
                     mp / "home/private/x.h5/d000000.json"):
            refused = as_other("cat", str(path))
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, path
        assert as_other("ls", str(team / "secret.h5")).returncode != 0
        shown = as_other("stat", "-c", "%a %n", str(team / "secret.h5"), str(team / "open.h5"),
                         str(mp / "home/private"))
        assert shown.stdout.split("\n")[:3] == [f"0 {team / 'secret.h5'}",
                                                f"555 {team / 'open.h5'}",
                                                f"0 {mp / 'home/private'}"], shown
        listed = as_other("ls", str(team))  # the folder itself is readable by default
        assert {"open.h5", "secret.h5"} <= set(listed.stdout.split())
        # the kernel keeps no user's view for another: root still reads
        assert (team / "secret.h5/d000001.json").read_text()


def test_hsds_acls_without_a_map_apply_to_root_too(open_dir: Path) -> None:
    """root maps to HSDS user "root", which no ACL names: secret.h5 has no
    default entry, so even root gets EACCES (the daemon checks every request,
    not only the kernel's mode check, which root bypasses)."""
    bucket = acl_bucket(open_dir)
    with mounted(bucket, open_dir / "mp", "-o", "hsds_acls") as mp:
        for path in ("home/team/secret.h5/d000000.json", "home/team/open.h5.json",
                     "home/private/x.h5/d000000.json"):  # the folder refuses the walk
            with pytest.raises(PermissionError):
                (mp / path).read_text()
        assert {"open.h5", "secret.h5"} <= set(os.listdir(mp / "home/team"))  # default read


def test_acl_map_errors_are_clear(open_dir: Path) -> None:
    bad = open_dir / "bad_map"
    bad.write_text("root\n")
    proc = run_h5mount(str(acl_bucket(open_dir)), str(open_dir), "-o", f"acl_map={bad}")
    assert proc.returncode == 1 and "expected LOCAL_USER HSDS_USER" in proc.stderr, proc.stderr
