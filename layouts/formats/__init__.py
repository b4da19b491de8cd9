"""The storage formats a source may hold, in one registry: ``FORMATS``.

Owns the list and its ``Format`` entries; what a format means, and how it is
recognised and opened, is its own module's (``probe`` and ``open``).
``mountd.sources`` turns SOURCE into a ``layouts.places.Place`` and walks
``FORMATS`` in order: the first format that takes the place's kind and whose
``probe`` says yes opens it. The list runs from the most particular format to
the most general, and a place that no format claims is refused with the
``refusal`` of the last format that takes its kind. Adding a format is one
module and one entry here; ``mountd`` does not change.

Concurrency: the registry is immutable; ``probe`` and ``open`` are awaited by
the one task that opens the source, before the mount is served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from layouts.formats import hsds, refs
from layouts.model import Catalog
from layouts.places import Host, Place, PlaceKind


@dataclass(frozen=True, slots=True)
class Format:
    """One storage format: the places it may be in, and how it is found and opened."""

    #: What the format is called in logs and messages.
    name: str
    #: The kinds of place it may be in.
    kinds: frozenset[PlaceKind]
    #: True if the place holds this format (storage errors propagate).
    probe: Callable[[Place], Awaitable[bool]]
    #: The catalog over the place; ``SourceError`` with one line if it cannot be mounted.
    open: Callable[[Place, Host], Awaitable[Catalog]]
    #: Why a place of its kinds that no format claims is refused.
    refusal: str


FORMATS: tuple[Format, ...] = (
    Format("reference file", frozenset({PlaceKind.FILE, PlaceKind.DIRECTORY}),
           refs.probe_place, refs.open_place,
           refusal="not a LINDI or kerchunk reference file"),
    Format("HSDS bucket", frozenset({PlaceKind.DIRECTORY, PlaceKind.BUCKET}),
           hsds.probe_place, hsds.open_place,
           refusal="not an HSDS bucket (no db/ and no domain folders)"),
    Format("HSDS service", frozenset({PlaceKind.SERVICE}),
           hsds.service.probe_place, hsds.service.open_place,
           refusal="not an HSDS service endpoint"),
)
