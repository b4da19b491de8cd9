"""Retrying remote storage calls within a time budget, and what is worth retrying.

Owns the retry rule shared by every remote store (S3 and plain HTTP):

- One store operation (a GET, a HEAD, one listing page) gets ``timeout``
  seconds in all, retries included, enforced by one trio deadline around the
  whole loop. A read therefore never hangs: when the budget runs out, the
  attempt in flight is cancelled and ``StorageError(key, "... after N attempts
  in X s: last error")`` is raised, which the FUSE layer turns into EIO.
- Between attempts it sleeps with full jitter: a uniform random time in
  ``[0, min(max_delay, base_delay * 2**(n-1))]`` (0.1 s doubling, capped at
  5 s). It gives up at once rather than sleep past the deadline.
- Stalls are the backend's to detect, with ``RetryPolicy.stall`` as the
  longest silence: ``min(timeout / 3, 10 s)``. The HTTP client's connect,
  read and write timeouts are set to it, so a server that stops sending
  fails that attempt (a ``Transient``) while leaving time for two more.
  A server that trickles bytes is bounded by the overall deadline only.

Classification is split in two. A backend's attempt function raises
``Transient(reason)`` for failures that may pass (throttling, 5xx, resets,
timeouts, truncated bodies) and the permanent ``NotFound`` / ``Changed`` /
``StorageError`` for the rest (404, 412, 403, 400), which pass straight
through. ``transient_status`` and ``transient_error`` hold the HTTP-level
part of that decision, free of any S3 detail, for every backend to share.

Concurrency: ``retrying`` keeps its state in locals, so any number of tasks
may call it at once. Cancellation from outside (an unmount) is never caught.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx
import trio

from mountd.errors import StorageError
from mountd.io.meter import StoreMeter, measured

log = logging.getLogger(__name__)

T = TypeVar("T")

#: HTTP statuses that mean "try again": timeout, throttled, server-side failures.
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})

#: Longest silence allowed within one attempt, whatever the budget.
MAX_STALL = 10.0


class Transient(Exception):
    """One attempt failed in a way another attempt may not; never escapes ``retrying``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Total budget per operation and the backoff between attempts, in seconds."""

    timeout: float = 30.0
    base_delay: float = 0.1
    max_delay: float = 5.0

    @property
    def stall(self) -> float:
        """Longest wait for a connection or for the next bytes within one attempt."""
        return min(self.timeout / 3, MAX_STALL)

    def backoff(self, failures: int) -> float:
        """Seconds to sleep after the ``failures``-th failed attempt (full jitter)."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** min(failures - 1, 32))
        return random.uniform(0.0, ceiling)


def transient_status(status: int) -> bool:
    """True if an HTTP response with ``status`` is worth retrying."""
    return status in TRANSIENT_STATUS


def transient_error(exc: BaseException) -> str | None:
    """Why ``exc``, raised by httpx, ``mountd.io.h1`` or a socket, is worth retrying;
    None if it is not."""
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, TimeoutError):
        return f"timed out ({exc})"
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError | ConnectionError):
        return f"connection failed ({type(exc).__name__}: {exc})"
    return None


async def retrying(key: str, policy: RetryPolicy, attempt: Callable[[], Awaitable[T]],
                   meter: StoreMeter) -> T:
    """``await attempt()`` until it returns, retrying ``Transient`` within the budget.

    Anything but ``Transient`` propagates from the first attempt that raises it.
    The operation is counted in ``meter`` (``measured``), its retries too.
    """
    return await measured(meter, _retry(key, policy, attempt, meter))


async def _retry(key: str, policy: RetryPolicy, attempt: Callable[[], Awaitable[T]],
                 meter: StoreMeter) -> T:
    start = trio.current_time()
    deadline = start + policy.timeout
    attempts = 0
    last = "no answer in time"
    with trio.move_on_at(deadline):
        while True:
            attempts += 1
            try:
                return await attempt()
            except Transient as exc:
                last = exc.reason
            delay = policy.backoff(attempts)
            if trio.current_time() + delay >= deadline:
                break
            log.debug("%s: attempt %d failed (%s); retrying in %.2f s",
                      key, attempts, last, delay)
            meter.retries += 1
            await trio.sleep(delay)
        elapsed = trio.current_time() - start
        raise StorageError(key, f"failed after {attempts} attempts in {elapsed:.1f} s: {last}")
    elapsed = trio.current_time() - start
    raise StorageError(key, f"timed out after {attempts} attempts in {elapsed:.1f} s "
                            f"(timeout={policy.timeout:g}); last error: {last}")
