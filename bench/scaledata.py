"""Metadata-scale benchmark buckets, written straight in HSDS schema v2.

This module owns one local bucket under the benchmark cache directory
(``/var/tmp/h5mount-bench/scale/``) holding the shapes users reach when they
browse, each a domain of its own:

- ``/home/admin/wide10k.h5``, ``/home/admin/wide100k.h5``: a root group with
  10,000 or 100,000 hard links ``d000000``... to small int32 datasets of shape
  (4,) with an attribute and no chunk written (3 entries per link in a mount);
- ``/home/admin/many.h5``: 100 groups of 99 such datasets (10,000 objects);
- ``/home/admin/tiny.h5``: ``/x``, a 1-D int32 dataset of 200,000 chunks of
  one element each (extendible), every chunk stored as HSDS stores gzip
  (a Blosc frame with the zlib codec); ``/y`` is the same with 1,000,000 chunks
  when asked for (``--million``).

``hsload`` and h5pyd cannot write a group of 100,000 links (one request of
over 1 MiB: HSDS answers 413), so the objects are written here with the id
and key functions of ``h5json`` (HSDS's own dependency), in the JSON shapes
HSDS 1.0.2 writes. ``tests/test_scaledata.py`` checks a small bucket made by
the same code against h5pyd through a real HSDS.

Everything is pure file writing, no servers. Run
``python -m bench.scaledata [--dir DIR] [--million]``; the benchmarks call
:func:`ensure` themselves. A ``READY.json`` written last marks a finished
bucket, which is then reused.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
from h5json import objid

log = logging.getLogger("bench.scaledata")

DEFAULT_DIR = Path("/var/tmp/h5mount-bench/scale")
BUCKET = "scale"
WIDE = {10_000: "/home/admin/wide10k.h5", 100_000: "/home/admin/wide100k.h5"}
MANY_DOMAIN = "/home/admin/many.h5"
MANY_GROUPS = 100
MANY_PER_GROUP = 99
TINY_DOMAIN = "/home/admin/tiny.h5"
TINY_CHUNKS = 200_000
MILLION_CHUNKS = 1_000_000
#: Bump when the recipe changes, so an old bucket is rebuilt.
RECIPE_VERSION = 1
#: A fixed time for every object, so rebuilt buckets are identical but for ids.
STAMP = 1_790_000_000.0

_INT32 = {"class": "H5T_INTEGER", "base": "H5T_STD_I32LE"}
_ACLS = {"admin": {"create": True, "read": True, "update": True, "delete": True,
                   "readACL": True, "updateACL": True}}


def link_name(i: int) -> str:
    return f"d{i:06d}"


@dataclass(frozen=True)
class ScaleData:
    """The finished bucket: its directory and the domains in it."""

    bucket_dir: Path
    million: bool

    def domain_dir(self, domain: str) -> Path:
        return self.bucket_dir / domain.strip("/")


class BucketWriter:
    """Writes HSDS schema v2 keys under one bucket directory.

    ``put`` and ``exists`` are the only methods that touch storage, so a
    subclass may keep the keys elsewhere (``bench.walkdata.MemoryWriter``)."""

    def __init__(self, bucket_dir: Path) -> None:
        self.bucket_dir = bucket_dir

    def put(self, key: str, data: bytes) -> None:
        path = self.bucket_dir / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def put_json(self, key: str, doc: dict[str, Any]) -> None:
        self.put(key, json.dumps(doc, separators=(",", ":")).encode())

    def exists(self, key: str) -> bool:
        return (self.bucket_dir / key).exists()

    def folder(self, path: str) -> None:
        key = f"{path.strip('/')}/.domain.json"
        if not self.exists(key):
            self.put_json(key, {"owner": "admin", "acls": _ACLS, "created": STAMP,
                                "lastModified": STAMP})

    def domain(self, path: str, root_id: str) -> None:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            self.folder("/".join(parts[:depth]))
        self.put_json(f"{path.strip('/')}/.domain.json",
                      {"root": root_id, "owner": "admin", "acls": _ACLS, "created": STAMP,
                       "lastModified": STAMP})

    def group(self, gid: str, root_id: str, links: dict[str, str]) -> None:
        self.put_json(objid.getS3Key(gid), {
            "id": gid, "root": root_id, "created": STAMP, "lastModified": STAMP,
            "links": {name: {"class": "H5L_TYPE_HARD", "created": STAMP, "id": target}
                      for name, target in links.items()},
            "attributes": {}})

    def dataset(self, did: str, root_id: str, shape: int, chunk: int, *,
                extendible: bool = False, gzip: bool = False, index: int = 0) -> None:
        doc: dict[str, Any] = {
            "id": did, "root": root_id, "created": STAMP, "lastModified": STAMP,
            "type": _INT32,
            "shape": {"class": "H5S_SIMPLE", "dims": [shape],
                      "maxdims": ["H5S_UNLIMITED" if extendible else shape]},
            "attributes": {"index": {"type": _INT32, "shape": {"class": "H5S_SCALAR"},
                                     "value": index, "created": STAMP}},
            "creationProperties": {"layout": {"class": "H5D_CHUNKED", "dims": [chunk]},
                                   "fillValue": 0},
        }
        if gzip:
            doc["creationProperties"]["filters"] = [
                {"class": "H5Z_FILTER_DEFLATE", "id": 1, "level": 4, "name": "deflate"}]
        self.put_json(objid.getS3Key(did), doc)


def small_datasets(writer: BucketWriter, root_id: str, count: int,
                   start: int = 0) -> dict[str, str]:
    """``count`` small datasets; their link names and ids."""
    links = {}
    for i in range(start, start + count):
        did = objid.createObjId("datasets", root_id=root_id)
        writer.dataset(did, root_id, 4, 4, index=i)
        links[link_name(i)] = did
    return links


def write_wide(writer: BucketWriter, domain: str, links: int) -> None:
    root_id = objid.createObjId("groups")
    writer.group(root_id, root_id, small_datasets(writer, root_id, links))
    writer.domain(domain, root_id)


def write_many(writer: BucketWriter, domain: str = MANY_DOMAIN, groups: int = MANY_GROUPS,
               per_group: int = MANY_PER_GROUP) -> None:
    root_id = objid.createObjId("groups")
    top = {}
    for g in range(groups):
        gid = objid.createObjId("groups", root_id=root_id)
        writer.group(gid, root_id, small_datasets(writer, root_id, per_group, g * per_group))
        top[f"g{g:03d}"] = gid
    writer.group(root_id, root_id, top)
    writer.domain(domain, root_id)


def tiny_value(i: int) -> int:
    """The value stored in chunk ``i`` of the tiny-chunk datasets."""
    return (i * 7919) % 1_000_003


def tiny_chunks(count: int) -> Iterator[tuple[int, bytes]]:
    """(index, stored bytes) of each one-element chunk: a Blosc-zlib frame, typesize 1."""
    blosc = numcodecs.Blosc(cname="zlib", clevel=4, shuffle=numcodecs.Blosc.NOSHUFFLE)
    for i in range(count):
        raw = np.array([tiny_value(i)], dtype="<i4").view(np.uint8)
        yield i, bytes(blosc.encode(raw))


def write_tiny(writer: BucketWriter, domain: str, million: bool) -> None:
    root_id = objid.createObjId("groups")
    links = {}
    for name, count in (("x", TINY_CHUNKS), ("y", MILLION_CHUNKS if million else 0)):
        if not count:
            continue
        did = objid.createObjId("datasets", root_id=root_id)
        writer.dataset(did, root_id, count, 1, extendible=True, gzip=True)
        prefix = objid.getS3Key(did).rsplit("/", 1)[0]
        for i, data in tiny_chunks(count):
            writer.put(f"{prefix}/{i}", data)
        links[name] = did
    writer.group(root_id, root_id, links)
    writer.domain(domain, root_id)


def ensure(base: Path = DEFAULT_DIR, *, million: bool = False, force: bool = False) -> ScaleData:
    """The scale bucket under ``base``, built if missing, stale or lacking ``million``."""
    bucket_dir = base / BUCKET
    ready = base / "READY.json"
    want = {"recipe": RECIPE_VERSION, "million": million}
    if not force and ready.exists():
        have = json.loads(ready.read_text())
        if have.get("recipe") == RECIPE_VERSION and (have.get("million") or not million):
            return ScaleData(bucket_dir, bool(have.get("million")))
    if base.exists():
        shutil.rmtree(base)
    writer = BucketWriter(bucket_dir)
    started = time.monotonic()
    for links, domain in WIDE.items():
        log.info("writing %s (%d links)", domain, links)
        write_wide(writer, domain, links)
    log.info("writing %s (%d objects)", MANY_DOMAIN, MANY_GROUPS * (MANY_PER_GROUP + 1))
    write_many(writer)
    log.info("writing %s (%d chunks%s)", TINY_DOMAIN, TINY_CHUNKS,
             f" + {MILLION_CHUNKS}" if million else "")
    write_tiny(writer, TINY_DOMAIN, million)
    want["seconds"] = round(time.monotonic() - started, 1)
    ready.write_text(json.dumps(want) + "\n")
    log.info("scale bucket ready in %.0f s at %s", want["seconds"], bucket_dir)
    return ScaleData(bucket_dir, million)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--million", action="store_true",
                        help="also write /y, a dataset of 1,000,000 one-element chunks")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    data = ensure(args.dir, million=args.million, force=args.force)
    print(data.bucket_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
