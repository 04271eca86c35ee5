"""Plain counters and histograms that pybk's parts update as they work.

These hold no locks and import nothing: the bookie's journal, checkpoint, garbage
collector and server each update their own, on the one thread (or under the one lock)
that already does the work, and :mod:`pybk.http.metrics` reads them when Prometheus scrapes.
A scrape that races an update may see a histogram's sum one observation ahead of its
counts; the next scrape is consistent again, which is all a rate needs.

Latencies are in milliseconds, as BookKeeper's Prometheus provider reports them, so that
dashboards made for BookKeeper read pybk's figures in the same unit.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import NamedTuple

#: Upper bounds of latency buckets, in milliseconds (from 50 µs, a small fdatasync on a
#: fast disk, to 10 s, a stalled one).
LATENCY_BOUNDS_MS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0,
                     500.0, 1000.0, 2500.0, 10000.0)
#: Upper bounds of count buckets (records in a group commit).
COUNT_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
#: Upper bounds of size buckets, in bytes (a group commit, a checkpoint).
BYTES_BOUNDS = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
                268435456)


class Histogram:
    """Observations counted in buckets with fixed upper ``bounds`` (the last bucket,
    past every bound, is +Inf), and their sum.  ``counts[i]`` counts observations
    ``<= bounds[i]`` and above the bound before (not cumulative)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS_MS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Count ``value`` ``times`` times (a group commit's records share its wait)."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def observe_since(self, start: float, times: int = 1) -> None:
        """Count the milliseconds since ``start`` (a ``time.monotonic()``)."""
        self.observe((time.monotonic() - start) * 1000.0, times)

    @property
    def count(self) -> int:
        return sum(self.counts)


class OpStats:
    """Latencies of an operation that succeeds or fails (BookKeeper's OpStatsLogger)."""

    __slots__ = ("success", "failure")

    def __init__(self) -> None:
        self.success = Histogram()
        self.failure = Histogram()

    def observe_since(self, start: float, ok: bool, times: int = 1) -> None:
        (self.success if ok else self.failure).observe_since(start, times)


class JournalStats:
    """A journal's figures, updated by the thread committing a group (one at a time)."""

    __slots__ = ("add_entry", "sync", "group_records", "group_bytes", "bytes_written")

    def __init__(self) -> None:
        #: Milliseconds from a group's first record being queued to the group being
        #: durable, counted once per record (an upper bound for the later records).
        self.add_entry = Histogram()
        #: Milliseconds of each fdatasync.
        self.sync = Histogram()
        #: Records, and bytes, per group commit.
        self.group_records = Histogram(COUNT_BOUNDS)
        self.group_bytes = Histogram(BYTES_BOUNDS)
        self.bytes_written = 0


class StorageStats:
    """A bookie's checkpoint and garbage collection figures."""

    __slots__ = ("flush", "flush_bytes", "gc_runs", "minor_compactions", "major_compactions",
                 "reclaimed_deletion_bytes", "reclaimed_compaction_bytes")

    def __init__(self) -> None:
        #: Milliseconds per checkpoint, and bytes of entries each wrote out.
        self.flush = Histogram()
        self.flush_bytes = Histogram(BYTES_BOUNDS)
        self.gc_runs = 0
        self.minor_compactions = 0
        self.major_compactions = 0
        #: Entry-log bytes freed by deleting logs of deleted ledgers, and by compaction.
        self.reclaimed_deletion_bytes = 0
        self.reclaimed_compaction_bytes = 0


class StorageGauges(NamedTuple):
    """What a bookie holds at one moment (:meth:`pybk.storage.Bookie.gauges`)."""

    #: Records waiting for the journal (an ADD message's entries count as one).
    journal_queue: int
    #: Bytes of entries in the write cache, not yet in entry logs.
    write_cache_bytes: int
    entry_logs: int
    entry_log_bytes: int
    index_bytes: int
    #: Ledgers in the index (as of the last checkpoint), deleted ones not counted.
    ledgers: int
    read_only: bool


class ServerStats:
    """A bookie server's figures, updated by its server thread only."""

    __slots__ = ("add_request", "read_request", "messages_in", "bytes_in", "messages_out",
                 "bytes_out", "paused")

    def __init__(self) -> None:
        #: Milliseconds from an add request being read to its reply, per entry.
        self.add_request = OpStats()
        #: Milliseconds to answer a READ or READ_BATCH request.
        self.read_request = OpStats()
        self.messages_in = 0
        self.bytes_in = 0
        self.messages_out = 0
        self.bytes_out = 0
        #: Times the server stopped reading requests at maxAddsInProgressLimit or
        #: maxReadsInProgressLimit, or with replies ZeroMQ could not take (back-pressure).
        self.paused = 0
