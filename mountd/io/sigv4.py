"""AWS Signature Version 4 for S3 GET and HEAD requests, without botocore's per-request cost.

Owns the signing of the S3 store's hot path (``mountd.io.s3``): a request
with no body, no query string and an already URI-encoded path. It signs
exactly ``host``, ``x-amz-content-sha256`` (the SHA-256 of the empty body),
``x-amz-date`` and, with temporary credentials, ``x-amz-security-token``;
other headers (``Range``, ``If-Match``) travel unsigned, which S3 allows.
The result is the signature botocore's ``S3SigV4Auth`` computes for the same
request headers (``tests/test_s3store.py`` checks it byte for byte).

Why not botocore's signer: it builds an ``AWSRequest``, re-parses the URL,
canonicalises every header and formats dates through ``datetime`` on every
call, which costs about as much CPU as sending the request. Here the signing
key is derived once per UTC day and the timestamp once per second, so a
signature is two SHA-256 passes over short strings.

Concurrency: a ``SigV4Signer`` holds one set of frozen credentials and two
caches that are replaced whole without an ``await`` in between, so any
number of trio tasks may sign with it at once.
"""

from __future__ import annotations

import hashlib
import hmac
import time

#: SHA-256 of the empty payload, hex: every GET and HEAD sends it.
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ALGORITHM = "AWS4-HMAC-SHA256"


class SigV4Signer:
    """Signs bodiless requests to one service in one region with one set of credentials."""

    def __init__(self, access_key: str, secret_key: str, token: str | None,
                 region: str, service: str = "s3") -> None:
        self.access_key = access_key
        self._secret = secret_key
        self._token = token
        self.region = region
        self.service = service
        self._signed = ("host;x-amz-content-sha256;x-amz-date"
                        + (";x-amz-security-token" if token else ""))
        self._day = ""
        self._scope = ""
        self._key = b""
        self._second = -1
        self._stamp = ""

    def sign(self, method: str, host: str, path: str,
             now: float | None = None) -> dict[str, str]:
        """The headers that sign ``method host path`` (path URI-encoded, no query) at
        ``now`` (seconds since the epoch; default the current time)."""
        second = int(time.time() if now is None else now)
        if second != self._second:
            self._stamp, self._second = time.strftime("%Y%m%dT%H%M%SZ",
                                                      time.gmtime(second)), second
        stamp = self._stamp
        day = stamp[:8]
        if day != self._day:
            self._key = self._derive(day)
            self._scope = f"{day}/{self.region}/{self.service}/aws4_request"
            self._day = day
        token = self._token
        canonical = (f"{method}\n{path}\n\nhost:{host}\nx-amz-content-sha256:{EMPTY_SHA256}\n"
                     f"x-amz-date:{stamp}\n"
                     + (f"x-amz-security-token:{token}\n" if token else "")
                     + f"\n{self._signed}\n{EMPTY_SHA256}")
        to_sign = (f"{ALGORITHM}\n{stamp}\n{self._scope}\n"
                   f"{hashlib.sha256(canonical.encode()).hexdigest()}")
        signature = hmac.new(self._key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers = {
            "x-amz-content-sha256": EMPTY_SHA256,
            "x-amz-date": stamp,
            "Authorization": (f"{ALGORITHM} Credential={self.access_key}/{self._scope}, "
                              f"SignedHeaders={self._signed}, Signature={signature}"),
        }
        if token:
            headers["x-amz-security-token"] = token
        return headers

    def _derive(self, day: str) -> bytes:
        """The signing key of ``day`` (``YYYYMMDD``)."""
        key = ("AWS4" + self._secret).encode()
        for part in (day, self.region, self.service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        return key
