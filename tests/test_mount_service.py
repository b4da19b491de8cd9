"""Mounting an HSDS service endpoint through the real daemon, against a real HSDS.

The service serves a copy of the session's bucket (``hsds_bucket``), so its
mount must show what a direct mount of the bucket shows (``test_mount_s3``'s
``snapshot``: every name, type, size, mode, symlink, xattr and byte, each
``D.h5`` as h5dump reads it), with the two differences docs/CONTRACT.md names
for a service: times are the server's ``lastModified`` of each object, and a
dataset directory lists every chunk of its grid, a chunk never stored reading
as the fill value (checked against h5py). ACLs are the server's, for the
user the mount authenticates as; faults come from a real HTTP proxy in front
of the service node (``tests/faultproxy.py``).
"""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from mountd.config import MountConfig
from mountd.hscredentials import credentials
from tests.conftest import HSDS_BUCKET
from tests.faultproxy import FaultProxy
from tests.h5compare import expected_chunk
from tests.hsds_server import ADMIN_PASSWORD, ADMIN_USER, HsdsServer
from tests.http_server import RangeHttpServer
from tests.mounting import fuse_available, mounted, run_h5mount
from tests.test_mount_s3 import snapshot, timeless_sidecar

pytestmark = [pytest.mark.mount, pytest.mark.hsds, pytest.mark.server,
              pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))]

READER, READER_PASSWORD = "reader", "reader-pw-3"
#: The domain the reader is given read access to; it may not read the others.
READABLE = "home/admin/types.h5"
HIDDEN = "home/admin/links.h5"
#: A dataset of 27 chunks of 6x5x4 int32 (``tests/h5files.py``, layout.h5).
GRID = "home/admin/layout.h5/edge_3d"


@pytest.fixture(scope="module")
def service(hsds_bucket: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HsdsServer]:
    """A running HSDS serving a copy of the session bucket (HSDS may write to what
    it serves), with a second user who may read ``READABLE`` only."""
    base = tmp_path_factory.mktemp("service")
    shutil.copytree(hsds_bucket.bucket_dir, base / "root" / HSDS_BUCKET, symlinks=True)
    with HsdsServer(base / "root", HSDS_BUCKET, log_dir=base / "logs",
                    users={READER: READER_PASSWORD}, scan_wait=3600) as server:
        server.rest("PUT", f"/acls/{READER}", READABLE,
                    {"create": False, "read": True, "update": False, "delete": False,
                     "readACL": False, "updateACL": False})
        yield server


def login(tmp: Path, user: str, password: str) -> tuple[str, ...]:
    """Mount options that authenticate as ``user`` (the password in a file)."""
    secret = tmp / f"{user}.password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    return ("-o", f"hs_username={user},hs_password_file={secret}")


@pytest.fixture(scope="module")
def service_mnt(service: HsdsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("svcmnt")
    with mounted(service.endpoint, tmp / "mnt", *login(tmp, ADMIN_USER, ADMIN_PASSWORD)) as mp:
        yield mp


def shuffle_only(mount: Path) -> list[str]:
    """The datasets filtered with byte shuffle and no compressor (as their sidecars
    show), which HSDS 1.0.2 serves wrongly unshuffled."""
    found = []
    for sidecar in mount.rglob("*.json"):
        try:
            doc = json.loads(sidecar.read_bytes())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("kind") != "dataset":
            continue
        classes = {f.get("class") for f in doc["hdf5"].get("filters") or []}
        if classes == {"H5Z_FILTER_SHUFFLE"} and doc["dtype"][-1] != "1":
            found.append(str(sidecar.with_suffix("").relative_to(mount)))
    return sorted(found)


def rest_json(service: HsdsServer, path: str, domain: str) -> dict[str, Any]:
    answer = service.rest("GET", path, domain)
    assert isinstance(answer, dict)
    return answer


def test_service_mount_equals_bucket_mount(service_mnt: Path, mnt: Path,
                                           hsds_bucket: Any) -> None:
    """Everything a direct mount of the bucket shows, the service mount shows the
    same; what it shows besides are chunks that were never stored, each of
    which reads as h5py's fill for that part of the grid."""
    local, remote = snapshot(mnt), snapshot(service_mnt)
    assert len(local) > 500
    assert sorted(set(local) - set(remote)) == []
    different = {rel for rel in local if remote[rel] != local[rel]}
    # The fixture gave the reader access to READABLE on the service: its ACLs are
    # the server's, so they show it, and the domain's lastModified moved.
    acl_changed = f"{READABLE}.json"
    assert remote[acl_changed][-1]["domain"]["acls"][READER]["read"] is True
    for tree in (local, remote):
        for key in ("acls", "lastModified"):
            tree[acl_changed][-1]["domain"].pop(key)
    different = {rel for rel in local if remote[rel] != local[rel]}
    # HSDS 1.0.2 serves these datasets wrongly unshuffled: whole chunks are put right,
    # edge chunks (and so the .npy, and h5dump of the domain's file) give EIO.
    shuffled = shuffle_only(mnt)
    assert len(shuffled) >= 2, shuffled
    wrong = {rel for rel in different if any(rel.startswith(f"{ds}/") or rel == f"{ds}.npy"
                                             for ds in shuffled)}
    assert different - wrong == {f"{ds.split('.h5/')[0]}.h5.h5" for ds in shuffled}, \
        [(rel, local[rel][:7], remote[rel][:7]) for rel in sorted(different - wrong)[:6]]
    assert {f"{ds}.npy" for ds in shuffled} <= wrong
    assert all(remote[rel][-1] == f"errno {errno.EIO}" for rel in wrong), wrong
    whole = [rel for ds in shuffled for rel in local if rel.startswith(f"{ds}/")
             and rel not in wrong and re.fullmatch(r"[\d.]+", rel[len(ds) + 1:])]
    assert whole, "no whole chunk of a shuffled dataset was compared"
    extra = sorted(set(remote) - set(local))
    checked = 0
    for rel in extra:
        dataset = service_mnt / rel
        directory = dataset.parent
        sidecar = json.loads(Path(f"{directory}.json").read_bytes())
        assert sidecar["kind"] == "dataset", rel
        index = tuple(int(i) for i in dataset.name.split("."))
        dtype = np.dtype(sidecar["dtype"]) if isinstance(sidecar["dtype"], str) else None
        domain = rel.split(".h5/")[0] + ".h5"
        if dtype is None or dtype.hasobject:
            assert dataset.read_bytes(), rel
            continue
        with h5py.File(hsds_bucket.files[domain], "r") as f:
            want = expected_chunk(f[sidecar["path"]], index, sidecar["chunks"], dtype)
        got = np.frombuffer(dataset.read_bytes(), dtype=dtype).reshape(want.shape)
        np.testing.assert_array_equal(got, want)
        checked += 1
    assert not extra or checked, extra


def test_a_grid_lists_every_chunk(service_mnt: Path) -> None:
    names = {p.name for p in (service_mnt / GRID).iterdir()}
    chunks = {n for n in names if re.fullmatch(r"\d+\.\d+\.\d+", n)}
    side = json.loads((service_mnt / f"{GRID}.json").read_bytes())
    grid = [-(-n // c) for n, c in zip(side["shape"], side["chunks"], strict=True)]
    assert len(chunks) == int(np.prod(grid)) == 27


def test_times_are_the_service_times(service_mnt: Path, service: HsdsServer) -> None:
    """A sidecar's ``modified`` and its entry's mtime are the object's
    ``lastModified`` as the service reports it."""
    domain = "home/admin/types.h5"
    checked = 0
    for sidecar in sorted((service_mnt / domain).rglob("*.json"))[:40]:
        if sidecar.is_symlink() or timeless_sidecar(sidecar) is None:
            continue
        doc = json.loads(sidecar.read_bytes())
        collection = {"group": "groups", "dataset": "datasets", "datatype": "datatypes"}
        stamp = rest_json(service, f"/{collection[doc['kind']]}/{doc['id']}", domain)
        assert doc["modified"] == pytest.approx(stamp["lastModified"]), sidecar
        if doc["path"] != "/":
            assert os.stat(sidecar.with_suffix("")).st_mtime == pytest.approx(doc["modified"])
        checked += 1
    assert checked >= 5


def test_a_domain_path_with_the_endpoint_option(service: HsdsServer, hsds_bucket: Any,
                                                service_mnt: Path, tmp_path: Path) -> None:
    """``-o endpoint=URL`` with SOURCE a domain path mounts that domain (its root
    group at the top, ``.root.json``); with a folder path, that folder."""
    creds = login(tmp_path, ADMIN_USER, ADMIN_PASSWORD)
    one_domain = "home/admin/attrs.h5"  # not READABLE: its ACLs differ from the bucket's
    with mounted(hsds_bucket.bucket_dir, tmp_path / "local", "--domain", one_domain) as local, \
            mounted(f"/{one_domain}", tmp_path / "one", "-o", f"endpoint={service.endpoint}",
                    *creds) as one:
        assert ".root.json" in os.listdir(one)
        assert snapshot(one) == snapshot(local)
    with mounted("/home/admin/", tmp_path / "folder", "-o", f"endpoint={service.endpoint}",
                 *creds) as folder:
        assert snapshot(folder / "layout.h5") == snapshot(service_mnt / "home/admin/layout.h5")
        with h5py.File(hsds_bucket.files["home/admin/layout.h5"], "r") as f:
            np.testing.assert_array_equal(np.load(folder / "layout.h5/edge_3d.npy"),
                                          f["edge_3d"][()])


def test_acls_are_the_servers(service: HsdsServer, tmp_path: Path, service_mnt: Path) -> None:
    """A user without read on a domain gets EACCES for it and reads the rest."""
    with mounted(service.endpoint, tmp_path / "mnt",
                 *login(tmp_path, READER, READER_PASSWORD)) as mp:
        folder = mp / "home/admin"
        assert {"types.h5", "links.h5"} <= set(os.listdir(folder))
        with pytest.raises(PermissionError):
            os.listdir(mp / HIDDEN)
        with pytest.raises(PermissionError):
            (mp / f"{HIDDEN}.json").read_bytes()
        seen = {p.relative_to(mp) for p in (mp / READABLE).rglob("*.npy")}
        assert len(seen) >= 5
        for rel in sorted(seen):
            assert (mp / rel).read_bytes() == (service_mnt / rel).read_bytes(), rel


def test_bad_credentials_refuse_the_mount(service: HsdsServer, tmp_path: Path) -> None:
    (tmp_path / "mp").mkdir()
    proc = run_h5mount(service.endpoint, str(tmp_path / "mp"),
                       *login(tmp_path, ADMIN_USER, "not-the-password"),
                       env={"HOME": str(tmp_path)})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "does not accept the mount's credentials" in lines[0], lines
    assert "not-the-password" not in proc.stderr


def test_no_credentials_read_what_anyone_may(service: HsdsServer, tmp_path: Path) -> None:
    """This server lets anonymous users list folders (HSDS's ``default`` user):
    with no credentials the mount shows the folders, and a domain only its
    owner may read gives EACCES."""
    with mounted(service.endpoint, tmp_path / "mp", env={"HOME": str(tmp_path)}) as mp:
        assert "links.h5" in os.listdir(mp / "home/admin")
        with pytest.raises(PermissionError):
            os.listdir(mp / HIDDEN)


def test_hscfg_credentials_and_no_secret_shown(service: HsdsServer, tmp_path: Path) -> None:
    """``~/.hscfg`` written for this endpoint logs the mount in; the password is in no
    log line and not in ``config.json``."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".hscfg").write_text(f"# h5pyd\nhs_endpoint = {service.endpoint}\n"
                                 f"hs_username = {READER}\nhs_password = {READER_PASSWORD}z\n")
    log = tmp_path / "daemon.log"
    (tmp_path / "mp").mkdir()
    # The reader's password with a suffix: the server refuses it...
    proc = run_h5mount(service.endpoint, str(tmp_path / "mp"), env={"HOME": str(home)})
    assert proc.returncode == 1 and "credentials" in proc.stderr, proc.stderr
    assert READER_PASSWORD not in proc.stderr
    # ... and the right one logs in.
    (home / ".hscfg").write_text(f"hs_endpoint = {service.endpoint}\n"
                                 f"hs_username = {READER}\nhs_password = {READER_PASSWORD}\n")
    with mounted(service.endpoint, tmp_path / "mp", "-o", f"log_file={log},log_level=DEBUG",
                 env={"HOME": str(home)}) as mp:
        assert (mp / READABLE / "misc/bool.npy").read_bytes()
        config = (mp / ".h5mount/config.json").read_text()
        stats = (mp / ".h5mount/stats.json").read_text()
    logged = log.read_text()
    assert "GET " in logged and READER in logged
    token = base64.b64encode(f"{READER}:{READER_PASSWORD}".encode()).decode()
    for text in (logged, config, stats):
        assert READER_PASSWORD not in text and token not in text


def test_credentials_go_only_to_their_endpoint(tmp_path: Path) -> None:
    """The environment's and ``~/.hscfg``'s credentials apply to the endpoint they
    name (or to any, naming none); the options win over both; an API key is a
    bearer token."""
    cfg = tmp_path / ".hscfg"
    cfg.write_text("hs_endpoint = http://other:5101\nhs_username = cfguser\nhs_password = cfgpw\n")
    config = MountConfig(source="http://127.0.0.1:5101", mountpoint="/mnt")
    here = "http://127.0.0.1:5101"
    assert credentials(config, here, env={}, hscfg=cfg).header() is None
    assert credentials(config, "http://OTHER:5101/", env={}, hscfg=cfg).username == "cfguser"
    env = {"HS_USERNAME": "envuser", "HS_PASSWORD": "envpw"}
    assert credentials(config, here, env=env, hscfg=cfg).username == "envuser"
    assert credentials(config, here, env={**env, "HS_ENDPOINT": "http://x:1"},
                       hscfg=cfg).header() is None
    assert credentials(config, here, env={"HS_API_KEY": "k3y", **env},
                       hscfg=cfg).header() == "Bearer k3y"
    secret = tmp_path / "pw"
    secret.write_text("filepw\n")
    config.hs_username, config.hs_password_file = "optuser", str(secret)
    found = credentials(config, here, env=env, hscfg=cfg)
    assert (found.username, found.password) == ("optuser", "filepw")
    assert "filepw" not in repr(found)
    assert credentials(MountConfig(source=here, mountpoint="/m"), here,
                       env={"HS_USERNAME": "none", "HS_PASSWORD": "x"},
                       hscfg=tmp_path / "missing").username is None


# ------------------------------------------------------------------------- faults


@pytest.fixture
def proxy(service: HsdsServer) -> Iterator[FaultProxy]:
    with FaultProxy(service.endpoint, seed=7) as fp:
        yield fp


def test_faults_are_retried_and_reads_stay_exact(proxy: FaultProxy, service_mnt: Path,
                                                 tmp_path: Path) -> None:
    proxy.error(503, path="/datasets/", probability=0.3)
    proxy.reset(path="/value", probability=0.2)
    proxy.error(500, path="/groups/", probability=0.2)
    with mounted(proxy.endpoint, tmp_path / "mnt", "-o", "timeout=20",
                 *login(tmp_path, ADMIN_USER, ADMIN_PASSWORD)) as mp:
        files = sorted(p.relative_to(service_mnt)
                       for p in (service_mnt / "home/admin/layout.h5").rglob("*.npy"))
        assert len(files) >= 3
        for rel in files:
            assert (mp / rel).read_bytes() == (service_mnt / rel).read_bytes(), rel
    hits = proxy.hits()
    assert hits["error"] > 0 and hits["reset"] > 0, hits


def test_a_dead_server_gives_eio_within_timeout(proxy: FaultProxy, tmp_path: Path) -> None:
    with mounted(proxy.endpoint, tmp_path / "mnt", "-o", "timeout=4",
                 *login(tmp_path, ADMIN_USER, ADMIN_PASSWORD)) as mp:
        npy = mp / GRID
        os.listdir(npy)  # metadata read; then the server goes silent
        proxy.stall(60, path="/value")
        started = time.monotonic()
        with pytest.raises(OSError) as caught:
            (mp / f"{GRID}.npy").read_bytes()
        assert caught.value.errno == errno.EIO
        assert time.monotonic() - started < 4 + 6
        proxy.clear()
        proxy.error(503, path="/value")
        started = time.monotonic()
        with pytest.raises(OSError) as caught:
            (mp / GRID / "1.1.1").read_bytes()
        assert caught.value.errno == errno.EIO
        assert time.monotonic() - started < 4 + 6


def test_a_url_that_is_no_service_is_refused(tmp_path: Path) -> None:
    """An http URL with no path is taken for an endpoint; a server that is not
    HSDS refuses the mount with one line, as an unreadable source does."""
    (tmp_path / "mp").mkdir()
    with RangeHttpServer(tmp_path) as web:
        proc = run_h5mount(web.url, str(tmp_path / "mp"))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not an HSDS service endpoint" in lines[0], lines


def hsds_requests(mount: Path) -> int:
    """The requests the daemon has sent to the service so far (its stats document)."""
    stats = json.loads((mount / ".h5mount/stats.json").read_bytes())
    return int(stats["storage"]["hsds"]["requests"])


def test_summaries_read_a_domain_in_a_few_requests(service: HsdsServer, service_mnt: Path,
                                                  tmp_path: Path) -> None:
    """With ``-o hs_summaries`` a scanned domain's metadata comes from its summary,
    in a few requests whatever its size, and shows the same tree (times aside)."""
    domain = "home/admin/links.h5"
    with mounted(service.endpoint, tmp_path / "mnt", "-o", "hs_summaries",
                 *login(tmp_path, ADMIN_USER, ADMIN_PASSWORD)) as mp:
        before = hsds_requests(mp)
        names = [p for p in (mp / domain).rglob("*")]
        asked = hsds_requests(mp) - before
        objects = sum(1 for p in names if p.name.endswith(".json") and p.is_file()
                      and timeless_sidecar(p) is not None)
        assert objects >= 20 and asked <= 5, (objects, asked)
        for sub in ("home/admin/links.h5", "home/admin/types.h5"):
            assert snapshot(mp / sub) == snapshot(service_mnt / sub), sub
