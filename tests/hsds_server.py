"""Run a real HSDS 1.0.2 (one data node, one service node) for tests and examples.

This module owns starting and stopping the two ``hsds-node`` processes on free
loopback ports, with POSIX storage under ``root_dir/bucket`` or S3 storage on an
S3-compatible endpoint (``S3Storage``, e.g. moto on loopback), loading HDF5
files into it with ``hstouch``/``hsload`` and flushing domains so every object
is stored before the nodes stop. The stored-object check (``missing_objects``)
reads keys through ``DirKeys`` or ``S3Keys``, so it works on either storage.

The ``hsds`` launcher is deliberately not used. It always gives its data node
port 6101, so a second instance on the same machine collides with the first
(its data node exits, and its service node writes into the other instance's
storage), and it does not pass ``--bucket_name`` to its nodes, which then
take ``BUCKET_NAME`` from the environment or default to ``hsdstest``. The
nodes are started the way the launcher starts them inside, each on free
loopback ports and with its own log files (``start``). Each node gets a
scrubbed environment (no HSDS config key, ``AWS_*``, ``AZURE_*`` or ``HS_*``
variable is inherited) and runs in its own working directory, so no stray
``config.yml`` or ``.hscfg`` changes its behaviour.

What the tests rely on, as HSDS 1.0.2, h5pyd 1.0.0 and moto 5.2 behave:

* Ports and addresses: the nodes listen on every interface, but nothing here
  talks to them except through ``127.0.0.1``. The service node is up when
  ``GET /about`` says ``"state": "READY"``.
* Storage: POSIX storage is ``--root_dir``, whose ``BUCKET`` directory must
  exist first. On S3 the nodes get no ``--root_dir`` and no ``ROOT_DIR``
  (either would win over ``AWS_S3_GATEWAY``), the bucket must exist (HSDS
  does not make it), and the key id must be a real one (``S3Storage``).
* Flush: the nodes write objects and chunks to storage a second or two after
  they last change, not when the client's request returns. ``flush`` (``PUT
  /?domain=D&flush=1``) answers 204 once all of ``D`` is stored, and may
  answer 5xx after some seconds under load: it is retried. Stopping the nodes
  before a flush loses what was not yet written. ``stop`` sends SIGTERM to
  the service node, then the data node.
* Rescan: HSDS writes a domain's ``.info.json`` and ``.summary.json`` from a
  scan that runs once the domain has been quiet for ``scan_wait_time`` (60 s
  by default; ``SCAN_WAIT_TIME`` and ``SCAN_SLEEP_TIME`` in the nodes'
  environment, 2 s here unless ``scan_wait`` says otherwise). ``PUT
  /?domain=D&rescan=1`` scans at once and answers 204 when a scan started
  after the request has completed, or 503 after ``max_scan_duration`` (180 s)
  while it goes on (``wait_for_scan``; flush first). ``scan_start`` is the data
  node's clock, while S3's ``LastModified`` is the store's, to the second.
* Traps: ``hsload`` onto an existing domain writes a new ``db/<root>/``
  prefix and leaves the old one, so keys are found from the domain's
  ``root``, never by scanning ``db/``. Chunks equal to the fill value are not
  written (``missing_objects`` checks only the chunks that differ from it).
  h5pyd cannot change a domain whose root group holds thousands of links (on
  close it sends every link in one request, which HSDS refuses): change such
  a domain through the REST API (``rest``).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

import h5py
import numpy as np

from tests import tiers

log = logging.getLogger(__name__)

ADMIN_USER = "admin"
ADMIN_PASSWORD = "admin"

# Environment prefixes that HSDS or h5pyd read and that must not leak in.
_SCRUB_PREFIXES = ("AWS_", "AZURE_", "HS_", "HSDS_", "KEYCLOAK_", "GOOGLE_")
# Other single variables that change where HSDS looks for configuration.
_SCRUB_NAMES = ("CONFIG_DIR", "CONFIG_OVERRIDE_PATH", "PYTHONSTARTUP")


class HsdsError(RuntimeError):
    """HSDS failed to start, load, flush or stop; the message says which."""


class _PortTaken(HsdsError):
    """A node could not bind its port (someone took it after we chose it)."""


def tool_path() -> str:
    """PATH with this Python's own ``bin`` first: the virtualenv's commands
    (``hsds-node``, ``hsload``, ``moto_server``) are found without activating it."""
    return os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


def hsds_node_available() -> bool:
    """Return True when the ``hsds-node``, ``hsload`` and ``hstouch`` commands exist."""
    return all(shutil.which(cmd, path=tool_path()) is not None
               for cmd in ("hsds-node", "hsload", "hstouch"))


def _hsds_config_keys() -> set[str]:
    """Upper-cased names of every HSDS config.yml key (each is also an env override)."""
    try:
        from importlib.resources import files  # noqa: PLC0415

        import yaml  # noqa: PLC0415

        text = files("admin.config").joinpath("config.yml").read_text()
        data = yaml.safe_load(text)
    except Exception as exc:  # pragma: no cover - only if hsds is oddly installed
        log.warning("could not read HSDS config.yml keys: %s", exc)
        return set()
    return {str(key).upper() for key in data}


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that the kernel sends it SIGTERM when the test process
    dies, even by SIGKILL, so no server outlives its run (util-linux
    ``setpriv``, which execs it in place: no ``preexec_fn``, unsafe with threads)."""
    return ["setpriv", "--pdeathsig", "TERM", "--", *argv]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return a copy of ``os.environ`` without any HSDS/h5pyd/cloud setting, plus ``extra``."""
    config_keys = _hsds_config_keys()
    env: dict[str, str] = {}
    for name, value in os.environ.items():
        upper = name.upper()
        if upper in config_keys or upper in _SCRUB_NAMES or upper.startswith(_SCRUB_PREFIXES):
            continue
        env[name] = value
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = tool_path()
    if extra:
        env.update(extra)
    return env


def _free_port() -> int:
    """Ask the kernel for a currently free loopback TCP port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    """True when something accepts TCP connections on loopback ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 40) -> str:
    """Return the last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------------- storage


@dataclass(frozen=True)
class S3Storage:
    """An S3-compatible endpoint and credentials for HSDS to store its bucket on.

    The bucket must exist before HSDS starts: HSDS does not create it. The key
    id must be real: with HSDS's default ``xxx``, or none, HSDS asks the EC2
    metadata address for credentials.
    """

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def __post_init__(self) -> None:
        if not self.access_key or self.access_key == "xxx" or not self.secret_key:
            raise HsdsError("S3 storage needs a real access key id and secret (never 'xxx')")

    @classmethod
    def from_env(cls, endpoint: str, env: Mapping[str, str]) -> S3Storage:
        """Credentials and region from ``AWS_*`` variables in ``env`` (e.g. MotoServer.env())."""
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        return cls(endpoint, env.get("AWS_ACCESS_KEY_ID", ""),
                   env.get("AWS_SECRET_ACCESS_KEY", ""), region)

    def node_env(self) -> dict[str, str]:
        """The variables that make an HSDS node use this endpoint (no root_dir given)."""
        return {
            "AWS_S3_GATEWAY": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
        }

    def client(self) -> Any:
        """A boto3 S3 client for the endpoint (path-style addressing)."""
        import boto3  # noqa: PLC0415 - only S3 mode needs it
        from botocore.config import Config  # noqa: PLC0415

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=16))


class StoredKeys(Protocol):
    """Read access to the keys of one HSDS bucket, whatever the storage."""

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None when there is no such key."""

    def size(self, key: str) -> int | None:
        """The size of the object under ``key``, or None when there is no such key."""


class DirKeys:
    """The keys of a POSIX bucket: key ``a/b`` is the file ``bucket_dir/a/b``."""

    def __init__(self, bucket_dir: Path) -> None:
        self.bucket_dir = Path(bucket_dir)

    def get(self, key: str) -> bytes | None:
        try:
            return (self.bucket_dir / key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def size(self, key: str) -> int | None:
        path = self.bucket_dir / key
        return path.stat().st_size if path.is_file() else None


class S3Keys:
    """The keys of one bucket on an S3 endpoint, read with a boto3 client."""

    def __init__(self, client: Any, bucket: str) -> None:
        from botocore.exceptions import ClientError  # noqa: PLC0415 - only S3 mode needs it

        self._client = client
        self._client_error = ClientError
        self.bucket = bucket

    def _missing(self, exc: Exception) -> bool:
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        return code in ("NoSuchKey", "404", "NotFound")

    def get(self, key: str) -> bytes | None:
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
        except self._client_error as exc:
            if self._missing(exc):
                return None
            raise
        return bytes(resp["Body"].read())

    def size(self, key: str) -> int | None:
        try:
            resp = self._client.head_object(Bucket=self.bucket, Key=key)
        except self._client_error as exc:
            if self._missing(exc):
                return None
            raise
        return int(resp["ContentLength"])

    def listing(self, prefix: str = "") -> dict[str, int]:
        """Every key under ``prefix`` with its size."""
        return {key: size for key, (size, _) in self.entries(prefix).items()}

    def entries(self, prefix: str = "") -> dict[str, tuple[int, str]]:
        """Every key under ``prefix`` with its size and ETag (unquoted): for an
        object stored with one PUT, the MD5 of its bytes in hex."""
        found: dict[str, tuple[int, str]] = {}
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                found[str(item["Key"])] = (int(item["Size"]), str(item["ETag"]).strip('"'))
        return found

    def times(self, prefix: str = "") -> dict[str, float]:
        """Every key under ``prefix`` with its LastModified, in seconds since the epoch."""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix)
        return {str(item["Key"]): item["LastModified"].timestamp()
                for page in pages for item in page.get("Contents", [])}


# ---------------------------------------------------------------------- the server


class HsdsServer:
    """One HSDS data node plus service node, storing in ``root_dir/bucket`` or on S3.

    POSIX storage: give ``root_dir``. S3 storage: give ``root_dir=None`` and
    ``s3``; the bucket must exist on that endpoint. ``scan_wait`` is how long
    after a domain's last change HSDS's background scan writes its
    ``.info.json``/``.summary.json`` (a large value keeps a domain "freshly
    loaded", without the summary that lets h5pyd fetch all metadata at once).
    ``users`` (name: password) are accepted besides ``admin``, from a password file.
    Use as a context manager; ``stop()`` always runs on exit, also after an error.
    Node logs go to ``log_dir`` (``dn.log``, ``sn.log``); without a ``log_dir`` a
    temporary one is made and removed on a clean exit, kept after an error.
    """

    def __init__(
        self,
        root_dir: Path | None,
        bucket: str,
        *,
        s3: S3Storage | None = None,
        startup_timeout: float = 60.0,
        log_dir: Path | None = None,
        scan_wait: float = 2.0,
        users: Mapping[str, str] | None = None,
    ) -> None:
        if (root_dir is None) == (s3 is None):
            raise ValueError("give either root_dir (POSIX storage) or s3 (S3 storage)")
        self._root_dir = None if root_dir is None else Path(root_dir).resolve()
        self.s3 = s3
        self.bucket = bucket
        self.startup_timeout = startup_timeout
        self.scan_wait = scan_wait
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="hsds-logs-"))
        self._sn_port = 0
        self._dn_port = 0
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_files: dict[str, Path] = {}
        self._folders_made: set[str] = set()
        self.users = dict(users or {})

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoint(self) -> str:
        """The service node URL, ``http://127.0.0.1:PORT``."""
        if not self._sn_port:
            raise HsdsError("HSDS is not started")
        return f"http://127.0.0.1:{self._sn_port}"

    @property
    def root_dir(self) -> Path:
        """The POSIX storage root (raises HsdsError on S3 storage)."""
        if self._root_dir is None:
            raise HsdsError("HSDS on S3 storage has no root_dir")
        return self._root_dir

    @property
    def bucket_dir(self) -> Path:
        """``root_dir/bucket``: the directory holding the bucket's keys (POSIX storage)."""
        return self.root_dir / self.bucket

    @property
    def storage(self) -> str:
        """Where the bucket is, for messages: a directory or ``s3://bucket at endpoint``."""
        if self.s3 is not None:
            return f"s3://{self.bucket} at {self.s3.endpoint}"
        return str(self.bucket_dir)

    def keys(self) -> StoredKeys:
        """Read access to the bucket's keys on its storage."""
        if self.s3 is not None:
            return S3Keys(self.s3.client(), self.bucket)
        return DirKeys(self.bucket_dir)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if exc_type is None:
            self.cleanup_logs()
        else:
            log.error("HSDS node logs kept in %s", self.log_dir)

    def _node_env(self) -> dict[str, str]:
        extra = {
            "BUCKET_NAME": self.bucket,
            "SCAN_WAIT_TIME": f"{self.scan_wait:g}",
            "SCAN_SLEEP_TIME": "2",
        }
        if self.s3 is not None:
            extra.update(self.s3.node_env())
        return clean_env(extra)

    def _password_file(self) -> str:
        """The service node's password file: ``admin`` and ``users``, or none
        (``""``) when there are no other users, as the launcher runs it."""
        if not self.users:
            return ""
        path = self.log_dir / "passwd.txt"
        lines = [f"{name}:{password}" for name, password in
                 {ADMIN_USER: ADMIN_PASSWORD, **self.users}.items()]
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    def _spawn(self, name: str, args: list[str]) -> None:
        log_path = self.log_dir / f"{name}.log"
        self._log_files[name] = log_path
        workdir = self.log_dir / f"{name}-cwd"
        workdir.mkdir(exist_ok=True)
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                dying_with_parent(["hsds-node", *args]),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                env=self._node_env(),
                start_new_session=True,
            )
        self._procs[name] = proc
        log.debug("started HSDS %s pid %d, log %s", name, proc.pid, log_path)

    def start(self, attempts: int = 3) -> None:
        """Start both nodes and wait until the service node reports READY.

        A free port can be taken by someone else between choosing and binding
        it; when a node exits with "address already in use" the start is retried
        on new ports, up to ``attempts`` times.
        """
        tiers.uses("hsds")
        if self._procs:
            raise HsdsError("HSDS already started")
        self._prepare_storage()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
            except _PortTaken as exc:
                if attempt == attempts:
                    raise HsdsError(str(exc)) from None
                log.warning("HSDS port collision, retrying on new ports: %s", exc)
                continue
            except BaseException:
                self.stop()
                raise
            log.info("HSDS ready at %s, bucket %s", self.endpoint, self.storage)
            return

    def _prepare_storage(self) -> None:
        """Create the POSIX bucket directory, or check that the S3 bucket exists."""
        if self.s3 is None:
            self.bucket_dir.mkdir(parents=True, exist_ok=True)
            return
        try:
            self.s3.client().head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise HsdsError(f"S3 bucket {self.storage} is not usable "
                            f"(HSDS does not create it): {exc}") from exc

    def _start_once(self) -> None:
        self._dn_port = _free_port()
        self._sn_port = _free_port()
        while self._sn_port == self._dn_port:
            self._sn_port = _free_port()
        dn_url = f"http://127.0.0.1:{self._dn_port}"
        sn_url = self.endpoint
        # S3 storage: no root_dir at all (it would win over AWS_S3_GATEWAY).
        storage = [] if self.s3 is not None else [f"--root_dir={self.root_dir}"]
        self._spawn(
            "dn",
            [
                "--node_type=dn",
                "--log_prefix=dn1 ",
                "--standalone",
                "--node_number=0",
                f"--dn_urls={dn_url}",
                f"--hsds_endpoint={sn_url}",
                *storage,
            ],
        )
        self._spawn(
            "sn",
            [
                "--node_type=sn",
                "--log_prefix=sn ",
                "--standalone",
                f"--dn_urls={dn_url}",
                f"--sn_url={sn_url}",
                f"--hsds_endpoint={sn_url}",
                f"--hs_username={ADMIN_USER}",
                f"--hs_password={ADMIN_PASSWORD}",
                f"--admin_user={ADMIN_USER}",
                f"--password_file={self._password_file()}",
                *storage,
            ],
        )
        try:
            self._wait_ready()
        except HsdsError as exc:
            self.stop()
            if any(
                "address already in use" in _tail(path, 20).lower()
                for path in self._log_files.values()
            ):
                raise _PortTaken(str(exc)) from None
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise HsdsError(
                        f"HSDS {name} node exited with code {proc.returncode} during startup"
                        + self.logs_tail()
                    )
            try:
                status, body = self._request("GET", "/about", timeout=2.0)
            except OSError as exc:
                last = str(exc)
            else:
                if status == 200:
                    state = json.loads(body).get("state")
                    # A standalone service node is READY at once, maybe before the
                    # data node listens: wait for that too.
                    if state == "READY" and _listening(self._dn_port):
                        return
                    last = f"state {state}, data node listening: {_listening(self._dn_port)}"
                else:
                    last = f"HTTP {status}"
            time.sleep(0.2)
        raise HsdsError(
            f"HSDS not READY after {self.startup_timeout:.0f}s ({last})" + self.logs_tail()
        )

    def pids(self) -> dict[str, int]:
        """The process ids of the running nodes, by name (``dn``, ``sn``)."""
        return {name: proc.pid for name, proc in self._procs.items() if proc.poll() is None}

    def logs_tail(self, lines: int = 40) -> str:
        """The last lines of each node log, for error messages."""
        parts = [
            f"\n--- {name} log {path} ---\n{_tail(path, lines)}"
            for name, path in self._log_files.items()
        ]
        return "".join(parts)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the service node, then the data node; SIGKILL what does not exit."""
        for name in ("sn", "dn"):
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("HSDS %s pid %d ignored SIGTERM, killing", name, proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        self._procs.clear()

    def cleanup_logs(self) -> None:
        """Delete the log directory if this object created it (not a given ``log_dir``)."""
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    # ------------------------------------------------------------------ HTTP

    def _request(
        self, method: str, path: str, *, timeout: float = 30.0, auth: bool = False,
        body: Any = None,
    ) -> tuple[int, bytes]:
        """Send one request to the service node (``body`` as JSON) and return
        (status, body)."""
        req = urllib.request.Request(self.endpoint + path, method=method)
        if auth:
            token = base64.b64encode(f"{ADMIN_USER}:{ADMIN_PASSWORD}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        if body is not None:
            req.data = json.dumps(body).encode()
            req.add_header("Content-Type", "application/json")
        elif method in ("PUT", "POST"):
            req.data = b""
        # Never go through a proxy: the server is on loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=timeout) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read()

    def rest(self, method: str, path: str, domain: str, body: Any = None) -> Any:
        """One REST request as admin about ``domain`` (``PUT /groups/ID/attributes/A``,
        ``POST /datasets``...): its JSON answer; ``HsdsError`` unless it is 2xx."""
        sep = "&" if "?" in path else "?"
        query = urllib.parse.urlencode({"domain": _abs_domain(domain)})
        status, answer = self._request(method, f"{path}{sep}{query}", auth=True, body=body)
        if not 200 <= status < 300:
            raise HsdsError(f"{method} {path} ({domain}): HTTP {status} {answer[:300]!r}")
        return json.loads(answer) if answer else None

    def domain_exists(self, domain: str) -> bool:
        """True when ``domain`` (a file domain or a folder ending in ``/``) exists."""
        # HSDS rejects a trailing "/" in the query parameter; folders are named without it.
        query = urllib.parse.urlencode({"domain": _abs_domain(domain).rstrip("/")})
        status, body = self._request("GET", f"/?{query}", auth=True)
        if status == 200:
            return True
        if status in (404, 410):
            return False
        raise HsdsError(f"GET domain {domain}: HTTP {status} {body[:200]!r}")

    def flush(self, domain: str, timeout: float = 120.0) -> None:
        """Ask HSDS to write everything of ``domain`` to storage; retry 5xx until 204."""
        self._put_domain(domain, "flush", timeout)

    def _put_domain(self, domain: str, action: str, timeout: float) -> None:
        """``PUT /?domain=D&ACTION=1`` (flush or rescan); retry 5xx until 204."""
        domain = _abs_domain(domain)
        query = urllib.parse.urlencode({"domain": domain, action: "1"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, body = self._request("PUT", f"/?{query}", auth=True, timeout=60.0)
            except OSError as exc:
                status, body = 0, str(exc).encode()
            if status == 204:
                log.debug("%s %s done", action, domain)
                return
            if status != 0 and status < 500:
                raise HsdsError(f"{action} {domain}: HTTP {status} {body[:300]!r}")
            if time.monotonic() >= deadline:
                raise HsdsError(
                    f"{action} {domain} still failing after {timeout:.0f}s: "
                    f"HTTP {status} {body[:300]!r}" + self.logs_tail()
                )
            log.info("%s %s answered %s, retrying", action, domain, status or body[:100])
            time.sleep(1.0)

    def flush_and_verify(self, domain: str, h5file: Path, timeout: float = 120.0) -> None:
        """Flush ``domain``, then wait until every object and data chunk is stored.

        The flush answers 204 only once HSDS has written everything, so the check
        should pass at once; it is repeated (with more flushes) until ``timeout``
        to be safe, then fails naming what is missing.
        """
        deadline = time.monotonic() + timeout
        keys = self.keys()
        while True:
            self.flush(domain, timeout=max(1.0, deadline - time.monotonic()))
            missing = missing_objects(keys, domain, h5file)
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise HsdsError(
                    f"{domain}: {len(missing)} objects still not stored after flush: "
                    f"{missing[:10]}" + self.logs_tail(20)
                )
            log.warning("%s: %d objects not stored yet after flush", domain, len(missing))
            time.sleep(0.5)

    def wait_for_scan(self, domain: str, timeout: float = 60.0) -> None:
        """Scan ``domain`` now; wait until ``db/<uuid1>/.info.json`` and ``.summary.json`` exist.

        The background scan runs ``scan_wait`` (2 s by default) after a domain
        last changed, so a load that pauses longer gets an early, incomplete
        scan. ``PUT ?rescan=1`` has HSDS scan at once and answers once the
        ``.info.json`` of a scan that started after the request is stored: it
        counts everything. That scan writes ``.summary.json`` right after; an
        older summary is told apart by its objects (see ``_summary_matches``).
        Both files are parsed, so a half-written file does not count.
        """
        self._put_domain(domain, "rescan", timeout)
        keys = self.keys()
        dom = _read_json(keys, domain.strip("/") + "/.domain.json")
        if dom is None or "root" not in dom:
            raise HsdsError(f"{domain}: no domain with a root to wait for")
        prefix = "db/" + str(dom["root"])[2:19]
        deadline = time.monotonic() + timeout
        while True:
            try:
                if _summary_matches(keys, prefix):
                    return
            except ValueError:
                pass  # caught mid-write
            if time.monotonic() >= deadline:
                raise HsdsError(
                    f"{domain}: no matching .info.json / .summary.json in {prefix} after "
                    f"{timeout:.0f}s" + self.logs_tail(20)
                )
            time.sleep(0.2)

    # ------------------------------------------------------------------ client tools

    def client_env(self) -> dict[str, str]:
        """Environment for h5pyd command line tools talking to this server as admin."""
        return clean_env(
            {
                "HS_ENDPOINT": self.endpoint,
                "HS_USERNAME": ADMIN_USER,
                "HS_PASSWORD": ADMIN_PASSWORD,
            }
        )

    def _run_tool(self, args: list[str], timeout: float = 300.0) -> str:
        """Run an h5pyd tool in a scratch directory; raise with its output on failure."""
        workdir = self.log_dir / "client-cwd"
        workdir.mkdir(exist_ok=True)
        # h5pyd tools read ./.hscfg before ~/.hscfg: pin every setting here.
        (workdir / ".hscfg").write_text(
            f"hs_endpoint = {self.endpoint}\n"
            f"hs_username = {ADMIN_USER}\nhs_password = {ADMIN_PASSWORD}\n"
        )
        try:
            proc = subprocess.run(
                args,
                env=self.client_env(),
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HsdsError(f"{args} timed out after {timeout}s" + self.logs_tail()) from exc
        out = (proc.stdout + proc.stderr).decode(errors="replace")
        if proc.returncode != 0:
            raise HsdsError(
                f"{' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}" + self.logs_tail(20)
            )
        log.debug("%s: %s", args[0], out.strip()[-1000:])
        return out

    def ensure_folder(self, folder: str, owner: str | None = None) -> None:
        """Create a folder domain (path ending in ``/``) with ``hstouch`` unless it exists."""
        folder = _abs_domain(folder)
        if not folder.endswith("/"):
            folder += "/"
        if folder in self._folders_made or self.domain_exists(folder):
            self._folders_made.add(folder)
            return
        args = ["hstouch"]
        if owner:
            args += ["-o", owner]
        self._run_tool([*args, folder])
        self._folders_made.add(folder)

    def load(
        self,
        h5file: Path,
        domain: str,
        link: bool = False,
        *,
        args: Sequence[str] = (),
        hsload: Sequence[str] = ("hsload",),
    ) -> None:
        """``hsload`` a local HDF5 file to ``domain`` (e.g. ``/home/admin/x.h5``).

        Creates ``/home/`` and ``/home/admin/`` first when missing. With ``link``
        the file must lie inside ``root_dir`` (e.g. ``root_dir/bucket/files/x.h5``)
        and only its metadata is copied; chunks stay in the file (``H5D_*_REF``
        layouts whose ``file_uri`` is the path relative to ``root_dir``).
        Caveat (h5pyd 1.0.0 + h5json 2.0.1): hsload --link copies datasets of at
        most 512 elements as usual and fails on larger ones ("Only datasets with
        'H5D_CHUNKED' layout can be resizable"): h5pyd passes every dataset's
        maxshape, and h5json refuses one for a non-H5D_CHUNKED layout. ``hsload``
        is the command to run instead of ``hsload`` (``tests/test_linked.py``
        runs it with that one check fixed). ``args`` are extra
        hsload options such as ``("--ignore-filters",)``.
        """
        domain = _abs_domain(domain)
        self.ensure_folder("/home/")
        self.ensure_folder(f"/home/{ADMIN_USER}/", owner=ADMIN_USER)
        cmd = [*hsload, *args]
        src = Path(h5file).resolve()
        if link:
            # hsload opens the local file for metadata; the server gets the path
            # relative to its root_dir ("BUCKET/dir/file.h5") as the chunk source.
            try:
                rel = src.relative_to(self.root_dir)
            except ValueError as exc:
                raise HsdsError(f"--link needs {src} inside root_dir {self.root_dir}") from exc
            cmd += ["--link", "--linkpath", str(rel)]
        self._run_tool([*cmd, str(src), domain])
        log.info("hsloaded %s to %s", h5file, domain)


# ---------------------------------------------------------------------- stored-object check

_PRIMES = (29, 31, 37, 41, 43, 47, 53, 59, 61, 67)


def _read_json(keys: StoredKeys, key: str) -> dict[str, Any] | None:
    """The JSON object stored under ``key``, or None when it is missing or still empty."""
    text = keys.get(key)
    if not text:
        return None
    return dict(json.loads(text))


def _summary_matches(keys: StoredKeys, prefix: str) -> bool:
    """True when ``prefix``'s ``.summary.json`` holds the objects its ``.info.json`` counted.

    The summary maps object ids to metadata; one from an earlier scan lacks
    objects made after it (chunks are not in it, so only objects count).
    """
    info = _read_json(keys, f"{prefix}/.info.json")
    summary = _read_json(keys, f"{prefix}/.summary.json")
    if info is None or summary is None:
        return False
    groups = sum(1 for obj_id in summary if obj_id.startswith("g-"))
    return groups == info.get("num_groups") and set(info.get("datasets", {})) <= set(summary)


def _object_key(obj_id: str, root_id: str) -> str:
    """The key of the JSON of a group, dataset or committed type (schema v2 ids)."""
    kind, rest = obj_id[0], obj_id[2:]
    uuid1, uuid2 = rest[:17], rest[18:]
    if obj_id == root_id:
        return f"db/{uuid1}/.group.json"
    sub, name = {"g": ("g", ".group.json"), "d": ("d", ".dataset.json")}.get(
        kind, ("t", ".datatype.json")
    )
    return f"db/{uuid1}/{sub}/{uuid2}/{name}"


def _chunk_key(dset_prefix: str, layout: Mapping[str, Any], index: tuple[int, ...]) -> str:
    """The key of one chunk of the dataset whose keys start with ``dset_prefix`` (ends in /)."""
    name = "_".join(str(i) for i in index) if index else "0"
    count = layout.get("partition_count")
    if count:
        part = sum(i * _PRIMES[d % len(_PRIMES)] for d, i in enumerate(index)) % int(count)
        return f"{dset_prefix}p{part}/{name}"
    return dset_prefix + name


def _chunk_has_data(region: np.ndarray, fill: np.ndarray) -> bool:
    """True when a chunk region holds anything but the fill value (so HSDS must store it)."""
    if region.size == 0:
        return False
    if region.dtype.hasobject:
        return True  # vlen data: no cheap fill comparison; expect the chunk
    return region.tobytes() != np.broadcast_to(fill, region.shape).astype(region.dtype).tobytes()


def missing_objects(bucket: Path | StoredKeys, domain: str, h5file: Path) -> list[str]:
    """Keys HSDS should have written for ``domain`` (loaded from ``h5file``) but has not.

    ``bucket`` is a POSIX bucket directory or any ``StoredKeys`` (``S3Keys`` for
    S3 storage). Checks the domain JSON, every group, dataset and committed type
    reachable from its root through hard links, and, for every dataset of the
    source file, every chunk whose data differs from the fill value. Linked
    (``*_REF``) layouts are not checked for chunks. An empty list means the load
    is completely stored.
    """
    keys: StoredKeys = DirKeys(bucket) if isinstance(bucket, Path) else bucket
    domain_key = domain.strip("/") + "/.domain.json"
    dom = _read_json(keys, domain_key)
    if dom is None or "root" not in dom:
        return [domain_key]
    missing: list[str] = []
    ids: dict[str, str] = {}  # h5 path -> object id
    seen: set[str] = set()
    root_id = str(dom["root"])
    pending: list[tuple[str, str]] = [("/", root_id)]
    while pending:
        path, obj_id = pending.pop()
        ids.setdefault(path, obj_id)
        if obj_id in seen:
            continue
        seen.add(obj_id)
        obj_key = _object_key(obj_id, root_id)
        obj = _read_json(keys, obj_key)
        if obj is None:
            missing.append(obj_key)
            continue
        for name, link in obj.get("links", {}).items():
            if link.get("class") == "H5L_TYPE_HARD":
                child = path.rstrip("/") + "/" + name
                pending.append((child, str(link["id"])))
    if missing:
        return missing

    with h5py.File(h5file, "r") as f:
        datasets: list[str] = []
        f.visititems(
            lambda name, obj: datasets.append("/" + name) if isinstance(obj, h5py.Dataset) else None
        )
        for path in datasets:
            obj_id = ids.get(path)
            if obj_id is None:
                missing.append(f"<no object for {path}>")
                continue
            missing.extend(_missing_chunks(keys, _object_key(obj_id, root_id), f[path]))
    return missing


def _missing_chunks(keys: StoredKeys, json_key: str, dset: h5py.Dataset) -> list[str]:
    meta = _read_json(keys, json_key) or {}
    layout = meta.get("layout") or meta.get("creationProperties", {}).get("layout", {})
    if str(layout.get("class", "")).endswith("_REF") or dset.shape is None:
        return []
    dset_prefix = json_key.rsplit("/", 1)[0] + "/"
    try:
        fill = np.asarray(dset.fillvalue, dtype=dset.dtype)
    except (TypeError, ValueError):
        fill = np.zeros((), dtype=dset.dtype)
    if dset.shape == ():
        expected: list[tuple[int, ...]] = (
            [()] if _chunk_has_data(np.asarray(dset[()]), fill) else [])
    else:
        dims = [int(d) for d in layout.get("dims", dset.shape)]
        data = dset[()]
        grid = [range(-(-n // c)) for n, c in zip(dset.shape, dims, strict=True)]
        expected = [
            index for index in itertools.product(*grid)
            if _chunk_has_data(data[tuple(slice(i * c, (i + 1) * c)
                                          for i, c in zip(index, dims, strict=True))], fill)
        ]
    found = (_chunk_key(dset_prefix, layout, index) for index in expected)
    return [key for key in found if not keys.size(key)]


def _abs_domain(domain: str) -> str:
    """Return ``domain`` with exactly one leading ``/``."""
    return "/" + domain.lstrip("/")
