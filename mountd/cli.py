"""The ``h5mount`` command line: parses arguments and hands over to the daemon.

Owns the command line's flags and ``--help``, whose ``-o`` part is made from
the table of options in ``mountd.config``. No I/O beyond printing usage
errors; no shared state; every check of the mountpoint and source happens in
``mountd.daemon`` so that it is reported the same way in every mode.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from mountd import __version__, daemon, statscli, warm
from mountd.config import (
    FIELD_OPTIONS,
    LOG_LEVELS,
    MountConfig,
    OptionError,
    apply_options,
    help_entries,
)

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
    read local files unless -o allow_local_refs is given (EACCES);
  - an HSDS service endpoint, http(s)://HOST[:PORT] with no path (or any
    folder or domain path on it, such as /home/u/, with -o endpoint=URL),
    read through its REST API as the user -o hs_username= and
    hs_password_file=, HS_USERNAME/HS_PASSWORD/HS_API_KEY or ~/.hscfg
    name; the server's ACLs decide what that user reads (EACCES). A dataset
    directory lists every chunk of its grid there, unstored ones reading as
    the fill value.
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

#: What ``--help`` says before and after the table of ``-o`` options.
OPTIONS_INTRO = """\
mount options (-o, comma separated, mount(8) style; with them an fstab line
can say everything; a command-line flag that says the same wins):"""
EXIT_STATUS = """\
exit status: 0 once the mount is live (or, with -f, after a clean unmount);
1 if it cannot start (one line on stderr says why); 2 for usage errors."""

#: Where the text of each ``-o`` option starts in ``--help``, and the width.
HELP_INDENT = 23
HELP_WIDTH = 79


def options_help() -> str:
    """The ``-o`` part of ``--help``: every option of ``mountd.config``'s table,
    with its default, then the exit status."""
    lines = [OPTIONS_INTRO]
    indent = " " * HELP_INDENT
    for spellings, text in help_entries():
        head = ", ".join(spellings)
        if len(head) + 3 <= HELP_INDENT:
            head = f"  {head}".ljust(HELP_INDENT)
        else:
            lines += textwrap.wrap(head, HELP_WIDTH, initial_indent="  ",
                                   subsequent_indent="  ", break_on_hyphens=False)
            head = indent
        lines.append(textwrap.fill(text.replace("`", ""), HELP_WIDTH, initial_indent=head,
                                   subsequent_indent=indent, break_on_hyphens=False,
                                   break_long_words=False))
    return "\n".join([*lines, "", EXIT_STATUS, ""])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="h5mount", description=DESCRIPTION, epilog=options_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="SOURCE",
                        help="HSDS bucket directory, s3://BUCKET[/PREFIX], an HSDS service "
                             "endpoint http(s)://HOST[:PORT], or a LINDI/kerchunk "
                             "reference file (path or http(s) URL)")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing empty directory")
    parser.add_argument("-f", "--foreground", action="store_true",
                        help="stay in the foreground and log to stderr")
    parser.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS",
                        help="mount options, see below")
    parser.add_argument("--domain", metavar="PATH",
                        help="HSDS buckets and services only: mount just this domain "
                             "(e.g. /home/u/f.h5); "
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
    # No default: only a given --log-level beats -o log_level; MountConfig holds it.
    parser.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper,
                        help=f"log verbosity (default: {FIELD_OPTIONS['log_level'].default})")
    parser.add_argument("--log-file", metavar="PATH",
                        help="also log to this file (default in the background: syslog)")
    parser.add_argument("--version", action="version", version=f"h5mount {__version__}")
    return parser


def parse_args(argv: list[str]) -> MountConfig:
    """The mount's configuration: ``-o`` options first, then the flags, which win."""
    parser = build_parser()
    args = parser.parse_args(argv)
    config = MountConfig(source=args.source, mountpoint=os.path.abspath(args.mountpoint),
                         foreground=args.foreground)
    try:
        apply_options(config, args.options)
    except OptionError as exc:
        parser.error(str(exc))
    # A local path is made absolute (the daemon leaves its directory); a path on an
    # HSDS service (-o endpoint) is the service's own.
    if "://" not in config.source and config.endpoint is None:
        config.source = os.path.abspath(config.source)
    for name in ("endpoint_url", "region", "profile", "domain", "log_level"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    if args.log_file:
        config.log_file = os.path.abspath(args.log_file)
    config.anon = config.anon or args.anon
    if not config.source.startswith("s3://") and (config.endpoint_url or config.region
                                                   or config.profile or config.anon):
        parser.error("--endpoint-url, --region, --profile and --anon apply to s3:// sources")
    if config.endpoint is not None and "://" in config.source:
        parser.error("with -o endpoint=URL, SOURCE is a folder or domain path on that HSDS "
                     "service (such as / or /home/user/), not a URL")
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
