"""Mount configuration and the parsing of mount(8)-style ``-o`` options.

Owns ``MountConfig`` and the one function that turns ``-o a,b=c`` strings
into it, including which options mount(8), ``mount.fuse3`` and systemd put in
the option string are passed to the kernel or accepted and ignored. Pure code
with no I/O.

What reaches h5mount from ``mount -t fuse.h5mount SRC MNT -o OPTS`` (util-linux
2.38, fuse 3.14): mount(8) drops its own userspace options (``defaults``,
``auto``, ``noauto``, ``owner``, ``group``, ``comment=``, ``x-*``, ``X-*``),
turns ``user``/``users`` into ``nosuid,nodev,noexec``, puts ``ro`` or else
``rw`` first, and keeps kernel flags (``sync``, ``relatime``, ``nodiratime``,
...); ``mount.fuse3`` then drops ``user``, ``users``, ``nouser``, ``auto``,
``noauto``, ``nofail``, ``_netdev``, ``setuid=`` and ``drop_privileges`` and
appends ``dev`` and ``suid`` unless ``nodev``/``nosuid`` are there. The ``rw``
mount(8) adds when the options lack ``ro`` cannot be told from one the user
wrote, so ``rw`` is refused with a message that says to add ``ro``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from layouts.storage import DEFAULT_MAX_METADATA

#: fstab/mount(8) options that only matter to mount(8) itself; accepted and ignored
#: (``user=NAME`` too: mount(8) passes it for a mount made by a user).
_MOUNT_ONLY = {"defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser",
               "owner", "group", "ro"}
#: Options passed through to the kernel mount unchanged (libfuse 3.14 takes these).
_KERNEL = {"nosuid", "nodev", "noexec", "noatime", "suid", "dev", "exec", "atime",
           "sync", "async", "dirsync"}
#: Kernel flags mount(8) passes on that libfuse 3.14 refuses (access times,
#: mandatory locks, i_version, kernel messages): nothing a read-only FUSE mount
#: needs, so accepted and ignored.
_IGNORED_KERNEL = {"relatime", "norelatime", "strictatime", "nostrictatime", "diratime",
                   "nodiratime", "lazytime", "nolazytime", "mand", "nomand", "silent",
                   "loud", "iversion", "noiversion"}
#: ``-o log_level=`` values, as ``--log-level`` takes them.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class OptionError(ValueError):
    """A ``-o`` option is unknown or has a bad value."""


@dataclass
class MountConfig:
    source: str
    mountpoint: str
    foreground: bool = False
    domain: str | None = None
    allow_other: bool = False
    #: ``-o auto_unmount``: fusermount3 unmounts when the daemon dies, even by SIGKILL.
    auto_unmount: bool = False
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    fsname: str | None = None
    metadata_ttl: float = 60.0
    chunk_cache: int = 256 << 20
    readahead: int = 1 << 20
    cache_size: int = 512 << 20
    cache_dir: str | None = None
    disk_cache_size: int = 10 << 30
    #: ``-o cache_decoded``: also keep decoded chunks in ``cache_dir``.
    cache_decoded: bool = False
    timeout: float = 30.0
    max_metadata: int = DEFAULT_MAX_METADATA
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    anon: bool = False
    allow_local_refs: bool = False
    hsds_acls: bool = False
    acl_map: str | None = None
    kernel_options: list[str] = field(default_factory=list)
    log_level: str = "WARNING"
    log_file: str | None = None
    stats_file: str | None = None
    #: ``-o h5view=on|off``: show each domain as an HDF5 file ``D.h5``.
    h5view: bool = True
    #: ``-o h5view_inline=SIZE``: most variable-length bytes one ``D.h5`` embeds.
    h5view_inline: int = 64 << 20
    #: ``-o h5view_objects=N``: most objects one ``D.h5`` holds.
    h5view_objects: int = 20_000

    def fuse_options(self) -> set[str]:
        """Options for ``pyfuse3.init``: always read-only, with kernel permission checks."""
        opts = {"ro", "default_permissions", "subtype=h5mount",
                f"fsname={self.fsname or self.source}"}
        if self.allow_other:
            opts.add("allow_other")
        if self.auto_unmount:
            opts.add("auto_unmount")
        opts.update(self.kernel_options)
        return opts


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(name: str, value: str | None) -> int:
    """A byte count such as ``1048576``, ``512K``, ``256M``, ``2G`` (binary units)."""
    if not value:
        raise OptionError(f"option {name} needs a size ({name}=256M)")
    text = value.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    digits = text[:len(text) - len(unit)]
    try:
        number = float(digits)
    except ValueError:
        raise OptionError(f"option {name}={value}: not a size") from None
    if number < 0 or not digits:
        raise OptionError(f"option {name}={value}: not a size")
    return int(number * _UNITS[unit])


def _number(name: str, value: str | None, kind: type[int] | type[float]) -> float:
    if value is None:
        raise OptionError(f"option {name} needs a value ({name}=...)")
    try:
        number = kind(value)
    except ValueError:
        raise OptionError(f"option {name}={value}: not a number") from None
    if number < 0:
        raise OptionError(f"option {name}={value}: must not be negative")
    return number


def apply_options(config: MountConfig, option_strings: list[str]) -> None:
    """Apply every ``-o`` string (comma-separated ``name`` or ``name=value``)."""
    for text in option_strings:
        for item in filter(None, (s.strip() for s in text.split(","))):
            name, eq, value = item.partition("=")
            val = value if eq else None
            if name == "allow_other":
                config.allow_other = True
            elif name == "auto_unmount":
                config.auto_unmount = True
            elif name == "uid":
                config.uid = int(_number(name, val, int))
            elif name == "gid":
                config.gid = int(_number(name, val, int))
            elif name == "fsname":
                if not val:
                    raise OptionError("option fsname needs a value")
                config.fsname = val
            elif name == "metadata_ttl":
                config.metadata_ttl = _number(name, val, float)
            elif name == "chunk_cache":
                config.chunk_cache = parse_size(name, val)
            elif name == "readahead":
                config.readahead = parse_size(name, val)
            elif name == "cache_size":
                config.cache_size = parse_size(name, val)
            elif name == "cache_dir":
                if not val:
                    raise OptionError("option cache_dir needs a directory")
                config.cache_dir = os.path.abspath(val)
            elif name == "stats_file":
                if not val:
                    raise OptionError("option stats_file needs a path")
                config.stats_file = os.path.abspath(val)
            elif name == "disk_cache_size":
                config.disk_cache_size = parse_size(name, val)
            elif name == "cache_decoded":
                if val not in (None, "on", "off"):
                    raise OptionError(f"option {item}: say cache_decoded, cache_decoded=on "
                                      "or cache_decoded=off")
                config.cache_decoded = val != "off"
            elif name == "max_metadata":
                config.max_metadata = parse_size(name, val)
                if config.max_metadata == 0:
                    raise OptionError("option max_metadata=0: must be at least 1 byte")
            elif name == "timeout":
                config.timeout = _number(name, val, float)
                if config.timeout == 0:
                    raise OptionError("option timeout=0: must be more than 0 seconds")
            elif name in ("endpoint_url", "region", "profile", "domain"):
                if not val:
                    raise OptionError(f"option {name} needs a value")
                setattr(config, name, val)
            elif name == "log_level":
                if not val or val.upper() not in LOG_LEVELS:
                    raise OptionError(f"option {item}: the level is one of "
                                      f"{', '.join(LOG_LEVELS)} (log_level=info)")
                config.log_level = val.upper()
            elif name == "log_file":
                if not val:
                    raise OptionError("option log_file needs a path")
                config.log_file = os.path.abspath(val)
            elif name == "h5view":
                if val not in ("on", "off"):
                    raise OptionError(f"option {item}: say h5view=on or h5view=off")
                config.h5view = val == "on"
            elif name == "h5view_inline":
                config.h5view_inline = parse_size(name, val)
            elif name == "h5view_objects":
                config.h5view_objects = int(_number(name, val, int))
            elif name == "anon":
                config.anon = True
            elif name == "allow_local_refs":
                config.allow_local_refs = True
            elif name == "hsds_acls":
                config.hsds_acls = True
            elif name == "acl_map":
                if not val:
                    raise OptionError("option acl_map needs a file")
                config.acl_map = os.path.abspath(val)
                config.hsds_acls = True
            elif name == "rw":
                raise OptionError("h5mount mounts are read-only; option rw is not supported "
                                  "(mount(8) adds rw unless the options say ro: add ro)")
            elif name in _KERNEL:
                config.kernel_options.append(name)
            elif (name in _MOUNT_ONLY or name in _IGNORED_KERNEL or name == "comment"
                  or name.startswith(("x-", "X-"))):
                continue
            else:
                raise OptionError(f"unknown option: {item}")
    if config.cache_decoded and config.cache_dir is None:
        raise OptionError("option cache_decoded needs cache_dir (cache_dir=DIR,cache_decoded)")
