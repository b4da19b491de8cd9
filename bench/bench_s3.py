"""Benchmark: a 1 GiB dataset on S3 (moto on loopback) through h5mount, against its peers.

This module owns the driver of the S3 benchmark. In one run it starts a moto
S3 server, has a real HSDS write the data onto it (``bench.s3data``; moto
keeps everything in memory, so this happens in every run and is timed), and
measures:

- (a) cold: ``cat data.npy > /dev/null`` on a fresh ``h5mount s3://bench``
  mount (``-o cache_size=512M,chunk_cache=256M``), page cache dropped;
- (b) warm: the same ``cat`` on a fresh mount whose ``cache_dir`` already
  holds every block (filled by ``h5mount warm`` when the command exists, else
  by one read), page cache dropped; with ``--cache-decoded`` those mounts add
  ``-o cache_decoded``, so the cache_dir holds every chunk decoded as well;
  and, as a diagnostic, a second ``cat`` on the (a) mount, served by the
  kernel's page cache; and a third once that mount's ``metadata_ttl``
  (``TTL``) has passed, storage unchanged (issue 27: at least 3x the cold
  read);
- (c) what the network allows: plain aiobotocore GETs of the same chunk
  objects plus the mount's decoder on 2 threads (``bench.s3peers``), and
  the same with ``numcodecs.blosc`` decoding (issue 15's peer);
- (d) h5pyd reading the dataset through a real HSDS on the same bucket;
- (f) h5py reading the local ``.h5`` with a warm page cache, the peer of the
  warm target (``bench_npy.time_h5py``);
- ``ls -lR`` of a 10,000-object domain through a fresh mount (cold, then
  warm) against h5pyd ``visititems`` on the freshly loaded domain;
- the daemon's peak RSS (VmHWM) while one mount streams 4 GiB (four reads of
  ``data.npy``, page cache dropped before each), against the cache budget
  (``cache_size`` + ``chunk_cache``) + 150 MiB;
- ``walk_stream``: the same peak while ``find`` walks ``walk100k.h5``
  (``bench.walkdata``'s 100,000 datasets, copied to moto: several minutes)
  on a mount that reads ``data.npy`` again and again until the walk ends,
  against the budgets with ``meta_cache`` + 150 MiB.

It prints a table and replaces its own section of ``docs/benchmarks.md``
(``bench.s3report``). ``--cases`` runs some groups of cases only (``--cases
stream`` for the peak-RSS run alone); such a run only prints its results,
unless ``--doc`` names a file. When the mount cannot serve ``s3://`` yet, the mount
cases are reported as not available and the peers are still measured.
Every mount is unmounted and every server stopped, also on errors and
SIGTERM.

Run from the repository root, as root (for drop_caches)::

    .venv/bin/python -m bench.bench_s3
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bench_npy, s3data, s3peers, s3report, walkdata
from bench import data as benchdata
from bench.bench_npy import Case, NotAvailable, Timed, timed, timed_cat, with_retries
from mountd.config import parse_size
from tests import mounting
from tests.hsds_server import HsdsServer
from tests.moto_server import MotoServer

log = logging.getLogger("bench.bench_s3")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OPTIONS = "cache_size=512M,chunk_cache=256M"
STREAM_PASSES = 4
#: Seconds after which the walk of ``run_walk_stream`` is given up.
WALK_STREAM_TIMEOUT = 1500.0
#: ``metadata_ttl`` of the ``run_walk_stream`` mount.
WALK_STREAM_TTL = 3600.0
#: ``metadata_ttl`` of the (a) mounts, and how long after the page-cache ``cat``
#: the (b) after-ttl ``cat`` starts: past the end of the period.
TTL = 10.0
TTL_WAIT = TTL + 1.0
MIB = float(1 << 20)
QUIET_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer", "aiobotocore", "h5pyd")


def not_root(record: logging.LogRecord) -> bool:
    """Drop records of the root logger: h5pyd's metadata layer logs every lookup there."""
    return record.name != "root"



def new_cases() -> dict[str, Case]:
    """The cases of one run, in report order."""
    cases = [
        Case("a_cold", "(a) cold", "`cat data.npy > /dev/null`, fresh mount, page cache "
             "dropped"),
        Case("b_warm", "(b) warm", "the same `cat` on a fresh mount whose `cache_dir` holds "
             "every block, page cache dropped"),
        Case("b_page", "(b) page cache", "`cat` again on the (a) mount: the kernel's page "
             "cache; diagnostic"),
        Case("b_ttl", "(b) after metadata_ttl", f"`cat` once more on the (a) mount, "
             f"{TTL_WAIT:.0f} s later (its `metadata_ttl` is {TTL:.0f} s), storage unchanged"),
        Case("c", "(c) network + decode", f"aiobotocore GETs of the chunk objects, "
             f"{s3peers.CONCURRENCY} in flight, + `decode_chunk` on {s3peers.DECODE_THREADS} "
             "threads, no FUSE"),
        Case("c_numcodecs", "(c) network + numcodecs", "the same GETs + "
             f"`numcodecs.blosc.decompress` on {s3peers.DECODE_THREADS} threads, no FUSE "
             "(the issue 15 peer)"),
        Case("c_get", "(c) GETs only", "the same GETs without decoding; GiB/s of *stored* "
             "bytes; diagnostic"),
        Case("d", "(d) h5pyd", "h5pyd reading `data` in 1024-row slabs through a real HSDS "
             "(fresh) on the same bucket"),
        Case("stream", "(e) 4 GiB stream", f"{STREAM_PASSES} x `cat data.npy` on one mount, "
             "page cache dropped before each (the peak-RSS run)"),
        Case("walk_stream", "(e) stream + 100k walk", f"{STREAM_PASSES} x `cat data.npy` or "
             "more on one mount (that file's pages dropped before each) while `find` walks "
             f"walk100k.h5 (100,000 datasets) on it, from a fresh mount with "
             f"`-o metadata_ttl={WALK_STREAM_TTL:g}`; seconds run until the `find` and the "
             "pass under way when it ended are done (the peak-RSS run with a walk)"),
        Case("ls_cold", "ls -lR cold", "`ls -lR` of the 10,000-object domain, fresh mount, "
             "page cache dropped"),
        Case("ls_warm", "ls -lR warm", "the same `ls -lR` again on that mount"),
        Case("ls_local", "ls -lR cold, local disk", "`ls -lR` of the same domain on a fresh "
             "mount of the POSIX bucket that h5pyd's HSDS served, page cache dropped"),
        Case("visit", "h5pyd visititems", "h5pyd `visititems` on the freshly loaded domain, "
             "right after building it"),
        Case("h5py", "(f) h5py local", "h5py reading the local `.h5` in chunk-row slabs, warm "
             "page cache (the warm target's peer)"),
    ]
    return {c.key: c for c in cases}


@dataclass
class Run:
    """Everything the cases of one run share."""

    ctx: bench_npy.Context
    moto: MotoServer
    big: s3data.BigOnS3
    options: str
    moto_pid: int | None
    cases: dict[str, Case]
    ls_timeout: float
    h5pyd_repeat: int
    #: ``--cache-decoded``: the cache_dir mounts also keep decoded chunks.
    cache_decoded: bool = False
    many: s3data.ManyDomain | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def workdir(self) -> Path:
        return self.ctx.workdir

    def pids(self, extra: dict[str, int] | None = None) -> dict[str, int]:
        """Processes whose CPU is the benchmark's own: moto, plus ``extra``."""
        found = {"moto": self.moto_pid} if self.moto_pid else {}
        return {**found, **(extra or {})}


# ---------------------------------------------------------------------- helpers


def find_moto_pid(moto: MotoServer) -> int | None:
    """The pid of the ``moto_server`` process listening on ``moto.port``."""
    port = str(moto.port).encode()
    found = mounting.pids_where(
        lambda argv: port in argv and any(arg.endswith(b"moto_server") for arg in argv))
    return found[0] if found else None


def vm_hwm_mib(pid: int) -> float:
    """Peak resident set size (VmHWM) of ``pid``, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    raise bench_npy.BenchError(f"no VmHWM for pid {pid}")


def cache_budget_mib(options: str, *, with_meta: bool = False) -> float:
    """``cache_size`` + ``chunk_cache`` of an ``-o`` string (daemon defaults when
    absent), + ``meta_cache`` ``with_meta`` (the budget a walk fills)."""
    sizes = {"cache_size": 512 << 20, "chunk_cache": 256 << 20}
    if with_meta:
        sizes["meta_cache"] = 256 << 20
    for item in options.split(","):
        name, _, value = item.partition("=")
        if name in sizes:
            sizes[name] = parse_size(name, value)
    return sum(sizes.values()) / MIB


@contextlib.contextmanager
def s3_mount(run: Run, name: str, options: str) -> Iterator[tuple[Path, dict[str, int]]]:
    """A fresh ``h5mount s3://bench`` at ``workdir/name`` and the pids to watch."""
    args = ("--endpoint-url", run.moto.endpoint, "-o", options,
            "--log-file", str(run.workdir / "h5mount.log"))
    with bench_npy.bench_mount(f"s3://{s3data.BUCKET}", run.workdir / name, *args,
                               env=run.moto.env()) as (mp, pid):
        yield mp, run.pids({} if pid is None else {"h5mount": pid})


def npy_path(mp: Path) -> Path:
    path = mp / s3data.BIG_DOMAIN.strip("/") / f"{benchdata.DATASET}.npy"
    if not path.exists():
        raise NotAvailable(f"{path.relative_to(mp)} does not exist on the mount")
    return path


def _cat(path: Path) -> Callable[[], tuple[float, int]]:
    return lambda: timed_cat(path)


# ---------------------------------------------------------------------- peers


def run_network(run: Run) -> None:
    """(c): aiobotocore GETs + decode, and the GETs alone."""
    fetcher = s3peers.ChunkFetcher(
        run.moto.endpoint, run.moto.env(), s3data.BUCKET, keys=run.big.chunk_keys,
        spec=s3peers.chunk_spec(run.big.dataset_json))
    try:
        fetcher.read_all(decode=True, check=True)  # untimed: checks the data, warms threads
        fetcher.read_all(decode=True, check=True, numcodecs=True)
        for key, decode, numcodecs in (("c", True, False), ("c_numcodecs", True, True),
                                       ("c_get", False, False)):
            case = run.cases[key]
            for _ in range(run.ctx.repeat):
                with_retries(run.ctx, lambda case=case, decode=decode, numcodecs=numcodecs: [
                    timed(run.ctx, case,
                          lambda: fetcher.read_all(decode=decode, numcodecs=numcodecs),
                          run.pids())])
    finally:
        fetcher.close()


def run_h5pyd(run: Run) -> None:
    """(d): h5pyd through a freshly started HSDS whose storage is the moto bucket."""
    case = run.cases["d"]
    for attempt in range(run.h5pyd_repeat):
        def one(attempt: int = attempt) -> list[Timed]:
            logs = run.workdir / f"hsds-read-logs-{attempt}"
            with HsdsServer(None, s3data.BUCKET, s3=s3data.storage_of(run.moto),
                            log_dir=logs) as server:
                return [timed(run.ctx, case, lambda: s3peers.h5pyd_read(
                    server.endpoint, s3data.BIG_DOMAIN, benchdata.DATASET, benchdata.CHUNKS[0]),
                    run.pids(server.pids()))]

        with_retries(run.ctx, one)


def run_many(run: Run) -> None:
    """The 10,000-object domain and the h5pyd ``visititems`` peer."""
    case = run.cases["visit"]

    def quiet() -> None:
        busy = bench_npy.wait_quiet(run.ctx.max_busy, run.ctx.quiet_timeout)
        if busy > run.ctx.max_busy:
            case.notes.append(f"a run started with the CPUs {100 * busy:.0f}% busy with "
                              "other work")

    run.many = s3data.build_many(run.moto, run.workdir, before_visit=quiet)
    case.add(run.many.visititems_s, 0)
    if run.many.visited != run.many.objects:
        case.notes.append(f"visited {run.many.visited} of {run.many.objects} objects")


# ---------------------------------------------------------------------- the mount


def run_cold(run: Run) -> None:
    """(a) cold ``cat`` on fresh mounts, each followed by a page-cache ``cat`` (b)
    and, once the mount's ``metadata_ttl`` has passed, one more (b after ttl)."""
    cold, page, ttl = run.cases["a_cold"], run.cases["b_page"], run.cases["b_ttl"]
    peaks: list[float] = []
    for attempt in range(run.ctx.repeat):
        def one(attempt: int = attempt) -> list[Timed]:
            bench_npy.drop_caches_noted(cold)
            with s3_mount(run, "mnt", f"{run.options},metadata_ttl={TTL:g}") as (mp, pids):
                npy = npy_path(mp)
                runs = [timed(run.ctx, cold, _cat(npy), pids)]
                if "h5mount" in pids:
                    peaks.append(vm_hwm_mib(pids["h5mount"]))
                runs.append(timed(run.ctx, page, _cat(npy), pids))
                time.sleep(TTL_WAIT)
                runs.append(timed(run.ctx, ttl, _cat(npy), pids))
                if attempt == 0:
                    bench_npy.check_npy(npy)
            return runs

        with_retries(run.ctx, one)
    if peaks:
        cold.notes.append(f"daemon VmHWM after a cold read: {max(peaks):.0f} MiB")


def _fill_disk_cache(run: Run, options: str) -> None:
    """Put every block of ``big.h5``'s data into ``cache_dir``: ``h5mount warm``, else one read.

    ``h5mount warm`` gets the dataset's directory, so it reads each chunk file once.
    """
    case = run.cases["b_warm"]
    with s3_mount(run, "mnt", options) as (mp, _pids):
        dataset = mp / s3data.BIG_DOMAIN.strip("/") / benchdata.DATASET
        started = time.perf_counter()
        proc = mounting.run_h5mount("warm", str(dataset), timeout=600)
        seconds = time.perf_counter() - started
        if proc.returncode == 0:
            case.notes.append(f"`h5mount warm {dataset.relative_to(mp)}` (the chunk files) "
                              f"filled the cache_dir in {seconds:.1f} s")
            return
        reason = " ".join((proc.stderr or proc.stdout).split())[:160]
        seconds, size = timed_cat(npy_path(mp))
        case.notes.append(f"`h5mount warm` failed ({reason}); one `cat` filled the cache_dir "
                          f"instead, at {size / bench_npy.GIB / seconds:.2f} GiB/s")


def run_warm(run: Run) -> None:
    """(b) warm: fresh mounts reading from a filled ``cache_dir``, page cache dropped."""
    case = run.cases["b_warm"]
    cache_dir = run.workdir / "blocks"
    cache_dir.mkdir()
    options = f"{run.options},cache_dir={cache_dir}"
    if run.cache_decoded:
        options += ",cache_decoded"
        case.notes.append("mounted with `-o cache_decoded`: decoded chunks kept in the cache_dir")
    _fill_disk_cache(run, options)
    stored = sum(path.stat().st_size for path in cache_dir.rglob("*") if path.is_file())
    case.notes.append(f"cache_dir holds {stored / MIB:.0f} MiB")
    for _ in range(run.ctx.repeat):
        def one() -> list[Timed]:
            bench_npy.drop_caches_noted(case)
            with s3_mount(run, "mnt", options) as (mp, pids):
                return [timed(run.ctx, case, _cat(npy_path(mp)), pids)]

        with_retries(run.ctx, one)


class ListingTimeout(bench_npy.BenchError):
    """``ls -lR`` was cut off after ``seconds``, having listed ``dirs`` directories."""

    def __init__(self, seconds: float, dirs: int) -> None:
        super().__init__(f"ls -lR cut off after {seconds:.0f} s ({dirs} directories listed)")
        self.seconds = seconds
        self.dirs = dirs


def timed_ls(path: Path, out: Path, timeout: float) -> tuple[float, int]:
    """Run ``ls -lR PATH > out``; return (seconds, 0). Raise ListingTimeout after ``timeout``."""
    started = time.perf_counter()
    with open(out, "wb") as sink:
        try:
            proc = subprocess.run(["ls", "-lR", str(path)], stdout=sink,
                                  stderr=subprocess.PIPE, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            dirs = sum(1 for line in out.read_bytes().splitlines() if line.endswith(b":"))
            raise ListingTimeout(timeout, dirs) from None
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise bench_npy.BenchError(f"ls -lR {path} exited {proc.returncode}: "
                                   f"{proc.stderr.decode(errors='replace')[:300]}")
    return seconds, 0


def run_ls(run: Run) -> None:
    """``ls -lR`` of ``many.h5`` on fresh mounts (cold), then again (warm).

    A listing slower than ``run.ls_timeout`` is cut off; then its case shows
    the bound (for the cold case also ``run.facts["ls_cold_bound_s"]``) and no
    more listings follow. Listings are not redone when other work disturbed them.
    """
    cold, warm = run.cases["ls_cold"], run.cases["ls_warm"]
    out = run.workdir / "ls.txt"
    for attempt in range(run.ctx.repeat):
        bench_npy.drop_caches_noted(cold)
        with s3_mount(run, "mnt", run.options) as (mp, pids):
            domain = mp / s3data.MANY_DOMAIN.strip("/")
            if not domain.is_dir():
                raise NotAvailable(f"{s3data.MANY_DOMAIN} is not a directory on the mount")
            for case in (cold, warm):
                try:
                    found = timed(run.ctx, case, lambda domain=domain: timed_ls(
                        domain, out, run.ls_timeout), pids)
                except ListingTimeout as exc:
                    _cut_off(run, case, exc)
                    return
                case.add(found.seconds, found.nbytes)
                case.cpu.append(found.watch.own)
                if attempt == 0 and case is cold:
                    lines = out.read_bytes().count(b"\n")
                    cold.notes.append(f"`ls -lR` printed {lines} lines")


def run_ls_local(run: Run) -> None:
    """``ls -lR`` of ``many.h5`` on fresh mounts of the local bucket it was built in.

    The like-for-like peer of ``visititems``, whose HSDS read that same directory.
    """
    case = run.cases["ls_local"]
    if run.many is None:
        raise NotAvailable("many.h5 was not built")
    out = run.workdir / "ls-local.txt"
    for _ in range(run.ctx.repeat):
        bench_npy.drop_caches_noted(case)
        with mounting.mounted(run.many.bucket_dir, run.workdir / "mnt-local") as mp:
            daemons = mounting.daemon_pids(mp)
            domain = mp / run.many.domain.strip("/")
            try:
                found = timed(run.ctx, case, lambda domain=domain: timed_ls(
                    domain, out, run.ls_timeout),
                    run.pids({"h5mount": daemons[0]} if len(daemons) == 1 else {}))
            except ListingTimeout as exc:
                _cut_off(run, case, exc)
                return
            case.add(found.seconds, found.nbytes)
            case.cpu.append(found.watch.own)


def _cut_off(run: Run, case: Case, exc: ListingTimeout) -> None:
    total = (run.many.objects if run.many else 0) + 1
    case.notes.append(f"cut off after {exc.seconds:.0f} s with {exc.dirs} of {total} "
                      f"directories listed ({1000 * exc.seconds / max(exc.dirs, 1):.0f} ms "
                      "per directory)")
    if case.status != "ok":
        case.status = f"> {exc.seconds:.0f} s"
    if case is run.cases["ls_cold"] and not case.seconds:
        run.facts["ls_cold_bound_s"] = exc.seconds
        run.cases["ls_warm"].status = "not run"


def run_stream(run: Run) -> None:
    """Peak RSS: one mount streams ``data.npy`` 4 times, page cache dropped before each."""
    case = run.cases["stream"]
    with s3_mount(run, "mnt", run.options) as (mp, pids):
        npy = npy_path(mp)
        for _ in range(STREAM_PASSES):
            bench_npy.drop_caches_noted(case)
            found = timed(run.ctx, case, _cat(npy), pids)
            case.add(found.seconds, found.nbytes)
            case.cpu.append(found.watch.own)
        if "h5mount" not in pids:
            raise bench_npy.BenchError("no single h5mount daemon to measure")
        run.facts["peak_rss_mib"] = vm_hwm_mib(pids["h5mount"])
    total = sum(case.nbytes) / bench_npy.GIB
    log.info("streamed %.1f GiB; daemon VmHWM %.0f MiB", total, run.facts["peak_rss_mib"])


def run_walk_stream(run: Run) -> None:
    """Peak RSS while ``find`` walks walk100k.h5 and, on the same mount, ``data.npy``
    is read whole again and again (at least ``STREAM_PASSES`` times, that file's
    pages dropped before each, so each pass reaches the daemon) until it ends.

    walk100k.h5 is copied to moto from ``bench.walkdata``'s bucket. The copy is
    newer than the scan that wrote its summary, so the mount reads each object
    on its own, as for any domain written since its last scan. Only the file's
    own pages are dropped (``POSIX_FADV_DONTNEED``): dropping every cache would
    make the kernel forget the walk's inodes, and the daemon its entries.
    """
    case = run.cases["walk_stream"]
    walk = walkdata.ensure()
    started = time.perf_counter()
    copied = s3data.copy_domain(run.moto, walk.bucket_dir, walkdata.WALK100K)
    copy_seconds = time.perf_counter() - started
    log.info("walk100k.h5: %d keys copied to moto in %.0f s", copied, copy_seconds)
    run.facts["walk_stream_budget_mib"] = cache_budget_mib(run.options, with_meta=True)
    bench_npy.drop_caches_noted(case)
    # moto lists a bucket in O(keys) per page: with the default metadata_ttl the
    # walk would list the domain's 110,000 keys again every minute.
    with s3_mount(run, "mnt", f"{run.options},metadata_ttl={WALK_STREAM_TTL:g}") as (mp, pids):
        npy = npy_path(mp)
        if "h5mount" not in pids:
            raise bench_npy.BenchError("no single h5mount daemon to measure")
        errors = run.workdir / "walk-stream-find.err"
        with errors.open("wb") as err:
            found = subprocess.Popen(["find", str(mp / walkdata.WALK100K.strip("/"))],
                                     stdout=subprocess.DEVNULL, stderr=err)
        t0 = time.perf_counter()
        passes = nbytes = 0
        try:
            while passes < STREAM_PASSES or found.poll() is None:
                if time.perf_counter() - t0 > WALK_STREAM_TIMEOUT:
                    raise bench_npy.BenchError(
                        f"find still walking after {WALK_STREAM_TIMEOUT:.0f} s")
                with npy.open("rb") as f:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                nbytes += timed_cat(npy)[1]
                passes += 1
        finally:
            if found.poll() is None:
                found.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                # A find stuck in a readdir ends only once the unmount aborts it.
                found.wait(timeout=10)
        if found.returncode != 0:
            raise bench_npy.BenchError(f"find failed: {errors.read_text(errors='replace')[-300:]}")
        case.add(time.perf_counter() - t0, nbytes)
        run.facts["walk_stream_rss_mib"] = vm_hwm_mib(pids["h5mount"])
    case.notes.append(f"{passes} passes of data.npy ({nbytes / bench_npy.GIB:.0f} "
                      f"GiB) while `find` walked walk100k.h5; walk100k.h5 copied to moto "
                      f"({copied:,} keys) in {copy_seconds:.0f} s")
    log.info("walk + stream: %d passes; daemon VmHWM %.0f MiB", passes,
             run.facts["walk_stream_rss_mib"])


# ---------------------------------------------------------------------- driver


def run_h5py(run: Run) -> None:
    """(f): h5py on the local file, warm page cache."""
    bench_npy.time_h5py(run.ctx, run.cases["h5py"])


def _guard(run: Run, keys: tuple[str, ...], fn: Callable[[Run], None]) -> None:
    """Run one group of cases; record NotAvailable/BenchError on its cases, not fatal."""
    bench_npy.guard(run.cases, run.notes, keys, lambda: fn(run),
                    (bench_npy.BenchError, s3peers.PeerError, OSError))


def _mount_ready(run: Run) -> str | None:
    """None when a fresh mount shows ``data.npy``; else why not."""
    try:
        with s3_mount(run, "mnt", run.options) as (mp, _pids):
            npy_path(mp)
    except NotAvailable as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Group:
    """Cases measured together (``--cases`` names them); ``mount``: they need the mount."""

    name: str
    keys: tuple[str, ...]
    fn: Callable[[Run], None]
    mount: bool


#: Every group, in the order a run measures them (``ls`` and ``ls_local`` need
#: ``many``'s domain).
GROUPS = (
    Group("many", ("visit",), run_many, mount=False),
    Group("network", ("c", "c_numcodecs", "c_get"), run_network, mount=False),
    Group("h5pyd", ("d",), run_h5pyd, mount=False),
    Group("h5py", ("h5py",), run_h5py, mount=False),
    Group("cold", ("a_cold", "b_page", "b_ttl"), run_cold, mount=True),
    Group("warm", ("b_warm",), run_warm, mount=True),
    Group("ls", ("ls_cold", "ls_warm"), run_ls, mount=True),
    Group("ls_local", ("ls_local",), run_ls_local, mount=True),
    Group("stream", ("stream",), run_stream, mount=True),
    Group("walk_stream", ("walk_stream",), run_walk_stream, mount=True),
)


def parse_groups(text: str) -> frozenset[str]:
    """The groups a ``--cases`` value names (``all``: every one); ``ls`` and
    ``ls_local`` bring ``many``, whose domain they list."""
    names = {group.name for group in GROUPS}
    wanted = names if text == "all" else {n.strip() for n in text.split(",") if n.strip()}
    unknown = wanted - names
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown case group(s) {', '.join(sorted(unknown))}; choose from "
            f"{', '.join(g.name for g in GROUPS)} or all")
    if wanted & {"ls", "ls_local"}:
        wanted.add("many")
    return frozenset(wanted)


def run(args: argparse.Namespace) -> int:
    """Make the data, run every case, print the table and update the doc."""
    started = datetime.datetime.now().astimezone()
    t0 = time.perf_counter()
    data = benchdata.ensure(args.dir)
    workdir = Path(tempfile.mkdtemp(prefix="h5mount-bench-s3-"))
    ctx = bench_npy.Context(data, workdir, args.repeat, args.options, benchdata.CHUNKS[0],
                            prefault_gib=args.prefault_gib, max_busy=args.max_busy,
                            quiet_timeout=args.quiet_timeout, max_other=args.max_other,
                            retries=args.retries)
    cases = new_cases()
    try:
        with MotoServer() as moto:
            big = s3data.load_big(moto, data.h5file, workdir / "hsds-load-logs")
            current = Run(ctx, moto, big, args.options, find_moto_pid(moto), cases,
                          args.ls_timeout, args.h5pyd_repeat, cache_decoded=args.cache_decoded)
            chosen = [group for group in GROUPS if group.name in args.cases]
            with bench_npy.damon_paused(args.pause_damon) as paused:
                reclaim = bench_npy.reclaim_note(paused)
                if reclaim:
                    cases["b_ttl"].notes.append(reclaim)
                for group in chosen:
                    if not group.mount:
                        _guard(current, group.keys, group.fn)
                mounted = [group for group in chosen if group.mount]
                reason = _mount_ready(current) if mounted else None
                for group in mounted:
                    if reason is None:
                        _guard(current, group.keys, group.fn)
                    else:
                        for key in group.keys:
                            cases[key].status = "not available"
            if reason is not None:
                log.warning("the mount cannot serve the bucket yet: %s", reason)
                current.notes.append(f"Mount cases not run: {reason}")
        seconds = time.perf_counter() - t0
        report = s3report.Report(current, started, seconds, cache_budget_mib(args.options),
                                 " ".join([".venv/bin/python -m bench.bench_s3", *sys.argv[1:]]))
        print(report.text())
        doc = args.doc
        if doc is None and args.cases == parse_groups("all"):
            doc = s3report.DEFAULT_DOC
        if doc is not None and not args.no_doc:
            s3report.write_doc(doc, report.section())
        return 0
    finally:
        mounting.unmount(workdir / "mnt")
        mounting.unmount(workdir / "mnt-local")
        if mounting.is_mounted(workdir / "mnt"):
            log.error("%s is still mounted; workdir kept", workdir / "mnt")
        elif not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=benchdata.DEFAULT_DIR,
                        help=f"cache of big.h5 (default {benchdata.DEFAULT_DIR})")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (default 3)")
    parser.add_argument("-o", dest="options", default=DEFAULT_OPTIONS,
                        help=f"h5mount -o options (default {DEFAULT_OPTIONS})")
    bench_npy.add_quiet_options(parser, max_busy=0.2, quiet_timeout=10.0, retries=1)
    parser.add_argument("--h5pyd-repeat", type=int, default=1,
                        help="timed h5pyd reads, each through a fresh HSDS (default 1: "
                             "about 25 s each)")
    parser.add_argument("--ls-timeout", type=float, default=60.0,
                        help="cut off an `ls -lR` after this many seconds (default 60)")
    parser.add_argument("--cases", type=parse_groups, default=parse_groups("all"),
                        help="comma-separated groups of cases to run (default all): "
                             + ", ".join(g.name for g in GROUPS) + "; a run of some only "
                             "prints its results unless --doc is given")
    parser.add_argument("--cache-decoded", action="store_true",
                        help="mount the (b) warm case with -o cache_decoded too")
    parser.add_argument("--doc", type=Path, default=None,
                        help="markdown file to update (default docs/benchmarks.md when "
                             "every case runs)")
    parser.add_argument("--no-doc", action="store_true", help="only print the results")
    bench_npy.add_pause_damon(parser)
    bench_npy.add_prefault(parser)
    parser.add_argument("--keep-workdir", action="store_true",
                        help="keep the temporary directory (h5mount and HSDS logs)")
    parser.add_argument("--log-level", default="INFO", type=str.upper)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for handler in logging.getLogger().handlers:
        handler.addFilter(not_root)
    os.chdir(REPO)
    signal.signal(signal.SIGTERM, bench_npy.raise_on_sigterm)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
