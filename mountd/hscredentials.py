"""Who a mount of an HSDS service authenticates as, found where h5pyd users keep it.

Owns the lookup, from the first place that has a value, per field:

1. the mount's options: ``-o hs_username=``, ``-o hs_password_file=FILE`` and
   ``-o hs_api_key_file=FILE`` (the first line of the file; the secret itself
   never appears in an option string, ``/proc/mounts`` or ``config.json``);
2. the environment: ``HS_USERNAME``, ``HS_PASSWORD``, ``HS_API_KEY``;
3. ``~/.hscfg`` (``hs_username = ...`` lines, ``#`` comments), as h5pyd reads it.

Credentials are sent only to the endpoint they were written for: the
environment's apply when ``HS_ENDPOINT`` is unset or names the mount's
endpoint, and ``~/.hscfg``'s when its ``hs_endpoint`` is empty or names it.
Values spelt ``none`` (any case) are unset, as h5pyd has it. An API key wins
over the user name and password (it is sent as a bearer token).

Plain synchronous code, run once before the mount is served.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from mountd.config import MountConfig
from mountd.errors import SourceError
from mountd.io.hsservice import Credentials, endpoint_url

log = logging.getLogger(__name__)

_FIELDS = ("hs_username", "hs_password", "hs_api_key")


def credentials(config: MountConfig, endpoint: str, env: Mapping[str, str] | None = None,
                hscfg: Path | None = None) -> Credentials:
    """The credentials of a mount of ``endpoint`` (see the module docstring)."""
    env = os.environ if env is None else env
    hscfg = Path.home() / ".hscfg" if hscfg is None else hscfg
    found: dict[str, str] = {}
    given = {"hs_username": config.hs_username,
             "hs_password": _first_line(config.hs_password_file, "hs_password_file"),
             "hs_api_key": _first_line(config.hs_api_key_file, "hs_api_key_file")}
    found.update({k: v for k, v in given.items() if _set(v)})
    if _same(env.get("HS_ENDPOINT"), endpoint):
        for name in _FIELDS:
            value = env.get(name.upper())
            if name not in found and _set(value):
                found[name] = value
    cfg = _read_hscfg(hscfg)
    if _same(cfg.get("hs_endpoint"), endpoint):
        for name in _FIELDS:
            value = cfg.get(name)
            if name not in found and _set(value):
                found[name] = value
    return Credentials(found.get("hs_username"), found.get("hs_password"),
                       found.get("hs_api_key"))


def _set(value: str | None) -> bool:
    return bool(value) and value.strip().lower() != "none"


def _same(written_for: str | None, endpoint: str) -> bool:
    """True if credentials written for ``written_for`` may go to ``endpoint``."""
    if not _set(written_for):
        return True
    try:
        return endpoint_url(written_for.strip()) == endpoint_url(endpoint)
    except SourceError:
        return False


def _first_line(path: str | None, option: str) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"-o {option}={path}: cannot read it ({exc})") from exc
    value = line.rstrip("\r\n")
    if not value:
        raise SourceError(f"-o {option}={path}: its first line is empty")
    return value


def _read_hscfg(path: Path) -> dict[str, str]:
    """The ``key = value`` lines of an h5pyd config file; {} if there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("%s: not read (%s)", path, exc)
        return {}
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip()
    return values
