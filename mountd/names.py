"""How HDF5 link names become file names (MOUNT-SPEC.md, "Names").

Pure functions, no state. ``display_name`` is injective on link names: ``%``
is escaped first, so an escaped name never equals another link's raw name.
Names over 255 bytes are cut and tagged with a SHA-1 so they stay unique.
The cut backs off to a UTF-8 character boundary so every name stays valid
UTF-8; for ASCII names it is exactly 240 bytes.
"""

from __future__ import annotations

import hashlib

NAME_MAX = 255
_CUT = 240
_HASH_CHARS = 14


def escape(name: str) -> str:
    """Escape ``%``, NUL, and the names ``.`` and ``..``."""
    if name == ".":
        return "%2E"
    if name == "..":
        return "%2E%2E"
    return name.replace("%", "%25").replace("\0", "%00")


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
