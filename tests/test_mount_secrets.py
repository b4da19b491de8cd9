"""Presigned URLs in a reference file: read with their secrets, shown without them.

A real kerchunk reference file, served with the HDF5 file it describes by the
loopback ``RangeHttpServer`` (which ignores query strings), names that file
by presigned-style URLs: AWS SigV4 (``X-Amz-Credential``, ``X-Amz-Signature``,
``X-Amz-Security-Token``), Azure SAS (``sig``), GCS (``X-Goog-Signature``),
``token`` and a ``user:password@`` URL. The reference file itself is mounted
by a presigned URL too, with debug logging to a file and ``-o stats_file``.
Data read through the mount must equal h5py's, the server must have been sent
the full URLs, and the error paths (a 404, a truncated range, an external
array file that is gone, credentials in a URL, a mount that fails) must have
run. Then no secret value may appear anywhere the mount shows text: the log,
``/proc/mounts``, the control files, the stats file, every file and xattr of
the tree (sidecars, Zarr files, ``.root.h5``),
and the failed mount's message on stderr. The redacted forms must appear in
the log, so the URLs were there to be masked.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from layouts.redact import MASK
from tests.http_server import RangeHttpServer
from tests.mounting import fuse_available, mounted, run_h5mount

pytestmark = [pytest.mark.mount, pytest.mark.server,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

#: A value no redaction may leave anywhere, made fresh for each run.
SECRETS = {name: f"{name}{secrets.token_hex(12)}" for name in (
    "AKIAKEYID", "sigv4", "ststoken", "refsig", "azuresig", "googsig", "plaintoken",
    "password", "metasig", "failsig")}


def aws_query(signature: str, *, token: str | None = None) -> str:
    """A SigV4 presigned query string, non-secret parameters first."""
    parts = ["X-Amz-Algorithm=AWS4-HMAC-SHA256",
             f"X-Amz-Credential={SECRETS['AKIAKEYID']}%2F20250101%2Fus-east-1%2Fs3%2Faws4_request",
             "X-Amz-Date=20250101T000000Z", "X-Amz-Expires=3600"]
    if token is not None:
        parts.append(f"X-Amz-Security-Token={token}")
    parts += ["X-Amz-SignedHeaders=host", f"X-Amz-Signature={signature}"]
    return "&".join(parts)


@dataclass(frozen=True)
class Site:
    """The served files: the HDF5 file and the reference file's presigned URL."""

    h5: Path
    server: RangeHttpServer
    refs_url: str


def write_h5(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "presigned"
        f.create_dataset("values", data=np.arange(200 * 50, dtype="<f8").reshape(200, 50),
                         chunks=(16, 16), compression="gzip")
        f.create_dataset("big", data=np.arange(5000, dtype="<i4"), chunks=(100,))
        f.create_dataset("flat", data=np.arange(300, dtype="<i2"))


def presigned_refs(h5: Path, server: RangeHttpServer) -> dict[str, Any]:
    """kerchunk's refs of ``h5``, its byte ranges pointed at presigned URLs, plus
    datasets whose refs fail: a missing file, a truncated range, credentials in
    the URL, an external array whose file is gone, and metadata that is gone."""
    kerchunk_hdf = pytest.importorskip("kerchunk.hdf")
    doc: dict[str, Any] = kerchunk_hdf.SingleHdf5ToZarr(str(h5), inline_threshold=0).translate()
    refs: dict[str, Any] = doc["refs"]
    data = server.url_for(h5.name)
    values_url = f"{data}?{aws_query(SECRETS['sigv4'])}"
    for value in refs.values():
        if isinstance(value, list):
            value[0] = values_url
    size = h5.stat().st_size

    def like_flat(name: str, ref: list[Any]) -> None:
        refs[f"{name}/.zarray"] = refs["flat/.zarray"]
        refs[f"{name}/.zattrs"] = refs["flat/.zattrs"]
        refs[f"{name}/0"] = ref

    like_flat("missing", [f"{server.url_for('missing.h5')}?X-Goog-Algorithm=GOOG4-RSA-SHA256"
                          f"&X-Goog-Date=20250101T000000Z&X-Goog-Signature={SECRETS['googsig']}",
                          0, 600])
    like_flat("truncated", [f"{data}?sv=2022-11-02&sr=b&sp=r&se=2099-01-01&"
                            f"sig={SECRETS['azuresig']}", size - 10, 600])
    refs["meta_gone/.zattrs"] = "{}"
    refs["meta_gone/.zarray"] = [f"{server.url_for('meta.json')}?{aws_query(SECRETS['metasig'])}",
                                 0, 200]
    like_flat("userinfo", [f"http://alice:{SECRETS['password']}@{data.split('://', 1)[1]}",
                           0, 600])

    def external(name: str, url: str) -> None:
        attrs = json.loads(refs["big/.zattrs"])
        attrs["_EXTERNAL_ARRAY_LINK"] = {"link_type": "hdf5_dataset", "url": url,
                                         "name": "/big"}
        refs[f"{name}/.zarray"] = refs["big/.zarray"]
        refs[f"{name}/.zattrs"] = json.dumps(attrs)

    for key in [k for k in refs if k.startswith("big/") and not k.startswith("big/.")]:
        del refs[key]
    external("big", f"{data}?{aws_query(SECRETS['sigv4'], token=SECRETS['ststoken'])}")
    external("gone", f"{server.url_for('gone.h5')}?token={SECRETS['plaintoken']}")
    return copy.deepcopy(doc)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("presigned")
    h5 = root / "data.h5"
    write_h5(h5)
    with RangeHttpServer(root) as server:
        (root / "refs.json").write_text(json.dumps(presigned_refs(h5, server)))
        yield Site(h5, server, f"{server.url_for('refs.json')}?{aws_query(SECRETS['refsig'])}")


def assert_clean(where: str, text: str | bytes) -> None:
    """No secret value is in ``text``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    leaked = [name for name, value in SECRETS.items() if value in text]
    assert not leaked, f"{where} shows {leaked}"


def read_everything(mp: Path) -> dict[str, int]:
    """Every file, symlink and xattr under ``mp`` checked for secrets; the errno of
    each file or directory that cannot be read, by path."""
    failed: dict[str, int] = {}
    for top, dirs, files in os.walk(mp):
        for name in [*dirs, *files]:
            path = Path(top, name)
            try:
                if path.is_symlink():
                    assert_clean(str(path), os.readlink(path))
                elif name in dirs:
                    for attr in os.listxattr(path):
                        assert_clean(f"{path} {attr}", os.getxattr(path, attr))
                else:
                    assert_clean(str(path), path.read_bytes())
            except OSError as exc:
                assert_clean(f"the error reading {path}", str(exc))
                failed[str(path.relative_to(mp))] = exc.errno or 0
    return failed


def test_presigned_urls_are_read_in_full_and_shown_redacted(site: Site, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    stats_file = tmp_path / "stats.json"
    mp = tmp_path / "mnt"
    site.server.clear()
    with mounted(site.refs_url, mp, "--log-level", "debug", "--log-file", str(log),
                 "-o", f"stats_file={stats_file}"):
        with h5py.File(site.h5, "r") as f:
            np.testing.assert_array_equal(np.load(mp / "values.npy"), f["values"][()])
            np.testing.assert_array_equal(np.load(mp / "big.npy"), f["big"][()])
            np.testing.assert_array_equal(np.load(mp / "flat.npy"), f["flat"][()])
        failed = read_everything(mp)
        assert {failed.get(f"{name}/0") for name in ("missing", "truncated", "userinfo")} \
            == {errno.EIO}, failed
        assert failed.get("gone.npy") == errno.EIO, failed
        assert failed.get("meta_gone") == failed.get("meta_gone.json") == errno.EIO, failed
        with h5py.File(mp / ".root.h5", "r") as view:
            left_out = [str(line) for line in view.attrs["h5mount_left_out"]]
        assert any(line.startswith("/meta_gone: cannot be read") and
                   f"X-Amz-Signature={MASK}" in line for line in left_out), left_out
        with open("/proc/mounts") as mounts:
            line = next(line for line in mounts if str(mp) in line.split()[1])
        assert "refs.json?" in line
        assert_clean("/proc/mounts", line)
        for name in ("config.json", "stats.json", "metrics"):
            assert_clean(name, (mp / ".h5mount" / name).read_bytes())
        config = json.loads((mp / ".h5mount" / "config.json").read_text())
        assert f"X-Amz-Signature={MASK}" in config["source"]
        assert "X-Amz-Date=20250101T000000Z" in config["source"]
    # The server got the whole URLs: the redaction is in what is shown alone.
    targets = [target for _, target, _, _ in site.server.requests()]
    for name in ("refsig", "sigv4", "ststoken", "azuresig", "googsig", "plaintoken"):
        assert any(SECRETS[name] in target for target in targets), name
    assert_clean("the stats file", stats_file.read_bytes())
    text = log.read_text()
    assert_clean("the log", text)
    for shown in (f"X-Amz-Signature={MASK}", f"X-Amz-Credential={MASK}",
                  f"X-Amz-Security-Token={MASK}", f"sig={MASK}", f"X-Goog-Signature={MASK}",
                  f"token={MASK}", "X-Amz-Date=20250101T000000Z", "HTTP Request: GET"):
        assert shown in text, shown


def test_a_failed_mount_says_so_without_the_secret(site: Site, tmp_path: Path) -> None:
    url = f"{site.server.url_for('nothere.json')}?{aws_query(SECRETS['failsig'])}"
    done = run_h5mount(url, str(tmp_path), "--log-level", "debug")
    assert done.returncode == 1
    assert "nothere.json?X-Amz-Algorithm=AWS4-HMAC-SHA256" in done.stderr
    assert f"X-Amz-Signature={MASK}" in done.stderr
    assert_clean("h5mount's stderr", done.stderr)
