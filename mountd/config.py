"""Mount configuration: the one table of ``-o`` options, and their parsing.

Owns ``MountConfig`` and the table of mount options. Each option of the daemon
is a field of ``MountConfig`` declared with ``option``: the field gives the
name, type and default, and its ``Option`` how fstab spells the option, how the
value is parsed and what it does (``FIELD_OPTIONS``). ``MOUNT8_OPTIONS`` holds
the options mount(8), ``mount.fuse3`` and systemd put in the option string,
with what h5mount does with each: pass it to the kernel, accept and ignore it,
or refuse it. ``apply_options`` parses ``-o`` strings with the table, and
``help_entries`` lists it for ``--help`` (``mountd.cli``) and the README
(``tests/test_options.py`` checks both). Pure code with no I/O; no locks: the
table is built at import and never changed, and ``apply_options`` changes only
the config it is given.

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

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from fnmatch import fnmatchcase
from typing import Any

from layouts.storage import DEFAULT_MAX_METADATA
from mountd import logsafe
from mountd.cache.held import ROW_BANDS_BYTES
from mountd.cache.memo import MAX_BYTES as MEMO_BYTES

#: ``-o log_level=`` values, as ``--log-level`` takes them.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class OptionError(ValueError):
    """A ``-o`` option is unknown or has a bad value."""


# ------------------------------------------------------------ kinds of value


@dataclass(frozen=True)
class Kind:
    """How an option is spelt after its name, its value parsed, and a default shown.

    ``parse(name, value)`` gets the text after ``=``, or None when the option
    has no ``=``, and returns the field's value or raises ``OptionError``;
    ``show`` writes a default as ``parse`` reads it."""

    spelt: str
    parse: Callable[[str, str | None], Any]
    show: Callable[[Any], str] = str


def _item(name: str, value: str | None) -> str:
    """The option as it was written, for error messages."""
    return name if value is None else f"{name}={value}"


def _on_off(value: bool) -> str:
    return "on" if value else "off"


_YES = ("on", "yes", "true", "1")
_NO = ("off", "no", "false", "0")


def _flag(name: str, value: str | None) -> bool:
    if value is None or value.lower() in _YES:
        return True
    if value.lower() in _NO:
        return False
    raise OptionError(f"option {name}={value}: say {name} or {name}=off")


#: ``NAME`` turns it on; ``NAME=off`` (or ``no``, ``false``, ``0``) leaves it off.
FLAG = Kind("", _flag, _on_off)


def on_off(bare: bool = False) -> Kind:
    """``NAME=on`` or ``NAME=off``; with ``bare``, ``NAME`` alone is on."""
    def parse(name: str, value: str | None) -> bool:
        if value in ("on", "off") or (bare and value is None):
            return value != "off"
        say = f"{name}, {name}=on or {name}=off" if bare else f"{name}=on or {name}=off"
        raise OptionError(f"option {_item(name, value)}: say {say}")
    return Kind("[=on|off]" if bare else "=on|off", parse, _on_off)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(name: str, value: str | None) -> int:
    """A byte count such as ``1048576``, ``512K``, ``256M``, ``2G`` (binary units)."""
    if not value:
        raise OptionError(f"option {name} needs a size ({name}=256M)")
    written = value.strip().upper().removesuffix("IB").removesuffix("B")
    unit = written[-1:] if written[-1:] in _UNITS else ""
    digits = written[:len(written) - len(unit)]
    try:
        number = float(digits)
    except ValueError:
        raise OptionError(f"option {name}={value}: not a size") from None
    if not digits or not math.isfinite(number) or number < 0:
        raise OptionError(f"option {name}={value}: not a size")
    return int(number * _UNITS[unit])


def format_size(nbytes: int) -> str:
    """``nbytes`` as ``parse_size`` reads it, in the largest unit that divides it."""
    for unit in ("T", "G", "M", "K"):
        if nbytes and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def size(nonzero: bool = False) -> Kind:
    """``NAME=SIZE``: bytes (``parse_size``); with ``nonzero``, at least 1."""
    def parse(name: str, value: str | None) -> int:
        number = parse_size(name, value)
        if nonzero and number == 0:
            raise OptionError(f"option {name}=0: must be at least 1 byte")
        return number
    return Kind("=SIZE", parse, format_size)


def _number(name: str, value: str | None, kind: type[int] | type[float]) -> float:
    if value is None:
        raise OptionError(f"option {name} needs a value ({name}=...)")
    try:
        number = kind(value)
    except ValueError:
        raise OptionError(f"option {name}={value}: not a number") from None
    if not math.isfinite(number):
        raise OptionError(f"option {name}={value}: not a number")
    if number < 0:
        raise OptionError(f"option {name}={value}: must not be negative")
    return number


def seconds(nonzero: bool = False) -> Kind:
    """``NAME=SECS``: seconds, not negative; with ``nonzero``, more than 0."""
    def parse(name: str, value: str | None) -> float:
        number = _number(name, value, float)
        if nonzero and number == 0:
            raise OptionError(f"option {name}=0: must be more than 0 seconds")
        return number
    return Kind("=SECS", parse, "{:g}".format)


#: ``NAME=N``: a whole number, not negative.
COUNT = Kind("=N", lambda name, value: int(_number(name, value, int)))


def text(metavar: str, noun: str = "value", *, path: bool = False) -> Kind:
    """``NAME=METAVAR``: text that is not empty (``noun`` says what is missing
    when it is); with ``path``, a path, made absolute."""
    def parse(name: str, value: str | None) -> str:
        if not value:
            raise OptionError(f"option {name} needs a {noun}")
        return os.path.abspath(value) if path else value
    return Kind(f"={metavar}", parse)


def _log_level(name: str, value: str | None) -> str:
    if not value or value.upper() not in LOG_LEVELS:
        raise OptionError(f"option {_item(name, value)}: the level is one of "
                          f"{', '.join(LOG_LEVELS)} ({name}=info)")
    return value.upper()


#: ``NAME=LEVEL``: one of ``LOG_LEVELS``, any case.
LOG_LEVEL = Kind("=LEVEL", _log_level)


# ------------------------------------------------------------ the table


@dataclass(frozen=True)
class Option:
    """The ``-o`` option of one ``MountConfig`` field (the field names it).

    ``help`` says what it does, in one paragraph; words in backquotes are
    code (the README keeps the backquotes, ``--help`` drops them).
    ``default`` is the default as ``--help`` and the README show it."""

    kind: Kind
    help: str
    default: str
    #: A flag field this option sets as well.
    implies: str = ""


def option(kind: Kind, help: str, *, default: Any = None,
           factory: Callable[[], Any] | None = None, shown: str = "",
           implies: str = "") -> Any:
    """A ``MountConfig`` field that is a ``-o`` option: its default is ``default``
    (or ``factory()``), shown as ``shown`` or else as ``kind`` shows it."""
    entry = Option(kind, help, shown or kind.show(default), implies)
    if factory is not None:
        return field(default_factory=factory, metadata={"option": entry})
    return field(default=default, metadata={"option": entry})


@dataclass(frozen=True)
class Mount8Option:
    """Options mount(8), ``mount.fuse3`` or systemd may pass, matched by name
    (any value after ``=`` is ignored); ``names`` may hold ``*`` patterns.

    Passed to the kernel mount when ``kernel``, refused with ``refused`` when
    that is set, else accepted and ignored."""

    names: tuple[str, ...]
    help: str
    kernel: bool = False
    refused: str = ""

    def matches(self, name: str) -> bool:
        return any(fnmatchcase(name, pattern) for pattern in self.names)


@dataclass
class MountConfig:
    """A mount's settings: the command line's, then one field per ``-o`` option."""

    source: str
    mountpoint: str
    foreground: bool = False
    domain: str | None = option(
        text("PATH"), shown="the whole bucket",
        help="mount just this domain of an HSDS bucket (e.g. `/home/u/f.h5`); the mount "
             "root is its root group, with its sidecar at `.root.json`. The same as `--domain`")
    allow_other: bool = option(
        FLAG, default=False,
        help="let other users access the mount (non-root users need `user_allow_other` in "
             "`/etc/fuse.conf`)")
    auto_unmount: bool = option(
        FLAG, default=False,
        help="unmount when the daemon ends for any reason, even when killed, so that no "
             "stale mountpoint (\"Transport endpoint is not connected\") is left behind (a "
             "`fusermount3` process watches the daemon)")
    uid: int = option(COUNT, factory=os.getuid, shown="the mounting user",
                      help="owner shown for every file")
    gid: int = option(COUNT, factory=os.getgid, shown="the mounting user's group",
                      help="group shown for every file")
    fsname: str | None = option(text("NAME"), shown="SOURCE",
                                help="name shown in `/proc/mounts`")
    metadata_ttl: float = option(
        seconds(), default=60.0,
        help="how long anything read from storage is served before it is read again: "
             "group and dataset metadata, decoded chunks, the kernel's attributes, entries "
             "and page cache of the mount's files, and cached remote blocks before their "
             "ETag is checked (an HSDS dataset of 1 MiB or more keeps its decoded chunks and "
             "the page cache of its chunk files and .npy while a listing of its chunks, once "
             "a period, shows them unchanged); after it, every change in storage is visible "
             "to reads that start later")
    chunk_cache: int = option(
        size(), default=256 << 20,
        help="memory for decoded chunks, so that a sequential read decodes each chunk once; "
             "chunks being fetched and decoded count against it too, and readahead waits "
             "while they would take more than half of it. A `.npy` read sequentially "
             "crosses a whole chunk row (the chunks a band of whole rows touches); when the "
             "cache cannot hold one, the open file holds the chunk rows it reads apart from "
             f"the cache instead (up to {ROW_BANDS_BYTES >> 20} MiB for all open files, else "
             "each chunk is decoded again per band of rows), and the log says once per "
             "dataset what size would do")
    meta_cache: int = option(
        size(), default=MEMO_BYTES,
        help="memory for what the mount derives from metadata and keeps while it is current: "
             "the sizes of sidecars, `.zarray`, `.zattrs` and `.npy` files, groups' listings, "
             "datasets' chunk lists, rendered xattrs (a walk keeps about 2 KB per dataset "
             "it shows); past it, the least recently used are made again when asked. The "
             "objects' own metadata, and the nodes of entries the kernel holds, are not in it")
    memory_limit: int | None = option(
        size(), shown="the budgets plus 96M",
        help="resident memory the daemon keeps under: while it is over (the model objects "
             "and nodes of what is browsed, listings being made and allocator slack are in no "
             "budget), the block cache, then `meta_cache`, then the chunk cache hold less "
             "than their budgets (down to an eighth, an eighth and a half of them), and get "
             "their room back once it falls. The default is `cache_size` (remote sources), "
             "`chunk_cache`, `meta_cache` and the chunk rows open `.npy` files hold, plus "
             "96M; 0 turns it off")
    readahead: int = option(
        size(), default=1 << 20,
        help="largest read the kernel sends, set on the mount's own bdi when run as root "
             "(0 keeps the kernel's default)")
    cache_size: int = option(
        size(), default=512 << 20,
        help="memory for 1 MiB blocks of remote objects (S3, http(s) refs), validated by "
             "ETag; ranged requests under way count against it too, and readahead is dropped "
             "while they would take more than half of it")
    cache_dir: str | None = option(
        text("DIR", "directory", path=True), shown="none",
        help="also keep remote blocks on disk in DIR, validated by ETag, and the sizes of "
             "views made of one dataset (a table's CSV), validated by its stored chunks, so "
             "they survive a remount (with the counts of their blocks, so a changed chunk "
             "costs a count of its own rows only)")
    disk_cache_size: int = option(
        size(), default=10 << 30,
        help="largest size of `cache_dir`; the cache also always leaves 5% (at least 1 GiB) "
             "of its file system free")
    cache_decoded: bool = option(
        on_off(bare=True), default=False,
        help="with `cache_dir`: also keep the decoded chunks of remote objects (S3, http(s) "
             "refs) there, validated by ETag like the blocks, so a remount serves them with "
             "no decoding; the encoded blocks are kept too, so both take room in "
             "`cache_dir`. Not kept: chunks of local files, inline refs, linked datasets "
             "(`hsload --link`) and LINDI `_EXTERNAL_ARRAY_LINK` arrays")
    timeout: float = option(
        seconds(nonzero=True), default=30.0,
        help="longest time, above 0, that one storage request may take, retries included, "
             "before the reader gets `EIO`")
    max_metadata: int = option(
        size(nonzero=True), default=DEFAULT_MAX_METADATA,
        help="largest metadata object read: an HSDS object's JSON, a reference file's "
             "`.zattrs` or `.zarray`; a larger one is refused before it is read in full and "
             "gives `EIO` for that object alone, with one log line naming it. A reference "
             "file itself may be up to 1G, else the mount is refused")
    endpoint_url: str | None = option(
        text("URL"), shown="AWS",
        help="S3-compatible endpoint, e.g. `http://127.0.0.1:9000` (path-style addressing "
             "is used). The same as `--endpoint-url`")
    region: str | None = option(
        text("NAME"), shown="the AWS config's, else us-east-1",
        help="region of the S3 bucket. The same as `--region`")
    profile: str | None = option(
        text("NAME"), shown="AWS_PROFILE, else default",
        help="profile of `~/.aws/credentials` and `~/.aws/config` to use. The same as "
             "`--profile`")
    anon: bool = option(
        FLAG, default=False,
        help="send unsigned S3 requests (public buckets); no credentials needed. The same "
             "as `--anon`")
    endpoint: str | None = option(
        text("URL"), shown="none",
        help="an HSDS service endpoint, e.g. `https://hsds.example.org`: SOURCE is then a "
             "folder or domain path on it (`/`, `/home/u/`, `/home/u/f.h5`), read over its "
             "REST API with the server's ACLs for the mount's user. An http(s) SOURCE with no "
             "path is an endpoint already")
    hs_username: str | None = option(
        text("NAME"), shown="HS_USERNAME, else `~/.hscfg`'s hs_username",
        help="HSDS service user the mount authenticates as, with `hs_password_file`")
    hs_password_file: str | None = option(
        text("FILE", "file", path=True), shown="HS_PASSWORD, else `~/.hscfg`'s hs_password",
        help="file whose first line is the HSDS service password (never logged or shown)")
    hs_api_key_file: str | None = option(
        text("FILE", "file", path=True), shown="HS_API_KEY, else `~/.hscfg`'s hs_api_key",
        help="file whose first line is an HSDS API key, sent as a bearer token instead of "
             "the user name and password")
    hs_summaries: bool = option(
        FLAG, default=False,
        help="HSDS service: read a scanned domain's metadata from the server's domain "
             "summary in one request, as h5pyd does, instead of one request per object. "
             "The summary is as old as the server's last scan of the domain: objects written "
             "since may show as they were, or not at all, until HSDS scans it again "
             "(`scan_wait_time` after a write, 60 s by default); times are the scan's. "
             "Parsing a summary takes about 14K of memory per object, uncharged")
    allow_local_refs: bool = option(
        FLAG, default=False,
        help="let a reference file fetched over http(s) point at local files (else such "
             "refs give `EACCES`)")
    hsds_acls: bool = option(
        FLAG, default=False,
        help="enforce each HSDS domain's and folder's `.domain.json` ACLs per local user: a "
             "user maps to the HSDS user of the same name, else the ACL's `default` entry "
             "applies; a domain they may not read shows mode 0 and gives `EACCES` (with "
             "`allow_other` one mount serves several users)")
    acl_map: str | None = option(
        text("FILE", "file", path=True), shown="none", implies="hsds_acls",
        help="like `hsds_acls`, mapping local users to HSDS users by the "
             "`LOCAL_USER HSDS_USER` lines of FILE (e.g. `root admin`)")
    #: The kernel flags of ``MOUNT8_OPTIONS`` given, passed on to the mount.
    kernel_options: list[str] = field(default_factory=list)
    log_level: str = option(
        LOG_LEVEL, default="WARNING",
        help=f"log verbosity: {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}, in any "
             "case. The same as `--log-level`")
    log_file: str | None = option(
        text("PATH", "path", path=True), shown="syslog, or stderr with -f",
        help="log to PATH (with `-f`, to stderr as well). The same as `--log-file`")
    stats_file: str | None = option(
        text("PATH", "path", path=True), shown="none",
        help="on SIGUSR1 and at unmount, write the daemon's figures to PATH: the document "
             "of `MOUNTPOINT/.h5mount/stats.json`")
    h5view: bool = option(
        on_off(), default=True,
        help="show each domain as one HDF5 file beside its directory, `D.h5` "
             "(`sample.h5` gives `sample.h5.h5`; `.root.h5` for a mount of one file), which "
             "h5dump, h5py and netCDF readers open")
    h5view_inline: int = option(
        size(), default=64 << 20,
        help="most bytes of variable-length and reference data one `D.h5` embeds; a "
             "dataset past it is left out and named in the root attribute "
             "`h5mount_left_out`")
    h5view_objects: int | None = option(
        COUNT, shown="no cap",
        help="most objects one `D.h5` holds: a larger domain gets the first N found, "
             "breadth first, and the root attribute `h5mount_left_out` says so. Memory "
             "bounds a file without it: planning stops where `memory_limit` would not "
             "hold building more, about 2K an object besides the domain's metadata")

    def fuse_options(self) -> set[str]:
        """Options for ``pyfuse3.init``: always read-only, with kernel permission checks.
        ``fsname``, which ``/proc/mounts`` shows to every user, has its secrets masked."""
        opts = {"ro", "default_permissions", "subtype=h5mount",
                f"fsname={logsafe.redact(self.fsname or self.source)}"}
        if self.allow_other:
            opts.add("allow_other")
        if self.auto_unmount:
            opts.add("auto_unmount")
        opts.update(self.kernel_options)
        return opts


#: The ``-o`` options of ``MountConfig``, by name, in field order.
FIELD_OPTIONS: dict[str, Option] = {f.name: f.metadata["option"] for f in fields(MountConfig)
                                    if "option" in f.metadata}

#: The options of mount(8), ``mount.fuse3`` and systemd.
MOUNT8_OPTIONS = (
    Mount8Option(("ro",), "accepted; the mount is always read-only"),
    Mount8Option(
        ("rw",), "refused; mount(8) adds rw when the options lack ro, so an fstab line or "
                 "`mount -o` must say ro",
        refused="h5mount mounts are read-only; option rw is not supported (mount(8) adds rw "
                "unless the options say ro: add ro)"),
    # libfuse 3.14 takes these.
    Mount8Option(
        ("nosuid", "nodev", "noexec", "noatime", "suid", "dev", "exec", "atime", "sync",
         "async", "dirsync"),
        "passed to the kernel (`mount.fuse3` adds dev,suid unless nodev,nosuid are given; "
        "no file here is a device or set-user-ID)", kernel=True),
    # libfuse 3.14 refuses these: nothing a read-only FUSE mount needs.
    Mount8Option(
        ("relatime", "norelatime", "strictatime", "nostrictatime", "diratime", "nodiratime",
         "lazytime", "nolazytime", "mand", "nomand", "silent", "loud", "iversion",
         "noiversion"),
        "kernel flags mount(8) may pass on (access times, mandatory locks, i_version, "
        "kernel messages); accepted and ignored"),
    # user=NAME too: mount(8) passes it for a mount made by a user.
    Mount8Option(
        ("defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser", "owner",
         "group", "comment", "x-*", "X-*"),
        "fstab and systemd options, for mount(8) (also with a value: `user=NAME`, "
        "`comment=TEXT`, `x-systemd.automount`...); accepted and ignored"),
)


def help_entries() -> list[tuple[tuple[str, ...], str]]:
    """Every option as ``--help`` and the README list it, in order: how fstab
    spells it (several names for a ``Mount8Option``), and what it does (with
    its default, for a ``MountConfig`` field)."""
    entries = [((f"{name}{opt.kind.spelt}",), f"{opt.help} (default: {opt.default})")
               for name, opt in FIELD_OPTIONS.items()]
    entries += [(mount8.names, mount8.help) for mount8 in MOUNT8_OPTIONS]
    return entries


def apply_options(config: MountConfig, option_strings: list[str]) -> None:
    """Apply every ``-o`` string (comma-separated ``name`` or ``name=value``)."""
    for option_string in option_strings:
        for item in filter(None, (s.strip() for s in option_string.split(","))):
            name, eq, value = item.partition("=")
            _apply(config, name, value if eq else None)
    if config.cache_decoded and config.cache_dir is None:
        raise OptionError("option cache_decoded needs cache_dir (cache_dir=DIR,cache_decoded)")


def _apply(config: MountConfig, name: str, value: str | None) -> None:
    """Apply one option, ``value`` being None when it has no ``=``."""
    opt = FIELD_OPTIONS.get(name)
    if opt is not None:
        setattr(config, name, opt.kind.parse(name, value))
        if opt.implies:
            setattr(config, opt.implies, True)
        return
    for mount8 in MOUNT8_OPTIONS:
        if mount8.matches(name):
            if mount8.refused:
                raise OptionError(mount8.refused)
            if mount8.kernel:
                config.kernel_options.append(name)
            return
    raise OptionError(f"unknown option: {_item(name, value)}")
