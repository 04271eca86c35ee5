"""Acknowledgements as runs: a bookie's answers out of order move the LAC only over
entries acknowledged by Qa bookies (watermarks and the answers waiting ahead of them);
``LedgerHandle.add_entries`` and its asyncio twin: many entries in one call, one
completion per call with the range of ids; a bad buffer refuses the whole call before
anything is sent; a failure part-way tells which of the call's entries were
acknowledged, and that matches what the ledger closed at; the log writer sends the
batches ready together in one call.  Over bookies called in-process and served over
ZeroMQ on loopback."""

from __future__ import annotations

import dataclasses
import time

import pytest
from clientutil import FAST, clusters

from pybk.aio import AsyncBookKeeper
from pybk.client.ledger import LedgerHandle
from pybk.errors import EntryTooLarge, LedgerClosed, LedgerFenced, LogFenced
from pybk.log import LogWriter, Position
from pybk.settings import LogSettings
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(120)
PASSWORD = b"secret"


@pytest.fixture(params=("inprocess", "zmq"))
def cluster(tmp_path, request):
    with clusters(tmp_path, request.param) as make:
        yield make(4)


def payload(i: int) -> bytes:
    return b"entry-%d-" % i * 8


@pytest.mark.parametrize("ensemble", [3, 4])  # Qw = E, and striping (E4/Qw3)
def test_answers_out_of_order_confirm_only_runs_every_bookie_acknowledged(cluster,
                                                                          ensemble):
    """Qa = Qw = 3: the answers of entries 1 and 2 from a bookie storing 1..3 are held,
    then given 2 first: the bookie's later answers wait ahead of its watermark, and the
    LAC moves past 0 only once 1 comes."""
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=60.0))
    lh = bk.create_ledger(ensemble, 3, 3, password=PASSWORD)
    metadata = lh.metadata
    slow = next(b for b in metadata.write_set(1)
                if all(b in metadata.write_set(e) for e in (1, 2, 3)))
    faults = cluster.faults[slow]
    faults.hold.add("add")
    faults.only_entries = {1, 2}
    order: list[int] = []
    futures = [lh.add_entry_async(payload(i)) for i in range(8)]
    for future in futures:
        future.add_done_callback(lambda f: order.append(f.result()))
    faults.wait_held(2)
    assert futures[0].result(timeout=30) == 0
    faults.release(entries={2})
    assert lh.last_add_confirmed == 0 and not futures[1].done()
    faults.release(entries={1})
    assert [f.result(timeout=30) for f in futures] == list(range(8))
    assert order == list(range(8)) and lh.last_add_confirmed == 7
    lh.close()


@pytest.mark.parametrize("write_quorum", [3, 2])  # every bookie, and striping
def test_calls_complete_with_their_ranges_in_order_with_single_adds(cluster, write_quorum):
    bk = cluster.client()
    lh = bk.create_ledger(3, write_quorum, 2, password=PASSWORD)
    order: list[object] = []
    calls = []
    for call in range(20):
        first = call * 6
        if call % 2:
            futures = [lh.add_entry_async(payload(first + i)) for i in range(6)]
        else:
            futures = [lh.add_entries_async([payload(first + i) for i in range(6)])]
        for future in futures:
            future.add_done_callback(lambda f: order.append(f.result()))
        calls.append(futures)
    results = [[f.result(timeout=30) for f in futures] for futures in calls]
    for call, result in enumerate(results):
        first = call * 6
        assert result == (list(range(first, first + 6)) if call % 2
                          else [(first, first + 5)])
    assert order == [r for result in results for r in result]  # completions in id order
    assert lh.add_entries([payload(120)]) == (120, 120)
    assert lh.last_add_confirmed == 120
    assert lh.length == sum(len(payload(i)) for i in range(121))
    assert [e.data for e in lh.read_entries(0, 120)] == [payload(i) for i in range(121)]
    for entry_id in (0, 7, 120):
        assert sorted(cluster.holders(lh.id, entry_id)) == sorted(
            lh.metadata.write_set(entry_id))
    lh.close()


def test_one_bad_buffer_refuses_the_whole_call_before_any_is_sent(cluster):
    bk = cluster.client(dataclasses.replace(FAST, throttle=8))
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    too_large = b"x" * bk.settings.maxEntrySizeBytes
    for bad, error in (([payload(0), "text", payload(2)], TypeError),
                       ([payload(0), too_large], EntryTooLarge),
                       ([], ValueError),
                       ([payload(i) for i in range(9)], ValueError)):  # over the throttle
        with pytest.raises(error):
            lh.add_entries(bad)
        assert lh.pending_adds == 0 and lh.last_add_confirmed == -1
    assert all(not cluster.holds_ledger(b, lh.id) for b in lh.metadata.fragments[0].ensemble)
    # The throttle's permits: a call of 8 takes all of them, and gives them back.
    for _ in range(3):
        first, last = lh.add_entries([payload(i) for i in range(8)])
        assert last - first == 7
    assert lh.add_entry(payload(24)) == 24
    assert [e.data for e in lh.read_entries(0, 7)] == [payload(i) for i in range(8)]


def test_a_failure_part_way_tells_what_was_acknowledged(cluster):
    """Entries 0..9 in one call; the replies of 6..9 are held on every bookie and then
    fail as fenced: the call's future fails, telling 0..5 acknowledged, which is where
    the ledger closed (and recovery by another client agrees)."""
    bk = cluster.client()
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    ensemble = lh.metadata.fragments[0].ensemble
    for bookie_id in ensemble:
        faults = cluster.faults[bookie_id]
        faults.hold.add("add")
        faults.only_entries = set(range(6, 10))
    future = lh.add_entries_async([payload(i) for i in range(10)])
    for bookie_id in ensemble:
        cluster.faults[bookie_id].wait_held(4)
    deadline = time.monotonic() + WAIT_S
    while lh.last_add_confirmed < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lh.last_add_confirmed == 5 and not future.done()
    for bookie_id in ensemble:
        cluster.faults[bookie_id].release(LedgerFenced("fenced by the test"))
    with pytest.raises(LedgerFenced) as failed:
        future.result(timeout=30)
    assert failed.value.acknowledged == range(0, 6)
    assert lh.last_add_confirmed == 5
    with pytest.raises((LedgerFenced, LedgerClosed)):
        lh.add_entries([payload(10)])
    for bookie_id in ensemble:
        cluster.faults[bookie_id].only_entries = None
        cluster.faults[bookie_id].hold.clear()
    recovered = cluster.client().open_ledger(lh.id, password=PASSWORD)
    assert recovered.last_add_confirmed >= 5  # 6..9 are on the bookies: recovery may keep them
    assert [e.data for e in recovered.read_entries(0, 5)] == [payload(i) for i in range(6)]


@pytest.mark.asyncio
async def test_the_asyncio_twin_keeps_call_order_and_tells_failures(cluster):
    async with AsyncBookKeeper(cluster.client()) as bk:
        lh = await bk.create_ledger(3, 2, 2)
        single = await lh.submit(payload(0))
        assert await lh.add_entries([payload(i) for i in range(1, 50)]) == (1, 49)
        assert await single == 0
        assert await lh.add_entries([bytearray(payload(50))]) == (50, 50)
        with pytest.raises(TypeError):
            await lh.add_entries([payload(51), 51])
        with pytest.raises(ValueError):
            await lh.add_entries([])
        assert lh.last_add_confirmed == 50
        entries = [e async for e in lh.read_entries(0, 50)]
        assert [e.data for e in entries] == [payload(i) for i in range(51)]
        await lh.close()
        with pytest.raises(LedgerClosed):
            await lh.add_entries([payload(51)])



@pytest.mark.parametrize("fenced", [False, True])
def test_a_log_writer_sends_the_batches_ready_together_in_one_call(cluster, monkeypatch,
                                                                   fenced):
    """Batches of one record each wait while a roll's metadata write is held; once it
    lands they go out to the new segment in one add_entries call.  ``fenced``: the
    call's entries 1 and 2 fail (a recoverer fenced them), so the batch acknowledged
    before them succeeds and the others fail, as if sent one by one."""
    calls: list[int] = []
    add_entries_then = LedgerHandle.add_entries_then

    def counted(self, buffers, done):
        calls.append(len(buffers))
        return add_entries_then(self, buffers, done)
    monkeypatch.setattr(LedgerHandle, "add_entries_then", counted)
    bk = cluster.client(dataclasses.replace(FAST, addEntryTimeout=60.0))
    settings = LogSettings(ensembleSize=3, writeQuorumSize=3, ackQuorumSize=2,
                           batchMaxBytes=1024, maxOutstandingBatches=1,
                           segmentMaxAgeSeconds=0.2)
    records = [b"%03d" % i + bytes(600) for i in range(5)]
    with LogWriter.open(bk, "grouped", settings) as writer:
        assert writer.append(records[0]) == Position(0, 0, 0)
        cluster.metadata_faults.hold_writes = True
        time.sleep(0.3)  # the segment is due to roll by age at the next append
        futures = [writer.append_async(record) for record in records[1:]]
        cluster.metadata_faults.wait_held(1)  # the roll waits: the batches queue
        if fenced:
            for faults in cluster.faults.values():
                faults.hold.add("add")
                faults.only_entries = {1, 2}
        cluster.metadata_faults.release_all()
        if not fenced:
            assert [f.result(timeout=30) for f in futures] == [
                Position(1, entry, 0) for entry in range(4)]
            assert calls[0] == 3
            return
        # Entries 1 and 2 held on the segment's three bookies, entry 0 acknowledged.
        deadline = time.monotonic() + WAIT_S
        while (sum(len(f.held()) for f in cluster.faults.values()) < 6
               or bk.pending_adds() > 2) and time.monotonic() < deadline:
            time.sleep(0.01)
        for faults in cluster.faults.values():
            faults.release(LedgerFenced("fenced by the test"))
        assert futures[0].result(timeout=30) == Position(1, 0, 0)
        for future in futures[1:]:
            with pytest.raises(LogFenced):
                future.result(timeout=30)
        assert calls == [3]
