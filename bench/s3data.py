"""The S3 benchmark's data, rebuilt on a fresh moto S3 server in every run.

This module owns putting two domains into one moto bucket and recording how
long that took:

- ``/home/admin/big.h5``: the 1 GiB dataset of ``bench.data`` (its cached
  ``big.h5``), hsloaded by a real HSDS whose storage *is* the moto bucket
  (S3 mode), flushed and checked key by key on S3 (:func:`load_big`);
- ``/home/admin/many.h5``: 100 groups of 99 small datasets (10,000 objects),
  built with h5pyd, flushing every 1,000 objects (:func:`build_many`).

HSDS 1.0.2 opens a new aiobotocore client for every storage request, which
costs its data node about 35 ms of CPU here: building 10,000 objects directly
on S3 takes about 15 minutes. ``many.h5`` is therefore built through an HSDS
with POSIX storage, timed with h5pyd ``visititems`` right after the build
(the freshly loaded domain: its background scan is held off, so h5pyd has no
summary to fetch all metadata at once), and then copied key for key into the
moto bucket next to ``big.h5``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import data as benchdata
from bench.s3peers import h5pyd_file
from tests.hsds_server import ADMIN_USER, HsdsServer, S3Keys, S3Storage
from tests.moto_server import MotoServer

log = logging.getLogger("bench.s3data")

BUCKET = "bench"
BIG_DOMAIN = benchdata.DOMAIN
MANY_DOMAIN = "/home/admin/many.h5"
MANY_GROUPS = 100
MANY_DATASETS_PER_GROUP = 99
MANY_FLUSH_EVERY = 1000
#: Long enough that HSDS never scans ``many.h5`` while the benchmark runs.
NO_SCAN = 3600.0


@dataclass
class BigOnS3:
    """``big.h5`` as stored on S3: where its chunks are, and how long loading took."""

    domain: str
    dataset_key: str
    chunk_keys: list[str]
    chunk_bytes: int
    dataset_json: dict[str, Any]
    facts: dict[str, float] = field(default_factory=dict)


@dataclass
class ManyDomain:
    """``many.h5``: its object count, the h5pyd ``visititems`` timing and build facts."""

    domain: str
    objects: int
    keys: int
    visititems_s: float
    visited: int
    bucket_dir: Path
    facts: dict[str, float] = field(default_factory=dict)


def storage_of(moto: MotoServer) -> S3Storage:
    """The moto server as HSDS storage (credentials from ``MotoServer.env()``)."""
    return S3Storage.from_env(moto.endpoint, moto.env())


def _read_json(keys: S3Keys, key: str) -> dict[str, Any]:
    raw = keys.get(key)
    if raw is None:
        raise RuntimeError(f"s3://{keys.bucket}/{key} is missing")
    return dict(json.loads(raw))


def dataset_prefix(keys: S3Keys, domain: str, dataset: str) -> str:
    """The key prefix (``db/<uuid1>/d/<uuid2>/``) of ``domain``'s root-level ``dataset``.

    Follows the domain's ``root`` and the root group's link, never scans ``db/``.
    """
    root = str(_read_json(keys, domain.strip("/") + "/.domain.json")["root"])
    group = _read_json(keys, f"db/{root[2:19]}/.group.json")
    dset_id = str(group["links"][dataset]["id"])
    return f"db/{dset_id[2:19]}/d/{dset_id[20:]}/"


def load_big(moto: MotoServer, h5file: Path, log_dir: Path) -> BigOnS3:
    """hsload ``h5file`` to ``big.h5`` through an HSDS storing on moto; flush and check it.

    Creates the bucket. HSDS is stopped on return; everything is on S3.
    """
    facts: dict[str, float] = {}
    started = time.perf_counter()
    moto.create_bucket(BUCKET)
    with HsdsServer(None, BUCKET, s3=storage_of(moto), log_dir=log_dir) as server:
        facts["hsds_start_s"] = time.perf_counter() - started
        log.info("hsload %s -> s3://%s%s (1 GiB: about a minute)", h5file, BUCKET, BIG_DOMAIN)
        t0 = time.perf_counter()
        server.load(h5file, BIG_DOMAIN)
        facts["hsload_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        server.flush_and_verify(BIG_DOMAIN, h5file, timeout=600.0)
        facts["flush_verify_s"] = time.perf_counter() - t0
        log.info("hsload %.1f s, flush + check on S3 %.1f s",
                 facts["hsload_s"], facts["flush_verify_s"])
    facts["total_s"] = time.perf_counter() - started
    keys = S3Keys(storage_of(moto).client(), BUCKET)
    prefix = dataset_prefix(keys, BIG_DOMAIN, benchdata.DATASET)
    listing = keys.listing(prefix)
    chunks = sorted(key for key in listing if _is_chunk_name(key.rsplit("/", 1)[1]))
    return BigOnS3(BIG_DOMAIN, prefix + ".dataset.json", chunks,
                   sum(listing[key] for key in chunks),
                   _read_json(keys, prefix + ".dataset.json"), facts)


def _is_chunk_name(name: str) -> bool:
    return all(part.isdigit() for part in name.split("_"))


def _create_many(server: HsdsServer) -> int:
    """Create ``many.h5`` with h5pyd, flushing every 1,000 objects; return the object count."""
    count = 0
    with h5pyd_file(server.endpoint, MANY_DOMAIN, "w") as f:
        for g in range(MANY_GROUPS):
            grp = f.create_group(f"group{g:03d}")
            count += 1
            for d in range(MANY_DATASETS_PER_GROUP):
                grp.create_dataset(f"data{d:03d}", shape=(4,), dtype="<i4")
                count += 1
                if count % MANY_FLUSH_EVERY == 0:
                    f.flush()
                    log.info("many.h5: %d objects", count)
    return count


def visititems(endpoint: str, domain: str) -> tuple[float, int]:
    """Time h5pyd opening ``domain`` and ``visititems`` over it: (seconds, objects visited)."""
    visited = 0

    def visit(_name: str, _obj: object) -> None:
        nonlocal visited
        visited += 1

    started = time.perf_counter()
    with h5pyd_file(endpoint, domain, "r") as f:
        f.visititems(visit)
    return time.perf_counter() - started, visited


def build_many(moto: MotoServer, workdir: Path,
               before_visit: Callable[[], None] = lambda: None) -> ManyDomain:
    """Build ``many.h5`` with h5pyd, time ``visititems`` on it at once, copy it to moto.

    ``before_visit`` runs right before the timed ``visititems`` (e.g. to wait
    for quiet CPUs). The bucket must exist (``load_big`` made it and the
    ``/home/admin/`` folder).
    """
    facts: dict[str, float] = {}
    root = workdir / "hsds-many"
    started = time.perf_counter()
    with HsdsServer(root, BUCKET, log_dir=workdir / "hsds-many-logs",
                    scan_wait=NO_SCAN) as server:
        server.ensure_folder("/home/")
        server.ensure_folder(f"/home/{ADMIN_USER}/", owner=ADMIN_USER)
        objects = _create_many(server)
        server.flush(MANY_DOMAIN)
        facts["build_s"] = time.perf_counter() - started
        log.info("many.h5: %d objects built and flushed in %.1f s", objects, facts["build_s"])
        before_visit()
        seconds, visited = visititems(server.endpoint, MANY_DOMAIN)
        log.info("h5pyd visititems on the fresh domain: %d objects in %.1f s", visited, seconds)
        bucket_dir = server.bucket_dir
    t0 = time.perf_counter()
    copied = copy_domain(moto, bucket_dir, MANY_DOMAIN)
    facts["copy_s"] = time.perf_counter() - t0
    log.info("many.h5: %d keys copied to moto in %.1f s", copied, facts["copy_s"])
    return ManyDomain(MANY_DOMAIN, objects, copied, seconds, visited, bucket_dir, facts)


def copy_domain(moto: MotoServer, bucket_dir: Path, domain: str) -> int:
    """Copy one domain's keys (its ``.domain.json`` and ``db/<root>/``) from a POSIX bucket."""
    dom_key = domain.strip("/") + "/.domain.json"
    root = str(json.loads((bucket_dir / dom_key).read_bytes())["root"])
    db_dir = bucket_dir / "db" / root[2:19]
    paths = [bucket_dir / dom_key]
    for dirpath, _dirs, files in os.walk(db_dir):
        paths.extend(Path(dirpath) / name for name in files)
    client = storage_of(moto).client()

    def put(path: Path) -> None:
        key = path.relative_to(bucket_dir).as_posix()
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, paths))
    return len(paths)
