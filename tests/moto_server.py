"""Run moto's standalone S3 server on a free loopback port, for tests and benchmarks.

Owns one ``moto_server`` process: started on 127.0.0.1 with a scrubbed
environment, waited for until it answers, and always stopped on exit. Moto
keeps everything in memory, so each server starts empty; ``create_bucket`` and
``upload_dir`` fill it over the S3 protocol with boto3 (synchronous: these are
test helpers, not daemon code).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests import tiers
from tests.hsds_server import _free_port, _tail, clean_env, dying_with_parent

log = logging.getLogger(__name__)

#: Credentials moto accepts; never ``xxx`` (HSDS then asks the EC2 metadata address:
#: ``tests.hsds_server.S3Storage``).
ACCESS_KEY = "h5mount-test-key"
SECRET_KEY = "h5mount-test-secret"
REGION = "us-east-1"


class MotoError(RuntimeError):
    """moto_server failed to start."""


class MotoServer:
    """One moto S3 server on ``http://127.0.0.1:PORT``; use as a context manager."""

    def __init__(self, startup_timeout: float = 30.0) -> None:
        self.startup_timeout = startup_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_dir = Path(tempfile.mkdtemp(prefix="moto-logs-"))
        self.log_path = self._log_dir / "moto.log"

    @property
    def endpoint(self) -> str:
        if not self.port:
            raise MotoError("moto is not started")
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """AWS variables that point a client (h5mount, HSDS, boto3) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> None:
        tiers.uses("server")
        for _ in range(attempts):
            self.port = _free_port()
            log_file = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
            try:
                self._proc = subprocess.Popen(
                    dying_with_parent(["moto_server", "-H", "127.0.0.1", "-p", str(self.port)]),
                    stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=clean_env(), start_new_session=True)
            finally:
                log_file.close()
            if self._wait_ready():
                return
            self.stop()
        raise MotoError(f"moto_server did not start:\n{_tail(self.log_path)}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    return True
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def client(self) -> Any:
        """A boto3 S3 client for this server (path-style, test credentials)."""
        import boto3  # noqa: PLC0415 - test-only dependency
        from botocore.config import Config  # noqa: PLC0415

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=16))

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def upload_dir(self, directory: Path, bucket: str, prefix: str = "") -> int:
        """Copy every file below ``directory`` to ``bucket`` key for key; returns the count."""
        client = self.client()
        paths = [p for p in _walk(directory) if p.is_file()]

        def put(path: Path) -> None:
            key = prefix + path.relative_to(directory).as_posix()
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, paths))
        return len(paths)


def _walk(directory: Path) -> Iterator[Path]:
    for root, _dirs, files in os.walk(directory):
        for name in files:
            yield Path(root) / name
