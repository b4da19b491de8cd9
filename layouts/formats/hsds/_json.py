"""Parsing JSON read from storage (HSDS object JSON, ``.domain.json``).

Owns ``loads``: orjson where it can, the standard library for what orjson
refuses but storage holds. What parsed JSON may hold before it is kept is
``layouts.bounds``'s (``check_json``). Pure function; safe anywhere.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(raw: bytes | str) -> Any:
    """Parse JSON from storage: orjson, or ``json`` for what orjson refuses
    (``NaN``/``Infinity`` literals, integers past 64 bits, lone surrogates).

    Raises ``ValueError`` (``UnicodeDecodeError`` included) if it is not JSON.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
