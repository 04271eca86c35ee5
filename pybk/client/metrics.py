"""A ledger client's Prometheus metrics, on a registry the application gives.

A :class:`~pybk.client.BookKeeper` made with ``metrics_registry=`` reports, under
BookKeeper's client names (scope ``bookkeeper_client``):

``bookkeeper_client_ADD_ENTRY`` (histogram, ms, label ``success``)
    From an add's call to its acknowledgement (or failure), per entry.
``bookkeeper_client_READ_ENTRY`` (histogram, ms, label ``success``)
    From asking a range read for its next entry to having it, per entry.
``bookkeeper_client_NUM_PENDING_ADD`` (gauge)
    Adds sent and not yet acknowledged, over the client's writable ledgers (read when
    scraped).
``bookkeeper_client_NUM_ENSEMBLE_CHANGE`` (counter)
    Ensemble changes recorded in ledger metadata.
``pybk_client_bookie_errors`` (counter, label ``bookie``)
    Adds a bookie failed or did not answer in time (each starts an ensemble change).

Several clients may share one registry: they share its metrics (the pending adds are
summed over them).  Without a registry a client keeps no metrics, and its add path pays
one attribute test per add.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from pybk.stats import LATENCY_BOUNDS_MS

T = TypeVar("T")
AddDone = Callable[[int | None, BaseException | None], None]

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
        add = Histogram("bookkeeper_client_ADD_ENTRY", "Add latency in ms, per entry",
                        ["success"], registry=registry, buckets=LATENCY_BOUNDS_MS)
        read = Histogram("bookkeeper_client_READ_ENTRY", "Read latency in ms, per entry",
                         ["success"], registry=registry, buckets=LATENCY_BOUNDS_MS)
        # Children resolved once: a labels() lookup per add would cost more than the
        # observation itself.
        self._add_ok, self._add_failed = add.labels("true"), add.labels("false")
        self._read_ok, self._read_failed = read.labels("true"), read.labels("false")
        self.ensemble_changes = Counter("bookkeeper_client_NUM_ENSEMBLE_CHANGE",
                                        "Ensemble changes recorded in ledger metadata",
                                        registry=registry)
        self.bookie_errors = Counter("pybk_client_bookie_errors",
                                     "Adds a bookie failed or did not answer in time",
                                     ["bookie"], registry=registry)
        registry.register(_PendingAdds(self._clients))

    @classmethod
    def on(cls, registry: CollectorRegistry, client: CountedClient) -> "ClientMetrics":
        """The metrics on ``registry``, counting ``client`` in from now on."""
        with _lock:
            metrics = _by_registry.get(registry)
            if metrics is None:
                metrics = _by_registry[registry] = cls(registry)
            metrics._clients.add(client)
        return metrics

    def timed_add(self, done: AddDone) -> AddDone:
        """``done``, observing the add's latency from now when it is called."""
        started = time.monotonic()

        def timed(entry_id: int | None, error: BaseException | None) -> None:
            (self._add_ok if error is None else self._add_failed).observe(
                (time.monotonic() - started) * 1000.0)
            done(entry_id, error)
        return timed

    def timed_reads(self, entries: Iterable[T]) -> Iterator[T]:
        """``entries``, observing how long each took to come."""
        iterator = iter(entries)
        while True:
            started = time.monotonic()
            try:
                entry = next(iterator)
            except StopIteration:
                return
            except BaseException:
                self._read_failed.observe((time.monotonic() - started) * 1000.0)
                raise
            self._read_ok.observe((time.monotonic() - started) * 1000.0)
            yield entry


class _PendingAdds:
    """Collects ``bookkeeper_client_NUM_PENDING_ADD`` when scraped."""

    def __init__(self, clients: "weakref.WeakSet[CountedClient]") -> None:
        self._clients = clients

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pending = sum(client.pending_adds() for client in list(self._clients))
        yield GaugeMetricFamily("bookkeeper_client_NUM_PENDING_ADD",
                                "Adds sent and not yet acknowledged", value=pending)
