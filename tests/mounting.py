"""Running the real ``h5mount`` command against a real FUSE mount in tests.

``mounted(source, mountpoint, *args)`` starts the daemon the way a user does
(background mode, the parent exits once the mount is live), yields, and
always unmounts with ``fusermount3 -u`` and waits for the daemon to go, even
when the test body fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests import tiers

H5MOUNT = [sys.executable, "-m", "mountd.cli"]
REPO = Path(__file__).resolve().parent.parent


def fuse_available() -> str | None:
    """None if a FUSE mount can be made here, else the reason it cannot."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed"
    return None


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f)


def run_h5mount(*args: str, timeout: float = 60,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run h5mount; ``env`` adds variables (AWS credentials) to this process's environment."""
    if not {"--help", "--version"} & set(args):
        tiers.uses("mount")
    return subprocess.run(
        [*H5MOUNT, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
        check=False, env={**os.environ, **env} if env else None,
    )


def unmount(path: Path) -> None:
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], check=False, capture_output=True)


def pids_where(match: Callable[[list[bytes]], bool]) -> list[int]:
    """PIDs of the processes whose argv (from /proc) ``match`` accepts."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if match(argv):
            pids.append(int(entry))
    return pids


def daemon_pids(mountpoint: Path) -> list[int]:
    """PIDs of h5mount daemons serving ``mountpoint``."""
    where = str(mountpoint).encode()
    return pids_where(lambda argv: b"mountd.cli" in argv and where in argv)


def wait_gone(mountpoint: Path, timeout: float = 15,
              pids: Callable[[Path], list[int]] = daemon_pids) -> bool:
    """Wait until no daemon (found by ``pids``) serves ``mountpoint`` and it is no mount."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pids(mountpoint) and not is_mounted(mountpoint):
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def mounted(source: str | Path, mountpoint: Path, *args: str,
            env: dict[str, str] | None = None) -> Iterator[Path]:
    mountpoint.mkdir(parents=True, exist_ok=True)
    proc = run_h5mount(str(source), str(mountpoint), *args, env=env)
    try:
        if proc.returncode != 0:
            raise AssertionError(f"h5mount failed ({proc.returncode}): {proc.stderr}")
        assert is_mounted(mountpoint)
        yield mountpoint
    finally:
        unmount(mountpoint)
        if not wait_gone(mountpoint):
            for pid in daemon_pids(mountpoint):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
