"""A byte-rate limit: how a replication worker keeps to ``replicationRateByBytes``.

:class:`ByteRate` lets a caller take ``n`` bytes at a time.  It runs a budget that grows
by ``rate`` bytes per second, up to one second's worth (so an idle worker may start with
a burst of at most ``rate`` bytes); taking more than the budget holds waits until the
debt is paid.  A single take larger than ``rate`` is allowed (an entry is never split)
and paid for by the wait after it, so that over any long run the rate holds.
"""

from __future__ import annotations

import threading
import time


class ByteRate:
    """At most ``bytes_per_s`` bytes a second (None or -1: no limit).  ``stop`` ends
    every wait at once when set.  For one thread."""

    def __init__(self, bytes_per_s: int | None, stop: threading.Event) -> None:
        self._rate = bytes_per_s if bytes_per_s is not None and bytes_per_s > 0 else None
        self._stop = stop
        self._budget = float(self._rate or 0)
        self._at = time.monotonic()

    def take(self, count: int) -> None:
        """Wait until ``count`` more bytes keep to the rate (or ``stop`` is set)."""
        if self._rate is None:
            return
        now = time.monotonic()
        self._budget = min(float(self._rate), self._budget + (now - self._at) * self._rate)
        self._at = now
        self._budget -= count
        if self._budget < 0:
            self._stop.wait(-self._budget / self._rate)
