"""How HDF5 link names become file names (docs/CONTRACT.md, "Names").

Pure functions, no state. ``display_name`` is injective on link names: ``%``
is escaped first, so an escaped name never equals another link's raw name;
``unescape`` inverts ``escape``, so a name looked up can be mapped back to
its link without an index of the group.
Names over 255 bytes are cut and tagged with a SHA-1 so they stay unique.
The cut backs off to a UTF-8 character boundary so every name stays valid
UTF-8; for ASCII names it is exactly 240 bytes.
"""

from __future__ import annotations

import hashlib

NAME_MAX = 255
_CUT = 240
_HASH_CHARS = 14
_UNESCAPES = {"25": "%", "00": "\0"}


def escape(name: str) -> str:
    """Escape ``%``, NUL, and the names ``.`` and ``..``."""
    if name == ".":
        return "%2E"
    if name == "..":
        return "%2E%2E"
    return name.replace("%", "%25").replace("\0", "%00")


def unescape(shown: str) -> str | None:
    """The link name that ``escape`` shows as ``shown``, or None if it shows none."""
    if shown == "%2E":
        return "."
    if shown == "%2E%2E":
        return ".."
    first, *parts = shown.split("%")
    out = [first]
    for part in parts:
        char = _UNESCAPES.get(part[:2])
        if char is None:
            return None
        out += (char, part[2:])
    name = "".join(out)
    return name if escape(name) == shown else None


def fits(name: str, longest_suffix: int) -> bool:
    """True if ``name`` is shown uncut with every suffix of at most
    ``longest_suffix`` bytes (``display_name`` cuts and hashes the rest)."""
    return len(escape(name).encode("utf-8", "surrogateescape")) + longest_suffix <= NAME_MAX


def display_name(name: str, suffix: str = "") -> str:
    """The file name shown for link ``name`` with a generated ``suffix``.

    ``suffix`` is ``""`` for the object itself, or ``.json``/``.npy``/... for
    the generated siblings. A result longer than 255 bytes is cut to 240 bytes
    (on a character boundary) followed by ``~`` and 14 hex digits of the
    SHA-1 of the raw name plus suffix.
    """
    shown = escape(name) + suffix
    encoded = shown.encode("utf-8", "surrogateescape")
    if len(encoded) <= NAME_MAX:
        return shown
    digest = hashlib.sha1((name + suffix).encode("utf-8", "surrogateescape")).hexdigest()
    head = encoded[:_CUT].decode("utf-8", "ignore")
    return f"{head}~{digest[:_HASH_CHARS]}"


def to_bytes(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def from_bytes(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")
