"""The HSDS service port of ``layouts/``: REST reads of an HSDS endpoint.

A ``Service`` answers the read requests of the HDF REST API that an HSDS
service node serves, as the user the mount authenticates as; ``mountd.io``
implements it (credentials, retries, the connection pool) and the HSDS
format's service catalog (``layouts.formats.hsds._service``) reads through it.
Paths are the API's (``/``, ``/domains``, ``/groups/ID``, ``/datasets/ID/value``),
and ``params`` its query parameters (``domain`` among them).

Failures: a path or domain that does not exist raises ``NotFound``; one the
user may not read (HTTP 401 or 403) raises ``Forbidden``; anything else that
fails, after the retries the implementation makes, raises ``StorageError``
naming the request. JSON answers are read capped at ``max_metadata`` bytes
(``Corrupt`` beyond), binary ones at the size the caller expects.

Concurrency: implementations hold no per-call state; any number of trio tasks
may call them at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Service(Protocol):
    """Read-only access to an HSDS service's REST API."""

    @property
    def url(self) -> str:
        """The endpoint, for logs and messages."""
        ...

    async def get_json(self, path: str, params: Mapping[str, str],
                       limit: int | None = None) -> bytes:
        """The JSON document ``GET path?params`` answers, unparsed (the format
        parses it: HSDS writes ``NaN`` and integers past 64 bits); ``Corrupt``
        past ``limit`` bytes (None: ``max_metadata``)."""
        ...

    async def get_binary(self, path: str, params: Mapping[str, str], limit: int) -> bytes:
        """The body ``GET path?params`` answers with ``Accept: application/octet-stream``
        (a dataset selection's values); ``Corrupt`` if it holds more than ``limit`` bytes."""
        ...
