"""The benchmark's data: one 1 GiB float32 HDF5 file and the HSDS bucket it is loaded into.

This module owns making, once, under a cache directory (default
``/var/tmp/h5mount-bench``):

- ``big.h5``: dataset ``/data``, float32, shape (16384, 16384), chunks
  (1024, 1024) (4 MiB), gzip level 4 + shuffle. The values are a smooth field
  plus low-amplitude noise, quantised to 1/64, so gzip gets about 2.5x.
- ``hsds/bench/``: an HSDS bucket (POSIX storage) with that file hsloaded as
  ``/home/admin/big.h5`` by a real HSDS on loopback, flushed before HSDS stops.
- ``READY.json``: written last; while it is there and matches, everything is
  reused as it is.

Run ``.venv/bin/python -m bench.data [--dir DIR] [--force]`` from the repository root;
``bench.bench_npy`` calls :func:`ensure` itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from tests.hsds_server import ADMIN_PASSWORD, ADMIN_USER, HsdsError, HsdsServer

log = logging.getLogger("bench.data")

DEFAULT_DIR = Path("/var/tmp/h5mount-bench")
BUCKET = "bench"
DOMAIN = "/home/admin/big.h5"
DATASET = "data"
SHAPE = (16384, 16384)
CHUNKS = (1024, 1024)
DTYPE = np.dtype("<f4")
GZIP_LEVEL = 4
QUANTUM = 1.0 / 64.0
NOISE = 1.0
SEED = 20240611
#: Bump when the recipe changes, so an old cache is rebuilt.
RECIPE_VERSION = 1

HSLOAD_TIMEOUT = 3 * 3600.0


@dataclass(frozen=True)
class BenchData:
    """Where the benchmark data lives, plus the facts recorded when it was made."""

    dir: Path
    h5file: Path
    bucket_dir: Path
    domain: str
    dataset: str
    info: dict[str, Any]

    @property
    def nbytes(self) -> int:
        """Decoded size of the dataset in bytes."""
        return int(np.prod(SHAPE)) * DTYPE.itemsize


def paths(base: Path) -> tuple[Path, Path, Path, Path]:
    """(h5 file, HSDS root_dir, bucket dir, marker file) under ``base``."""
    root = base / "hsds"
    return base / "big.h5", root, root / BUCKET, base / "READY.json"


def _dir_bytes(path: Path) -> tuple[int, int]:
    """(total size, number of files) of every file under ``path``."""
    total = count = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            count += 1
    return total, count


def block_values(row0: int, rows: int, cols: int = SHAPE[1]) -> np.ndarray:
    """The dataset's rows ``row0 .. row0 + rows`` (deterministic for a given ``row0``)."""
    rng = np.random.default_rng([SEED, row0])
    y = np.arange(row0, row0 + rows, dtype=np.float64)[:, None]
    x = np.arange(cols, dtype=np.float64)[None, :]
    field = 100.0 * np.sin(x / 317.0) * np.cos(y / 211.0) + 20.0 * np.sin((x + y) / 97.0)
    field += rng.normal(0.0, NOISE, field.shape)
    return (np.round(field / QUANTUM) * QUANTUM).astype(DTYPE)


def make_h5(path: Path) -> dict[str, Any]:
    """Write the HDF5 file to ``path`` (through a temporary name) and return its facts."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    started = time.perf_counter()
    rows = CHUNKS[0]
    with h5py.File(tmp, "w") as f:
        dset = f.create_dataset(
            DATASET, shape=SHAPE, dtype=DTYPE, chunks=CHUNKS,
            compression="gzip", compression_opts=GZIP_LEVEL, shuffle=True,
        )
        dset.attrs["description"] = "h5mount benchmark: smooth field + noise, quantised to 1/64"
        for row0 in range(0, SHAPE[0], rows):
            dset[row0:row0 + rows] = block_values(row0, rows)
            log.info("big.h5: wrote rows %d-%d of %d (%.0f s)",
                     row0, row0 + rows - 1, SHAPE[0], time.perf_counter() - started)
        stored = int(dset.id.get_storage_size())
    os.replace(tmp, path)
    seconds = time.perf_counter() - started
    raw = int(np.prod(SHAPE)) * DTYPE.itemsize
    log.info("big.h5: %d bytes stored for %d decoded (gzip ratio %.2f) in %.1f s",
             stored, raw, raw / stored, seconds)
    return {"write_h5_s": round(seconds, 1), "h5_stored_bytes": stored,
            "h5_file_bytes": path.stat().st_size, "h5_gzip_ratio": round(raw / stored, 3)}


def _run_hsload(server: HsdsServer, h5file: Path, domain: str, bucket_dir: Path,
                workdir: Path) -> None:
    """Run ``hsload`` against ``server``, logging progress every 30 s; raise on failure."""
    workdir.mkdir(parents=True, exist_ok=True)
    # h5pyd tools read ./.hscfg before ~/.hscfg: pin every setting here.
    (workdir / ".hscfg").write_text(
        f"hs_endpoint = {server.endpoint}\n"
        f"hs_username = {ADMIN_USER}\nhs_password = {ADMIN_PASSWORD}\n"
    )
    out_path = workdir / "hsload.log"
    started = time.monotonic()
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            ["hsload", str(h5file), domain], env=server.client_env(), cwd=workdir,
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
        try:
            while True:
                try:
                    proc.wait(timeout=30.0)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > HSLOAD_TIMEOUT:
                        raise HsdsError(f"hsload still running after {elapsed:.0f} s") from None
                    size, files = _dir_bytes(bucket_dir)
                    log.info("hsload running %.0f s: bucket has %d files, %.0f MiB",
                             elapsed, files, size / 2**20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        text = out_path.read_text(errors="replace")[-4000:]
        raise HsdsError(f"hsload exited {proc.returncode}:\n{text}" + server.logs_tail(20))


def load_bucket(h5file: Path, root_dir: Path, bucket_dir: Path, base: Path) -> dict[str, Any]:
    """Load ``h5file`` into a fresh bucket with a real HSDS; flush and stop it; return timings."""
    if root_dir.exists():
        log.info("removing incomplete bucket %s", root_dir)
        shutil.rmtree(root_dir)
    root_dir.mkdir(parents=True)
    log_dir = base / "hsds-logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    facts: dict[str, Any] = {}
    with HsdsServer(root_dir, BUCKET, log_dir=log_dir) as server:
        server.ensure_folder("/home/")
        server.ensure_folder(f"/home/{ADMIN_USER}/", owner=ADMIN_USER)
        log.info("hsload %s -> %s (1 GiB: this takes a while)", h5file, DOMAIN)
        started = time.perf_counter()
        _run_hsload(server, h5file, DOMAIN, bucket_dir, log_dir / "client-cwd")
        facts["hsload_s"] = round(time.perf_counter() - started, 1)
        log.info("hsload done in %.1f s; flushing", facts["hsload_s"])
        started = time.perf_counter()
        server.flush_and_verify(DOMAIN, h5file, timeout=900.0)
        facts["flush_verify_s"] = round(time.perf_counter() - started, 1)
        log.info("flushed and verified in %.1f s; stopping HSDS", facts["flush_verify_s"])
    size, files = _dir_bytes(bucket_dir)
    facts["bucket_bytes"] = size
    facts["bucket_files"] = files
    return facts


def chunk_dir(bucket_dir: Path, domain: str = DOMAIN, dataset: str = DATASET) -> Path:
    """The bucket directory that holds the chunk objects of ``domain``'s ``/dataset``.

    Follows the domain's ``root`` (never scans ``db/``): the root group's link
    gives the dataset id ``d-<uuid1>-<uuid2>``, whose chunks are in
    ``db/<uuid1>/d/<uuid2>/`` (possibly in ``p<N>/`` partition folders).
    """
    dom = json.loads((bucket_dir / domain.strip("/") / ".domain.json").read_bytes())
    root_id = str(dom["root"])
    uuid1 = root_id[2:19]
    group = json.loads((bucket_dir / "db" / uuid1 / ".group.json").read_bytes())
    dset_id = str(group["links"][dataset]["id"])
    return bucket_dir / "db" / dset_id[2:19] / "d" / dset_id[20:]


def chunk_files(bucket_dir: Path, domain: str = DOMAIN, dataset: str = DATASET) -> list[Path]:
    """Every stored chunk object of the dataset (names like ``3_7``), sorted."""
    found: list[Path] = []
    for dirpath, _dirs, files in os.walk(chunk_dir(bucket_dir, domain, dataset)):
        for name in files:
            if all(part.isdigit() for part in name.split("_")):
                found.append(Path(dirpath) / name)
    return sorted(found)


def _dataset_layout(bucket_dir: Path) -> dict[str, Any]:
    doc = json.loads((chunk_dir(bucket_dir) / ".dataset.json").read_bytes())
    layout = doc.get("layout") or doc.get("creationProperties", {}).get("layout", {})
    filters = doc.get("creationProperties", {}).get("filters", [])
    return {"layout": layout, "filters": filters}


def ensure(base: Path = DEFAULT_DIR, *, force: bool = False) -> BenchData:
    """Make the file and bucket under ``base`` unless a complete, matching set is there."""
    base = Path(base).resolve()
    base.mkdir(parents=True, exist_ok=True)
    h5file, root_dir, bucket_dir, marker = paths(base)
    if not force and marker.is_file():
        info = json.loads(marker.read_text())
        if (info.get("recipe") == RECIPE_VERSION and h5file.is_file()
                and h5file.stat().st_size == info.get("h5_file_bytes")
                and (bucket_dir / DOMAIN.strip("/") / ".domain.json").is_file()):
            log.info("reusing benchmark data in %s (made %s)", base, info.get("made"))
            return BenchData(base, h5file, bucket_dir, DOMAIN, DATASET, info)
        log.warning("%s does not match what is on disk; rebuilding", marker)
    marker.unlink(missing_ok=True)
    info: dict[str, Any] = {"recipe": RECIPE_VERSION, "shape": list(SHAPE),
                            "chunks": list(CHUNKS), "dtype": DTYPE.str,
                            "compression": f"gzip {GZIP_LEVEL} + shuffle"}
    if force or not h5file.is_file():
        info.update(make_h5(h5file))
    else:
        log.info("reusing %s", h5file)
        with h5py.File(h5file, "r") as f:
            stored = int(f[DATASET].id.get_storage_size())
        raw = int(np.prod(SHAPE)) * DTYPE.itemsize
        info.update({"h5_stored_bytes": stored, "h5_file_bytes": h5file.stat().st_size,
                     "h5_gzip_ratio": round(raw / stored, 3)})
    info.update(load_bucket(h5file, root_dir, bucket_dir, base))
    files = chunk_files(bucket_dir)
    chunk_bytes = sum(p.stat().st_size for p in files)
    raw = int(np.prod(SHAPE)) * DTYPE.itemsize
    info.update({"chunk_objects": len(files), "chunk_object_bytes": chunk_bytes,
                 "hsds_ratio": round(raw / chunk_bytes, 3), **_dataset_layout(bucket_dir),
                 "made": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, marker)
    log.info("benchmark data ready in %s: %s", base, json.dumps(info))
    return BenchData(base, h5file, bucket_dir, DOMAIN, DATASET, info)


def main(argv: list[str] | None = None) -> int:
    """Command line: make (or check) the benchmark data and print where it is."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"cache directory (default {DEFAULT_DIR})")
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    parser.add_argument("--log-level", default="INFO", type=str.upper)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    data = ensure(args.dir, force=args.force)
    print(json.dumps({"h5file": str(data.h5file), "bucket": str(data.bucket_dir),
                      "domain": data.domain, **data.info}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
