"""Catch-up reads (``LedgerHandle.read_entries``, :mod:`pybk.client.reads`): many entries
per request and several requests in flight, with ``read_entry``'s guarantees: digests
verified, failover along the write set on an error, a bad copy or no answer, never past
the last readable entry, entries in order and each once.  Each test runs with bookies
called in-process and with bookie servers on loopback TCP (READ_BATCH messages)."""

from __future__ import annotations

import pytest
from clientutil import TRANSPORTS, Cluster, spy_on

from pybk.client import reads
from pybk.errors import DigestMismatch, NoSuchEntry
from pybk.log import LogReader, LogWriter
from pybk.settings import ClientSettings, LogSettings

pytestmark = pytest.mark.timeout(120)
PASSWORD = b"read-ahead"
SETTINGS = ClientSettings(addEntryTimeout=5.0, readTimeout=1.0)


@pytest.fixture(params=TRANSPORTS)
def cluster_of(tmp_path, request):
    made: list[Cluster] = []

    def make(n: int) -> Cluster:
        cluster = Cluster(str(tmp_path / f"cluster{len(made)}"), n, request.param)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def payload(i: int, size: int = 100) -> bytes:
    return (b"entry %d " % i * (size // 8 + 1))[:size]


def written_ledger(cluster: Cluster, count: int, ensemble: int = 3, write_quorum: int = 2,
                   size: int = 100, close: bool = True):
    """A ledger of ``count`` entries (``payload(i, size)``), written by a client of its own."""
    lh = cluster.client(SETTINGS).create_ledger(ensemble, write_quorum, write_quorum,
                                                password=PASSWORD)
    for future in [lh.add_entry_async(payload(i, size)) for i in range(count)]:
        future.result(timeout=30)
    if close:
        lh.close()
    return lh


def test_a_range_is_read_in_batches_with_several_in_flight(cluster_of):
    cluster = cluster_of(3)
    count = 3000
    lh = written_ledger(cluster, count)
    bk = cluster.client(SETTINGS)
    reader = bk.open_ledger(lh.id, PASSWORD, recovery=False)
    spies, counter = spy_on(bk, cluster)
    entries = list(reader.read_entries(0, count - 1))
    assert [(e.entry_id, e.data) for e in entries] == [(i, payload(i)) for i in range(count)]
    # Each entry asked once, of the first bookie of its write set, in batches.
    asked = {b: spy.asked() for b, spy in spies.items()}
    assert sorted(e for ids in asked.values() for e in ids) == list(range(count))
    for bookie_id, entry_ids in asked.items():
        assert all(lh.metadata.write_set(e)[0] == bookie_id for e in entry_ids)
    assert not any(spy.reads for spy in spies.values()), "entries read one by one"
    requests = sum(len(spy.batches) for spy in spies.values())
    assert requests <= count // 50, f"{requests} requests for {count} entries"
    if cluster.transport != "inprocess":  # in-process batches complete before they return
        assert counter["most"] >= len(spies), "the bookies were not asked at once"


def test_reads_fail_over_to_the_next_bookie_and_avoid_a_failing_one(cluster_of):
    cluster = cluster_of(3)
    count = 600
    lh = written_ledger(cluster, count)
    bk = cluster.client(SETTINGS)
    reader = bk.open_ledger(lh.id, PASSWORD, recovery=False)
    spies, _ = spy_on(bk, cluster)
    failing = lh.metadata.fragments[0].ensemble[0]
    cluster.faults[failing].fail.add("read")
    assert [e.data for e in reader.read_entries(0, count - 1)] == \
        [payload(i) for i in range(count)]
    # Only what was asked before its first failure came back: then it was avoided.
    assert len(spies[failing].asked()) <= reads.READ_AHEAD_FIRST_ENTRIES


def test_reads_fail_over_when_a_bookie_does_not_answer(cluster_of):
    cluster = cluster_of(3)
    count = 300
    lh = written_ledger(cluster, count)
    bk = cluster.client(SETTINGS)
    reader = bk.open_ledger(lh.id, PASSWORD, recovery=False)
    spies, _ = spy_on(bk, cluster)
    silent = lh.metadata.fragments[0].ensemble[1]
    cluster.faults[silent].drop.add("read")
    assert [e.data for e in reader.read_entries(0, count - 1)] == \
        [payload(i) for i in range(count)]
    # One readTimeout: the requests sent before it, then nothing more.
    assert len(spies[silent].asked()) <= reads.READ_AHEAD_FIRST_ENTRIES


def test_a_bad_copy_is_read_from_the_next_bookie_and_no_good_copy_fails_in_place(cluster_of):
    cluster = cluster_of(3)
    count, bad = 200, 120
    lh = written_ledger(cluster, count)
    bk = cluster.client(SETTINGS)
    good = cluster.stored_entry(lh.metadata.write_set(bad)[0], lh.id, bad)
    damaged = good[:-1] + bytes([good[-1] ^ 0xFF])
    key = bk.master_key(PASSWORD)
    cluster.put_entry(lh.metadata.write_set(bad)[0], lh.id, bad, damaged, key)
    reader = bk.open_ledger(lh.id, PASSWORD, recovery=False)
    assert [e.data for e in reader.read_entries(0, count - 1)] == \
        [payload(i) for i in range(count)]
    cluster.put_entry(lh.metadata.write_set(bad)[1], lh.id, bad, damaged, key)
    got = []
    with pytest.raises(DigestMismatch, match=f"entry {bad}"):
        for entry in reader.read_entries(0, count - 1):
            got.append(entry.entry_id)
    assert got == list(range(bad))  # every entry before it, then the error


def test_reads_never_ask_past_the_last_readable_entry(cluster_of):
    cluster = cluster_of(3)
    lh = written_ledger(cluster, 100, close=False)
    lh.add_entry_async(payload(100))  # may be on the bookies, not yet readable
    bk = cluster.client(SETTINGS)
    reader = bk.open_ledger(lh.id, PASSWORD, recovery=False)
    lac = reader.last_add_confirmed
    assert 98 <= lac <= 100
    spies, _ = spy_on(bk, cluster)
    with pytest.raises(NoSuchEntry, match="past the last readable entry"):
        reader.read_entries(0, lac + 1)
    assert [e.entry_id for e in reader.read_entries(lac - 60, lac)] == \
        list(range(lac - 60, lac + 1))
    asked = [e for spy in spies.values() for e in spy.asked()]
    assert min(asked) == lac - 60 and max(asked) == lac


def test_entries_over_the_byte_budget_are_asked_again_in_later_requests(cluster_of):
    cluster = cluster_of(2)
    count, size = 24, 300 * 1024  # three entries are over one request's budget
    lh = written_ledger(cluster, count, ensemble=2, write_quorum=2, size=size)
    bk = cluster.client(SETTINGS)
    reader = bk.open_ledger(lh.id, PASSWORD, recovery=False)
    spies, _ = spy_on(bk, cluster)
    assert [e.data for e in reader.read_entries(0, count - 1)] == \
        [payload(i, size) for i in range(count)]
    for spy in spies.values():
        for _entry_ids, max_bytes, future in spy.batches:
            answers = future.result(timeout=0)
            assert sum(map(len, answers)) <= max_bytes or len(answers) == 1
    requests = sum(len(spy.batches) for spy in spies.values())
    assert requests >= count * size // reads.READ_BATCH_MAX_BYTES


def test_answers_that_come_out_of_order_are_returned_in_order(cluster_of):
    cluster = cluster_of(3)
    count = 90
    lh = written_ledger(cluster, count)
    cluster.faults[lh.metadata.fragments[0].ensemble[0]].delay_s = 0.01
    reader = cluster.client(SETTINGS).open_ledger(lh.id, PASSWORD, recovery=False)
    assert [(e.entry_id, e.data) for e in reader.read_entries(0, count - 1)] == \
        [(i, payload(i)) for i in range(count)]


def test_a_log_reader_reads_ahead_across_segments(cluster_of):
    cluster = cluster_of(3)
    count = 400
    settings = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2,
                           segmentMaxBytes=8 * 1024)
    with LogWriter.open(cluster.client(SETTINGS), "catch-up", settings) as writer:
        positions = [writer.append(payload(i)) for i in range(count)]  # an entry each
    assert len({position.segment for position in positions}) > 2
    bk = cluster.client(SETTINGS)
    spies, _ = spy_on(bk, cluster)
    assert list(LogReader(bk, "catch-up").read()) == \
        [(position, payload(i)) for i, position in enumerate(positions)]
    assert not any(spy.reads for spy in spies.values()), "entries read one by one"
    assert sum(len(spy.batches) for spy in spies.values()) <= count // 4
