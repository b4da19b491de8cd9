"""The systemd unit ``systemd/h5mount@.service``: valid for systemd, and the lifecycle it asks for.

``systemd-analyze verify`` checks an instance of the template (skipped where
systemd is not installed); a unit-file parse checks the directives the
daemon relies on. Pure file checks, no service is started.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.mounting import REPO

UNIT = REPO / "systemd" / "h5mount@.service"
#: Directives that give the service a mount namespace of its own, where the
#: FUSE mount would be seen by h5mount alone.
NAMESPACING = ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts",
               "ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths", "ProtectKernelModules",
               "ProtectKernelTunables", "ProtectKernelLogs", "ProtectControlGroups",
               "TemporaryFileSystem", "BindPaths", "RootDirectory", "MountAPIVFS")


def service_section() -> configparser.SectionProxy:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    h5mount = shutil.which("h5mount") or str(REPO / ".venv" / "bin" / "h5mount")
    # verify wants ExecStart's program to exist: point it at this checkout's.
    (tmp_path / UNIT.name).write_text(UNIT.read_text().replace("/usr/local/bin/h5mount",
                                                               h5mount))
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", "./h5mount@test.service"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out


def test_lifecycle_directives() -> None:
    service = service_section()
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    assert "fusermount3 -u ${MOUNTPOINT}" in service["ExecStop"]
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert int(service["WatchdogSec"]) > 0
    assert "--foreground" in service["ExecStart"]
    assert service["NoNewPrivileges"] == "yes"
    assert "/dev/fuse rw" in service["DeviceAllow"]
    assert "@mount" in service["SystemCallFilter"]
    assert not [key for key in NAMESPACING if key in service]
