"""Prometheus metrics: a real bookie process scraped over HTTP while a real client writes
and reads, the endpoint's life, the Grafana dashboard against a real scrape, and the
client's metrics on a registry of the application's."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request

import pytest
import zkutil
from clientutil import FAST, clusters
from clusterutil import address, bookies, listening_sockets, unused_port  # noqa: F401
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import pybk
from pybk.errors import InvalidConfiguration
from pybk.http.metrics import MetricsServer, render
from pybk.settings import ServerSettings
from pybk.stats import READ_SAMPLE
from pybk.testing.waiting import wait_until

PASSWORD = b"metrics"
ENTRIES = 40
DASHBOARD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "docs", "grafana-pybk.json")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def payload(i: int) -> bytes:
    return b"metrics entry %d " % i * 16


def parse(text: str) -> Samples:
    """Every sample of a /metrics page, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        return parse(reply.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def listening_ports(pid: int) -> set[int]:
    return {port for _host, port in listening_sockets(pid)}


def endpoint_port(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


def test_a_bookie_process_serves_metrics_that_follow_its_work(bookies, address):
    port = unused_port()
    bookie = bookies.start("b1", "--set", f"prometheusStatsHttpPort={port}").wait_serving()
    assert f"pybk bookie: metrics at http://127.0.0.1:{port}/metrics" in bookie.output
    assert listening_ports(bookie.process.pid) == {endpoint_port(bookie.endpoint), port}
    before = scrape(port)
    registry = CollectorRegistry()
    batch = 10  # the last entries are added in one call
    with pybk.connect(address, FAST, zk_settings=zkutil.settings(),
                      metrics_registry=registry) as bk:
        lh = bk.create_ledger(1, 1, 1, password=PASSWORD)
        for i in range(ENTRIES - batch):
            lh.add_entry(payload(i))
        lh.add_entries([payload(i) for i in range(ENTRIES - batch, ENTRIES)])
        assert [e.data for e in lh.read_entries(0, ENTRIES - 1)] == \
            [payload(i) for i in range(ENTRIES)]
        assert lh.read_last_add_confirmed() == ENTRIES - 1
        lh.close()
        entry_bytes = sum(len(payload(i)) for i in range(ENTRIES)) + \
            ENTRIES * lh._digest.overhead
    after = scrape(port)
    client = parse(render(registry)[0].decode())

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # The client counts every entry, the batch's too, and one creation.
    assert value(client, "bookkeeper_client_ADD_ENTRY_count", success="true") == ENTRIES
    assert value(client, "bookkeeper_client_READ_ENTRY_count", success="true") == ENTRIES
    assert value(client, "bookkeeper_client_LEDGER_CREATE_count", success="true") == 1
    # The bookie took every entry (the batch's in one call, weighted), and read each once:
    # its bytes as sent, digest header included.
    assert moved("bookie_BOOKIE_ADD_ENTRY_count", success="true") == ENTRIES
    assert moved("bookie_BOOKIE_ADD_ENTRY_count", success="false") == 0
    assert moved("bookie_BOOKIE_ADD_ENTRY_BYTES_count", success="true") == ENTRIES
    assert moved("bookie_BOOKIE_ADD_ENTRY_BYTES_sum", success="true") == entry_bytes
    assert moved("bookie_WRITE_BYTES_total") == entry_bytes
    assert moved("bookie_READ_BYTES_total") == entry_bytes
    assert moved("bookie_write_cache_hits_total") + \
        moved("bookie_write_cache_misses_total") == ENTRIES
    # One read in READ_SAMPLE is timed and counted READ_SAMPLE times.
    assert ENTRIES <= moved("bookie_BOOKIE_READ_ENTRY_count", success="true") \
        < ENTRIES + READ_SAMPLE
    # Every add the client made was one successful add request, none failed.
    assert moved("bookkeeper_server_ADD_ENTRY_REQUEST_count", success="true") == ENTRIES
    assert moved("bookkeeper_server_ADD_ENTRY_REQUEST_count", success="false") == 0
    assert moved("bookkeeper_server_ADD_ENTRY_REQUEST_sum", success="true") > 0
    assert moved("bookkeeper_server_READ_ENTRY_REQUEST_count", success="true") >= 1
    assert moved("bookkeeper_server_READ_LAC_REQUEST_count", success="true") >= 1
    assert value(client, "bookkeeper_client_READ_LAC_count", success="true") == 1
    # The journal wrote every entry (and the ledger's master key) in synced groups.
    assert moved("bookie_journal_JOURNAL_ADD_ENTRY_count", success="true") >= ENTRIES
    assert moved("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES_sum") >= ENTRIES
    # Per group, weighted by its records: the queue wait per record, the rest per group.
    assert moved("bookie_journal_JOURNAL_QUEUE_LATENCY_count", success="true") == \
        moved("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES_sum")
    groups = moved("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES_count")
    assert moved("bookie_journal_JOURNAL_FLUSH_LATENCY_count", success="true") == groups
    assert moved("bookie_journal_JOURNAL_PROCESS_TIME_LATENCY_count", success="true") == groups
    syncs = moved("bookie_journal_JOURNAL_SYNC_count", success="true")
    assert 1 <= syncs <= moved("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES_count")
    assert moved("bookie_journal_JOURNAL_WRITE_BYTES_total") >= ENTRIES * len(payload(0))
    assert value(after, "bookie_journal_JOURNAL_SYNC_bucket", le="+Inf", success="true") \
        == value(after, "bookie_journal_JOURNAL_SYNC_count", success="true")
    # ZeroMQ traffic: the adds and the reads came in, their answers went out.
    assert moved("pybk_server_messages_received_total") >= ENTRIES - batch + 1
    assert moved("pybk_server_bytes_received_total") >= ENTRIES * len(payload(0))
    assert moved("pybk_server_messages_sent_total") >= ENTRIES - batch + 1
    assert moved("pybk_server_bytes_sent_total") >= ENTRIES * len(payload(0))
    assert value(after, "bookie_SERVER_STATUS") == 1
    assert value(after, "bookie_journal_JOURNAL_QUEUE_SIZE") == 0
    # The checkpoint (every flushInterval) moves the entries into entry logs and index.
    flushed = wait_until(lambda: (s := scrape(port)) and
                         value(s, "bookie_flush_size_sum") >= ENTRIES * len(payload(0))
                         and s, "the entries checkpointed")
    assert value(flushed, "bookie_ledgers_count") == 1
    assert value(flushed, "pybk_bookie_entry_log_bytes") >= ENTRIES * len(payload(0))
    assert value(flushed, "pybk_bookie_index_bytes") > 0
    # The only bookie is the auditor, and publishes an empty backlog.
    audited = wait_until(lambda: (s := scrape(port)) and
                         ("pybk_auditor_underreplicated_ledgers", ()) in s and s,
                         "backlog measured")
    assert value(audited, "pybk_auditor_elected") == 1
    assert value(audited, "pybk_auditor_underreplicated_ledgers") == 0
    assert value(audited, "pybk_auditor_underreplicated_entries") == 0
    # A force of a DEFERRED_SYNC ledger: timed by the client and the server, counted by
    # the bookie.
    with pybk.connect(address, FAST, zk_settings=zkutil.settings(),
                      metrics_registry=registry) as bk:
        lh = bk.create_ledger(1, 1, 1, password=PASSWORD,
                              write_flags={pybk.WriteFlag.DEFERRED_SYNC})
        lh.add_entry(payload(0))
        assert lh.force() == 0
    forced = scrape(port)
    assert value(parse(render(registry)[0].decode()), "bookkeeper_client_FORCE_count",
                 success="true") == 1
    assert value(forced, "bookkeeper_server_FORCE_LEDGER_REQUEST_count", success="true") \
        - value(audited, "bookkeeper_server_FORCE_LEDGER_REQUEST_count", success="true") \
        == value(forced, "bookie_BOOKIE_FORCE_LEDGER_total") \
        - value(audited, "bookie_BOOKIE_FORCE_LEDGER_total") >= 1
    assert bookie.terminate() == 0


def test_without_a_port_a_bookie_serves_no_metrics(bookies):
    bookie = bookies.start("b1").wait_serving()
    assert "metrics at" not in bookie.output
    assert listening_ports(bookie.process.pid) == {endpoint_port(bookie.endpoint)}


def test_a_metrics_port_in_use_stops_the_start_in_one_line(bookies):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bookie = bookies.start("b1", "--set", f"prometheusStatsHttpPort={port}")
        assert bookie.process.wait(60) == 1
    assert f"pybk bookie: cannot serve metrics on 127.0.0.1:{port}: " in bookie.output
    assert "Traceback" not in bookie.output


def test_the_dashboard_queries_only_metrics_a_bookie_serves(bookies, address):
    with open(DASHBOARD, encoding="utf-8") as f:
        dashboard = json.load(f)
    queried = {name for panel in dashboard["panels"] for target in panel.get("targets", ())
               for name in re.findall(r"\b((?:bookie|bookkeeper|pybk|process)_\w+)",
                                      target["expr"])}
    assert len(queried) >= 20
    port = unused_port()
    bookies.start("b1", "--set", f"prometheusStatsHttpPort={port}").wait_serving()
    served = wait_until(lambda: (s := scrape(port)) and
                        ("pybk_auditor_underreplicated_ledgers", ()) in s and s,
                        "backlog measured")
    assert queried <= {name for name, _labels in served}, \
        queried - {name for name, _labels in served}


def test_a_metrics_server_answers_metrics_only_and_frees_its_port(bookie):
    registry = CollectorRegistry()
    registry.register(pybk.http.metrics.BookieCollector(bookie))
    with MetricsServer(registry, "127.0.0.1", 0) as server:
        assert value(scrape(server.port), "bookie_SERVER_STATUS") == 1
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=10)
        assert missing.value.code == 404
        port = server.port
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
    body, content_type = render(registry)
    assert content_type.startswith("text/plain") and b"bookie_SERVER_STATUS 1.0" in body


def test_a_bad_metrics_port_is_refused():
    with pytest.raises(InvalidConfiguration, match="prometheusStatsHttpPort"):
        ServerSettings(prometheusStatsHttpPort=70000)
    assert ServerSettings().prometheusStatsHttpPort == 0


def test_client_metrics_count_adds_reads_pending_adds_and_ensemble_changes(tmp_path):
    registry = CollectorRegistry()
    with clusters(tmp_path) as make:
        cluster = make(4)
        bk = cluster.client(metrics_registry=registry)
        lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
        for i in range(20):
            lh.add_entry(payload(i))
        # Adds held at two bookies of the write sets are pending.
        held = lh.metadata.write_set(20)
        for bookie_id in held:
            cluster.faults[bookie_id].hold.add("add")
        futures = [lh.add_entry_async(payload(20))]
        cluster.faults[held[0]].wait_held(1)
        assert value(parse(render(registry)[0].decode()),
                     "bookkeeper_client_NUM_PENDING_ADD") == 1
        for bookie_id in held:
            cluster.faults[bookie_id].hold.clear()
            cluster.faults[bookie_id].release()
        assert futures[0].result(timeout=30) == 20
        # A failing bookie: its errors are counted, and the ensemble change.
        failing = lh.metadata.fragments[-1].ensemble[1]
        cluster.faults[failing].unreachable = True
        futures = [lh.add_entry_async(payload(i)) for i in range(21, ENTRIES)]
        assert [f.result(timeout=30) for f in futures] == list(range(21, ENTRIES))
        assert len(list(lh.read_entries(0, ENTRIES - 1))) == ENTRIES
        # Recovered under the writer (fenced), then deleted.
        assert bk.open_ledger(lh.id, password=PASSWORD).read_last_add_confirmed() == \
            ENTRIES - 1
        bk.delete_ledger(lh.id)
        samples = parse(render(registry)[0].decode())
    assert value(samples, "bookkeeper_client_ADD_ENTRY_count", success="true") == ENTRIES
    assert value(samples, "bookkeeper_client_ADD_ENTRY_count", success="false") == 0
    assert value(samples, "bookkeeper_client_READ_ENTRY_count", success="true") == ENTRIES
    assert value(samples, "bookkeeper_client_NUM_PENDING_ADD") == 0
    assert value(samples, "bookkeeper_client_NUM_ENSEMBLE_CHANGE_total") == 1
    for operation in ("LEDGER_CREATE", "LEDGER_OPEN", "LEDGER_RECOVER", "LEDGER_DELETE"):
        assert value(samples, f"bookkeeper_client_{operation}_count", success="true") == 1
    assert value(samples, "bookkeeper_client_READ_LAC_count", success="true") >= 1
    for counted in ("READ", "ADD"):
        assert value(samples, f"bookkeeper_client_LEDGER_RECOVER_{counted}_ENTRIES_count",
                     success="true") == 1
    # Recovery read the last confirmed entry, each one it re-wrote (at least those past
    # the last ensemble change's LAC), and one past the end.
    rewritten = value(samples, "bookkeeper_client_LEDGER_RECOVER_ADD_ENTRIES_sum",
                      success="true")
    assert rewritten >= 1
    assert value(samples, "bookkeeper_client_LEDGER_RECOVER_READ_ENTRIES_sum",
                 success="true") == rewritten + 2
    assert value(samples, "pybk_client_bookie_errors_total", bookie=failing) >= 1


def test_a_client_without_a_registry_keeps_no_metrics(tmp_path):
    with clusters(tmp_path) as make:
        bk = make(1).client()
        assert bk.metrics is None
        lh = bk.create_ledger(1, 1, 1, password=PASSWORD)
        assert lh.add_entry(payload(0)) == 0


def test_an_embedded_wal_reports_its_client_and_bookie_until_closed(tmp_path):
    registry = CollectorRegistry()
    with pybk.open(tmp_path / "wal", metrics_registry=registry) as wal:
        for i in range(10):
            wal.append(payload(i))
        samples = parse(render(registry)[0].decode())
        assert value(samples, "bookkeeper_client_ADD_ENTRY_count", success="true") >= 1
        assert value(samples, "bookie_journal_JOURNAL_SYNC_count", success="true") >= 1
        assert value(samples, "bookie_SERVER_STATUS") == 1
    assert b"bookie_journal_JOURNAL_SYNC" not in render(registry)[0]
