"""h5mount as a service, checked without mounting: its units and the options it is given.

``systemd/h5mount@.service``: ``systemd-analyze verify`` checks an instance
of the template (skipped where systemd is not installed); a unit-file parse
checks the directives the daemon relies on. The real
``systemd-fstab-generator`` turns h5mount fstab lines into ``.mount`` and
``.automount`` units, which are checked and verified the same way. The option
strings mount(8), ``mount.fuse3`` and systemd were seen to hand h5mount are
parsed as h5mount parses them. No service is started and nothing is mounted
(``tests/test_fstab.py`` mounts through mount(8)).
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mountd.cli import parse_args
from mountd.config import MountConfig, OptionError, apply_options
from tests.mounting import REPO

UNIT = REPO / "systemd" / "h5mount@.service"
GENERATOR = Path("/usr/lib/systemd/system-generators/systemd-fstab-generator")
#: Two lines in the README's form: a bucket directory mounted at boot, and an
#: S3 bucket mounted on first access, once the network is up.
FSTAB = """\
/srv/hsds/data/mybucket  /mnt/h5bucket  fuse.h5mount  ro,allow_other,nofail  0 0
s3://mybucket  /mnt/h5s3  fuse.h5mount  ro,allow_other,nofail,_netdev,noauto,x-systemd.automount,\
profile=hsds,endpoint_url=https://s3.example.org,cache_dir=/var/cache/h5mount  0 0
"""
S3_OPTIONS = ("ro,allow_other,nofail,_netdev,noauto,x-systemd.automount,profile=hsds,"
              "endpoint_url=https://s3.example.org,cache_dir=/var/cache/h5mount")
#: Directives that give the service a mount namespace of its own, where the
#: FUSE mount would be seen by h5mount alone.
NAMESPACING = ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts",
               "ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths", "ProtectKernelModules",
               "ProtectKernelTunables", "ProtectKernelLogs", "ProtectControlGroups",
               "TemporaryFileSystem", "BindPaths", "RootDirectory", "MountAPIVFS")


def unit_file(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def service_section() -> configparser.SectionProxy:
    return unit_file(UNIT)["Service"]


def verify(unit_dir: Path, *units: str) -> None:
    """``systemd-analyze verify`` finds nothing to say about ``units``."""
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", *(f"./{u}" for u in units)],
                         cwd=unit_dir, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    h5mount = shutil.which("h5mount") or str(REPO / ".venv" / "bin" / "h5mount")
    # verify wants ExecStart's program to exist: point it at this checkout's.
    (tmp_path / UNIT.name).write_text(UNIT.read_text().replace("/usr/local/bin/h5mount",
                                                               h5mount))
    verify(tmp_path, "h5mount@test.service")


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


@pytest.mark.skipif(not GENERATOR.exists(), reason=f"{GENERATOR} is not installed")
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
def test_fstab_generator_units(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    fstab.write_text(FSTAB)
    normal, early, late = (tmp_path / name for name in ("normal", "early", "late"))
    for directory in (normal, early, late):
        directory.mkdir()
    # SYSTEMD_FSTAB: the generator reads this file instead of /etc/fstab.
    out = subprocess.run([str(GENERATOR), str(normal), str(early), str(late)],
                         env={**os.environ, "SYSTEMD_FSTAB": str(fstab)},
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr

    bucket = unit_file(normal / "mnt-h5bucket.mount")
    assert dict(bucket["Mount"]) == {"What": "/srv/hsds/data/mybucket", "Where": "/mnt/h5bucket",
                                     "Type": "fuse.h5mount", "Options": "ro,allow_other,nofail"}
    assert bucket["Unit"]["SourcePath"] == str(fstab)
    # Not _netdev: a local file system, mounted at boot; no automount.
    assert (normal / "local-fs.target.wants" / "mnt-h5bucket.mount").is_symlink()
    assert not (normal / "mnt-h5bucket.automount").exists()

    s3 = unit_file(normal / "mnt-h5s3.mount")
    assert dict(s3["Mount"]) == {"What": "s3://mybucket", "Where": "/mnt/h5s3",
                                 "Type": "fuse.h5mount", "Options": S3_OPTIONS}
    automount = unit_file(normal / "mnt-h5s3.automount")
    assert dict(automount["Automount"]) == {"Where": "/mnt/h5s3"}
    # _netdev: wanted by remote-fs.target, through the automount alone (noauto).
    assert (normal / "remote-fs.target.wants" / "mnt-h5s3.automount").is_symlink()
    assert not list(normal.glob("*.target.wants/mnt-h5s3.mount"))
    assert not list(early.iterdir()) and not list(late.iterdir())

    verify(normal, "mnt-h5bucket.mount", "mnt-h5s3.mount", "mnt-h5s3.automount")
    # h5mount takes the units' Options= as they are (systemd passes them to mount(8)).
    for options in (bucket["Mount"]["Options"], s3["Mount"]["Options"]):
        apply_options(MountConfig("s3://mybucket", "/mnt/x"), [options])


#: Option strings h5mount was started with by mount(8) and mount.fuse3
#: (util-linux 2.38, fuse 3.14), for the options mount(8) was given.
FROM_MOUNT_HELPER = {
    "ro,allow_other": "ro,allow_other,dev,suid",
    "ro,users": "ro,noexec,nosuid,nodev",
    "ro,defaults,noauto,nofail,_netdev,x-systemd.automount,comment=x,X-mount.mkdir":
        "ro,dev,suid",
    "ro,sync,dirsync,strictatime,noexec,noatime": "ro,sync,dirsync,strictatime,noexec,noatime,"
                                                  "dev,suid",
    "ro,relatime,nodiratime,lazytime,mand,silent,iversion":
        "ro,relatime,nodiratime,lazytime,mand,silent,iversion,dev,suid",
    "ro,user=alice,exec,suid,dev": "ro,user=alice,exec,suid,dev,dev,suid",
}


@pytest.mark.parametrize("given", sorted(FROM_MOUNT_HELPER))
def test_options_from_mount_helper_are_accepted(given: str) -> None:
    config = parse_args(["/srv/bucket", "/mnt/x", "-o", FROM_MOUNT_HELPER[given]])
    kernel = set(config.fuse_options())
    # ro always; only the flags libfuse knows reach it, the rest are dropped
    assert "ro" in kernel and "rw" not in kernel
    assert kernel - {"ro", "default_permissions", "subtype=h5mount", "fsname=/srv/bucket"} <= {
        "allow_other", "dev", "suid", "exec", "noexec", "nosuid", "nodev", "sync", "dirsync",
        "noatime"}


def test_rw_that_mount8_adds_is_refused_with_a_hint() -> None:
    # `mount -t fuse.h5mount SRC MNT` (no ro) starts h5mount with -o rw,dev,suid
    with pytest.raises(OptionError, match=r"read-only.*add ro"):
        apply_options(MountConfig("/srv/bucket", "/mnt/x"), ["rw,dev,suid"])


def test_log_and_domain_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = parse_args(["/srv/bucket", "/mnt/x", "-o",
                         "log_level=info,log_file=h5.log,domain=/home/u/f.h5"])
    assert (config.log_level, config.log_file, config.domain) == (
        "INFO", str(tmp_path / "h5.log"), "/home/u/f.h5")
    # the command-line flags win over -o
    config = parse_args(["/srv/bucket", "/mnt/x", "-o",
                         "log_level=debug,log_file=h5.log,domain=/home/u/f.h5",
                         "--log-level", "warning", "--log-file", "/var/log/h5.log",
                         "--domain", "/home/u/g.h5"])
    assert (config.log_level, config.log_file, config.domain) == (
        "WARNING", "/var/log/h5.log", "/home/u/g.h5")
    default = parse_args(["/srv/bucket", "/mnt/x"])
    assert (default.log_level, default.log_file, default.domain) == ("WARNING", None, None)


@pytest.mark.parametrize(("option", "message"), [
    ("log_level=loud", "option log_level=loud: the level is one of DEBUG, INFO, WARNING, ERROR"),
    ("log_level", "option log_level: the level is one of"),
    ("log_file=", "option log_file needs a path"),
    ("domain", "option domain needs a value"),
    ("nosymfollow", "unknown option: nosymfollow"),
])
def test_bad_service_options(option: str, message: str) -> None:
    with pytest.raises(OptionError) as info:
        apply_options(MountConfig("/srv/bucket", "/mnt/x"), [option])
    assert message in str(info.value)
