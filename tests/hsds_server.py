"""Run a real HSDS 1.0.2 (one data node, one service node) for tests and examples.

This module owns starting and stopping the two ``hsds-node`` processes on free
loopback ports with POSIX storage under ``root_dir/bucket``, loading HDF5 files
into it with ``hstouch``/``hsload`` and flushing domains so every object is on
disk before the nodes stop.

The ``hsds`` launcher is deliberately not used: it always gives its data node
port 6101 and does not pass the bucket name (see docs in
``/work/shared/HSDS-TESTING.md``). Each node gets a scrubbed environment (no
HSDS config key, ``AWS_*``, ``AZURE_*`` or ``HS_*`` variable is inherited) and
runs in its own working directory, so no stray ``config.yml`` or ``.hscfg``
changes its behaviour.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

log = logging.getLogger(__name__)

ADMIN_USER = "admin"
ADMIN_PASSWORD = "admin"

# Environment prefixes that HSDS or h5pyd read and that must not leak in.
_SCRUB_PREFIXES = ("AWS_", "AZURE_", "HS_", "HSDS_", "KEYCLOAK_", "GOOGLE_")
# Other single variables that change where HSDS looks for configuration.
_SCRUB_NAMES = ("CONFIG_DIR", "CONFIG_OVERRIDE_PATH", "PYTHONSTARTUP")


class HsdsError(RuntimeError):
    """HSDS failed to start, load, flush or stop; the message says which."""


def hsds_node_available() -> bool:
    """Return True when the ``hsds-node``, ``hsload`` and ``hstouch`` commands exist."""
    return all(shutil.which(cmd) is not None for cmd in ("hsds-node", "hsload", "hstouch"))


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
    if extra:
        env.update(extra)
    return env


def _free_port() -> int:
    """Ask the kernel for a currently free loopback TCP port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    """Return the last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


class HsdsServer:
    """One HSDS data node plus service node, with POSIX storage in ``root_dir/bucket``.

    Use as a context manager; ``stop()`` always runs on exit, also after an error.
    """

    def __init__(
        self,
        root_dir: Path,
        bucket: str,
        *,
        startup_timeout: float = 60.0,
        log_dir: Path | None = None,
    ) -> None:
        self.root_dir = Path(root_dir).resolve()
        self.bucket = bucket
        self.startup_timeout = startup_timeout
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="hsds-logs-"))
        self._sn_port = 0
        self._dn_port = 0
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_files: dict[str, Path] = {}
        self._folders_made: set[str] = set()

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoint(self) -> str:
        """The service node URL, ``http://127.0.0.1:PORT``."""
        if not self._sn_port:
            raise HsdsError("HSDS is not started")
        return f"http://127.0.0.1:{self._sn_port}"

    @property
    def bucket_dir(self) -> Path:
        """``root_dir/bucket``: the directory holding the bucket's keys."""
        return self.root_dir / self.bucket

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

    def _node_env(self) -> dict[str, str]:
        return clean_env(
            {
                "BUCKET_NAME": self.bucket,
                "SCAN_WAIT_TIME": "2",
                "SCAN_SLEEP_TIME": "2",
            }
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        log_path = self.log_dir / f"{name}.log"
        self._log_files[name] = log_path
        workdir = self.log_dir / f"{name}-cwd"
        workdir.mkdir(exist_ok=True)
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                ["hsds-node", *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                env=self._node_env(),
                start_new_session=True,
            )
        self._procs[name] = proc
        log.debug("started HSDS %s pid %d, log %s", name, proc.pid, log_path)

    def start(self) -> None:
        """Start both nodes and wait until the service node reports READY."""
        if self._procs:
            raise HsdsError("HSDS already started")
        self.bucket_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._dn_port = _free_port()
        self._sn_port = _free_port()
        while self._sn_port == self._dn_port:
            self._sn_port = _free_port()
        dn_url = f"http://127.0.0.1:{self._dn_port}"
        sn_url = self.endpoint
        root = f"--root_dir={self.root_dir}"
        try:
            self._spawn(
                "dn",
                [
                    "--node_type=dn",
                    "--log_prefix=dn1 ",
                    "--standalone",
                    "--node_number=0",
                    f"--dn_urls={dn_url}",
                    f"--hsds_endpoint={sn_url}",
                    root,
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
                    "--password_file=",
                    root,
                ],
            )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("HSDS ready at %s, bucket %s", sn_url, self.bucket_dir)

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
                    if state == "READY":
                        return
                    last = f"state {state}"
                else:
                    last = f"HTTP {status}"
            time.sleep(0.2)
        raise HsdsError(
            f"HSDS not READY after {self.startup_timeout:.0f}s ({last})" + self.logs_tail()
        )

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
        """Delete the log directory if this object created it."""
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    # ------------------------------------------------------------------ HTTP

    def _request(
        self, method: str, path: str, *, timeout: float = 30.0, auth: bool = False
    ) -> tuple[int, bytes]:
        """Send one request to the service node and return (status, body)."""
        req = urllib.request.Request(self.endpoint + path, method=method)
        if auth:
            token = base64.b64encode(f"{ADMIN_USER}:{ADMIN_PASSWORD}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        if method in ("PUT", "POST"):
            req.data = b""
        # Never go through a proxy: the server is on loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=timeout) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read()

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
        domain = _abs_domain(domain)
        query = urllib.parse.urlencode({"domain": domain, "flush": "1"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, body = self._request("PUT", f"/?{query}", auth=True, timeout=60.0)
            except OSError as exc:
                status, body = 0, str(exc).encode()
            if status == 204:
                log.debug("flushed %s", domain)
                return
            if status != 0 and status < 500:
                raise HsdsError(f"flush {domain}: HTTP {status} {body[:300]!r}")
            if time.monotonic() >= deadline:
                raise HsdsError(
                    f"flush {domain} still failing after {timeout:.0f}s: "
                    f"HTTP {status} {body[:300]!r}" + self.logs_tail()
                )
            log.info("flush %s answered %s, retrying", domain, status or body[:100])
            time.sleep(1.0)

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
                f"{' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}"
                + self.logs_tail(20)
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

    def load(self, h5file: Path, domain: str, link: bool = False) -> None:
        """``hsload`` a local HDF5 file to ``domain`` (e.g. ``/home/admin/x.h5``).

        Creates ``/home/`` and ``/home/admin/`` first when missing. With ``link``
        the file must lie inside ``root_dir`` and only its metadata is copied;
        chunks stay in the file (``H5D_*_REF`` layouts).
        """
        domain = _abs_domain(domain)
        self.ensure_folder("/home/")
        self.ensure_folder(f"/home/{ADMIN_USER}/", owner=ADMIN_USER)
        args = ["hsload"]
        src = str(Path(h5file).resolve())
        if link:
            rel = Path(src).relative_to(self.root_dir)
            args += ["--link"]
            src = str(rel)
        self._run_tool([*args, src, domain])
        log.info("hsloaded %s to %s", h5file, domain)


def _abs_domain(domain: str) -> str:
    """Return ``domain`` with exactly one leading ``/``."""
    return "/" + domain.lstrip("/")
