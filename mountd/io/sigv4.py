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
call, which costs about as much CPU as sending the request. Here what
depends only on the UTC day (the signing key, an HMAC keyed with it, the
credential scope and the Authorization header up to the signature) is made
once per day, the timestamp once per second and the canonical request's
constant tail once per signer, so a signature is one SHA-256 and one copied
HMAC over short strings.

Concurrency: a ``SigV4Signer`` holds one set of frozen credentials and its
caches; ``sign`` never awaits, so the caches change only between signatures
and any number of trio tasks may sign with it at once.
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
        signed = "host;x-amz-content-sha256;x-amz-date" + (";x-amz-security-token"
                                                           if token else "")
        #: The canonical request after the date header: the same for every request.
        self._tail = ((f"x-amz-security-token:{token}\n" if token else "")
                      + f"\n{signed}\n{EMPTY_SHA256}")
        self._signed = signed
        self._day = ""
        self._scope = ""
        self._mac = hmac.new(b"", digestmod=hashlib.sha256)
        self._credential = ""
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
        if stamp[:8] != self._day:
            self._new_day(stamp[:8])
        canonical = (f"{method}\n{path}\n\nhost:{host}\nx-amz-content-sha256:{EMPTY_SHA256}\n"
                     f"x-amz-date:{stamp}\n{self._tail}")
        mac = self._mac.copy()
        mac.update(f"{ALGORITHM}\n{stamp}\n{self._scope}\n"
                   f"{hashlib.sha256(canonical.encode()).hexdigest()}".encode())
        headers = {
            "x-amz-content-sha256": EMPTY_SHA256,
            "x-amz-date": stamp,
            "Authorization": self._credential + mac.hexdigest(),
        }
        if self._token:
            headers["x-amz-security-token"] = self._token
        return headers

    def _new_day(self, day: str) -> None:
        """Derive the signing key of ``day`` (``YYYYMMDD``) and what follows from it."""
        key = ("AWS4" + self._secret).encode()
        for part in (day, self.region, self.service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._scope = scope
        self._credential = (f"{ALGORITHM} Credential={self.access_key}/{scope}, "
                            f"SignedHeaders={self._signed}, Signature=")
        self._day = day
