"""Secrets of URLs masked in text (``layouts.redact``) and where the daemon shows text.

``redact`` is checked over many URL shapes: presigned URLs of AWS (SigV4 and
SigV2), Google Cloud Storage, Azure, CloudFront, tokens and API keys,
userinfo, keys holding a query, several URLs in one message; URLs with no
secret come back unchanged, and redacted text is left alone by a second pass.
Then the places it is applied without a mount: ``LayoutError`` messages, the
log filter (a third-party record and a traceback), ``fsname``, sidecar links.
``tests/test_mount_secrets.py`` checks a real mount end to end.
"""

from __future__ import annotations

import dataclasses
import io
import logging
from types import MappingProxyType

import httpx
import numpy as np
import pytest
import trio

from layouts.errors import NotFound, SourceError, StorageError
from layouts.model import Attribute, Group, Link, LinkKind, ObjectRef
from layouts.redact import MASK, redact, secret_name
from mountd import logsafe
from mountd.config import MountConfig
from mountd.tree.sidecar import sidecar_document, stored_links
from tests import modelcat

M = MASK

SHAPES = [
    # AWS SigV4, the session token of temporary credentials included.
    ("https://b.s3.us-east-1.amazonaws.com/d/f.h5?X-Amz-Algorithm=AWS4-HMAC-SHA256"
     "&X-Amz-Credential=AKIAXX%2F20250101%2Fus-east-1%2Fs3%2Faws4_request"
     "&X-Amz-Date=20250101T000000Z&X-Amz-Expires=3600&X-Amz-Security-Token=IQoJb3JpZ2luX2Vj"
     "&X-Amz-SignedHeaders=host&x-id=GetObject&X-Amz-Signature=0123abcd",
     "https://b.s3.us-east-1.amazonaws.com/d/f.h5?X-Amz-Algorithm=AWS4-HMAC-SHA256"
     f"&X-Amz-Credential={M}&X-Amz-Date=20250101T000000Z&X-Amz-Expires=3600"
     f"&X-Amz-Security-Token={M}&X-Amz-SignedHeaders=host&x-id=GetObject"
     f"&X-Amz-Signature={M}"),
    # lower case, and a name percent-encoded
    ("https://h/f?x-amz-signature=abc&X%2DAmz%2DSecurity%2DToken=def",
     f"https://h/f?x-amz-signature={M}&X%2DAmz%2DSecurity%2DToken={M}"),
    # AWS SigV2
    ("https://b.s3.amazonaws.com/f.h5?AWSAccessKeyId=AKIAXX&Expires=1700000000"
     "&Signature=vjbyPxybdZaNmGa%2ByT272YEAiv4%3D",
     f"https://b.s3.amazonaws.com/f.h5?AWSAccessKeyId={M}&Expires=1700000000"
     f"&Signature={M}"),
    # Google Cloud Storage, V4 and V2
    ("https://storage.googleapis.com/b/f.h5?X-Goog-Algorithm=GOOG4-RSA-SHA256"
     "&X-Goog-Credential=sa%40p.iam.gserviceaccount.com%2F20250101%2Fauto%2Fstorage"
     "%2Fgoog4_request&X-Goog-Date=20250101T000000Z&X-Goog-Expires=900"
     "&X-Goog-SignedHeaders=host&X-Goog-Signature=8f6e2a",
     "https://storage.googleapis.com/b/f.h5?X-Goog-Algorithm=GOOG4-RSA-SHA256"
     f"&X-Goog-Credential={M}&X-Goog-Date=20250101T000000Z&X-Goog-Expires=900"
     f"&X-Goog-SignedHeaders=host&X-Goog-Signature={M}"),
    ("https://storage.googleapis.com/b/f?GoogleAccessId=sa%40p&Expires=1&Signature=a%2Bb",
     f"https://storage.googleapis.com/b/f?GoogleAccessId={M}&Expires=1&Signature={M}"),
    # Azure SAS: only the signature is secret
    ("https://acct.blob.core.windows.net/c/f.h5?sv=2022-11-02&ss=b&srt=o&sp=r"
     "&se=2099-01-01T00:00:00Z&st=2025-01-01T00:00:00Z&spr=https&sig=abc%2Bdef%3D",
     "https://acct.blob.core.windows.net/c/f.h5?sv=2022-11-02&ss=b&srt=o&sp=r"
     f"&se=2099-01-01T00:00:00Z&st=2025-01-01T00:00:00Z&spr=https&sig={M}"),
    # CloudFront
    ("https://d1.cloudfront.net/f.h5?Expires=1&Signature=a~b-c&Key-Pair-Id=K2JCJMDEHXQW5F",
     f"https://d1.cloudfront.net/f.h5?Expires=1&Signature={M}&Key-Pair-Id=K2JCJMDEHXQW5F"),
    # tokens and keys of every spelling, in the query and in the fragment
    ("https://h/f?token=t1&access_token=t2&api_key=k1&apikey=k2&key=k3&part=2",
     f"https://h/f?token={M}&access_token={M}&api_key={M}&apikey={M}&key={M}&part=2"),
    ("https://h/f?password=p&client_secret=s&auth=a&__token__=exp=1~hmac=x#id_token=j",
     f"https://h/f?password={M}&client_secret={M}&auth={M}&__token__={M}#id_token={M}"),
    # userinfo
    ("https://alice:pa55w0rd@example.org/r.json", f"https://alice:{M}@example.org/r.json"),
    ("https://ghp_tokentokentoken@example.org/r.json", f"https://{M}@example.org/r.json"),
    ("http://u:p@[::1]:8080/x?sig=s", f"http://u:{M}@[::1]:8080/x?sig={M}"),
    # a store's key holding a query, with no scheme or host
    ("data/f.h5?X-Amz-Signature=abc", f"data/f.h5?X-Amz-Signature={M}"),
    # several URLs in one message, and punctuation after them
    ("cannot read https://h/a.h5?sig=s1: not found (https://h b.h5?token=t2), retrying",
     f"cannot read https://h/a.h5?sig={M}: not found (https://h b.h5?token={M}), retrying"),
    ("['https://h/a?sig=s1', 0, 8] and \"https://u:p@h/b\"",
     f"['https://h/a?sig={M}', 0, 8] and \"https://u:{M}@h/b\""),
    ("HTML-escaped https://h/a?x=1&amp;sig=s1", f"HTML-escaped https://h/a?x=1&amp;sig={M}"),
]

UNCHANGED = [
    "s3://bucket/prefix",
    "/srv/hsds/data/bucket",
    "https://example.org/data/run42.lindi.json",
    "https://h/f.h5?version=3&part=1&X-Amz-SignedHeaders=host&author=me&x-id=GetObject",
    "http://[::1]:8080/x?a=1#frag",
    "file:///tmp/x.h5",
    "https://h/f?sig=&token=",  # empty: nothing to hide
    "https://u:@h/f",
    "alice@example.org wrote https://h/f",
    "a = b & c; d=e",
    "",
]


@pytest.mark.parametrize(("text", "shown"), SHAPES)
def test_secrets_are_masked_and_the_rest_kept(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert redact(shown) == shown


@pytest.mark.parametrize("text", UNCHANGED)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("name", "secret"), [
    ("X-Amz-Signature", True), ("X-Amz-Credential", True), ("X-Amz-Security-Token", True),
    ("X-Goog-Signature", True), ("sig", True), ("SIG", True), ("token", True),
    ("refresh_token", True), ("api-key", True), ("sessionid", True), ("Password", True),
    ("X-Amz-SignedHeaders", False), ("X-Amz-Date", False), ("se", False), ("sv", False),
    ("Key-Pair-Id", False), ("versionId", False), ("author", False), ("signed", False),
])
def test_secret_names(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


def test_error_messages_are_redacted_and_keep_the_whole_key() -> None:
    url = "https://h/f.h5?X-Amz-Date=1&X-Amz-Signature=s3cr3tsignature"
    err = StorageError(url, "access denied (403)")
    assert str(err) == f"https://h/f.h5?X-Amz-Date=1&X-Amz-Signature={M}: access denied (403)"
    assert err.key == url  # what was read, for whoever must read it again
    assert "s3cr3t" not in str(NotFound(url)) + str(SourceError(f"{url}: not found"))
    assert "s3cr3t" not in repr(str(err))


def test_the_log_filter_masks_urls_of_any_logger_and_tracebacks() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logsafe.RedactFilter())
    logger = logging.getLogger("httpx.redact-test")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    url = httpx.URL("https://h/f.h5?X-Amz-Date=1&X-Amz-Signature=s3cr3tsignature")
    try:
        logger.info('HTTP Request: %s %s "%s %d %s"', "GET", url, "HTTP/1.1", 206, "Partial")
        try:
            raise ValueError(f"Client error '403 Forbidden' for url '{url}'")
        except ValueError:
            logger.exception("request failed")
        logger.info("%d%% done, %s", 100, "nothing to hide")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert "s3cr3t" not in text
    assert text.count(f"https://h/f.h5?X-Amz-Date=1&X-Amz-Signature={M}") == 2
    assert "100% done, nothing to hide" in text


def test_fsname_is_redacted() -> None:
    config = MountConfig(source="https://h/r.json?sig=s3cr3t&sv=1", mountpoint="/mnt")
    assert f"fsname=https://h/r.json?sig={M}&sv=1" in config.fuse_options()
    config.fsname = "https://u:s3cr3t@h/"
    assert f"fsname=https://u:{M}@h/" in config.fuse_options()


def test_sidecar_links_and_storage_descriptions_are_redacted() -> None:
    group = Group(id="g", links={
        "ext": Link(LinkKind.EXTERNAL, "/data", domain="https://h/f.h5?token=s3cr3t"),
        "soft": Link(LinkKind.SOFT, "/a?token=kept-as-stored-path")})
    links = stored_links(group)
    assert links["ext"] == {"kind": "external", "domain": f"https://h/f.h5?token={M}",
                            "path": "/data"}
    assert logsafe.redact_strings({"layout": {"file_uri": "https://u:s3cr3t@h/f", "n": (1, "a")}}) \
        == {"layout": {"file_uri": f"https://u:{M}@h/f", "n": (1, "a")}}


async def no_refs(ref: ObjectRef) -> str | None:
    return None


def test_a_sidecar_shows_storage_urls_redacted_and_attributes_as_stored() -> None:
    layout = {"class": "H5D_CONTIGUOUS_REF", "file_uri": "https://h/f.h5?X-Amz-Signature=s3cr3t",
              "offset": 8, "size": 64}
    rows = np.zeros(4, np.dtype([("a", "<i4")]))
    content = "https://h/f.h5?token=part-of-the-data"
    ds = dataclasses.replace(modelcat.table("d-1", rows, 2), hdf5={"layout": layout},
                             attrs=(Attribute("source", content),))
    doc = trio.run(sidecar_document, ds, "/t", None, no_refs)
    assert doc["hdf5"] == {"layout": {**layout, "file_uri":
                                      f"https://h/f.h5?X-Amz-Signature={M}"}}
    assert doc["attributes"] == {"source": content}


def test_a_shared_description_is_redacted_again_once_a_secret_is_added(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sidecars keep the shown form of a description shared by many datasets;
    a secret added later (rotated S3 credentials) is still masked in them."""
    monkeypatch.setattr(logsafe, "_secrets", logsafe._secrets.copy())
    secret = "rotated-secret-key-0123"
    layout = {"class": "H5D_CONTIGUOUS_REF", "file_uri": f"s3://b/{secret}/f.h5"}
    rows = np.zeros(4, np.dtype([("a", "<i4")]))
    shared = MappingProxyType({"layout": layout})  # as a catalog shares one
    ds = dataclasses.replace(modelcat.table("d-1", rows, 2), hdf5=shared)
    before = trio.run(sidecar_document, ds, "/t", None, no_refs)
    assert trio.run(sidecar_document, ds, "/t", None, no_refs)["hdf5"] is before["hdf5"]
    assert before["hdf5"]["layout"]["file_uri"] == f"s3://b/{secret}/f.h5"
    logsafe.add_secret(secret)
    after = trio.run(sidecar_document, ds, "/t", None, no_refs)
    assert after["hdf5"]["layout"]["file_uri"] == f"s3://b/{M}/f.h5"
    assert ds.hdf5["layout"]["file_uri"] == f"s3://b/{secret}/f.h5"  # the model is untouched
