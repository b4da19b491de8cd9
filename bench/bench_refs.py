"""Benchmark: a 1 GiB HDF5 file over loopback HTTP, mounted by its LINDI reference file.

This module owns the driver of the reference-file benchmark. In one run it
serves ``bench.data``'s ``big.h5`` with ``tests.http_server.RangeHttpServer``
in a process of its own (``bench.refpeers serve``, so its CPU is measured
apart), writes ``big.h5.lindi.json`` next to it with the real ``lindi``
package (``.venv-lindi``; its refs are the server's URL of ``big.h5``), and
reads the dataset ``/data`` (1 GiB decoded) whole, in these ways:

- (a) cold: ``cat data.npy > /dev/null`` on a fresh ``h5mount URL-OF-THE-REF
  MNT`` (the reference file also fetched over HTTP), page cache dropped;
- (a) warm, page cache: the same ``cat`` again on that mount;
- (a) warm, cache_dir: ``cat`` on a fresh mount whose ``-o cache_dir`` holds
  every block (filled by one earlier read), page cache dropped; with
  ``--cache-decoded`` those mounts add ``-o cache_decoded``, so the cache_dir
  holds every chunk decoded as well;
- (b) ``lindi.LindiH5pyFile.from_lindi_file(URL)`` reading ``/data`` in
  1024-row slabs (``.venv-lindi``: lindi, zarr 2);
- (c) fsspec's ``ReferenceFileSystem`` (``fo`` = the URL, ``remote_protocol``
  http, aiohttp) plus zarr 3's ``FsspecStore``, the same slabs (``.venv``);
- h5py reading the local ``big.h5`` in the same slabs, page cache dropped
  and page cache hot (the peer of the warm target);
- decoding alone: every chunk (its ``.zarray``'s zlib + shuffle) decoded
  from memory on 2 threads, by plain numcodecs and by the mount's own decoder
  (``layouts.formats.refs._codecs``, which inflates with libdeflate): the ceiling.

Every reader runs as a subprocess that times itself (the open included,
imports excluded) and reports its own CPU seconds; page caches are dropped
before every remote read. The bytes are checked: the first and last slab of
every peer read against ``bench.data``'s recipe, and ``data.npy`` once
(``bench_npy.check_npy``). The server's request log gives the requests of
each read. When the mount cannot serve the reference file yet, the mount
cases are reported as not available and the peers are still measured.

It prints a table and replaces its own section of ``docs/benchmarks.md``
(``bench.refreport``). Every mount is unmounted and the server stopped, also
on errors and SIGTERM; the reference file is removed at the end.

Run from the repository root, as root (for drop_caches)::

    .venv/bin/python -m bench.bench_refs
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
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

import h5py
import numpy as np

from bench import bench_npy, refpeers, refreport, s3peers
from bench import data as benchdata
from bench.bench_npy import Case, NotAvailable, Timed, timed, timed_cat, with_retries
from layouts.formats.refs import _codecs as lindi_codecs
from tests import mounting

log = logging.getLogger("bench.bench_refs")

REPO = Path(__file__).resolve().parent.parent
REF_NAME = "big.h5.lindi.json"
SLAB_ROWS = benchdata.CHUNKS[0]
#: The slabs every peer read is checked on: the first and the last.
CHECK_ROWS = (0, benchdata.SHAPE[0] - SLAB_ROWS)
WRITE_TIMEOUT = 300.0


def new_cases() -> dict[str, Case]:
    """The cases of one run, in report order, with the issue's figures as references."""
    cases = [
        Case("a_cold", "(a) cold", "`cat data.npy > /dev/null`, fresh mount of the reference "
             "file's URL, page cache dropped"),
        Case("a_page", "(a) warm, page cache", "the same `cat` again on that mount"),
        Case("a_disk", "(a) warm, cache_dir", "`cat` on a fresh mount whose `cache_dir` holds "
             "every block, page cache dropped"),
        Case("b", "(b) lindi", "`LindiH5pyFile.from_lindi_file(URL)`, `/data` in 1024-row "
             "slabs, page cache dropped", 0.235),
        Case("c", "(c) fsspec + zarr", "`ReferenceFileSystem(fo=URL, remote_protocol=\"http\")`"
             " + zarr 3 `FsspecStore`, same slabs, page cache dropped", 0.23),
        Case("h5_cold", "h5py local, cold", "h5py reading the local `big.h5`, same slabs, page "
             "cache dropped"),
        Case("h5_warm", "h5py local, warm", "the same, page cache hot", 0.54),
        Case("d", "(d) decode, numcodecs", f"numcodecs zlib + shuffle of every chunk from "
             f"memory, {refpeers.DECODE_THREADS} threads, no I/O", 0.8),
        Case("d_mount", "(d) decode, the mount's", "the same with the mount's decoder "
             "(`lindi_codecs.decode_chunk`: libdeflate + numcodecs shuffle)"),
    ]
    return {c.key: c for c in cases}


@dataclass
class Traffic:
    """What the server answered during one kept run of a case."""

    requests: list[refpeers.Request]
    peak: int


@dataclass
class Run:
    """Everything the cases of one run share."""

    ctx: bench_npy.Context
    server: refpeers.ServerProcess
    ref_url: str
    refs: dict[str, Any]
    cases: dict[str, Case]
    #: ``--cache-decoded``: the cache_dir mounts also keep decoded chunks.
    cache_decoded: bool = False
    traffic: dict[str, list[Traffic]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def workdir(self) -> Path:
        return self.ctx.workdir

    def pids(self, extra: dict[str, int] | None = None) -> dict[str, int]:
        """Processes whose CPU is the benchmark's own: the HTTP server, plus ``extra``."""
        return {"server": self.server.pid, **(extra or {})}


# ---------------------------------------------------------------------- set-up


def ensure_h5(base: Path) -> benchdata.BenchData:
    """``big.h5`` under ``base``, made by ``bench.data`` if missing (no HSDS bucket needed)."""
    base = Path(base).resolve()
    base.mkdir(parents=True, exist_ok=True)
    h5file, _root, bucket_dir, _marker = benchdata.paths(base)
    info: dict[str, Any] = {"shape": list(benchdata.SHAPE), "chunks": list(benchdata.CHUNKS),
                            "compression": f"gzip {benchdata.GZIP_LEVEL} + shuffle"}
    if not h5file.is_file():
        info.update(benchdata.make_h5(h5file))
    with h5py.File(h5file, "r") as f:
        info["h5_stored_bytes"] = int(f[benchdata.DATASET].id.get_storage_size())
    return benchdata.BenchData(base, h5file, bucket_dir, benchdata.DOMAIN, benchdata.DATASET,
                               info)


def write_reference(h5file: Path, url: str, out: Path) -> float:
    """Write ``out`` (a ``.lindi.json`` whose refs name ``url``) with lindi; return seconds."""
    code = ("import sys, lindi; lindi.LindiH5ZarrStore.from_file(sys.argv[1], url=sys.argv[2])"
            ".write_reference_file_system(sys.argv[3])")
    started = time.perf_counter()
    proc = subprocess.run([str(refpeers.LINDI_PYTHON), "-c", code, str(h5file), url, str(out)],
                          capture_output=True, text=True, check=False, timeout=WRITE_TIMEOUT)
    if proc.returncode != 0:
        raise bench_npy.BenchError(f"lindi could not write {out}: "
                                   + " ".join(proc.stderr.split())[-400:])
    return time.perf_counter() - started


def expected_digests() -> dict[int, str]:
    """SHA-256 of the recipe's slabs at ``CHECK_ROWS``."""
    return {row0: refpeers.digest(benchdata.block_values(row0, SLAB_ROWS))
            for row0 in CHECK_ROWS}


def _keep_traffic(run: Run, case: Case, attempts: list[Traffic]) -> None:
    """Record the traffic of the attempt ``with_retries`` kept (the last one)."""
    if attempts:
        run.traffic.setdefault(case.key, []).append(attempts[-1])


# ---------------------------------------------------------------------- peers


def measure_reader(run: Run, case: Case, kind: str, target: str, *, drop: bool) -> None:
    """``ctx.repeat`` kept runs of one reader subprocess, the page cache dropped first if ``drop``.

    The CPU recorded is the reader's own during its read, plus the server's.
    """
    expected = expected_digests()
    for _ in range(run.ctx.repeat):
        attempts: list[Traffic] = []

        def one(attempts: list[Traffic] = attempts) -> list[Timed]:
            if drop:
                bench_npy.drop_caches_noted(case)
            run.server.clear()
            found: list[refpeers.ReadResult] = []

            def read() -> tuple[float, int]:
                found.append(refpeers.run_reader(kind, target, benchdata.DATASET, SLAB_ROWS,
                                                 CHECK_ROWS))
                return found[0].seconds, found[0].nbytes

            done = timed(run.ctx, case, read, run.pids())
            if found[0].digests != expected:
                raise bench_npy.BenchError(f"{kind} read wrong data (slabs at rows "
                                           f"{', '.join(map(str, CHECK_ROWS))})")
            attempts.append(Traffic(*run.server.take()))
            done.watch.own = {kind: found[0].cpu, "server": done.watch.own.get("server", 0.0)}
            return [done]

        with_retries(run.ctx, one)
        _keep_traffic(run, case, attempts)


def run_remote_peers(run: Run) -> None:
    """(b) lindi and (c) fsspec + zarr, both reading the reference file's URL."""
    measure_reader(run, run.cases["b"], "lindi", run.ref_url, drop=True)
    measure_reader(run, run.cases["c"], "fsspec", run.ref_url, drop=True)


def run_h5py(run: Run) -> None:
    """h5py on the local file: page cache dropped, then hot (after one untimed read)."""
    target = str(run.ctx.data.h5file)
    measure_reader(run, run.cases["h5_cold"], "h5py", target, drop=True)
    refpeers.run_reader("h5py", target, benchdata.DATASET, SLAB_ROWS, CHECK_ROWS)
    measure_reader(run, run.cases["h5_warm"], "h5py", target, drop=False)


def mount_decoder(zarray: dict[str, Any]) -> refpeers.Decode:
    """The mount's own chunk decoder (``layouts.formats.refs._codecs``) for a float ``.zarray``."""
    dtype = np.dtype(zarray["dtype"])
    configs = [*(zarray.get("filters") or []), *([zarray["compressor"]]
                                                  if zarray.get("compressor") else [])]
    spec = lindi_codecs.ChunkSpec(lindi_codecs.Kind.RAW, tuple(zarray["chunks"]), dtype, dtype,
                                  lindi_codecs.codecs(configs))
    return lambda raw: lindi_codecs.decode_chunk(raw, spec, benchdata.DATASET)


def run_decode(run: Run) -> None:
    """(d): every chunk decoded from memory on 2 threads, by numcodecs and by the mount's code."""
    decoder = refpeers.ChunkDecoder(run.ctx.data.h5file, run.refs, benchdata.DATASET)
    try:
        run.facts["decode_note"] = (f"{len(decoder.chunks)} chunks, "
                                    f"{decoder.stored / 2**20:.0f} MiB stored, read from the "
                                    "local file into memory before timing")
        for key, decode in (("d", refpeers.numcodecs_decoder(decoder.zarray)),
                            ("d_mount", mount_decoder(decoder.zarray))):
            case = run.cases[key]
            s3peers.check_first_chunk(decoder.first_chunk(decode))
            decoder.decode_all(decode)  # untimed: threads and allocator warm
            for _ in range(run.ctx.repeat):
                with_retries(run.ctx, lambda case=case, decode=decode: [
                    timed(run.ctx, case, lambda: decoder.decode_all(decode))])
    finally:
        decoder.close()


# ---------------------------------------------------------------------- the mount


@contextlib.contextmanager
def ref_mount(run: Run, ctx: bench_npy.Context) -> Iterator[tuple[Path, dict[str, int]]]:
    """A fresh ``h5mount REF-URL workdir/mnt`` with ``ctx``'s options; the pids to watch."""
    started = time.perf_counter()
    with bench_npy.bench_mount(run.ref_url, run.workdir / "mnt", *ctx.h5mount_args()) as (mp, pid):
        run.facts.setdefault("mount_s", []).append(time.perf_counter() - started)
        yield mp, run.pids({} if pid is None else {"h5mount": pid})


def npy_path(mp: Path) -> Path:
    path = mp / f"{benchdata.DATASET}.npy"
    if not path.exists():
        raise NotAvailable(f"{path.name} does not exist on the mount")
    return path


def mount_ready(run: Run) -> str | None:
    """None when a fresh mount of the reference file shows ``data.npy``; else why not."""
    try:
        with ref_mount(run, run.ctx) as (mp, _pids):
            npy_path(mp)
    except NotAvailable as exc:
        return str(exc)
    return None


def run_cold(run: Run) -> None:
    """(a) cold ``cat`` on fresh mounts, each followed by a page-cache ``cat``."""
    cold, page = run.cases["a_cold"], run.cases["a_page"]
    for attempt in range(run.ctx.repeat):
        attempts: list[tuple[Traffic, Traffic]] = []

        def one(attempt: int = attempt, attempts: list[tuple[Traffic, Traffic]] = attempts
                ) -> list[Timed]:
            bench_npy.drop_caches_noted(cold)
            run.server.clear()
            with ref_mount(run, run.ctx) as (mp, pids):
                npy = npy_path(mp)
                runs = [timed(run.ctx, cold, lambda: timed_cat(npy), pids)]
                first = Traffic(*run.server.take())  # the mount's start included
                runs.append(timed(run.ctx, page, lambda: timed_cat(npy), pids))
                attempts.append((first, Traffic(*run.server.take())))
                run.facts["read_ahead_kb"] = bench_npy.read_ahead_kb(mp)
                if attempt == 0:
                    bench_npy.check_npy(npy)
                    log.info("data.npy checked")
            return runs

        with_retries(run.ctx, one)
        if attempts:
            _keep_traffic(run, cold, [attempts[-1][0]])
            _keep_traffic(run, page, [attempts[-1][1]])


def run_disk(run: Run) -> None:
    """(a) warm, cache_dir: fresh mounts reading from a filled ``cache_dir``, page cache dropped."""
    case = run.cases["a_disk"]
    cache_dir = run.workdir / "blocks"
    cache_dir.mkdir()
    extra = f"cache_dir={cache_dir}"
    if run.cache_decoded:
        extra += ",cache_decoded"
        case.notes.append("mounted with `-o cache_decoded`: decoded chunks kept in the cache_dir")
    options = f"{run.ctx.mount_options},{extra}" if run.ctx.mount_options else extra
    ctx = dataclasses.replace(run.ctx, mount_options=options)
    bench_npy.drop_caches_noted(case)
    with ref_mount(run, ctx) as (mp, _pids):
        seconds, size = timed_cat(npy_path(mp))
    stored = sum(path.stat().st_size for path in cache_dir.rglob("*") if path.is_file())
    case.notes.append(f"one `cat` filled the cache_dir ({stored / 2**20:.0f} MiB) at "
                      f"{size / bench_npy.GIB / seconds:.2f} GiB/s")
    for _ in range(run.ctx.repeat):
        attempts: list[Traffic] = []

        def one(attempts: list[Traffic] = attempts) -> list[Timed]:
            bench_npy.drop_caches_noted(case)
            run.server.clear()
            with ref_mount(run, ctx) as (mp, pids):
                runs = [timed(run.ctx, case, lambda: timed_cat(npy_path(mp)), pids)]
            attempts.append(Traffic(*run.server.take()))
            return runs

        with_retries(run.ctx, one)
        _keep_traffic(run, case, attempts)


# ---------------------------------------------------------------------- driver


def _guard(run: Run, keys: tuple[str, ...], fn: Callable[[Run], None]) -> None:
    """Run one group of cases; record NotAvailable and errors on its cases, not fatal."""
    bench_npy.guard(run.cases, run.notes, keys, lambda: fn(run),
                    (bench_npy.BenchError, refpeers.PeerError, s3peers.PeerError, OSError,
                     subprocess.SubprocessError))


def run(args: argparse.Namespace) -> int:
    """Serve the file, write the reference file, run every case, print and write the report."""
    started = datetime.datetime.now().astimezone()
    t0 = time.perf_counter()
    data = ensure_h5(args.dir)
    workdir = Path(tempfile.mkdtemp(prefix="h5mount-bench-refs-"))
    ctx = bench_npy.Context(data, workdir, args.repeat, args.options, SLAB_ROWS,
                            max_busy=args.max_busy, quiet_timeout=args.quiet_timeout,
                            max_other=args.max_other, retries=args.retries)
    ref_file = data.dir / REF_NAME
    try:
        with refpeers.ServerProcess(data.dir) as server:
            seconds = write_reference(data.h5file, server.url_for(data.h5file.name), ref_file)
            current = Run(ctx, server, server.url_for(REF_NAME),
                          json.loads(ref_file.read_text())["refs"], new_cases(),
                          cache_decoded=args.cache_decoded)
            current.facts.update(ref_write_s=seconds, ref_bytes=ref_file.stat().st_size)
            _guard(current, ("d", "d_mount"), run_decode)
            _guard(current, ("h5_cold", "h5_warm"), run_h5py)
            _guard(current, ("b", "c"), run_remote_peers)
            reason = mount_ready(current)
            if reason is None:
                _guard(current, ("a_cold", "a_page"), run_cold)
                _guard(current, ("a_disk",), run_disk)
            else:
                log.warning("the mount cannot serve the reference file yet: %s", reason)
                current.notes.append(f"Mount cases not run: {reason}")
                for key in ("a_cold", "a_page", "a_disk"):
                    current.cases[key].status = "not available"
        report = refreport.Report(current, started, time.perf_counter() - t0,
                                  " ".join([".venv/bin/python -m bench.bench_refs", *sys.argv[1:]]))
        print(report.section() if args.markdown else report.text())
        if not args.no_doc:
            refreport.write_doc(args.doc, report.section())
        return 0
    finally:
        mounting.unmount(workdir / "mnt")
        ref_file.unlink(missing_ok=True)
        if mounting.is_mounted(workdir / "mnt"):
            log.error("%s is still mounted; workdir kept", workdir / "mnt")
        elif not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=benchdata.DEFAULT_DIR,
                        help=f"where big.h5 is (made if missing; default {benchdata.DEFAULT_DIR})")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (default 3)")
    parser.add_argument("-o", dest="options", default=None,
                        help="h5mount -o options (default: none, the daemon's defaults)")
    bench_npy.add_quiet_options(parser, max_busy=0.2, quiet_timeout=10.0, retries=1)
    parser.add_argument("--cache-decoded", action="store_true",
                        help="mount the warm cache_dir case with -o cache_decoded too")
    parser.add_argument("--doc", type=Path, default=refreport.DEFAULT_DOC,
                        help="markdown file to update (default docs/benchmarks.md)")
    parser.add_argument("--no-doc", action="store_true", help="only print the results")
    parser.add_argument("--markdown", action="store_true",
                        help="print the markdown section instead of the plain-text tables")
    parser.add_argument("--keep-workdir", action="store_true",
                        help="keep the temporary directory (h5mount log)")
    parser.add_argument("--log-level", default="INFO", type=str.upper)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    os.chdir(REPO)
    signal.signal(signal.SIGTERM, bench_npy.raise_on_sigterm)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
