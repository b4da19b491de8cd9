"""The reference-file benchmark's parts that run outside the driver: the HTTP server and the peers.

This module owns:

- ``python -m bench.refpeers serve ROOT``: a ``tests.http_server.RangeHttpServer``
  over ROOT in a process of its own, so its CPU time is measured apart from
  the reader's. It prints its URL, then answers one stdin line at a time:
  ``log`` prints a JSON line ``{"requests": [...], "peak": N}`` (the requests
  answered and the most handled at once since the last ``clear``), ``clear``
  forgets them and prints ``ok``. It stops at the end of stdin.
  :class:`ServerProcess` runs it from the driver.
- ``python -m bench.refpeers read KIND TARGET``: one timed read of a whole
  dataset in row slabs, the open included, with KIND ``lindi``
  (``lindi.LindiH5pyFile.from_lindi_file``, run with ``.venv-lindi``'s
  Python), ``fsspec`` (fsspec's ``ReferenceFileSystem`` over http plus zarr 3's
  ``FsspecStore``, in ``.venv``) or ``h5py`` (a local ``.h5``). It prints a
  JSON line with the seconds, the bytes, the CPU seconds of the read, and the
  SHA-256 of the slabs that start at the ``--check-rows``. :func:`run_reader`
  runs it from the driver.
- :class:`ChunkDecoder`: decoding alone, in the driver's process: every chunk
  a reference file names, read once from the local ``.h5`` into memory, then
  decoded on 2 threads by a given function, such as :func:`numcodecs_decoder`
  (the codecs of the ``.zarray``, through plain numcodecs).

Only the standard library, numpy, numcodecs and ``tests.http_server`` (standard
library only) are imported at module level: both virtualenvs have them. lindi,
fsspec, zarr and h5py are imported by the reader that needs them.

Concurrency: the driver uses each object from one thread; ``ChunkDecoder``
owns a thread pool whose workers only decode.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numcodecs
import numpy as np

from tests.http_server import RangeHttpServer

log = logging.getLogger("bench.refpeers")

REPO = Path(__file__).resolve().parent.parent
LINDI_PYTHON = REPO / ".venv-lindi" / "bin" / "python"
KINDS = ("lindi", "fsspec", "h5py")
DECODE_THREADS = 2
READ_TIMEOUT = 600.0

#: One answered request, as the server records it: method, target, Range header, status.
Request = tuple[str, str, str | None, int]


class PeerError(RuntimeError):
    """A peer or the server failed or read wrong data; the message says which."""


# ---------------------------------------------------------------------- the server


class ServerProcess:
    """``python -m bench.refpeers serve ROOT`` as a context manager, and its request log."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise PeerError("the server is not running")
        return self._proc.pid

    def url_for(self, relpath: str) -> str:
        return f"{self.url}/{relpath.lstrip('/')}"

    def __enter__(self) -> Self:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.refpeers", "serve", str(self.root)], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self._reply()
        if not self.url.startswith("http://"):
            self.stop()
            raise PeerError(f"the server started with {self.url!r} instead of its URL")
        log.info("HTTP server pid %d at %s serving %s", self.pid, self.url, self.root)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """End the server: close its stdin, then terminate or kill it if it lingers."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _command(self, command: str) -> str:
        if self._proc is None or self._proc.stdin is None:
            raise PeerError("the server is not running")
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return self._reply()

    def _reply(self) -> str:
        if self._proc is None or self._proc.stdout is None:
            raise PeerError("the server is not running")
        line = self._proc.stdout.readline()
        if not line:
            raise PeerError(f"the server exited ({self._proc.poll()})")
        return line.strip()

    def log(self) -> tuple[list[Request], int]:
        """The requests answered since the last ``clear``, and the most handled at once."""
        answer = json.loads(self._command("log"))
        requests: list[Request] = [(str(method), str(target), None if rng is None else str(rng),
                                    int(status))
                                   for method, target, rng, status in answer["requests"]]
        return requests, int(answer["peak"])

    def clear(self) -> None:
        if self._command("clear") != "ok":
            raise PeerError("the server did not clear its log")

    def take(self) -> tuple[list[Request], int]:
        """``log`` then ``clear``: what was answered since the last ``take`` or ``clear``."""
        found = self.log()
        self.clear()
        return found


def serve(root: Path) -> int:
    """The ``serve`` subcommand (see the module docstring)."""
    with RangeHttpServer(root) as server:
        sys.stdout.write(server.url + "\n")
        sys.stdout.flush()
        for line in sys.stdin:
            command = line.strip()
            if command == "log":
                answer = {"requests": server.requests(), "peak": server.peak()}
                sys.stdout.write(json.dumps(answer) + "\n")
            elif command == "clear":
                server.clear()
                sys.stdout.write("ok\n")
            else:
                sys.stdout.write(json.dumps({"error": f"unknown command {command!r}"}) + "\n")
            sys.stdout.flush()
    return 0


# ---------------------------------------------------------------------- the readers


@dataclass(frozen=True)
class ReadResult:
    """One reader run: wall seconds and CPU seconds of the read (open included), bytes read."""

    seconds: float
    nbytes: int
    cpu: float
    digests: dict[int, str]


def digest(block: np.ndarray) -> str:
    """SHA-256 of a block's C-order bytes."""
    return hashlib.sha256(np.ascontiguousarray(block).tobytes()).hexdigest()


Opener = Callable[[str, str], contextlib.AbstractContextManager[Any]]


def opener(kind: str) -> Opener:
    """``open(target, dataset)`` of peer ``kind``, its libraries already imported.

    Each peer's library is imported here, before any clock starts (and only
    here: the two virtualenvs differ).
    """
    if kind == "lindi":
        import lindi  # noqa: PLC0415

        @contextlib.contextmanager
        def open_lindi(target: str, dataset: str) -> Iterator[Any]:
            f = lindi.LindiH5pyFile.from_lindi_file(target)
            try:
                yield f[dataset]
            finally:
                f.close()

        return open_lindi
    if kind == "fsspec":
        import fsspec  # noqa: PLC0415
        import zarr  # noqa: PLC0415
        from zarr.storage import FsspecStore  # noqa: PLC0415

        @contextlib.contextmanager
        def open_fsspec(target: str, dataset: str) -> Iterator[Any]:
            fs = fsspec.filesystem("reference", fo=target, remote_protocol="http",
                                   remote_options={"asynchronous": True}, asynchronous=True)
            group = zarr.open_group(FsspecStore(fs, read_only=True), mode="r", zarr_format=2)
            yield group[dataset]

        return open_fsspec
    if kind == "h5py":
        import h5py  # noqa: PLC0415

        @contextlib.contextmanager
        def open_h5py(target: str, dataset: str) -> Iterator[Any]:
            with h5py.File(target, "r") as f:
                yield f[dataset]

        return open_h5py
    raise PeerError(f"unknown reader {kind!r}")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read(kind: str, target: str, dataset: str, slab_rows: int,
         check_rows: Sequence[int]) -> ReadResult:
    """Open ``dataset`` with ``kind`` and read it whole in ``slab_rows`` row slabs.

    The slabs starting at ``check_rows`` are kept and hashed after the clock stops.
    """
    open_ = opener(kind)
    kept: dict[int, np.ndarray] = {}
    total = 0
    cpu0 = cpu_seconds()
    started = time.perf_counter()
    with open_(target, dataset) as arr:
        for row0 in range(0, arr.shape[0], slab_rows):
            block = np.asarray(arr[row0:row0 + slab_rows])
            total += block.nbytes
            if row0 in check_rows:
                kept[row0] = block
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu0
    return ReadResult(seconds, total, cpu, {row0: digest(b) for row0, b in kept.items()})


def reader_command(kind: str, target: str, dataset: str, slab_rows: int,
                   check_rows: Sequence[int]) -> list[str]:
    """The command line of one reader run, with the Python of the peer's virtualenv."""
    python = str(LINDI_PYTHON) if kind == "lindi" else sys.executable
    return [python, "-m", "bench.refpeers", "read", kind, target, "--dataset", dataset,
            "--slab-rows", str(slab_rows), "--check-rows", ",".join(map(str, check_rows))]


def run_reader(kind: str, target: str, dataset: str, slab_rows: int,
               check_rows: Sequence[int]) -> ReadResult:
    """Run one reader in a subprocess and return what it measured; PeerError if it failed."""
    cmd = reader_command(kind, target, dataset, slab_rows, check_rows)
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False,
                              timeout=READ_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise PeerError(f"{kind} reader still running after {READ_TIMEOUT:.0f} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
        raise PeerError(f"{kind} reader exited {proc.returncode}: {tail}")
    found = json.loads(lines[-1])
    return ReadResult(float(found["seconds"]), int(found["nbytes"]), float(found["cpu"]),
                      {int(k): str(v) for k, v in found["digests"].items()})


# ---------------------------------------------------------------------- the decode ceiling


Decode = Callable[[bytes], Any]


def numcodecs_decoder(zarray: Mapping[str, Any]) -> Decode:
    """Plain numcodecs: the ``.zarray``'s compressor, then its filters last to first."""
    codecs = [numcodecs.get_codec(dict(cfg)) for cfg in reversed(zarray.get("filters") or [])]
    if zarray.get("compressor"):
        codecs.insert(0, numcodecs.get_codec(dict(zarray["compressor"])))

    def decode(raw: bytes) -> Any:
        out: Any = raw
        for codec in codecs:
            out = codec.decode(out)
        return out

    return decode


class ChunkDecoder:
    """Every chunk of ``dataset`` that ``refs`` names, held in memory, decoded on 2 threads.

    ``refs`` is a reference file's ``refs`` (inline ``.zarray`` object, chunk
    refs ``[url, offset, length]``); the bytes are read from the local copy
    ``h5file`` of the file the URLs name.
    """

    def __init__(self, h5file: Path, refs: Mapping[str, Any], dataset: str) -> None:
        zarray = refs[f"{dataset}/.zarray"]
        self.zarray: dict[str, Any] = json.loads(zarray) if isinstance(zarray, str) else zarray
        self.chunk_nbytes = (int(np.prod(self.zarray["chunks"]))
                             * np.dtype(self.zarray["dtype"]).itemsize)
        prefix = f"{dataset}/"
        self.chunks: dict[str, bytes] = {}
        with open(h5file, "rb") as f:
            for key, ref in refs.items():
                name = key[len(prefix):]
                if not key.startswith(prefix) or name.startswith("."):
                    continue
                _url, offset, length = ref
                f.seek(int(offset))
                self.chunks[name] = f.read(int(length))
        self.stored = sum(len(raw) for raw in self.chunks.values())
        self.pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="decode")

    def close(self) -> None:
        self.pool.shutdown()

    def _size(self, decode: Decode, raw: bytes) -> int:
        nbytes = memoryview(decode(raw)).nbytes
        if nbytes != self.chunk_nbytes:
            raise PeerError(f"a chunk decoded to {nbytes} bytes, not {self.chunk_nbytes}")
        return nbytes

    def first_chunk(self, decode: Decode) -> bytes:
        """Chunk ``0.0`` decoded (to check it against the recipe)."""
        return memoryview(decode(self.chunks["0.0"])).tobytes()

    def decode_all(self, decode: Decode) -> tuple[float, int]:
        """Decode every chunk once with ``decode``; (seconds, decoded bytes)."""
        started = time.perf_counter()
        total = sum(self.pool.map(lambda raw: self._size(decode, raw), self.chunks.values()))
        return time.perf_counter() - started, total


# ---------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``serve ROOT`` or ``read KIND TARGET``; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serving = sub.add_parser("serve", help="serve ROOT over HTTP with byte ranges")
    serving.add_argument("root", type=Path)
    reading = sub.add_parser("read", help="read a whole dataset once, timed")
    reading.add_argument("kind", choices=KINDS)
    reading.add_argument("target", help="reference file URL (lindi, fsspec) or .h5 path")
    reading.add_argument("--dataset", default="data")
    reading.add_argument("--slab-rows", type=int, default=1024)
    reading.add_argument("--check-rows", default="0",
                         help="comma-separated first rows of the slabs to hash")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args.root)
    checks = [int(x) for x in args.check_rows.split(",") if x]
    found = read(args.kind, args.target, args.dataset, args.slab_rows, checks)
    sys.stdout.write(json.dumps({"seconds": found.seconds, "nbytes": found.nbytes,
                                 "cpu": found.cpu, "digests": found.digests}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
