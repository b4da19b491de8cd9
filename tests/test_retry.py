"""The retry loop on trio's virtual clock: budget, backoff, what passes through."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from mountd.errors import Changed, NotFound, StorageError
from mountd.io.meter import StoreMeter
from mountd.io.retry import RetryPolicy, Transient, retrying, transient_error, transient_status


def run_virtual(main) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class Attempts:
    """Fails with ``errors`` in turn, then returns ``b"ok"``; may sleep per attempt."""

    def __init__(self, *errors: Exception, sleep: float = 0.0) -> None:
        self.errors = list(errors)
        self.sleep = sleep
        self.calls = 0

    async def __call__(self) -> bytes:
        self.calls += 1
        await trio.sleep(self.sleep)
        if self.errors:
            raise self.errors.pop(0)
        return b"ok"


def test_transient_failures_are_retried() -> None:
    async def main() -> None:
        attempts = Attempts(Transient("503"), Transient("reset"))
        meter = StoreMeter()
        assert await retrying("k", RetryPolicy(timeout=30), attempts, meter) == b"ok"
        assert attempts.calls == 3
        assert (meter.requests, meter.retries, meter.failures, meter.bytes) == (1, 2, 0, 2)
        assert meter.latency.count == 1
    run_virtual(main)


@pytest.mark.parametrize("error", [NotFound("k"), Changed("k", "etag"), StorageError("k", "403")])
def test_permanent_errors_pass_at_once(error: Exception) -> None:
    async def main() -> None:
        attempts = Attempts(error)
        meter = StoreMeter()
        with pytest.raises(type(error)):
            await retrying("k", RetryPolicy(), attempts, meter)
        assert attempts.calls == 1
        missing = isinstance(error, NotFound)
        assert (meter.requests, meter.retries, meter.bytes) == (1, 0, 0)
        assert (meter.not_found, meter.failures) == ((1, 0) if missing else (0, 1))
    run_virtual(main)


def test_budget_bounds_retries() -> None:
    async def main() -> None:
        policy = RetryPolicy(timeout=10)
        attempts = Attempts(*[Transient("HTTP 500") for _ in range(1000)])
        started = trio.current_time()
        with pytest.raises(StorageError) as info:
            await retrying("key", policy, attempts, meter := StoreMeter())
        assert trio.current_time() - started <= policy.timeout
        assert meter.retries == attempts.calls - 1 and meter.failures == 1
        assert info.value.key == "key"
        assert f"after {attempts.calls} attempts" in info.value.reason
        assert "HTTP 500" in info.value.reason
        assert attempts.calls >= 4
    run_virtual(main)


def test_budget_cuts_a_hung_attempt() -> None:
    async def main() -> None:
        attempts = Attempts(sleep=1000)
        started = trio.current_time()
        with pytest.raises(StorageError, match=r"timed out after 1 attempts .*timeout=5"):
            await retrying("k", RetryPolicy(timeout=5), attempts, StoreMeter())
        assert trio.current_time() - started == pytest.approx(5)
    run_virtual(main)


def test_backoff_is_full_jitter_with_a_cap() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=5.0)
    for failures, ceiling in ((1, 0.1), (2, 0.2), (4, 0.8), (10, 5.0), (500, 5.0)):
        delays = [policy.backoff(failures) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2
    assert RetryPolicy(timeout=30).stall == 10
    assert RetryPolicy(timeout=3).stall == 1


def test_classification() -> None:
    assert all(transient_status(s) for s in (500, 502, 503, 504, 429, 408))
    assert not any(transient_status(s) for s in (200, 400, 403, 404, 412, 416))
    request = httpx.Request("GET", "http://127.0.0.1/")
    assert transient_error(httpx.ReadTimeout("slow", request=request))
    assert transient_error(httpx.ConnectError("refused", request=request))
    assert transient_error(httpx.RemoteProtocolError("short body", request=request))
    assert transient_error(ConnectionResetError())
    assert transient_error(TimeoutError("no progress for 10 s")) == (
        "timed out (no progress for 10 s)")
    assert transient_error(ValueError("bug")) is None
    assert transient_error(httpx.UnsupportedProtocol("ftp", request=request)) is None
