"""Deferred sync (``WriteFlag.DEFERRED_SYNC`` and ``force``, :mod:`pybk.client.deferred`):
adds acknowledged once written, made durable by a force whose answer is the durable LAC,
the LAC readers see never past it.  The protocol tests run over every transport
(in-process, ZeroMQ, CURVE, bookie processes); the crash tests kill real processes."""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import Future

import pytest
from clientutil import PROCESSES, BookiePool, clusters
from crashutil import check_bookie, children, crash_settings, read_acks, settings_of  # noqa: F401
from test_client import bookie_pool, cluster_of, payload  # noqa: F401

from pybk import WriteFlag
from pybk.aio.client import AsyncBookKeeper
from pybk.client.deferred import AckWatermarks, ForceOp, entries_stored
from pybk.errors import (
    BookKeeperError,
    LedgerClosed,
    MalformedMessage,
    NoSuchEntry,
    ReadOnlyLedger,
)
from pybk.meta.ledger_metadata import LedgerState
from pybk.net import wire
from pybk.net.wire import Op, Request
from pybk.settings import ServerSettings
from pybk.storage import Bookie, format_bookie, make_entry
from pybk.testing import WAIT_S, waiting
from pybk.testing.faultyio import MODES, FaultyFileIO, lose_unsynced, read_unsynced

pytestmark = pytest.mark.timeout(120)
PASSWORD = b"secret"
DEFERRED = {WriteFlag.DEFERRED_SYNC}
KEY = b"k" * 20


def wait_until(predicate) -> None:
    """pybk.testing.wait_until (its bound: a busy machine's, not an expectation)."""
    waiting.wait_until(predicate, "the test's condition")


# -- the bookie ------------------------------------------------------------------------

def test_a_deferred_add_is_acknowledged_unsynced_and_force_syncs_it(tmp_path):
    """The journal acknowledges a deferred add with its bytes written and not synced, a
    durable add only synced; the force leaves nothing of the journal unsynced."""
    settings = ServerSettings(journalDirectory=str(tmp_path / "journal"),
                              ledgerDirectories=(str(tmp_path / "ledgers"),),
                              journalPreAllocSizeMB=1)
    format_bookie(settings)
    io = FaultyFileIO()
    with Bookie(settings, io=io) as bookie:
        def unsynced_journal_bytes() -> int:
            return sum(w.length for path, writes in io.unsynced.items() if "journal" in path
                       for w in writes)

        bookie.add_entry(1, 0, make_entry(1, 0, -1, b"durable"), KEY)
        assert unsynced_journal_bytes() == 0
        for entry_id in range(1, 4):
            bookie.add_entry_async(1, entry_id, make_entry(1, entry_id, -1, b"deferred"), KEY,
                                   deferred=True).result(timeout=WAIT_S)
        assert unsynced_journal_bytes() > 0
        assert bookie.read_entry(1, 3) == make_entry(1, 3, -1, b"deferred")
        bookie.force(1).result(timeout=WAIT_S)
        assert unsynced_journal_bytes() == 0


@pytest.mark.timeout(240)
def test_power_loss_keeps_every_forced_deferred_add_and_loses_unforced_ones(tmp_path,
                                                                            children):
    """Power cuts under deferred adds: the child SIGKILLs itself before a sync, then its
    unsynced writes are undone, zeroed or garbled.  Every add a completed force covered
    reads back byte-identical, nothing reads as wrong bytes, and adds acknowledged as
    written but not forced are lost (which a plain SIGKILL never does)."""
    values = crash_settings(tmp_path / "bookie")
    settings = settings_of(values)
    acks_path, written_path = tmp_path / "acks", tmp_path / "written"
    rng = random.Random(2020)
    lost_total = 0
    for round_no in range(6):
        faulty_log = tmp_path / f"unsynced-{round_no}.jsonl"
        child = children.start(values, acks_path, round_no, "--deferred", "--written",
                               str(written_path), "--faulty-log", str(faulty_log),
                               "--kill-before-sync", str(rng.randint(20, 200)))
        children.wait_for_exit(child, timeout=60)
        children.assert_killed(child)
        lose_unsynced(read_unsynced(str(faulty_log)), MODES[round_no % len(MODES)], rng)
        written = read_acks(written_path)
        with Bookie(settings) as bookie:
            check_bookie(bookie, read_acks(acks_path))
            for ledger_id, entry_ids in written.entries.items():
                for entry_id in entry_ids:
                    try:
                        bookie.read_entry(ledger_id, entry_id)
                    except NoSuchEntry:
                        lost_total += 1
    assert lost_total > 0, "no power cut lost an unforced deferred add"


# -- the wire --------------------------------------------------------------------------

def test_the_deferred_flag_travels_per_run_and_older_bookies_refuse_it():
    runs = [wire.AddRun(5, [0, 1], [b"a", b"b"], KEY, False, True),
            wire.AddRun(6, [0], [b"c"], KEY, True, False)]
    body = wire.encode_adds(runs, 1024)
    assert wire.decode_adds(body, 1024) == runs
    # The flag is bit 2 of the run's flags; a bookie of before deferred sync checked that
    # only bit 1 may be set, and refused the message as malformed.
    assert body[4 + 8:4 + 10] == (wire.DEFERRED_SYNC).to_bytes(2, "big")
    force = Request(Op.FORCE_LEDGER, 7, ledger_id=5)
    assert wire.decode_request(wire.encode_request(force, 1024), 1024) == force


def answered(held: int | None = None, error: BaseException | None = None) -> Future:
    """A FORCE_LEDGER future, done: the bookie holds ``held`` entries of the range forced,
    or failed."""
    future: Future = Future()
    if error is None:
        future.set_result(held)
    else:
        future.set_exception(error)
    return future


def test_a_force_needs_ack_quorum_of_every_write_set():
    outcomes: list[BaseException | None] = []
    acked = {"B1": 2, "B2": 2, "B3": 2}.__getitem__
    stored = {"B1": 2, "B2": 2, "B3": 2}
    force = ForceOp([(1, ("B1", "B2", "B3")), (2, ("B2", "B3", "B1"))], stored, 2, acked,
                    outcomes.append)
    assert force.bookies == {"B1", "B2", "B3"}
    force.answer("B1", answered(error=BookKeeperError("down")))
    force.answer("B2", answered(2))
    assert outcomes == []
    force.answer("B3", answered(2))
    assert outcomes == [None]
    failing: list[BaseException | None] = []
    force = ForceOp([(0, ("B1", "B2"))], stored, 2, acked, failing.append)
    force.answer("B1", answered(error=BookKeeperError("down")))
    assert len(failing) == 1 and isinstance(failing[0], BookKeeperError)
    # A bookie of before deferred sync answers FORCE_LEDGER as an unknown operation.
    old: list[BaseException | None] = []
    ForceOp([(0, ("B1",))], stored, 1, acked, old.append).answer(
        "B1", answered(error=MalformedMessage("unknown operation 9")))
    assert "without deferred sync" in str(old[0])


def test_a_force_counts_a_bookie_only_for_entries_it_acknowledged_and_holds():
    """Entries 4 and 5 forced, Qa=2: B3 refused entry 5 (its watermark stays at 4), so
    its OK counts for entry 4, not 5; B2 lost entry 4 (it holds one of the two), so it
    counts for neither, and entry 5 has only B1."""
    acked = {"B1": 5, "B2": 5, "B3": 4}.__getitem__
    stored = entries_stored([("B1", "B2", "B3")], 4, 5)
    assert stored == {"B1": 2, "B2": 2, "B3": 2}
    outcomes: list[BaseException | None] = []
    force = ForceOp([(5, ("B1", "B2", "B3"))], stored, 2, acked, outcomes.append)
    force.answer("B1", answered(2))
    force.answer("B3", answered(2))
    assert outcomes == []
    force.answer("B2", answered(1))
    assert len(outcomes) == 1 and "holds 1 of the 2 entries" in str(outcomes[0])


def test_entries_stored_counts_each_bookies_share_of_a_range():
    # E=3, Qw=2: B1 stores entries 0, 2, 3, 5...; B2 0, 1, 3, 4...; B3 1, 2, 4, 5...
    write_sets = [("B1", "B2"), ("B2", "B3"), ("B3", "B1")]
    assert entries_stored(write_sets, 2, 6) == {"B1": 4, "B2": 3, "B3": 3}
    assert entries_stored(write_sets, 0, -1) == {"B1": 0, "B2": 0, "B3": 0}


def test_ack_watermarks_follow_each_bookie_through_its_write_sets():
    # E=3, Qw=2: B1 stores entries 0, 2, 3, 5...; B2 0, 1, 3, 4...; B3 1, 2, 4, 5...
    ensemble = ("B1", "B2", "B3")
    write_set = {e: (ensemble[e % 3], ensemble[(e + 1) % 3]) for e in range(12)}
    marks = AckWatermarks(-1, lambda b, e: b in write_set[e], 3)
    for e in (0, 2, 3):
        marks.acked("B1", e)
    assert marks.through("B1") == 3
    marks.acked("B2", 3)  # before 0 and 1: waits above the watermark
    assert marks.through("B2") == -1
    marks.acked("B2", 0)
    marks.acked("B2", 1)
    assert marks.through("B2") == 3
    # B3 refused entry 1: what it acknowledges later never counts.
    for e in (2, 4, 5):
        marks.acked("B3", e)
    assert marks.through("B3") == -1


# -- the ledger protocol, over every transport ------------------------------------------

def test_deferred_adds_are_readable_at_once_and_force_gives_the_durable_lac(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client()
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD, write_flags=DEFERRED)
    futures = [lh.add_entry_async(payload(i)) for i in range(20)]
    assert [f.result(timeout=30) for f in futures] == list(range(20))
    assert lh.last_add_acknowledged == 19
    assert lh.last_add_forced == lh.last_add_confirmed == -1
    # The writer reads what was acknowledged; the entries carry the durable LAC.
    entries = list(lh.read_entries(0, 19))
    assert [e.data for e in entries] == [payload(i) for i in range(20)]
    assert {e.last_add_confirmed for e in entries} == {-1}
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.read_last_add_confirmed() == -1  # nothing is durable yet
    assert lh.force() == 19
    assert lh.last_add_forced == lh.last_add_confirmed == 19
    # Readers learn the durable LAC (explicit LAC of the idle writer, then piggybacked).
    wait_until(lambda: reader.read_last_add_confirmed() == 19)
    assert [e.data for e in reader.read_entries(0, 19)] == [payload(i) for i in range(20)]
    assert lh.add_entry(payload(20)) == 20
    assert lh.read_entry(20).last_add_confirmed == 19
    lh.close()  # forces first: every acknowledged entry is in the closed ledger
    assert lh.metadata.state is LedgerState.CLOSED and lh.metadata.last_entry_id == 20
    with pytest.raises(LedgerClosed):
        lh.force()
    with pytest.raises(ReadOnlyLedger):
        reader.force()


def test_the_asyncio_face_adds_deferred_and_forces(tmp_path):
    async def run(bk) -> None:
        async with AsyncBookKeeper(bk) as abk:
            lh = await abk.create_ledger(3, 2, 2, password=PASSWORD, write_flags=DEFERRED)
            assert [await lh.add(payload(i)) for i in range(5)] == list(range(5))
            assert lh.last_add_confirmed == -1
            assert await lh.force() == 4 == lh.last_add_confirmed
            await lh.close()

    with clusters(tmp_path) as make:
        asyncio.run(run(make(3).client()))


def test_force_of_a_ledger_without_deferred_sync_is_its_lac(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    assert lh.force() == -1
    lh.add_entry(b"x")
    assert lh.force() == lh.last_add_confirmed == lh.last_add_forced == 0
    lh.close()


def test_a_failing_bookie_closes_a_deferred_ledger_at_the_durable_lac(cluster_of):
    """BookKeeper's rule: no ensemble change for DEFERRED_SYNC; the ledger closes at the
    durable LAC, without the entries acknowledged after the last force."""
    cluster = cluster_of(4)
    bk = cluster.client()
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD, write_flags=DEFERRED)
    ensemble = lh.metadata.fragments[0].ensemble
    for i in range(10):
        lh.add_entry(payload(i))
    assert lh.force() == 9
    for i in range(10, 15):
        lh.add_entry(payload(i))
    cluster.faults[ensemble[0]].fail.add("add")
    with pytest.raises(BookKeeperError):
        lh.add_entry(payload(15))
    wait_until(lambda: bk.ledger_manager.read(lh.id).metadata.state is LedgerState.CLOSED)
    closed = bk.ledger_manager.read(lh.id).metadata
    assert closed.last_entry_id == 9
    assert closed.fragments[0].ensemble == ensemble and len(closed.fragments) == 1
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD)
    assert [e.data for e in reader.read_entries(0, 9)] == [payload(i) for i in range(10)]


def test_recovery_of_a_dead_deferred_writer_keeps_at_least_the_durable_lac(cluster_of):
    """A writer gone with acknowledged entries past its last force: a plain reader sees
    the durable LAC; recovery closes at an entry no lower, every entry there intact."""
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD, write_flags=DEFERRED)
    for i in range(8):
        lh.add_entry(payload(i))
    assert lh.force() == 7
    for i in range(8, 12):
        lh.add_entry(payload(i))
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    wait_until(lambda: reader.read_last_add_confirmed() == 7)
    recovered = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    last = recovered.metadata.last_entry_id
    assert 7 <= last <= 11
    assert [e.data for e in recovered.read_entries(0, last)] == \
        [payload(i) for i in range(last + 1)]


def test_a_bookie_process_killed_before_force(tmp_path, zookeeper):
    """SIGKILL of a bookie process after deferred adds and before the force: what it
    wrote stays in the page cache (only a power cut loses it, see the power-loss test),
    a force still completes on ack quorum of every write set, a plain reader sees the
    durable LAC, and recovery (re-writing from the LAC the entries carry, the one durable
    when each was written) closes with every acknowledged entry intact."""
    (tmp_path / "pool").mkdir()
    pool = BookiePool(tmp_path / "pool", zookeeper, 4)
    try:
        with clusters(tmp_path, PROCESSES, pool) as make:
            cluster = make(4)  # a spare, for recovery's re-writes of entries 10..19
            lh = cluster.client().create_ledger(3, 3, 2, password=PASSWORD,
                                                write_flags=DEFERRED)
            for i in range(10):
                lh.add_entry(payload(i))
            assert lh.force() == 9
            for i in range(10, 20):
                lh.add_entry(payload(i))
            reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
            pool.kill(lh.metadata.fragments[0].ensemble[0])
            wait_until(lambda: reader.read_last_add_confirmed() == 9)
            assert lh.force() == 19  # two of three bookies of each write set answered
            wait_until(lambda: reader.read_last_add_confirmed() == 19)
            recovered = cluster.client().open_ledger(lh.id, password=PASSWORD)
            assert recovered.metadata.last_entry_id == 19
            assert [e.data for e in recovered.read_entries(0, 19)] == \
                [payload(i) for i in range(20)]
    finally:
        pool.close()
