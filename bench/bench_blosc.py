"""Benchmark: HSDS gzip chunks (Blosc zlib frames) decoded by ``layouts.hdf5._blosc``
against numcodecs.

This module owns one measurement: how fast the libdeflate fast path
(``layouts.hdf5._blosc.decode``) decodes realistic HSDS gzip chunks, against
``numcodecs.blosc.decompress`` (zlib), on 1 thread and on 2 threads. The chunks
are a smooth field plus noise quantised to 1/64 (the recipe of ``bench.data``),
encoded by numcodecs' ``Blosc(cname="zlib", clevel=4, shuffle=SHUFFLE)``, the
call HSDS makes for gzip level 4:

- ``hsds f4 4M``: a 4 MiB float32 chunk as HSDS 1.0.2 writes it: it passes
  the chunk's bytes, so the frame's typesize is 1 and the shuffle flag does
  nothing;
- ``f4 4M``, ``f8 4M``, ``f4 1M``: the same data encoded as a typed array
  (typesize 4 or 8, bytes shuffled, blocks split per byte).

numcodecs runs with ``use_threads = False`` (one core per call, as in the
mount's decode threads). Each run decodes every chunk of a case; the decoders
and thread counts take turns, and the report gives the median of
``--repeat`` runs of each and the ratio of the medians.

Run from the repository root::

    .venv/bin/python -m bench.bench_blosc [--repeat 7] [--chunks 6]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numcodecs
import numpy as np
from numcodecs import blosc as nc_blosc

from layouts.hdf5 import _blosc as blosc

MiB = 1 << 20
CLEVEL = 4
QUANTUM = 1.0 / 64.0


@dataclass(frozen=True)
class Case:
    """Chunks of one kind: name, dtype, chunk size, and whether HSDS wrote it (typesize 1)."""

    name: str
    dtype: str
    nbytes: int
    as_bytes: bool


CASES = (
    Case("hsds f4 4M", "<f4", 4 * MiB, True),
    Case("f4 4M", "<f4", 4 * MiB, False),
    Case("f8 4M", "<f8", 4 * MiB, False),
    Case("f4 1M", "<f4", MiB, False),
)


def chunk_values(case: Case, seed: int) -> np.ndarray:
    """A square-ish chunk of ``case``: a smooth field plus noise, quantised to 1/64."""
    dtype = np.dtype(case.dtype)
    rows = int(np.sqrt(case.nbytes // dtype.itemsize))
    cols = case.nbytes // dtype.itemsize // rows
    y, x = np.mgrid[0:rows, 0:cols]
    rng = np.random.default_rng(seed)
    field = 100 * np.sin((x + seed * 37) / 150.0) * np.cos(y / 210.0)
    values = field + rng.normal(0.0, 1.0, field.shape)
    return (np.round(values / QUANTUM) * QUANTUM).astype(dtype)


def frames_for(case: Case, count: int) -> list[bytes]:
    """``count`` encoded chunks of ``case``."""
    codec = numcodecs.Blosc(cname="zlib", clevel=CLEVEL, shuffle=numcodecs.Blosc.SHUFFLE)
    frames = []
    for seed in range(count):
        values = chunk_values(case, seed)
        frames.append(bytes(codec.encode(values.tobytes() if case.as_bytes else values)))
    return frames


def decode_fast(limit: int, frame: bytes) -> int:
    data = blosc.decode(frame, limit, "bench")
    if data is None:
        raise RuntimeError("the fast path left a benchmark frame to numcodecs")
    return len(data)


def decode_numcodecs(frame: bytes) -> int:
    return len(nc_blosc.decompress(frame))


def run_once(pool: ThreadPoolExecutor | None, decoder: Callable[[bytes], int],
             frames: list[bytes]) -> float:
    """Seconds to decode every frame, on the calling thread or on ``pool``."""
    started = time.perf_counter()
    if pool is None:
        for frame in frames:
            decoder(frame)
    else:
        list(pool.map(decoder, frames))
    return time.perf_counter() - started


def measure(case: Case, chunks: int, repeat: int, pool: ThreadPoolExecutor) -> list[str]:
    """The report row of ``case``: stored size, MiB/s of each decoder on 1 and 2
    threads, and the ratios of the medians."""
    frames = frames_for(case, chunks)
    for frame in frames:
        if blosc.decode(frame, case.nbytes, "bench") != bytes(nc_blosc.decompress(frame)):
            raise RuntimeError(f"{case.name}: the fast path decodes differently")
    header = blosc.HEADER.unpack_from(frames[0])
    configs = {(name, threads): (decoder, None if threads == 1 else pool)
               for name, decoder in (("numcodecs", decode_numcodecs),
                                     ("fast", functools.partial(decode_fast, case.nbytes)))
               for threads in (1, 2)}
    times: dict[tuple[str, int], list[float]] = {key: [] for key in configs}
    for decoder, where in configs.values():
        run_once(where, decoder, frames)  # warm
    for _ in range(repeat):
        for key, (decoder, where) in configs.items():
            times[key].append(run_once(where, decoder, frames))
    total = chunks * case.nbytes / MiB
    median = {key: statistics.median(values) for key, values in times.items()}
    rate = {key: total / seconds for key, seconds in median.items()}
    stored = sum(map(len, frames)) / (chunks * case.nbytes)
    return [case.name, f"{header[3]}", f"{header[5] // 1024}K", f"{stored:.2f}",
            f"{rate['numcodecs', 1]:.0f}", f"{rate['fast', 1]:.0f}",
            f"{median['numcodecs', 1] / median['fast', 1]:.2f}x",
            f"{rate['numcodecs', 2]:.0f}", f"{rate['fast', 2]:.0f}",
            f"{median['numcodecs', 2] / median['fast', 2]:.2f}x"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per decoder (7)")
    parser.add_argument("--chunks", type=int, default=6, help="chunks per case (6)")
    args = parser.parse_args()
    nc_blosc.use_threads = False
    head = ["case", "typesize", "block", "stored/raw", "numcodecs 1T", "fast 1T", "ratio 1T",
            "numcodecs 2T", "fast 2T", "ratio 2T"]
    with ThreadPoolExecutor(2) as pool:
        rows = [measure(case, args.chunks, args.repeat, pool) for case in CASES]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    print(f"Blosc zlib decode, MiB/s of decoded data, medians of {args.repeat} runs "
          f"over {args.chunks} chunks per case (numcodecs {numcodecs.__version__}, "
          f"c-blosc {nc_blosc.VERSION_STRING}; ratio = numcodecs time / fast time)")
    for row in [head, *rows]:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
