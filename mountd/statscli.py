"""``h5mount stats MOUNTPOINT``: a mount's live figures, as a table or as JSON.

Owns the command that reads ``MOUNTPOINT/.h5mount/stats.json`` (the
daemon's control directory, ``mountd.control``) and shows it: a table for
people, ``--watch`` to refresh it in place, ``--json`` for scripts (with
``--watch``, one JSON document per line). It only reads that file, so any
user who can read the mount can run it, and no daemon state is touched.

Concurrency: none; a plain blocking loop in the calling process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from mountd.control import CONTROL_DIR

#: ANSI: cursor home, clear the screen.
CLEAR = "\x1b[H\x1b[2J"


class StatsError(Exception):
    """The figures cannot be read; the message is the one line shown."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="h5mount stats",
        description="Show the live figures of an h5mount mount: FUSE requests, errors, "
                    "latencies, storage requests and bytes, cache hits, misses and sizes, "
                    f"memory. They are read from MOUNTPOINT/{CONTROL_DIR}/stats.json, which "
                    "the daemon renders at most once a second.")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="where h5mount is mounted")
    parser.add_argument("--json", action="store_true",
                        help="print the JSON document instead of a table (one line per "
                             "refresh with --watch)")
    parser.add_argument("--watch", action="store_true",
                        help="refresh until interrupted (Ctrl-C)")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between refreshes with --watch (default: 2)")
    return parser


def read(mountpoint: str) -> dict[str, Any]:
    """The stats document of the mount at ``mountpoint``."""
    path = os.path.join(mountpoint, CONTROL_DIR, "stats.json")
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise StatsError(f"{mountpoint} is not an h5mount mount (no {path})") from None
    except OSError as exc:
        raise StatsError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise StatsError(f"{path} is not a statistics document: {exc}") from None
    if not isinstance(doc, dict) or "requests" not in doc:
        raise StatsError(f"{path} is not a statistics document")
    return doc


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s"


def _latency(figures: dict[str, float]) -> str:
    if not figures.get("count"):
        return "-"
    return (f"p50 {figures['p50_ms']:.2f}  p90 {figures['p90_ms']:.2f}  "
            f"p99 {figures['p99_ms']:.2f}  max {figures['max_ms']:.2f} ms")


def _table(rows: list[list[str]]) -> Iterator[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:],
                                                                          strict=True)]
        yield "  " + "  ".join(cells).rstrip()


def render(doc: dict[str, Any]) -> str:
    """The document as a table for a terminal."""
    about = doc.get("h5mount", {})
    lines = [f"h5mount {about.get('version', '?')} (pid {about.get('pid', '?')}): "
             f"{about.get('source', '?')} on {about.get('mountpoint', '?')}, "
             f"up {_duration(about.get('uptime_seconds', 0))}"]
    requests = doc["requests"]
    total = sum(requests.values())
    kinds = ", ".join(f"{name} {n:,}" for name, n in
                      sorted(requests.items(), key=lambda kv: -kv[1]))
    lines += ["", f"FUSE requests: {total:,}" + (f" ({kinds})" if kinds else "")]
    errors = doc.get("errors", {})
    lines.append("errors: " + (", ".join(f"{name} {n:,}" for name, n in errors.items())
                               if errors else "none"))
    for kind, figures in doc.get("latency", {}).items():
        lines.append(f"{kind} latency: {_latency(figures)}")
    opened = doc.get("open", {})
    lines.append("open: " + ", ".join(f"{name.replace('_', ' ')} {n:,}"
                                      for name, n in opened.items()))
    storage = doc.get("storage", {})
    rows = [["storage", "requests", "bytes", "retries", "failures", "latency"]]
    for kind, s in storage.items():
        if s["requests"]:
            rows.append([kind, f"{s['requests']:,}", _size(s["bytes"]), f"{s['retries']:,}",
                         f"{s['failures']:,}", _latency(s["latency"])])
    if len(rows) > 1:
        lines += ["", *_table(rows)]
    rows = [["cache", "hits", "misses", "hit rate", "evictions", "size", "budget"]]
    for name, c in doc.get("caches", {}).items():
        asked = c.get("hits", 0) + c.get("misses", 0)
        rate = f"{100 * c['hits'] / asked:.1f}%" if asked else "-"
        size = _size(c["bytes"]) if "bytes" in c else f"{c.get('entries', 0):,} entries"
        budget = (_size(c["budget_bytes"]) if "budget_bytes" in c
                  else f"{c.get('max_entries', 0):,} entries")
        rows.append([name, f"{c.get('hits', 0):,}", f"{c.get('misses', 0):,}", rate,
                     f"{c.get('evictions', 0):,}", size, budget])
    lines += ["", *_table(rows)]
    memory = doc.get("memory", {})
    lines += ["", "memory: " + ", ".join(f"{name.removesuffix('_bytes').replace('_', ' ')} "
                                         f"{_size(n)}" for name, n in memory.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.interval <= 0:
        print("h5mount stats: --interval must be more than 0 seconds", file=sys.stderr)
        return 2
    try:
        while True:
            doc = read(args.mountpoint)
            if args.json:
                text = json.dumps(doc, indent=None if args.watch else 2) + "\n"
            else:
                text = (CLEAR if args.watch and sys.stdout.isatty() else "") + render(doc)
            sys.stdout.write(text)
            sys.stdout.flush()
            if not args.watch:
                return 0
            time.sleep(args.interval)
    except StatsError as exc:
        print(f"h5mount stats: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
