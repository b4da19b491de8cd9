"""Whole-domain walk benchmark data: HSDS schema v2 domains that a real HSDS has scanned.

This module owns the data of ``bench.bench_walk``:

- a local bucket, cached in ``/var/tmp/h5mount-bench/walk/walk/`` (a
  ``READY.json`` written last marks it finished, with its recipe version and
  what the scans wrote), holding ``/home/admin/walk10k.h5``, ``walk100k.h5``
  and ``walk2k.h5``, root groups of 10,000, 100,000 and 2,000 hard links
  ``d000000``... to small datasets, and ``/home/admin/folder20/f00.h5`` ...
  ``f19.h5``, 1,000 such links each. Every dataset is int32, shape (4,),
  chunk (4,), with one attribute ``index``; every 10th is gzip-filtered and
  has its one chunk stored as HSDS stores gzip (a Blosc frame with the zlib
  codec), so its dataset directory holds a chunk file; every 1,000th from
  ``d000007`` on is extendible (maxdims ``H5S_UNLIMITED``). The objects are
  written straight to files with ``h5json``'s ids and keys
  (``bench.scaledata.BucketWriter``); then a real HSDS (POSIX storage) is
  started over the bucket and made to scan every domain (a flush, then
  ``PUT /?domain=D&rescan=1``), so that ``db/<root>/.info.json`` and
  ``.summary.json`` exist. :func:`check_scan` proves each summary current:
  it holds every object of the domain, and its ``scan_start`` is later than
  the modification time of every key under ``db/<root>/``.
- the S3 copy (:func:`build_s3`): ``walk2k.h5`` of the same recipe written to
  a moto bucket under the same keys, then scanned by a real HSDS whose
  storage is that moto bucket. Moto keeps everything in memory, so this is
  redone in every run.
- writes the scan has not seen (:func:`apply_changes`), through HSDS's REST
  API: a new attribute on ``d000003``, a new dataset ``new_dataset`` linked
  into the root group, and ``d000007`` resized from (4,) to (8,); flushed,
  with the data node's background scan held off (``SCAN_WAIT_TIME`` of an
  hour), so the summary stays stale. Local domains get them on a scratch copy
  (:func:`copy_domains`), so the cached bucket stays as scanned.
  :func:`changes_shown` checks them through a mount.

Concurrency: everything runs in the caller's thread, except the uploads to
moto (a thread pool of independent PUTs). Every HSDS started here is stopped
before the function that started it returns, also on errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import numcodecs
import numpy as np
from h5json import objid

from bench import s3data, scaledata
from layouts.formats.hsds._summary import MARGIN
from tests.hsds_server import ADMIN_PASSWORD, ADMIN_USER, HsdsServer
from tests.moto_server import MotoServer

log = logging.getLogger("bench.walkdata")

DEFAULT_DIR = Path("/var/tmp/h5mount-bench/walk")
BUCKET = "walk"
WALK10K = "/home/admin/walk10k.h5"
WALK100K = "/home/admin/walk100k.h5"
WALK2K = "/home/admin/walk2k.h5"
FOLDER = "/home/admin/folder20/"
FOLDER_DOMAINS = 20
FOLDER_LINKS = 1_000
#: Every domain of the local bucket and its number of links (datasets).
LINKS: dict[str, int] = {
    WALK10K: 10_000, WALK100K: 100_000, WALK2K: 2_000,
    **{f"{FOLDER}f{i:02d}.h5": FOLDER_LINKS for i in range(FOLDER_DOMAINS)},
}
GZIP_EVERY = 10
EXTENDIBLE_EVERY = 1_000
EXTENDIBLE_AT = 7
#: Bump when the recipe changes, so an old bucket is rebuilt.
RECIPE_VERSION = 1
#: The data nodes' ``SCAN_WAIT_TIME``: no background scan runs while a benchmark does.
NO_SCAN = s3data.NO_SCAN
#: HSDS's ``max_scan_duration``: a rescan request answers 503 after this, the scan going on.
MAX_SCAN_DURATION = 180.0
#: Longest wait for one scan: a minute plus this much per object (HSDS on moto
#: scans 5-16 objects a second, depending on the load; on local disk hundreds).
SCAN_SECONDS_PER_OBJECT = 0.5
#: Seconds a domain rests between its last write and the scan asked for. HSDS
#: itself scans ``scan_wait_time`` (60 s) after the last write; h5mount trusts a
#: summary only for objects last written ``MARGIN`` seconds before the scan
#: began (clock skew, one-second S3 times), so a scan asked for at once would
#: leave the objects written last to be read one by one.
REST_BEFORE_SCAN = MARGIN + 2.0

#: The writes of :func:`apply_changes`.
ATTR_TARGET = scaledata.link_name(3)
ATTR_NAME = "walk_note"
ATTR_VALUE = 25
NEW_DATASET = "new_dataset"
RESIZED = scaledata.link_name(EXTENDIBLE_AT)
NEW_SHAPE = 8

_TIMEOUT = httpx.Timeout(60.0, read=MAX_SCAN_DURATION + 60.0)


class WalkDataError(RuntimeError):
    """The data could not be made or is not as the recipe says; the message says why."""


# ---------------------------------------------------------------------- the recipe


def is_gzip(i: int) -> bool:
    """Dataset ``i`` is gzip-filtered and has its one chunk stored."""
    return i % GZIP_EVERY == 0


def is_extendible(i: int) -> bool:
    """Dataset ``i`` has maxdims ``H5S_UNLIMITED``."""
    return i % EXTENDIBLE_EVERY == EXTENDIBLE_AT


def chunk_frame(i: int) -> bytes:
    """The stored chunk of dataset ``i``: values ``4i .. 4i+3`` as a Blosc-zlib frame."""
    values = np.arange(4 * i, 4 * i + 4, dtype="<i4")
    codec = numcodecs.Blosc(cname="zlib", clevel=4, shuffle=numcodecs.Blosc.NOSHUFFLE)
    return bytes(codec.encode(values))


def chunk_key(dataset_id: str) -> str:
    """The key of chunk ``0`` of a one-chunk dataset."""
    return objid.getS3Key(dataset_id).rsplit("/", 1)[0] + "/0"


def root_prefix(root_id: str) -> str:
    """``db/<uuid1>/``: where every key of the domain whose root group is ``root_id`` lives."""
    return objid.getS3Key(root_id).rsplit("/", 1)[0] + "/"


def write_domain(writer: scaledata.BucketWriter, domain: str, links: int) -> str:
    """Write ``domain`` with ``links`` datasets of the recipe; return its root group id."""
    root_id = objid.createObjId("groups")
    ids = {}
    for i in range(links):
        did = objid.createObjId("datasets", root_id=root_id)
        writer.dataset(did, root_id, 4, 4, extendible=is_extendible(i), gzip=is_gzip(i),
                       index=i)
        if is_gzip(i):
            writer.put(chunk_key(did), chunk_frame(i))
        ids[scaledata.link_name(i)] = did
    writer.group(root_id, root_id, ids)
    writer.domain(domain, root_id)
    return root_id


class MemoryWriter(scaledata.BucketWriter):
    """A ``BucketWriter`` keeping the keys in memory, for an upload to S3."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"))
        self.keys: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.keys[key] = data

    def exists(self, key: str) -> bool:
        return key in self.keys


# ---------------------------------------------------------------------- storage


class Bucket(Protocol):
    """What the scan checks read of a bucket, whatever its storage."""

    #: Resolution of ``modified``, s: an object modified at ``t`` was written before ``t + this``.
    resolution: float

    def get(self, key: str) -> bytes | None:
        """The bytes under ``key``; None when there is none."""

    def modified(self, prefix: str) -> dict[str, float]:
        """Every key under ``prefix`` and its modification time (POSIX time)."""

    def written(self, key: str) -> float | None:
        """The modification time of ``key``; None when there is none."""


class LocalBucket:
    """A POSIX bucket directory: mtimes in nanoseconds."""

    resolution = 0.0

    def __init__(self, bucket_dir: Path) -> None:
        self.bucket_dir = bucket_dir

    def get(self, key: str) -> bytes | None:
        try:
            return (self.bucket_dir / key).read_bytes()
        except FileNotFoundError:
            return None

    def written(self, key: str) -> float | None:
        try:
            return (self.bucket_dir / key).stat().st_mtime
        except FileNotFoundError:
            return None

    def modified(self, prefix: str) -> dict[str, float]:
        found = {}
        top = self.bucket_dir / prefix
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                path = Path(dirpath) / name
                found[path.relative_to(self.bucket_dir).as_posix()] = path.stat().st_mtime
        return found


class S3Bucket:
    """A bucket on an S3 endpoint: ``LastModified`` has one-second resolution."""

    resolution = 1.0

    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket = bucket

    def get(self, key: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except self.client.exceptions.NoSuchKey:
            return None

    def written(self, key: str) -> float | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except self.client.exceptions.ClientError:
            return None
        return float(head["LastModified"].timestamp())

    def modified(self, prefix: str) -> dict[str, float]:
        found = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                      Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                found[str(item["Key"])] = float(item["LastModified"].timestamp())
        return found


def upload(moto: MotoServer, bucket: str, keys: dict[str, bytes]) -> None:
    """PUT every key to ``bucket`` on ``moto``, 16 at a time."""
    client = moto.client()

    def put(key: str) -> None:
        client.put_object(Bucket=bucket, Key=key, Body=keys[key])

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, keys))


def _json(bucket: Bucket, key: str) -> Any:
    raw = bucket.get(key)
    if not raw:
        raise WalkDataError(f"{key} is missing")
    return json.loads(raw)


def domain_root(bucket: Bucket, domain: str) -> str:
    """The root group id of ``domain``."""
    return str(_json(bucket, domain.strip("/") + "/.domain.json")["root"])


# ---------------------------------------------------------------------- scans


@dataclass
class ScanFacts:
    """What HSDS's scan of one domain wrote, and why it is current."""

    domain: str
    root: str
    objects: int
    chunks: int
    scan_start: float
    scan_complete: float
    #: Newest modification time of the domain's other keys (objects and chunks).
    newest_object: float
    info_written: float
    summary_written: float
    info_fields: list[str]
    dataset_fields: list[str]
    summary_fields: list[str]
    info_bytes: int
    summary_bytes: int
    #: How long the scan took, from the rescan request to a current summary, s.
    seconds: float = 0.0


def check_scan(bucket: Bucket, domain: str) -> ScanFacts:
    """The facts of ``domain``'s scan, proven current; WalkDataError if not.

    Current means: ``.info.json`` and ``.summary.json`` parse, the summary
    holds the root group and every object the root group links to (and
    nothing else), and every other key under ``db/<root>/`` was last
    modified ``MARGIN`` seconds before ``scan_start`` (and for the storage's
    resolution: S3's ``LastModified`` is whole seconds), so h5mount trusts
    the summary for every object. A half-written file counts as missing.
    """
    root = domain_root(bucket, domain)
    prefix = root_prefix(root)
    info_key, summary_key = prefix + ".info.json", prefix + ".summary.json"
    info_raw, summary_raw = bucket.get(info_key), bucket.get(summary_key)
    if not info_raw or not summary_raw:
        raise WalkDataError(f"{domain}: no .info.json or .summary.json in {prefix}")
    times = bucket.modified(prefix)  # listed after the reads: a later write shows as stale
    try:
        info, summary = json.loads(info_raw), json.loads(summary_raw)
    except ValueError as exc:
        raise WalkDataError(f"{domain}: .info.json or .summary.json does not parse "
                            f"(still being written?): {exc}") from None
    group = _json(bucket, objid.getS3Key(root))
    expected = {root, *(link["id"] for link in group["links"].values() if "id" in link)}
    if set(summary) != expected:
        raise WalkDataError(f"{domain}: the summary holds {len(summary)} objects, the domain "
                            f"{len(expected)} ({len(expected - set(summary))} missing)")
    others = {key: t for key, t in times.items() if key not in (info_key, summary_key)}
    newest = max(others.values(), default=0.0)
    if not newest + bucket.resolution + MARGIN < info["scan_start"]:
        raise WalkDataError(f"{domain}: a key was modified at {newest:.3f}, not {MARGIN:g} s "
                            f"before the scan started ({info['scan_start']:.3f}): h5mount "
                            f"reads it on its own")
    datasets = info.get("datasets", {})
    return ScanFacts(
        domain=domain, root=root, objects=len(summary), chunks=int(info.get("num_chunks", 0)),
        scan_start=float(info["scan_start"]), scan_complete=float(info["scan_complete"]),
        newest_object=newest, info_written=times.get(info_key, math.nan),
        summary_written=times.get(summary_key, math.nan),
        info_fields=sorted(info),
        dataset_fields=sorted(next(iter(datasets.values()), {})),
        summary_fields=sorted({name for entry in summary.values() for name in entry}),
        info_bytes=len(info_raw), summary_bytes=len(summary_raw))


def _client(endpoint: str) -> httpx.Client:
    return httpx.Client(base_url=endpoint, auth=(ADMIN_USER, ADMIN_PASSWORD), trust_env=False,
                        timeout=_TIMEOUT)


def _scan_written(bucket: Bucket, prefix: str, requested: float) -> bool:
    """True once a scan that started at or after ``requested`` has written both files
    (each parses, and the summary is no older than the ``.info.json``)."""
    info_raw = bucket.get(prefix + ".info.json")
    if not info_raw:
        return False
    try:
        if json.loads(info_raw)["scan_start"] < requested:
            return False
    except ValueError:
        return False  # still being written
    info_at, summary_at = bucket.written(prefix + ".info.json"), bucket.written(
        prefix + ".summary.json")
    if summary_at is None or info_at is None or summary_at + bucket.resolution < info_at:
        return False
    try:
        json.loads(bucket.get(prefix + ".summary.json") or b"")
    except ValueError:
        return False
    return True


def rescan(server: HsdsServer, bucket: Bucket, domain: str) -> ScanFacts:
    """Flush ``domain``, let it rest ``REST_BEFORE_SCAN`` seconds, have HSDS scan it
    now, wait until it wrote both files, and prove the summary current
    (:func:`check_scan`).

    ``PUT /?domain=D&rescan=1`` is sent once: it answers 204 when the scan's
    ``.info.json`` is stored, or 503 after ``max_scan_duration`` while the
    scan goes on (sending it again would queue another scan). Then storage is
    polled every 2 s until the scan's ``.summary.json`` is there too.
    """
    server.flush(domain)
    time.sleep(REST_BEFORE_SCAN)
    objects = LINKS.get(domain, 0) + 1
    deadline = time.monotonic() + 60.0 + SCAN_SECONDS_PER_OBJECT * objects
    prefix = root_prefix(domain_root(bucket, domain))
    requested = time.time()
    log.info("HSDS scans %s (%d objects)", domain, objects)
    status = 0
    with _client(server.endpoint) as client:
        try:
            answer = client.put("/", params={"domain": domain, "rescan": 1},
                                json={"rescan": True})
        except httpx.TimeoutException:
            log.info("rescan %s: no answer yet; waiting for the files", domain)
        else:
            status = answer.status_code
            if status not in (204, 503):
                raise WalkDataError(f"rescan {domain}: HTTP {status} {answer.text[:300]}")
    while not _scan_written(bucket, prefix, requested):
        if time.monotonic() > deadline:
            raise WalkDataError(f"{domain}: the scan wrote no summary in time"
                                + server.logs_tail(20))
        time.sleep(2.0)
    facts = check_scan(bucket, domain)
    facts.seconds = time.time() - requested
    log.info("%s scanned in %.0f s", domain, facts.seconds)
    return facts


# ---------------------------------------------------------------------- the local bucket


@dataclass
class WalkData:
    """The finished local bucket and the facts of its scans."""

    base: Path
    scans: dict[str, ScanFacts]
    facts: dict[str, float] = field(default_factory=dict)

    @property
    def bucket_dir(self) -> Path:
        return self.base / BUCKET


def _build(base: Path) -> WalkData:
    """Write every domain, then have a real HSDS scan each one."""
    if base.exists():
        shutil.rmtree(base)
    writer = scaledata.BucketWriter(base / BUCKET)
    started = time.monotonic()
    for domain, links in LINKS.items():
        log.info("writing %s (%d links)", domain, links)
        write_domain(writer, domain, links)
    facts = {"write_s": round(time.monotonic() - started, 1)}
    started = time.monotonic()
    bucket = LocalBucket(base / BUCKET)
    with HsdsServer(base, BUCKET, scan_wait=NO_SCAN) as server:
        scans = {domain: rescan(server, bucket, domain) for domain in LINKS}
    facts["scan_s"] = round(time.monotonic() - started, 1)
    return WalkData(base, scans, facts)


def ensure(base: Path = DEFAULT_DIR, *, force: bool = False) -> WalkData:
    """The scanned local bucket under ``base``, built if missing, stale or of an old recipe.

    A reused bucket is checked again (:func:`check_scan` of every domain): a
    summary made stale since (someone wrote into the cache) rebuilds it.
    """
    ready = base / "READY.json"
    if not force and ready.exists():
        have = json.loads(ready.read_text())
        if have.get("recipe") == RECIPE_VERSION:
            bucket = LocalBucket(base / BUCKET)
            try:
                scans = {domain: check_scan(bucket, domain) for domain in LINKS}
            except WalkDataError as exc:
                log.warning("rebuilding %s: %s", base, exc)
            else:
                for domain, facts in scans.items():
                    facts.seconds = have["scans"][domain]["seconds"]
                return WalkData(base, scans, have["facts"])
    data = _build(base)
    ready.write_text(json.dumps({"recipe": RECIPE_VERSION, "facts": data.facts,
                                 "scans": {d: dataclasses.asdict(f)
                                           for d, f in data.scans.items()}}, indent=1) + "\n")
    log.info("walk bucket ready at %s: written in %.0f s, scanned in %.0f s",
             data.bucket_dir, data.facts["write_s"], data.facts["scan_s"])
    return data


# ---------------------------------------------------------------------- S3


@dataclass
class S3Walk:
    """``walk2k.h5`` on moto, scanned by an HSDS on moto."""

    scan: ScanFacts
    keys: int
    upload_s: float


def build_s3(moto: MotoServer) -> S3Walk:
    """Write ``walk2k.h5`` to a new moto bucket and have an HSDS on moto scan it."""
    moto.create_bucket(BUCKET)
    writer = MemoryWriter()
    write_domain(writer, WALK2K, LINKS[WALK2K])
    started = time.monotonic()
    upload(moto, BUCKET, writer.keys)
    upload_s = time.monotonic() - started
    log.info("%s: %d keys put to moto in %.0f s", WALK2K, len(writer.keys), upload_s)
    bucket = S3Bucket(moto.client(), BUCKET)
    with HsdsServer(None, BUCKET, s3=s3data.storage_of(moto), scan_wait=NO_SCAN) as server:
        scan = rescan(server, bucket, WALK2K)
    return S3Walk(scan, len(writer.keys), upload_s)


# ---------------------------------------------------------------------- writes after the scan


def copy_domains(src_bucket: Path, dest_bucket: Path, domains: Sequence[str]) -> None:
    """Copy ``domains`` (their folders' and their own ``.domain.json``, and ``db/<root>/``)
    from one POSIX bucket into another, keeping modification times."""
    bucket = LocalBucket(src_bucket)
    for domain in domains:
        parts = domain.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            key = "/".join(parts[:depth]) + "/.domain.json"
            (dest_bucket / key).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src_bucket / key, dest_bucket / key)
        prefix = root_prefix(domain_root(bucket, domain))
        shutil.copytree(src_bucket / prefix, dest_bucket / prefix)


@dataclass
class Changes:
    """What :func:`apply_changes` wrote, and when."""

    domain: str
    new_dataset: str
    written: float
    seconds: float


def _checked(answer: httpx.Response, what: str) -> Any:
    if answer.status_code not in (200, 201, 204):
        raise WalkDataError(f"{what}: HTTP {answer.status_code} {answer.text[:300]}")
    return answer.json() if answer.content else None


def apply_changes(server: HsdsServer, domain: str) -> Changes:
    """Through HSDS's REST API: a new attribute, a new linked dataset, a new shape; flushed.

    The server must run with its background scan held off (``scan_wait``
    ``NO_SCAN``), so the domain's summary stays as the last scan wrote it.
    """
    started = time.monotonic()
    written = time.time()
    query = {"domain": domain}
    with _client(server.endpoint) as client:
        root = _checked(client.get("/", params=query), f"GET {domain}")["root"]

        def link(name: str) -> str:
            found = _checked(client.get(f"/groups/{root}/links/{name}", params=query),
                             f"GET link {name}")
            return str(found["link"]["id"])

        target, resized = link(ATTR_TARGET), link(RESIZED)
        _checked(client.put(f"/datasets/{target}/attributes/{ATTR_NAME}", params=query,
                            json={"type": "H5T_STD_I32LE", "value": ATTR_VALUE}),
                 f"PUT attribute {ATTR_NAME}")
        made = _checked(client.post("/datasets", params=query,
                                    json={"type": "H5T_STD_I32LE", "shape": [4]}),
                        "POST dataset")
        _checked(client.put(f"/groups/{root}/links/{NEW_DATASET}", params=query,
                            json={"id": made["id"]}), f"PUT link {NEW_DATASET}")
        _checked(client.put(f"/datasets/{resized}/shape", params=query,
                            json={"shape": [NEW_SHAPE]}), f"PUT shape of {RESIZED}")
    server.flush(domain)
    seconds = time.monotonic() - started
    log.info("%s: attribute, dataset and shape written and flushed in %.1f s", domain, seconds)
    return Changes(domain, str(made["id"]), written, seconds)


def changes_shown(domain_dir: Path) -> list[str]:
    """The writes of :func:`apply_changes` that a mounted domain does not show (none: [])."""
    missing = []
    sidecar = json.loads((domain_dir / f"{ATTR_TARGET}.json").read_text())
    if ATTR_NAME not in sidecar.get("attributes", {}):
        missing.append(f"attribute {ATTR_NAME} not in {ATTR_TARGET}.json")
    try:
        os.getxattr(domain_dir / ATTR_TARGET, f"user.h5.attr.{ATTR_NAME}")
    except OSError as exc:
        missing.append(f"xattr user.h5.attr.{ATTR_NAME} of {ATTR_TARGET}: {exc.strerror}")
    if not (domain_dir / NEW_DATASET).is_dir():
        missing.append(f"no directory {NEW_DATASET}/")
    shape = json.loads((domain_dir / f"{RESIZED}.json").read_text()).get("shape")
    if shape != [NEW_SHAPE]:
        missing.append(f"{RESIZED}.json shape {shape}, not [{NEW_SHAPE}]")
    return missing


def main(argv: list[str] | None = None) -> int:
    """Command line: build (or check) the local bucket and print where it is."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    data = ensure(args.dir, force=args.force)
    print(data.bucket_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
