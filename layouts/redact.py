"""Secrets in URLs, masked wherever text may hold one: a port of ``layouts/``.

Owns the rule of what part of a URL is a secret (docs/CONTRACT.md, "Secrets
in URLs"), and ``redact``, which masks those parts in any text: a bare URL,
a storage key, an error message, a log line holding several URLs. A
presigned URL stays useful to read, with its scheme, host, path and every
other parameter kept:

- the value of a query (or fragment) parameter whose name is a secret's
  (``secret_name``: signatures, tokens, credentials, passwords, keys, such as
  ``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``,
  ``X-Goog-Signature``, Azure SAS's ``sig``, ``token``) becomes ``MASK``:
  ``X-Amz-Signature=<redacted>``; a parameter is found by the ``?``, ``&``,
  ``#`` or ``;`` before it, so a key holding a query (``file.h5?sig=...``)
  is masked as well as a whole URL. Its value ends at ``&``, ``#``, ``;``,
  white space or a quote, and leaves out the punctuation that ends the text
  or comes before white space (``...?sig=<redacted>: not found``, ``(URL)``);
- the userinfo of a URL: the password in ``user:password@`` becomes
  ``user:<redacted>@``, and a user name alone (how a token is often passed,
  ``https://TOKEN@host``) becomes ``<redacted>@``.

Masked text is left as it is by a second pass. Both layouts and the daemon
mask with it: ``LayoutError`` messages (``layouts.errors``), and through
``mountd.logsafe.redact`` the log filter, control files, sidecars and
``fsname``. It is never applied to what the mount reads: requests go out
with the whole URL.

Pure functions of their arguments, with no state; safe from any thread.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

#: What a secret is replaced with.
MASK = "<redacted>"

#: A parameter is a secret's if its name, lower case and without ``-``, ``_``
#: and ``.``, is one of these...
SECRET_NAMES = frozenset({"sig", "key", "auth", "pass", "pwd", "jwt", "hdnts",
                          "googleaccessid"})
#: ... or holds one of these.
SECRET_WORDS = ("signature", "token", "secret", "password", "passwd", "credential",
                "apikey", "accesskey", "privatekey", "sessionid", "hmac")

_PARAM = re.compile(r"(?P<lead>[?&#;])(?P<name>[^\s=&#;?\"'`]+)="
                    r"(?P<value>[^\s&#;\"'`]*?)(?=[\s&#;\"'`]|[:.,)\]}]*(?:\s|$))")
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#@\"'`]*)@")
_NAME_NOISE = re.compile(r"[-_.]")


def secret_name(name: str) -> bool:
    """True if a URL parameter of this name carries a secret."""
    plain = _NAME_NOISE.sub("", unquote(name)).lower()
    return plain in SECRET_NAMES or any(word in plain for word in SECRET_WORDS)


def redact(text: str) -> str:
    """``text`` with the secrets of every URL in it masked (see the module)."""
    if "=" in text:
        text = _PARAM.sub(_param, text)
    if "@" in text and "://" in text:
        text = _USERINFO.sub(_userinfo, text)
    return text


def _param(match: re.Match[str]) -> str:
    value = match["value"]
    if value in ("", MASK) or not secret_name(match["name"]):
        return match[0]
    return f"{match['lead']}{match['name']}={MASK}"


def _userinfo(match: re.Match[str]) -> str:
    user, colon, password = match["userinfo"].partition(":")
    if colon:
        if password in ("", MASK):
            return match[0]
        return f"{match['scheme']}{user}:{MASK}@"
    if user in ("", MASK):
        return match[0]
    return f"{match['scheme']}{MASK}@"
