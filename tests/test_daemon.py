"""The daemon as a user runs it: start-up checks, backgrounding, signals, unmount."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.mounting import (
    H5MOUNT,
    REPO,
    daemon_pids,
    fuse_available,
    is_mounted,
    mounted,
    run_h5mount,
    unmount,
    wait_gone,
)

pytestmark = [pytest.mark.mount, pytest.mark.hsds, pytest.mark.skipif(fuse_available() is not None,
                                                 reason=f"no FUSE: {fuse_available()}")]


def test_help_and_version() -> None:
    out = run_h5mount("--help")
    assert out.returncode == 0
    for word in ("SOURCE", "MOUNTPOINT", "--foreground", "allow_other", "metadata_ttl",
                 "uid=N", "fsname=NAME", "--domain", "--log-level"):
        assert word in out.stdout
    version = run_h5mount("--version")
    assert version.returncode == 0 and version.stdout.startswith("h5mount ")


@pytest.mark.parametrize("case", ["missing", "file"])
def test_bad_mountpoint_is_refused(case: str, tmp_path: Path, hsds_bucket) -> None:
    mp = tmp_path / "mp"
    if case == "file":
        mp.write_text("x")
    out = run_h5mount(str(hsds_bucket.bucket_dir), str(mp))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert ("does not exist" if case == "missing" else "not a directory") in lines[0]


def test_not_a_bucket_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "empty"
    source.mkdir()
    (source / "notes.txt").write_text("hello")
    mp = tmp_path / "mp"
    mp.mkdir()
    out = run_h5mount(str(source), str(mp))
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "not an HSDS bucket" in out.stderr
    missing = run_h5mount(str(tmp_path / "nope"), str(mp))
    assert missing.returncode == 1 and "no such file" in missing.stderr
    assert not is_mounted(mp)


def test_bad_option_is_a_usage_error(tmp_path: Path, hsds_bucket) -> None:
    out = run_h5mount(str(hsds_bucket.bucket_dir), str(tmp_path), "-o", "bogus=1")
    assert out.returncode == 2 and "unknown option: bogus=1" in out.stderr
    out = run_h5mount(str(hsds_bucket.bucket_dir), str(tmp_path), "-o", "rw")
    assert out.returncode == 2 and "read-only" in out.stderr


def test_already_mounted_and_fusermount_ends_daemon(tmp_path: Path, hsds_bucket) -> None:
    mp = tmp_path / "mp"
    with mounted(hsds_bucket.bucket_dir, mp, "-o", "fsname=h5test"):
        pids = daemon_pids(mp)
        assert len(pids) == 1
        with open("/proc/mounts") as f:
            line = next(line for line in f if line.split()[1] == str(mp))
        assert line.split()[0] == "h5test" and line.split()[2] == "fuse.h5mount"
        assert " ro," in f" {line.split()[3]},"
        again = run_h5mount(str(hsds_bucket.bucket_dir), str(mp))
        assert again.returncode == 1 and "already mounted" in again.stderr
        subprocess.run(["fusermount3", "-u", str(mp)], check=True)
        assert wait_gone(mp)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts_cleanly(sig: int, tmp_path: Path, hsds_bucket) -> None:
    mp = tmp_path / "mp"
    with mounted(hsds_bucket.bucket_dir, mp):
        assert os.listdir(mp)
        (pid,) = daemon_pids(mp)
        os.kill(pid, sig)
        assert wait_gone(mp)
        assert not is_mounted(mp)


def test_foreground_exit_status_and_log(tmp_path: Path, hsds_bucket) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    log_file = tmp_path / "h5mount.log"
    proc = subprocess.Popen([*H5MOUNT, "-f", "--log-level", "info", "--log-file", str(log_file),
                             str(hsds_bucket.bucket_dir), str(mp)], cwd=REPO,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(mp) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        assert sorted(os.listdir(mp)) == ["home"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not is_mounted(mp)
        assert "mounted" in log_file.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        unmount(mp)


def test_writes_fail_with_erofs(tmp_path: Path, hsds_bucket) -> None:
    mp = tmp_path / "mp"
    with mounted(hsds_bucket.bucket_dir, mp):
        domain = next(iter(hsds_bucket.files))
        root = mp / domain
        sidecar = mp / f"{domain}.json"
        attempts = [
            lambda: os.open(root / "new.txt", os.O_WRONLY | os.O_CREAT),
            lambda: os.open(sidecar, os.O_RDWR),
            lambda: os.mkdir(root / "newdir"),
            lambda: os.unlink(sidecar),
            lambda: os.rename(sidecar, root / "moved.json"),
            lambda: os.symlink("x", root / "newlink"),
            lambda: os.chmod(sidecar, 0o777),
            lambda: os.setxattr(root, "user.test", b"1"),
            lambda: os.truncate(sidecar, 0),
        ]
        for attempt in attempts:
            with pytest.raises(OSError) as info:
                attempt()
            assert info.value.errno == errno.EROFS


def test_owner_options(tmp_path: Path, hsds_bucket) -> None:
    mp = tmp_path / "mp"
    with mounted(hsds_bucket.bucket_dir, mp, "-o", "uid=1234,gid=5678,ro,noatime"):
        domain = next(iter(hsds_bucket.files))
        for path in (mp, mp / domain, mp / f"{domain}.json"):
            st = os.stat(path)
            assert (st.st_uid, st.st_gid) == (1234, 5678)


def test_domain_option_mounts_one_root_group(tmp_path: Path, hsds_bucket) -> None:
    mp = tmp_path / "mp"
    with mounted(hsds_bucket.bucket_dir, mp, "--domain", "/home/admin/links.h5"):
        names = set(os.listdir(mp))
        assert {".root.json", "g1", "g1.json", "names"} <= names
        assert os.readlink(mp / "g1/soft_abs") == "g2/d"
        # the external link's domain is not in this mount: a dangling DOMAIN::PATH link
        assert os.readlink(mp / "ext_data").endswith("::/data")
    missing = run_h5mount(str(hsds_bucket.bucket_dir), str(mp), "--domain", "/home/nobody.h5")
    assert missing.returncode == 1 and "no such domain /home/nobody.h5" in missing.stderr
    assert not is_mounted(mp)


def test_systemd_notify(tmp_path: Path, hsds_bucket) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    sock_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(sock_path))
        sock.settimeout(30)
        env = {**os.environ, "NOTIFY_SOCKET": str(sock_path)}
        proc = subprocess.Popen([*H5MOUNT, "-f", str(hsds_bucket.bucket_dir), str(mp)],
                                cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
        try:
            assert sock.recv(100) == b"READY=1"
            assert is_mounted(mp)
            proc.terminate()
            assert sock.recv(100) == b"STOPPING=1"
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            unmount(mp)
