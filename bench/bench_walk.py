"""Benchmark: whole-domain walks (``find``, ``ls -lR``) through h5mount, against the FUSE floor.

This module owns the driver of the whole-domain walk benchmark and its
section of ``docs/benchmarks.md``. Its data (``bench.walkdata``) are domains
of small datasets (int32, shape (4,), one attribute; every 10th with a stored
gzip chunk) that a real HSDS has scanned, so each has a current
``db/<root>/.info.json`` and ``.summary.json``. Every h5mount case is one
command on a fresh mount with the page cache dropped; the groups
(``--cases``) are:

- ``local``: ``find D`` and ``ls -lR D`` of ``walk10k.h5`` (10,000 datasets)
  and ``walk2k.h5`` (2,000), local-disk bucket;
- ``memtree``: the same walks over ``bench.memtree``, a bare pyfuse3
  filesystem serving from memory a snapshot of a warm h5mount mount of the
  same domain (the same directories, names, sizes, modes and symlinks), the
  first walk on a fresh peer mount, page cache dropped;
- ``after``: the same walks of both domains after writes the scan has not
  seen (a new attribute, a new dataset, a changed shape; made through HSDS's
  REST API on a scratch copy of the domains, with HSDS's background scan
  held off), each change then checked through the mount;
- ``big``: the same walks of ``walk100k.h5`` (100,000 datasets), with the
  daemon's peak RSS;
- ``visit``: h5pyd ``visititems`` of ``walk10k.h5`` through a freshly
  started real HSDS (POSIX storage, the same bucket), page cache dropped;
- ``folders``: ``ls -l`` of ``folder20/`` (20 domains of 1,000 datasets;
  it stats every ``D.h5`` and ``D.json``) and of ``/home/admin/`` (which
  holds ``walk10k.h5``, ``walk100k.h5``, ``walk2k.h5`` and ``folder20/``),
  each with ``D.h5`` views (the default) and with ``-o h5view=off``;
- ``h5open``: h5py's first open of walk10k.h5's ``D.h5`` (a process of its
  own; the ``stat``, the plan and the build of the file included), against
  h5py making the same skeleton in memory (``bench.skeleton_peer``), and
  ``h5ls -r`` of the view (metadata only: its storage requests show whether
  reading metadata reads elements too);
- ``bigview``: h5py's first open of walk100k.h5's ``D.h5``, with the
  daemon's peak RSS, then (outside the timing) how many of its objects the
  file holds and what it leaves out; again with ``-o memory_limit=`` set
  to ``TIGHT_LIMIT``, where the file holds fewer;
- ``s3`` (unless ``--no-s3``): a moto S3 server on loopback, ``walk2k.h5``
  written to it and scanned by a real HSDS running on moto (moto keeps
  everything in memory, so this is redone in every run, about 3 minutes),
  then the walks of it through ``h5mount s3://walk`` and ``h5ls -r`` of its
  ``D.h5``, and the walks again after the same writes.

For every h5mount case it records the wall time, the daemon's CPU seconds
and peak RSS (VmHWM), the FUSE requests and the storage requests the command
caused (from the daemon's stats document: ``-o stats_file``, written on
SIGUSR1), and storage requests per object of what was listed. A command
slower than ``--timeout`` is killed and recorded as a lower bound; the
runs after it of that case are skipped. The targets are ratios within the
run: the walks of walk10k at most 2x memtree; on S3 at most 1.3x the local
mount of the same domain (3x after the writes); at most 0.01 storage
requests per object with a current summary; walk100k at most 11x walk10k
with a peak RSS within the cache budgets (`chunk_cache` and `meta_cache`, from
the mount options) + 150 MiB;
the ratios to ``visititems`` and to ``bench.skeleton_peer`` are reported only.

Everything runs sequentially in the driver's one thread; every mount is
unmounted with ``fusermount3 -u`` and every server it starts (h5mount
daemons, ``bench.memtree``, HSDS, moto; all on loopback) is stopped when its
measurement ends, also on errors, Ctrl-C and SIGTERM.

The first run writes the local bucket (``bench.walkdata``, cached in
``/var/tmp/h5mount-bench/walk``) and has a real HSDS scan every domain: about
4 minutes. A run of every group with ``--repeat 1`` then takes about 40
minutes while the walks of walk100k hit the timeout, far less once they do
not. Run from the repository root, as root (for drop_caches)::

    .venv/bin/python -m bench.bench_walk [--cases local,memtree] [--repeat 1] \\
        [--no-s3] [--no-doc]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py

from bench import bench_npy, bench_s3, memtree, s3data, walkdata
from bench.bench_meta import MAX_OTHER, CommandTimeout, MetaCase, daemon_figures, timed_command
from bench.bench_npy import BenchError, CpuWatch, drop_caches_noted
from bench.s3report import machine_facts, table
from mountd.config import MountConfig, apply_options
from tests.hsds_server import HsdsServer
from tests.moto_server import MotoServer

log = logging.getLogger("bench.bench_walk")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DOC = REPO / "docs" / "benchmarks.md"
SECTION_START = ("<!-- bench_walk:start (generated by bench/bench_walk.py; edits are "
                 "overwritten) -->")
SECTION_END = "<!-- bench_walk:end -->"
DEFAULT_TIMEOUT = 600.0
H5MOUNT_DIR = "h5mount"
MEMTREE_DIR = "memtree"
#: Options of every S3 mount (``cache_size`` is the block cache of remote reads).
S3_OPTIONS = bench_s3.DEFAULT_OPTIONS
RSS_SLACK_MIB = 150.0
#: ``-o memory_limit`` of the second ``bigview`` case: below what walk100k's
#: whole ``D.h5`` takes to build.
TIGHT_LIMIT = "400M"
MAX_STORAGE_PER_OBJECT = 0.01
MIB = float(1 << 20)
#: The walks of a domain: case key suffix and command.
WALKS = {"find": ("find",), "lsr": ("ls", "-lR")}
HOME = "/home/admin/"
QUIET_LOGGERS = (*bench_s3.QUIET_LOGGERS, "httpx")


# ---------------------------------------------------------------------- results


@dataclass
class WalkCase(MetaCase):
    """A timed command: ``MetaCase``'s runs, plus per run the storage requests it
    caused, the objects of what it listed, and (after writes) what it did not show."""

    objects: int = 0
    storage: list[int] = field(default_factory=list)
    #: FUSE requests by operation and storage requests by store, of the last run.
    by_op: dict[str, int] = field(default_factory=dict)
    by_store: dict[str, int] = field(default_factory=dict)
    #: The writes a mount did not show; None when not checked.
    shown: list[str] | None = None
    #: What a ``D.h5`` view left out of its domain; None when not checked.
    missing: list[str] | None = None

    @property
    def per_object(self) -> float | None:
        """Median storage requests per object; None without counts."""
        if not self.storage or not self.objects:
            return None
        return statistics.median(self.storage) / self.objects


@dataclass(frozen=True)
class Target:
    """One row of the targets table.

    ``ratio``: median seconds of ``case`` over ``peer``'s, at most ``maximum``;
    ``per_object``: storage requests per object of ``case``; ``rss``: the
    daemon's peak RSS during ``case`` within the cache budgets plus
    ``RSS_SLACK_MIB``; ``shown``: every write shown; ``whole``: a ``D.h5`` view
    leaves nothing out. ``maximum`` None: reported only.
    """

    label: str
    case: str
    kind: str = "ratio"
    peer: str = ""
    maximum: float | None = None


def _walk_cases(tag: str, label: str, what: str, objects: int) -> list[WalkCase]:
    return [WalkCase(f"{tag}_find", f"{label} find", f"`find` of {what}", objects=objects),
            WalkCase(f"{tag}_lsr", f"{label} ls -lR", f"`ls -lR` of {what}", objects=objects)]


def _objects(domain: str, extra: int = 0) -> int:
    return walkdata.LINKS[domain] + 1 + extra


def new_cases() -> dict[str, WalkCase]:
    """The cases of one run, in report order."""
    fresh = "fresh h5mount, page cache dropped"
    peer = "fresh `bench.memtree` mount of a snapshot of a warm h5mount mount of it, page cache "
    folder_objects = sum(_objects(d) for d in walkdata.LINKS if d.startswith(walkdata.FOLDER))
    home_objects = sum(_objects(d) for d in (walkdata.WALK10K, walkdata.WALK100K,
                                             walkdata.WALK2K))
    cases = [
        *_walk_cases("l10k", "walk10k local", f"walk10k.h5 (10,000 datasets), {fresh}",
                     _objects(walkdata.WALK10K)),
        *_walk_cases("l2k", "walk2k local", f"walk2k.h5 (2,000 datasets), {fresh}",
                     _objects(walkdata.WALK2K)),
        *_walk_cases("m10k", "memtree 10k", f"walk10k.h5 over a {peer}dropped",
                     _objects(walkdata.WALK10K)),
        *_walk_cases("m2k", "memtree 2k", f"walk2k.h5 over a {peer}dropped",
                     _objects(walkdata.WALK2K)),
        *_walk_cases("a10k", "walk10k after writes", "walk10k.h5 after writes the scan has "
                     f"not seen (scratch copy), {fresh}", _objects(walkdata.WALK10K, 1)),
        *_walk_cases("a2k", "walk2k after writes", f"walk2k.h5 after the same writes, {fresh}",
                     _objects(walkdata.WALK2K, 1)),
        *_walk_cases("l100k", "walk100k local", f"walk100k.h5 (100,000 datasets), {fresh}",
                     _objects(walkdata.WALK100K)),
        WalkCase("visit", "h5pyd visititems", "h5pyd `visititems` of walk10k.h5 through a "
                 "freshly started real HSDS (POSIX, the same bucket), page cache dropped",
                 objects=_objects(walkdata.WALK10K)),
        WalkCase("f20_on", "ls -l folder20", "`ls -l folder20/` (20 domains of 1,000 datasets: "
                 f"stats every `D.h5` and `D.json`), {fresh}", objects=folder_objects),
        WalkCase("f20_off", "ls -l folder20 h5view=off", "the same with `-o h5view=off`",
                 objects=folder_objects),
        WalkCase("home_on", "ls -l home", "`ls -l /home/admin/` (the `D.h5` and `D.json` of "
                 f"walk10k, walk100k and walk2k, and folder20/), {fresh}",
                 objects=home_objects),
        WalkCase("home_off", "ls -l home h5view=off", "the same with `-o h5view=off`",
                 objects=home_objects),
        WalkCase("o10k_open", "walk10k D.h5 first open", "h5py opening walk10k.h5's `D.h5` "
                 f"(a process of its own: `stat`, plan, build, open), {fresh}",
                 objects=_objects(walkdata.WALK10K)),
        WalkCase("o10k_h5ls", "walk10k D.h5 h5ls -r", "`h5ls -r` of walk10k.h5's `D.h5` "
                 f"(metadata only), {fresh}", objects=_objects(walkdata.WALK10K)),
        WalkCase("o100k_open", "walk100k D.h5 first open", "h5py opening walk100k.h5's "
                 f"`D.h5` (a process of its own: `stat`, plan, build, open), {fresh}",
                 objects=_objects(walkdata.WALK100K)),
        WalkCase("o100k_tight", f"walk100k D.h5 memory_limit={TIGHT_LIMIT}", "the same with "
                 f"`-o memory_limit={TIGHT_LIMIT}`", objects=_objects(walkdata.WALK100K)),
        WalkCase("o10k_peer", "h5py skeleton 10k", "h5py making the same skeleton in memory "
                 "(`bench.skeleton_peer`: core driver, no elements, a process of its own)",
                 objects=_objects(walkdata.WALK10K)),
        *_walk_cases("s2k", "walk2k S3", "walk2k.h5 on S3 (moto on loopback), fresh "
                     "`h5mount s3://walk`, page cache dropped", _objects(walkdata.WALK2K)),
        WalkCase("s2k_h5ls", "walk2k S3 D.h5 h5ls -r", "`h5ls -r` of walk2k.h5's `D.h5` on "
                 "S3 (metadata only), fresh `h5mount s3://walk`, page cache dropped",
                 objects=_objects(walkdata.WALK2K)),
        *_walk_cases("sa2k", "walk2k S3 after writes", "walk2k.h5 on S3 after the same "
                     "writes, fresh mount, page cache dropped", _objects(walkdata.WALK2K, 1)),
    ]
    return {c.key: c for c in cases}


def _both(label: str, tag: str, peer: str = "", *, one_peer: bool = False,
          kind: str = "ratio", maximum: float | None = None) -> tuple[Target, ...]:
    """The targets of ``find`` and of ``ls -lR`` of case ``tag``, each against the same
    walk of ``peer``, or against the case ``peer`` itself when ``one_peer``."""
    return tuple(
        Target(f"`{' '.join(command)}` {label}", f"{tag}_{suffix}", kind,
               peer if one_peer or not peer else f"{peer}_{suffix}", maximum)
        for suffix, command in WALKS.items())


TARGETS: tuple[Target, ...] = (
    *_both("walk10k local <= 2x memtree", "l10k", "m10k", maximum=2.0),
    *_both("walk2k S3 <= 1.3x walk2k local", "s2k", "l2k", maximum=1.3),
    *_both("walk10k local: storage requests per object <= 0.01", "l10k", kind="per_object",
           maximum=MAX_STORAGE_PER_OBJECT),
    *_both("walk2k S3: storage requests per object <= 0.01", "s2k", kind="per_object",
           maximum=MAX_STORAGE_PER_OBJECT),
    Target("walk10k after writes, local: every change shown", "a10k_find", kind="shown"),
    Target("walk100k D.h5: every object in the file", "o100k_open", kind="whole"),
    Target("walk100k D.h5 first open: daemon peak RSS <= cache budgets + 150 MiB",
           "o100k_open", kind="rss", maximum=RSS_SLACK_MIB),
    Target("walk2k after writes, local: every change shown", "a2k_find", kind="shown"),
    Target("walk2k after writes, S3: every change shown", "sa2k_find", kind="shown"),
    *_both("walk2k after writes, S3 <= 3x local", "sa2k", "a2k", maximum=3.0),
    *_both("walk100k <= 11x walk10k", "l100k", "l10k", maximum=11.0),
    *_both("walk100k: daemon peak RSS <= cache budgets + 150 MiB", "l100k", kind="rss",
           maximum=RSS_SLACK_MIB),
    # Reported only.
    *_both("walk10k local / h5pyd visititems (reported)", "l10k", "visit", one_peer=True),
    *_both("walk2k local / memtree 2k (reported)", "l2k", "m2k"),
    *_both("walk10k after writes / walk10k (reported)", "a10k", "l10k"),
    Target("walk10k D.h5 first open / h5py making its skeleton (reported)", "o10k_open",
           peer="o10k_peer"),
)


# ---------------------------------------------------------------------- servers and commands


@dataclass(frozen=True)
class Server:
    """A mounted FUSE server: mountpoint, kind (``h5mount`` or ``memtree``), pid,
    its statistics file, and whether it reads S3."""

    mountpoint: Path
    kind: str
    pid: int | None
    stats: Path
    s3: bool = False


@dataclass
class Run:
    """Everything the cases of one run share."""

    data: walkdata.WalkData
    workdir: Path
    repeat: int
    timeout: float
    max_busy: float
    quiet_timeout: float
    #: ``-o`` options of every h5mount mount.
    options: list[str]
    cases: dict[str, WalkCase]
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    moto: MotoServer | None = None
    moto_pid: int | None = None

    @contextlib.contextmanager
    def h5mount(self, source: str, *options: str, s3: bool = False) -> Iterator[Server]:
        """A fresh h5mount mount of ``source`` with the run's options and ``options``;
        S3 sources read from the run's moto server. Unmounted afterwards."""
        stats = self.workdir / "h5mount-stats.json"
        stats.unlink(missing_ok=True)
        args = ["--log-file", str(self.workdir / "h5mount.log"), "-o", f"stats_file={stats}"]
        env = None
        if s3:
            if self.moto is None:
                raise BenchError("no moto server for an S3 mount")
            args += ["--endpoint-url", self.moto.endpoint, "-o", S3_OPTIONS]
            env = self.moto.env()
        for option in (*self.options, *options):
            args += ["-o", option]
        with bench_npy.bench_mount(source, self.workdir / H5MOUNT_DIR, *args,
                                   env=env) as (mp, pid):
            yield Server(mp, "h5mount", pid, stats, s3)

    def local(self, *options: str) -> contextlib.AbstractContextManager[Server]:
        """A fresh h5mount mount of the cached local bucket."""
        return self.h5mount(str(self.data.bucket_dir), *options)

    @contextlib.contextmanager
    def memtree(self, snapshot: Path) -> Iterator[Server]:
        """A fresh ``bench.memtree`` mount serving ``snapshot``; unmounted afterwards,
        when it writes its request counts."""
        stats = self.workdir / "memtree-stats.json"
        stats.unlink(missing_ok=True)
        with bench_npy.server_mounted("bench.memtree", "h5bench-memtree",
                                      self.workdir / MEMTREE_DIR, "--snapshot", str(snapshot),
                                      "--stats", str(stats)) as (mp, pid):
            yield Server(mp, "memtree", pid, stats)


#: The notes ``measure`` leaves on a case disturbed by other work (gathered in the report).
BUSY_START = "a run started with the CPUs busy with other work"
BUSY_DURING = "other work used the CPUs during a run"


def _note_once(case: WalkCase, note: str) -> None:
    if note not in case.notes:
        case.notes.append(note)


def _storage_requests(figures: dict[str, Any]) -> dict[str, int]:
    return {kind: int(store["requests"]) for kind, store in figures["storage"].items()}


def _difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    found = {name: count - before.get(name, 0) for name, count in after.items()}
    return {name: count for name, count in found.items() if count}


def measure(run: Run, case: WalkCase, argv: Sequence[str], server: Server) -> None:
    """One timed run of ``argv`` for ``case``, with the server's CPU and peak RSS and,
    for h5mount, the FUSE and storage requests it caused.

    Waits for quiet CPUs first. On a timeout the case keeps the bound and the
    CommandTimeout is raised on.
    """
    busy = bench_npy.wait_quiet(run.max_busy, run.quiet_timeout)
    if busy > run.max_busy:
        _note_once(case, BUSY_START)
    daemon = server.pid if server.kind == "h5mount" else None
    before = daemon_figures(daemon, server.stats) if daemon is not None else None
    pids = {} if server.pid is None else {"server": server.pid}
    if server.s3 and run.moto_pid is not None:
        pids["moto"] = run.moto_pid
    with CpuWatch(pids) as watch:
        try:
            seconds, _ = timed_command(argv, run.timeout)
        except CommandTimeout as exc:
            case.bound = exc.seconds
            case.status = f"> {exc.seconds:.0f} s"
            if server.pid is not None:  # the peak so far: a lower bound
                case.rss_mib.append(bench_s3.vm_hwm_mib(server.pid))
            raise
    case.add(seconds, 0)
    case.cpu.append({**{name: watch.own.get(name, 0.0) for name in pids},
                     "client": watch.own["cat"]})
    if watch.other_seconds > max(MAX_OTHER * watch.wall * len(os.sched_getaffinity(0)), 0.05):
        _note_once(case, BUSY_DURING)
    if server.pid is not None:
        case.rss_mib.append(bench_s3.vm_hwm_mib(server.pid))
    after = daemon_figures(daemon, server.stats) if daemon is not None else None
    if before is not None and after is not None:
        case.by_op = _difference(after["requests"], before["requests"])
        case.requests.append(sum(case.by_op.values()))
        case.by_store = _difference(_storage_requests(after), _storage_requests(before))
        case.storage.append(sum(case.by_store.values()))
        if not server.s3:
            run.facts["cache_budgets"] = {name: cache["budget_bytes"]
                                          for name, cache in after["caches"].items()
                                          if "budget_bytes" in cache}


def _memtree_counts(case: WalkCase, stats: Path) -> None:
    """The request counts ``bench.memtree`` wrote on unmount, as the run's FUSE requests."""
    try:
        found = json.loads(stats.read_text())
    except (OSError, ValueError):
        _note_once(case, "bench.memtree wrote no request counts")
        return
    case.requests.append(int(found["total"]))
    case.by_op = dict(found["requests"])


def walk(run: Run, tag: str, mount: Callable[[], contextlib.AbstractContextManager[Server]],
         top: Callable[[Path], Path],
         check: Callable[[WalkCase, Path], None] | None = None) -> None:
    """``find`` and ``ls -lR`` of ``top(mountpoint)``, ``repeat`` times each, every
    run on a fresh ``mount()`` with the page cache dropped; ``check`` runs on the
    mount after the first run of each. After a timeout the case's later runs
    are skipped."""
    for suffix, command in WALKS.items():
        case = run.cases[f"{tag}_{suffix}"]
        for attempt in range(run.repeat):
            drop_caches_noted(case)
            timed_out = False
            with mount() as server:
                path = top(server.mountpoint)
                try:
                    measure(run, case, [*command, str(path)], server)
                except CommandTimeout as exc:
                    log.warning("%s", exc)
                    _note_once(case, f"{exc}; the runs after it were skipped")
                    timed_out = True
                if check is not None and attempt == 0 and not timed_out:
                    check(case, path)
            if server.kind == "memtree":
                _memtree_counts(case, server.stats)
            if timed_out:
                break


def in_domain(domain: str) -> Callable[[Path], Path]:
    """The path of ``domain`` on a mount of a whole bucket."""
    return lambda mountpoint: mountpoint / domain.strip("/")


def check_changes(case: WalkCase, path: Path) -> None:
    """Record on ``case`` which writes of ``walkdata.apply_changes`` the mount does not show."""
    try:
        case.shown = walkdata.changes_shown(path)
    except (OSError, ValueError) as exc:
        case.shown = [f"could not check: {exc}"]
    if case.shown:
        case.notes.append("NOT shown on the mount: " + "; ".join(case.shown))
    else:
        case.notes.append(f"every write was shown on the mount: attribute `{walkdata.ATTR_NAME}`"
                          f" in `{walkdata.ATTR_TARGET}.json` and as xattr, "
                          f"`{walkdata.NEW_DATASET}/`, `{walkdata.RESIZED}.json` shape "
                          f"[{walkdata.NEW_SHAPE}]")


def ensure_stale(bucket: walkdata.Bucket, domain: str, case: WalkCase) -> None:
    """Check that the writes made ``domain``'s summary stale; BenchError if it is current."""
    try:
        walkdata.check_scan(bucket, domain)
    except walkdata.WalkDataError as exc:
        case.notes.append(f"the summary is stale, as intended ({exc})")
        return
    raise BenchError(f"{domain}: the summary is still current after the writes")


# ---------------------------------------------------------------------- the groups


def run_local(run: Run) -> None:
    """The walks of walk10k.h5 and walk2k.h5 on the local bucket."""
    walk(run, "l10k", run.local, in_domain(walkdata.WALK10K))
    walk(run, "l2k", run.local, in_domain(walkdata.WALK2K))


def run_memtree(run: Run) -> None:
    """Snapshots of warm mounts of walk10k.h5 and walk2k.h5, and the walks over them."""
    for tag, domain in (("m10k", walkdata.WALK10K), ("m2k", walkdata.WALK2K)):
        snapshot_file = run.workdir / f"{tag}-snapshot.json"
        with run.local() as server:
            top = in_domain(domain)(server.mountpoint)
            warm, _ = timed_command(["find", str(top)], run.timeout)
            started = time.perf_counter()
            snapshot = memtree.take(top)
            took = time.perf_counter() - started
        memtree.save(snapshot, snapshot_file)
        counts = ", ".join(f"{n:,} {kind}" for kind, n in sorted(snapshot.counts().items()))
        run.cases[f"{tag}_find"].notes.append(
            f"snapshot of {domain} on an h5mount mount warmed by one `find` ({warm:.1f} s): "
            f"{len(snapshot.entries):,} entries ({counts}), taken in {took:.1f} s")
        name = Path(domain).name
        walk(run, tag, lambda snapshot_file=snapshot_file: run.memtree(snapshot_file),
             lambda mountpoint, name=name: mountpoint / name)


def run_after(run: Run) -> None:
    """Writes the scan has not seen on a scratch copy of walk10k.h5 and walk2k.h5, then
    the walks of it, each change checked through the mount."""
    scratch = run.workdir / "after"
    bucket_dir = scratch / walkdata.BUCKET
    domains = {"a10k": walkdata.WALK10K, "a2k": walkdata.WALK2K}
    started = time.perf_counter()
    walkdata.copy_domains(run.data.bucket_dir, bucket_dir, list(domains.values()))
    copied = time.perf_counter() - started
    with HsdsServer(scratch, walkdata.BUCKET, scan_wait=walkdata.NO_SCAN) as server:
        for tag, domain in domains.items():
            changes = walkdata.apply_changes(server, domain)
            run.cases[f"{tag}_find"].notes.append(
                f"the writes took {changes.seconds:.1f} s through HSDS, flush included "
                f"(scratch copy of the domain made in {copied:.1f} s)")
    for tag, domain in domains.items():
        ensure_stale(walkdata.LocalBucket(bucket_dir), domain, run.cases[f"{tag}_find"])
        walk(run, tag, lambda: run.h5mount(str(bucket_dir)), in_domain(domain), check_changes)


def run_big(run: Run) -> None:
    """The walks of walk100k.h5."""
    walk(run, "l100k", run.local, in_domain(walkdata.WALK100K))


def run_visit(run: Run) -> None:
    """h5pyd ``visititems`` of walk10k.h5, each run through a freshly started HSDS."""
    case = run.cases["visit"]
    for _ in range(run.repeat):
        drop_caches_noted(case)
        with HsdsServer(run.data.base, walkdata.BUCKET, scan_wait=walkdata.NO_SCAN) as server:
            busy = bench_npy.wait_quiet(run.max_busy, run.quiet_timeout)
            if busy > run.max_busy:
                _note_once(case, BUSY_START)
            pids = server.pids()
            with CpuWatch(pids) as watch:
                seconds, visited = s3data.visititems(server.endpoint, walkdata.WALK10K)
        case.add(seconds, 0)
        case.cpu.append({"server": sum(watch.own.get(name, 0.0) for name in pids),
                         "client": watch.own["bench"]})
        _note_once(case, f"visited {visited:,} objects; server CPU is HSDS's two nodes', "
                   "client CPU h5pyd's (the driver's own process)")


def run_folders(run: Run) -> None:
    """``ls -l`` of folder20/ and of /home/admin/, with and without ``D.h5`` views."""
    for key, folder, options in (("f20_on", walkdata.FOLDER, ()),
                                 ("f20_off", walkdata.FOLDER, ("h5view=off",)),
                                 ("home_on", HOME, ()), ("home_off", HOME, ("h5view=off",))):
        case = run.cases[key]
        for _ in range(run.repeat):
            drop_caches_noted(case)
            with run.local(*options) as server:
                try:
                    measure(run, case, ["ls", "-l", str(in_domain(folder)(server.mountpoint))],
                            server)
                except CommandTimeout as exc:
                    _note_once(case, f"{exc}; the runs after it were skipped")
                    break


def run_h5open(run: Run) -> None:
    """h5py's first open of walk10k.h5's ``D.h5``, h5py making its skeleton in
    memory, and ``h5ls -r`` of the view."""
    opener = "import sys, h5py; h5py.File(sys.argv[1]).close()"
    peer = Server(Path("/"), "peer", None, Path(os.devnull))
    for _ in range(run.repeat):
        if not view_command(run, "o10k_open", run.local, walkdata.WALK10K,
                            [sys.executable, "-c", opener]):
            break
        measure(run, run.cases["o10k_peer"],
                [sys.executable, "-m", "bench.skeleton_peer",
                 str(walkdata.LINKS[walkdata.WALK10K])], peer)
    for _ in range(run.repeat):
        if not view_command(run, "o10k_h5ls", run.local, walkdata.WALK10K, h5ls()):
            break


def run_bigview(run: Run) -> None:
    """h5py's first open of walk100k.h5's ``D.h5``, with the default memory
    limit and with ``TIGHT_LIMIT``; then what the file holds."""
    opener = "import sys, h5py; h5py.File(sys.argv[1]).close()"
    for key, options in (("o100k_open", ()), ("o100k_tight", (f"memory_limit={TIGHT_LIMIT}",))):
        case = run.cases[key]
        for attempt in range(run.repeat):
            drop_caches_noted(case)
            with run.local(*options) as server:
                view = Path(f"{in_domain(walkdata.WALK100K)(server.mountpoint)}.h5")
                try:
                    measure(run, case, [sys.executable, "-c", opener, str(view)], server)
                except CommandTimeout as exc:
                    _note_once(case, f"{exc}; the runs after it were skipped")
                    break
                if attempt == 0:
                    check_view(case, view)


def check_view(case: WalkCase, view: Path) -> None:
    """Record on ``case`` how many objects the ``D.h5`` at ``view`` holds and
    what its ``h5mount_left_out`` says (``missing``)."""
    counted = [0]

    def count(_name: str) -> None:
        counted[0] += 1

    try:
        with h5py.File(view, "r") as f:
            f.visit(count)
            case.missing = [str(line) for line in f.attrs.get("h5mount_left_out", ())]
    except OSError as exc:
        case.missing = [f"could not check: {exc}"]
    note = (f"the file holds {counted[0]:,} of the domain's {case.objects - 1:,} objects "
            "below its root" + ("; left out: " + "; ".join(case.missing) if case.missing else ""))
    log.info("%s: %s", case.label, note)
    case.notes.append(note)


def h5ls() -> list[str]:
    """``h5ls -r``, from hdf5-tools (``dev/setup`` installs it)."""
    found = shutil.which("h5ls")
    if found is None:
        raise BenchError("h5ls is not installed (apt-get install hdf5-tools; dev/setup does)")
    return [found, "-r"]


def view_command(run: Run, key: str, mount: Callable[[], contextlib.AbstractContextManager[Server]],
                 domain: str, command: list[str]) -> bool:
    """One run of ``command`` on ``domain``'s ``D.h5`` on a fresh ``mount()``,
    page cache dropped; False after a timeout (noted on the case)."""
    case = run.cases[key]
    drop_caches_noted(case)
    with mount() as server:
        try:
            measure(run, case, [*command, f"{in_domain(domain)(server.mountpoint)}.h5"], server)
        except CommandTimeout as exc:
            _note_once(case, f"{exc}; the runs after it were skipped")
            return False
    return True


def run_s3(run: Run) -> None:
    """walk2k.h5 on moto, scanned by an HSDS on moto; its walks, then the writes and again."""
    with MotoServer() as moto:
        run.moto, run.moto_pid = moto, bench_s3.find_moto_pid(moto)
        try:
            started = time.perf_counter()
            built = walkdata.build_s3(moto)
            run.facts["s3"] = built
            run.facts["s3_build_s"] = time.perf_counter() - started
            source = f"s3://{walkdata.BUCKET}"
            walk(run, "s2k", lambda: run.h5mount(source, s3=True), in_domain(walkdata.WALK2K))
            for _ in range(run.repeat):
                if not view_command(run, "s2k_h5ls", lambda: run.h5mount(source, s3=True),
                                    walkdata.WALK2K, h5ls()):
                    break
            with HsdsServer(None, walkdata.BUCKET, s3=s3data.storage_of(moto),
                            scan_wait=walkdata.NO_SCAN) as server:
                changes = walkdata.apply_changes(server, walkdata.WALK2K)
            case = run.cases["sa2k_find"]
            case.notes.append(f"the writes took {changes.seconds:.1f} s through an HSDS on "
                              "moto, flush included")
            ensure_stale(walkdata.S3Bucket(moto.client(), walkdata.BUCKET), walkdata.WALK2K,
                         case)
            walk(run, "sa2k", lambda: run.h5mount(source, s3=True), in_domain(walkdata.WALK2K),
                 check_changes)
        finally:
            run.moto, run.moto_pid = None, None


#: Case groups for ``--cases``: runner and the cases it fills, in run order.
GROUPS: dict[str, tuple[Callable[[Run], None], tuple[str, ...]]] = {
    "local": (run_local, ("l10k_find", "l10k_lsr", "l2k_find", "l2k_lsr")),
    "memtree": (run_memtree, ("m10k_find", "m10k_lsr", "m2k_find", "m2k_lsr")),
    "after": (run_after, ("a10k_find", "a10k_lsr", "a2k_find", "a2k_lsr")),
    "big": (run_big, ("l100k_find", "l100k_lsr")),
    "visit": (run_visit, ("visit",)),
    "folders": (run_folders, ("f20_on", "f20_off", "home_on", "home_off")),
    "h5open": (run_h5open, ("o10k_open", "o10k_peer", "o10k_h5ls")),
    "bigview": (run_bigview, ("o100k_open", "o100k_tight")),
    "s3": (run_s3, ("s2k_find", "s2k_lsr", "s2k_h5ls", "sa2k_find", "sa2k_lsr")),
}


# ---------------------------------------------------------------------- report


def cache_budget_mib(options: Sequence[str], remote: bool) -> float:
    """The cache budgets a walk can fill on a mount with ``options``: ``chunk_cache``
    and ``meta_cache``, plus the block cache (``cache_size``) that only remote reads
    use; daemon defaults when absent."""
    config = MountConfig("", "")
    apply_options(config, list(options))
    return (config.chunk_cache + config.meta_cache
            + (config.cache_size if remote else 0)) / MIB


def _median(values: Sequence[float], fmt: str) -> str:
    return fmt.format(statistics.median(values)) if values else "—"


def _seconds(case: WalkCase) -> str:
    if case.bound is not None:
        return f"> {case.bound:.0f} s"
    if case.status == "ok":
        return f"{statistics.median(case.seconds):.2f}"
    return case.status


FIGURE_HEAD = ["case", "what", "median s", "range", "runs", "server CPU s",
               "server peak RSS MiB", "FUSE requests", "storage requests",
               "storage req/object", "client CPU s"]


def figure_rows(cases: dict[str, WalkCase]) -> list[list[str]]:
    """One row per case that ran (skipped cases left out), as ``FIGURE_HEAD``."""
    rows = []
    for case in cases.values():
        if case.status == "skipped":
            continue
        spread = (f"{min(case.seconds):.2f}-{max(case.seconds):.2f}"
                  if len(case.seconds) > 1 else "—")
        server = [run["server"] for run in case.cpu if "server" in run]
        client = [run["client"] for run in case.cpu]
        per_object = case.per_object
        rows.append([case.label, case.what, _seconds(case), spread, str(len(case.seconds)),
                     _median(server, "{:.2f}"),
                     (">= " if case.bound is not None else "") + f"{max(case.rss_mib):.0f}"
                     if case.rss_mib else "—",
                     _median(case.requests, "{:.0f}"), _median(case.storage, "{:.0f}"),
                     "—" if per_object is None else f"{per_object:.3f}",
                     _median(client, "{:.2f}")])
    return rows


def _ratio_row(target: Target, case: WalkCase, peer: WalkCase) -> tuple[str, str]:
    if peer.value is None or peer.value <= 0:
        return "—", "n/a"
    if case.bound is not None:
        ratio = case.bound / peer.value
        failed = target.maximum is not None and ratio > target.maximum
        return f"> {ratio:.2f}x", "**FAIL**" if failed else "n/a"
    if case.value is None:
        return "—", "n/a"
    ratio = case.value / peer.value
    if target.maximum is None:
        return f"{ratio:.2f}x", "reported"
    return f"{ratio:.2f}x", "**PASS**" if ratio <= target.maximum else "**FAIL**"


def _pass(ok: bool) -> str:
    return "**PASS**" if ok else "**FAIL**"


def target_rows(run: Run) -> list[list[str]]:
    """target, measured, result; targets on skipped cases left out."""
    rows = []
    budget = cache_budget_mib(run.options, remote=False)
    for target in TARGETS:
        case = run.cases[target.case]
        peer = run.cases.get(target.peer)
        if case.status == "skipped" or (peer is not None and peer.status == "skipped"):
            continue
        label = target.label
        if target.kind == "ratio" and peer is not None:
            label += f" ({case.label} / {peer.label})"
            measured, result = _ratio_row(target, case, peer)
        elif target.kind == "per_object":
            value = case.per_object
            measured = "—" if value is None else (
                f"{value:.3f} ({statistics.median(case.storage):.0f} requests / "
                f"{case.objects:,} objects)")
            result = "n/a" if value is None else _pass(value <= (target.maximum or 0.0))
        elif target.kind == "rss":
            limit = budget + (target.maximum or 0.0)
            label += f" ({case.label})"
            peak = max(case.rss_mib) if case.rss_mib else None
            if peak is None:
                measured, result = "—", "n/a"
            elif case.bound is not None:  # killed: the peak so far is a lower bound
                measured = f">= {peak:.0f} MiB of {limit:.0f} MiB (when killed)"
                result = "**FAIL**" if peak > limit else "n/a"
            else:
                measured, result = f"{peak:.0f} MiB of {limit:.0f} MiB", _pass(peak <= limit)
        else:
            found = case.missing if target.kind == "whole" else case.shown
            measured = "—" if found is None else "all" if not found else "; ".join(found)
            result = "n/a" if found is None else _pass(not found)
        rows.append([label, measured, result])
    return rows


def text_report(run: Run) -> str:
    """Plain-text tables for stdout (without the long 'what' column)."""
    figures = [[r[0], *r[2:]] for r in figure_rows(run.cases)]
    targets = [[r[0], r[1], r[2].replace("*", "")] for r in target_rows(run)]
    return "\n\n".join([
        table([FIGURE_HEAD[0], *FIGURE_HEAD[2:]], figures, markdown=False),
        table(["target", "measured", "result"], targets, markdown=False),
    ])


def _scan_note(scan: walkdata.ScanFacts, where: str) -> str:
    return (f"{scan.domain} ({where}): {scan.objects:,} objects, {scan.chunks:,} chunks; "
            f"`.info.json` {scan.info_bytes / MIB:.2f} MiB, `.summary.json` "
            f"{scan.summary_bytes / MIB:.2f} MiB; `scan_start` "
            f"{scan.scan_start - scan.newest_object:.1f} s after the newest object key, "
            f"scan {scan.scan_complete - scan.scan_start:.1f} s to `scan_complete`, "
            f"{scan.seconds:.0f} s to a current summary.")


def data_notes(run: Run) -> list[str]:
    """What the data is, how it was made and scanned, and why its summaries are current."""
    data = run.data
    scans = data.scans
    folder = [s for d, s in scans.items() if d.startswith(walkdata.FOLDER)]
    notes = [
        f"Data (`bench/walkdata.py`, cached in `{data.bucket_dir}`): root groups of 10,000, "
        "100,000 and 2,000 hard links (`walk10k.h5`, `walk100k.h5`, `walk2k.h5`) and "
        "`folder20/f00.h5`..`f19.h5` of 1,000 each, to int32 datasets of shape (4,), chunk "
        "(4,), one attribute; every 10th gzip-filtered with its one chunk stored (a "
        "Blosc-zlib frame), every 1,000th from `d000007` extendible. Written straight in "
        f"HSDS schema v2 in {data.facts.get('write_s', 0):.0f} s, then scanned by a real "
        f"HSDS 1.0.2 (POSIX storage, flush then `PUT /?domain=D&rescan=1` per domain) in "
        f"{data.facts.get('scan_s', 0):.0f} s, once; every run checks again that each "
        "summary holds every object of its domain and that `scan_start` is later than "
        "every other key's mtime.",
        *[_scan_note(scans[d], "local") for d in (walkdata.WALK10K, walkdata.WALK2K,
                                                  walkdata.WALK100K) if d in scans],
    ]
    if folder:
        notes.append(f"folder20: {len(folder)} domains of {folder[0].objects:,} objects, "
                     f"summaries {sum(s.summary_bytes for s in folder) / MIB:.1f} MiB in all, "
                     f"scanned in {sum(s.seconds for s in folder):.0f} s in all")
    built = run.facts.get("s3")
    if isinstance(built, walkdata.S3Walk):
        notes.append(
            f"S3: moto keeps everything in memory, so this run wrote walk2k.h5 to moto again "
            f"({built.keys:,} keys put in {built.upload_s:.0f} s) and had a real HSDS on moto "
            f"scan it: {run.facts['s3_build_s']:.0f} s in all. "
            + _scan_note(built.scan, "moto"))
    notes.append(
        "After writes: through HSDS's REST API, attribute `walk_note` added to `d000003`, "
        "dataset `new_dataset` created and linked into the root group, `d000007` resized "
        "(4,) -> (8,), then a flush; the data node ran with `SCAN_WAIT_TIME` of an hour, "
        "so no scan saw them. Local domains got them on a scratch copy in the run's "
        "workdir (the cached bucket stays as scanned).")
    return notes


def report_notes(run: Run) -> list[str]:
    """Everything under the tables: data, method, budgets, per-case notes."""
    budgets = run.facts.get("cache_budgets", {})
    stated = ", ".join(f"{name} {size / MIB:.0f} MiB" for name, size in sorted(budgets.items()))
    options = ",".join(run.options) or "(none)"
    notes = [
        *data_notes(run),
        f"h5mount options: `{options}` on local mounts; S3 mounts add `-o {S3_OPTIONS}` "
        "and `--endpoint-url` of the moto server. Every h5mount case is one command on a "
        "fresh mount after `drop_caches`.",
        "Server CPU and peak RSS are those of the FUSE server that answered (the h5mount "
        "daemon or `bench.memtree`; for visititems HSDS's two nodes, no RSS): CPU seconds "
        "during the command, VmHWM after it. Client CPU is the command's own (for "
        "visititems h5pyd's). FUSE and storage requests are the daemon's own counts "
        "(`-o stats_file`, SIGUSR1) of what the command caused (memtree: its own counts); "
        "storage req/object divides by the objects (groups and datasets) of what was listed.",
        f"Peak RSS budget of a local mount: `chunk_cache` plus `meta_cache` "
        f"{cache_budget_mib(run.options, remote=False):.0f} MiB (a local bucket is read "
        "without the block cache; `cache_size` applies to remote reads only), + "
        f"{RSS_SLACK_MIB:.0f} MiB."
        + (f" The daemon's stats document gave the budgets {stated} (memo is `meta_cache`; "
           "row bands serve `.npy` reads, which a walk does not make)." if stated else ""),
        f"Commands are killed after {run.timeout:.0f} s; such a case shows `> "
        f"{run.timeout:.0f} s` and its ratio is a bound.",
        f"Before each run the driver waited up to {run.quiet_timeout:.0f} s for the CPUs to "
        f"be at most {100 * run.max_busy:.0f}% busy; runs are not redone when other work "
        "used the CPUs meanwhile (noted below).",
    ]
    for busy, what in ((BUSY_START, "started with the CPUs busy with other work (after "
                        f"waiting up to {run.quiet_timeout:.0f} s)"),
                       (BUSY_DURING, "had other work use the CPUs meanwhile")):
        labels = [case.label for case in run.cases.values() if busy in case.notes]
        if labels:
            notes.append(f"Runs of {len(labels)} of the {len(figure_rows(run.cases))} cases "
                         f"{what}: {', '.join(labels)}.")
    for case in run.cases.values():
        notes.extend(f"{case.label}: {note}" for note in case.notes
                     if note not in (BUSY_START, BUSY_DURING))
        if case.by_op and case.status == "ok":
            ops = ", ".join(f"{op} {n:,}" for op, n in sorted(case.by_op.items()))
            stores = ", ".join(f"{kind} {n:,}" for kind, n in sorted(case.by_store.items()))
            notes.append(f"{case.label}: FUSE requests of its last run: {ops}"
                         + (f"; storage requests: {stores}" if stores else ""))
        moto = [run["moto"] for run in case.cpu if "moto" in run]
        if moto:
            notes.append(f"{case.label}: moto used {statistics.median(moto):.2f} CPU-s "
                         "(median) per run")
    notes.extend(run.notes)
    return notes


def report_section(run: Run, command: str, started: datetime.datetime,
                   seconds: float) -> str:
    """The markdown section for docs/benchmarks.md, markers included."""
    lines = [
        *bench_npy.section_head(SECTION_START, "## Whole-domain walks at the FUSE floor",
                                started=started, seconds=seconds, command=command,
                                facts=machine_facts()),
        f"Seconds are wall time of one command, the median of its runs (`--repeat "
        f"{run.repeat}`); `range` is the fastest and slowest run. Every ratio is against a "
        "peer measured in the same run.",
        "",
        table(FIGURE_HEAD, figure_rows(run.cases), markdown=True),
        "",
        "Targets (lower is better):",
        "",
        table(["target", "measured", "result"], target_rows(run), markdown=True),
        "",
        "Notes:",
        "",
        *[f"- {note}" for note in report_notes(run)],
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- main


def select_groups(text: str, s3: bool) -> list[str]:
    """The groups named (or prefixed) by a comma-separated ``--cases``; ``s3`` only if ``s3``."""
    wanted = [token.strip() for token in text.split(",") if token.strip()]
    unknown = [t for t in wanted if not any(group.startswith(t) for group in GROUPS)]
    if unknown:
        raise ValueError(f"unknown case group(s) {', '.join(unknown)}; "
                         f"known: {', '.join(GROUPS)}")
    return [group for group in GROUPS if any(group.startswith(t) for t in wanted)
            and (s3 or group != "s3")]


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> int:
    """Ensure the data, run the chosen groups, print the tables and update the doc."""
    started = datetime.datetime.now().astimezone()
    t0 = time.perf_counter()
    data = walkdata.ensure(args.dir)
    workdir = Path(tempfile.mkdtemp(prefix="h5mount-bench-walk-"))
    run = Run(data, workdir, args.repeat, args.timeout, args.max_busy, args.quiet_timeout,
              args.options, new_cases())
    for key, case in run.cases.items():
        if not any(key in GROUPS[name][1] for name in args.groups):
            case.status = "skipped"
    try:
        loads = []
        for name in args.groups:
            runner, keys = GROUPS[name]
            load = bench_npy.loadavg()
            loads.append(f"{name} {load:.1f}")
            log.info("group %s: start, load average %.1f", name, load)
            bench_npy.guard(run.cases, run.notes, keys, lambda runner=runner: runner(run),
                            (BenchError, OSError, ValueError, walkdata.WalkDataError))
        run.notes.append("1-minute load average at the start of each group (2 CPUs): "
                         + ", ".join(loads) + ".")
        command = shlex.join([".venv/bin/python", "-m", "bench.bench_walk", *argv])
        print(text_report(run))
        if not args.no_doc:
            section = report_section(run, command, started, time.perf_counter() - t0)
            bench_npy.write_doc(args.doc, section, SECTION_START, SECTION_END)
        return 0
    finally:
        bench_npy.release_workdir(workdir, H5MOUNT_DIR, MEMTREE_DIR, keep=args.keep_workdir)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(GROUPS),
                        help="comma-separated case groups, or prefixes of them "
                             f"(default: all of {', '.join(GROUPS)})")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (default 3)")
    parser.add_argument("--s3", action=argparse.BooleanOptionalAction, default=True,
                        help="run the s3 group (moto on loopback; default: --s3)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"kill a command after this many seconds (default "
                             f"{DEFAULT_TIMEOUT:g})")
    parser.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS",
                        help="h5mount -o options for every mount (repeatable; default none)")
    bench_npy.add_wait_options(parser, max_busy=0.2, quiet_timeout=10.0)
    parser.add_argument("--dir", type=Path, default=walkdata.DEFAULT_DIR,
                        help=f"walk bucket cache (default {walkdata.DEFAULT_DIR})")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC,
                        help="markdown file to update (default docs/benchmarks.md)")
    parser.add_argument("--no-doc", action="store_true", help="only print the results")
    parser.add_argument("--keep-workdir", action="store_true",
                        help="keep the temporary directory (h5mount log, snapshots, the "
                             "scratch bucket of the writes)")
    parser.add_argument("--log-level", default="INFO", type=str.upper)
    args = parser.parse_args(argv)
    try:
        args.groups = select_groups(args.cases, args.s3)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for handler in logging.getLogger().handlers:
        handler.addFilter(bench_s3.not_root)
    os.chdir(REPO)
    signal.signal(signal.SIGTERM, bench_npy.raise_on_sigterm)
    return run_benchmark(args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
