"""Benchmark: client CPU per small S3 GET, the store's hot path against aiobotocore.

This module owns one measurement. It starts a moto S3 server on loopback
(``tests.moto_server``; moto runs in its own process, so its CPU is not
counted), puts ``--n`` objects of ``--size`` bytes, and measures the CPU
seconds this process spends per GET (``time.process_time``, so the server's
work is excluded) for:

- (a) aiobotocore ``get_object`` plus reading the body, as the S3 store
  did before its hot path (the baseline);
- (b) ``S3Store.get``: the store's hot path (lean SigV4, its own HTTP/1.1
  connections, ``mountd.io.h1``), retries, limiter, meters and error mapping
  included;
- (c) a bare ``httpx.AsyncClient.get`` of the same URL, unsigned (moto does
  not check signatures): the transport the hot path used before
  ``mountd.io.h1``, which (b) now costs less than.

moto's server closes the connection after every answer, so by default each
GET also pays for a TCP connect. ``--keepalive`` puts ``tests.faultproxy``
(in a child process, so its CPU is not counted either) between the client
and moto: it keeps client connections open, as S3 does (the proxy itself opens
a connection to moto per request).

Each case reads every object once sequentially and once with ``--concurrency``
trio tasks, after a warm-up that opens the connections; the cases take turns
for ``--rounds`` rounds and the median is reported, with the ratio to (a) in
the same mode. ``--profile FILE`` also writes a cProfile of (b) (concurrent)
for ``python -m pstats``.

Run from the repository root::

    .venv/bin/python -m bench.s3get [--n 2000] [--concurrency 32] [--keepalive]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import trio

from mountd.io.s3 import S3Options, open_s3
from tests.faultproxy import FaultProxy
from tests.moto_server import MotoServer

log = logging.getLogger("bench.s3get")

BUCKET = "s3get"
WARMUP = 100

Get = Callable[[str], Awaitable[bytes]]
#: Per (case, tasks): per-GET (user CPU, system CPU, wall) seconds of each round.
Results = dict[tuple[str, int], list[tuple[float, float, float]]]


def _put_objects(moto: MotoServer, n: int, size: int) -> list[str]:
    client = moto.client()
    client.create_bucket(Bucket=BUCKET, ACL="public-read")
    keys = [f"obj/{i:06d}" for i in range(n)]
    body = os.urandom(size)

    def put(key: str) -> None:  # public, so that (c) may read it unsigned
        client.put_object(Bucket=BUCKET, Key=key, Body=body, ACL="public-read")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, keys))
    return keys


def _proxy(upstream: str, pipe: Connection) -> None:
    """Child process: a keep-alive proxy to ``upstream``, until the pipe says stop."""
    with FaultProxy(upstream) as proxy:
        pipe.send(proxy.endpoint)
        pipe.recv()


async def _run(get: Get, keys: list[str], concurrency: int) -> tuple[float, float, float]:
    """(user CPU, system CPU, wall) seconds to GET every key, ``concurrency`` at a time."""
    index = 0

    async def worker() -> None:
        nonlocal index
        while index < len(keys):
            key = keys[index]
            index += 1
            await get(key)

    before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if concurrency == 1:
        await worker()
    else:
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_SELF)
    return after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, wall


async def measure(endpoint: str, keys: list[str], size: int, concurrency: int, *,
                  rounds: int, profile: Path | None) -> Results:
    """Every case in every mode, ``rounds`` times: per-GET (CPU, wall) seconds."""
    options = S3Options(endpoint_url=endpoint, max_connections=concurrency)
    async with open_s3(options) as conn, httpx.AsyncClient(
            limits=httpx.Limits(max_connections=concurrency,
                                max_keepalive_connections=concurrency)) as bare:
        store = conn.store(BUCKET)

        async def boto(key: str) -> bytes:
            response = await conn.client.get_object(Bucket=BUCKET, Key=key)
            async with response["Body"] as body:
                return await body.read()

        async def httpx_get(key: str) -> bytes:
            return (await bare.get(f"{endpoint}/{BUCKET}/{key}")).content

        cases: dict[str, Get] = {"a": boto, "b": store.get, "c": httpx_get}
        for name, get in cases.items():  # warm up, and check what each case reads
            for key in keys[:WARMUP]:
                data = await get(key)
                if len(data) != size:
                    raise RuntimeError(f"case {name} read {len(data)} bytes of {key}")
            await _run(get, keys[:WARMUP], concurrency)
        results: Results = {}
        for _ in range(rounds):
            for mode in (1, concurrency):
                for name, get in cases.items():
                    user, system, wall = await _run(get, keys, mode)
                    results.setdefault((name, mode), []).append(
                        (user / len(keys), system / len(keys), wall / len(keys)))
        if profile is not None:
            profiler = cProfile.Profile()
            profiler.enable()
            await _run(store.get, keys, concurrency)
            profiler.disable()
            profiler.dump_stats(profile)
    return results


def report(results: Results, concurrency: int,
           n: int, size: int, *, rounds: int, front: str) -> str:
    labels = {"a": "(a) aiobotocore get_object", "b": "(b) S3Store.get (hot path)",
              "c": "(c) bare httpx GET, unsigned"}
    lines = [f"{n} GETs of {size} B objects per case and mode, {front}; median of {rounds} "
             "rounds; client CPU only (the servers run in other processes)",
             f"{'case':<32} {'tasks':>5} {'CPU us/GET':>11} {'vs (a)':>7} {'user':>6} "
             f"{'sys':>6} {'wall us/GET':>12}"]
    for mode in (1, concurrency):
        base = statistics.median(u + s for u, s, _ in results["a", mode])
        for name, label in labels.items():
            rows = results[name, mode]
            cpu = statistics.median(u + s for u, s, _ in rows)
            user = statistics.median(u for u, _, _ in rows)
            system = statistics.median(s for _, s, _ in rows)
            wall = statistics.median(w for _, _, w in rows)
            lines.append(f"{label:<32} {mode:>5} {cpu * 1e6:>11.0f} {cpu / base:>6.2f}x "
                         f"{user * 1e6:>6.0f} {system * 1e6:>6.0f} {wall * 1e6:>12.0f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="objects, and GETs per case")
    parser.add_argument("--size", type=int, default=1024, help="bytes per object")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="write a cProfile of (b) here")
    parser.add_argument("--keepalive", action="store_true",
                        help="reach moto through a keep-alive proxy in a child process")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with MotoServer() as moto, tempfile.TemporaryDirectory() as scratch:
        for name in [name for name in os.environ if name.startswith("AWS_")]:
            del os.environ[name]
        os.environ.update(moto.env())
        os.environ.update({"AWS_EC2_METADATA_DISABLED": "true",
                           "AWS_CONFIG_FILE": f"{scratch}/no-config",
                           "AWS_SHARED_CREDENTIALS_FILE": f"{scratch}/no-credentials"})
        keys = _put_objects(moto, args.n, args.size)
        endpoint, front = moto.endpoint, "moto direct (a new connection per GET)"
        child: multiprocessing.Process | None = None
        if args.keepalive:
            here, there = multiprocessing.Pipe()
            child = multiprocessing.Process(target=_proxy, args=(moto.endpoint, there))
            child.start()
            endpoint, front = here.recv(), "keep-alive proxy in front of moto"
        try:
            results = trio.run(partial(measure, rounds=args.rounds, profile=args.profile),
                               endpoint, keys, args.size, args.concurrency)
        finally:
            if child is not None:
                here.send("stop")
                child.join()
    print(report(results, args.concurrency, args.n, args.size, rounds=args.rounds, front=front))


if __name__ == "__main__":
    main()
