"""mount(8) and an fstab line starting h5mount through the real ``mount.fuse3`` helper.

mount(8) removes PATH (and HOME) from the helper's environment (util-linux's
``sanitize_env``), so ``mount.fuse3``'s ``/bin/sh -c 'h5mount ...'`` finds
h5mount only in the shell's default PATH,
``/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin``, whatever
PATH the caller had. These tests install nothing on the host: each runs
mount(8) in a mount namespace of its own, where an overlay adds an ``h5mount``
symlink to this checkout's console script to ``/usr/local/bin``, which is what
the README's ``ln -s`` does. The FUSE mount is made in a directory shared with
the test's own namespace, so the test sees it like any other mount, reads it,
checks ``/proc/self/mountinfo`` and unmounts it with umount(8); the daemon,
left in the namespace, exits when it is unmounted. A fixture always undoes the
mount and ends the daemon, whatever the test did. Root only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.mounting import REPO, fuse_available, is_mounted, pids_where, wait_gone

#: The console script of the interpreter running the tests (this checkout's .venv).
H5MOUNT_SCRIPT = Path(sys.executable).parent / "h5mount"
SAMPLE = REPO / "examples" / "sample-bucket"
DOMAIN = "home/admin/sample.h5"
#: The environment systemd gives a .mount unit's mount(8); it does not hold .venv/bin.
SERVICE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "LANG": "C.UTF-8"}
#: Runs "$@" in a new mount namespace whose /usr/local/bin also holds what is in
#: $1. The mount holding /usr/local/bin is made a slave first, so that the
#: overlay can never propagate to the host, even where / is shared.
NAMESPACE_SCRIPT = """\
set -eu
bin=$1
shift
mount --make-slave "$(findmnt -n -o TARGET --target /usr/local/bin)"
mount -t overlay h5mount-test -o "lowerdir=$bin:/usr/local/bin" /usr/local/bin
exec "$@"
"""


def _cannot_run() -> str | None:
    """None if these tests can run here, else why not."""
    if fuse_available() is not None:
        return fuse_available()
    if os.geteuid() != 0:
        return "mount(8) of a FUSE file system through mount.fuse3 needs root"
    for tool in ("mount", "umount", "unshare", "findmnt"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not installed"
    if not any(os.path.exists(f"{d}/mount.fuse3") for d in ("/sbin", "/usr/sbin")):
        return "mount.fuse3 is not installed (apt-get install fuse3)"
    if not os.path.isdir("/usr/local/bin"):
        return "/usr/local/bin does not exist"
    if not H5MOUNT_SCRIPT.exists():
        return f"{H5MOUNT_SCRIPT} does not exist (pip install -e .)"
    return None


pytestmark = [pytest.mark.mount,
              pytest.mark.skipif(_cannot_run() is not None, reason=str(_cannot_run()))]


def _run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True,
                          timeout=60, check=False, env=SERVICE_ENV)


def daemon_pids(mountpoint: Path) -> list[int]:
    """PIDs of h5mount daemons started as ``.../h5mount ... MOUNTPOINT ...``."""
    where = str(mountpoint).encode()
    return pids_where(lambda argv: any(a.endswith(b"/h5mount") for a in argv)
                      and where in argv)


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


@dataclass(frozen=True)
class MountInfo:
    """One line of /proc/self/mountinfo."""

    fstype: str
    source: str
    mount_options: list[str]
    super_options: list[str]


def mountinfo(mountpoint: Path) -> MountInfo:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields, _, tail = line.partition(" - ")
            parts = fields.split()
            if parts[4] == str(mountpoint):
                fstype, source, super_options = tail.split()
                return MountInfo(fstype, source, parts[5].split(","), super_options.split(","))
    raise AssertionError(f"{mountpoint} is not in /proc/self/mountinfo")


@dataclass(frozen=True)
class Namespace:
    """Where the tests run mount(8): ``run`` starts it with h5mount in /usr/local/bin.

    ``mountpoint`` lies in a directory bind-mounted on itself and made shared,
    so a mount made on it in the namespace shows in the test's namespace too.
    """

    mountpoint: Path
    bin_dir: Path

    def run(self, *command: str | Path) -> subprocess.CompletedProcess[str]:
        return _run("unshare", "--mount", "--propagation", "unchanged",
                    "sh", "-c", NAMESPACE_SCRIPT, "sh", self.bin_dir, *command)


@pytest.fixture
def namespace(tmp_path: Path) -> Iterator[Namespace]:
    """A shared directory with an empty mountpoint; always unmounted and cleared after."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "h5mount").symlink_to(H5MOUNT_SCRIPT)
    shared = tmp_path / "shared"
    mountpoint = shared / "mnt"
    mountpoint.mkdir(parents=True)
    for step in (["--bind", shared, shared], ["--make-private", shared],
                 ["--make-shared", shared]):
        done = _run("mount", *step)
        if done.returncode != 0:
            _run("umount", "-l", shared)
            raise AssertionError(f"mount {step}: {done.stderr}")
    try:
        yield Namespace(mountpoint, bin_dir)
    finally:
        if is_mounted(mountpoint):
            _run("umount", "-l", mountpoint)
        if not wait_gone(mountpoint, pids=daemon_pids):
            for pid in daemon_pids(mountpoint):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _run("umount", "-l", shared)


@pytest.fixture(scope="module")
def sample_npy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The bytes of the sample bucket's ``.npy`` files, from h5py reading the
    sample HDF5 file that ``examples/make_sample_bucket.py`` writes, through
    numpy's own writer (docs/CONTRACT.md, "Views": the header is numpy's)."""
    spec = importlib.util.spec_from_file_location(
        "make_sample_bucket", REPO / "examples" / "make_sample_bucket.py")
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    h5file = maker.write_sample(tmp_path_factory.mktemp("sample") / "sample.h5")
    out = {}
    with h5py.File(h5file, "r") as f:
        for name in ("measurements/temperature", "measurements/pressure"):
            buf = io.BytesIO()
            np.save(buf, f[name][()])
            out[f"{DOMAIN}/{name}.npy"] = buf.getvalue()
    return out


def check_sample_mount(mountpoint: Path, sample_npy: dict[str, bytes]) -> None:
    """The mount is a live h5mount of the sample bucket that reads the right bytes."""
    assert os.path.ismount(mountpoint)
    info = mountinfo(mountpoint)
    assert (info.fstype, info.source) == ("fuse.h5mount", str(SAMPLE)), info
    assert "ro" in info.mount_options and "allow_other" in info.super_options, info
    for relative, want in sample_npy.items():
        assert (mountpoint / relative).read_bytes() == want, relative
    sidecar = json.loads((mountpoint / DOMAIN / "measurements/temperature.json").read_bytes())
    assert sidecar["shape"] == [24, 8]


def unmount_and_check_gone(mountpoint: Path, log_file: Path) -> None:
    """umount(8) the mount; the daemon must exit cleanly, saying so in its log."""
    done = _run("umount", mountpoint)
    assert done.returncode == 0, done.stderr
    assert wait_gone(mountpoint, pids=daemon_pids), daemon_pids(mountpoint)
    assert not os.path.ismount(mountpoint)
    assert f"INFO mountd.daemon: unmounted {mountpoint}" in log_file.read_text()


def test_mount_t_fuse_h5mount(namespace: Namespace, tmp_path: Path,
                              sample_npy: dict[str, bytes]) -> None:
    mp = namespace.mountpoint
    log_file = tmp_path / "h5mount.log"
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    options = (f"ro,allow_other,cache_dir={cache_dir},metadata_ttl=5,log_level=info,"
               f"log_file={log_file}")
    done = namespace.run("mount", "-t", "fuse.h5mount", SAMPLE, mp, "-o", options)
    assert done.returncode == 0, done.stderr
    check_sample_mount(mp, sample_npy)
    (pid,) = daemon_pids(mp)
    # What mount(8) and mount.fuse3 ran: h5mount from the default PATH, with the
    # options as given plus the dev,suid mount.fuse3 adds.
    assert cmdline(pid)[1:] == ["/usr/local/bin/h5mount", str(SAMPLE), str(mp), "-o",
                                f"{options},dev,suid"]
    assert f"INFO mountd.daemon: mounted {SAMPLE} on {mp}" in log_file.read_text()
    unmount_and_check_gone(mp, log_file)


@pytest.mark.parametrize(("fstype", "what"), [("fuse.h5mount", "{source}"),
                                              ("fuse3", "h5mount#{source}")])
def test_fstab_line(fstype: str, what: str, namespace: Namespace, tmp_path: Path,
                    sample_npy: dict[str, bytes]) -> None:
    mp = namespace.mountpoint
    log_file = tmp_path / "h5mount.log"
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{what.format(source=SAMPLE)}  {mp}  {fstype}  ro,nofail,_netdev,"
                     f"x-systemd.automount,noauto,allow_other,log_level=info,"
                     f"log_file={log_file}  0 0\n")
    done = namespace.run("mount", "--fstab", fstab, mp)
    assert done.returncode == 0, done.stderr
    check_sample_mount(mp, sample_npy)
    (pid,) = daemon_pids(mp)
    # mount(8) kept nofail and _netdev for the helper, which dropped them.
    assert cmdline(pid)[-1] == f"ro,allow_other,log_level=info,log_file={log_file},dev,suid"
    unmount_and_check_gone(mp, log_file)


def test_mount_without_ro_is_refused(namespace: Namespace) -> None:
    """mount(8) says rw when the options lack ro; h5mount refuses it, saying what to do."""
    mp = namespace.mountpoint
    done = namespace.run("mount", "-t", "fuse.h5mount", SAMPLE, mp, "-o", "allow_other")
    assert done.returncode != 0
    assert "option rw is not supported" in done.stderr and "add ro" in done.stderr
    assert not os.path.ismount(mp) and not daemon_pids(mp)


@pytest.mark.hsds
@pytest.mark.server
def test_fstab_line_of_an_hsds_service(namespace: Namespace, tmp_path: Path,
                                       sample_npy: dict[str, bytes]) -> None:
    """An fstab line mounting a folder of an HSDS service (``-o endpoint=``), its
    password in a file: mount(8) clears HOME, so ``~/.hscfg`` is no help there."""
    from tests.hsds_server import ADMIN_PASSWORD, ADMIN_USER, HsdsServer  # noqa: PLC0415

    shutil.copytree(SAMPLE, tmp_path / "root" / "sample", symlinks=True)
    secret = tmp_path / "password"
    secret.write_text(ADMIN_PASSWORD + "\n")
    mp = namespace.mountpoint
    log_file = tmp_path / "h5mount.log"
    fstab = tmp_path / "fstab"
    with HsdsServer(tmp_path / "root", "sample", log_dir=tmp_path / "logs",
                    scan_wait=3600) as server:
        fstab.write_text(f"/home/admin/  {mp}  fuse.h5mount  ro,nofail,_netdev,noauto,"
                         f"endpoint={server.endpoint},hs_username={ADMIN_USER},"
                         f"hs_password_file={secret},log_level=info,log_file={log_file}  0 0\n")
        done = namespace.run("mount", "--fstab", fstab, mp)
        assert done.returncode == 0, done.stderr
        info = mountinfo(mp)
        assert (info.fstype, info.source) == ("fuse.h5mount", "/home/admin/"), info
        for relative, want in sample_npy.items():
            assert (mp / relative.removeprefix("home/admin/")).read_bytes() == want, relative
        unmount_and_check_gone(mp, log_file)
