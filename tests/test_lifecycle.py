"""The daemon's life under a service manager, on real mounts.

systemd's notifications through a real ``NOTIFY_SOCKET`` datagram socket
(``READY=1`` only once the mount is live, then ``STATUS=`` and
``WATCHDOG=1``, ``STOPPING=1`` on SIGTERM), SIGHUP making a changed bucket
visible at once whatever ``metadata_ttl`` says while reads go on, a killed
daemon's stale mountpoint, ``-o auto_unmount``, and SIGTERM in the middle of
a large read.

Concurrency: each test owns its daemon and mountpoint; reader threads are
joined (with a timeout) before a test ends, and every test unmounts with
``fusermount3 -u`` even when it fails.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mountd import daemon
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

pytestmark = [pytest.mark.mount, pytest.mark.skipif(fuse_available() is not None,
                                                 reason=f"no FUSE: {fuse_available()}")]

SAMPLE = REPO / "examples" / "sample-bucket"
#: The sample bucket's one domain, and the file of its root group.
DOMAIN = "home/admin/sample.h5"
ROOT_GROUP = "db/1963c813-a83f18f0/.group.json"
#: The large reference file's dataset: 64 chunks of 8 MiB, 512 MiB in all.
BIG_CHUNK = 1 << 20
BIG_CHUNKS = 64


def sample_bucket(tmp_path: Path) -> Path:
    """A copy of the sample bucket that a test may change."""
    bucket = tmp_path / "bucket"
    shutil.copytree(SAMPLE, bucket)
    return bucket


def big_reference(tmp_path: Path) -> Path:
    """A kerchunk file whose dataset ``big`` (float64 zeros) is 512 MiB of raw
    chunks in a sparse local file."""
    raw = tmp_path / "raw.bin"
    with raw.open("wb") as f:
        f.truncate(BIG_CHUNK * 8 * BIG_CHUNKS)
    refs: dict[str, object] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        ".zattrs": "{}",
        "big/.zarray": json.dumps({"zarr_format": 2, "shape": [BIG_CHUNK * BIG_CHUNKS],
                                   "chunks": [BIG_CHUNK], "dtype": "<f8", "compressor": None,
                                   "filters": None, "fill_value": 0, "order": "C"}),
        "big/.zattrs": "{}",
    }
    for i in range(BIG_CHUNKS):
        refs[f"big/{i}"] = [str(raw), i * BIG_CHUNK * 8, BIG_CHUNK * 8]
    ref = tmp_path / "big.json"
    ref.write_text(json.dumps({"version": 1, "refs": refs}))
    return ref


@contextlib.contextmanager
def foreground(source: Path, mountpoint: Path, *args: str,
               env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """``h5mount -f``, yielded once the mount is live; always unmounted at the end."""
    mountpoint.mkdir(exist_ok=True)
    proc = subprocess.Popen([*H5MOUNT, "-f", *args, str(source), str(mountpoint)], cwd=REPO,
                            env={**os.environ, **(env or {})}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(mountpoint):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the mount did not come up"
            time.sleep(0.02)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        unmount(mountpoint)
        wait_gone(mountpoint)


def receive(sock: socket.socket, until: float) -> str | None:
    """The next notification, or None if none comes before ``until`` (monotonic)."""
    sock.settimeout(max(until - time.monotonic(), 0.001))
    try:
        return sock.recv(4096).decode()
    except TimeoutError:
        return None


def test_notify_ready_status_watchdog_stopping(tmp_path: Path) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    bucket = sample_bucket(tmp_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(tmp_path / "notify.sock"))
        env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "200000"}
        proc = subprocess.Popen([*H5MOUNT, "-f", str(bucket), str(mp)], cwd=REPO,
                                env={**os.environ, **env}, stderr=subprocess.PIPE, text=True)
        try:
            assert receive(sock, time.monotonic() + 30) == "READY=1"
            assert os.path.ismount(mp)
            assert os.listdir(mp / DOMAIN)
            seen: list[str] = []
            deadline = time.monotonic() + 20
            while seen.count("WATCHDOG=1") < 3 or not any(m.startswith("STATUS=") for m in seen):
                message = receive(sock, deadline)
                assert message is not None, f"only {seen} in 20 s"
                seen.append(message)
            status = next(m for m in seen if m.startswith("STATUS="))
            assert str(bucket) in status and "inodes" in status and "chunk cache" in status
            assert "READY=1" not in seen
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 20
            while (message := receive(sock, deadline)) != "STOPPING=1":
                assert message is not None, "no STOPPING=1"
            assert proc.wait(timeout=20) == 0
            assert not is_mounted(mp)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            unmount(mp)


@pytest.mark.parametrize(("usec", "pid", "expected"), [
    ("200000", None, 0.1), ("200000", "self", 0.1), ("200000", "1", None), ("0", None, None),
    ("", None, None), ("x", None, None)])
def test_watchdog_interval(usec: str, pid: str | None, expected: float | None,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is None:
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
    else:
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)
    assert daemon.watchdog_interval() == expected


def test_sighup_shows_changes_during_reads(tmp_path: Path) -> None:
    bucket = sample_bucket(tmp_path)
    mp = tmp_path / "mp"
    log_file = tmp_path / "h5mount.log"
    with mounted(bucket, mp, "-o", "metadata_ttl=3600", "--log-level", "info",
                 "--log-file", str(log_file)):
        root = mp / DOMAIN
        npy = root / "measurements" / "temperature.npy"
        whole = npy.read_bytes()
        assert os.getxattr(root, "user.h5.attr.version") == b"1"
        sidecar = mp / f"{DOMAIN}.json"
        assert "newest" not in json.loads(sidecar.read_text())["links"]
        (pid,) = daemon_pids(mp)
        group = json.loads((bucket / ROOT_GROUP).read_text())
        group["attributes"]["version"]["value"] = 2
        group["links"]["newest"] = {"class": "H5L_TYPE_SOFT", "created": 1.0,
                                    "h5path": "/measurements/temperature"}
        (bucket / ROOT_GROUP).write_text(json.dumps(group))
        # metadata_ttl is an hour: without SIGHUP the old metadata is served.
        assert os.getxattr(root, "user.h5.attr.version") == b"1"
        assert "newest" not in os.listdir(root)

        failures: list[BaseException] = []
        stop = threading.Event()

        def read_on() -> None:
            while not stop.is_set():
                try:
                    assert npy.read_bytes() == whole
                except BaseException as exc:
                    failures.append(exc)
                    return

        readers = [threading.Thread(target=read_on) for _ in range(4)]
        for reader in readers:
            reader.start()
        try:
            time.sleep(0.2)
            os.kill(pid, signal.SIGHUP)
            deadline = time.monotonic() + 10
            while os.getxattr(root, "user.h5.attr.version") != b"2":
                assert time.monotonic() < deadline, "the change did not show after SIGHUP"
                time.sleep(0.02)
            time.sleep(0.2)
        finally:
            stop.set()
            for reader in readers:
                reader.join(timeout=30)
        assert not failures
        assert "newest" in os.listdir(root)
        # the kernel's cached size of the sidecar was dropped too: the new one reads whole
        assert "newest" in json.loads(sidecar.read_text())["links"]
        assert os.readlink(root / "newest") == "measurements/temperature"
        assert daemon_pids(mp) == [pid] and is_mounted(mp)
        lines = [line for line in log_file.read_text().splitlines() if "SIGHUP" in line]
        assert len(lines) == 1 and " INFO " in lines[0]


def test_stale_mountpoint_is_explained(tmp_path: Path) -> None:
    bucket = sample_bucket(tmp_path)
    mp = tmp_path / "mp"
    with mounted(bucket, mp):
        (pid,) = daemon_pids(mp)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while daemon_pids(mp):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(OSError) as info:
            os.listdir(mp)
        assert info.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        again = run_h5mount(str(bucket), str(mp))
        assert again.returncode == 1
        assert again.stderr.count("\n") == 1
        assert "stale mount" in again.stderr and f"fusermount3 -u {mp}" in again.stderr
        subprocess.run(["fusermount3", "-u", str(mp)], check=True)
        assert not is_mounted(mp)
    with mounted(bucket, mp):
        assert os.listdir(mp / DOMAIN)


def test_auto_unmount_leaves_no_stale_mount(tmp_path: Path) -> None:
    bucket = sample_bucket(tmp_path)
    mp = tmp_path / "mp"
    with mounted(bucket, mp, "-o", "auto_unmount"):
        (pid,) = daemon_pids(mp)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while is_mounted(mp):
            assert time.monotonic() < deadline, "auto_unmount left the mount behind"
            time.sleep(0.02)
        assert os.listdir(mp) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_large_read_ends_cleanly(sig: int, tmp_path: Path) -> None:
    ref = big_reference(tmp_path)
    mp = tmp_path / "mp"
    with foreground(ref, mp, "-o", "chunk_cache=32M") as proc:
        started = threading.Event()
        outcome: list[int | BaseException] = []

        def read_all() -> None:
            total = 0
            try:
                with (mp / "big.npy").open("rb", buffering=0) as f:
                    while chunk := f.read(4 << 20):
                        total += len(chunk)
                        started.set()
                outcome.append(total)
            except OSError as exc:
                outcome.append(exc)
            finally:
                started.set()

        reader = threading.Thread(target=read_all)
        reader.start()
        try:
            assert started.wait(timeout=30)
            proc.send_signal(sig)
            assert proc.wait(timeout=30) == 0
        finally:
            reader.join(timeout=30)
        assert not reader.is_alive(), "the read hung"
        assert not is_mounted(mp)
        (result,) = outcome
        if isinstance(result, OSError):
            assert result.errno == errno.EIO, result
        else:
            assert result == BIG_CHUNK * BIG_CHUNKS * 8 + 128
