#!/usr/bin/env python3
"""Regenerate ``examples/sample-bucket/``, the small demo HSDS bucket h5mount mounts.

This script owns the sample data: it writes ``sample.h5`` with h5py, starts a
real HSDS (hsds 1.0.2, via ``tests/hsds_server.py``) on loopback with POSIX
storage in a temporary directory, hsloads the file to ``/home/admin/sample.h5``,
flushes it, waits for HSDS's background summary (``.info.json``,
``.summary.json``), stops HSDS and copies the bucket directory (``home/`` and
``db/``) to the output directory, replacing whatever was there.

Object ids are random, so every run gives different file names under ``db/``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.hsds_server import HsdsServer, hsds_node_available  # noqa: E402

log = logging.getLogger(__name__)

DOMAIN = "/home/admin/sample.h5"
BUCKET = "sample-bucket"
DEFAULT_OUT = REPO / "examples" / "sample-bucket"

STATIONS = (
    ("Aberdeen", 57.15, -2.09, 65.0),
    ("Bergen", 60.39, 5.32, 12.0),
    ("Cork", 51.90, -8.47, 20.0),
    ("Dundee", 56.46, -2.97, 40.0),
    ("Esbjerg", 55.47, 8.45, 5.0),
    ("Faro", 37.02, -7.93, 7.0),
    ("Galway", 53.27, -9.05, 15.0),
    ("Hamburg", 53.55, 9.99, 6.0),
)


def write_sample(path: Path) -> Path:
    """Write the demo HDF5 file: a few groups, attributes, a soft link, a table."""
    hours = 24
    rng = np.random.default_rng(20261121)
    t = np.arange(hours)[:, None]
    lat = np.array([s[1] for s in STATIONS])[None, :]
    temperature = (
        25.0 - 0.35 * lat + 4.0 * np.sin((t - 9) / 24 * 2 * np.pi) + rng.normal(0, 0.4, (hours, 8))
    ).astype("<f4")
    pressure = (1013.0 + rng.normal(0, 4, (hours, 8)).cumsum(axis=0) * 0.3).astype("<f8")

    with h5py.File(path, "w") as f:
        f.attrs["title"] = "h5mount sample bucket: hourly readings from eight coastal stations"
        f.attrs["source"] = "synthetic data made by examples/make_sample_bucket.py"
        f.attrs["version"] = np.int32(1)

        meas = f.create_group("measurements")
        meas.attrs["description"] = "one row per hour, one column per station"
        temp = meas.create_dataset(
            "temperature", data=temperature, chunks=(12, 4), compression="gzip", shuffle=True
        )
        temp.attrs["units"] = "degC"
        temp.attrs["long_name"] = "air temperature at 2 m"
        temp.attrs["valid_range"] = np.array([-40.0, 50.0], dtype="<f4")
        pres = meas.create_dataset("pressure", data=pressure, chunks=(12, 8))
        pres.attrs["units"] = "hPa"
        pres.attrs["long_name"] = "air pressure at sea level"
        hour = meas.create_dataset("hour", data=np.arange(hours, dtype="<i2"))
        hour.attrs["units"] = "hours since 2026-11-21T00:00:00Z"

        stations = f.create_group("stations")
        stations.create_dataset(
            "names",
            data=np.array([s[0] for s in STATIONS], dtype=object),
            dtype=h5py.string_dtype(),
        )
        row = np.dtype(
            [("id", "<i4"), ("name", "S12"), ("lat", "<f8"), ("lon", "<f8"), ("elevation_m", "<f4")]
        )
        table = np.array(
            [(i, name.encode(), la, lo, el) for i, (name, la, lo, el) in enumerate(STATIONS)],
            dtype=row,
        )
        tbl = stations.create_dataset("table", data=table)
        tbl.attrs["description"] = "station id, name, position (degrees) and elevation"

        cfg = f.create_group("config")
        cfg.create_dataset("sample_interval_s", data=np.int32(3600))
        cfg.create_dataset("operator", data="h5mount examples", dtype=h5py.string_dtype())

        f["latest"] = h5py.SoftLink("/measurements/temperature")
    return path


def build(out: Path, keep_h5: Path | None) -> None:
    """Make the bucket in a temporary HSDS root, then replace ``out`` with it."""
    with tempfile.TemporaryDirectory(prefix="h5mount-sample-") as tmp:
        work = Path(tmp)
        h5file = write_sample(work / "sample.h5")
        server = HsdsServer(work / "root", BUCKET)  # logs kept only on failure
        with server:
            server.load(h5file, DOMAIN)
            server.flush_and_verify(DOMAIN, h5file)
            server.wait_for_scan(DOMAIN)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(server.bucket_dir, out)
        if keep_h5 is not None:
            shutil.copyfile(h5file, keep_h5)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log.info("wrote %s (%d files, %d bytes)", out, len(list(out.rglob("*.json"))), size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(
            "Write a small demo HDF5 file, load it into a temporary real HSDS "
            f"(domain {DOMAIN}) and copy the resulting bucket directory to OUT, "
            "replacing OUT. Needs hsds 1.0.2 and h5pyd installed (hsds-node, hstouch, "
            "hsload on PATH); HSDS listens only while the script runs, on free ports."
        )
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="bucket directory to (re)create; it gets home/ and db/ (default: %(default)s)",
    )
    parser.add_argument(
        "--keep-h5",
        type=Path,
        metavar="PATH",
        help="also copy the source HDF5 file to PATH",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not hsds_node_available():
        parser.error("hsds-node, hstouch or hsload not found; pip install 'hsds==1.0.2' h5pyd")
    build(args.out.resolve(), args.keep_h5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
