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
from typing import Callable, NamedTuple

#: Upper bounds of latency buckets, in milliseconds (from 50 µs, a small fdatasync on a
#: fast disk, to 10 s, a stalled one).
LATENCY_BOUNDS_MS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0,
                     500.0, 1000.0, 2500.0, 10000.0)
#: Upper bounds of count buckets (records in a group commit).
COUNT_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
#: Upper bounds of size buckets, in bytes (a group commit, a checkpoint).
BYTES_BOUNDS = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
                268435456)
#: Upper bounds of entry size buckets, in bytes.
ENTRY_BYTES_BOUNDS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
#: Reads timed by a bookie: one in this many (:class:`BookieStats`).  Timing a read costs
#: about half of a read served from the write cache (0.4 µs of 0.8 µs, measured here).
READ_SAMPLE = 16


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

    def observe_mean(self, total: float, times: int) -> None:
        """Count ``times`` values whose sum is ``total`` as their mean (the sum stays
        exact; the buckets are when the values are equal)."""
        self.counts[bisect_left(self.bounds, total / times)] += times
        self.sum += total

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
    """A journal's figures, updated by the thread committing a group (one at a time).

    Per group, not per record: a latency shared by a group's records is observed once
    with their count as weight, so that counts are per record as BookKeeper's are."""

    __slots__ = ("add_entry", "queue", "flush", "process", "sync", "group_records",
                 "group_bytes", "bytes_written")

    def __init__(self) -> None:
        #: Milliseconds from a group's first record being queued to the group being
        #: durable, counted once per record (an upper bound for the later records).
        self.add_entry = Histogram()
        #: Milliseconds from a group's first record being queued to the group being
        #: taken to be written, once per record (BookKeeper's JOURNAL_QUEUE_LATENCY).
        self.queue = Histogram()
        #: Milliseconds of each group's write, before its fdatasync (JOURNAL_FLUSH_LATENCY).
        self.flush = Histogram()
        #: Milliseconds from a group being taken to its records' callbacks having run,
        #: once per group (JOURNAL_PROCESS_TIME_LATENCY).
        self.process = Histogram()
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


class BookieStats:
    """A bookie's add and read figures (BookKeeper's ``bookie`` scope).

    Adds are counted per call (an ADD message's runs of entries), under the bookie's
    lock; the failures are the adds such a call refused (a single add's refusal is
    raised to its caller, not counted).  Reads are counted per entry by the reading
    thread: a server's, or an in-process client's (whose increments rely on the GIL,
    docs/THREADS.md).  One read in :data:`READ_SAMPLE` is timed and counted that many
    times: the read histogram's count is the reads rounded up to that step, its sum an
    estimate."""

    __slots__ = ("add_entry", "recovery_add_entry", "add_entry_bytes", "read_entry",
                 "read_entry_bytes", "write_bytes", "read_bytes", "force_ledger",
                 "write_cache_hits", "write_cache_misses", "reads_until_timed")

    def __init__(self) -> None:
        #: Milliseconds to check, cache and queue a run of adds for the journal (not its
        #: durability: that is the journal's JOURNAL_ADD_ENTRY), once per entry.
        self.add_entry = OpStats()
        self.recovery_add_entry = OpStats()
        #: Entry sizes of the adds: each run's mean size, weighted by its entries (the
        #: count and sum are exact, the buckets are when a run's entries share a size).
        self.add_entry_bytes = Histogram(ENTRY_BYTES_BOUNDS)
        #: Milliseconds of a read, sampled (see the class doc).
        self.read_entry = OpStats()
        #: Sizes of the sampled reads' entries, weighted as their latencies are.
        self.read_entry_bytes = Histogram(ENTRY_BYTES_BOUNDS)
        #: Bytes of entries added and read (every add and read).
        self.write_bytes = 0
        self.read_bytes = 0
        #: FORCE_LEDGER requests (and other forces of a ledger's deferred adds).
        self.force_ledger = 0
        #: Reads served from the write cache, and reads it did not hold (served from an
        #: entry log).
        self.write_cache_hits = 0
        self.write_cache_misses = 0
        self.reads_until_timed = 0

    def adds_queued(self, started: float, added: int, recovered: int, nbytes: int,
                    failed: int) -> None:
        """A call's adds are queued for the journal: ``added`` and ``recovered`` (recovery
        adds) entries of ``nbytes`` bytes in all, ``failed`` refused; ``started`` is the
        call's ``time.monotonic()``."""
        elapsed_ms = (time.monotonic() - started) * 1000.0
        if added:
            self.add_entry.success.observe(elapsed_ms, added)
        if recovered:
            self.recovery_add_entry.success.observe(elapsed_ms, recovered)
        if failed:
            self.add_entry.failure.observe(elapsed_ms, failed)
        if nbytes:
            self.add_entry_bytes.observe_mean(nbytes, added + recovered)
            self.write_bytes += nbytes

    def timed_read(self, read: Callable[[int, int], bytes], ledger_id: int,
                   entry_id: int) -> bytes:
        """``read(ledger_id, entry_id)``, timed and counted :data:`READ_SAMPLE` times."""
        started = time.monotonic()
        try:
            data = read(ledger_id, entry_id)
        except BaseException:
            self.read_entry.failure.observe_since(started, READ_SAMPLE)
            raise
        self.read_entry.success.observe_since(started, READ_SAMPLE)
        self.read_entry_bytes.observe(len(data), READ_SAMPLE)
        self.read_bytes += len(data)
        return data


class StorageGauges(NamedTuple):
    """What a bookie holds at one moment (:meth:`pybk.storage.Bookie.gauges`)."""

    #: Records waiting for the journal (an ADD message's entries count as one).
    journal_queue: int
    #: Bytes of entries in the write cache, not yet in entry logs, and their count.
    write_cache_bytes: int
    write_cache_entries: int
    entry_logs: int
    entry_log_bytes: int
    index_bytes: int
    #: Ledgers in the index (as of the last checkpoint), deleted ones not counted.
    ledgers: int
    read_only: bool


#: The requests a bookie server times besides adds and plain reads, by BookKeeper's
#: name (scope ``bookkeeper_server``).
SERVER_REQUESTS = ("READ_LAC_REQUEST", "WRITE_LAC_REQUEST", "FORCE_LEDGER_REQUEST",
                   "READ_ENTRY_FENCE_REQUEST", "READ_ENTRY_LONG_POLL_REQUEST",
                   "GET_BOOKIE_INFO_REQUEST")


class ServerStats:
    """A bookie server's figures, updated by its server thread only."""

    __slots__ = ("add_request", "read_request", "requests", "messages_in", "bytes_in",
                 "messages_out", "bytes_out", "paused")

    def __init__(self) -> None:
        #: Milliseconds from an add request being read to its reply, per entry.
        self.add_request = OpStats()
        #: Milliseconds to answer a READ or READ_BATCH request.
        self.read_request = OpStats()
        #: Milliseconds from the other requests being read to their reply, by
        #: BookKeeper's name (:data:`SERVER_REQUESTS`).
        self.requests = {name: OpStats() for name in SERVER_REQUESTS}
        self.messages_in = 0
        self.bytes_in = 0
        self.messages_out = 0
        self.bytes_out = 0
        #: Times the server stopped reading requests at maxAddsInProgressLimit or
        #: maxReadsInProgressLimit, or with replies ZeroMQ could not take (back-pressure).
        self.paused = 0
