"""Test tiers: the real parts a test uses, and the rule that it is marked for them.

Owns the four markers that sort the suite into tiers, and their enforcement:

- ``mount``: a real FUSE mount (the h5mount daemon, or mount(8));
- ``hsds``: a real HSDS service, or a bucket one wrote (the session fixtures);
- ``server``: another real server on loopback (moto's S3, the Range HTTP server);
- ``tools``: programs of the other virtualenvs (lindi in ``.venv-lindi``,
  anndata and legend-pydataobj in ``.venv-conv``);
- ``slow``: seconds of CPU on its own, with no real part (scale, fuzz and
  decode-bomb tests); set by hand, from ``--durations``.

A test with none of them is in the fast tier (``dev/test --fast``: no FUSE,
no servers, no subprocesses of other environments, nothing slow). The rule
for the first four is checked twice, so a test cannot slip into the fast
tier by mistake:

- at collection, a test that asks for a fixture of ``FIXTURE_MARKS`` without
  the fixture's markers stops the run (``check_fixtures``);
- at run time, the helpers that start a real part call ``uses(marker)``,
  which fails the running test if it lacks that marker.

Concurrency: pytest runs one test at a time in a process; ``running`` is set
and cleared around each test by ``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

#: Each marker, and the real part (or the cost) it stands for.
MARKERS = {
    "mount": "a real FUSE mount",
    "hsds": "a real HSDS service or a bucket it wrote",
    "server": "a real loopback server (moto S3, Range HTTP)",
    "tools": "programs of .venv-lindi or .venv-conv",
    "slow": "seconds of CPU on its own (scale, fuzz and decode-bomb tests)",
}

#: The markers a test needs when it asks for each of these fixtures.
FIXTURE_MARKS: dict[str, frozenset[str]] = {
    "hsds_bucket": frozenset({"hsds"}),
    "moto": frozenset({"server"}),
    "s3_bucket": frozenset({"hsds", "server"}),
    "s3_prefixed_bucket": frozenset({"hsds", "server"}),
    "hsds_s3_direct": frozenset({"hsds", "server"}),
    "mnt": frozenset({"hsds", "mount"}),
}

#: The test being run now, if any.
running: pytest.Item | None = None


def missing(item: pytest.Item, needed: Iterable[str]) -> list[str]:
    """The markers of ``needed`` that ``item`` does not carry."""
    return sorted(mark for mark in needed if item.get_closest_marker(mark) is None)


def check_fixtures(items: Iterable[pytest.Item]) -> None:
    """Stop the run if a collected test asks for a fixture without its markers."""
    problems = []
    for item in items:
        names = getattr(item, "fixturenames", ())
        needed = {mark for name in names for mark in FIXTURE_MARKS.get(name, ())}
        lacking = missing(item, needed)
        if lacking:
            problems.append(f"{item.nodeid}: add " + ", ".join(f"@pytest.mark.{m}"
                                                              for m in lacking))
    if problems:
        raise pytest.UsageError("tests use real parts without their markers "
                                "(tests/tiers.py):\n  " + "\n  ".join(problems))


def uses(marker: str) -> None:
    """Say that the running test starts ``marker``'s real part now: it fails at once
    if it is not marked for it (outside a test, e.g. in a benchmark, nothing happens)."""
    item = running
    if item is not None and item.get_closest_marker(marker) is None:
        pytest.fail(f"{item.nodeid} uses {MARKERS[marker]} but is not marked "
                    f"@pytest.mark.{marker} (tests/tiers.py)", pytrace=False)
