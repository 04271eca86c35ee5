"""A bookie's Prometheus metrics, and the HTTP endpoint that serves them.

Everything is read when Prometheus scrapes: :class:`BookieCollector` turns the plain
figures the bookie's parts keep (:mod:`pybk.stats`) and what the bookie holds
(:meth:`pybk.storage.Bookie.gauges`) into metric families, so the data path pays for no
metrics object, lock or label lookup.  Names are BookKeeper's where it has one (its
Prometheus provider's: scope, then the stat's name), so that dashboards made for
BookKeeper find them; latencies are histograms in milliseconds with a ``success`` label,
as BookKeeper's OpStatsLogger reports them (BookKeeper writes quantiles, pybk buckets:
``histogram_quantile`` gives the quantiles).  Counters carry the ``_total`` suffix that
Prometheus' text format gives every counter.  pybk's own figures are named ``pybk_...``.

Bookie (``bookie_*``, BookKeeper's scope ``bookie``)
    Adds and reads (:class:`pybk.stats.BookieStats`): ``bookie_BOOKIE_ADD_ENTRY`` and
    ``..._RECOVERY_ADD_ENTRY`` (checking, caching and queueing adds for the journal; one
    observation per call, weighted by its entries), ``..._ADD_ENTRY_BYTES`` (entry sizes),
    ``bookie_BOOKIE_READ_ENTRY`` and ``..._READ_ENTRY_BYTES`` (one read in
    :data:`pybk.stats.READ_SAMPLE` timed, counted that many times),
    ``bookie_BOOKIE_FORCE_LEDGER_total``, ``bookie_WRITE_BYTES_total``,
    ``bookie_READ_BYTES_total``, ``bookie_write_cache_hits_total`` and ``..._misses_total``
    (reads), ``bookie_write_cache_size`` (bytes) and ``bookie_write_cache_count``
    (entries).  ``bookie_SERVER_STATUS`` (1 writable, 0 read-only); ``bookie_JOURNAL_DIRS``
    and ``bookie_JOURNAL_QUEUE_MAX_SIZE``.  The journal (:class:`pybk.stats.JournalStats`,
    per group, latencies weighted by its records): ``bookie_journal_JOURNAL_ADD_ENTRY``
    (from a record's group being first queued to the group durable, per record),
    ``..._QUEUE_LATENCY`` (to the group being taken, per record), ``..._FLUSH_LATENCY``
    (the group's write), ``..._PROCESS_TIME_LATENCY`` (from the group taken to its
    callbacks run), ``..._SYNC`` (each fdatasync), ``..._QUEUE_SIZE``,
    ``..._FORCE_WRITE_BATCH_ENTRIES`` and ``..._BATCH_BYTES`` (per group commit),
    ``..._WRITE_BYTES_total``.  ``bookie_flush`` and ``bookie_flush_size`` (each
    checkpoint's latency and bytes); ``bookie_ledgers_count``;
    ``bookie_gc_MINOR_COMPACTION_COUNT_total``, ``bookie_gc_MAJOR_COMPACTION_COUNT_total``,
    ``bookie_gc_RECLAIMED_DELETION_SPACE_BYTES_total``,
    ``bookie_gc_RECLAIMED_COMPACTION_SPACE_BYTES_total``; pybk's ``pybk_bookie_gc_runs_total``,
    ``pybk_bookie_entry_logs``, ``pybk_bookie_entry_log_bytes``, ``pybk_bookie_index_bytes``.
Server (``bookkeeper_server_*``)
    ``bookkeeper_server_ADD_ENTRY_REQUEST`` (per entry, from the request being read to its
    reply), ``bookkeeper_server_READ_ENTRY_REQUEST`` (READ and READ_BATCH requests, not
    fencing reads); ``..._READ_LAC_REQUEST``, ``..._WRITE_LAC_REQUEST``,
    ``..._FORCE_LEDGER_REQUEST``, ``..._READ_ENTRY_FENCE_REQUEST``,
    ``..._READ_ENTRY_LONG_POLL_REQUEST``, ``..._GET_BOOKIE_INFO_REQUEST`` (from the
    request being read to its reply); ``..._ADD_ENTRY_IN_PROGRESS`` and
    ``..._READ_ENTRY_IN_PROGRESS``;
    pybk's ``pybk_server_messages_received_total``,
    ``pybk_server_bytes_received_total``, ``pybk_server_messages_sent_total``,
    ``pybk_server_bytes_sent_total`` (ZeroMQ messages and bytes) and
    ``pybk_server_backpressure_pauses_total`` (times the server stopped reading requests at
    its in-progress limits or with replies ZeroMQ could not take).
Autorecovery (pybk's)
    ``pybk_auditor_elected`` (1 in the process that audits now) and, from that process,
    the backlog it last measured: ``pybk_auditor_underreplicated_ledgers``,
    ``pybk_auditor_underreplicated_entries``, ``pybk_auditor_fewest_replicas`` (the
    fewest live copies of any entry; absent when no entry is short).

Serving: :class:`MetricsServer` answers ``GET /metrics`` on one thread
(``pybk-metrics-http``), one request at a time, each bounded by a socket timeout.
:func:`render` gives the page for another server to mount (an admin HTTP server serves
``/metrics`` on its own port, as BookKeeper's does when enabled).
"""

from __future__ import annotations

import http.server
import logging
import threading
from typing import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from pybk.autorecovery.service import AutoRecovery
from pybk.errors import BookKeeperError
from pybk.net.server import BookieServer
from pybk.promstats import histogram_family, op_histogram_family
from pybk.stats import READ_SAMPLE
from pybk.storage import Bookie

log = logging.getLogger(__name__)

#: Seconds a scrape's connection may stay silent before the server drops it (one
#: request at a time: a stalled client must not hold the endpoint).
REQUEST_TIMEOUT_S = 5.0


class BookieCollector:
    """Collects a bookie's metrics (and its server's and autorecovery's, if given) when
    scraped.  Register it on a ``CollectorRegistry``."""

    def __init__(self, bookie: Bookie, server: BookieServer | None = None,
                 autorecovery: AutoRecovery | None = None) -> None:
        self._bookie = bookie
        self._server = server
        self._autorecovery = autorecovery

    def collect(self) -> Iterator[Metric]:
        yield from self._bookie_metrics()
        if self._server is not None:
            yield from self._server_metrics()
        if self._autorecovery is not None:
            yield from self._autorecovery_metrics()

    def _bookie_metrics(self) -> Iterator[Metric]:
        journal, storage = self._bookie.journal_stats, self._bookie.stats
        ops = self._bookie.bookie_stats
        # Latencies in ms (and sizes in bytes) with the label success, per entry or record.
        for name, doc, stats in (
                ("bookie_BOOKIE_ADD_ENTRY",
                 "Latency in ms of checking, caching and queueing adds for the journal, per "
                 "entry (observed once per call, weighted by its entries)", ops.add_entry),
                ("bookie_BOOKIE_RECOVERY_ADD_ENTRY",
                 "bookie_BOOKIE_ADD_ENTRY of recovery adds", ops.recovery_add_entry),
                ("bookie_BOOKIE_ADD_ENTRY_BYTES",
                 "Entry sizes of adds (each call's mean size, weighted by its entries)",
                 ops.add_entry_bytes),
                ("bookie_BOOKIE_READ_ENTRY",
                 f"Read latency in ms, per entry: one read in {READ_SAMPLE} is timed and "
                 f"counted {READ_SAMPLE} times", ops.read_entry),
                ("bookie_BOOKIE_READ_ENTRY_BYTES",
                 "Entry sizes of reads, sampled as bookie_BOOKIE_READ_ENTRY",
                 ops.read_entry_bytes),
                ("bookie_journal_JOURNAL_ADD_ENTRY", "Journal add latency in ms, per record",
                 journal.add_entry),
                ("bookie_journal_JOURNAL_QUEUE_LATENCY",
                 "Latency in ms from a journal group's first record being queued to the "
                 "group being taken, per record", journal.queue),
                ("bookie_journal_JOURNAL_FLUSH_LATENCY",
                 "Latency in ms of writing a journal group (before its fdatasync)",
                 journal.flush),
                ("bookie_journal_JOURNAL_PROCESS_TIME_LATENCY",
                 "Latency in ms from a journal group being taken to its callbacks having run "
                 "(write, fdatasync, completions)", journal.process),
                ("bookie_journal_JOURNAL_SYNC", "Journal fdatasync latency in ms",
                 journal.sync)):
            yield op_histogram_family(name, doc, stats)
        for name, doc, value in (
                ("bookie_WRITE_BYTES", "Bytes of entries added", ops.write_bytes),
                ("bookie_READ_BYTES", "Bytes of entries read", ops.read_bytes),
                ("bookie_BOOKIE_FORCE_LEDGER", "Forces of a ledger's adds", ops.force_ledger),
                ("bookie_write_cache_hits", "Reads served from the write cache",
                 ops.write_cache_hits),
                ("bookie_write_cache_misses", "Reads the write cache did not hold",
                 ops.write_cache_misses)):
            yield CounterMetricFamily(name, doc, value)
        yield histogram_family("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
                               "Records per journal group commit", journal.group_records)
        yield histogram_family("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES",
                               "Bytes per journal group commit", journal.group_bytes)
        yield CounterMetricFamily("bookie_journal_JOURNAL_WRITE_BYTES",
                                  "Bytes written to the journal", journal.bytes_written)
        yield histogram_family("bookie_flush", "Checkpoint (write cache flush) latency in ms",
                               storage.flush)
        yield histogram_family("bookie_flush_size", "Bytes of entries each checkpoint wrote",
                               storage.flush_bytes)
        for name, doc, value in (
                ("pybk_bookie_gc_runs", "Garbage collection runs", storage.gc_runs),
                ("bookie_gc_MINOR_COMPACTION_COUNT", "Minor compactions",
                 storage.minor_compactions),
                ("bookie_gc_MAJOR_COMPACTION_COUNT", "Major compactions",
                 storage.major_compactions),
                ("bookie_gc_RECLAIMED_DELETION_SPACE_BYTES",
                 "Entry-log bytes freed by deleting logs of deleted ledgers",
                 storage.reclaimed_deletion_bytes),
                ("bookie_gc_RECLAIMED_COMPACTION_SPACE_BYTES",
                 "Entry-log bytes freed by compaction", storage.reclaimed_compaction_bytes)):
            yield CounterMetricFamily(name, doc, value)
        try:
            gauges = self._bookie.gauges()
        except Exception as e:  # closing meanwhile: its index may be gone under the read
            log.debug("bookie gauges not read: %s", e)
            gauges = None
        if gauges is None:
            return
        for name, doc, value in (
                ("bookie_SERVER_STATUS", "1 if the bookie takes adds, 0 if read-only",
                 0 if gauges.read_only else 1),
                ("bookie_JOURNAL_DIRS", "Journal directories", 1),
                ("bookie_JOURNAL_QUEUE_MAX_SIZE",
                 "Records that may wait for the journal (journalQueueSize)",
                 self._bookie.settings.journalQueueSize),
                ("bookie_journal_JOURNAL_QUEUE_SIZE", "Records waiting for the journal",
                 gauges.journal_queue),
                ("bookie_write_cache_size", "Bytes of entries in the write cache",
                 gauges.write_cache_bytes),
                ("bookie_write_cache_count", "Entries in the write cache",
                 gauges.write_cache_entries),
                ("bookie_ledgers_count", "Ledgers in the index", gauges.ledgers),
                ("pybk_bookie_entry_logs", "Entry log files", gauges.entry_logs),
                ("pybk_bookie_entry_log_bytes", "Bytes of entry log files",
                 gauges.entry_log_bytes),
                ("pybk_bookie_index_bytes", "Bytes of the index's pages",
                 gauges.index_bytes)):
            yield GaugeMetricFamily(name, doc, value=value)

    def _server_metrics(self) -> Iterator[Metric]:
        server = self._server
        assert server is not None
        stats = server.stats
        yield op_histogram_family("bookkeeper_server_ADD_ENTRY_REQUEST",
                                  "Add request latency in ms, per entry", stats.add_request)
        yield op_histogram_family("bookkeeper_server_READ_ENTRY_REQUEST",
                                  "Read request latency in ms", stats.read_request)
        for name, timed in stats.requests.items():
            yield op_histogram_family(f"bookkeeper_server_{name}",
                                      "Latency in ms from the request being read to its reply",
                                      timed)
        yield GaugeMetricFamily("bookkeeper_server_ADD_ENTRY_IN_PROGRESS",
                                "Adds and other writes read and not answered yet",
                                value=server.adds_in_progress)
        yield GaugeMetricFamily("bookkeeper_server_READ_ENTRY_IN_PROGRESS",
                                "Fencing reads and long polls read and not answered yet",
                                value=server.reads_in_progress)
        for name, doc, value in (
                ("pybk_server_messages_received", "ZeroMQ messages received",
                 stats.messages_in),
                ("pybk_server_bytes_received", "Bytes of ZeroMQ messages received",
                 stats.bytes_in),
                ("pybk_server_messages_sent", "ZeroMQ messages sent", stats.messages_out),
                ("pybk_server_bytes_sent", "Bytes of ZeroMQ messages sent", stats.bytes_out),
                ("pybk_server_backpressure_pauses",
                 "Times the server stopped reading requests (back-pressure)", stats.paused)):
            yield CounterMetricFamily(name, doc, value)

    def _autorecovery_metrics(self) -> Iterator[Metric]:
        recovery = self._autorecovery
        assert recovery is not None
        yield GaugeMetricFamily("pybk_auditor_elected", "1 if this process is the auditor",
                                value=1 if recovery.is_auditor else 0)
        backlog = recovery.backlog
        if backlog is None:
            return
        yield GaugeMetricFamily("pybk_auditor_underreplicated_ledgers",
                                "Ledgers marked under-replicated", value=backlog.ledgers)
        yield GaugeMetricFamily("pybk_auditor_underreplicated_entries",
                                "Entries lacking a replica", value=backlog.entries)
        if backlog.min_replicas is not None:
            yield GaugeMetricFamily("pybk_auditor_fewest_replicas",
                                    "Fewest live replicas of an entry short of its quorum",
                                    value=backlog.min_replicas)


def bookie_registry(bookie: Bookie, server: BookieServer | None = None,
                    autorecovery: AutoRecovery | None = None) -> CollectorRegistry:
    """A registry with the bookie's metrics and the process's (CPU, memory, open files:
    ``process_*``)."""
    registry = CollectorRegistry()
    registry.register(BookieCollector(bookie, server, autorecovery))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The ``/metrics`` page of ``registry``: its body and content type (Prometheus' text
    format)."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsServer:
    """Serves ``GET /metrics`` of ``registry`` on ``host:port`` (port 0: a free one, see
    :attr:`port`) until :meth:`close`.  Raises BookKeeperError if it cannot bind."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        handler = type("_Handler", (_MetricsHandler,), {"registry": registry})
        try:
            self._httpd = http.server.HTTPServer((host, port), handler)
        except OSError as e:
            raise BookKeeperError(f"cannot serve metrics on {host}:{port}: "
                                  f"{e.strerror or e}") from None
        #: The port it listens on.
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name="pybk-metrics-http", daemon=True)
        self._thread.start()
        log.info("metrics served at http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        """Stop serving (a scrape in progress finishes first) and free the port."""
        self._httpd.shutdown()
        self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _MetricsHandler(http.server.BaseHTTPRequestHandler):
    registry: CollectorRegistry
    timeout = REQUEST_TIMEOUT_S

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.partition("?")[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        body, content_type = render(self.registry)
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("metrics request from %s: " + format, self.client_address[0], *args)
