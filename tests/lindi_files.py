"""Real LINDI files for the tests, written and read by lindi itself.

lindi 0.4.6 needs zarr 2, so it lives in its own virtualenv (``.venv-lindi``,
made by ``dev/setup``); this module runs ``tests/lindi_tool.py`` there as a
subprocess. ``write_lindi`` writes a ``.lindi.json``, ``.lindi.tar`` or
``.lindi.d`` from an HDF5 file; ``lindi_read`` asks lindi's own reader for
the bytes of keys. Both skip the calling test when the virtualenv is missing.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from tests import tiers

ROOT = Path(__file__).resolve().parents[1]
LINDI_PYTHON = ROOT / ".venv-lindi" / "bin" / "python"
LINDI_TOOL = Path(__file__).with_name("lindi_tool.py")


def lindi_available() -> bool:
    return LINDI_PYTHON.exists()


def _need_lindi() -> None:
    tiers.uses("tools")
    if not lindi_available():
        pytest.skip(f"lindi is not installed: {LINDI_PYTHON} is missing (run dev/setup)")


def write_lindi(kind: str, h5: Path, out: Path, url: str | None = None, *,
                threshold: int | None = None, blobs: int = 0) -> Path:
    """Write ``out`` from ``h5`` with real lindi: ``kind`` is json, tar or dir."""
    _need_lindi()
    command = [str(LINDI_PYTHON), str(LINDI_TOOL), kind, str(h5), str(out)]
    if url is not None:
        command += ["--url", url]
    if threshold is not None:
        command += ["--threshold", str(threshold)]
    if blobs:
        command += ["--blobs", str(blobs)]
    subprocess.run(command, check=True, capture_output=True, cwd=out.parent)
    return out


def lindi_read(path: Path, keys: list[str] | None = None, *, raw: bool = False
               ) -> dict[str, bytes | None]:
    """What lindi's own reader returns for ``keys`` of ``path`` (all keys if None)."""
    _need_lindi()
    command = [str(LINDI_PYTHON), str(LINDI_TOOL), "read", str(path), *(keys or [])]
    if raw:
        command.append("--raw")
    done = subprocess.run(command, check=True, capture_output=True, text=True,
                          cwd=path.parent)
    return {k: None if v is None else base64.b64decode(v)
            for k, v in json.loads(done.stdout).items()}
