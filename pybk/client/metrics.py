"""A ledger client's Prometheus metrics, on a registry the application gives.

A :class:`~pybk.client.BookKeeper` made with ``metrics_registry=`` reports, under
BookKeeper's client names (scope ``bookkeeper_client``; latencies are histograms in
ms with the label ``success``):

``bookkeeper_client_ADD_ENTRY``
    From an add's call to its acknowledgement (or failure), per entry: an
    ``add_entries`` call is observed once, weighted by its entries (those acknowledged
    before a failure count as successes).
``bookkeeper_client_READ_ENTRY``
    Per entry read: a catch-up read's batch request (:mod:`pybk.client.reads`) is
    observed once, from its sending to its answer being taken in, weighted by the
    entries it brought (those that failed, or all it asked for when the request failed,
    as failures); ``read_entry`` once.
``bookkeeper_client_LEDGER_{CREATE,OPEN,RECOVER,DELETE}``
    Creating a ledger; opening one (recovery included); recovering one (fence, read
    forward, re-write, close); deleting one.
``bookkeeper_client_{FORCE,READ_LAC,READ_LAST_CONFIRMED_AND_ENTRY}``
    A force of a DEFERRED_SYNC ledger; asking the bookies for the LAC
    (``read_last_add_confirmed`` and ``try_read_last_add_confirmed``); the long poll.
``bookkeeper_client_LEDGER_RECOVER_READ_ENTRIES``, ``..._LEDGER_RECOVER_ADD_ENTRIES``
    Per recovery, the entries it read (forward from the LAC, the one past the end
    included) and re-wrote (histograms of counts, label ``success``).
``bookkeeper_client_NUM_PENDING_ADD`` (gauge)
    Adds sent and not yet acknowledged, over the client's writable ledgers (read when
    scraped).
``bookkeeper_client_NUM_ENSEMBLE_CHANGE`` (counter)
    Ensemble changes recorded in ledger metadata.
``pybk_client_bookie_errors`` (counter, label ``bookie``)
    Adds a bookie failed or did not answer in time (each starts an ensemble change).

Several clients may share one registry: they share its metrics (the pending adds are
summed over them).  The latencies are :mod:`pybk.stats` histograms updated without a
lock by the threads that complete the operations (docs/THREADS.md, fields that rely on
the GIL) and turned into metric families when Prometheus scrapes.  Without a registry a
client keeps no metrics, and its add path pays one attribute test per call.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Callable, Iterator, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from pybk.promstats import op_histogram_family
from pybk.stats import COUNT_BOUNDS, Histogram, OpStats

AddDone = Callable[[int | None, BaseException | None], None]

#: The operations timed, by BookKeeper's name, with their help text.
OPERATIONS = {
    "ADD_ENTRY": "Add latency in ms, per entry (a batch observed once, weighted)",
    "READ_ENTRY": "Read latency in ms, per entry (a batch request observed once, weighted)",
    "LEDGER_CREATE": "Ledger creation latency in ms",
    "LEDGER_OPEN": "Ledger open latency in ms (recovery included)",
    "LEDGER_RECOVER": "Ledger recovery latency in ms",
    "LEDGER_DELETE": "Ledger deletion latency in ms",
    "FORCE": "Force (DEFERRED_SYNC) latency in ms",
    "READ_LAC": "LAC read latency in ms",
    "READ_LAST_CONFIRMED_AND_ENTRY": "Long poll (LAC and entry) latency in ms",
}

_lock = threading.Lock()
_by_registry: "weakref.WeakKeyDictionary[CollectorRegistry, ClientMetrics]" = \
    weakref.WeakKeyDictionary()


class CountedClient(Protocol):
    """A client whose pending adds the gauge sums (a :class:`~pybk.client.BookKeeper`)."""

    def pending_adds(self) -> int: ...


class ClientMetrics:
    """The metrics of the clients on one registry (:meth:`on` finds or makes them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._clients: "weakref.WeakSet[CountedClient]" = weakref.WeakSet()
        #: Latencies by BookKeeper's operation name (:data:`OPERATIONS`).
        self.ops = {name: OpStats() for name in OPERATIONS}
        self._add = self.ops["ADD_ENTRY"]
        self._read = self.ops["READ_ENTRY"]
        #: Entries read and re-written by each recovery.
        self.recover_reads = Histogram(COUNT_BOUNDS)
        self.recover_adds = Histogram(COUNT_BOUNDS)
        self.ensemble_changes = Counter("bookkeeper_client_NUM_ENSEMBLE_CHANGE",
                                        "Ensemble changes recorded in ledger metadata",
                                        registry=registry)
        self.bookie_errors = Counter("pybk_client_bookie_errors",
                                     "Adds a bookie failed or did not answer in time",
                                     ["bookie"], registry=registry)
        registry.register(_Collector(self, self._clients))

    @classmethod
    def on(cls, registry: CollectorRegistry, client: CountedClient) -> "ClientMetrics":
        """The metrics on ``registry``, counting ``client`` in from now on."""
        with _lock:
            metrics = _by_registry.get(registry)
            if metrics is None:
                metrics = _by_registry[registry] = cls(registry)
            metrics._clients.add(client)
        return metrics

    def timed_add(self, done: AddDone, count: int = 1) -> AddDone:
        """``done``, observing the latency from now of ``count`` adds when it is called
        (on a failure, those in ``error.acknowledged`` count as successes)."""
        started = time.monotonic()
        stats = self._add

        def timed(entry_id: int | None, error: BaseException | None) -> None:
            elapsed_ms = (time.monotonic() - started) * 1000.0
            if error is None:
                stats.success.observe(elapsed_ms, count)
            else:
                acknowledged = len(getattr(error, "acknowledged", None) or ())
                if acknowledged:
                    stats.success.observe(elapsed_ms, acknowledged)
                stats.failure.observe(elapsed_ms, count - acknowledged)
            done(entry_id, error)
        return timed

    def recovered(self, read: int, added: int) -> None:
        """A recovery read ``read`` entries and re-wrote ``added``."""
        self.recover_reads.observe(read)
        self.recover_adds.observe(added)

    def reads_done(self, sent: float, taken: float, ok: bool, count: int) -> None:
        """A read request sent at ``sent`` was answered (``ok``) or failed by ``taken``
        (``time.monotonic()`` both), for ``count`` entries."""
        (self._read.success if ok else self._read.failure).observe(
            (taken - sent) * 1000.0, count)

    @contextlib.contextmanager
    def timing(self, name: str) -> Iterator[None]:
        """Observe the block's latency as operation ``name`` (failed if it raises)."""
        stats = self.ops[name]
        started = time.monotonic()
        try:
            yield
        except BaseException:
            stats.observe_since(started, False)
            raise
        stats.observe_since(started, True)

    def time_future(self, name: str, future: Future) -> Future:
        """``future``, observing as operation ``name`` the latency from now to its end."""
        stats = self.ops[name]
        started = time.monotonic()
        future.add_done_callback(lambda done: stats.observe_since(
            started, not done.cancelled() and done.exception() is None))
        return future


class _Collector:
    """Collects the latencies and ``bookkeeper_client_NUM_PENDING_ADD`` when scraped."""

    def __init__(self, metrics: ClientMetrics,
                 clients: "weakref.WeakSet[CountedClient]") -> None:
        self._metrics = metrics
        self._clients = clients

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        for name, stats in metrics.ops.items():
            yield op_histogram_family(f"bookkeeper_client_{name}", OPERATIONS[name], stats)
        yield op_histogram_family("bookkeeper_client_LEDGER_RECOVER_READ_ENTRIES",
                                  "Entries each recovery read", metrics.recover_reads)
        yield op_histogram_family("bookkeeper_client_LEDGER_RECOVER_ADD_ENTRIES",
                                  "Entries each recovery re-wrote", metrics.recover_adds)
        pending = sum(client.pending_adds() for client in list(self._clients))
        yield GaugeMetricFamily("bookkeeper_client_NUM_PENDING_ADD",
                                "Adds sent and not yet acknowledged", value=pending)
