"""The ``h5mount`` command line: parses arguments and hands over to the daemon.

Owns the user-facing option names and help text. No I/O beyond printing
usage errors; every check of the mountpoint and source happens in
``mountd.daemon`` so that it is reported the same way in every mode.
"""

from __future__ import annotations

import argparse
import os
import sys

from mountd import __version__, daemon, statscli, warm
from mountd.config import MountConfig, OptionError, apply_options

DESCRIPTION = """\
Mount HDF5 data read-only as a POSIX tree.

SOURCE is one of
  - an HSDS bucket in a local directory (the one that contains db/ and the
    domain folders, i.e. ROOT_DIR/BUCKET as written by
    `hsds --root_dir ROOT_DIR`);
  - an HSDS bucket at s3://BUCKET[/PREFIX] on AWS S3 or any S3-compatible
    store (see --endpoint-url). Credentials come from the usual AWS chain:
    the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment variables,
    --profile or AWS_PROFILE, ~/.aws/credentials and ~/.aws/config; --anon
    for public buckets;
  - a LINDI or kerchunk reference file describing one HDF5 file: a path or
    http(s):// URL of a .lindi.json or kerchunk .json file, a .lindi.tar, or
    a .lindi.d directory. The mount root is the file's root group. Its refs
    may point into local files (read from disk) or http(s) URLs (read with
    HTTP Range requests). A reference file fetched over http(s) may not
    read local files unless -o allow_local_refs is given (EACCES).
Remote reads (S3, http) go through a block cache (-o cache_size, and
-o cache_dir for a persistent one) with sequential readahead, and are
retried on throttling, 5xx and resets for at most -o timeout seconds.

Groups become directories, datasets become directories of decoded chunk
files, every object has a P.json sidecar, every dataset of fixed-size type
a P.npy with the whole array, soft links become symlinks and attributes
become user.h5.* xattrs. Group and dataset directories also hold Zarr v2
metadata (.zgroup, .zarray, .zattrs), so zarr and xarray read the mount.
The daemon goes to the background once the mount is live; stop it with
`fusermount3 -u MOUNTPOINT`, SIGINT or SIGTERM. SIGHUP reads the AWS
credential files again (S3) and drops the cached metadata, so that changes
in storage show at once; SIGUSR1 writes the
figures of -o stats_file. Under systemd (NOTIFY_SOCKET) it reports READY=1,
STATUS=, WATCHDOG=1 (with WatchdogSec=) and STOPPING=1.

`h5mount warm PATH...` reads the files under PATH (inside a mount) so that
the mount's caches hold them; see `h5mount warm --help`.

Live figures are in the hidden directory MOUNTPOINT/.h5mount/ (in no
listing, open by name): stats.json (requests, errors, latencies, storage
and cache figures), config.json (the effective options, secrets redacted)
and metrics (the same counters in the Prometheus text format).
`h5mount stats MOUNTPOINT [--watch] [--json]` shows them as a table.
"""

OPTIONS_HELP = """\
mount options (-o, comma separated, mount(8) style; with them an fstab line
can say everything; a command-line flag that says the same wins):
  ro                   accepted; the mount is always read-only. rw is refused,
                       and mount(8) adds rw when the options lack ro, so an
                       fstab line or mount -o must say ro
  allow_other          let other users access the mount (non-root users need
                       user_allow_other in /etc/fuse.conf)
  auto_unmount         unmount when the daemon ends for any reason, even
                       when killed, so no stale mountpoint ("Transport
                       endpoint is not connected") is left behind (a
                       fusermount3 process watches the daemon)
  uid=N, gid=N         owner shown for every file (default: the mounting user)
  fsname=NAME          name shown in /proc/mounts (default: SOURCE)
  metadata_ttl=SECS    how long metadata is cached, and the kernel's
                       attribute/entry timeout (default: 60)
  chunk_cache=SIZE     memory for decoded chunks, e.g. 512M (default: 256M)
  readahead=SIZE       largest read the kernel sends, set on the mount's
                       bdi when run as root (default: 1M; 0 keeps the
                       kernel's default)
  cache_size=SIZE      memory for blocks of remote objects (default: 512M)
  cache_dir=DIR        also keep remote blocks on disk in DIR, validated by
                       ETag, so they survive a remount (default: none)
  disk_cache_size=SIZE largest size of cache_dir (default: 10G); the cache
                       also leaves free space on its file system
  cache_decoded        with cache_dir: also keep the decoded chunks of
                       remote objects (S3, http refs) there, validated by
                       ETag like the blocks, so a remount serves them with
                       no decoding; the encoded blocks are kept too, so
                       both take room in cache_dir. Not kept: chunks of
                       local files, inline refs, linked datasets (hsload
                       --link) and LINDI _EXTERNAL_ARRAY_LINK arrays
                       (cache_decoded=on|off; default: off)
  timeout=SECS         longest time one storage request may take, retries
                       included, before the reader gets EIO (default: 30)
  max_metadata=SIZE    largest metadata object read: an HSDS object's JSON,
                       a reference file's .zattrs or .zarray; a larger one
                       gives EIO for that object, logged (default: 64M). A
                       reference file itself may be up to 1G
  stats_file=PATH      on SIGUSR1 and at unmount, write the daemon's figures
                       to PATH: the document of MOUNTPOINT/.h5mount/stats.json
                       (default: none)
  h5view=on|off        show each domain as one HDF5 file beside its
                       directory, D.h5 (sample.h5 gives sample.h5.h5;
                       .root.h5 for a mount of one file), which h5dump,
                       h5py and netCDF readers open (default: on)
  h5view_inline=SIZE   most bytes of variable-length and reference data
                       one D.h5 embeds; a dataset past it is left out and
                       named in the root attribute h5mount_left_out
                       (default: 64M)
  h5view_objects=N     most objects one D.h5 holds: a larger domain gets
                       the first N found, breadth first, and the root
                       attribute h5mount_left_out says so; building takes
                       about 15K of memory per object (default: 20000)
  endpoint_url=URL, region=NAME, profile=NAME, anon
                       the same as the S3 options above, for fstab
  domain=PATH          the same as --domain
  log_level=LEVEL      the same as --log-level (DEBUG, INFO, WARNING, ERROR;
                       any case)
  log_file=PATH        the same as --log-file
  allow_local_refs     let a reference file fetched over http(s) point at
                       local files (refused with EACCES by default)
  hsds_acls            enforce each HSDS domain's and folder's ACLs per
                       local user: a user maps to the HSDS user of the same
                       name, else the ACL's "default" entry applies; a
                       domain they may not read shows mode 0 and gives
                       EACCES (use with allow_other to share a mount)
  acl_map=FILE         like hsds_acls, mapping local users to HSDS users by
                       the "LOCAL_USER HSDS_USER" lines of FILE
  nosuid,nodev,noexec,noatime,suid,dev,exec,atime,sync,async,dirsync
                       passed to the kernel (mount.fuse3 adds dev,suid unless
                       nodev,nosuid are given; no file here is a device or
                       set-user-ID)
  relatime,strictatime,nodiratime,lazytime,mand,silent,iversion
                       and their opposites: kernel flags mount(8) may pass
                       on; accepted and ignored
  defaults,auto,noauto,nofail,_netdev,user,users,nouser,owner,group,
  comment=...,x-*,X-*  fstab and systemd options; accepted and ignored

exit status: 0 once the mount is live (or, with -f, after a clean unmount);
1 if it cannot start (one line on stderr says why); 2 for usage errors.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="h5mount", description=DESCRIPTION, epilog=OPTIONS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="SOURCE",
                        help="HSDS bucket directory, s3://BUCKET[/PREFIX], or a LINDI/kerchunk "
                             "reference file (path or http(s) URL)")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing empty directory")
    parser.add_argument("-f", "--foreground", action="store_true",
                        help="stay in the foreground and log to stderr")
    parser.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS",
                        help="mount options, see below")
    parser.add_argument("--domain", metavar="PATH",
                        help="HSDS buckets only: mount just this domain (e.g. /home/u/f.h5); "
                             "the mount root is its root group, with its sidecar at .root.json")
    s3 = parser.add_argument_group("S3 sources")
    s3.add_argument("--endpoint-url", metavar="URL",
                    help="S3-compatible endpoint, e.g. http://127.0.0.1:9000 (path-style "
                         "addressing is used); default: AWS")
    s3.add_argument("--region", help="region of the bucket (default: from the AWS config, "
                                     "else us-east-1)")
    s3.add_argument("--profile", help="profile of ~/.aws/credentials and ~/.aws/config to use")
    s3.add_argument("--anon", action="store_true",
                    help="send unsigned requests (public buckets); no credentials needed")
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        type=str.upper, help="log verbosity (default: WARNING)")
    parser.add_argument("--log-file", metavar="PATH",
                        help="also log to this file (default in the background: syslog)")
    parser.add_argument("--version", action="version", version=f"h5mount {__version__}")
    return parser


def parse_args(argv: list[str]) -> MountConfig:
    """The mount's configuration: ``-o`` options first, then the flags, which win."""
    parser = build_parser()
    # None unless --log-level is given, so that only a given one beats -o
    # log_level; MountConfig holds the default.
    parser.set_defaults(log_level=None)
    args = parser.parse_args(argv)
    config = MountConfig(
        source=args.source if "://" in args.source else os.path.abspath(args.source),
        mountpoint=os.path.abspath(args.mountpoint),
        foreground=args.foreground,
    )
    try:
        apply_options(config, args.options)
    except OptionError as exc:
        parser.error(str(exc))
    for name in ("endpoint_url", "region", "profile", "domain", "log_level"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    if args.log_file:
        config.log_file = os.path.abspath(args.log_file)
    config.anon = config.anon or args.anon
    if not config.source.startswith("s3://") and (config.endpoint_url or config.region
                                                   or config.profile or config.anon):
        parser.error("--endpoint-url, --region, --profile and --anon apply to s3:// sources")
    return config


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["warm"]:
        return warm.main(args[1:])
    if args[:1] == ["stats"]:
        return statscli.main(args[1:])
    config = parse_args(args)
    return daemon.run(config)


if __name__ == "__main__":
    sys.exit(main())
