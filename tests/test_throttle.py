"""The byte-rate limit of replication workers (:class:`pybk.autorecovery.throttle.ByteRate`):
what it makes its caller wait, read from the waits it asks of its stop event (which
records them instead of sleeping, so nothing here depends on timing)."""

from __future__ import annotations

import threading

import pytest

from pybk.autorecovery.throttle import ByteRate


class RecordedWaits(threading.Event):
    """A stop event that records the waits asked of it and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


def test_a_second_of_bytes_passes_then_each_byte_owes_its_time():
    waits = RecordedWaits()
    rate = ByteRate(1_000, waits)
    rate.take(1_000)              # the first second's budget: no wait
    assert waits.waits == []
    for _ in range(4):
        rate.take(500)            # the waits did not pass: the debt grows
    # Owed: 2,000 bytes at 1,000 B/s (less what the test's own run time earned).
    assert waits.waits[-1] == pytest.approx(2.0, abs=0.05)
    assert waits.waits == sorted(waits.waits)


def test_an_entry_larger_than_a_second_of_bytes_is_taken_whole_and_paid_after():
    waits = RecordedWaits()
    ByteRate(100, waits).take(1_000)
    assert waits.waits == [pytest.approx(9.0, abs=0.05)]


@pytest.mark.parametrize("unlimited", [-1, None])
def test_no_limit_never_waits(unlimited):
    waits = RecordedWaits()
    rate = ByteRate(unlimited, waits)
    for _ in range(100):
        rate.take(10 ** 9)
    assert waits.waits == []
